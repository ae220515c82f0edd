//! What the code generated for a batch function calls once the checks of its value (and error)
//! type have passed: the call of the function, a single-key call of its cache, and the
//! companion's operations on a cache that keeps, per key, `Some(value)` or `None` for a key the
//! function's map left out.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use super::Companion;
use crate::checks::Witness;
use crate::config::Config;
use crate::error::{Error, LoadError};
use crate::kv::{Key, Value};
use crate::slot::{Call, ErrorRules, Recipe};
use crate::tier::Tier;

impl<V: Value> Witness<V> {
    /// Calls [`Recipe::values`] once the value type's checks have passed.
    #[inline(always)]
    pub fn values<S, K, T, P, L, Fut, const LEAN: bool>(
        self,
        recipe: Recipe<S, K, Option<V>, (), LEAN>,
        call: Call,
        keys: Vec<K>,
        prepare: P,
    ) -> impl Future<Output = Vec<(K, Option<V>)>>
    where
        K: Key,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Option<V>>> + Send + 'static,
    {
        recipe.values(call, keys, prepare)
    }

    /// Calls [`Recipe::value_one`] once the value type's checks have passed.
    #[inline(always)]
    pub fn value_one<S, K, T, P, L, Fut, const LEAN: bool>(
        self,
        recipe: Recipe<S, K, Option<V>, (), LEAN>,
        key: K,
        prepare: P,
        window: Option<Duration>,
    ) -> impl Future<Output = Option<V>>
    where
        K: Key,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Option<V>>> + Send + 'static,
    {
        recipe.value_one(key, prepare, window)
    }

    /// The operations of a batch function's companion, for a function returning a plain map.
    #[inline(always)]
    pub fn values_companion(self) -> Companion<Option<V>> {
        Companion(PhantomData)
    }
}

impl<V: Value, E: LoadError + From<Error>> Witness<Result<V, E>> {
    /// Calls [`Recipe::results`] once the checks of `V` and `E` have passed.
    #[inline(always)]
    pub fn results<S, K, T, P, L, Fut, const LEAN: bool>(
        self,
        recipe: Recipe<S, K, Option<V>, ErrorRules<E>, LEAN>,
        call: Call,
        keys: Vec<K>,
        prepare: P,
    ) -> impl Future<Output = Result<Vec<(K, Option<V>)>, E>>
    where
        K: Key,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Option<V>>, E>> + Send + 'static,
    {
        recipe.results(call, keys, prepare)
    }

    /// Calls [`Recipe::result_one`] once the checks of `V` and `E` have passed.
    #[inline(always)]
    pub fn result_one<S, K, T, P, L, Fut, const LEAN: bool>(
        self,
        recipe: Recipe<S, K, Option<V>, ErrorRules<E>, LEAN>,
        key: K,
        prepare: P,
        window: Option<Duration>,
    ) -> impl Future<Output = Result<Option<V>, E>>
    where
        K: Key,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Option<V>>, E>> + Send + 'static,
    {
        recipe.result_one(key, prepare, window)
    }

    /// The operations of a batch function's companion, for a function returning
    /// `Result<Map, E>`.
    #[inline(always)]
    pub fn results_companion(self) -> Companion<Option<V>> {
        Companion(PhantomData)
    }
}
