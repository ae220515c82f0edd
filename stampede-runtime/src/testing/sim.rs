//! Hooks for the deterministic simulation (`tests/simulation.rs`, feature `simulation`): caches
//! built over any tier outside the generated code, the fake shared tier, seeded randomness, and
//! what a cache leaves behind after a run. Not for users: it changes without notice.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::Cache;
use crate::config::Config;
use crate::core::Tags;
use crate::error::{Error, LoadError};
use crate::kv::{Key, Value};
use crate::load::RetryIf;
use crate::memory::Invalidation;
use crate::registry::{self, AnyCache as _};
use crate::stats::Stats;
use crate::tier::{One, Tier};
use crate::witness::ops::Ops;

pub use crate::core::Values;
pub use crate::testing::fake_tier::{Event, Fake, Process, Space, Store, tier, tier_of};
pub use crate::tier::{Call, Local};

/// A cache of a simulated function, over tier `T`.
pub struct SimCache<K: Key, V: Value, T: 'static> {
    cache: &'static Cache<K, V, T>,
}

impl<K: Key, V: Value, T: 'static> Clone for SimCache<K, V, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: Key, V: Value, T: 'static> Copy for SimCache<K, V, T> {}

/// What a cache holds between calls that must be gone once nothing runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Keys marked in flight.
    pub flights: usize,
    /// Keys with a load or read registered with the memory tier.
    pub registrations: usize,
    /// The breaker's probe still running.
    pub probing: bool,
}

impl<K: Key, V: Value, T: Tier<K, V>> SimCache<K, V, T> {
    /// A cache with these options over `tier`, listed in the registry, living until
    /// [`SimCache::free`].
    pub fn new(config: Config, tier: T, tags: Tags<K>, values: Values<V>) -> Self {
        let cache = Box::leak(Box::new(Cache::of_form(config, tier, tags, values)));
        registry::register(cache);
        SimCache { cache }
    }

    /// A call of the function (`Call::Get`), or its companion's `refresh` or `read_through`,
    /// whose attempts `load` makes; its failed attempts retried only when `retry_if`
    /// (`#[cached(retry_if = "path")]`) accepts their error, every one without it.
    pub fn call<F, Fut, E>(
        self,
        call: Call,
        key: K,
        load: F,
        retry_if: Option<fn(&E) -> bool>,
    ) -> impl Future<Output = Result<V, Error>> + Send
    where
        F: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: LoadError,
    {
        let retry_if = retry_if.unwrap_or(|_| true);
        self.cache
            .call(call, key, move || RetryIf { load, retry_if })
    }

    /// The companion's `invalidate`; whether a value was held for the key. This and the
    /// operations below go through [`Ops`], as the generated code's do.
    pub async fn invalidate(self, key: K) -> Result<bool, Error> {
        Ops::invalidate(self.cache, key, Invalidation::Drop).await
    }

    /// The companion's `clear`.
    pub async fn clear(self) -> Result<(), Error> {
        Ops::clear(self.cache).await
    }

    /// The companion's `expire`; whether a value was held for the key.
    pub async fn expire(self, key: K) -> Result<bool, Error> {
        Ops::invalidate(self.cache, key, Invalidation::Expire).await
    }

    /// The companion's `prime`.
    pub async fn prime(self, key: K, value: V) -> Result<(), Error> {
        Ops::prime(self.cache, key, value).await
    }

    /// The companion's `peek`.
    pub fn peek(self, key: &K) -> Option<V> {
        Ops::peek(self.cache, key)
    }

    /// Its counters.
    pub fn stats(self) -> Stats {
        self.cache.stats()
    }

    /// What it holds that must be gone once nothing runs.
    pub fn leftovers(self) -> Leftovers {
        let core = self.cache.core();
        Leftovers {
            flights: core.flights.len(),
            registrations: core.memory.loading_count(),
            probing: core
                .breaker
                .as_ref()
                .is_some_and(|breaker| breaker.probing()),
        }
    }

    /// Takes the cache off the registry and frees it.
    ///
    /// # Safety
    ///
    /// Nothing may use the cache any more: every runtime that ran its calls has shut down (their
    /// tasks, which borrow it, are dropped), no [`SimCache`] copy is used again, and no fake
    /// store still lists it (drop the stores first).
    pub unsafe fn free(self) {
        registry::unregister(self.cache);
        let cache = self.cache as *const Cache<K, V, T> as *mut Cache<K, V, T>;
        // SAFETY: the cache was leaked from a `Box` in `new`, and the caller guarantees that no
        // reference to it is left.
        drop(unsafe { Box::from_raw(cache) });
    }
}

/// The future of one attempt of a batch load: each key's answer, in order.
type Answers<V, E> = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Option<V>>, E>> + Send>>;

/// The load of a batch function's cache, as the generated code makes it: a call of the
/// function with the keys, each key answered from its map (`None`: left out, absent).
fn answered<K, V, F, Fut, E>(load: F) -> impl Fn(&Vec<K>) -> Answers<V, E> + Send + Sync + 'static
where
    K: Key,
    V: Value,
    F: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<HashMap<K, V>, E>> + Send + 'static,
    E: LoadError,
{
    move |keys: &Vec<K>| -> Answers<V, E> {
        let call = load(keys);
        let keys = keys.clone();
        Box::pin(async move {
            let mut found = call.await?;
            Ok(keys.iter().map(|key| found.remove(key)).collect())
        })
    }
}

impl<K: Key, V: Value, T: Tier<K, Option<V>>> SimCache<K, Option<V>, T> {
    /// A call of a batch function (`refresh`: its companion's `refresh`) whose attempts `load`
    /// makes, each with the keys to load, returning a map of those it found; its failed attempts
    /// retried as [`SimCache::call`]'s. Each key once, in the order first given, with its own
    /// answer (`None`: absent).
    pub fn get_many<F, Fut, E>(
        self,
        keys: Vec<K>,
        load: F,
        retry_if: Option<fn(&E) -> bool>,
        refresh: bool,
    ) -> impl Future<Output = Vec<(K, Result<Option<V>, Error>)>> + Send
    where
        F: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<HashMap<K, V>, E>> + Send + 'static,
        E: LoadError,
    {
        let retry_if = retry_if.unwrap_or(|_| true);
        let call = if refresh { Call::Refresh } else { Call::Get };
        let load = answered(load);
        self.cache
            .get_many(keys, move || RetryIf { load, retry_if }, call)
    }

    /// A single-key call of a batch function's cache (a function with `batch_loader`), whose
    /// load calls the batch function with its key; with `window`, loaded together with the
    /// other single-key calls that must load within it (`batch_window`). The load is made
    /// (`make`) only when this call must start one, as the generated code's is: a window's load
    /// is the one its first call made, called with every key the window holds, so that a
    /// simulation can tell which call's flight each key of it is.
    pub fn get_one<M, F, Fut, E>(
        self,
        key: K,
        make: M,
        retry_if: Option<fn(&E) -> bool>,
        window: Option<Duration>,
    ) -> impl Future<Output = Result<Option<V>, Error>> + Send
    where
        M: FnOnce() -> F + Send + 'static,
        F: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<HashMap<K, V>, E>> + Send + 'static,
        E: LoadError,
    {
        let retry_if = retry_if.unwrap_or(|_| true);
        let prepare = move || RetryIf {
            load: answered(make()),
            retry_if,
        };
        let cache = self.cache;
        async move {
            match window {
                Some(window) => cache.get_in_window(key, prepare, window).await,
                None => cache.get(key, move || One::new(Arc::new(prepare()))).await,
            }
        }
    }
}

impl<K: Key, V: Value> SimCache<K, V, Fake<K, V>> {
    /// A cache over the fake shared tier, attached to the tier's process (it hears the
    /// invalidations announced to that process).
    pub fn shared(config: Config, tier: Fake<K, V>, tags: Tags<K>, values: Values<V>) -> Self {
        let (store, process) = (tier.store.clone(), tier.process);
        let (space, connection) = (tier.space.clone(), tier.connection.clone());
        let cache = SimCache::new(config, tier, tags, values);
        store.attach_in(process, space, connection, cache.cache);
        cache
    }
}

/// Seeds this thread's randomness (TTL jitter, retry backoff): one seed, one run. `None`: the
/// thread's random generator again.
pub fn seed(seed: Option<u64>) {
    crate::random::seed(seed);
}

/// Forgets the options set at run time for the caches named `name` (a run replayed anew).
pub fn forget_configured(name: &str) {
    crate::tuning::forget(name);
}

/// A tag's invalidation in this process's memory (`stampede::invalidate_tag` without Redis).
pub fn forget_tag(tag: &str) {
    registry::forget_tag(tag);
}

/// A tag's expiry in this process's memory (`stampede::expire_tag` without Redis).
pub fn expire_tag(tag: &str) {
    registry::forget_tag_as(tag, Invalidation::Expire);
}

/// How many background refreshes hold a turn in the process's refresh budget now.
pub fn refresh_turns_taken() -> usize {
    crate::budget::turns_taken()
}
