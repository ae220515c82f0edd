//! The hit path: what one call costs when its key is warm, next to what a user would pick
//! instead (DESIGN.md section 7).
//!
//! One key, a 100-byte `String` value (every contender returns an owned copy, so every figure
//! includes the same clone and drop). Two groups:
//!
//! - `hit/1 task`: one task on a current-thread runtime calls in a loop.
//! - `hit/2 tasks`: two tasks on a 2-worker runtime call the same key at once; the figure is the
//!   wall time divided by the calls of one task, so it equals the 1-task figure when the two do
//!   not slow each other down.
//!
//! - `arc/1 task` and `arc/2 tasks`: the same, the value an `Arc<String>` (a clone is a reference
//!   count's increment, not a copy), for the contenders that have such a store.
//! - `zipf/1 task` and `zipf/2 tasks`: the same, each call asking for the next key of a Zipf
//!   (s = 1.0) sequence over 100,000 keys (drawn once from a fixed seed, every key warm in every
//!   contender; the second task starts in the middle of the sequence).
//!
//! The floor is a `std::sync::RwLock<HashMap>` read and clone (`RwLock<HashMap> floor`); the
//! same with `parking_lot`'s `RwLock` (`parking_lot floor`) is the floor of issue 38's harness,
//! measured beside it in the `hit` and `arc` groups.
//!
//! `quick_cache get` is the store stampede's memory tier is built on, raw; `quick_cache +
//! deadline` adds what the runtime does on a hit besides the lookup (read tokio's clock, compare
//! with the entry's deadline). The summary also prints each contender's throughput at 1 and 2
//! tasks and their ratio (2 tasks on 2 cores over 1 task).
//!
//! `stampede tiered L1` is a hit of a `lock = "redis"` function (memory in front of Redis): the
//! value is in this process's memory, so Redis is not asked. It needs a Redis: the one at
//! `STAMPEDE_BENCH_REDIS` if set, otherwise a `redis-server` of its own on a free loopback port;
//! without either the row is left out.
//!
//! `key/N args` measures a `#[stampede::cached]` hit whose key is built from 1, 3 or 5 arguments,
//! one of them a `&str` (turned into an owned `String` for the key), next to a raw moka `get` on
//! the same owned tuple built per call.
//!
//! `metrics/1 task` and `metrics/2 tasks` price recording metrics on a hit: the same memory hit
//! with no recorder installed (the runtime's metric handles are no-ops) and, on a cache first
//! called after installing `metrics-exporter-prometheus`'s recorder (handles are taken when a
//! cache is first called), with it. This group runs last: the recorder is process-global.
//!
//! Run: `cargo bench -p stampede-benches --bench hit` (add `-- --quick` for a shorter run; keep
//! `-p`, see `scenarios/main.rs`). After criterion's own
//! report, a summary prints every hit as a ratio to raw moka `get` and to the
//! `RwLock<HashMap>` floor.
//!
//! Profiling: with `STAMPEDE_BENCH_PROFILE=NAME[:CALLS]` the program skips criterion and makes
//! CALLS (default 100,000) warm hits of one contender inside `profiled_calls`, for callgrind's
//! `--toggle-collect=*profiled_calls*`; NAME is one of [`PROFILED`].

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use stampede_benches::BenchRedis;
use tokio::runtime::{Builder, Runtime};

/// The warm key every hit asks for.
const KEY: u64 = 42;
/// A task yields to its runtime after this many calls, so a loop of hits never starves it.
const YIELD_EVERY: u64 = 256;

/// The cached value: 100 bytes on the heap, as a row or a rendered fragment would be.
fn value() -> String {
    "v".repeat(100)
}

// ---- the contenders, each a warm cache of one key -------------------------------------------

#[stampede::cached(ttl = "1h", name = "bench::hit")]
async fn stampede_hit(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::cached(ttl_secs = 3600)]
async fn cached_default(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::cached(ttl_secs = 3600, sync_writes = true)]
async fn cached_sync_writes(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::cached(ttl_secs = 3600, sync_writes = "by_key")]
async fn cached_by_key(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::concurrent_cached(ttl_secs = 3600)]
async fn cached_concurrent(id: u64) -> String {
    black_box(id);
    value()
}

/// Tiered (`lock = "redis"` puts memory in front of Redis): a warm key is an L1 hit.
#[stampede::cached(ttl = "1h", lock = "redis", redis = "bench", name = "bench::tiered")]
async fn stampede_tiered(id: u64) -> String {
    black_box(id);
    value()
}

/// The same as [`stampede_hit`], on a cache first called after a metrics recorder is installed.
#[stampede::cached(ttl = "1h", name = "bench::recorded")]
async fn stampede_recorded(id: u64) -> String {
    black_box(id);
    value()
}

static MOKA: LazyLock<moka::future::Cache<u64, String>> = LazyLock::new(|| {
    moka::future::Cache::builder()
        .max_capacity(10_000)
        .time_to_live(Duration::from_secs(3600))
        .build()
});

/// The store the memory tier is built on, raw: bounded, with its own eviction, but no expiry
/// (the runtime judges freshness from the entry's deadlines).
static QUICK: LazyLock<quick_cache::sync::Cache<u64, String>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(10_000));

/// What a hit would cost if the runtime's entry lived in `quick_cache`: the lookup, then the
/// freshness check against the entry's deadline on tokio's clock, as the runtime does it.
#[derive(Clone)]
struct Deadlined {
    value: String,
    fresh_until: tokio::time::Instant,
}

static QUICK_ENTRY: LazyLock<quick_cache::sync::Cache<(u64,), Deadlined>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(10_000));

/// The floor: a read lock, a `HashMap` lookup and the clone, nothing else.
static FLOOR: LazyLock<RwLock<HashMap<u64, String>>> = LazyLock::new(Default::default);

async fn moka_get(id: u64) -> String {
    MOKA.get(&id).await.expect("warmed before measuring")
}

async fn moka_get_with(id: u64) -> String {
    MOKA.get_with(id, async { unreachable!("warmed before measuring") })
        .await
}

async fn quick_cache_get(id: u64) -> String {
    QUICK.get(&id).expect("warmed before measuring")
}

async fn quick_cache_entry(id: u64) -> String {
    let entry = QUICK_ENTRY.get(&(id,)).expect("warmed before measuring");
    assert!(tokio::time::Instant::now() < entry.fresh_until, "fresh");
    entry.value
}

async fn rwlock_floor(id: u64) -> String {
    let map = FLOOR.read().unwrap_or_else(|poison| poison.into_inner());
    map.get(&id).expect("warmed before measuring").clone()
}

/// The floor of the harness: the same with `parking_lot`'s `RwLock`.
static FLOOR_PL: LazyLock<parking_lot::RwLock<HashMap<u64, String>>> =
    LazyLock::new(Default::default);

async fn parking_lot_floor(id: u64) -> String {
    FLOOR_PL
        .read()
        .get(&id)
        .expect("warmed before measuring")
        .clone()
}

/// The contenders of `$list` (a macro naming each, given the measuring function, the group and
/// the runtime, and `$extra`) as the groups `$name/1 task`, on a current-thread runtime, and
/// `$name/2 tasks`, on a 2-worker one.
macro_rules! one_and_two_tasks {
    ($c:expr, $name:literal, $list:ident $(, $extra:expr)*) => {{
        let rt = current_thread();
        let mut group = $c.benchmark_group(concat!($name, "/1 task"));
        $list!(one_task, &mut group, &rt $(, $extra)*);
        group.finish();
        let rt = two_workers();
        let mut group = $c.benchmark_group(concat!($name, "/2 tasks"));
        $list!(two_tasks, &mut group, &rt $(, $extra)*);
        group.finish();
    }};
}

// ---- an `Arc` value ----------------------------------------------------------------------------

/// The same value shared: cloning it is a reference count's increment rather than a copy of the
/// bytes, as a service that caches `Arc`s has it (and as issue 38's own harness measured).
fn shared() -> Arc<String> {
    Arc::new(value())
}

#[stampede::cached(ttl = "1h", name = "bench::arc")]
async fn stampede_arc(id: u64) -> Arc<String> {
    black_box(id);
    shared()
}

#[cached::concurrent_cached(ttl_secs = 3600)]
async fn cached_concurrent_arc(id: u64) -> Arc<String> {
    black_box(id);
    shared()
}

static MOKA_ARC: LazyLock<moka::future::Cache<u64, Arc<String>>> = LazyLock::new(|| {
    moka::future::Cache::builder()
        .max_capacity(10_000)
        .time_to_live(Duration::from_secs(3600))
        .build()
});

static QUICK_ARC: LazyLock<quick_cache::sync::Cache<u64, Arc<String>>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(10_000));

static FLOOR_ARC: LazyLock<RwLock<HashMap<u64, Arc<String>>>> = LazyLock::new(Default::default);

async fn moka_get_arc(id: u64) -> Arc<String> {
    MOKA_ARC.get(&id).await.expect("warmed before measuring")
}

async fn quick_cache_get_arc(id: u64) -> Arc<String> {
    QUICK_ARC.get(&id).expect("warmed before measuring")
}

async fn rwlock_floor_arc(id: u64) -> Arc<String> {
    let map = FLOOR_ARC
        .read()
        .unwrap_or_else(|poison| poison.into_inner());
    Arc::clone(map.get(&id).expect("warmed before measuring"))
}

static FLOOR_PL_ARC: LazyLock<parking_lot::RwLock<HashMap<u64, Arc<String>>>> =
    LazyLock::new(Default::default);

async fn parking_lot_floor_arc(id: u64) -> Arc<String> {
    Arc::clone(
        FLOOR_PL_ARC
            .read()
            .get(&id)
            .expect("warmed before measuring"),
    )
}

/// Warms every `Arc` contender's key.
fn warm_arcs(rt: &Runtime) {
    rt.block_on(MOKA_ARC.insert(KEY, shared()));
    QUICK_ARC.insert(KEY, shared());
    FLOOR_ARC
        .write()
        .unwrap_or_else(|poison| poison.into_inner())
        .insert(KEY, shared());
    FLOOR_PL_ARC.write().insert(KEY, shared());
}

// ---- a Zipf spread ------------------------------------------------------------------------------

/// Keys of the Zipf rows: 0 to `ZIPF_KEYS - 1`, every one warm in every contender.
const ZIPF_KEYS: u64 = 100_000;
/// How many calls the precomputed key sequence holds (a power of two); calls cycle through it.
const ZIPF_CALLS: usize = 1 << 20;

/// The Zipf (s = 1.0) key sequence, drawn once from a fixed seed: every contender asks for the
/// same keys in the same order, and drawing costs nothing during the measurement.
static ZIPF: LazyLock<Vec<u64>> = LazyLock::new(|| {
    use rand::SeedableRng;
    use rand_distr::Distribution;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(14);
    let zipf = rand_distr::Zipf::new(ZIPF_KEYS as f64, 1.0).expect("valid Zipf parameters");
    // Ranks run from 1; rank 1 (key 0) is the most asked for.
    (0..ZIPF_CALLS)
        .map(|_| zipf.sample(&mut rng) as u64 - 1)
        .collect()
});

/// The key of call number `call`.
#[inline]
fn zipf_key(call: u64) -> u64 {
    ZIPF[call as usize & (ZIPF_CALLS - 1)]
}

#[stampede::cached(ttl = "1h", capacity = 200_000, name = "bench::zipf")]
async fn stampede_zipf(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::cached(ttl_secs = 3600)]
async fn cached_zipf(id: u64) -> String {
    black_box(id);
    value()
}

#[cached::concurrent_cached(ttl_secs = 3600)]
async fn cached_concurrent_zipf(id: u64) -> String {
    black_box(id);
    value()
}

static MOKA_ZIPF: LazyLock<moka::future::Cache<u64, String>> = LazyLock::new(|| {
    moka::future::Cache::builder()
        .max_capacity(200_000)
        .time_to_live(Duration::from_secs(3600))
        .build()
});

static QUICK_ZIPF: LazyLock<quick_cache::sync::Cache<u64, String>> =
    LazyLock::new(|| quick_cache::sync::Cache::new(200_000));

static FLOOR_ZIPF: LazyLock<RwLock<HashMap<u64, String>>> = LazyLock::new(Default::default);

/// Every Zipf key stored in every contender, before any is measured.
fn warm_zipf(rt: &Runtime) {
    LazyLock::force(&ZIPF);
    rt.block_on(async {
        for key in 0..ZIPF_KEYS {
            stampede_zipf(key).await;
            cached_zipf(key).await;
            cached_concurrent_zipf(key).await;
            MOKA_ZIPF.insert(key, value()).await;
        }
        MOKA_ZIPF.run_pending_tasks().await;
    });
    let mut floor = FLOOR_ZIPF
        .write()
        .unwrap_or_else(|poison| poison.into_inner());
    for key in 0..ZIPF_KEYS {
        QUICK_ZIPF.insert(key, value());
        floor.insert(key, value());
    }
}

/// The contenders of the Zipf groups, each asked for the key of its call number.
macro_rules! zipf_hits {
    ($bench:ident, $group:expr, $rt:expr) => {
        $bench($group, $rt, "stampede", |i| stampede_zipf(zipf_key(i)));
        $bench($group, $rt, "moka get", |i| async move {
            MOKA_ZIPF.get(&zipf_key(i)).await.expect("warm")
        });
        $bench($group, $rt, "cached", |i| cached_zipf(zipf_key(i)));
        $bench($group, $rt, "concurrent_cached", |i| {
            cached_concurrent_zipf(zipf_key(i))
        });
        $bench($group, $rt, "quick_cache get", |i| async move {
            QUICK_ZIPF.get(&zipf_key(i)).expect("warm")
        });
        $bench($group, $rt, "RwLock<HashMap> floor", |i| async move {
            let map = FLOOR_ZIPF
                .read()
                .unwrap_or_else(|poison| poison.into_inner());
            map.get(&zipf_key(i)).expect("warm").clone()
        });
    };
}

fn zipf_hits(c: &mut Criterion) {
    warm_zipf(&current_thread());
    one_and_two_tasks!(c, "zipf", zipf_hits);
}

/// The same contenders as `hits`, each returning the shared value ([`shared`]).
macro_rules! arc_hits {
    ($bench:ident, $group:expr, $rt:expr) => {
        $bench($group, $rt, "stampede", |_| stampede_arc(black_box(KEY)));
        $bench($group, $rt, "moka get", |_| moka_get_arc(black_box(KEY)));
        $bench($group, $rt, "concurrent_cached", |_| {
            cached_concurrent_arc(black_box(KEY))
        });
        $bench($group, $rt, "quick_cache get", |_| {
            quick_cache_get_arc(black_box(KEY))
        });
        $bench($group, $rt, "RwLock<HashMap> floor", |_| {
            rwlock_floor_arc(black_box(KEY))
        });
        $bench($group, $rt, "parking_lot floor", |_| {
            parking_lot_floor_arc(black_box(KEY))
        });
    };
}

fn arc_hits(c: &mut Criterion) {
    warm_arcs(&current_thread());
    one_and_two_tasks!(c, "arc", arc_hits);
}

// ---- keys of several arguments ----------------------------------------------------------------

#[stampede::cached(ttl = "1h", name = "bench::key1")]
async fn key1(name: &str) -> String {
    black_box(name);
    value()
}

#[stampede::cached(ttl = "1h", name = "bench::key3")]
async fn key3(id: u64, name: &str, region: u32) -> String {
    black_box((id, name, region));
    value()
}

#[stampede::cached(ttl = "1h", name = "bench::key5")]
async fn key5(id: u64, name: &str, region: u32, lang: u16, beta: bool) -> String {
    black_box((id, name, region, lang, beta));
    value()
}

static MOKA_KEY1: LazyLock<moka::future::Cache<String, String>> =
    LazyLock::new(|| moka::future::Cache::new(10_000));
#[allow(clippy::type_complexity)]
static MOKA_KEY3: LazyLock<moka::future::Cache<(u64, String, u32), String>> =
    LazyLock::new(|| moka::future::Cache::new(10_000));
#[allow(clippy::type_complexity)]
static MOKA_KEY5: LazyLock<moka::future::Cache<(u64, String, u32, u16, bool), String>> =
    LazyLock::new(|| moka::future::Cache::new(10_000));

const NAME: &str = "catalogue";

// ---- measuring ----------------------------------------------------------------------------------

/// `iters` calls in a row, yielding every [`YIELD_EVERY`]; each call is given its number,
/// counted from `from` (the Zipf rows pick their key by it).
async fn calls<F, Fut, T>(iters: u64, from: u64, call: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = T>,
{
    for i in 0..iters {
        black_box(call(from + i).await);
        if i % YIELD_EVERY == YIELD_EVERY - 1 {
            tokio::task::yield_now().await;
        }
    }
}

fn one_task<F, Fut, T>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, call: F)
where
    F: Fn(u64) -> Fut + Copy,
    Fut: Future<Output = T>,
{
    rt.block_on(call(0)); // warm
    group.bench_function(name, |b| {
        b.to_async(rt).iter_custom(|iters| async move {
            let start = Instant::now();
            calls(iters, 0, call).await;
            start.elapsed()
        })
    });
}

fn two_tasks<F, Fut, T>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, call: F)
where
    F: Fn(u64) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    rt.block_on(call(0)); // warm
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async move {
                let start = Instant::now();
                // The second task walks the Zipf sequence from its middle: the two are not in step.
                let tasks = [
                    tokio::spawn(calls(iters, 0, call)),
                    tokio::spawn(calls(iters, ZIPF_CALLS as u64 / 2, call)),
                ];
                for task in tasks {
                    task.await.expect("a calling task panicked");
                }
                start.elapsed()
            })
        })
    });
}

/// The same list of contenders for both groups.
macro_rules! hits {
    ($bench:ident, $group:expr, $rt:expr, $tiered:expr) => {
        $bench($group, $rt, "stampede", |_| stampede_hit(black_box(KEY)));
        if $tiered {
            $bench($group, $rt, "stampede tiered L1", |_| {
                stampede_tiered(black_box(KEY))
            });
        }
        $bench($group, $rt, "moka get", |_| moka_get(black_box(KEY)));
        $bench($group, $rt, "moka get_with", |_| {
            moka_get_with(black_box(KEY))
        });
        $bench($group, $rt, "cached", |_| cached_default(black_box(KEY)));
        $bench($group, $rt, "cached sync_writes", |_| {
            cached_sync_writes(black_box(KEY))
        });
        $bench($group, $rt, "cached by_key", |_| {
            cached_by_key(black_box(KEY))
        });
        $bench($group, $rt, "concurrent_cached", |_| {
            cached_concurrent(black_box(KEY))
        });
        $bench($group, $rt, "quick_cache get", |_| {
            quick_cache_get(black_box(KEY))
        });
        $bench($group, $rt, "quick_cache + deadline", |_| {
            quick_cache_entry(black_box(KEY))
        });
        $bench($group, $rt, "RwLock<HashMap> floor", |_| {
            rwlock_floor(black_box(KEY))
        });
        $bench($group, $rt, "parking_lot floor", |_| {
            parking_lot_floor(black_box(KEY))
        });
    };
}

fn two_workers() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a 2-worker runtime")
}

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn hits(c: &mut Criterion, tiered: bool) {
    let rt = current_thread();
    rt.block_on(MOKA.insert(KEY, value()));
    QUICK.insert(KEY, value());
    QUICK_ENTRY.insert(
        (KEY,),
        Deadlined {
            value: value(),
            fresh_until: tokio::time::Instant::now() + Duration::from_secs(3600),
        },
    );
    FLOOR
        .write()
        .unwrap_or_else(|poison| poison.into_inner())
        .insert(KEY, value());
    FLOOR_PL.write().insert(KEY, value());
    one_and_two_tasks!(c, "hit", hits, tiered);
}

fn keys(c: &mut Criterion) {
    let rt = current_thread();
    rt.block_on(async {
        MOKA_KEY1.insert(NAME.to_owned(), value()).await;
        MOKA_KEY3.insert((KEY, NAME.to_owned(), 7), value()).await;
        MOKA_KEY5
            .insert((KEY, NAME.to_owned(), 7, 3, true), value())
            .await;
    });
    let mut group = c.benchmark_group("key");
    one_task(&mut group, &rt, "stampede 1 arg", |_| key1(black_box(NAME)));
    one_task(&mut group, &rt, "stampede 3 args", |_| {
        key3(black_box(KEY), black_box(NAME), black_box(7))
    });
    one_task(&mut group, &rt, "stampede 5 args", |_| {
        key5(
            black_box(KEY),
            black_box(NAME),
            black_box(7),
            black_box(3),
            black_box(true),
        )
    });
    one_task(&mut group, &rt, "moka get 1 arg", |_| async {
        let key = black_box(NAME).to_owned();
        MOKA_KEY1.get(&key).await.expect("warm")
    });
    one_task(&mut group, &rt, "moka get 3 args", |_| async {
        let key = (black_box(KEY), black_box(NAME).to_owned(), black_box(7));
        MOKA_KEY3.get(&key).await.expect("warm")
    });
    one_task(&mut group, &rt, "moka get 5 args", |_| async {
        let key = (
            black_box(KEY),
            black_box(NAME).to_owned(),
            black_box(7),
            black_box(3),
            black_box(true),
        );
        MOKA_KEY5.get(&key).await.expect("warm")
    });
    group.finish();
}

/// Installs `metrics-exporter-prometheus`'s recorder, as a service does at start (without its
/// HTTP listener: the service renders the handle's text itself). Kept for the process's life.
fn install_recorder() {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("no other recorder is installed")
    });
}

fn recording(c: &mut Criterion) {
    let rt = current_thread();
    // Before the recorder: this cache's handles are no-ops (they are if `hits` called it first).
    rt.block_on(stampede_hit(KEY));
    install_recorder();
    rt.block_on(stampede_recorded(KEY));
    let mut group = c.benchmark_group("metrics/1 task");
    one_task(&mut group, &rt, "no recorder", |_| {
        stampede_hit(black_box(KEY))
    });
    one_task(&mut group, &rt, "prometheus recorder", |_| {
        stampede_recorded(black_box(KEY))
    });
    group.finish();

    let rt = two_workers();
    let mut group = c.benchmark_group("metrics/2 tasks");
    two_tasks(&mut group, &rt, "no recorder", |_| {
        stampede_hit(black_box(KEY))
    });
    two_tasks(&mut group, &rt, "prometheus recorder", |_| {
        stampede_recorded(black_box(KEY))
    });
    group.finish();
}

// ---- profiling ----------------------------------------------------------------------------------

/// The contenders `STAMPEDE_BENCH_PROFILE` can name.
const PROFILED: [&str; 11] = [
    "stampede",
    "stampede arc",
    "floor arc",
    "stampede tiered L1",
    "stampede recorded",
    "moka get",
    "moka get_with",
    "quick_cache + deadline",
    "floor",
    "parking_lot floor",
    "parking_lot floor arc",
];

/// `calls` warm hits; callgrind counts only inside this function.
#[inline(never)]
fn profiled_calls<F, Fut, T>(rt: &Runtime, calls_made: u64, call: F)
where
    F: Fn(u64) -> Fut + Copy,
    Fut: Future<Output = T>,
{
    rt.block_on(calls(calls_made, 0, call));
}

fn profile(spec: &str) -> Result<(), String> {
    let (name, count) = spec.split_once(':').unwrap_or((spec, "100000"));
    let count: u64 = count
        .parse()
        .map_err(|_| format!("`{count}` is not a number of calls"))?;
    let rt = current_thread();
    macro_rules! run {
        ($call:expr) => {{
            rt.block_on($call(0)); // warm
            profiled_calls(&rt, count, $call);
        }};
    }
    match name {
        "stampede" => run!(|_| stampede_hit(black_box(KEY))),
        "stampede tiered L1" => run!(|_| stampede_tiered(black_box(KEY))),
        "stampede recorded" => {
            install_recorder();
            run!(|_| stampede_recorded(black_box(KEY)))
        }
        "moka get" => {
            rt.block_on(MOKA.insert(KEY, value()));
            run!(|_| moka_get(black_box(KEY)))
        }
        "moka get_with" => {
            rt.block_on(MOKA.insert(KEY, value()));
            run!(|_| moka_get_with(black_box(KEY)))
        }
        "quick_cache + deadline" => {
            QUICK_ENTRY.insert(
                (KEY,),
                Deadlined {
                    value: value(),
                    fresh_until: tokio::time::Instant::now() + Duration::from_secs(3600),
                },
            );
            run!(|_| quick_cache_entry(black_box(KEY)))
        }
        "stampede arc" => run!(|_| stampede_arc(black_box(KEY))),
        "floor arc" => {
            warm_arcs(&rt);
            run!(|_| rwlock_floor_arc(black_box(KEY)))
        }
        "floor" => {
            FLOOR
                .write()
                .unwrap_or_else(|poison| poison.into_inner())
                .insert(KEY, value());
            run!(|_| rwlock_floor(black_box(KEY)))
        }
        "parking_lot floor" => {
            FLOOR_PL.write().insert(KEY, value());
            run!(|_| parking_lot_floor(black_box(KEY)))
        }
        "parking_lot floor arc" => {
            warm_arcs(&rt);
            run!(|_| parking_lot_floor_arc(black_box(KEY)))
        }
        other => return Err(format!("no contender `{other}`; one of {PROFILED:?}")),
    }
    println!("{count} hits of {name}");
    Ok(())
}

// ---- the summary ----------------------------------------------------------------------------

/// Where criterion writes its estimates, found the way criterion finds it.
fn criterion_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("criterion")
}

/// The median of one benchmark of this run, in nanoseconds per call.
fn median_ns(home: &std::path::Path, group: &str, bench: &str) -> Option<f64> {
    // criterion's directory names replace characters a file name cannot hold.
    let dir = |name: &str| name.replace(['/', '<', '>'], "_");
    let path = home
        .join(dir(group))
        .join(dir(bench))
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(&text).ok()?;
    estimates["median"]["point_estimate"].as_f64()
}

fn summary(home: &std::path::Path) {
    let ratio = |value: Option<f64>, reference: Option<f64>| match (value, reference) {
        (Some(v), Some(r)) => format!("{:.2}x", v / r),
        _ => "-".to_owned(),
    };
    let ns = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.1}"));
    for group in [
        "hit/1 task",
        "hit/2 tasks",
        "arc/1 task",
        "arc/2 tasks",
        "zipf/1 task",
        "zipf/2 tasks",
    ] {
        let moka = median_ns(home, group, "moka get");
        let floor = median_ns(home, group, "RwLock<HashMap> floor");
        println!();
        println!(
            "{group}: median ns per call (last run of each), as a ratio to moka get and to the floor"
        );
        println!(
            "{:<24} {:>9} {:>9} {:>9}",
            "contender", "ns/call", "/moka get", "/floor"
        );
        for bench in [
            "stampede",
            "stampede tiered L1",
            "moka get",
            "moka get_with",
            "cached",
            "cached sync_writes",
            "cached by_key",
            "concurrent_cached",
            "quick_cache get",
            "quick_cache + deadline",
            "RwLock<HashMap> floor",
            "parking_lot floor",
        ] {
            let value = median_ns(home, group, bench);
            if value.is_none() {
                continue;
            }
            println!(
                "{bench:<24} {:>9} {:>9} {:>9}",
                ns(value),
                ratio(value, moka),
                ratio(value, floor)
            );
        }
    }
    // Throughput: one task makes 1/t calls per ns; two make 2/t2 (t2 is per call of one task).
    for keys in ["hit", "arc", "zipf"] {
        println!();
        println!("{keys}: throughput in millions of calls per second, and 2 tasks over 1 task");
        println!(
            "{:<24} {:>9} {:>9} {:>9}",
            "contender", "1 task", "2 tasks", "scaling"
        );
        for bench in [
            "stampede",
            "moka get",
            "cached",
            "concurrent_cached",
            "quick_cache get",
            "RwLock<HashMap> floor",
            "parking_lot floor",
        ] {
            let one = median_ns(home, &format!("{keys}/1 task"), bench);
            let two = median_ns(home, &format!("{keys}/2 tasks"), bench);
            let (Some(one), Some(two)) = (one, two) else {
                continue;
            };
            println!(
                "{bench:<24} {:>9.1} {:>9.1} {:>8.2}x",
                1e3 / one,
                2e3 / two,
                2.0 * one / two
            );
        }
    }
    println!();
    println!(
        "metrics: median ns per call of a memory hit, with no recorder and with \
         metrics-exporter-prometheus's"
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9}",
        "tasks", "none", "recorder", "ratio"
    );
    for tasks in ["1 task", "2 tasks"] {
        let group = format!("metrics/{tasks}");
        let none = median_ns(home, &group, "no recorder");
        let recorder = median_ns(home, &group, "prometheus recorder");
        println!(
            "{tasks:<24} {:>9} {:>9} {:>9}",
            ns(none),
            ns(recorder),
            ratio(recorder, none)
        );
    }
    println!();
    println!("key: median ns per call, stampede against moka get on the same owned key");
    println!(
        "{:<24} {:>9} {:>9} {:>9}",
        "arguments", "stampede", "moka get", "ratio"
    );
    for args in ["1 arg", "3 args", "5 args"] {
        let ours = median_ns(home, "key", &format!("stampede {args}"));
        let moka = median_ns(home, "key", &format!("moka get {args}"));
        println!(
            "{args:<24} {:>9} {:>9} {:>9}",
            ns(ours),
            ns(moka),
            ratio(ours, moka)
        );
    }
}

/// The Redis of the tiered row, installed as the `bench` connection; `None` leaves the row out.
fn bench_redis() -> Option<BenchRedis> {
    let url = std::env::var("STAMPEDE_BENCH_REDIS").ok();
    match BenchRedis::get(url).and_then(|redis| {
        redis.install()?;
        Ok(redis)
    }) {
        Ok(redis) => {
            eprintln!(
                "Redis for the tiered row: {} at {}",
                redis.origin, redis.url
            );
            Some(redis)
        }
        Err(why) => {
            eprintln!("no Redis for the tiered row: {why}");
            None
        }
    }
}

fn main() {
    let redis = bench_redis();
    if let Ok(spec) = std::env::var("STAMPEDE_BENCH_PROFILE") {
        if let Err(error) = profile(&spec) {
            eprintln!("{error}");
            drop(redis); // `exit` runs no destructor: the server would outlive the program
            std::process::exit(2);
        }
        return;
    }
    let home = criterion_home();
    let mut criterion = Criterion::default()
        .output_directory(&home)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    hits(&mut criterion, redis.is_some());
    arc_hits(&mut criterion);
    zipf_hits(&mut criterion);
    keys(&mut criterion);
    recording(&mut criterion);
    criterion.final_summary();
    summary(&home);
    drop(redis);
}
