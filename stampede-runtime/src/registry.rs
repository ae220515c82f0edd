//! The one registry of the process's caches: what stats, debug pages, invalidation by name and
//! tiers (an invalidation announced by another process) find them through, each as an
//! [`AnyCache`] whatever its key, value and tier types.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{LazyLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::config::Config;
use crate::error::Error;
use crate::memory::Invalidation;
use crate::stats::Stats;

/// A cache as the registry holds it, whatever its key, value and tier types: what stats read
/// and what invalidations, by key, by name or by tag, do to it.
pub(crate) trait AnyCache: Send + Sync {
    /// Its options as the attribute built them.
    fn config(&self) -> &Config;
    /// Its options now, with those set at run time (`stampede::configure`).
    fn options(&self) -> std::sync::Arc<Config>;
    /// Runs its new fills and loads with `options` (checked already).
    fn retune(&self, options: Config);
    /// Its counters now.
    fn stats(&self) -> Stats;
    /// Drops `key` from the cache (or expires it, as `how` says), here and in its tier, as a
    /// lookup by `name` found it (see `Cache::invalidate_by`); `None` when `key` is not of
    /// the cache's key type.
    fn invalidate<'a>(
        &'a self,
        name: &'a str,
        key: &'a (dyn Any + Send + Sync),
        how: Invalidation,
    ) -> Option<BoxFuture<'a, Result<(), Error>>>;
    /// Drops (or expires, as `how` says), in this process only, the key that the cache's tier
    /// names `name` (an invalidation another process announced); nothing for a tier that names
    /// no keys.
    fn forget_named(&self, name: &str, how: Invalidation);
    /// Detaches, in this process only, the running loads of keys tagged `tag` (a tag's
    /// invalidation; stored entries are checked against it on read); nothing for an untagged
    /// cache.
    fn forget_tag(&self, tag: &str);
    /// Ends, in this process only, the freshness of every value tagged `tag` (a tag's expiry)
    /// and detaches the running loads of such keys; nothing for an untagged cache. A scan of
    /// the keys the cache holds and loads.
    fn expire_tag(&self, tag: &str);
    /// Drops every value of the cache, here and in its tier, and every other process's memory
    /// of it (`clear`), as a lookup by `name` found it (see `Cache::clear_by`).
    fn clear<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), Error>>;
    /// Drops, in this process only, every value of the cache (a clear another process
    /// announced) and detaches its running loads.
    fn clear_here(&self);
    /// Drops, in this process only, every value of a cache whose tier names its keys to other
    /// processes (its invalidations may have been missed), if it shares them `through` that
    /// connection (`None`: through any); nothing for a local cache. With `fail_safe`, each
    /// stays its key's last good value.
    fn forget_all_shared(&self, through: Option<&str>);
    /// As [`AnyCache::forget_all_shared`], but each value is kept, out of service from `until`
    /// on, rather than dropped, to be served again by [`AnyCache::resume_shared`] (the feed was
    /// lost; its log may tell what was missed).
    fn suspend_shared(&self, through: Option<&str>, until: tokio::time::Instant);
    /// Serves again what [`AnyCache::suspend_shared`] took out of service and memory still
    /// holds: the feed is back, and the invalidations it missed were applied from its log.
    fn resume_shared(&self, through: Option<&str>);
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The process's caches, in the order they were built, and by each name they answer to
/// ([`answered_by`](crate::names::answered_by)): a lookup by name (the invalidation feed makes
/// one per message) costs the same however many caches the process has.
#[derive(Default)]
struct Registry {
    all: Vec<&'static dyn AnyCache>,
    by_name: HashMap<String, Vec<&'static dyn AnyCache>>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

fn read() -> RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(PoisonError::into_inner)
}

fn write() -> RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(PoisonError::into_inner)
}

/// Lists `cache`, and reports a name another cache of this process has: two functions (each
/// instantiation or implementor has a name of its own), almost always a copied `name = ".."`.
pub(crate) fn register(cache: &'static dyn AnyCache) {
    let mut registry = write();
    let name = &cache.config().name;
    let listed = registry.by_name.get(&**name);
    if listed.is_some_and(|listed| listed.iter().any(|other| other.config().name == *name)) {
        tracing::error!(
            cache = %name,
            "stampede: two cached functions in this process are named `{name}`: a lookup by \
             the name reaches both, and on one Redis they share their values when their key \
             and value shapes match. Give each its own `name`."
        );
    }
    registry.all.push(cache);
    for answered in crate::names::answered_by(name) {
        let listed = registry.by_name.entry(answered.to_owned()).or_default();
        listed.push(cache);
    }
}

/// Takes `cache` off the registry (the simulation, before it frees the caches of a run).
#[cfg(feature = "simulation")]
pub(crate) fn unregister(cache: &'static dyn AnyCache) {
    let mut registry = write();
    let other = |listed: &&'static dyn AnyCache| !std::ptr::addr_eq(*listed, cache);
    registry.all.retain(other);
    for answered in crate::names::answered_by(&cache.config().name) {
        if let Some(listed) = registry.by_name.get_mut(answered) {
            listed.retain(other);
            if listed.is_empty() {
                registry.by_name.remove(answered);
            }
        }
    }
}

/// Every cache of the process.
pub(crate) fn all() -> Vec<&'static dyn AnyCache> {
    read().all.clone()
}

/// The caches that answer to `name` ([`answers_to`](crate::names::answers_to)): several in a
/// generic impl, or when names are shared. An invalidation, a `clear` or the stats by name
/// reach every instantiation of a generic function.
pub(crate) fn named(name: &str) -> Vec<&'static dyn AnyCache> {
    read().by_name.get(name).cloned().unwrap_or_default()
}

/// A cached function linked into the binary. The code `#[cached]` generates lists one for each
/// non-generic free function before `main` runs, so that a lookup by name (`invalidate(name,
/// key)`) builds the cache of a function this process never called.
pub struct Linked {
    name: &'static str,
    build: fn(),
    tagged: bool,
}

impl Linked {
    /// The function's cache name, how to build its cache, and whether it has `tags`.
    pub const fn new(name: &'static str, build: fn(), tagged: bool) -> Self {
        Linked {
            name,
            build,
            tagged,
        }
    }
}

/// Builds the cache of every linked function with `tags` (once; later calls find them built):
/// so that a tag's invalidation knows every shared store a tagged entry may be in, in a process
/// that never called those functions.
pub(crate) fn build_tagged() {
    for linked in inventory::iter::<Linked> {
        if linked.tagged {
            (linked.build)();
        }
    }
}

inventory::collect!(Linked);

/// Drops, in this process, every entry tagged `tag` and detaches the loads of such keys running
/// now: after this returns, no call here returns a value whose load began before it.
pub(crate) fn forget_tag(tag: &str) {
    crate::tags::mark(tag);
    for cache in all() {
        cache.forget_tag(tag);
    }
}

/// Drops (or, as `how` says, expires) in this process every entry tagged `tag`
/// ([`forget_tag`], [`AnyCache::expire_tag`]).
pub(crate) fn forget_tag_as(tag: &str, how: Invalidation) {
    match how {
        Invalidation::Drop => forget_tag(tag),
        Invalidation::Expire => {
            for cache in all() {
                cache.expire_tag(tag);
            }
        }
    }
}

/// The caches called `name`, building those of the linked functions called so first when
/// none is built yet (a process that never called them: an admin tool).
pub(crate) fn named_or_linked(name: &str) -> Vec<&'static dyn AnyCache> {
    let caches = named(name);
    if caches.is_empty() && build_linked(name) {
        return named(name);
    }
    caches
}

/// Builds the cache of every linked function called `name` that has none yet; whether any is
/// called so.
pub(crate) fn build_linked(name: &str) -> bool {
    let mut found = false;
    for linked in inventory::iter::<Linked> {
        if linked.name == name {
            (linked.build)();
            found = true;
        }
    }
    found
}
