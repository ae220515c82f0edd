//! The previous value to the load (`stampede::previous`) with a shared tier, against a real
//! `redis-server` per test: a process with nothing in memory is given the value Redis holds,
//! and "unchanged" (returning it) makes it fresh again for every process. Two functions with
//! one `name` are two processes over the same Redis keys. Time is real (see `redis_tier.rs`).

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};

fn install(server: &RedisServer, name: &str) {
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("previous")
        .install_as(name);
}

/// The source of the tests: a version per key that a conditional read compares, and the
/// previous values each load was given.
struct Source {
    version: AtomicUsize,
    full_reads: AtomicUsize,
    given: Mutex<Vec<Option<String>>>,
}

impl Source {
    const fn new() -> Source {
        Source {
            version: AtomicUsize::new(1),
            full_reads: AtomicUsize::new(0),
            given: Mutex::new(Vec::new()),
        }
    }

    /// A conditional read of `id`: the previous value if its version is the source's, else a
    /// full read.
    fn load(&self, id: u64) -> Result<String, AppError> {
        let previous = stampede::previous::<String>();
        self.given.lock().unwrap().push(previous.clone());
        let version = self.version.load(SeqCst);
        let current = format!("row {id} v{version}");
        match previous {
            Some(previous) if previous == current => Ok(previous), // unchanged
            _ => {
                self.full_reads.fetch_add(1, SeqCst);
                Ok(current)
            }
        }
    }

    fn given(&self) -> Vec<Option<String>> {
        self.given.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn redis_only_a_refresh_is_given_the_stale_value_redis_holds_and_unchanged_renews_it() {
    static SOURCE: Source = Source::new();

    #[cached(
        ttl = "1s",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        backend = "redis",
        redis = "previous_redis",
        name = "previous::redis_only"
    )]
    async fn in_a(id: u64) -> Result<String, AppError> {
        SOURCE.load(id)
    }
    #[cached(
        ttl = "1s",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        backend = "redis",
        redis = "previous_redis",
        name = "previous::redis_only"
    )]
    async fn in_b(id: u64) -> Result<String, AppError> {
        SOURCE.load(id)
    }

    let server = RedisServer::start();
    install(&server, "previous_redis");
    assert_eq!(within(in_a(5)).await.unwrap(), "row 5 v1");
    tokio::time::sleep(Duration::from_millis(1_200)).await; // stale in Redis
    // b holds nothing in memory: its refresh is given the stale value it read from Redis.
    assert_eq!(within(in_b(5)).await.unwrap(), "row 5 v1");
    eventually("b's refresh ran", || SOURCE.given().len() == 2).await;
    assert_eq!(SOURCE.given(), vec![None, Some("row 5 v1".to_owned())]);
    assert_eq!(SOURCE.full_reads.load(SeqCst), 1, "unchanged: no full read");
    // "Unchanged" wrote it back fresh: a's next call is a hit, with no load.
    eventually("b's refresh wrote it back", || {
        stampede::stats("previous::redis_only").unwrap().in_flight == 0
    })
    .await;
    assert_eq!(within(in_a(5)).await.unwrap(), "row 5 v1");
    assert_eq!(SOURCE.given().len(), 2, "fresh again in Redis: no load");
}

#[tokio::test]
async fn tiered_a_process_with_nothing_in_memory_is_given_what_redis_holds_never_an_invalidated_value()
 {
    static SOURCE: Source = Source::new();

    #[cached(
        ttl = "300ms",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        lock = "redis",
        redis = "previous_tiered",
        name = "previous::tiered"
    )]
    async fn in_a(id: u64) -> Result<String, AppError> {
        SOURCE.load(id)
    }
    #[cached(
        ttl = "300ms",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        lock = "redis",
        redis = "previous_tiered",
        name = "previous::tiered"
    )]
    async fn in_b(id: u64) -> Result<String, AppError> {
        SOURCE.load(id)
    }

    let server = RedisServer::start();
    install(&server, "previous_tiered");
    assert_eq!(within(in_a(8)).await.unwrap(), "row 8 v1");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        within(in_b(8)).await.unwrap(),
        "row 8 v1",
        "stale, from Redis"
    );
    eventually("b's refresh ran", || SOURCE.given().len() == 2).await;
    assert_eq!(SOURCE.given()[1].as_deref(), Some("row 8 v1"));
    // The row changes and is invalidated: no process's next load is given the old value.
    SOURCE.version.store(2, SeqCst);
    in_a::invalidate(8).await.unwrap();
    assert_eq!(within(in_b(8)).await.unwrap(), "row 8 v2");
    assert_eq!(SOURCE.given()[2], None, "{:?}", SOURCE.given());
    assert_eq!(SOURCE.full_reads.load(SeqCst), 2);
}
