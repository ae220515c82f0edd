//! The boundary between a cache and what it shares beyond this process.
//!
//! A cache's core (the memory tier, the loads in flight, loads with timeout and retry,
//! generations) is generic over a [`Tier`]. The core asks the tier for the value of a key this
//! process has no usable value for ([`Tier::fetch`]), and the tier *reports what happened*
//! ([`Fetched`]): it loaded the value here, read one another process stored, its load failed,
//! or the key's lock is busy. The core alone turns that into what the callers get (stale-if-
//! error, fail-safe, the breaker, metrics: see `cache::settle`), the same way for every tier.
//!
//! The tier reaches back into the core only through the [`Handle`] it is lent for that one
//! flight: load here (the breaker's admission and accounting are the handle's), keep a value
//! (the core checks that no invalidation came since the flight began, and applies the options
//! and the trust cap), hand a stale value to the waiters now, offer a last good value.
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
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::config::{Config, Lifetime};
use crate::core::{Begun, Core};
use crate::entry::Entry;
use crate::error::Error;
use crate::flight::Leader;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::memory::{Invalidation, Kept};
use crate::order;
use crate::stats::{Identity, Stats};
use crate::telemetry::Reason;

mod batch;

pub use batch::{Batch, BatchLoad, One};
#[cfg(any(feature = "redis", feature = "simulation"))]
pub(crate) use batch::{Group, Single};

/// What a cache shares beyond this process. Chosen statically by the code `#[cached]`
/// generates, so a hit pays no dispatch.
pub trait Tier<K: Key, V: Value>: Send + Sync + 'static {
    /// Gets the value of a key this process has no usable value for: from the shared store, or
    /// by loading it through `handle` (and sharing the result); reports which. Runs inside the
    /// key's flight.
    fn fetch<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
    ) -> impl Future<Output = Fetched<V>> + Send;

    /// Stores a value for a key as if it had been loaded now (a companion's `prime`): in this
    /// process's memory and in the shared store.
    fn prime<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        handle.keep_loaded(Loaded::now(value), None);
        std::future::ready(Ok(()))
    }

    /// Drops `key` (or expires it, as `how` says) from the shared store and from every other
    /// process's memory (this process's memory has done so already); whether the shared store
    /// held a value for it. `name` is what the invalidation asked for: the cache's own name, or
    /// the stem it shares with the function's other caches (`names::stem`), which reaches
    /// theirs too, in every process.
    fn invalidate(
        &self,
        config: &Config,
        name: &str,
        key: &K,
        how: Invalidation,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Drops every key of the cache's name from the shared store, and every other process's
    /// memory of the cache (this process's memory has dropped it already). `name` is what the
    /// clear asked for, as for [`Tier::invalidate`]: asked for by the stem, it reaches the
    /// function's other caches too, in every process.
    fn clear(&self, config: &Config, name: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Gets the values of many keys this process has no usable value for, as [`Tier::fetch`]
    /// does for one, with one load of the keys it must load here: a batch function's call, or
    /// a window of single-key calls (`batch_window`). Reports each key's outcome through
    /// its group's [`report`](batch::Group::report) as soon as it is known (not when the last
    /// key is), so that no key waits in flight for another. Runs inside the flight of each key.
    /// Without a shared store, every key is loaded here: a tier that shares values overrides
    /// this.
    fn fetch_many<L: BatchLoad<K, V>>(
        &self,
        batch: &Batch<'_, K, V, L>,
    ) -> impl Future<Output = ()> + Send {
        batch.load_here(None)
    }

    /// [`Tier::read`] of many keys, each answered in order; by default one read after another
    /// at once. A tier that can read them together overrides it.
    fn read_many(
        &self,
        directs: &[Direct<'_, K, V>],
    ) -> impl Future<Output = Vec<Option<Shared<V>>>> + Send {
        futures_util::future::join_all(directs.iter().map(|direct| self.read(direct)))
    }

    /// How long a flight of this tier begun now would hear of an invalidation made in another
    /// process: `None` (throughout) for a tier that shares nothing or whose feed is live;
    /// `Some(bound)` while the feed is not known to be live (or the store cannot be used).
    /// Memory keeps a value no longer than that from its flight's start, and a caller joins a
    /// flight only within that of its start: later, it loads anew.
    fn trusted_for(&self) -> Option<Duration> {
        None
    }

    /// Whether [`Tier::read`] may find a key's value: a cache then asks it on the caller's task
    /// before it starts or joins a flight.
    fn reads(&self) -> bool {
        false
    }

    /// The entry of a key this process lacks, read from the shared store on the caller's task
    /// without a lock, if the store holds a fresh one; `None` otherwise (or when the store
    /// cannot be read): the caller then goes through the key's flight. Never loads. The core
    /// decides whether it is served, kept, or refreshed early.
    fn read(&self, direct: &Direct<'_, K, V>) -> impl Future<Output = Option<Shared<V>>> + Send {
        let _ = direct;
        std::future::ready(None)
    }

    /// How the tier names a key to other processes, so that an invalidation they announce can
    /// be matched against this process's keys. `None`: nothing is announced.
    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        None
    }

    /// The name of the connection through which the tier shares values (and hears other
    /// processes' invalidations); `None` for a tier that shares nothing.
    fn shared_through(&self) -> Option<&str> {
        None
    }

    /// Whether [`Tier::shared_through`] names a connection, known from the tier's type: a
    /// cached function's store is then chosen when it is compiled (`Cache::with_entries`).
    const SHARES: bool = false;

    /// The cache has `tags`: a tag's invalidation must reach the shared store this tier uses.
    fn tagged(&self) {}

    /// How the cache is known in the shared store, for [`caches`](crate::caches) and the
    /// stats; `None` for a tier that shares nothing.
    fn identity(&self) -> Option<Identity> {
        None
    }

    /// Adds the tier's own counters to a cache's stats.
    fn add_stats(&self, stats: &mut Stats) {
        let _ = stats;
    }
}

/// What a tier's [`fetch`](Tier::fetch) did: never a policy answer, which is the core's.
pub enum Fetched<V> {
    /// This flight's load produced the value (kept where the cache keeps values, and shared).
    Loaded(V),
    /// A value another process stored, read from the shared store.
    Read(V),
    /// This flight's load failed (an error, a timeout, a panic, an open breaker). A stale value
    /// handed to the waiters meanwhile, and a last good value the store still keeps, were
    /// reported through the handle ([`Handle::serve`], [`Handle::last_good`]).
    Failed(Error),
    /// Another process holds the key's lock, and the cache's policy is not to wait for it
    /// (`busy = "error"`); nothing was loaded.
    Busy,
}

/// An entry read from the shared store, and how long this process may keep values in memory
/// now: `None` as long as the entry's deadlines say; `Some(bound)` while the store's
/// invalidation feed is not known to be live (an invalidation missed meanwhile is outlived by
/// at most that bound).
pub struct Shared<V> {
    pub(crate) entry: Entry<V>,
    pub(crate) trusted_for: Option<Duration>,
}

impl<V> Shared<V> {
    pub(crate) fn new(entry: Entry<V>, trusted_for: Option<Duration>) -> Self {
        Shared { entry, trusted_for }
    }
}

/// Nothing is shared: every value is loaded and kept in this process.
pub struct Local;

/// The tier of a cache whose values stay in this process.
pub fn local() -> fn(&Config) -> Local {
    |_| Local
}

impl<K: Key, V: Value> Tier<K, V> for Local {
    async fn fetch<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        handle.load_here(None).await
    }

    async fn invalidate(&self, _: &Config, _: &str, _: &K, _: Invalidation) -> Result<bool, Error> {
        Ok(false)
    }

    async fn clear(&self, _: &Config, _: &str) -> Result<(), Error> {
        Ok(())
    }
}

/// What a flight does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    /// Gets the key's value: from memory if a load just stored it, else through the tier.
    Get,
    /// Loads the key whatever value is held, here or in the tier (a companion's `refresh`).
    Refresh,
    /// Gets the key's value through the tier, whatever memory holds (a companion's
    /// `read_through`): the tier's value, else a load.
    Through,
}

/// Which call on a cache the generated code makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// A call of the function: the cached value, or one load for every caller of the key.
    Get,
    /// The companion's `refresh`: a load now, shared with a load already running for the key.
    Refresh,
    /// The companion's `read_through`: what a call gets when memory holds nothing for the key
    /// (the shared tier's fresh value, else the key's load, shared as a call's is), whatever
    /// memory holds; kept in memory as a call's value is.
    ReadThrough,
}

/// Why and how a flight starts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Start {
    pub(crate) reason: Reason,
    pub(crate) run: Run,
    /// For an early refresh (`refresh_after`), when the value it replaces was loaded; for a
    /// companion's `refresh`, when it was asked for. A shared value filled no later is the one
    /// the flight replaces.
    pub(crate) replacing: Option<Instant>,
}

impl Start {
    /// A flight for callers with no servable value, or a companion's `refresh` (which
    /// replaces every value filled before it).
    pub(crate) fn miss(run: Run) -> Self {
        Start {
            reason: Reason::Miss,
            run,
            replacing: (run == Run::Refresh).then(Instant::now),
        }
    }
}

/// A cache's core, lent to its tier for one read of one key on the caller's task, outside any
/// flight ([`Tier::read`]). Registered with the memory tier like a load, so that a value read
/// before an invalidation is neither kept nor returned.
pub struct Direct<'a, K: Key, V: Value> {
    key: &'a K,
    pub(crate) begun: Begun<'a, K, V>,
}

impl<'a, K: Key, V: Value> Direct<'a, K, V> {
    /// The read of `key`, unless a load or another read of it runs in this process: a cold
    /// key's concurrent callers then make one read, and go through the flight after it.
    pub(crate) fn new(core: &'a Core<K, V>, key: &'a K) -> Option<Self> {
        Some(Direct {
            begun: Begun::alone(core, key)?,
            key,
        })
    }

    /// The key read.
    pub(crate) fn key(&self) -> &K {
        self.key
    }
}

/// A cache's core, lent to its tier for one flight of one key.
pub struct Handle<'a, K: Key, V: Value, L> {
    core: &'a Core<K, V>,
    key: &'a K,
    load: &'a L,
    start: Start,
    /// The flight's registration with the memory tier and its tags.
    begun: Begun<'a, K, V>,
    /// The flight's leader, to hand values to its waiters; `None` without a lock.
    leader: Option<&'a Leader<'static, K, V>>,
    /// Whether the load has started, so that `cache_refresh_total` counts it once.
    started: AtomicBool,
    /// The stale value handed to the waiters, if any: what a waiter gets if the load fails,
    /// while it is still servable.
    served: Mutex<Option<Entry<V>>>,
    /// A value past its stale deadline that the shared store still keeps (`fail_safe`).
    last_good: Mutex<Option<Entry<V>>>,
}

impl<'a, K: Key, V: Value, L: Load<K, V>> Handle<'a, K, V, L> {
    pub(crate) fn new(
        core: &'a Core<K, V>,
        key: &'a K,
        load: &'a L,
        start: Start,
        leader: Option<&'a Leader<'static, K, V>>,
    ) -> Self {
        let mut begun = Begun::new(core, key);
        // A flight detached (an invalidation) between its start and this, its task's first
        // step, keeps nothing, as one detached later: registered after the detach, the key's
        // generation cannot tell.
        if leader.is_some_and(|leader| leader.detached()) {
            begun.detach();
        }
        Handle {
            begun,
            core,
            key,
            load,
            start,
            leader,
            started: AtomicBool::new(false),
            served: Mutex::new(None),
            last_good: Mutex::new(None),
        }
    }

    /// The key of this flight.
    pub(crate) fn key(&self) -> &K {
        self.key
    }

    /// The key's tags, for a cache with `tags`.
    pub(crate) fn tags(&self) -> &[Box<str>] {
        self.begun.tags()
    }

    /// The cache's options as the attribute built them (its shape; see [`Core::config`]).
    pub(crate) fn config(&self) -> &Config {
        &self.core.config
    }

    /// The cache's options now, with those set at run time: what a fill reads.
    pub(crate) fn options(&self) -> Arc<Config> {
        self.core.options()
    }

    /// The windows of `value`'s life, loaded now: its fresh time (`ttl` or `ttl_from`)
    /// jittered, then `stale` and `fail_safe` (none for a value not to be cached).
    pub(crate) fn lifetime(&self, value: &V) -> Lifetime {
        self.core.lifetime(value)
    }

    /// Why and how the flight started.
    pub(crate) fn start(&self) -> Start {
        self.start
    }

    /// For an early refresh (`refresh_after`), when the value it replaces was loaded; for a
    /// companion's `refresh`, when it was asked for: a shared value filled later is newer, and
    /// needs no load (it is another load's, begun since).
    pub(crate) fn replacing(&self) -> Option<Instant> {
        self.start.replacing
    }

    /// Runs the function's load here, with its timeout and retries, if the breaker admits it
    /// (else `Error::CircuitOpen`); stores nothing. Its outcome is the breaker's verdict; a panic
    /// in the load is an `Error::LoadPanicked`.
    pub(crate) async fn load(&self) -> Result<Loaded<V>, Error> {
        let core = self.core;
        let previous = crate::previous::one(self.previous());
        let options = core.options();
        let attempts =
            crate::load::attempts(&options, &core.telemetry, self.key, self.load, previous);
        admitted(core, || self.started(), attempts).await
    }

    /// The value the load replaces, lent to it ([`previous`](fn@crate::previous)): memory's, while
    /// it may still stand for a failed load; else the stale or last good value the tier read
    /// for this flight. Nothing once the key was invalidated (or detached) since the flight
    /// began: memory drops such a value, but what the tier read before may be it.
    pub(crate) fn previous(&self) -> Option<V> {
        if !self.current() {
            return None;
        }
        let now = Instant::now();
        let held = match self.core.config.in_memory() {
            true => self.core.entry(self.key).filter(|held| held.fail_safe(now)),
            false => None,
        };
        held.or_else(|| lock(&self.served).clone())
            .or_else(|| lock(&self.last_good).clone())
            .map(|entry| entry.value)
    }

    /// The load has started: `cache_refresh_total` counts it, once per flight.
    fn started(&self) {
        if !self.started.swap(true, Ordering::Relaxed) {
            self.core.telemetry.load_started(self.start.reason);
        }
    }

    /// Loads here and keeps the value in memory for a jittered `ttl`, then `stale`, no longer
    /// than `trusted_for`: the path without a shared tier, and a tier's fallback when its store
    /// cannot be used.
    pub(crate) async fn load_here(&self, trusted_for: Option<Duration>) -> Fetched<V> {
        match self.load().await {
            Ok(loaded) => Fetched::Loaded(self.keep_loaded(loaded, trusted_for)),
            Err(error) => Fetched::Failed(error),
        }
    }

    /// The value's source version, for a cache with `source_version`.
    pub(crate) fn source_version(&self, value: &V) -> Option<u64> {
        self.core
            .values
            .source_version
            .and_then(|version| version(value))
    }

    /// The shared store kept its value of a newer source version instead of this flight's: it
    /// is counted.
    pub(crate) fn older_than_stored(&self) {
        self.core.telemetry.older_versions.bump();
    }

    /// Keeps a value loaded now in memory for a jittered `ttl`, then `stale` (unless the key was
    /// invalidated since the flight began, or memory holds a newer one), and returns it (or the
    /// newer one).
    pub(crate) fn keep_loaded(&self, loaded: Loaded<V>, trusted_for: Option<Duration>) -> V {
        self.keep(Shared::new(self.core.loaded(loaded), trusted_for))
    }

    /// Keeps an entry in memory, unless the key was invalidated since the flight began (or
    /// values live only in the shared tier), and returns its value.
    pub(crate) fn keep(&self, shared: Shared<V>) -> V {
        // Its callers get the newer value memory holds, if any: never an older one after it.
        self.newest(self.begun.entry(shared.entry, shared.trusted_for))
            .value
    }

    /// The shared store refused this flight's value, loaded now, and holds no value written
    /// since the flight's read to serve instead: the key's fence moved (an invalidation, or a
    /// holder that has not filled yet). The value is kept in this process's memory all the
    /// same, unless the key was invalidated here or announced invalidated since the flight
    /// began (then nobody keeps it): the flight's callers got it, and a call after them must
    /// not get an older one that memory still holds. Returns the value.
    pub(crate) fn fenced_off(&self, loaded: Loaded<V>, trusted_for: Option<Duration>) -> V {
        self.keep_loaded(loaded, trusted_for)
    }

    /// Whether neither the key nor one of its tags was invalidated or detached since the flight
    /// began.
    pub(crate) fn current(&self) -> bool {
        self.begun.current()
    }

    /// Drops the key's value from memory (a refused `prime`: what memory held is older).
    pub(crate) fn forget(&self) {
        self.core.memory.invalidate(self.key());
    }

    /// Hands a stale value to the flight's waiters now, while the refresh goes on, and keeps it
    /// in memory; if the load fails, the waiters keep it (stale-if-error). A waiter takes it only
    /// while it is servable; past its deadline, waiters wait for the refresh. Whether it was
    /// handed over: never for a companion's `refresh`, whose callers wait for what it loads.
    pub(crate) fn serve(&self, shared: Shared<V>) -> bool {
        if self.start.run == Run::Refresh {
            return false;
        }
        let entry = match self.held_later(&shared.entry, Entry::servable) {
            Some(held) => held,
            None => self.newest(self.begun.entry(shared.entry, shared.trusted_for)),
        };
        if let Some(leader) = self.leader {
            leader.serve(entry.clone());
        }
        self.offer(Some(entry.clone()));
        *lock(&self.served) = Some(entry);
        true
    }

    /// The entry memory holds for the key, if its source was read after `entry`'s and it is
    /// `usable` now (servable; or within its fail-safe window): a stale or fail-safe value the
    /// store still holds may be older than memory's (this process's fill was fenced off), and
    /// must not replace it.
    fn held_later(
        &self,
        entry: &Entry<V>,
        usable: fn(&Entry<V>, Instant) -> bool,
    ) -> Option<Entry<V>> {
        let now = Instant::now();
        self.core.entry(self.key).filter(|held| {
            !order::may_be_newer(entry.read_at(), held.read_at()) && usable(held, now)
        })
    }

    /// Keeps `entry` in memory, and returns it, or the entry of a newer source version that
    /// memory holds instead.
    fn newest(&self, entry: Entry<V>) -> Entry<V> {
        match self.begun.keep(entry.clone()) {
            Kept::Newer(newer, _) => newer,
            Kept::Stored | Kept::Invalidated | Kept::Older => entry,
        }
    }

    /// Offers a value past its stale deadline that the shared store still keeps for
    /// `fail_safe`: not to be served, but the last good value if this flight's load fails (or
    /// takes longer than `soft_timeout`).
    pub(crate) fn last_good(&self, shared: Shared<V>) {
        if self.core.config.fail_safe.is_none() {
            return;
        }
        let entry = match self.held_later(&shared.entry, Entry::fail_safe) {
            Some(held) => held,
            None => self.newest(self.begun.entry(shared.entry, shared.trusted_for)),
        };
        self.offer(Some(entry));
    }

    /// The shared store keeps nothing for the key now (no value, or one past its fail-safe
    /// window): a last good value read before is older than what was written since (a value
    /// not to be kept, `ttl_from`'s zero) or gone with it, and no longer stands in for a failed
    /// load (sim seed 70053874).
    pub(crate) fn no_last_good(&self) {
        self.offer(None);
    }

    /// What stands in for a failed load, as the flight's tier last read it: a stale value it
    /// served, or one past its stale deadline, or nothing.
    fn offer(&self, entry: Option<Entry<V>>) {
        if self.core.config.fail_safe.is_none() {
            return;
        }
        if let Some(leader) = self.leader {
            leader.offer(entry.clone());
        }
        *lock(&self.last_good) = entry;
    }

    /// The stale value handed to the waiters, if any and still servable at `now`: a caller
    /// that joined after its stale deadline (or waited for the lock past it) must not get it
    /// when the load fails.
    pub(crate) fn served_at(&self, now: Instant) -> Option<V> {
        let entry = lock(&self.served).take()?;
        (entry.servable(now) && !self.overtaken()).then_some(entry.value)
    }

    /// Whether another flight of the key answered with a value since this flight read the
    /// stale or last good value it holds (sim seed 191516300: a detached refresh answered with
    /// a newer value, then this flight's load failed, and a caller that joined it after that
    /// answer was given its older stale value).
    fn overtaken(&self) -> bool {
        self.leader.is_some_and(Leader::overtaken)
    }

    /// The key's last good value at `now`, for a failed load: the memory's entry where values
    /// live in memory, else one the tier offered; `None` past its fail-safe window.
    pub(crate) fn last_good_at(&self, now: Instant) -> Option<Entry<V>> {
        let entry = match self.core.config.in_memory() {
            true => self.core.entry(self.key),
            false => lock(&self.last_good).take().filter(|_| !self.overtaken()),
        };
        entry.filter(|entry| entry.fail_safe(now))
    }

    /// Keeps the last good value served for a failed load, fresh again for the throttle (where
    /// values live in memory); whether the key was not invalidated since the flight began.
    pub(crate) fn keep_throttled(&self, entry: Entry<V>, now: Instant) -> bool {
        if !entry.current() {
            return false;
        }
        let throttled = entry.throttled(now, self.core.options().fail_safe_throttle);
        self.begun.keep(throttled).current() && self.begun.current()
    }
}

/// Runs `attempts` (one load, with its timeout and retries) once one of the cache's loads is
/// free (`max_loads`, else `Error::LoadsFull`) and if the breaker admits it (else
/// `Error::CircuitOpen`), calling `started` first; its outcome is the breaker's verdict, and a
/// panic in it an `Error::LoadPanicked`.
async fn admitted<K: Key, V: Value, T>(
    core: &Core<K, V>,
    started: impl FnOnce(),
    attempts: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    // Held until the load ends; taken before the breaker's ticket, whose probe must run.
    let _free = match &core.limit {
        Some(limit) => Some(limit.enter(&core.options(), &core.telemetry).await?),
        None => None,
    };
    let ticket = match &core.breaker {
        Some(breaker) => Some(breaker.admit(&core.config.name)?),
        None => None,
    };
    started();
    let outcome = AssertUnwindSafe(attempts)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            core.telemetry.load_errors.bump();
            Err(Error::panicked(&core.config.name, &*panic))
        });
    if let Some(ticket) = ticket {
        ticket.verdict(outcome.is_ok());
    }
    outcome
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
