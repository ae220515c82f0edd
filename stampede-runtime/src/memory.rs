//! The memory tier: a bounded store of entries, and the generations that keep an invalidated
//! load from storing its value.
//!
//! A key's generation exists only while a load of it runs: [`Memory::begin`] registers the
//! load and reads the generation, an invalidation bumps it, and [`Memory::keep`] stores a
//! value only if it is unchanged. The check and the insert, like the bump and the removal,
//! happen under one lock, so an invalidation can never land between them. When a key's last
//! load ends, its generation is dropped: no per-key state outlives its use.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::cache::{Key, Value};
use crate::entry::Entry;

pub(crate) struct Memory<K, V> {
    store: moka::sync::Cache<K, Entry<V>>,
    /// The generations of the keys with a load running.
    loading: Mutex<HashMap<K, Generation>>,
}

struct Generation {
    value: u64,
    loads: usize,
}

/// A load of one key, registered with the memory tier; unregistered on drop.
pub(crate) struct Loading<'a, K: Key, V: Value> {
    memory: &'a Memory<K, V>,
    key: K,
    generation: u64,
}

impl<K: Key, V: Value> Memory<K, V> {
    /// A store of at most `capacity` entries. `reclaim_after` bounds how long moka keeps an
    /// entry: freshness is judged from each entry's own deadlines on tokio's clock (which
    /// paused-clock tests move and moka's clock does not), so moka's time to live only reclaims
    /// memory; a fixed one costs nothing per read. `by_predicate`: entries can be dropped by a
    /// predicate over their keys (invalidations announced by other processes).
    pub(crate) fn new(capacity: u64, reclaim_after: Duration, by_predicate: bool) -> Self {
        let mut store = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .time_to_live(reclaim_after.min(MOKA_MAX_TTL));
        if by_predicate {
            store = store.support_invalidation_closures();
        }
        Memory {
            store: store.build(),
            loading: Mutex::new(HashMap::new()),
        }
    }

    /// The key's entry, whatever its freshness.
    pub(crate) fn get(&self, key: &K) -> Option<Entry<V>> {
        self.store.get(key)
    }

    /// Registers a load of `key`, with the key's generation now.
    pub(crate) fn begin(&self, key: &K) -> Loading<'_, K, V> {
        let mut loading = self.loading();
        let generation = loading
            .entry(key.clone())
            .and_modify(|generation| generation.loads += 1)
            .or_insert(Generation { value: 0, loads: 1 });
        Loading {
            generation: generation.value,
            memory: self,
            key: key.clone(),
        }
    }

    /// Stores `entry` unless the key was invalidated since `load` began. Returns whether it did.
    pub(crate) fn keep(&self, load: &Loading<'_, K, V>, entry: Entry<V>) -> bool {
        let loading = self.loading();
        if !is_current(&loading, load) {
            return false;
        }
        self.store.insert(load.key.clone(), entry);
        true
    }

    /// Drops the key's value; loads of it running now will not store theirs.
    pub(crate) fn invalidate(&self, key: &K) {
        let mut loading = self.loading();
        if let Some(generation) = loading.get_mut(key) {
            generation.value += 1;
        }
        self.store.invalidate(key);
    }

    /// Drops the values of every key `matches`; loads of them running now will not store theirs.
    /// Needs a store built `by_predicate`.
    pub(crate) fn invalidate_where<F>(&self, matches: F)
    where
        F: Fn(&K) -> bool + Send + Sync + 'static,
    {
        let mut loading = self.loading();
        for (key, generation) in loading.iter_mut() {
            if matches(key) {
                generation.value += 1;
            }
        }
        // Built with invalidation closures whenever this is called, so this cannot fail.
        let _ = self.store.invalidate_entries_if(move |key, _| matches(key));
    }

    /// Drops every value; loads running now will not store theirs.
    pub(crate) fn invalidate_all(&self) {
        let mut loading = self.loading();
        for generation in loading.values_mut() {
            generation.value += 1;
        }
        self.store.invalidate_all();
    }

    /// How many entries the store holds, once its pending writes are applied.
    pub(crate) fn entry_count(&self) -> u64 {
        self.store.run_pending_tasks();
        self.store.entry_count()
    }

    /// How many keys have a load running.
    #[cfg(test)]
    pub(crate) fn loading_count(&self) -> usize {
        self.loading().len()
    }

    fn loading(&self) -> MutexGuard<'_, HashMap<K, Generation>> {
        // A panic in a user's `Hash` or `Eq` while the lock was held leaves the map consistent.
        self.loading.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn is_current<K: Key, V: Value>(
    loading: &HashMap<K, Generation>,
    load: &Loading<'_, K, V>,
) -> bool {
    loading
        .get(&load.key)
        .is_some_and(|generation| generation.value == load.generation)
}

impl<K: Key, V: Value> Drop for Loading<'_, K, V> {
    fn drop(&mut self) {
        let mut loading = self.memory.loading();
        if let Some(generation) = loading.get_mut(&self.key) {
            generation.loads -= 1;
            if generation.loads == 0 {
                loading.remove(&self.key);
                if loading.is_empty() && loading.capacity() > 1024 {
                    loading.shrink_to_fit();
                }
            }
        }
    }
}

/// moka refuses a time to live above 1000 years.
const MOKA_MAX_TTL: Duration = Duration::from_secs(1_000 * 365 * 24 * 60 * 60);

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    fn entry(value: u32) -> Entry<u32> {
        Entry::loaded(
            value,
            Instant::now(),
            Duration::from_secs(60),
            Duration::ZERO,
        )
    }

    #[tokio::test]
    async fn an_invalidation_stops_only_the_loads_of_its_own_key() {
        let memory = Memory::<u32, u32>::new(100, Duration::from_secs(60), false);
        let (one, two) = (memory.begin(&1), memory.begin(&2));
        memory.invalidate(&1);
        assert!(!memory.keep(&one, entry(10)), "key 1 was invalidated");
        assert!(memory.keep(&two, entry(20)), "key 2 was not");
        assert!(memory.get(&1).is_none());
        assert_eq!(memory.get(&2).map(|e| e.value), Some(20));
    }

    #[tokio::test]
    async fn a_load_that_began_after_the_invalidation_stores_its_value() {
        let memory = Memory::<u32, u32>::new(100, Duration::from_secs(60), false);
        let old = memory.begin(&1);
        memory.invalidate(&1);
        let new = memory.begin(&1);
        assert!(memory.keep(&new, entry(2)));
        assert!(
            !memory.keep(&old, entry(1)),
            "the old load never overwrites"
        );
        assert_eq!(memory.get(&1).map(|e| e.value), Some(2));
    }

    #[tokio::test]
    async fn no_generation_outlives_the_loads_of_its_key() {
        let memory = Memory::<u32, u32>::new(100, Duration::from_secs(60), true);
        for key in 0..1_000 {
            let load = memory.begin(&key);
            memory.invalidate_where(|k| k % 2 == 0);
            memory.keep(&load, entry(key));
        }
        assert_eq!(memory.loading_count(), 0);
    }
}
