//! The operations of a cached function's companion that load nothing (`invalidate`,
//! `invalidate_found`, `expire`, `clear`, `prime`, `peek`), as the generated code calls them.
//!
//! The companion has one hidden `__ops` that checks the key and value types (as the function's
//! call does, at the spans the user wrote them) and returns the function's cache as an [`Ops`]
//! object. Each operation is then one call here with that `__ops` and its key: no bound to prove,
//! so the front end checks the types once per function rather than once per operation, and
//! the operations' code is compiled once per key, value and tier type, in the object's vtable,
//! when a crate uses one of them (issue 38).

use crate::cache::Cache;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::memory::Invalidation;
use crate::registry::BoxFuture;
use crate::tier::Tier;

/// A function's hidden `__ops`: its cache, built at the first use.
pub type OpsOf<K, V> = fn() -> &'static dyn Ops<K, V>;

/// A cache as its companion's operations reach it.
pub trait Ops<K, V>: Sync {
    /// Drops `key` (or ends its fresh time), here, in the tier and in every other process's
    /// memory; whether a value was held for it, here or in the tier.
    fn invalidate(
        &'static self,
        key: K,
        how: Invalidation,
    ) -> BoxFuture<'static, Result<bool, Error>>;
    /// Drops every value of the cache, here, in the tier and in every other process's memory.
    fn clear(&'static self) -> BoxFuture<'static, Result<(), Error>>;
    /// Stores `value` for `key` as if it had been loaded now.
    fn prime(&'static self, key: K, value: V) -> BoxFuture<'static, Result<(), Error>>;
    /// The value held in this process's memory for `key`, if it may be served now.
    fn peek(&'static self, key: &K) -> Option<V>;
}

impl<K: Key, V: Value, T: Tier<K, V>> Ops<K, V> for Cache<K, V, T> {
    fn invalidate(
        &'static self,
        key: K,
        how: Invalidation,
    ) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move { self.invalidate_as(&key, how).await })
    }

    fn clear(&'static self) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(Cache::clear(self))
    }

    fn prime(&'static self, key: K, value: V) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(Cache::prime(self, key, value))
    }

    fn peek(&'static self, key: &K) -> Option<V> {
        Cache::peek(self, key)
    }
}

/// The companion's `invalidate`: drops `key` (see `stampede::invalidate`).
pub async fn invalidate<K, V>(ops: OpsOf<K, V>, key: K) -> Result<(), Error> {
    ops().invalidate(key, Invalidation::Drop).await.map(drop)
}

/// The companion's `invalidate_found`: `invalidate`, and whether a value was held.
pub async fn invalidate_found<K, V>(ops: OpsOf<K, V>, key: K) -> Result<bool, Error> {
    ops().invalidate(key, Invalidation::Drop).await
}

/// The companion's `expire`: ends the freshness of `key`'s value (see `stampede::expire`).
pub async fn expire<K, V>(ops: OpsOf<K, V>, key: K) -> Result<(), Error> {
    ops().invalidate(key, Invalidation::Expire).await.map(drop)
}

/// The companion's `clear`: drops every value (see `stampede::clear`).
pub async fn clear<K, V>(ops: OpsOf<K, V>) -> Result<(), Error> {
    ops().clear().await
}

/// The companion's `prime`: stores `value` for `key` as if it had been loaded now.
pub async fn prime<K, V>(ops: OpsOf<K, V>, key: K, value: V) -> Result<(), Error> {
    ops().prime(key, value).await
}

/// The companion's `peek`: the value held in this process's memory for `key`, if servable.
pub fn peek<K, V>(ops: OpsOf<K, V>, key: K) -> Option<V> {
    ops().peek(&key)
}
