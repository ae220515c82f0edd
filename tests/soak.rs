//! A soak: mixed traffic on many keys for a while (hits, misses, errors, panics, timeouts,
//! invalidations from two processes' caches, a Redis restart in the middle), then the checks a
//! long-running service needs: nothing in flight, no task or connection leaked, resident memory
//! steady after warm-up, a bounded number of Redis keys, and no call that returned a value older
//! than an invalidation that had returned before the call began.
//!
//! CI runs it for 8 seconds. For the long run, by hand:
//!
//! ```sh
//! STAMPEDE_SOAK_SECS=60 cargo test --release --test soak -- --nocapture
//! ```

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};

const KEYS: u64 = 500;

/// The "database": each key's current version, bumped by every write.
static VERSIONS: [AtomicU64; KEYS as usize] = [const { AtomicU64::new(0) }; KEYS as usize];
/// Per key, the version whose invalidation has returned: no call that begins later may return
/// an older one.
static COMMITTED: [AtomicU64; KEYS as usize] = [const { AtomicU64::new(0) }; KEYS as usize];
static LOADS: AtomicUsize = AtomicUsize::new(0);

/// One load: reads the key's version, and now and then fails, panics or hangs past the timeout.
async fn load(key: u64) -> Result<(u64, u64), AppError> {
    let n = LOADS.fetch_add(1, SeqCst) as u64;
    let version = VERSIONS[key as usize].load(SeqCst);
    match n % 50 {
        7 | 19 => return Err(AppError::Db(format!("load {n} of {key} failed"))),
        23 => panic!("load {n} of {key} panicked"),
        31 => tokio::time::sleep(Duration::from_millis(300)).await, // past the timeout
        _ => tokio::time::sleep(Duration::from_millis(n % 7)).await,
    }
    Ok((key, version))
}

#[cached(
    ttl = "300ms",
    stale = "300ms",
    timeout = "100ms",
    capacity = 200,
    lock = "redis",
    redis = "soak_a",
    name = "soak::versions"
)]
async fn in_a(key: u64) -> Result<(u64, u64), AppError> {
    load(key).await
}

#[cached(
    ttl = "300ms",
    stale = "300ms",
    timeout = "100ms",
    capacity = 200,
    lock = "redis",
    redis = "soak_b",
    name = "soak::versions"
)]
async fn in_b(key: u64) -> Result<(u64, u64), AppError> {
    load(key).await
}

/// A small xorshift generator, one per task, so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A key, skewed towards the first ones (a hot set).
    fn key(&mut self) -> u64 {
        let r = self.next();
        if r.is_multiple_of(4) {
            r % KEYS
        } else {
            r % 20
        }
    }
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_traffic_leaves_nothing_behind_and_never_serves_a_value_older_than_its_invalidation()
{
    // The loads' own panics are part of the traffic: keep them out of the output.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planned = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|message| message.starts_with("load "));
        if !planned {
            report(info);
        }
    }));
    let seconds: u64 = std::env::var("STAMPEDE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let mut server = RedisServer::start();
    for name in ["soak_a", "soak_b"] {
        RedisConfig::new(&server.url())
            .unwrap()
            .prefix("soak")
            .op_timeout(Duration::from_millis(200))
            .lease(Duration::from_secs(2))
            .install_as(name);
    }
    let runtime = tokio::runtime::Handle::current();
    let stop = &*Box::leak(Box::new(AtomicBool::new(false)));
    let calls = &*Box::leak(Box::new(AtomicU64::new(0)));
    let older = &*Box::leak(Box::new(AtomicU64::new(0)));

    let mut tasks = Vec::new();
    for reader in 0..16u64 {
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(reader.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            while !stop.load(SeqCst) {
                let key = rng.key();
                let committed = COMMITTED[key as usize].load(SeqCst);
                let got = if rng.next().is_multiple_of(2) {
                    in_a(key).await
                } else {
                    in_b(key).await
                };
                calls.fetch_add(1, SeqCst);
                if let Ok((k, version)) = got {
                    assert_eq!(k, key, "a call got another key's value");
                    if version < committed {
                        older.fetch_add(1, SeqCst);
                        eprintln!("key {key}: version {version} after {committed} was committed");
                    }
                }
                if rng.next().is_multiple_of(8) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    for writer in 0..2u64 {
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng((writer + 100).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
            while !stop.load(SeqCst) {
                let key = rng.key();
                let version = VERSIONS[key as usize].fetch_add(1, SeqCst) + 1;
                // The write, then its invalidation; it is a promise only once it returned Ok.
                if stampede::invalidate("soak::versions", (key,)).await.is_ok() {
                    COMMITTED[key as usize].fetch_max(version, SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5 + rng.next() % 10)).await;
            }
        }));
    }

    let run = Duration::from_secs(seconds);
    let started = Instant::now();
    tokio::time::sleep(run / 4).await;
    let warm_tasks = runtime.metrics().num_alive_tasks();
    let warm_memory = resident_bytes();
    tokio::time::sleep(run / 4).await;
    tokio::task::block_in_place(|| server.restart()); // empty, on the same port, mid-run
    tokio::time::sleep(run / 2).await;
    stop.store(true, SeqCst);
    for task in tasks {
        within(task).await.unwrap();
    }
    let ran = started.elapsed();

    eventually("every load and waiter to finish", || {
        let stats = stampede::stats("soak::versions").unwrap();
        stats.in_flight == 0 && stats.waiters == 0
    })
    .await;
    // What the traffic's tasks leave behind: the 18 traffic tasks are gone; the links' own
    // tasks (connections, subscriptions, heartbeats) are the ones counted at warm-up.
    let end_tasks = runtime.metrics().num_alive_tasks();
    let end_memory = resident_bytes();
    let clients: String = server.command(&["CLIENT", "LIST"]);
    let connections = clients.lines().count();
    let redis_keys: u64 = server.command(&["DBSIZE"]);
    let stats = stampede::stats("soak::versions").unwrap();
    println!(
        "soak {:.1} s: {} calls, {} loads ({} errors, {} timeouts), {} hits, {} degraded; \
         tasks {warm_tasks} at warm-up, {end_tasks} at the end; resident {:.1} MiB at warm-up, \
         {:.1} MiB at the end; {connections} Redis connections; {redis_keys} Redis keys; \
         {} values older than their invalidation",
        ran.as_secs_f64(),
        calls.load(SeqCst),
        stats.loads,
        stats.load_errors,
        stats.timeouts,
        stats.hits,
        stats.degraded,
        warm_memory as f64 / 1048576.0,
        end_memory as f64 / 1048576.0,
        older.load(SeqCst),
    );
    assert_eq!(
        older.load(SeqCst),
        0,
        "a call returned a value older than its invalidation"
    );
    assert!(
        stats.hits > 0 && stats.load_errors > 0 && stats.timeouts > 0,
        "{stats:?}"
    );
    assert!(
        end_tasks <= warm_tasks - 18 + 4,
        "tasks leaked: {warm_tasks} at warm-up (18 of them traffic), {end_tasks} at the end"
    );
    assert!(
        end_memory <= warm_memory + warm_memory / 10,
        "resident memory grew more than 10% after warm-up: {warm_memory} -> {end_memory}"
    );
    // Two caches, each with a command and a subscriber connection per runtime, and this test's.
    assert!(
        connections <= 6,
        "{connections} Redis connections:\n{clients}"
    );
    // A key has at most a value, a lock and a fence.
    assert!(
        redis_keys <= 3 * KEYS,
        "{redis_keys} Redis keys for {KEYS} cache keys"
    );
}
