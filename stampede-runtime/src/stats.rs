//! Counters per cache, and the public calls that read or act on the caches of the process.

use std::any::{Any, type_name};

use crate::config::Config;
use crate::error::Error;
pub use crate::hot::HotKey;
use crate::registry;

/// A snapshot of one cache's counters, from [`stats`].
///
/// Counters only grow and are exact; `entries`, `in_flight` and `waiters` are the current sizes.
/// `entries` counts the values held in memory, expired ones not yet reclaimed included.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Background refreshes that ran a load: of stale values, and early ones past
    /// `refresh_after` (the metric `cache_refresh_total{reason="stale"|"early"}`). Loads for misses are `misses - shared` at most, and
    /// every run of the body is in `loads`.
    pub refreshes: u64,
    /// Callers that joined a load another caller had started, and shared its result.
    pub shared: u64,
    /// Calls answered with the last good value: a failed load (`fail_safe`), or a load slower
    /// than `soft_timeout`.
    pub fail_safe_served: u64,
    /// Whether the circuit breaker (`breaker = N`) skips loads now.
    pub breaker_open: bool,
    /// Values read from Redis (L2) because this process had none.
    pub remote_hits: u64,
    /// Redis locks this process took to load a key.
    pub lock_acquired: u64,
    /// Times a key's Redis lock was held by another process.
    pub lock_busy: u64,
    /// Loads that ran without Redis because it was down, slow, refused or not configured.
    pub degraded: u64,
    /// Values in Redis that did not decode (another version of the type, foreign bytes).
    pub decode_errors: u64,
    /// Values held in memory now.
    pub entries: u64,
    /// Keys with a load in flight now.
    pub in_flight: u64,
    /// Callers waiting for a load now.
    pub waiters: u64,
    /// A sample of the most-hit keys, most hit first, with the age of their values.
    pub hot_keys: Vec<HotKey>,
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
        self.fail_safe_served += other.fail_safe_served;
        self.breaker_open |= other.breaker_open;
        self.remote_hits += other.remote_hits;
        self.lock_acquired += other.lock_acquired;
        self.lock_busy += other.lock_busy;
        self.degraded += other.degraded;
        self.decode_errors += other.decode_errors;
        self.entries += other.entries;
        self.in_flight += other.in_flight;
        self.waiters += other.waiters;
        self.hot_keys.extend(other.hot_keys.iter().cloned());
    }
}

/// One cache of the process, as [`caches`] lists it.
#[derive(Clone, Debug, serde::Serialize)]
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
    let mut found = None;
    for cache in registry::named(name) {
        found.get_or_insert_with(Stats::default).add(&cache.stats());
    }
    found
}

/// Every cache of the process that has been called at least once: what a health or debug page
/// prints.
///
/// ```
/// for cache in stampede_runtime::caches() {
///     println!("{}: {} hits, {} loads", cache.config.name, cache.stats.hits, cache.stats.loads);
/// }
/// ```
pub fn caches() -> Vec<CacheInfo> {
    registry::all()
        .into_iter()
        .map(|cache| CacheInfo {
            config: cache.config().clone(),
            stats: cache.stats(),
        })
        .collect()
}

/// Drops the value of one key of the cache called `name`, in this process and, for a cache
/// backed by Redis, in Redis and in every other process's memory. A load of the key that was
/// running meanwhile does not store its (possibly outdated) value.
///
/// `key` is the cache's key: the tuple of the key arguments, each owned (a `&str` argument is a
/// `String`), in the order of the `key` template or of the signature.
///
/// ```no_run
/// # async fn demo() -> Result<(), stampede_runtime::Error> {
/// // for `#[cached(ttl = "60s")] async fn user(id: u64, region: &str) -> User`
/// stampede_runtime::invalidate("users::user", (42u64, "eu".to_owned())).await?;
/// # Ok(()) }
/// ```
///
/// Fails with [`Error::InvalidConfig`] when no cache of that name has that key type. It works
/// in a process that never called the function when the function is a non-generic free
/// function linked into the binary (its cache is built then); a method's cache exists from its
/// first call on. Prefer the function's companion, which is typed (a wrong key type is a
/// compile error): `product::invalidate(id, region).await?` (`Type::method_invalidate` for a
/// method with `companion = true`).
pub async fn invalidate<K: Any + Send + Sync>(name: &str, key: K) -> Result<(), Error> {
    if invalidate_in(registry::named(name), &key).await? {
        return Ok(());
    }
    // Not called yet in this process: build the caches of the linked functions of that name.
    if registry::build_linked(name) && invalidate_in(registry::named(name), &key).await? {
        return Ok(());
    }
    Err(Error::invalid_config(format!(
        "no cache named `{name}` has keys of type `{}`; a key is the tuple of the key arguments, owned, in the order of the `key` template or of the signature",
        type_name::<K>()
    )))
}

/// Invalidates `key` in those of `caches` whose key type it is; whether any was.
async fn invalidate_in(
    caches: Vec<&'static dyn registry::Inspect>,
    key: &(dyn Any + Send + Sync),
) -> Result<bool, Error> {
    let mut found = false;
    for cache in caches {
        if let Some(invalidation) = cache.invalidate(key) {
            found = true;
            invalidation.await?;
        }
    }
    Ok(found)
}

/// Serializes an optional duration as whole milliseconds, or `null`.
pub(crate) fn millis_opt<S: serde::Serializer>(
    duration: &Option<std::time::Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => millis(duration, serializer),
        None => serializer.serialize_none(),
    }
}

/// Serializes a duration as whole milliseconds (the field says `_ms`).
pub(crate) fn millis<S: serde::Serializer>(
    duration: &std::time::Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}
