//! How a cache shares its values beyond this process: not at all, or through Redis.

use std::future::Future;
use std::marker::PhantomData;

use crate::cache::{Cache, Key, Serve, Value};
use crate::error::{Error, LoadError};

/// The shared tier of one cache, chosen by the code `#[cached]` generates: [`local`] or, with
/// the `redis` feature, `redis`, which also holds how keys and values are written there.
pub struct Shared<K, V> {
    #[cfg(feature = "redis")]
    pub(crate) codec: Option<crate::redis::Codec<K, V>>,
    _types: PhantomData<fn(K) -> V>,
}

/// Values stay in this process.
pub fn local<K, V>() -> Shared<K, V> {
    Shared {
        #[cfg(feature = "redis")]
        codec: None,
        _types: PhantomData,
    }
}

impl<K: Key, V: Value> Shared<K, V> {
    #[cfg(feature = "redis")]
    pub(crate) fn through(codec: crate::redis::Codec<K, V>) -> Self {
        Shared {
            codec: Some(codec),
            _types: PhantomData,
        }
    }

    pub(crate) fn is_remote(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.codec.is_some();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Gets the value of a key that this process does not have.
    pub(crate) async fn fill<E, L, Fut>(
        &self,
        cache: &Cache<K, V>,
        key: &K,
        load: &L,
        serve: Serve<'_, V>,
    ) -> Result<V, Error>
    where
        E: LoadError,
        L: Fn(&K) -> Fut + Sync,
        Fut: Future<Output = Result<V, E>> + Send,
    {
        #[cfg(feature = "redis")]
        if let Some(codec) = &self.codec {
            return crate::redis::flow::fill(cache, codec, key, load, serve).await;
        }
        let _ = serve;
        cache.load_locally(key, load).await
    }

    /// Drops a key from the shared tier and from every process's memory.
    pub(crate) async fn invalidate(&self, cache: &Cache<K, V>, key: &K) -> Result<(), Error> {
        #[cfg(feature = "redis")]
        if let Some(codec) = &self.codec {
            return crate::redis::flow::invalidate(cache, codec, key).await;
        }
        let _ = (cache, key);
        Ok(())
    }
}
