//! One cache: the in-memory store, the loads in flight, and the path of a call through them.

use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::config::{Config, Lock};
use crate::entry::{Entry, Freshness};
use crate::error::{Error, LoadError, UpstreamError};
use crate::flight::{Flights, Joined, Leader};
use crate::stats::{Counters, Inspect, Stats};

/// What a cache key must be: hashable, comparable, cloneable, and shareable across tasks.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static {}
impl<K: Hash + Eq + Clone + Send + Sync + 'static> Key for K {}

/// What a cached value must be: cloneable (every caller gets its own copy) and shareable.
pub trait Value: Clone + Send + Sync + 'static {}
impl<V: Clone + Send + Sync + 'static> Value for V {}

/// The store, the in-flight loads and the counters of one cached function.
pub(crate) struct Cache<K, V> {
    config: Config,
    store: moka::future::Cache<K, Entry<V>>,
    flights: Flights<K, V>,
    counters: Counters,
}

impl<K: Key, V: Value> Cache<K, V> {
    pub(crate) fn new(config: Config) -> Self {
        let store = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            .expire_after(UntilStale)
            .build();
        Cache {
            config,
            store,
            flights: Flights::new(),
            counters: Counters::default(),
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
        if let Some(entry) = self.store.get(&key).await {
            match entry.freshness(Instant::now()) {
                Freshness::Fresh => {
                    Counters::bump(&self.counters.hits);
                    return Ok(entry.value);
                }
                Freshness::Stale if self.config.lock != Lock::None => {
                    Counters::bump(&self.counters.stale_served);
                    self.refresh(&key, prepare);
                    return Ok(entry.value);
                }
                Freshness::Stale | Freshness::Expired => {}
            }
        }
        Counters::bump(&self.counters.misses);
        match self.config.lock {
            Lock::None => self.load(&key, &prepare()).await,
            Lock::Local => match self.flights.join(&key) {
                Joined::Shared(waiter) => {
                    Counters::bump(&self.counters.shared);
                    waiter.wait(&self.config.name).await
                }
                Joined::Led(leader, waiter) => {
                    self.spawn_load(leader, prepare())?;
                    waiter.wait(&self.config.name).await
                }
            },
        }
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
            Counters::bump(&self.counters.refreshes);
            // Outside a runtime the refresh cannot start; the stale value is served regardless.
            let _ = self.spawn_load(leader, prepare());
        }
    }

    /// Runs the leader's load detached on the caller's runtime, so that cancelling the caller
    /// neither cancels the load nor strands the other waiters.
    fn spawn_load<E, L, Fut>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: L,
    ) -> Result<(), Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime {
            cache: self.config.name.clone(),
        })?;
        runtime.spawn(async move {
            let outcome = AssertUnwindSafe(self.load_unless_fresh(leader.key(), &load))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Counters::bump(&self.counters.load_errors);
                    Err(Error::panicked(&self.config.name, &*panic))
                });
            leader.finish(outcome);
        });
        Ok(())
    }

    async fn load_unless_fresh<E, L, Fut>(&self, key: &K, load: &L) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        // A load that finished between this caller's miss and its taking the lead has stored
        // its value already: serve that instead of loading twice.
        if let Some(entry) = self.store.get(key).await
            && entry.freshness(Instant::now()) == Freshness::Fresh
        {
            return Ok(entry.value);
        }
        self.load(key, load).await
    }

    /// Runs the load with its timeout and retries, and stores a value it returns.
    async fn load<E, L, Fut>(&self, key: &K, load: &L) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let mut retry = 0;
        loop {
            Counters::bump(&self.counters.loads);
            let error = match tokio::time::timeout(self.config.timeout, load(key)).await {
                Ok(Ok(value)) => {
                    let entry = Entry::fill(value.clone(), Instant::now(), &self.config);
                    self.store.insert(key.clone(), entry).await;
                    return Ok(value);
                }
                Ok(Err(error)) => Error::Upstream(UpstreamError::new(&self.config.name, error)),
                Err(_elapsed) => {
                    Counters::bump(&self.counters.timeouts);
                    Error::Timeout {
                        cache: self.config.name.clone(),
                        after: self.config.timeout,
                    }
                }
            };
            Counters::bump(&self.counters.load_errors);
            if retry == self.config.retries {
                return Err(error);
            }
            tokio::time::sleep(self.config.backoff_delay(retry)).await;
            retry += 1;
        }
    }
}

impl<K: Key, V: Value> Inspect for Cache<K, V> {
    fn config(&self) -> &Config {
        &self.config
    }

    fn stats(&self) -> Stats {
        self.counters
            .snapshot(self.store.entry_count(), self.flights.len() as u64)
    }
}

/// Lets moka reclaim an entry once its stale window has closed. Freshness itself is judged from
/// the entry's own deadlines on tokio's clock, which moka's clock does not follow.
struct UntilStale;

impl<K, V> moka::Expiry<K, Entry<V>> for UntilStale {
    fn expire_after_create(
        &self,
        _key: &K,
        entry: &Entry<V>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(entry.time_to_live(Instant::now()))
    }

    fn expire_after_update(
        &self,
        _key: &K,
        entry: &Entry<V>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.time_to_live(Instant::now()))
    }
}
