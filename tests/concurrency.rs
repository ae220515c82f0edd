//! Many tasks on a multi-threaded runtime calling, expiring, refreshing, failing and
//! invalidating at once: two loads of one key never overlap (in one process, and with
//! `lock = "redis"` across processes) unless an invalidation of the key came between their
//! starts (it detaches the running load, so the next caller starts a new one), nothing hangs,
//! and nothing stays in flight afterwards.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};

const KEYS: usize = 8;

/// Loads of each key running now, and whether two ever overlapped with no invalidation of the
/// key between them.
///
/// An invalidation detaches the key's flight, whose load may not have started yet: it starts
/// after the invalidation, next to the load of the flight that replaced it. So the first load
/// of a key to start after an invalidation began is exempt: it may be the detached one. With a
/// shared tier an invalidation detaches twice, before and after it drops the key from the tier
/// (a flight begun in between may have read the old value there): the first two are exempt.
struct Overlap {
    /// Per key, for each load running: how many invalidations of the key had ended when it
    /// began, and whether it is exempt.
    running: [Mutex<Vec<(u64, bool)>>; KEYS],
    /// Per key: how many loads starting from now on are exempt (an invalidation began).
    pending: [AtomicU64; KEYS],
    /// How many loads an invalidation exempts: its detached flights.
    detached_per_invalidation: u64,
    /// Per key: invalidations begun, and ended.
    invalidations_begun: [AtomicU64; KEYS],
    invalidations_ended: [AtomicU64; KEYS],
    seen: AtomicBool,
    loads: AtomicUsize,
}

impl Overlap {
    const fn new(detached_per_invalidation: u64) -> Self {
        Overlap {
            running: [const { Mutex::new(Vec::new()) }; KEYS],
            pending: [const { AtomicU64::new(0) }; KEYS],
            detached_per_invalidation,
            invalidations_begun: [const { AtomicU64::new(0) }; KEYS],
            invalidations_ended: [const { AtomicU64::new(0) }; KEYS],
            seen: AtomicBool::new(false),
            loads: AtomicUsize::new(0),
        }
    }

    /// A load of `key` that takes `millis` and fails one time in ten.
    async fn load(&self, key: u64, millis: u64) -> Result<u64, AppError> {
        let slot = key as usize % KEYS;
        let ended_at_start = self.invalidations_ended[slot].load(SeqCst);
        let exempt = self.pending[slot]
            .fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1))
            .is_ok();
        let me = (ended_at_start, exempt);
        {
            let mut running = self.running[slot].lock().unwrap();
            // Another load of the key runs: that is allowed only if one of the two is exempt,
            // or an invalidation of the key had begun by now and had not ended when the other
            // load began.
            let begun_now = self.invalidations_begun[slot].load(SeqCst);
            if running
                .iter()
                .any(|&(ended, exempt)| !exempt && !me.1 && begun_now <= ended)
            {
                self.seen.store(true, SeqCst);
            }
            running.push(me);
        }
        let n = self.loads.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        {
            let mut running = self.running[slot].lock().unwrap();
            let mine = running.iter().position(|&load| load == me).unwrap();
            running.swap_remove(mine);
        }
        if n % 10 == 3 {
            return Err(AppError::Db(format!("load {n} of key {key} failed")));
        }
        Ok(key * 1_000 + n as u64)
    }
}

/// Calls from `tasks` tasks, each choosing its key and its pauses from a seeded generator, while
/// another task invalidates keys now and then.
async fn storm<F, Fut>(
    overlap: &'static Overlap,
    tasks: u64,
    calls: u64,
    name: &'static str,
    call: F,
) where
    F: Fn(u64) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<u64, AppError>> + Send,
{
    let mut workers = Vec::new();
    for task in 0..tasks {
        workers.push(tokio::spawn(async move {
            let mut seed = task.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for _ in 0..calls {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let key = seed % KEYS as u64;
                if let Ok(value) = call(key).await {
                    assert_eq!(value / 1_000, key, "a call got another key's value");
                }
                if seed % 4 == 0 {
                    tokio::time::sleep(Duration::from_millis(seed % 3)).await;
                }
            }
        }));
    }
    let invalidator = tokio::spawn(async move {
        for round in 0..40u64 {
            tokio::time::sleep(Duration::from_millis(7)).await;
            let key = round % KEYS as u64;
            overlap.invalidations_begun[key as usize].fetch_add(1, SeqCst);
            overlap.pending[key as usize].store(overlap.detached_per_invalidation, SeqCst);
            let _ = stampede::invalidate(name, (key,)).await;
            overlap.invalidations_ended[key as usize].fetch_add(1, SeqCst);
        }
    });
    for worker in workers {
        within(worker).await.unwrap();
    }
    within(invalidator).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loads_of_one_key_never_overlap_in_a_process() {
    static OVERLAP: Overlap = Overlap::new(1);

    #[cached(
        ttl = "15ms",
        stale = "15ms",
        jitter = 50,
        retries = 1,
        backoff = "1ms",
        name = "conc::local"
    )]
    async fn value(key: u64) -> Result<u64, AppError> {
        OVERLAP.load(key, 1 + key % 3).await
    }

    storm(&OVERLAP, 32, 300, "conc::local", value).await;
    eventually("every load to end", || {
        stampede::stats("conc::local").unwrap().in_flight == 0
    })
    .await;

    assert!(
        !OVERLAP.seen.load(SeqCst),
        "two loads of one key overlapped"
    );
    let stats = stampede::stats("conc::local").unwrap();
    assert_eq!(stats.waiters, 0);
    assert!(
        OVERLAP.loads.load(SeqCst) > 50,
        "the storm exercised loads: {stats:?}"
    );
    assert!(
        stats.hits + stats.stale_served > 1_000,
        "and hits: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loads_of_one_key_never_overlap_across_processes_with_a_redis_lock() {
    static OVERLAP: Overlap = Overlap::new(2);

    #[cached(
        ttl = "40ms",
        stale = "40ms",
        lock = "redis",
        redis = "conc",
        name = "conc::redis"
    )]
    async fn in_a(key: u64) -> Result<u64, AppError> {
        OVERLAP.load(key, 2).await
    }
    #[cached(
        ttl = "40ms",
        stale = "40ms",
        lock = "redis",
        redis = "conc",
        name = "conc::redis"
    )]
    async fn in_b(key: u64) -> Result<u64, AppError> {
        OVERLAP.load(key, 2).await
    }
    #[cached(
        ttl = "40ms",
        stale = "40ms",
        lock = "redis",
        redis = "conc",
        name = "conc::redis"
    )]
    async fn in_c(key: u64) -> Result<u64, AppError> {
        OVERLAP.load(key, 2).await
    }

    let server = RedisServer::start();
    // Generous bounds: a Redis call that timed out would fall back to a local load, which this
    // test would see as an overlap although the contract allows it.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("conc")
        .op_timeout(Duration::from_secs(5))
        .install_as("conc");
    // Each key is asked of every process in turn.
    static TURN: AtomicUsize = AtomicUsize::new(0);
    let call = |key: u64| async move {
        match TURN.fetch_add(1, SeqCst) % 3 {
            0 => in_a(key).await,
            1 => in_b(key).await,
            _ => in_c(key).await,
        }
    };
    storm(&OVERLAP, 24, 150, "conc::redis", call).await;
    eventually("every load to end", || {
        stampede::stats("conc::redis").unwrap().in_flight == 0
    })
    .await;

    assert!(
        !OVERLAP.seen.load(SeqCst),
        "two loads of one key overlapped across processes"
    );
    let stats = stampede::stats("conc::redis").unwrap();
    assert_eq!(stats.degraded, 0, "{stats:?}");
    assert!(
        stats.lock_acquired > 20,
        "the storm exercised the lock: {stats:?}"
    );
}
