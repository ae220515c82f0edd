//! One cache: the in-memory store, the loads in flight, and the path of a call through them.

use std::any::Any;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use crate::config::{Config, Lock};
use crate::entry::{Entry, Freshness};
use crate::error::{Error, LoadError, UpstreamError};
use crate::flight::{Flights, Joined, Leader};
use crate::hot::HotKeys;
use crate::shared::Shared;
use crate::stats::{Inspect, Stats};
use crate::telemetry::{Reason, Telemetry};

/// What a cache key must be: hashable, comparable, cloneable, printable (in stats and traces),
/// and shareable across tasks.
pub trait Key: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
impl<K: Hash + Eq + Clone + Debug + Send + Sync + 'static> Key for K {}

/// What a cached value must be: cloneable (every caller gets its own copy) and shareable.
pub trait Value: Clone + Send + Sync + 'static {}
impl<V: Clone + Send + Sync + 'static> Value for V {}

/// Hands a value to a load's waiters before the load ends (a stale value during a refresh).
pub(crate) type Serve<'a, V> = &'a (dyn Fn(&V) + Send + Sync);

/// The store, the in-flight loads and the counters of one cached function.
pub(crate) struct Cache<K, V> {
    pub(crate) config: Config,
    pub(crate) store: moka::future::Cache<K, Entry<V>>,
    flights: Flights<K, V>,
    pub(crate) telemetry: Telemetry,
    hot: HotKeys<K>,
    /// How values are shared beyond this process, if they are.
    pub(crate) shared: Shared<K, V>,
    /// Bumped by every invalidation: a load that began before one does not store its value.
    generation: AtomicU64,
}

impl<K: Key, V: Value> Cache<K, V> {
    pub(crate) fn new(config: Config, shared: Shared<K, V>) -> Self {
        // moka reclaims memory only: freshness is judged from each entry's own deadlines on
        // tokio's clock (which paused-clock tests move and moka's clock does not). No entry is
        // servable longer than `ttl + stale` after it was stored, so that is moka's time to live;
        // a fixed one costs nothing per read, where a per-entry expiry hook costs a sixth of a hit.
        let mut store = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            .time_to_live(config.ttl.saturating_add(config.stale).min(MOKA_MAX_TTL));
        if shared.is_remote() {
            // Invalidations from other processes name keys by their Redis text.
            store = store.support_invalidation_closures();
        }
        Cache {
            telemetry: Telemetry::new(&config),
            config,
            store: store.build(),
            flights: Flights::new(),
            hot: HotKeys::new(),
            shared,
            generation: AtomicU64::new(0),
        }
    }

    /// The value for `key`: fresh from the store, stale while one refresh runs, or from the
    /// key's single load. `prepare` builds the load; it runs only when a load must start.
    pub(crate) async fn get<E, P, L, Fut>(&'static self, key: K, prepare: P) -> Result<V, Error>
    where
        E: LoadError,
        P: FnOnce() -> L,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        // At TRACE level: an atomic load decides it is off, so the hit path pays nothing more.
        // Never entered (entering costs on every poll): its outcome is recorded at the end.
        let span =
            tracing::trace_span!("stampede.lookup", cache = %self.config.name, outcome = Empty);
        self.lookup(key, prepare, &span).await
    }

    async fn lookup<E, P, L, Fut>(
        &'static self,
        key: K,
        prepare: P,
        span: &tracing::Span,
    ) -> Result<V, Error>
    where
        E: LoadError,
        P: FnOnce() -> L,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        let outcome = |outcome: &str| {
            span.record("outcome", outcome);
        };
        if self.config.in_memory()
            && let Some(entry) = self.store.get(&key).await
        {
            match entry.freshness(Instant::now()) {
                Freshness::Fresh => {
                    let hit = self.telemetry.hits.bump();
                    self.hot.hit(hit, &key, entry.filled_at);
                    outcome("hit");
                    return Ok(entry.value);
                }
                Freshness::Stale if self.config.lock != Lock::None => {
                    self.telemetry.stale_served.bump();
                    self.refresh(&key, prepare);
                    outcome("stale");
                    return Ok(entry.value);
                }
                Freshness::Stale | Freshness::Expired => {}
            }
        }
        self.telemetry.misses.bump();
        if self.config.lock == Lock::None {
            outcome("miss");
            let load = self.counted(prepare(), Reason::Miss);
            return self.fill(&key, &load, &|_| {}).await;
        }
        let waiter = match self.flights.join(&key) {
            Joined::Shared(waiter) => {
                self.telemetry.shared.bump();
                outcome("shared");
                waiter
            }
            Joined::Led(leader, waiter) => {
                outcome("miss");
                self.spawn_load(leader, prepare(), Reason::Miss)?;
                waiter
            }
        };
        let _waiting = self.telemetry.waiters.raise();
        waiter.wait(&self.config.name).await
    }

    /// Starts a background refresh of a stale key, unless one is already in flight.
    fn refresh<E, P, L, Fut>(&'static self, key: &K, prepare: P)
    where
        E: LoadError,
        P: FnOnce() -> L,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        if let Some(leader) = self.flights.lead(key) {
            // Outside a runtime the refresh cannot start; the stale value is served regardless.
            let _ = self.spawn_load(leader, prepare(), Reason::Stale);
        }
    }

    /// Runs the leader's load detached on the caller's runtime, so that cancelling the caller
    /// neither cancels the load nor strands the other waiters. Its span follows from the span of
    /// the call that started it.
    fn spawn_load<E, L, Fut>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: L,
        reason: Reason,
    ) -> Result<(), Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime {
            cache: self.config.name.clone(),
        })?;
        let span = tracing::debug_span!(
            "stampede.refresh",
            cache = %self.config.name,
            key = ?leader.key(),
            reason = reason.as_str(),
            outcome = Empty,
            duration_ms = Empty,
        );
        // The caller's span (the request): the lookup span is never entered.
        span.follows_from(tracing::Span::current());
        let running = async move {
            let _running = self.telemetry.in_flight.raise();
            let started = Instant::now();
            let serve = |value: &V| leader.serve(value.clone());
            let load = self.counted(load, reason);
            let outcome = AssertUnwindSafe(self.fill(leader.key(), &load, &serve))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    self.telemetry.load_errors.bump();
                    Err(Error::panicked(&self.config.name, &*panic))
                });
            let span = tracing::Span::current();
            span.record("outcome", outcome_name(&outcome));
            span.record("duration_ms", started.elapsed().as_millis() as u64);
            leader.finish(outcome);
        };
        runtime.spawn(running.instrument(span));
        Ok(())
    }

    /// `load`, counted in `cache_refresh_total{reason}` when it first runs: a flight that finds
    /// the value filled meanwhile (here or, through Redis, by another process) loads nothing.
    fn counted<'a, E, L, Fut>(
        &'a self,
        load: L,
        reason: Reason,
    ) -> impl Fn(&K) -> Fut + Send + Sync + 'a
    where
        E: LoadError,
        L: Fn(&K) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = Result<V, E>>,
    {
        let started = AtomicBool::new(false);
        move |key: &K| {
            if !started.swap(true, Ordering::Relaxed) {
                self.telemetry.load_started(reason);
            }
            load(key)
        }
    }

    /// Gets the key's value for a miss or a refresh: from a load that finished meanwhile, from
    /// the shared tier, or by loading it.
    async fn fill<E, L, Fut>(&self, key: &K, load: &L, serve: Serve<'_, V>) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut + Sync,
        Fut: Future<Output = Result<V, E>> + Send,
    {
        // A load that finished between this caller's miss and its taking the lead has stored
        // its value already: serve that instead of loading twice.
        if self.config.in_memory()
            && let Some(entry) = self.store.get(key).await
            && entry.freshness(Instant::now()) == Freshness::Fresh
        {
            return Ok(entry.value);
        }
        self.shared.fill(self, key, load, serve).await
    }

    /// Loads the key here and keeps the value in memory: the path without a shared tier, and
    /// the fallback when the shared tier is unavailable.
    pub(crate) async fn load_locally<E, L, Fut>(&self, key: &K, load: &L) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let generation = self.generation();
        let value = self.attempts(key, load).await?;
        let fresh = crate::entry::jittered_ttl(self.config.ttl, self.config.jitter);
        let entry = Entry::loaded(value.clone(), Instant::now(), fresh, self.config.stale);
        self.remember(key, entry, generation).await;
        Ok(value)
    }

    /// Runs the load with its timeout and retries.
    pub(crate) async fn attempts<E, L, Fut>(&self, key: &K, load: &L) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let started = Instant::now();
        let mut retry = 0;
        let outcome = loop {
            self.telemetry.loads.bump();
            let error = match tokio::time::timeout(self.config.timeout, load(key)).await {
                Ok(Ok(value)) => break Ok(value),
                Ok(Err(error)) => Error::Upstream(UpstreamError::new(&self.config.name, error)),
                Err(_elapsed) => {
                    self.telemetry.timeouts.bump();
                    Error::Timeout {
                        cache: self.config.name.clone(),
                        after: self.config.timeout,
                    }
                }
            };
            self.telemetry.load_errors.bump();
            if retry == self.config.retries {
                break Err(error);
            }
            tokio::time::sleep(self.config.backoff_delay(retry)).await;
            retry += 1;
        };
        self.telemetry.load_took(started.elapsed());
        outcome
    }

    /// The invalidation count, read before a load so that its value is not stored if the key
    /// was invalidated while it ran.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Keeps `entry` in memory, unless values live only in Redis or an invalidation came after
    /// `generation` was read.
    pub(crate) async fn remember(&self, key: &K, entry: Entry<V>, generation: u64) {
        if self.config.in_memory() && self.generation() == generation {
            self.store.insert(key.clone(), entry).await;
        }
    }

    /// Records an invalidation: loads running now will not store their values.
    pub(crate) fn invalidated(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Drops this process's copy of `key`.
    pub(crate) async fn forget(&self, key: &K) {
        self.invalidated();
        self.store.invalidate(key).await;
    }
}

impl<K: Key, V: Value> Inspect for Cache<K, V> {
    fn config(&self) -> &Config {
        &self.config
    }

    fn stats(&self) -> Stats {
        let t = &self.telemetry;
        Stats {
            hits: t.hits.get(),
            misses: t.misses.get(),
            stale_served: t.stale_served.get(),
            loads: t.loads.get(),
            load_errors: t.load_errors.get(),
            timeouts: t.timeouts.get(),
            refreshes: t.refreshes.get(),
            shared: t.shared.get(),
            remote_hits: t.remote_hits.get(),
            lock_acquired: t.lock_acquired.get(),
            lock_busy: t.lock_busy.get(),
            degraded: t.degraded.get(),
            decode_errors: t.decode_errors.get(),
            entries: self.store.entry_count(),
            in_flight: self.flights.len() as u64,
            waiters: t.waiters.get(),
            hot_keys: self.hot.snapshot(),
        }
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a (dyn Any + Send + Sync),
    ) -> Option<Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>> {
        let key = key.downcast_ref::<K>()?;
        Some(Box::pin(async move {
            self.forget(key).await;
            self.shared.invalidate(self, key).await
        }))
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

/// moka refuses a time to live above 1000 years.
const MOKA_MAX_TTL: Duration = Duration::from_secs(1_000 * 365 * 24 * 60 * 60);
