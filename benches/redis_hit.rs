//! A call served from Redis (issue 14), next to a raw `GET` of the same bytes on the same kind
//! of connection (a multiplexed tokio connection), to the `cached` crate's Redis store
//! (`#[concurrent_cached(redis = true)]`), and to the server's side of stampede's read done raw
//! (its pipelined `GETRANGE` and `TIME`; the `READ_FRESH` script it uses on a cluster), in one
//! run. The two `stampede tiered` rows are `lock = "redis"` functions (memory in front of Redis)
//! whose calls miss memory and find their value in Redis, on [`KEYS`] keys a run, each filled
//! before the run: `lapsed here` on keys this process held until their `memory_ttl` (1ms) passed,
//! read first with the plain pipeline; `never held here` on keys another process (a twin of the
//! same name, with its own memory) filled, read by the flight's `READ_OR_LOCK` script, which takes
//! the lock in the same round trip when the value is missing (issue 38).
//!
//! The stampede function is `backend = "redis"`: nothing is kept in this process, so every
//! call asks Redis, and finds its value there (written by the warm-up call). Each contender
//! makes [`CALLS`] sequential calls on a current-thread runtime, [`RUNS`] times, the contenders
//! taking turns; the figure is the mean time per call of each run, then the median of the runs.
//!
//! Needs a Redis: `STAMPEDE_BENCH_REDIS=URL`, or a `redis-server` on `PATH`, which it starts on
//! a free loopback port. Run: `cargo bench -p stampede-benches --bench redis_hit` (about 50 s).

use std::hint::black_box;
use std::time::{Duration, Instant};

use stampede_benches::{BenchRedis, print_runs};

/// The script of stampede's read on a cluster and of a value longer than a hit's first read
/// (`READ_FRESH`: the size checked, a `GET`, the server's `TIME`, the envelope's fresh deadline
/// matched and compared), run with `EVALSHA` on the raw connection: what the script costs next
/// to the pipeline a standalone server is read with. A copy of the script in
/// `stampede-runtime/src/redis/protocol/scripts.rs` (the runtime keeps its scripts private): change both.
const READ_SHAPE: &str = r"
if redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[1]) then
  return false
end
local value = redis.call('GET', KEYS[1])
if not value then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fresh = tonumber(string.match(value, '^S3 (%d+) '))
if fresh and fresh > now then
  return {value, now}
end
return false
";

/// Calls per run and contender.
const CALLS: u32 = 10_000;
/// Runs per contender.
const RUNS: usize = 15;
/// What a hit reads with `GETRANGE` (`HIT_WINDOW` in `stampede-runtime/src/redis/protocol/ops.rs`).
const HIT_WINDOW: usize = 16 << 10;

fn value() -> String {
    "v".repeat(100)
}

#[stampede::cached(ttl = "1h", backend = "redis", redis = "bench", name = "bench::redis")]
async fn stampede_redis(id: u64) -> String {
    black_box(id);
    value()
}

/// Tiered (`lock = "redis"` puts memory in front of Redis), memory keeping a value for 1ms.
#[stampede::cached(
    ttl = "1h",
    lock = "redis",
    memory_ttl = "1ms",
    redis = "bench",
    name = "bench::lapsing"
)]
async fn stampede_lapsing(id: u64) -> String {
    black_box(id);
    value()
}

/// Tiered, and its twin of the same name with a memory of its own: another process's.
#[stampede::cached(ttl = "1h", lock = "redis", redis = "bench", name = "bench::twins")]
async fn stampede_here(id: u64) -> String {
    black_box(id);
    value()
}

#[stampede::cached(ttl = "1h", lock = "redis", redis = "bench", name = "bench::twins")]
async fn stampede_elsewhere(id: u64) -> String {
    black_box(id);
    value()
}

/// Keys a run of each tiered row calls, each once.
const KEYS: u64 = 1000;

/// Mean time per call of `call` on `KEYS` keys from `first`, each filled by `fill` first: the
/// calls alone are timed.
async fn per_filled_call<F, Fut, G, Gut>(first: u64, fill: G, call: F) -> Duration
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = String>,
    G: Fn(u64) -> Gut,
    Gut: Future<Output = String>,
{
    for key in first..first + KEYS {
        fill(key).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await; // past `memory_ttl`
    let start = Instant::now();
    for key in first..first + KEYS {
        black_box(call(key).await);
    }
    start.elapsed() / KEYS as u32
}

#[cached::concurrent_cached(redis = true, ttl_secs = 3600, map_error = r##"|e| format!("{e}")"##)]
async fn cached_redis(id: u64) -> Result<String, String> {
    black_box(id);
    Ok(value())
}

/// Mean time per call of `CALLS` calls.
async fn per_call<F, Fut, T>(call: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: Future<Output = T>,
{
    let start = Instant::now();
    for _ in 0..CALLS {
        black_box(call().await);
    }
    start.elapsed() / CALLS
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
    let (raw, raw_key) = rt.block_on(async {
        let mut raw = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        // Warm: each contender's value is in Redis, its connections open.
        stampede_redis(7).await;
        cached_redis(7).await.expect("cached's Redis store");
        // The raw GET reads the very bytes stampede's `backend = "redis"` call reads: the value
        // key it wrote (the longest string of that cache's keys; the others are its fence and
        // the like).
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!(
                "stampede-bench-{}:{{bench::redis~*",
                std::process::id()
            ))
            .query_async(&mut raw)
            .await
            .expect("KEYS");
        let mut longest = (String::new(), 0);
        for key in keys {
            let bytes: Result<Option<Vec<u8>>, _> =
                redis::cmd("GET").arg(&key).query_async(&mut raw).await;
            if let Ok(Some(bytes)) = bytes
                && bytes.len() > longest.1
            {
                longest = (key, bytes.len());
            }
        }
        eprintln!("raw GET of `{}`: {} bytes", longest.0, longest.1);
        (raw, longest.0)
    });
    let script = redis::Script::new(READ_SHAPE);
    let mut times: [Vec<Duration>; 7] = Default::default();
    rt.block_on(async {
        for _ in 0..RUNS {
            times[0].push(per_call(|| stampede_redis(black_box(7))).await);
            times[1].push(
                per_call(|| {
                    let mut raw = raw.clone();
                    let key = raw_key.as_str();
                    async move {
                        redis::cmd("GET")
                            .arg(key)
                            .query_async::<Vec<u8>>(&mut raw)
                            .await
                            .expect("GET")
                    }
                })
                .await,
            );
            times[2].push(per_call(|| cached_redis(black_box(7))).await);
            times[3].push(
                per_call(|| {
                    let mut raw = raw.clone();
                    let (key, script) = (raw_key.as_str(), &script);
                    async move {
                        script
                            .key(key)
                            .arg(8 << 20)
                            .invoke_async::<redis::Value>(&mut raw)
                            .await
                            .expect("EVALSHA")
                    }
                })
                .await,
            );
            times[4].push(
                per_call(|| {
                    let mut raw = raw.clone();
                    let key = raw_key.as_str();
                    async move {
                        redis::pipe()
                            .cmd("GETRANGE")
                            .arg(key)
                            .arg(0)
                            .arg(HIT_WINDOW - 1)
                            .cmd("TIME")
                            .query_async::<(Vec<u8>, (u64, u64))>(&mut raw)
                            .await
                            .expect("GETRANGE + TIME")
                    }
                })
                .await,
            );
            let first = 1_000_000 + times[5].len() as u64 * KEYS;
            times[5].push(per_filled_call(first, stampede_lapsing, stampede_lapsing).await);
            times[6].push(per_filled_call(first, stampede_elsewhere, stampede_here).await);
        }
    });
    let stats = stampede::stats("bench::redis").expect("called");
    let names = [
        "stampede backend=redis",
        "raw GET",
        "cached concurrent_cached(redis)",
        "raw EVALSHA of READ_FRESH",
        "raw GETRANGE+TIME, stampede's",
        "stampede tiered, lapsed here",
        "stampede tiered, never held here",
    ];
    println!(
        "a call served from Redis: {CALLS} sequential calls per run, {RUNS} runs; Redis: {}",
        redis.origin
    );
    print_runs(&names, &times, 1, "/raw GET");
    println!(
        "stampede's stats: {} remote hits, {} loads (1: the warm-up)",
        stats.remote_hits, stats.loads
    );
    for name in ["bench::lapsing", "bench::twins"] {
        let tiered = stampede::stats(name).expect("called");
        println!(
            "{name}: {} memory hits, {} remote hits, {} loads (each run's fill of its {KEYS} keys \
             included: the timed calls load nothing)",
            tiered.hits, tiered.remote_hits, tiered.loads
        );
    }
}
