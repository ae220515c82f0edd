//! One cache: its core (options, memory tier, loads in flight, counters) and its tier, and the
//! path of a call through them.

use std::any::Any;
use std::fmt::Debug;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::runtime::Handle as Runtime;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use crate::breaker::Breaker;
use crate::config::{Config, Lock};
use crate::entry::{Entry, Freshness};
use crate::error::Error;
use crate::flight::{Flights, Joined, Leader};
use crate::hot::HotKeys;
use crate::load::Load;
use crate::memory::Memory;
use crate::registry::{BoxFuture, Inspect};
use crate::slot::Tags;
use crate::stats::Stats;
use crate::tags::Stamp;
use crate::telemetry::{Labels, Reason, Telemetry};
use crate::tier::{Direct, Handle, Tier};

mod companion;

/// What a cache key must be: hashable, comparable, cloneable, printable (in stats and traces),
/// and shareable across tasks.
pub trait Key: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
impl<K: Hash + Eq + Clone + Debug + Send + Sync + 'static> Key for K {}

/// What a cached value must be: cloneable (every caller gets its own copy) and shareable.
pub trait Value: Clone + Send + Sync + 'static {}
impl<V: Clone + Send + Sync + 'static> Value for V {}

/// What every tier's flights use of a cache: its options, its memory tier, its loads in flight
/// and its counters. A tier reaches it only through a [`Handle`].
pub(crate) struct Core<K: Key, V: Value> {
    pub(crate) config: Config,
    pub(crate) memory: Memory<K, V>,
    pub(crate) flights: Flights<K, V>,
    pub(crate) telemetry: Telemetry,
    hot: HotKeys<K>,
    /// The upstream circuit breaker, with `breaker = N`.
    pub(crate) breaker: Option<Breaker>,
    /// How a key's tags are rendered, for a cache with `tags`.
    pub(crate) tags: Tags<K>,
}

impl<K: Key, V: Value> Core<K, V> {
    /// The key's entry in memory, unless one of its tags was invalidated since its load began.
    pub(crate) fn entry(&self, key: &K) -> Option<Entry<V>> {
        self.memory.get(key).filter(Entry::current)
    }

    /// The key's tags, for a load of it beginning now.
    pub(crate) fn stamp(&self, key: &K) -> Option<Arc<Stamp>> {
        self.tags.map(|render| Stamp::new(render(key)))
    }

    /// A flight that got its value: the breaker, if any, closes.
    fn settled(&self, value: V) -> V {
        if let Some(breaker) = &self.breaker {
            breaker.succeeded();
        }
        value
    }

    /// A flight that failed: a failed load counts against the breaker, if any; then the last
    /// good value stands in for the error if fail-safe allows.
    fn settle<L: Load<K, V>>(
        &self,
        error: Error,
        handle: &Handle<'_, K, V, L>,
    ) -> Result<V, Error> {
        if let Some(breaker) = &self.breaker
            && !matches!(error, Error::CircuitOpen { .. })
        {
            breaker.failed();
        }
        handle.fail_safe(error)
    }
}

/// What [`Cache::lookup`] found.
enum Lookup<V, P> {
    /// A value to serve.
    Served(V),
    /// Nothing to serve: the call goes on with [`Cache::miss`].
    Missed(Miss<P>),
}

/// A call that found nothing to serve in memory: its load's builder and its lookup span.
struct Miss<P> {
    prepare: P,
    span: tracing::Span,
}

/// What a flight does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    /// Gets the key's value: from memory if a load just stored it, else through the tier.
    Fill,
    /// Loads the key whatever value is held, here or in the tier (a companion's `refresh`).
    Refresh,
}

/// One cached function's cache: the core and the tier behind it.
pub(crate) struct Cache<K: Key, V: Value, T> {
    core: Core<K, V>,
    tier: T,
}

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    pub(crate) fn new(config: Config, tier: T, tags: Tags<K>) -> Self {
        if tags.is_some() {
            crate::tags::keep_marks_for(config.longest_use());
            tier.tagged();
        }
        let memory = Memory::new(config.capacity, tier.key_name());
        Cache {
            core: Core {
                breaker: config.breaker.map(|threshold| {
                    let open = metrics::gauge!("cache_breaker_open", Labels::new(&config).cache());
                    Breaker::new(threshold, config.breaker_cooldown, open)
                }),
                telemetry: Telemetry::new(&config),
                config,
                memory,
                flights: Flights::new(),
                hot: HotKeys::new(),
                tags,
            },
            tier,
        }
    }

    /// The value for `key`: fresh from memory, stale while one refresh runs, or from the key's
    /// single load. `prepare` builds the load; it runs only when a load must start.
    pub(crate) async fn get<P, L>(&'static self, key: K, prepare: P) -> Result<V, Error>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        match self.lookup(&key, prepare) {
            Lookup::Served(value) => Ok(value),
            Lookup::Missed(miss) => self.miss(key, miss).await,
        }
    }

    /// The value in memory, if it may be served now (starting a refresh of it if it is due),
    /// without an `await`: a hit builds no future of the miss path (issue 14).
    fn lookup<P, L>(&'static self, key: &K, prepare: P) -> Lookup<V, P>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        // At TRACE level: an atomic load decides it is off, so the hit path pays nothing more.
        // Never entered (entering costs on every poll): its outcome is recorded at the end.
        let span = tracing::trace_span!("stampede.lookup", cache = %self.core.config.name, outcome = Empty);
        let outcome = |outcome: &str| {
            span.record("outcome", outcome);
        };
        let core = &self.core;
        if core.config.in_memory()
            && let Some(entry) = core.entry(key)
        {
            // The coarse clock first: the exact one only near the entry's deadline.
            let freshness = if entry.surely_fresh() {
                Freshness::Fresh
            } else {
                entry.freshness(Instant::now())
            };
            match freshness {
                freshness @ (Freshness::Fresh | Freshness::Early) => {
                    let hit = core.telemetry.hits.bump();
                    core.hot
                        .hit(hit, key, entry.filled_nanos(), &core.telemetry.key_age);
                    if freshness == Freshness::Fresh {
                        outcome("hit");
                        return Lookup::Served(entry.value);
                    }
                    // Past `refresh_after`: also one background refresh.
                    if core.config.lock != Lock::None
                        && let Some(leader) = core.flights.lead(key)
                    {
                        let _ = self.spawn_load(leader, prepare(), Reason::Early, Run::Fill);
                    }
                    outcome("early");
                    return Lookup::Served(entry.value);
                }
                Freshness::Stale if core.config.lock != Lock::None => {
                    core.telemetry.stale_served.bump();
                    if let Some(leader) = core.flights.lead(key) {
                        // Outside a runtime the refresh cannot start; the stale value is served
                        // regardless.
                        let _ = self.spawn_load(leader, prepare(), Reason::Stale, Run::Fill);
                    }
                    outcome("stale");
                    return Lookup::Served(entry.value);
                }
                Freshness::Stale => {}
                // Past every use: freed now rather than at its eviction.
                Freshness::Expired => core.memory.reclaim(key, Instant::now()),
            }
        }
        Lookup::Missed(Miss { prepare, span })
    }

    /// The rest of a call that found nothing to serve in memory: a read of the tier, or the
    /// key's single load.
    async fn miss<P, L>(&'static self, key: K, miss: Miss<P>) -> Result<V, Error>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        let Miss { prepare, span } = miss;
        let outcome = |outcome: &str| {
            span.record("outcome", outcome);
        };
        let core = &self.core;
        core.telemetry.misses.bump();
        if core.config.lock == Lock::None {
            outcome("miss");
            let load = prepare();
            let handle = Handle::new(core, &key, &load, Reason::Miss, None);
            return self.run(&handle, Run::Fill).await;
        }
        // A value another process shared: read on this task in one round trip, without a lock;
        // the flight, its task and the lock only when there is none, or when a load or a read
        // of the key runs here already (its callers share that rather than read again).
        if self.tier.reads()
            && !core.flights.contains(&key)
            && let Some(direct) = Direct::new(core, &key)
            && let Some(value) = self.tier.read(&direct).await
        {
            outcome("remote");
            return Ok(value);
        }
        let waiter = match core.flights.join(&key) {
            Joined::Shared(waiter) => {
                core.telemetry.shared.bump();
                outcome("shared");
                waiter
            }
            Joined::Led(leader, waiter) => {
                outcome("miss");
                self.spawn_load(leader, prepare(), Reason::Miss, Run::Fill)?;
                waiter
            }
        };
        let _waiting = core.telemetry.waiters.raise();
        // A soft timeout: with a fail-safe value at hand, wait for the load only so long; the
        // load goes on and stores its result.
        if let Some(soft) = core.config.soft_timeout
            && let Some(fallback) = core
                .entry(&key)
                .filter(|entry| entry.fail_safe(Instant::now()))
        {
            return match tokio::time::timeout(soft, waiter.wait(&core.config.name)).await {
                Ok(outcome) => outcome,
                Err(_soft_timeout) => {
                    core.telemetry.fail_safe_served.bump();
                    outcome("soft_timeout");
                    Ok(fallback.value)
                }
            };
        }
        waiter.wait(&core.config.name).await
    }

    /// Runs the leader's load detached on the caller's runtime, so that cancelling the caller
    /// neither cancels the load nor strands the other waiters. Its span follows from the span of
    /// the call that started it.
    pub(crate) fn spawn_load<L: Load<K, V>>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: L,
        reason: Reason,
        run: Run,
    ) -> Result<(), Error> {
        let core = &self.core;
        let runtime = Runtime::try_current().map_err(|_| Error::NoRuntime {
            cache: core.config.name.clone(),
        })?;
        let span = tracing::debug_span!(
            "stampede.refresh",
            cache = %core.config.name,
            key = ?leader.key(),
            reason = reason.as_str(),
            outcome = Empty,
            duration_ms = Empty,
        );
        // The caller's span (the request): the lookup span is never entered.
        span.follows_from(tracing::Span::current());
        let running = async move {
            // A refresh of a stale value waits for a turn in the process's budget; a load for
            // callers with no value never does.
            let _turn = match reason {
                Reason::Stale | Reason::Early => crate::budget::turn(leader.urgent()).await,
                Reason::Miss => None,
            };
            let _running = core.telemetry.in_flight.raise();
            let started = Instant::now();
            let handle = Handle::new(core, leader.key(), &load, reason, Some(&leader));
            let outcome = AssertUnwindSafe(self.flight(&handle, run))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    core.telemetry.load_errors.bump();
                    Err(Error::panicked(&core.config.name, &*panic))
                })
                .map(|value| core.settled(value));
            let failed = outcome.is_err();
            let outcome = outcome.or_else(|error| core.settle(error, &handle));
            drop(handle); // it borrows the leader, which the outcome goes through
            let span = tracing::Span::current();
            let answered = match &outcome {
                Ok(_) if failed => "fail_safe", // the load failed; the last good value answered
                outcome => outcome_name(outcome),
            };
            span.record("outcome", answered);
            span.record("duration_ms", started.elapsed().as_millis() as u64);
            leader.finish(outcome);
        };
        runtime.spawn(running.instrument(span));
        Ok(())
    }

    /// A flight run on the caller's task (`lock = "none"`), its outcome settled as a detached
    /// one's is: the breaker told, the last good value standing in for a failure.
    pub(crate) async fn run<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        run: Run,
    ) -> Result<V, Error> {
        match self.flight(handle, run).await {
            Ok(value) => Ok(self.core.settled(value)),
            Err(error) => self.core.settle(error, handle),
        }
    }

    /// What one flight does: gets the key's value for a miss or a refresh (from a load that
    /// finished meanwhile, or through the tier), or loads it whatever is held.
    async fn flight<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        run: Run,
    ) -> Result<V, Error> {
        // A load that finished between this caller's miss and its taking the lead has stored
        // its value already: serve that instead of loading twice.
        if run == Run::Fill
            && self.core.config.in_memory()
            && let Some(entry) = self.core.entry(handle.key())
            && entry.freshness(Instant::now()) == Freshness::Fresh
        {
            return Ok(entry.value);
        }
        if let Some(breaker) = &self.core.breaker {
            breaker.admit(&self.core.config.name)?;
        }
        match run {
            Run::Fill => self.tier.fill(handle).await,
            Run::Refresh => self.tier.refresh(handle).await,
        }
    }

    /// Drops this process's copy of `key` and detaches its running load (which stores
    /// nothing); then drops it from the tier.
    pub(crate) async fn invalidate(&self, key: &K) -> Result<(), Error> {
        self.forget(key);
        let dropped = self.tier.invalidate(&self.core.config, key).await;
        // A call meanwhile may have read the old value from a shared tier before it was dropped
        // there, and kept it: forget again, rather than wait for the announcement's echo.
        if self.tier.key_name().is_some() {
            self.forget(key);
        }
        dropped
    }

    /// Drops this process's copy of `key`: after this returns, no call here returns a value
    /// whose load began before it.
    pub(crate) fn forget(&self, key: &K) {
        self.core.flights.forget(key);
        self.core.memory.invalidate(key);
    }
}

impl<K: Key, V: Value, T: Tier<K, V>> Inspect for Cache<K, V, T> {
    fn config(&self) -> &Config {
        &self.core.config
    }

    fn stats(&self) -> Stats {
        let core = &self.core;
        let t = &core.telemetry;
        let mut stats = Stats {
            hits: t.hits.get(),
            misses: t.misses.get(),
            stale_served: t.stale_served.get(),
            loads: t.loads.get(),
            load_errors: t.load_errors.get(),
            timeouts: t.timeouts.get(),
            refreshes: t.refreshes.load(std::sync::atomic::Ordering::Relaxed),
            shared: t.shared.get(),
            fail_safe_served: t.fail_safe_served.get(),
            entries: core.memory.entry_count(),
            in_flight: core.flights.len() as u64,
            waiters: t.waiters.get(),
            hot_keys: core.hot.snapshot(t.hits.get()),
            breaker_open: core.breaker.as_ref().is_some_and(Breaker::is_open),
            ..Stats::default()
        };
        self.tier.add_stats(&mut stats);
        stats
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a (dyn Any + Send + Sync),
    ) -> Option<BoxFuture<'a, Result<(), Error>>> {
        let key = key.downcast_ref::<K>()?;
        Some(Box::pin(Cache::invalidate(self, key)))
    }

    fn forget_named(&self, name: &str) {
        let Some(name_of) = self.tier.key_name() else {
            return;
        };
        for key in self.core.flights.keys() {
            if name_of(&key).is_some_and(|own| own == name) {
                self.core.flights.forget(&key);
            }
        }
        self.core.memory.invalidate_named(name);
    }

    fn forget_tag(&self, tag: &str) {
        let Some(render) = self.core.tags else {
            return;
        };
        // Only the running loads: stored entries are checked against the tag's mark on read.
        for key in self.core.flights.keys() {
            if render(&key).iter().any(|own| own == tag) {
                self.forget(&key);
            }
        }
    }

    fn forget_all_shared(&self) {
        if self.tier.key_name().is_none() {
            return;
        }
        for key in self.core.flights.keys() {
            self.core.flights.forget(&key);
        }
        self.core.memory.invalidate_all();
    }
}

/// The `outcome` field of a refresh span.
fn outcome_name<V>(outcome: &Result<V, Error>) -> &'static str {
    match outcome {
        Ok(_) => "ok",
        Err(Error::Timeout { .. }) => "timeout",
        Err(Error::LoadPanicked { .. }) => "panic",
        Err(_) => "error",
    }
}
