//! The boundary between a cache and what it shares beyond this process.
//!
//! A cache's core (the memory tier, the loads in flight, loads with timeout and retry,
//! generations, stale serving) is generic over a [`Tier`]. The core calls the tier for one
//! thing: a key this process has no usable value for ([`Tier::fill`]), and for invalidations.
//! The tier reaches back into the core only through the [`Handle`] it is lent for that one
//! flight: load here, keep a value (the core, not the tier, checks that no invalidation came
//! since the flight began), serve a stale value to the waiters now.
//!
//! Arrows run one way: a tier holds no reference to a cache, and this module names no tier but
//! [`Local`]. The Redis tier lives in its own module; the runtime's unit tests use a fake one.
//!
//! The trait is not public. Getting a shared tier right takes more than its methods say: a lock
//! with leases and fencing, wake-ups without lost messages, invalidations that reach every
//! process, generations so that an old load never overwrites a newer value. Until a second
//! shared store is built here and the contract has settled, a public trait would freeze an API
//! that users could implement only by re-deriving those rules; see `docs/tiers.md`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;

use crate::cache::{Core, Key, Value};
use crate::config::Config;
use crate::entry::{Entry, Freshness, jittered_ttl};
use crate::error::Error;
use crate::flight::Leader;
use crate::load::Load;
use crate::memory::Loading;
use crate::stats::Stats;
use crate::tags::Stamp;
use crate::telemetry::Reason;

/// What a cache shares beyond this process. Chosen statically by the code `#[cached]`
/// generates, so a hit pays no dispatch.
pub trait Tier<K: Key, V: Value>: Send + Sync + 'static {
    /// Gets the value of a key this process has no usable value for: from the shared store, or
    /// by loading it through `handle` (and sharing the result). Runs inside the key's flight.
    fn fill<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
    ) -> impl Future<Output = Result<V, Error>> + Send;

    /// Drops `key` from the shared store and from every other process's memory. This process's
    /// memory has dropped it already.
    fn invalidate(
        &self,
        config: &Config,
        key: &K,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Loads a key now, whatever value is held for it here or in the shared store, and stores
    /// the result (a companion's `refresh`). Runs inside the key's flight.
    fn refresh<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
    ) -> impl Future<Output = Result<V, Error>> + Send {
        handle.load_and_keep()
    }

    /// Stores a value for a key as if it had been loaded now (a companion's `prime`): in this
    /// process's memory and in the shared store.
    fn prime<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        handle.keep_loaded(value);
        std::future::ready(Ok(()))
    }

    /// Whether [`Tier::read`] may find a key's value: a cache then asks it on the caller's task
    /// before it starts or joins a flight.
    fn reads(&self) -> bool {
        false
    }

    /// A fresh value of a key this process lacks, read from the shared store on the caller's
    /// task without a lock and kept through `direct`; `None` when there is none (or the store
    /// cannot be read): the caller then goes through the key's flight. Never loads.
    fn read(&self, direct: &Direct<'_, K, V>) -> impl Future<Output = Option<V>> + Send {
        let _ = direct;
        std::future::ready(None)
    }

    /// How the tier names a key to other processes, so that an invalidation they announce can
    /// be matched against this process's keys. `None`: nothing is announced.
    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        None
    }

    /// The cache has `tags`: a tag's invalidation must reach the shared store this tier uses.
    fn tagged(&self) {}

    /// Adds the tier's own counters to a cache's stats.
    fn add_stats(&self, stats: &mut Stats) {
        let _ = stats;
    }
}

/// Nothing is shared: every value is loaded and kept in this process.
pub struct Local;

/// The tier of a cache whose values stay in this process.
pub fn local() -> fn(&Config) -> Local {
    |_| Local
}

impl<K: Key, V: Value> Tier<K, V> for Local {
    async fn fill<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Result<V, Error> {
        handle.load_and_keep().await
    }

    async fn invalidate(&self, _config: &Config, _key: &K) -> Result<(), Error> {
        Ok(())
    }
}

/// An entry as the cache's options have it kept: refreshed early past `refresh_after`, and
/// kept for `fail_safe` past its stale deadline.
fn with_options<V>(config: &Config, entry: Entry<V>) -> Entry<V> {
    let entry = match config.refresh_after {
        Some(after) => {
            let at = crate::clock::after(entry.filled_at(), jittered_ttl(after, config.jitter));
            entry.refreshing_from(at)
        }
        None => entry,
    };
    match config.fail_safe {
        Some(fail_safe) => entry.failing_safe_for(fail_safe),
        None => entry,
    }
}

/// A flight's or a read's hold on its key: registered with the memory tier (a value is kept
/// only if the key was not invalidated since) and, for a cache with `tags`, stamped with the
/// key's tags and the tag epoch it began in, before its source is read.
struct Begun<'a, K: Key, V: Value> {
    loading: Loading<'a, K, V>,
    stamp: Option<Arc<Stamp>>,
}

impl<'a, K: Key, V: Value> Begun<'a, K, V> {
    fn new(core: &'a Core<K, V>, key: &K) -> Self {
        Begun {
            stamp: core.stamp(key),
            loading: core.memory.begin(key),
        }
    }

    /// Unless a load or a read of the key is registered already.
    fn alone(core: &'a Core<K, V>, key: &K) -> Option<Self> {
        Some(Begun {
            loading: core.memory.begin_alone(key)?,
            stamp: core.stamp(key),
        })
    }

    /// `entry` as it is kept: with the cache's options, stamped with the key's tags.
    fn entry(&self, config: &Config, entry: Entry<V>) -> Entry<V> {
        with_options(config, entry).stamped(self.stamp.as_ref())
    }

    /// Keeps `entry` in memory (unless values live only in the shared tier) if the key was not
    /// invalidated since this began; whether it was not.
    fn keep(&self, core: &Core<K, V>, entry: Entry<V>) -> bool {
        if core.config.in_memory() {
            core.memory.keep(&self.loading, entry)
        } else {
            core.memory.is_current(&self.loading)
        }
    }
}

/// A cache's core, lent to its tier for one read of one key on the caller's task, outside any
/// flight ([`Tier::read`]). Registered with the memory tier like a load, so that a value read
/// before an invalidation is neither kept nor returned.
pub struct Direct<'a, K: Key, V: Value> {
    core: &'a Core<K, V>,
    key: &'a K,
    begun: Begun<'a, K, V>,
}

impl<'a, K: Key, V: Value> Direct<'a, K, V> {
    /// The read of `key`, unless a load or another read of it runs in this process: a cold
    /// key's concurrent callers then make one read, and go through the flight after it.
    pub(crate) fn new(core: &'a Core<K, V>, key: &'a K) -> Option<Self> {
        Some(Direct {
            begun: Begun::alone(core, key)?,
            core,
            key,
        })
    }

    /// The key read.
    pub(crate) fn key(&self) -> &K {
        self.key
    }

    /// The value of an entry read from the shared store, kept in memory (unless values live
    /// only in the shared tier), if it is fresh and the key was not invalidated since the read
    /// began; `None` otherwise (past `refresh_after` included: a refresh is the flight's).
    pub(crate) fn keep(&self, entry: Entry<V>) -> Option<V> {
        let entry = self.begun.entry(&self.core.config, entry);
        // A tag of the key invalidated while it was read: the flight decides.
        if entry.freshness(Instant::now()) != Freshness::Fresh || !entry.current() {
            return None;
        }
        let value = entry.value.clone();
        self.begun.keep(self.core, entry).then_some(value)
    }
}

/// A cache's core, lent to its tier for one flight of one key.
pub struct Handle<'a, K: Key, V: Value, L> {
    core: &'a Core<K, V>,
    key: &'a K,
    load: &'a L,
    reason: Reason,
    /// The flight's registration with the memory tier and its tags.
    begun: Begun<'a, K, V>,
    /// The flight's leader, to hand a stale value to its waiters; `None` without a lock.
    leader: Option<&'a Leader<'static, K, V>>,
    /// Whether the load has started, so that `cache_refresh_total` counts it once.
    started: AtomicBool,
    /// For an early refresh, when the value it replaces was loaded.
    refreshing: Option<Instant>,
}

impl<'a, K: Key, V: Value, L: Load<K, V>> Handle<'a, K, V, L> {
    pub(crate) fn new(
        core: &'a Core<K, V>,
        key: &'a K,
        load: &'a L,
        reason: Reason,
        leader: Option<&'a Leader<'static, K, V>>,
    ) -> Self {
        let refreshing = match reason {
            Reason::Early => core.entry(key).map(|entry| entry.filled_at()),
            Reason::Miss | Reason::Stale => None,
        };
        Handle {
            refreshing,
            begun: Begun::new(core, key),
            core,
            key,
            load,
            reason,
            leader,
            started: AtomicBool::new(false),
        }
    }

    /// The key of this flight.
    pub(crate) fn key(&self) -> &K {
        self.key
    }

    /// The key's tags, for a cache with `tags`.
    pub(crate) fn tags(&self) -> &[Box<str>] {
        self.begun.stamp.as_ref().map_or(&[], |stamp| stamp.tags())
    }

    /// The cache's options.
    pub(crate) fn config(&self) -> &Config {
        &self.core.config
    }

    /// Runs the function's load here, with its timeout and retries; stores nothing.
    pub(crate) async fn load(&self) -> Result<V, Error> {
        if !self.started.swap(true, Ordering::Relaxed) {
            self.core.telemetry.load_started(self.reason);
        }
        crate::load::attempts(&self.core.config, &self.core.telemetry, self.key, self.load).await
    }

    /// Loads here and keeps the value in memory for a jittered `ttl`, then `stale`: the path
    /// without a shared tier, and a tier's fallback when its store cannot be used.
    pub(crate) async fn load_and_keep(&self) -> Result<V, Error> {
        let value = self.load().await?;
        Ok(self.keep_loaded(value))
    }

    /// Keeps a value loaded now in memory for a jittered `ttl`, then `stale` (unless the key was
    /// invalidated since the flight began), and returns it.
    pub(crate) fn keep_loaded(&self, value: V) -> V {
        let config = &self.core.config;
        let fresh = jittered_ttl(config.ttl, config.jitter);
        let entry = Entry::loaded(value, Instant::now(), fresh, config.stale);
        self.keep(entry)
    }

    /// Keeps `entry` in memory, unless the key was invalidated since the flight began (or values
    /// live only in the shared tier), and returns its value.
    pub(crate) fn keep(&self, entry: Entry<V>) -> V {
        let entry = self.begun.entry(&self.core.config, entry);
        let value = entry.value.clone();
        self.begun.keep(self.core, entry);
        value
    }

    /// What a failed load gives its callers: with `fail_safe`, the key's last good value (unless
    /// the key was invalidated since the flight began), served for the throttle; else `error`.
    pub(crate) fn fail_safe(&self, error: Error) -> Result<V, Error> {
        let config = &self.core.config;
        if config.fail_safe.is_none() || !config.in_memory() {
            return Err(error);
        }
        let now = Instant::now();
        match self.core.entry(self.key) {
            Some(entry) if entry.fail_safe(now) => {
                let entry = entry.throttled(now, config.fail_safe_throttle);
                if self.core.memory.keep(&self.begun.loading, entry.clone()) {
                    self.core.telemetry.fail_safe_served.bump();
                    tracing::debug!(cache = %config.name, %error, "stampede: a load failed; serving the last good value");
                    Ok(entry.value)
                } else {
                    Err(error) // invalidated meanwhile: the last good value is no good
                }
            }
            _ => Err(error),
        }
    }

    /// For an early refresh (`refresh_after`), when the value it replaces was loaded: a shared
    /// value loaded later is newer, and needs no load.
    pub(crate) fn refreshing(&self) -> Option<Instant> {
        self.refreshing
    }

    /// Hands a stale value to the flight's waiters now, while the refresh goes on. A waiter
    /// takes it only while it is servable; past its deadline, waiters wait for the refresh.
    pub(crate) fn serve(&self, entry: &Entry<V>) {
        if let Some(leader) = self.leader {
            leader.serve(entry.clone());
        }
    }
}
