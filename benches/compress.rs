//! `compress` (issue 37): the bytes a 100 KiB JSON-like value takes in Redis, and the time per
//! call of a read served from Redis and of a miss that loads and writes it, with and without
//! `compress = 16_384`, in one run.
//!
//! Both functions are `backend = "redis"`, so every call asks Redis. A read finds the value
//! there; a miss follows the key's invalidation, so it takes the lock, loads (at once: the value
//! is built beforehand) and writes. Each contender makes [`CALLS`] sequential calls on a
//! current-thread runtime, [`RUNS`] times, the contenders taking turns; the figure is the median
//! of the runs' mean time per call.
//!
//! Needs a Redis: `STAMPEDE_BENCH_REDIS=URL`, or a `redis-server` on `PATH`, which it starts on
//! a free loopback port. Run: `cargo bench -p stampede-benches --bench compress` (about 30 s).

use std::hint::black_box;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stampede_benches::{BenchRedis, median};

/// Calls per run and contender.
const CALLS: u32 = 300;
/// Runs per contender.
const RUNS: usize = 9;

/// A row of a catalog, as a JSON API would return it.
#[derive(Clone, Serialize, Deserialize)]
struct Product {
    id: u64,
    sku: String,
    name: String,
    description: String,
    price_cents: u64,
    tags: Vec<String>,
    in_stock: bool,
}

/// A catalog page of about 100 KiB in the payload form.
static PAGE: LazyLock<Vec<Product>> = LazyLock::new(|| {
    (0..560)
        .map(|id| Product {
            id,
            sku: format!("KT-{id:06}"),
            name: format!("Kettle, model {}", id % 37),
            description: format!(
                "Stainless steel kettle, {} litres, auto shut-off, boil-dry protection.",
                1 + id % 3
            ),
            price_cents: 1_999 + id * 7 % 5_000,
            tags: vec![
                "kitchen".into(),
                "appliance".into(),
                format!("range-{}", id % 9),
            ],
            in_stock: id % 5 != 0,
        })
        .collect()
});

#[stampede::cached(ttl = "1h", backend = "redis", redis = "bench", name = "bench::plain")]
async fn plain(id: u64) -> Vec<Product> {
    black_box(id);
    PAGE.clone()
}

#[stampede::cached(
    ttl = "1h",
    backend = "redis",
    redis = "bench",
    name = "bench::compressed",
    compress = 16_384
)]
async fn compressed(id: u64) -> Vec<Product> {
    black_box(id);
    PAGE.clone()
}

/// Mean time per call of `CALLS` calls.
async fn per_call<F: AsyncFn()>(call: F) -> Duration {
    let start = Instant::now();
    for _ in 0..CALLS {
        call().await;
    }
    start.elapsed() / CALLS
}

/// The bytes of the value key of cache `name` under this process's prefix.
async fn stored_bytes(connection: &mut redis::aio::MultiplexedConnection, name: &str) -> usize {
    let pattern = format!("stampede-bench-{}:{{{name}~*:v", std::process::id());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(connection)
        .await
        .expect("KEYS");
    let key = keys.first().expect("the value is in Redis");
    redis::cmd("STRLEN")
        .arg(key)
        .query_async(connection)
        .await
        .expect("STRLEN")
}

fn main() {
    let Some(redis) = BenchRedis::installed() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let client = redis::Client::open(redis.url.as_str()).expect("a Redis URL");
    let sizes = rt.block_on(async {
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        plain(1).await;
        compressed(1).await;
        [
            stored_bytes(&mut connection, "bench::plain").await,
            stored_bytes(&mut connection, "bench::compressed").await,
        ]
    });
    let mut reads: [Vec<Duration>; 2] = Default::default();
    let mut misses: [Vec<Duration>; 2] = Default::default();
    rt.block_on(async {
        for _ in 0..RUNS {
            reads[0].push(per_call(async || drop(black_box(plain(1).await))).await);
            reads[1].push(per_call(async || drop(black_box(compressed(1).await))).await);
            misses[0].push(
                per_call(async || {
                    plain::invalidate(1).await.expect("invalidated");
                    drop(black_box(plain(1).await));
                })
                .await,
            );
            misses[1].push(
                per_call(async || {
                    compressed::invalidate(1).await.expect("invalidated");
                    drop(black_box(compressed(1).await));
                })
                .await,
            );
        }
    });
    for name in ["bench::plain", "bench::compressed"] {
        let stats = stampede::stats(name).expect("called");
        assert_eq!(stats.decode_errors, 0, "{name}: {stats:?}");
    }
    let read = reads.map(median);
    let miss = misses.map(median);
    println!(
        "a {} KiB JSON-like value (560 products) through `backend = \"redis\"`: {CALLS} sequential \
         calls per run, {RUNS} runs, medians; Redis: {}",
        sizes[0] / 1024,
        redis.origin
    );
    println!(
        "{:<28} {:>14} {:>16} {:>22}",
        "contender", "bytes in Redis", "read µs/call", "invalidate+miss µs/call"
    );
    let rows = ["no compress", "compress = 16_384"];
    for (i, name) in rows.iter().enumerate() {
        println!(
            "{name:<28} {:>14} {:>16.1} {:>22.1}",
            sizes[i],
            read[i].as_secs_f64() * 1e6,
            miss[i].as_secs_f64() * 1e6
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "compressed / plain: bytes {:.3}x, read {:.2}x, invalidate+miss {:.2}x",
        sizes[1] as f64 / sizes[0] as f64,
        ratio(read[1], read[0]),
        ratio(miss[1], miss[0])
    );
}
