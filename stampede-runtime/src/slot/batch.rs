//! What the code generated for a batch function (`#[cached(batch = "ids")]`) calls: a call of
//! the function, many keys at once, and a single-key call of its cache (from a function that
//! names it with `batch_loader`). The cache of a batch function keeps, per key, `Some(value)`,
//! or `None` for a key the function's map left out.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Call, ErrorRules, Recipe, own_error};
use crate::config::Config;
use crate::error::{Error, LoadError};
use crate::kv::{Key, Value};
use crate::load::{Infallibly, Plain};
use crate::tier::{One, Tier};

impl<S, K, V, E, const LEAN: bool> Recipe<S, K, Option<V>, ErrorRules<E>, LEAN> {
    /// A call of a batch function returning `Result<Map, E>` (or its companion's `refresh`):
    /// each key once, with its value, `None` where the function's map left the key out. When
    /// the load of one of the keys failed (and no stale or fail-safe value stood in), the call
    /// fails with the first such key's error, as [`Recipe::result`] hands errors out: a
    /// failure reaches only the calls that asked for a key of the load that failed.
    pub async fn results<T, P, L, Fut>(
        self,
        call: Call,
        keys: Vec<K>,
        prepare: P,
    ) -> Result<Vec<(K, Option<V>)>, E>
    where
        K: Key,
        V: Value,
        E: LoadError + From<Error>,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Option<V>>, E>> + Send + 'static,
    {
        let (cache, rules) = self.cache::<T>();
        let prepare = rules.retrying(prepare);
        let answers = cache.get_many(keys, prepare, call).await;
        all_or_first_error(answers).map_err(|error| own_error(error, rules.clone))
    }

    /// A single-key call of a batch function's cache returning `Result<Map, E>`: the key's
    /// value, `None` if the function leaves it out. With `window`, a load it must start is made
    /// together with those other single-key calls start within it (`batch_window`).
    pub async fn result_one<T, P, L, Fut>(
        self,
        key: K,
        prepare: P,
        window: Option<Duration>,
    ) -> Result<Option<V>, E>
    where
        K: Key,
        V: Value,
        E: LoadError + From<Error>,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Option<V>>, E>> + Send + 'static,
    {
        let (cache, rules) = self.cache::<T>();
        let prepare = rules.retrying(prepare);
        let outcome = match window {
            Some(window) => cache.get_in_window(key, prepare, window).await,
            None => cache.get(key, move || One::new(Arc::new(prepare()))).await,
        };
        outcome.map_err(|error| own_error(error, rules.clone))
    }
}

impl<S, K, V, const LEAN: bool> Recipe<S, K, Option<V>, (), LEAN> {
    /// A call of a batch function returning a plain map (or its companion's `refresh`), as
    /// [`Recipe::results`]; such a function has no error channel: a load that panics or times
    /// out makes the calls that asked for its keys panic.
    pub async fn values<T, P, L, Fut>(
        self,
        call: Call,
        keys: Vec<K>,
        prepare: P,
    ) -> Vec<(K, Option<V>)>
    where
        K: Key,
        V: Value,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Option<V>>> + Send + 'static,
    {
        let (cache, ()) = self.cache::<T>();
        let prepare = move || Plain(prepare());
        let answers = cache.get_many(keys, prepare, call).await;
        match all_or_first_error(answers) {
            Ok(values) => values,
            Err(error) => panic!("{error}"),
        }
    }

    /// A single-key call of a batch function's cache returning a plain map, as
    /// [`Recipe::result_one`].
    pub async fn value_one<T, P, L, Fut>(
        self,
        key: K,
        prepare: P,
        window: Option<Duration>,
    ) -> Option<V>
    where
        K: Key,
        V: Value,
        S: FnOnce(&Config) -> T,
        T: Tier<K, Option<V>>,
        P: FnOnce() -> L + Send,
        L: Fn(&Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Option<V>>> + Send + 'static,
    {
        let (cache, ()) = self.cache::<T>();
        let prepare = move || Plain(prepare());
        let outcome = match window {
            Some(window) => cache.get_in_window(key, prepare, window).await,
            None => cache.get(key, move || One::new(Arc::new(prepare()))).await,
        };
        match outcome {
            Ok(value) => value,
            Err(error) => panic!("{error}"),
        }
    }
}

/// Every key's value, or the first error among them (the others dropped first, so that the
/// function's own error can be handed out as itself when no other caller holds it).
fn all_or_first_error<K, V>(answers: Vec<(K, Result<V, Error>)>) -> Result<Vec<(K, V)>, Error> {
    let mut values = Vec::with_capacity(answers.len());
    let mut failed = None;
    for (key, answer) in answers {
        match answer {
            Ok(value) => values.push((key, value)),
            Err(error) if failed.is_none() => failed = Some(error),
            Err(_) => {}
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(values),
    }
}

/// The keys of one batch load in groups that share every part of the key but the one key of
/// the batch (`rest` gives that part: the other key arguments, `()` when there are none), in the
/// order first seen, each with the places of its keys. The generated load calls the function
/// once per group, with that group's arguments: keys of one call of a batch function share
/// them, and so do those of a window unless single-key calls with other arguments joined it.
pub fn groups<K, R: PartialEq>(keys: &[K], rest: impl Fn(&K) -> R) -> Vec<(R, Vec<usize>)> {
    let mut groups: Vec<(R, Vec<usize>)> = Vec::new();
    for (at, key) in keys.iter().enumerate() {
        let part = rest(key);
        match groups.iter_mut().find(|(other, _)| *other == part) {
            Some((_, places)) => places.push(at),
            None => groups.push((part, vec![at])),
        }
    }
    groups
}

/// Runs the calls of a batch load's groups (see [`groups`]) at once, and answers each key from
/// its group's map: its value, or `None` where the map left it out. `keys` are the batch's
/// keys as the map holds them (the batch argument's part of each key). A call that fails fails
/// the load, with the first such error.
pub async fn batch_answers<Q, V, E, M, F>(
    keys: Vec<Q>,
    calls: Vec<(Vec<usize>, F)>,
) -> Result<Vec<Option<V>>, E>
where
    Q: std::hash::Hash + Eq,
    M: IntoIterator<Item = (Q, V)>,
    F: Future<Output = Result<M, E>>,
{
    let mut answers: Vec<Option<V>> = keys.iter().map(|_| None).collect();
    let called = futures_util::future::join_all(
        calls
            .into_iter()
            .map(|(places, call)| async move { (places, call.await) }),
    )
    .await;
    for (places, map) in called {
        let mut found: std::collections::HashMap<Q, V> = map?.into_iter().collect();
        for at in places {
            answers[at] = found.remove(&keys[at]);
        }
    }
    Ok(answers)
}

/// [`batch_answers`] of a batch function returning a plain map, which cannot fail.
pub async fn batch_values<Q, V, M, F>(keys: Vec<Q>, calls: Vec<(Vec<usize>, F)>) -> Vec<Option<V>>
where
    Q: std::hash::Hash + Eq,
    M: IntoIterator<Item = (Q, V)>,
    F: Future<Output = M>,
{
    let calls = calls
        .into_iter()
        .map(|(places, call)| (places, Infallibly(call)))
        .collect();
    match batch_answers(keys, calls).await {
        Ok(answers) => answers,
        Err(never) => match never {},
    }
}
