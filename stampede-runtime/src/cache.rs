//! One cache: its core and its tier, and the path of a call through them: a lookup in memory,
//! then a read of the shared tier, then the key's flight (`run`), whose tier's report the core
//! turns into what the callers get (`settle`). The companion's operations are in `ops`, what the
//! registry sees of a cache in `registered`.

mod batch;
mod ops;
mod registered;
mod run;
mod settle;

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;
use tracing::field::Empty;

pub(crate) use crate::answer::Answer;
use crate::clock::{self, Nanos};
use crate::config::{Config, Lock};
use crate::core::{Core, Tags, Values, lean_for};
use crate::entry::Lean;
use crate::entry::{Entry, Found, Freshness};
use crate::error::{Error, LoadError};
use crate::flight::{Joined, Leader, Waiter};
use crate::kv::{Key, Value};
use crate::load::{Erased, ErasedPrepare, Load, erased};
use crate::memory::{Invalidation, Kept, Shape, Store};
use crate::telemetry::Reason;
use crate::tier::{Direct, Run, Shared, Start, Tier};
use run::Running;

/// One cached function's cache: the core and the tier behind it.
pub(crate) struct Cache<K: Key, V: Value, T> {
    core: Core<K, V>,
    tier: T,
    /// [`Cache::held_as`] for the form of the store's entries.
    held: fn(&Self, &K) -> Held<V>,
    /// The open window of single-key calls to load together (`batch_window`), if any.
    window: batch::Window<K, V>,
}

/// Builds a cache from its options, tier, tags and values ([`Cache::with_entries`]).
pub(crate) type New<K, V, T> = fn(Config, T, Tags<K>, Values<V>) -> Cache<K, V, T>;

/// What [`Cache::held`] found in memory.
enum Held<V> {
    /// A value to serve.
    Hit(V),
    /// A value to serve, and a background refresh of it due for this reason; the value was
    /// loaded at that instant.
    Refresh(V, Reason, Instant),
    /// Nothing to serve; `lapsed`: memory held a value of the key, no longer servable (see
    /// [`Cache::reads_first`]).
    Missed { lapsed: bool },
}

/// A call that found nothing to serve in memory: its load's builder and its lookup span.
struct Miss<P> {
    prepare: P,
    span: tracing::Span,
    /// What a flight of it does: `Run::Get`, or `Run::Through` for a `read_through`.
    run: Run,
    /// Memory held a value of the key that lapsed ([`Held::Missed`]).
    lapsed: bool,
}

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// A cache with these options, tier, tags and values, its entries kept as `E`, which
    /// [`Cache::with_entries`] chooses.
    fn new<E: Shape<V>>(config: Config, tier: T, tags: Tags<K>, values: Values<V>) -> Self {
        debug_assert_eq!(T::SHARES, tier.shared_through().is_some());
        if tags.is_some() {
            tier.tagged();
        }
        let core = Core::new::<E>(config, tags, values, tier.key_name());
        debug_assert_eq!(
            E::LEAN,
            lean_for(&core.config, core.tags.is_some()),
            "the entries' form decided at compile time is not the options'"
        );
        Cache {
            core,
            tier,
            held: Self::held_as::<E>,
            window: batch::Window::default(),
        }
    }

    /// What builds a cache whose entries are lean or not (`LEAN`, which the generated code
    /// decides when the function is compiled: `slot::Entries`): the one rule from it and the
    /// tier to the entries' form. [`Entry`] whole; or [`Lean`], with when each value's source
    /// was read where the tier shares values (`entry::LeanRead`). The conditions are constants,
    /// so only the store of that form is compiled for the value type, not all three (issue 38).
    pub(crate) fn with_entries<const LEAN: bool>() -> New<K, V, T> {
        if !LEAN {
            Cache::new::<Entry<V>>
        } else if T::SHARES {
            Cache::new::<Lean<V, Nanos>>
        } else {
            Cache::new::<Lean<V>>
        }
    }

    /// A cache as [`Cache::new`] builds it, its entries' form chosen at run time from its
    /// options and tier: all three forms compiled, for the tests and the simulator.
    #[cfg(any(test, feature = "simulation"))]
    pub(crate) fn of_form(config: Config, tier: T, tags: Tags<K>, values: Values<V>) -> Self {
        let new = match lean_for(&config, tags.is_some()) {
            true => Self::with_entries::<true>(),
            false => Self::with_entries::<false>(),
        };
        new(config, tier, tags, values)
    }

    /// What `call` asks of `key`: the generated code's one entry for a single key. Not an
    /// `async fn`: a call of the function looks in memory when it is made (the generated code
    /// awaits it at once), so a hit is a ready value and polls no future of the miss path; what
    /// a miss, a `refresh` or a `read_through` awaits is compiled once per key, value, error and
    /// tier, not per cached function (issue 38).
    ///
    /// Inlined only where optimized, as the other entries of the generated call are
    /// (`Witness::value`, `Recipe::value`, `Answer::map`, `Answer`'s `poll`): since the load's
    /// type names no function, in a debug build each is compiled once per key, value and tier
    /// rather than copied into every cached function (issue 38: 4.1 to 1.9 KB of code per
    /// function).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn call<'a, P, L>(
        &'static self,
        call: crate::tier::Call,
        key: K,
        prepare: P,
    ) -> Answer<'a, Result<V, Error>>
    where
        P: FnOnce() -> L + Send + 'a,
        L: Load<K, V>,
    {
        use crate::tier::Call;
        // Only what names `prepare`'s type is compiled per cached function: the rest takes it
        // erased (issue 38).
        let (prepare, run, lapsed) = match call {
            Call::Get => match self.served(&key, prepare) {
                Ok(value) => return Answer::Ready(Ok(value)),
                Err((prepare, lapsed)) => (prepare, Some(Run::Get), lapsed),
            },
            Call::ReadThrough => (prepare, Some(Run::Through), false),
            Call::Refresh => (prepare, None, false),
        };
        Answer::Pending(self.pend(key, erased(prepare), run, lapsed))
    }

    /// [`Cache::pending`], boxed: out of line, so that the miss path's future is built and moved
    /// into its box once per key, value, error and tier rather than in every cached function's
    /// call (issue 38). It returns the box, not the answer: an answer written to memory by a
    /// call out of line made a hit's value go through memory too, 8ns more per hit.
    #[inline(never)]
    fn pend<'a, E: LoadError>(
        &'static self,
        key: K,
        prepare: ErasedPrepare<'a, K, V, E>,
        run: Option<Run>,
        lapsed: bool,
    ) -> Pin<Box<dyn Future<Output = Result<V, Error>> + Send + 'a>> {
        Box::pin(self.pending(key, prepare, run, lapsed))
    }

    /// What a call that has no value to serve yet awaits: a miss (or a `read_through`) that
    /// runs as `run` (`lapsed`: see [`Held::Missed`]), or with none, the companion's `refresh`.
    async fn pending<E: LoadError>(
        &'static self,
        key: K,
        prepare: ErasedPrepare<'_, K, V, E>,
        run: Option<Run>,
        lapsed: bool,
    ) -> Result<V, Error> {
        match run {
            Some(run) => {
                let span = self.lookup_span();
                let miss = Miss {
                    prepare,
                    span,
                    run,
                    lapsed,
                };
                self.missed(key, miss).await
            }
            None => self.refresh_erased(key, prepare).await,
        }
    }

    /// The value for `key`: fresh from memory, stale while one refresh runs, or from the key's
    /// single load. `prepare` builds the load; it runs only when a load must start.
    pub(crate) fn get<'a, P, L>(&'static self, key: K, prepare: P) -> Answer<'a, Result<V, Error>>
    where
        P: FnOnce() -> L + Send + 'a,
        L: Load<K, V>,
    {
        self.call(crate::tier::Call::Get, key, prepare)
    }

    /// The rest of a call that found nothing to serve in memory, its load erased: this and all
    /// below it are compiled once per key, value, error and tier, not per cached function.
    async fn missed<E: LoadError>(
        &'static self,
        key: K,
        miss: Miss<ErasedPrepare<'_, K, V, E>>,
    ) -> Result<V, Error> {
        let run = miss.run;
        let lead = move |leader, prepare: ErasedPrepare<'_, K, V, E>| {
            self.running(leader, prepare(), Start::miss(run)).map(Some)
        };
        self.miss(key, miss, lead).await
    }

    /// What memory holds for `key` that a call may serve now, with the span of a value served,
    /// without an `await`: a hit builds no future of the miss path (issue 14). Inlined into the
    /// call; what it asks of memory ([`Cache::held`]) is out of line, compiled once per key,
    /// value and tier rather than into every cached function's future (issue 38: inlined too,
    /// a hit took 2-4ns less and a release build of 50 functions 2.4s more). The caller starts
    /// the refresh it reports due. Inlined only where optimized: in a debug build this is
    /// compiled once per key, value and tier rather than into every cached function.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn lookup(&'static self, key: &K) -> Held<V> {
        let held = self.held(key);
        match &held {
            Held::Hit(_) => self.served_span("hit"),
            Held::Refresh(_, reason, _) => self.served_span(reason.as_str()),
            Held::Missed { .. } => {}
        }
        held
    }

    /// What memory may serve now for `key` ([`Cache::lookup`]), starting the background refresh
    /// it reports due with the load `prepare` builds (erased, so that the refresh's start is
    /// compiled once per key, value, error and tier); `prepare` back when there is nothing to
    /// serve, with whether memory's value of it lapsed ([`Held::Missed`]). A single-key call's
    /// and a `batch_loader` call's one way to look in memory.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn served<'a, P, L>(&'static self, key: &K, prepare: P) -> Result<V, (P, bool)>
    where
        P: FnOnce() -> L + Send + 'a,
        L: Load<K, V>,
    {
        match self.lookup(key) {
            Held::Hit(value) => Ok(value),
            Held::Refresh(value, reason, of) => {
                self.refresh_in_background(key, erased(prepare), reason, of);
                Ok(value)
            }
            Held::Missed { lapsed } => Err((prepare, lapsed)),
        }
    }

    /// The lookup's span, at TRACE level; never entered (entering costs on every poll): its
    /// outcome is recorded when it is known.
    fn lookup_span(&self) -> tracing::Span {
        tracing::trace_span!("stampede.lookup", cache = %self.core.config.name, outcome = Empty)
    }

    /// The span of a lookup that served a value from memory, made only when a `tracing`
    /// subscriber takes TRACE spans: one atomic load decides it is off, so a hit pays nothing
    /// more. A disabled span is not free: with `tracing`'s `log` feature (which dependencies
    /// such as sqlx turn on) and no subscriber set, making one and recording into it takes
    /// `tracing`'s path to `log`, about 360 instructions per hit (issue 25); so a hit's span
    /// does not reach `log`, a miss's still does.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn served_span(&self, outcome: &'static str) {
        use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
        // What `trace_span!` checks first (the most verbose level any subscriber enables).
        if tracing::Level::TRACE <= STATIC_MAX_LEVEL
            && tracing::Level::TRACE <= LevelFilter::current()
        {
            self.record_served(outcome);
        }
    }

    /// The span of a lookup that served a value, for a subscriber that takes it: out of line,
    /// so that it is compiled once per key, value and tier rather than into every cached
    /// function's hit (issue 38).
    #[cold]
    #[inline(never)]
    fn record_served(&self, outcome: &'static str) {
        self.lookup_span().record("outcome", outcome);
    }

    /// What memory holds for `key` that a call may serve now, counted as a hit (or a stale
    /// value served) when it does: whether a background refresh of it is due, and why.
    #[inline(always)]
    fn held(&self, key: &K) -> Held<V> {
        (self.held)(self, key)
    }

    /// [`Cache::held`], for a store of entries `E`: chosen when the cache is built, so that a
    /// hit reaches the store by its type, with one call as before the store's forms were
    /// compiled apart (issue 38).
    #[inline(never)]
    fn held_as<E: Shape<V>>(&self, key: &K) -> Held<V> {
        let core = &self.core;
        if !core.config.in_memory() {
            return Held::Missed { lapsed: false };
        }
        // The coarse clock, the exact one only near the entry's deadline. Read before the
        // lookup: a call between the store's lookup and the return moved the value through the
        // stack twice more (issue 38: a `String` hit about 7ns faster). A value whose deadline
        // is after the reading was fresh at an instant of the call, as one read after is.
        let latest = clock::latest();
        match core.memory.store_as::<E>() {
            Some(store) => self.held_of(key, Store::find(store, key, latest)),
            None => self.held_through_vtable(key, latest),
        }
    }

    /// [`Cache::held_as`] of a store whose entries are not the form asked for, which no cache
    /// builds: apart, so that the found value of the typed path goes to the answer without
    /// meeting this path's in memory first.
    #[cold]
    #[inline(never)]
    fn held_through_vtable(&self, key: &K, latest: Nanos) -> Held<V> {
        self.held_of(key, self.core.memory.find(key, latest))
    }

    /// What a call may serve of what memory `found` for `key`.
    #[inline(always)]
    fn held_of(&self, key: &K, found: Found<V>) -> Held<V> {
        match found {
            Found::Fresh(value, filled) => {
                self.core.hit(key, || filled);
                Held::Hit(value)
            }
            Found::Judge(entry) => self.judged(key, entry),
            Found::Nothing => Held::Missed { lapsed: false },
        }
    }

    /// What a call may serve of `entry`, found near or past its refresh point: judged on the
    /// exact clock.
    fn judged(&self, key: &K, entry: Entry<V>) -> Held<V> {
        let core = &self.core;
        let freshness = core.freshness(&entry, Instant::now());
        let reason = match freshness {
            Freshness::Fresh | Freshness::Early => {
                core.hit(key, || entry.filled_nanos());
                (freshness == Freshness::Early).then_some(Reason::Early)
            }
            Freshness::Stale if core.config.lock != Lock::None => {
                core.telemetry.stale_served.bump();
                Some(Reason::Stale)
            }
            Freshness::Stale => return Held::Missed { lapsed: true },
            Freshness::Expired => {
                // Past every use: freed now rather than at its eviction.
                core.memory.reclaim(key, Instant::now());
                return Held::Missed { lapsed: true };
            }
        };
        match reason {
            None => Held::Hit(entry.value),
            Some(reason) => {
                let of = entry.filled_at();
                Held::Refresh(entry.value, reason, of)
            }
        }
    }

    /// Starts one background refresh of a value being served (stale, or past `refresh_after`),
    /// unless a load of the key runs already. Outside a runtime the refresh cannot start; the
    /// value is served regardless.
    fn refresh_in_background<E: LoadError>(
        &'static self,
        key: &K,
        prepare: impl FnOnce() -> Erased<K, V, E>,
        reason: Reason,
        of: Instant,
    ) {
        if let Some((leader, start)) = self.refresh_led(key, reason, of) {
            let _ = self.spawn_load(leader, prepare(), start);
        }
    }

    /// The flight of a background refresh of `key`'s value, served now (stale, or past
    /// `refresh_after`, loaded at `of`), if one may start: the cache has a lock, and no load of
    /// the key runs already. An early refresh replaces the value loaded at `of`. The one rule of
    /// a single-key call's, a batch's and a read's refreshes.
    pub(crate) fn refresh_led(
        &'static self,
        key: &K,
        reason: Reason,
        of: Instant,
    ) -> Option<(Leader<'static, K, V>, Start)> {
        if self.core.config.lock == Lock::None {
            return None;
        }
        let leader = self.core.flights.lead(key)?;
        let start = Start {
            reason,
            run: Run::Get,
            replacing: (reason == Reason::Early).then_some(of),
        };
        Some((leader, start))
    }

    /// The rest of a call that found nothing to serve in memory: a read of the tier, or the
    /// key's single load, which `lead` starts when this call leads the key's flight (and hands
    /// back to run on this task while it waits, see [`Running`]).
    async fn miss<P, L>(
        &'static self,
        key: K,
        miss: Miss<P>,
        lead: impl FnOnce(Leader<'static, K, V>, P) -> Result<Option<Running>, Error>,
    ) -> Result<V, Error>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        let Miss {
            prepare,
            span,
            run,
            lapsed,
        } = miss;
        let outcome = |outcome: &str| {
            span.record("outcome", outcome);
        };
        let core = &self.core;
        core.telemetry.misses.bump();
        if core.config.lock == Lock::None {
            outcome("miss");
            return self.run_here(&key, prepare(), run).await;
        }
        // A value another process shared, where one is likely: read without a lock (one round
        // trip, two for a value of 16 KiB or more on a standalone server); the flight and the
        // lock only when there is none, or when a load or a read of the key runs here already
        // (its callers share that rather than read again).
        let prepare = if self.reads_first(lapsed) && !core.flights.contains(&key) {
            match self.read(&key, prepare).await {
                Ok(value) => {
                    outcome("remote");
                    return Ok(value);
                }
                Err(prepare) => prepare,
            }
        } else {
            prepare
        };
        match core.flights.join(&key, self.tier.trusted_for()) {
            Joined::Shared(waiter) => {
                core.telemetry.shared.bump();
                outcome("shared");
                self.wait(&key, waiter, &span).await
            }
            Joined::Led(leader, waiter) => {
                outcome("miss");
                let waited = self.wait(&key, waiter, &span);
                match lead(leader, prepare)? {
                    Some(running) => running.beside(waited).await,
                    None => waited.await,
                }
            }
        }
    }

    /// Whether a call that finds nothing to serve in memory reads the shared tier without a
    /// lock before it goes through the key's flight: where values do not live in memory
    /// (`backend = "redis"`), whose calls mostly find their value there; and with memory in
    /// front, for a key whose value `lapsed` there in a cache with `memory_ttl`, whose memory
    /// gives a value up before the tier does. Otherwise the tier often lacks the key too (this
    /// process never held it, or held it for as long as the tier keeps it): the flight's first
    /// step reads it and takes its lock in one round trip (a value found costs that round trip
    /// all the same, and the script costs the server a little more than the plain read; a miss
    /// costs two round trips beyond its load, not three).
    pub(crate) fn reads_first(&self, lapsed: bool) -> bool {
        self.tier.reads()
            && (!self.core.config.in_memory()
                || (lapsed && self.core.options().memory_ttl.is_some()))
    }

    /// A fresh value of `key` read from the shared tier on this task, kept in memory where
    /// values live there; past `refresh_after`, served and refreshed in the background. `prepare`
    /// back when there is none to serve.
    async fn read<P, L>(&'static self, key: &K, prepare: P) -> Result<V, P>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        let Some(direct) = Direct::new(&self.core, key) else {
            return Err(prepare);
        };
        let Some(shared) = self.tier.read(&direct).await else {
            return Err(prepare);
        };
        let Some((value, early)) = self.take_read(direct, shared) else {
            return Err(prepare);
        };
        if let Some(filled_at) = early {
            self.refresh_in_background(key, || Erased::of(prepare()), Reason::Early, filled_at);
        }
        Ok(value)
    }

    /// The value of an entry read from the shared tier through `direct`, kept in memory where
    /// values live there, if it may be served now: fresh by this process's clock, and neither
    /// the key nor a tag of it invalidated since the read began. With it, when it was loaded if
    /// it is past `refresh_after` (a background refresh is due).
    fn take_read(
        &self,
        direct: Direct<'_, K, V>,
        shared: Shared<V>,
    ) -> Option<(V, Option<Instant>)> {
        let entry = direct.begun.entry(shared.entry, shared.trusted_for);
        let freshness = self.core.freshness(&entry, Instant::now());
        // Not fresh by this process's clock, or a tag invalidated meanwhile: the flight decides.
        if !matches!(freshness, Freshness::Fresh | Freshness::Early) || !entry.current() {
            return None;
        }
        let (value, filled_at) = (entry.value.clone(), entry.filled_at());
        if !matches!(direct.begun.keep(entry), Kept::Stored) {
            // Invalidated while it was read, or memory holds a newer value.
            return None;
        }
        drop(direct);
        self.core.telemetry.remote_hits.bump();
        Some((value, (freshness == Freshness::Early).then_some(filled_at)))
    }

    /// Waits for the key's flight. With a soft timeout, a last good value (in memory, or one
    /// the flight's tier offered) answers after it; the load goes on and stores its result.
    async fn wait(&self, key: &K, mut waiter: Waiter<V>, span: &tracing::Span) -> Result<V, Error> {
        let core = &self.core;
        let _waiting = core.telemetry.waiters.raise();
        let name = &core.config.name;
        let Some(soft) = core.options().soft_timeout.filter(|_| waiter.takes_stale()) else {
            return waiter.wait(name).await;
        };
        if let Ok(outcome) = tokio::time::timeout(soft, waiter.wait(name)).await {
            return outcome;
        }
        let now = Instant::now();
        let last_good = match core.config.in_memory() {
            true => core.entry(key),
            false => waiter.last_good().filter(|entry| entry.current()),
        };
        match last_good.filter(|entry| entry.fail_safe(now)) {
            Some(entry) => {
                core.telemetry.fail_safe_served.bump();
                span.record("outcome", "soft_timeout");
                Ok(entry.value)
            }
            None => waiter.wait(name).await,
        }
    }

    /// The cache's core (for the simulation's checks).
    #[cfg(feature = "simulation")]
    pub(crate) fn core(&self) -> &Core<K, V> {
        &self.core
    }

    /// Drops this process's copy of `key` (whether there was one) and detaches its running load
    /// (which stores nothing): after this returns, no call here returns a value whose load began
    /// before it.
    pub(crate) fn forget(&self, key: &K) -> bool {
        self.forget_as(key, Invalidation::Drop)
    }

    /// Drops every value this process holds and detaches every running load (`clear`).
    pub(crate) fn clear_here(&self) {
        self.forget_flights();
        self.core.memory.clear();
    }

    /// Ends every flight's sharing: a call after this does not join a load begun before.
    pub(crate) fn forget_flights(&self) {
        for key in self.core.flights.keys() {
            self.core.flights.forget(&key);
        }
    }

    /// [`Cache::forget`], or with [`Invalidation::Expire`] the value kept but no longer fresh
    /// (stale for its stale window at most, then its last good value); whether a value was held.
    pub(crate) fn forget_as(&self, key: &K, how: Invalidation) -> bool {
        self.core.flights.forget(key);
        match how {
            Invalidation::Drop => self.core.memory.invalidate(key),
            Invalidation::Expire => self.core.memory.expire(key, Instant::now()),
        }
    }
}
