//! The batch scenario of issue 24: a page that shows 50 products, each product a key. Cold (none
//! cached), then with 10% of the page expired (5 of its keys dropped from every cache, each round
//! other ones), loaded by:
//!
//! - a batch function (`#[cached(batch = ids)]`): one call for the keys the cache lacks, one
//!   `SELECT .. WHERE id IN (..)`;
//! - 50 calls of a single-key `#[cached]` function, at once (`join_all`, as a handler that maps
//!   the page's ids to calls would);
//! - moka's `future::Cache::get_with`, and the `cached` crate's `#[cached]`, per key, the same
//!   way;
//! - across processes, the batch and single-key functions with `lock = "redis"`, and the `cached`
//!   crate's Redis store (`#[concurrent_cached(redis = true)]`) per key.
//!
//! Measured side by side in one run: database queries (counted at the one function that queries
//! a real SQLite database, in memory, through sqlx), Redis round trips (every command a client
//! sent the benchmark's own `redis-server` during the page, read through `MONITOR`; the commands
//! a script runs ride on its round trip and are not counted) and the wall time of a page (median
//! over the rounds; `MONITOR` slows every Redis contender alike). Ratios are to the batch function of the same tier.
//!
//! ```sh
//! cargo bench -p stampede-benches --bench batch
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};
use stampede_benches::{BenchRedis, CONNECTION, median};

/// Keys on a page.
const PAGE: u64 = 50;
/// Pages per phase and contender.
const ROUNDS: u64 = 40;
/// Keys dropped from a warm page before each round of the second phase (10%).
const EXPIRED: u64 = 5;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Product {
    id: u64,
    name: String,
    price_cents: i64,
}

#[derive(Clone, Debug)]
struct DbError(String);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

impl From<stampede::Error> for DbError {
    fn from(error: stampede::Error) -> Self {
        DbError(error.to_string())
    }
}

static POOL: OnceLock<SqlitePool> = OnceLock::new();
static QUERIES: AtomicU64 = AtomicU64::new(0);

fn pool() -> &'static SqlitePool {
    POOL.get().expect("the database is opened first")
}

/// `SELECT` one product: one query.
async fn select_one(id: u64) -> Result<Product, DbError> {
    QUERIES.fetch_add(1, Relaxed);
    let row: (i64, String, i64) =
        sqlx::query_as("SELECT id, name, price_cents FROM products WHERE id = ?")
            .bind(id as i64)
            .fetch_one(pool())
            .await
            .map_err(|e| DbError(e.to_string()))?;
    Ok(Product {
        id: row.0 as u64,
        name: row.1,
        price_cents: row.2,
    })
}

/// `SELECT` many products: one query, `WHERE id IN (..)`.
async fn select_many(ids: &[u64]) -> Result<HashMap<u64, Product>, DbError> {
    QUERIES.fetch_add(1, Relaxed);
    let marks = vec!["?"; ids.len()].join(", ");
    let sql = format!("SELECT id, name, price_cents FROM products WHERE id IN ({marks})");
    let mut query = sqlx::query_as::<_, (i64, String, i64)>(&sql);
    for &id in ids {
        query = query.bind(id as i64);
    }
    let rows = query
        .fetch_all(pool())
        .await
        .map_err(|e| DbError(e.to_string()))?;
    Ok(rows
        .into_iter()
        .map(|(id, name, price_cents)| {
            (
                id as u64,
                Product {
                    id: id as u64,
                    name,
                    price_cents,
                },
            )
        })
        .collect())
}

#[stampede::cached(ttl = "1h", batch = ids, name = "bench::batch")]
async fn stampede_batch(ids: Vec<u64>) -> Result<HashMap<u64, Product>, DbError> {
    select_many(&ids).await
}

#[stampede::cached(ttl = "1h", name = "bench::one")]
async fn stampede_one(id: u64) -> Result<Product, DbError> {
    select_one(id).await
}

#[stampede::cached(ttl = "1h", lock = "redis", redis = "bench", batch = ids, name = "bench::redis_batch")]
async fn stampede_redis_batch(ids: Vec<u64>) -> Result<HashMap<u64, Product>, DbError> {
    select_many(&ids).await
}

#[stampede::cached(ttl = "1h", lock = "redis", redis = "bench", name = "bench::redis_one")]
async fn stampede_redis_one(id: u64) -> Result<Product, DbError> {
    select_one(id).await
}

#[cached::cached(ttl_secs = 3600)]
async fn cached_one(id: u64) -> Result<Product, DbError> {
    select_one(id).await
}

#[cached::concurrent_cached(
    redis = true,
    ttl_secs = 3600,
    map_error = r##"|e| DbError(format!("{e}"))"##,
    key = "String",
    convert = r##"{ format!("batchbench:{id}") }"##
)]
async fn cached_redis_one(id: u64) -> Result<Product, DbError> {
    select_one(id).await
}

/// What one page cost.
#[derive(Default, Clone, Copy)]
struct Cost {
    queries: u64,
    round_trips: u64,
    wall: Duration,
}

/// Counts the commands clients send the benchmark's Redis, through `MONITOR` on a connection
/// of its own (a thread reading its lines): each line is one command a client sent (one round
/// trip, or one command of a pipeline), but those a script runs (`[0 lua]`), which ride on the
/// script's round trip. The commands of this program's own measuring (`ECHO` marks) are not
/// counted.
struct Monitor {
    /// Closed on drop, which ends `MONITOR`.
    stream: std::net::TcpStream,
    counted: std::sync::Arc<AtomicU64>,
    /// The last mark the monitor read.
    marked: std::sync::Arc<AtomicU64>,
    next_mark: u64,
}

impl Monitor {
    fn start(url: &str) -> Monitor {
        use std::io::{BufRead, BufReader, Write};
        let address = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let mut stream = std::net::TcpStream::connect(&address).expect("MONITOR's connection");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let counted = std::sync::Arc::new(AtomicU64::new(0));
        let marked = std::sync::Arc::new(AtomicU64::new(0));
        let (c, m) = (counted.clone(), marked.clone());
        let reading = stream.try_clone().expect("MONITOR's connection");
        std::thread::spawn(move || {
            for line in BufReader::new(reading).lines() {
                let Ok(line) = line else { return };
                if let Some(at) = line.find("\"stampede-bench-mark-") {
                    let mark = line[at + 21..].trim_end_matches('"').parse().unwrap_or(0);
                    m.store(mark, Relaxed);
                } else if line.contains(" [") && !line.contains(" lua] ") {
                    c.fetch_add(1, Relaxed);
                }
            }
        });
        Monitor {
            stream,
            counted,
            marked,
            next_mark: 1,
        }
    }

    /// Waits for the monitor to have read every command sent before now; the commands counted
    /// since the previous call.
    async fn sync(&mut self, redis: &mut redis::aio::MultiplexedConnection) -> u64 {
        let mark = self.next_mark;
        self.next_mark += 1;
        let _: String = redis::cmd("ECHO")
            .arg(format!("stampede-bench-mark-{mark}"))
            .query_async(redis)
            .await
            .expect("ECHO");
        let start = Instant::now();
        while self.marked.load(Relaxed) < mark {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "MONITOR fell silent"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        self.counted.swap(0, Relaxed)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// One page of `ids` through `load`, with its cost (its round trips counted with a monitor).
async fn page<F, Fut>(
    mut monitor: Option<&mut Monitor>,
    redis: &mut redis::aio::MultiplexedConnection,
    ids: Vec<u64>,
    load: F,
) -> Cost
where
    F: FnOnce(Vec<u64>) -> Fut,
    Fut: Future<Output = usize>,
{
    if let Some(monitor) = monitor.as_mut() {
        monitor.sync(redis).await;
    }
    let queries = QUERIES.load(Relaxed);
    let start = Instant::now();
    let found = load(ids).await;
    let wall = start.elapsed();
    assert_eq!(found as u64, PAGE, "every product of the page");
    Cost {
        queries: QUERIES.load(Relaxed) - queries,
        round_trips: match monitor {
            Some(monitor) => monitor.sync(redis).await,
            None => 0,
        },
        wall,
    }
}

/// The contenders, by name.
const NAMES: [&str; 7] = [
    "stampede batch (memory)",
    "stampede, 50 single-key calls (memory)",
    "moka get_with, per key",
    "cached #[cached], per key",
    "stampede batch (lock = \"redis\")",
    "stampede, 50 single-key calls (lock = \"redis\")",
    "cached Redis store, per key",
];

/// Loads a page with contender `which`; how many products it found.
async fn load(which: usize, moka: &moka::future::Cache<u64, Product>, ids: Vec<u64>) -> usize {
    match which {
        0 => stampede_batch(ids).await.expect("batch").len(),
        1 => ok_count(join_all(ids.into_iter().map(stampede_one)).await),
        2 => ok_count(
            join_all(
                ids.into_iter()
                    .map(|id| async move { moka.try_get_with(id, select_one(id)).await }),
            )
            .await,
        ),
        3 => ok_count(join_all(ids.into_iter().map(cached_one)).await),
        4 => stampede_redis_batch(ids).await.expect("batch").len(),
        5 => ok_count(join_all(ids.into_iter().map(stampede_redis_one)).await),
        _ => ok_count(join_all(ids.into_iter().map(cached_redis_one)).await),
    }
}

fn ok_count<T, E>(answers: Vec<Result<T, E>>) -> usize {
    answers.iter().filter(|answer| answer.is_ok()).count()
}

/// Drops `ids` from contender `which`'s cache (and its Redis, for the Redis ones).
async fn expire(
    which: usize,
    moka: &moka::future::Cache<u64, Product>,
    redis: &mut redis::aio::MultiplexedConnection,
    ids: &[u64],
) {
    for &id in ids {
        match which {
            0 => stampede_batch::invalidate(id).await.expect("invalidate"),
            1 => stampede_one::invalidate(id).await.expect("invalidate"),
            2 => moka.invalidate(&id).await,
            3 => {
                use cached::Cached;
                let _ = CACHED_ONE.write().await.cache_remove(&id);
            }
            4 => stampede_redis_batch::invalidate(id)
                .await
                .expect("invalidate"),
            5 => stampede_redis_one::invalidate(id)
                .await
                .expect("invalidate"),
            _ => {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("*:batchbench%3A{id}"))
                    .query_async(redis)
                    .await
                    .expect("KEYS");
                assert!(!keys.is_empty(), "cached's key of {id} was not found");
                for key in keys {
                    let _: i64 = redis::cmd("DEL")
                        .arg(key)
                        .query_async(redis)
                        .await
                        .expect("DEL");
                }
            }
        }
    }
}

/// Per page: mean queries and round trips, median wall time.
fn summary(costs: &[Cost]) -> (f64, f64, Duration) {
    let n = costs.len() as f64;
    (
        costs.iter().map(|c| c.queries as f64).sum::<f64>() / n,
        costs.iter().map(|c| c.round_trips as f64).sum::<f64>() / n,
        median(costs.iter().map(|c| c.wall).collect()),
    )
}

fn main() {
    let Some(redis) = BenchRedis::installed_for_cached() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let moka = moka::future::Cache::new(100_000);
    let results = rt.block_on(async {
        // One connection: an in-memory SQLite database lives as long as its connection.
        let db = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("SQLite");
        sqlx::query("CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL)")
            .execute(&db)
            .await
            .expect("CREATE TABLE");
        for id in 0..(2 * NAMES.len() as u64 + 1) * ROUNDS * PAGE {
            sqlx::query("INSERT INTO products VALUES (?, ?, ?)")
                .bind(id as i64)
                .bind(format!("product {id} {}", "x".repeat(60)))
                .bind((id * 7 % 10_000) as i64)
                .execute(&db)
                .await
                .expect("INSERT");
        }
        POOL.set(db).expect("opened once");
        stampede::require_redis(Some(CONNECTION))
            .await
            .expect("the benchmark's Redis");
        let client = redis::Client::open(redis.url.as_str()).expect("a Redis URL");
        let mut stats = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        // Warm: connections open, scripts loaded, on keys no page uses.
        let warm: Vec<u64> = (0..PAGE)
            .map(|i| 2 * (NAMES.len() as u64) * ROUNDS * PAGE + i)
            .collect();
        for which in 0..NAMES.len() {
            load(which, &moka, warm.clone()).await;
        }
        // Two passes over keys of their own: the first counts round trips (through MONITOR,
        // which slows the server), the second times the pages without it.
        let mut passes = Vec::new();
        for pass in 0..2u64 {
            let mut monitor = (pass == 0).then(|| Monitor::start(&redis.url));
            let mut results = Vec::new();
            for which in 0..NAMES.len() {
                let base = (pass * NAMES.len() as u64 + which as u64) * ROUNDS * PAGE;
                let mut cold = Vec::new();
                for round in 0..ROUNDS {
                    let ids: Vec<u64> = (0..PAGE).map(|i| base + round * PAGE + i).collect();
                    let cost = page(monitor.as_mut(), &mut stats, ids, |ids| load(which, &moka, ids));
                    cold.push(cost.await);
                }
                // The first page, warm; each round drops 5 of its keys, other ones each time.
                let first: Vec<u64> = (0..PAGE).map(|i| base + i).collect();
                let mut expired = Vec::new();
                for round in 0..ROUNDS {
                    let dropped: Vec<u64> = (0..EXPIRED)
                        .map(|i| first[((round * EXPIRED + i) % PAGE) as usize])
                        .collect();
                    expire(which, &moka, &mut stats, &dropped).await;
                    let cost = page(monitor.as_mut(), &mut stats, first.clone(), |ids| {
                        load(which, &moka, ids)
                    });
                    expired.push(cost.await);
                }
                results.push((summary(&cold), summary(&expired)));
            }
            drop(monitor.take());
            passes.push(results);
        }
        // Counts from the first pass, wall times from the second.
        let timed = passes.pop().expect("two passes");
        let counted = passes.pop().expect("two passes");
        let results: Vec<_> = counted
            .into_iter()
            .zip(timed)
            .map(|((cold, expired), (cold_t, expired_t))| {
                ((cold.0, cold.1, cold_t.2), (expired.0, expired.1, expired_t.2))
            })
            .collect();
        results
    });
    println!(
        "A page of {PAGE} keys, {ROUNDS} pages per phase; per page: database queries and Redis round trips (mean), wall time (median); x: ratio to the batch function of the same tier\n"
    );
    for (phase, title) in [(0, "cold"), (1, "10% expired")] {
        println!("{title}:");
        println!(
            "| {:<46} | {:>8} | {:>11} | {:>10} | {:>7} |",
            "contender", "queries", "round trips", "wall", "wall x"
        );
        for (which, name) in NAMES.iter().enumerate() {
            let pick = |r: &((f64, f64, Duration), (f64, f64, Duration))| match phase {
                0 => r.0,
                _ => r.1,
            };
            let (queries, trips, wall) = pick(&results[which]);
            let reference = pick(&results[if which < 4 { 0 } else { 4 }]).2;
            println!(
                "| {:<46} | {:>8.1} | {:>11.1} | {:>10.1?} | {:>6.1}x |",
                name,
                queries,
                trips,
                wall,
                wall.as_secs_f64() / reference.as_secs_f64()
            );
        }
        println!();
    }
}
