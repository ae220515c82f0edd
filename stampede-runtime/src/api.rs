//! The calls a service makes on the caches of its process: read their counters ([`stats`],
//! [`caches`]) and invalidate by key ([`invalidate`]) or by tag ([`invalidate_tag`]). They find
//! the caches through the registry, whatever their key, value and tier types.

use std::any::{Any, type_name};
use std::time::Duration;

use crate::error::Error;
use crate::memory::Invalidation;
use crate::registry;
use crate::stats::{CacheInfo, Stats};
use crate::tuning::Overrides;

/// The counters of the cache called `name`, or `None` before its function was first called.
///
/// A cache is named by `#[cached(name = "...")]`, by default `module::path::function`, or
/// `path::to::Type::method` for a method. Caches that share a name are summed.
///
/// ```
/// # async fn demo() {
/// if let Some(stats) = stampede::stats("shop::product") {
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
/// for cache in stampede::caches() {
///     println!("{}: {} hits, {} loads", cache.config.name, cache.stats.hits, cache.stats.loads);
/// }
/// ```
pub fn caches() -> Vec<CacheInfo> {
    registry::all()
        .into_iter()
        .map(|cache| {
            let stats = cache.stats();
            CacheInfo {
                config: (*cache.options()).clone(),
                identity: stats.identity.clone(),
                stats,
            }
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
/// # async fn demo() -> Result<(), stampede::Error> {
/// // for `#[cached(ttl = "60s")] async fn user(id: u64, region: &str) -> User`
/// stampede::invalidate("users::user", (42u64, "eu".to_owned())).await?;
/// # Ok(()) }
/// ```
///
/// Fails with [`Error::InvalidConfig`] when no cache of that name has that key type, or when
/// a cache of that name is backed by Redis through a connection this process has not
/// configured (the invalidation would reach no other process), and with
/// [`Error::RedisUnavailable`] when that Redis does not answer. It works
/// in a process that never called the function when the function is a non-generic free
/// function linked into the binary (its cache is built then); a method's cache exists from its
/// first call on. Prefer the function's companion, which is typed (a wrong key type is a
/// compile error): `product::invalidate(id, region).await?` (`Type::method_invalidate` for a
/// method with `companion = true`).
pub async fn invalidate<K: Any + Send + Sync>(name: &str, key: K) -> Result<(), Error> {
    invalidate_named(name, &key, Invalidation::Drop).await
}

/// Ends the freshness of one key of the cache called `name`, in this process and, for a cache
/// backed by Redis, in Redis and in every other process's memory, without dropping its value:
/// the next call gets it as a stale value (for the cache's `stale` at most, counted from now)
/// while one refresh runs, and with `fail_safe` it stays the key's last good value. A cache
/// without `stale` loads at the next call, and keeps the value only as the last good one. A
/// load of the key that was running meanwhile (it read the source before) stores no fresh
/// value (in Redis, one newer than the expired value replaces it, expired too).
///
/// `key`, the errors and where it reaches are as for [`invalidate`]; prefer the companion's
/// typed `product::expire(id).await?`. A process of an earlier version of this crate ignores
/// the announcement: its copy stays fresh for the rest of its `ttl`.
///
/// ```no_run
/// # async fn demo() -> Result<(), stampede::Error> {
/// // the row changed; serve the old one a little longer while it reloads
/// stampede::expire("shop::product", (42u64,)).await?;
/// # Ok(()) }
/// ```
pub async fn expire<K: Any + Send + Sync>(name: &str, key: K) -> Result<(), Error> {
    invalidate_named(name, &key, Invalidation::Expire).await
}

/// Drops every value of the cache called `name`, in this process and, for a cache backed by
/// Redis, in Redis (every key of every shape of the name under the connection's prefix) and in
/// every other process's memory. A load of the cache that was running meanwhile stores nothing.
///
/// In Redis the keys are found with `SCAN` (on each master of a cluster): a walk of the
/// keyspace, for an admin tool or a deploy step, not a request's path; an ACL user needs
/// `SCAN` for it. Fails as [`invalidate`] does when no cache has that name, its Redis
/// connection is not configured here, or Redis does not answer (then this process's memory is
/// cleared all the same; call it again). A process of an earlier version ignores the
/// announcement. Prefer the companion's `product::clear()`.
///
/// ```no_run
/// # async fn demo() -> Result<(), stampede::Error> {
/// // the prices were recomputed in bulk
/// stampede::clear("shop::price").await?;
/// # Ok(()) }
/// ```
pub async fn clear(name: &str) -> Result<(), Error> {
    let caches = registry::named_or_linked(name);
    if caches.is_empty() {
        return Err(Error::invalid_config(format!(
            "no cache is named `{name}` (see `stampede::caches()` for the names in this process)"
        )));
    }
    let mut failed = None;
    for cache in caches {
        if let Err(error) = cache.clear(name).await {
            failed.get_or_insert(error);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Sets options of the caches called `name` at run time: what their new fills and loads read
/// (a value already held keeps the deadlines it was stored with). Each setter overrides the
/// attribute's value (and one set before); [`Configure::apply`] checks them against every cache
/// of the name, as the attribute checks a literal, and applies them to all or none.
///
/// ```
/// # use std::time::Duration;
/// #[stampede::cached(ttl = "60s", stale = "30s", name = "shop::price")]
/// async fn price(id: u64) -> u64 { id }
///
/// # #[tokio::main] async fn main() -> Result<(), stampede::Error> {
/// // at start-up, from the environment's settings
/// stampede::configure("shop::price")
///     .ttl(Duration::from_secs(5))
///     .stale(Duration::from_secs(60))
///     .apply()?;
/// # assert_eq!(price(1).await, 1);
/// # Ok(()) }
/// ```
///
/// The numbers a fill, a load or a wait reads can be set: `ttl`, `stale`, `jitter`, `timeout`,
/// `retries`, `backoff`, and where the attribute turns them on `fail_safe`,
/// `fail_safe_throttle`, `refresh_after`, `xfetch`, `memory_ttl`, `soft_timeout`, `compress`
/// and `batch_max`; what shapes the cache (its backend, lock, capacity, breaker, `max_loads`,
/// which options are on) is the attribute's. With Redis, each process sets its own: set them alike in every
/// process that shares the cache (from one configuration), or each fills Redis with its own
/// windows.
pub fn configure(name: &str) -> Configure {
    Configure {
        name: name.to_owned(),
        overrides: Overrides::default(),
    }
}

/// Options of a cache set at run time ([`configure`]).
#[must_use = "nothing is set until `apply`"]
pub struct Configure {
    name: String,
    overrides: Overrides,
}

impl Configure {
    /// How long a value is fresh, before jitter.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.overrides.ttl = Some(ttl);
        self
    }

    /// How long after its fresh time a value is served while one refresh runs.
    pub fn stale(mut self, stale: Duration) -> Self {
        self.overrides.stale = Some(stale);
        self
    }

    /// Percent (0..=100) by which a fill may shorten `ttl`.
    pub fn jitter(mut self, percent: u8) -> Self {
        self.overrides.jitter = Some(percent);
        self
    }

    /// The bound on one load attempt.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.overrides.timeout = Some(timeout);
        self
    }

    /// Extra attempts after a failed or timed-out attempt.
    pub fn retries(mut self, retries: u32) -> Self {
        self.overrides.retries = Some(retries);
        self
    }

    /// The base delay before a retry.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.overrides.backoff = Some(backoff);
        self
    }

    /// How long past its stale deadline the last good value stands in for a failed load (the
    /// attribute must turn `fail_safe` on).
    pub fn fail_safe(mut self, fail_safe: Duration) -> Self {
        self.overrides.fail_safe = Some(fail_safe);
        self
    }

    /// How long a served last good value stands before the source is asked again (the
    /// attribute must turn `fail_safe` on).
    pub fn fail_safe_throttle(mut self, throttle: Duration) -> Self {
        self.overrides.fail_safe_throttle = Some(throttle);
        self
    }

    /// Past this age a hit also starts one background refresh (the attribute must turn
    /// `refresh_after` on).
    pub fn refresh_after(mut self, refresh_after: Duration) -> Self {
        self.overrides.refresh_after = Some(refresh_after);
        self
    }

    /// XFetch's `beta` (the attribute must turn `xfetch` on).
    pub fn xfetch(mut self, beta: f64) -> Self {
        self.overrides.xfetch = Some(beta);
        self
    }

    /// How long a tiered cache serves a value from memory before it reads Redis again (the
    /// attribute must turn `memory_ttl` on).
    pub fn memory_ttl(mut self, memory_ttl: Duration) -> Self {
        self.overrides.memory_ttl = Some(memory_ttl);
        self
    }

    /// How long a caller waits for a load before it gets the last good value (the attribute
    /// must turn `soft_timeout` on).
    pub fn soft_timeout(mut self, soft_timeout: Duration) -> Self {
        self.overrides.soft_timeout = Some(soft_timeout);
        self
    }

    /// The payload size in bytes above which a value goes to Redis compressed (the attribute
    /// must turn `compress` on).
    pub fn compress(mut self, over_bytes: usize) -> Self {
        self.overrides.compress = Some(over_bytes);
        self
    }

    /// The most keys one call of a batch function is given (the attribute must set
    /// `batch_max`).
    pub fn batch_max(mut self, most: usize) -> Self {
        self.overrides.batch_max = Some(most);
        self
    }

    /// Checks the options against every cache called so (building a linked free function's
    /// cache that was not called yet) and applies them to all of them, for their new fills and
    /// loads, and to caches of the name built later; or changes nothing and fails with
    /// [`Error::InvalidConfig`] naming the cache, the option and why (a value the attribute
    /// would refuse as a literal, an option it does not turn on), or that no cache has the
    /// name in this process yet (a method's cache is built at its first call).
    pub fn apply(self) -> Result<(), Error> {
        let caches = registry::named_or_linked(&self.name);
        if caches.is_empty() {
            return Err(Error::invalid_config(format!(
                "no cache is named `{}` in this process yet, so nothing was configured (a method's cache is built at its first call)",
                self.name
            )));
        }
        let overrides = crate::tuning::merged(&self.name, &self.overrides);
        let options = caches
            .iter()
            .map(|cache| overrides.applied_to(cache.config()))
            .collect::<Result<Vec<_>, Error>>()?;
        crate::tuning::set(&self.name, &self.overrides);
        for (cache, options) in caches.into_iter().zip(options) {
            cache.retune(options);
        }
        Ok(())
    }
}

/// [`invalidate`] or [`expire`], as `how` says.
async fn invalidate_named<K: Any + Send + Sync>(
    name: &str,
    key: &K,
    how: Invalidation,
) -> Result<(), Error> {
    if invalidate_in(name, key, how).await? {
        return Ok(());
    }
    // Not called yet in this process: build the caches of the linked functions of that name.
    if registry::build_linked(name) && invalidate_in(name, key, how).await? {
        return Ok(());
    }
    Err(Error::invalid_config(format!(
        "no cache named `{name}` has keys of type `{}`; a key is the tuple of the key arguments, owned, in the order of the `key` template or of the signature",
        type_name::<K>()
    )))
}

/// Invalidates `key` (as `how` says) in those of the caches called `name` whose key type it
/// is, as asked for by `name`; whether any was.
async fn invalidate_in(
    name: &str,
    key: &(dyn Any + Send + Sync),
    how: Invalidation,
) -> Result<bool, Error> {
    let mut found = false;
    for cache in registry::named(name) {
        if let Some(invalidation) = cache.invalidate(name, key, how) {
            found = true;
            invalidation.await?;
        }
    }
    Ok(found)
}

/// Drops every entry tagged `tag` (`#[cached(tags = ["user:{id}", ..])]`), of every cached
/// function: in this process and, for caches backed by Redis, in Redis and in every other
/// process's memory. A load of a tagged key running meanwhile does not store its (possibly
/// outdated) value: after this returns, no call returns a value whose load began before it.
///
/// No key is scanned: each process checks an entry's tags on read, and Redis keeps, per tag,
/// the set of keys loaded with it (see the guide's invalidation page).
///
/// ```no_run
/// # async fn demo() -> Result<(), stampede::Error> {
/// // for `#[cached(ttl = "5m", tags = ["user:{user_id}"])] async fn orders(user_id: u64) -> ..`
/// stampede::invalidate_tag("user:42").await?;
/// # Ok(()) }
/// ```
///
/// Fails with [`Error::InvalidConfig`] when the Redis connection of a cache with tags is not
/// configured in this process (it reached no other process through it: an admin tool that
/// forgot its `RedisConfig`), and with [`Error::RedisUnavailable`] when such a Redis cannot be
/// reached (the caches of tagged free functions linked into the binary count, called or not;
/// a tagged method's, once called); this process's entries, and the other connections', are
/// dropped all the same.
pub async fn invalidate_tag(tag: &str) -> Result<(), Error> {
    invalidate_tag_as(tag, Invalidation::Drop).await
}

/// Ends the freshness of every entry tagged `tag`, of every cached function, without dropping
/// them, as [`expire`] does for one key: in this process and, for caches backed by Redis, in
/// Redis and in every other process's memory. Each is then served stale at once while one
/// refresh runs (for its cache's `stale` at most, from now), and with `fail_safe` stays its
/// key's last good value; a load of a tagged key running meanwhile stores nothing.
///
/// Unlike [`invalidate_tag`], which marks the tag and checks entries on read, each process
/// visits the keys its tagged caches hold and load (a scan of their memory); Redis keeps, per
/// tag, the set of keys loaded with it, as for an invalidation. The errors are
/// [`invalidate_tag`]'s. A process of an earlier version ignores the announcement.
///
/// ```no_run
/// # async fn demo() -> Result<(), stampede::Error> {
/// // the catalog was re-imported: serve the old pages while each is reloaded
/// stampede::expire_tag("catalog").await?;
/// # Ok(()) }
/// ```
pub async fn expire_tag(tag: &str) -> Result<(), Error> {
    invalidate_tag_as(tag, Invalidation::Expire).await
}

/// [`invalidate_tag`] or [`expire_tag`], as `how` says.
async fn invalidate_tag_as(tag: &str, how: Invalidation) -> Result<(), Error> {
    registry::forget_tag_as(tag, how);
    #[cfg(feature = "redis")]
    {
        let dropped = crate::redis::invalidate_tag(tag, how).await;
        // A call meanwhile may have read an old value from Redis before it was dropped there,
        // and kept it: mark the tag again, rather than wait for the announcement's echo.
        registry::forget_tag_as(tag, how);
        dropped?;
    }
    Ok(())
}
