//! What a cache's counters read: [`Stats`] per cache and [`CacheInfo`] per listed cache, as
//! `stampede::stats` and `stampede::caches` return them.

use std::sync::Arc;

use crate::config::Config;
pub use crate::hot::HotKey;

/// A snapshot of one cache's counters, from [`stats`](crate::stats()).
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
    /// `refresh_after` (the metric `cache_refresh_total{reason="stale"|"early"}`). Loads for
    /// misses are `misses - shared` at most, and every run of the body is in `loads`.
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
    /// Loaded, refreshed or primed values not stored (in memory, or in Redis) because the
    /// value stored had a newer source version (`source_version`); the metric
    /// `cache_older_version_total`.
    pub older_versions: u64,
    /// Loads that waited for a free load of the cache (`max_loads`); the metric
    /// `cache_load_queued_total`.
    pub loads_queued: u64,
    /// Misses that found no free load (`max_loads`): refused at once, or after waiting
    /// `timeout`; the metric `cache_load_refused_total`.
    pub loads_refused: u64,
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
    /// How the cache is known in Redis, for a cache backed by Redis (the first one's, when
    /// caches share a name).
    pub identity: Option<Identity>,
}

impl Stats {
    /// Adds another cache's counters to these (caches that share a name are summed).
    pub(crate) fn add(&mut self, other: &Stats) {
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
        self.older_versions += other.older_versions;
        self.loads_queued += other.loads_queued;
        self.loads_refused += other.loads_refused;
        self.lock_acquired += other.lock_acquired;
        self.lock_busy += other.lock_busy;
        self.degraded += other.degraded;
        self.decode_errors += other.decode_errors;
        self.entries += other.entries;
        self.in_flight += other.in_flight;
        self.waiters += other.waiters;
        self.hot_keys.extend(other.hot_keys.iter().cloned());
        if self.identity.is_none() {
            self.identity.clone_from(&other.identity);
        }
    }
}

/// How a cache is known in a shared tier (Redis): what two processes, of one binary or of
/// two, must agree on to share its values, fills, invalidations and tags.
///
/// The identity is the cache's name, its `version` (if given), its `key` template (if given)
/// and the *shapes* of its key and value types as serde sees them (field names, element and
/// variant shapes, each primitive's kind; not the types' Rust paths or names), traced from the
/// types' `Deserialize` once, when the cache is built. Its Redis keys start
/// `{prefix}:{{name~fingerprint|`, the fingerprint a digest of the rest.
///
/// ```
/// for cache in stampede::caches() {
///     if let Some(identity) = &cache.identity {
///         println!("{} is {}~{} in Redis", cache.config.name, identity.name, identity.fingerprint);
///     }
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Identity {
    /// The cache's name.
    pub name: Arc<str>,
    /// `version = ".."`, if given.
    pub version: Option<Arc<str>>,
    /// The digest of the version, the key template and the two shapes, as the cache's Redis
    /// keys carry it after the name and `~`.
    pub fingerprint: Arc<str>,
    /// The key's shape, as traced: `(u64,str)` for the arguments `(id: u64, region: &str)`;
    /// or why it could not be traced.
    pub key_shape: Arc<str>,
    /// The value's shape, as traced, e.g. `struct{"id":u64,"name":str}`; or why it could not
    /// be traced.
    pub value_shape: Arc<str>,
    /// Why the cache shares nothing through Redis (a shape that cannot be traced, and no
    /// `version`); `None` when it does.
    pub problem: Option<Arc<str>>,
}

/// One cache of the process, as [`caches`](crate::caches()) lists it.
#[derive(Clone, Debug, serde::Serialize)]
#[non_exhaustive]
pub struct CacheInfo {
    /// Its options in force: those it was declared with, and those set at run time
    /// ([`configure`](crate::configure())).
    pub config: Config,
    /// How it is known in Redis, for a cache backed by Redis.
    pub identity: Option<Identity>,
    /// Its counters now.
    pub stats: Stats,
}
