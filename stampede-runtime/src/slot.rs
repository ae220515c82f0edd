//! The `static` that `#[cached]` puts in each function, and the calls its generated code makes.

use std::any::{Any, type_name};
use std::future::Future;
use std::sync::{OnceLock, PoisonError, RwLock};

use crate::cache::{Cache, Key, Value};
use crate::config::Config;
use crate::error::{Error, LoadError};
use crate::registry;
use crate::tier::Tier;

type Erased = &'static (dyn Any + Send + Sync);

/// Holds the cache of one function. It is type-erased because a `static` inside a method may not
/// name `Self` or the impl's generic parameters; the key and value types are named at the call.
///
/// A function in a generic impl shares one `static` between instantiations, so a slot keeps a
/// cache per (key, value) type pair: the first in a lock-free cell, any others in a list.
pub struct Slot {
    first: OnceLock<Erased>,
    others: RwLock<Vec<Erased>>,
}

impl Slot {
    /// An empty slot; the cache is built at the first call.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Slot {
            first: OnceLock::new(),
            others: RwLock::new(Vec::new()),
        }
    }

    /// A call of a function returning `Result<V, E>`: only `Ok` values are cached. The function's
    /// own error reaches a caller as itself when that caller was the only one of the load, and as
    /// `E::from(stampede::Error::Upstream(..))` (the original reachable through
    /// [`Error::upstream`]) when several callers shared it; timeouts, panics and the like arrive
    /// as `E::from(stampede::Error)`.
    ///
    /// `config` and `tier` build the cache at the first call: its options, and what it shares
    /// beyond this process.
    pub async fn get_result<K, V, E, C, S, T, P, L, Fut>(
        &'static self,
        config: C,
        tier: S,
        key: K,
        prepare: P,
    ) -> Result<V, E>
    where
        K: Key,
        V: Value,
        E: LoadError + From<Error>,
        C: FnOnce() -> Config,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
        P: FnOnce() -> L,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        match self.cache(config, tier).get(key, prepare).await {
            Ok(value) => Ok(value),
            // The function's own error, as itself when this caller was its load's only one.
            Err(Error::Upstream(upstream)) => Err(upstream
                .into_original::<E>()
                .unwrap_or_else(|upstream| E::from(Error::Upstream(upstream)))),
            Err(error) => Err(E::from(error)),
        }
    }

    /// A call of a function returning a plain value (an `Option` included). Such a function has
    /// no error channel: a load that panics or times out makes every waiting caller panic.
    pub async fn get_value<K, V, C, S, T, P, L, Fut>(
        &'static self,
        config: C,
        tier: S,
        key: K,
        prepare: P,
    ) -> V
    where
        K: Key,
        V: Value,
        C: FnOnce() -> Config,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
        P: FnOnce() -> L,
        L: Fn(&K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = V> + Send + 'static,
    {
        let prepare = move || {
            let load = prepare();
            move |key: &K| infallible(load(key))
        };
        match self.cache(config, tier).get(key, prepare).await {
            Ok(value) => value,
            Err(error) => panic!("{error}"),
        }
    }

    fn cache<K, V, C, S, T>(&'static self, config: C, tier: S) -> &'static Cache<K, V, T>
    where
        K: Key,
        V: Value,
        C: FnOnce() -> Config,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
    {
        let mut build = Some((config, tier));
        let first = *self.first.get_or_init(|| {
            let (config, tier) = build.take().expect("built once");
            leak(config(), tier)
        });
        match (first.downcast_ref(), build) {
            (Some(cache), _) => cache,
            (None, Some((config, tier))) => self.other(config, tier),
            (None, None) => unreachable!("the cache just built has the caller's types"),
        }
    }

    /// The cache of a further (key, value) type pair, in a generic impl.
    #[cold]
    fn other<K, V, C, S, T>(&'static self, config: C, tier: S) -> &'static Cache<K, V, T>
    where
        K: Key,
        V: Value,
        C: FnOnce() -> Config,
        S: FnOnce(&Config) -> T,
        T: Tier<K, V>,
    {
        let find = |others: &[Erased]| others.iter().find_map(|cache| cache.downcast_ref());
        if let Some(cache) = find(&self.others.read().unwrap_or_else(PoisonError::into_inner)) {
            return cache;
        }
        let mut others = self.others.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(cache) = find(&others) {
            return cache;
        }
        let mut config = config();
        config.name = format!(
            "{}<{}, {}>",
            config.name,
            type_name::<K>(),
            type_name::<V>()
        )
        .into();
        let cache = leak(config, tier);
        others.push(cache);
        cache
            .downcast_ref()
            .expect("a cache just built has the types it was built with")
    }
}

/// Builds a cache that lives as long as the process, and lists it in the registry.
fn leak<K, V, S, T>(config: Config, tier: S) -> Erased
where
    K: Key,
    V: Value,
    S: FnOnce(&Config) -> T,
    T: Tier<K, V>,
{
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(crate::telemetry::describe);
    let tier = tier(&config);
    let cache: &'static Cache<K, V, T> = Box::leak(Box::new(Cache::new(config, tier)));
    registry::register(cache);
    cache
}

async fn infallible<V>(load: impl Future<Output = V>) -> Result<V, std::convert::Infallible> {
    Ok(load.await)
}

/// Gives an `async` block its output type, so that `?` and `return` in a function's body infer
/// as they did before the body moved into the load.
pub fn typed<T, F: Future<Output = T>>(future: F) -> F {
    future
}
