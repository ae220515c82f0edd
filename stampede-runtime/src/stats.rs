//! Counters per cache, and the registry that lists every cache of the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use crate::config::Config;

/// A snapshot of one cache's counters, from [`stats`].
///
/// Counters only grow; `entries` and `in_flight` are the current sizes. `entries` is the
/// in-memory tier's count, which trails inserts and evictions by a moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls answered with a fresh value.
    pub hits: u64,
    /// Calls that found no servable value and waited for a load.
    pub misses: u64,
    /// Calls answered with a stale value while a refresh ran.
    pub stale_served: u64,
    /// Times the function's body ran (each retry counts).
    pub loads: u64,
    /// Load attempts that returned an error, panicked or timed out.
    pub load_errors: u64,
    /// Load attempts that ran past the timeout.
    pub timeouts: u64,
    /// Background refreshes started for stale values.
    pub refreshes: u64,
    /// Callers that joined a load another caller had started, and shared its result.
    pub shared: u64,
    /// Values held in memory now.
    pub entries: u64,
    /// Keys with a load in flight now.
    pub in_flight: u64,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.stale_served += other.stale_served;
        self.loads += other.loads;
        self.load_errors += other.load_errors;
        self.timeouts += other.timeouts;
        self.refreshes += other.refreshes;
        self.shared += other.shared;
        self.entries += other.entries;
        self.in_flight += other.in_flight;
    }
}

/// The live counters of one cache.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) stale_served: AtomicU64,
    pub(crate) loads: AtomicU64,
    pub(crate) load_errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) refreshes: AtomicU64,
    pub(crate) shared: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, entries: u64, in_flight: u64) -> Stats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            hits: get(&self.hits),
            misses: get(&self.misses),
            stale_served: get(&self.stale_served),
            loads: get(&self.loads),
            load_errors: get(&self.load_errors),
            timeouts: get(&self.timeouts),
            refreshes: get(&self.refreshes),
            shared: get(&self.shared),
            entries,
            in_flight,
        }
    }
}

/// What the registry needs of a cache, whatever its key and value types.
pub(crate) trait Inspect: Send + Sync {
    fn config(&self) -> &Config;
    fn stats(&self) -> Stats;
}

static REGISTRY: RwLock<Vec<&'static dyn Inspect>> = RwLock::new(Vec::new());

pub(crate) fn register(cache: &'static dyn Inspect) {
    REGISTRY
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .push(cache);
}

/// One cache of the process, as [`caches`] lists it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CacheInfo {
    /// The options it was declared with.
    pub config: Config,
    /// Its counters now.
    pub stats: Stats,
}

/// The counters of the cache called `name`, or `None` before its function was first called.
///
/// A cache is named by `#[cached(name = "...")]`, by default `module::path::function`, or
/// `path::to::Type::method` for a method. Caches that share a name are summed.
///
/// ```
/// # async fn demo() {
/// if let Some(stats) = stampede_runtime::stats("shop::product") {
///     println!("{} hits, {} loads", stats.hits, stats.loads);
/// }
/// # }
/// ```
pub fn stats(name: &str) -> Option<Stats> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    let mut found = None;
    for cache in registry
        .iter()
        .filter(|cache| &*cache.config().name == name)
    {
        found.get_or_insert_with(Stats::default).add(&cache.stats());
    }
    found
}

/// Every cache of the process that has been called at least once: what a health or debug page
/// prints.
pub fn caches() -> Vec<CacheInfo> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    registry
        .iter()
        .map(|cache| CacheInfo {
            config: cache.config().clone(),
            stats: cache.stats(),
        })
        .collect()
}
