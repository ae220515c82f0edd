//! The contenders: one async function per (scenario, contender), each with a cache of its own so
//! that every run starts cold, all loading through the same slow upstream.
//!
//! To add a contender: write its function once in [`contenders!`], add a counter to [`Loads`],
//! and add one line to [`for_each!`]. A contender is anything `Fn(u64) -> impl Future<Output =
//! String>`; a closure over a connection works as well as a function.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How long one upstream load takes.
pub const LOAD: Duration = Duration::from_millis(100);

/// What a call returns: 100 bytes, as in the micro benchmarks.
pub type Value = String;

/// Upstream loads per contender, counted in the upstream itself so every contender is counted
/// the same way.
#[derive(Default)]
pub struct Loads {
    pub naive: AtomicU64,
    pub cached: AtomicU64,
    pub cached_by_key: AtomicU64,
    pub moka_get_with: AtomicU64,
    pub stampede: AtomicU64,
    pub stampede_redis: AtomicU64,
    pub stampede_hits: AtomicU64,
}

impl Loads {
    pub const fn new() -> Self {
        Loads {
            naive: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            cached_by_key: AtomicU64::new(0),
            moka_get_with: AtomicU64::new(0),
            stampede: AtomicU64::new(0),
            stampede_redis: AtomicU64::new(0),
            stampede_hits: AtomicU64::new(0),
        }
    }
}

/// The slow upstream every contender loads from: counts the load, takes [`LOAD`], returns the
/// key's 100-byte value.
pub async fn upstream(loads: &AtomicU64, key: u64) -> Value {
    loads.fetch_add(1, Relaxed);
    tokio::time::sleep(LOAD).await;
    format!("{key:0>100}")
}

/// A moka cache as the naive and `get_with` contenders use it.
pub fn moka_store(ttl: Duration, capacity: u64) -> moka::future::Cache<u64, Value> {
    moka::future::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(ttl)
        .build()
}

/// Declares a module of contenders for one scenario. Attribute options must be literals, so the
/// TTL is given both as a `stampede` duration and as the `cached` crate's milliseconds.
/// Every contender gets the same TTL and no jitter, and the bounded ones hold every key.
/// `redis_name` names the `lock = "redis"` contender's cache, to read its stats.
macro_rules! contenders {
    ($scenario:ident {
        ttl: $ttl:tt,
        ttl_ms: $ttl_ms:tt,
        stale: $stale:tt,
        capacity: $capacity:tt,
        redis_name: $redis_name:tt $(,)?
    }) => {
        #[allow(dead_code)] // the `cached` crate's companions (`*_no_cache`, `*_prime_cache`)
        pub mod $scenario {
            use std::sync::LazyLock;
            use std::time::Duration;

            use $crate::contenders::{Loads, Value, moka_store, upstream};

            pub static LOADS: Loads = Loads::new();
            pub const REDIS_NAME: &str = $redis_name;

            /// Get, and on a miss load and insert: no protection at all.
            pub async fn naive(key: u64) -> Value {
                static STORE: LazyLock<moka::future::Cache<u64, Value>> =
                    LazyLock::new(|| moka_store(Duration::from_millis($ttl_ms), $capacity));
                if let Some(value) = STORE.get(&key).await {
                    return value;
                }
                let value = upstream(&LOADS.naive, key).await;
                STORE.insert(key, value.clone()).await;
                value
            }

            #[cached::cached(ttl_millis = $ttl_ms)]
            pub async fn cached(key: u64) -> Value {
                upstream(&LOADS.cached, key).await
            }

            #[cached::cached(ttl_millis = $ttl_ms, sync_writes = "by_key")]
            pub async fn cached_by_key(key: u64) -> Value {
                upstream(&LOADS.cached_by_key, key).await
            }

            pub async fn moka_get_with(key: u64) -> Value {
                static STORE: LazyLock<moka::future::Cache<u64, Value>> =
                    LazyLock::new(|| moka_store(Duration::from_millis($ttl_ms), $capacity));
                STORE
                    .get_with(key, upstream(&LOADS.moka_get_with, key))
                    .await
            }

            #[stampede::cached(ttl = $ttl, stale = $stale, jitter = 0, lock = "local", capacity = $capacity)]
            pub async fn stampede(key: u64) -> Value {
                upstream(&LOADS.stampede, key).await
            }

            /// Tiered: memory in front of the benchmarks' Redis, one load per key across every
            /// process sharing it. Only run when a Redis is at hand.
            #[stampede::cached(
                ttl = $ttl,
                stale = $stale,
                jitter = 0,
                lock = "redis",
                redis = "bench",
                capacity = $capacity,
                name = $redis_name
            )]
            pub async fn stampede_redis(key: u64) -> Value {
                upstream(&LOADS.stampede_redis, key).await
            }

            /// The reference for "near a hit": the same calls on a key that never expires.
            #[stampede::cached(ttl = "1h", jitter = 0, lock = "local")]
            pub async fn stampede_hits(key: u64) -> Value {
                upstream(&LOADS.stampede_hits, key).await
            }
        }
    };
}

contenders!(cold {
    ttl: "60s",
    ttl_ms: 60_000,
    stale: "0s",
    capacity: 100_000,
    redis_name: "bench::cold::redis",
});

contenders!(expiry {
    ttl: "1s",
    ttl_ms: 1_000,
    stale: "5s",
    capacity: 100_000,
    redis_name: "bench::expiry::redis",
});

contenders!(zipf {
    ttl: "2s",
    ttl_ms: 2_000,
    stale: "0s",
    capacity: 100_000,
    redis_name: "bench::zipf::redis",
});

/// Runs `$driver.run(label, &loads, function)` for every contender of `$scenario`, in table
/// order, and collects what it returns; the `lock = "redis"` contender only when `$redis`.
macro_rules! for_each {
    ($scenario:ident, $driver:expr, $redis:expr) => {{
        use $crate::contenders::$scenario as c;
        let driver = &$driver;
        let mut runs = vec![
            driver.run("naive get-or-compute", &c::LOADS.naive, c::naive),
            driver.run("cached #[cached]", &c::LOADS.cached, c::cached),
            driver.run("cached by_key", &c::LOADS.cached_by_key, c::cached_by_key),
            driver.run("moka get_with", &c::LOADS.moka_get_with, c::moka_get_with),
            driver.run("stampede lock=local", &c::LOADS.stampede, c::stampede),
        ];
        if $redis {
            runs.push(driver.run(
                "stampede lock=redis",
                &c::LOADS.stampede_redis,
                c::stampede_redis,
            ));
        }
        runs
    }};
}

pub(crate) use for_each;
