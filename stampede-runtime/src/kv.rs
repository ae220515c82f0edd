//! What a cache's keys and values must be: the bounds every layer of the runtime shares.

use std::fmt::Debug;
use std::hash::Hash;

/// What a cache key must be: hashable, comparable, cloneable, printable (in stats and traces),
/// and shareable across tasks.
pub trait Key: Hash + Eq + Clone + Debug + Send + Sync + 'static {}
impl<K: Hash + Eq + Clone + Debug + Send + Sync + 'static> Key for K {}

/// What a cached value must be: cloneable (every caller gets its own copy) and shareable.
pub trait Value: Clone + Send + Sync + 'static {}
impl<V: Clone + Send + Sync + 'static> Value for V {}
