//! The previous value to the load: while a load of a key runs, [`previous`] gives its body the
//! value the cache held for that key, so that it can ask its source whether that changed (an
//! ETag, an `If-Modified-Since`, a row version) and answer "unchanged" by returning it.
//!
//! The value is lent through a tokio task-local around each attempt, so the generated code and
//! the function's signature are untouched, and a load that never asks pays one clone of the
//! value it replaces (a load's cost is its source's).

use std::any::Any;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// What one load is lent: its key's value (a single-key load), or each key's (a batch load).
pub(crate) type Lent = Option<Arc<dyn Any + Send + Sync>>;

tokio::task_local! {
    static PREVIOUS: Lent;
}

/// In the body of a cached function while it loads: the value the cache holds for the key
/// being loaded, if any, as the type the cache stores: `T` for a function returning `T` or
/// `Result<T, E>`, `Option<T>` for one returning `Option<T>` (whose `None` is cached too).
/// `None` on a first load, after an invalidation, outside a load, or when `V` is not the
/// cache's value type.
///
/// Which value: the one the load replaces. A refresh of a stale value (in the background),
/// an early refresh (`refresh_after`, `xfetch`) and the companion's `refresh` are given the
/// value they replace; a load after the stale window is given the last good value where one is
/// kept (`fail_safe`); with `backend = "redis"`, the value this load read from Redis (stale, or
/// the last good one). A value invalidated (by key, by tag) before the load starts is never
/// given (another process's invalidation: once this process has heard it).
///
/// To answer "unchanged", return it: it is stored as if loaded now (fresh again for `ttl`,
/// jittered, then `stale`), and written to Redis again with a tier.
///
/// ```
/// # #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// # struct Page { etag: u32, body: String }
/// # async fn etag_of(_url: &str) -> u32 { 1 }
/// # async fn fetch(_url: &str) -> Page { Page { etag: 1, body: String::new() } }
/// #[stampede::cached(ttl = "60s", stale = "5m")]
/// async fn page(url: String) -> Page {
///     let etag = etag_of(&url).await; // a HEAD request
///     match stampede::previous::<Page>() {
///         Some(previous) if previous.etag == etag => previous, // not modified
///         _ => fetch(&url).await,
///     }
/// }
/// ```
///
/// For a batch function, see [`previous_of`].
pub fn previous<V: Clone + 'static>() -> Option<V> {
    lent(|lent| lent.downcast_ref::<V>().cloned())
}

/// In the body of a batch function (`#[cached(batch = ..)]`) while it loads: the value the
/// cache holds for `key`, one of the keys being loaded, as [`previous`] gives a single-key
/// load its key's. A key is the cache's: the tuple of the key arguments, each owned, in the
/// order of the `key` template or of the signature (`(id,)` for `batch = ids` alone); its
/// value is an `Option` (an absent key is cached as `None`).
///
/// ```
/// # use std::collections::HashMap;
/// # #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// # struct Product { id: u64, version: u64 }
/// #[stampede::cached(ttl = "60s", batch = ids)]
/// async fn products(ids: Vec<u64>) -> HashMap<u64, Product> {
///     let held: Vec<Option<Product>> = ids
///         .iter()
///         .map(|&id| stampede::previous_of::<(u64,), Option<Product>>(&(id,)).flatten())
///         .collect();
///     // ... ask the source only for the rows whose version moved past `held`'s
/// #   let _ = held;
/// #   ids.into_iter().map(|id| (id, Product { id, version: 1 })).collect()
/// }
/// ```
pub fn previous_of<K, V>(key: &K) -> Option<V>
where
    K: Hash + Eq + 'static,
    V: Clone + 'static,
{
    lent(|lent| lent.downcast_ref::<HashMap<K, V>>()?.get(key).cloned())
}

/// What `read` finds in the value lent to the load running on this task, if any.
fn lent<T>(read: impl FnOnce(&(dyn Any + Send + Sync)) -> Option<T>) -> Option<T> {
    PREVIOUS
        .try_with(|lent| lent.as_deref().and_then(read))
        .ok()
        .flatten()
}

/// Lends `previous` to the attempt `start` makes, while it is made and while it runs.
pub(crate) fn lend<F: Future>(
    previous: &Lent,
    start: impl FnOnce() -> F,
) -> impl Future<Output = F::Output> {
    let attempt = PREVIOUS.sync_scope(previous.clone(), start);
    PREVIOUS.scope(previous.clone(), attempt)
}

/// The value a single-key load is lent.
pub(crate) fn one<V: Send + Sync + 'static>(value: Option<V>) -> Lent {
    value.map(|value| Arc::new(value) as Arc<dyn Any + Send + Sync>)
}

/// The values a batch load is lent, by key (none when no key has one).
pub(crate) fn many<K, V>(values: HashMap<K, V>) -> Lent
where
    K: Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    (!values.is_empty()).then(|| Arc::new(values) as Arc<dyn Any + Send + Sync>)
}
