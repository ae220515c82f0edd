//! A miss through Redis (issue 38): what a call of a key found nowhere costs beyond its load,
//! the storm's tail miss in isolation. `lock = "redis"` + `stale` (the storm's stampede
//! contender: memory in front of Redis, the key's flight taking the Redis lock in its read,
//! then `FILL`), next to the `cached` crate's Redis store (`GET`, then `SET` after the load) and
//! a raw `GET` then `SET` of the same size on a multiplexed connection. The load returns at once,
//! so the figures are the cache's own cost of a miss.
//!
//! Each contender calls [`KEYS`] keys never asked for before, one after the other, on a
//! current-thread runtime, [`RUNS`] times, the contenders taking turns; the figure is the mean
//! time per call of a run, then the median of the runs.
//!
//! Needs a Redis: `STAMPEDE_BENCH_REDIS=URL`, or a `redis-server` on `PATH`, which it starts on a
//! free loopback port. Run: `cargo bench -p stampede-benches --bench redis_miss`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use stampede_benches::{BenchRedis, print_runs};

/// Keys per run and contender, each asked for once.
const KEYS: u64 = 2_000;
/// Runs per contender.
const RUNS: usize = 9;

fn value() -> String {
    "v".repeat(100)
}

/// The storm's stampede contender.
#[stampede::cached(
    ttl = "10s",
    jitter = 0,
    lock = "redis",
    stale = "60s",
    fail_safe = "5m",
    redis = "bench",
    name = "bench::miss"
)]
async fn stampede_miss(id: u64) -> String {
    black_box(id);
    value()
}

/// The same without `stale` and `fail_safe`.
#[stampede::cached(
    ttl = "10s",
    jitter = 0,
    lock = "redis",
    redis = "bench",
    name = "bench::plain"
)]
async fn stampede_plain(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::concurrent_cached(redis = true, ttl_secs = 10, map_error = r##"|e| format!("{e}")"##)]
async fn cached_miss(id: u64) -> Result<String, String> {
    black_box(id);
    Ok(value())
}

/// Mean time per call of `call` on `KEYS` keys from `first`.
async fn per_call<F, Fut, T>(first: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = T>,
{
    let start = Instant::now();
    for key in first..first + KEYS {
        black_box(call(key).await);
    }
    start.elapsed() / KEYS as u32
}

fn main() {
    let Some(redis) = BenchRedis::installed_for_cached() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let client = redis::Client::open(redis.url.as_str()).expect("a Redis URL");
    let raw = rt.block_on(async {
        // Warm: every contender's connection open, its scripts loaded.
        stampede_miss(0).await;
        stampede_plain(0).await;
        cached_miss(0).await.expect("cached's Redis store");
        client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection")
    });
    let names = [
        "stampede lock=redis + stale",
        "stampede lock=redis",
        "cached concurrent_cached(redis)",
        "raw GET + SET",
    ];
    let mut times: [Vec<Duration>; 4] = Default::default();
    rt.block_on(async {
        for run in 0..RUNS {
            let first = 1 + run as u64 * KEYS;
            times[0].push(per_call(first, stampede_miss).await);
            times[1].push(per_call(first, stampede_plain).await);
            times[2].push(per_call(first, cached_miss).await);
            times[3].push(
                per_call(first, |key| {
                    let mut raw = raw.clone();
                    async move {
                        let key = format!("raw-miss:{key}");
                        let found: Option<Vec<u8>> = redis::cmd("GET")
                            .arg(&key)
                            .query_async(&mut raw)
                            .await
                            .expect("GET");
                        let () = redis::cmd("SET")
                            .arg(&key)
                            .arg(value())
                            .arg("EX")
                            .arg(10)
                            .query_async(&mut raw)
                            .await
                            .expect("SET");
                        found
                    }
                })
                .await,
            );
        }
    });
    println!(
        "a miss through Redis: {KEYS} new keys per run, {RUNS} runs; Redis: {}",
        redis.origin
    );
    print_runs(&names, &times, 3, "/raw GET+SET");
    let stats = stampede::stats("bench::miss").expect("called");
    println!(
        "bench::miss: {} loads, {} remote hits",
        stats.loads, stats.remote_hits
    );
}
