//! The memory tier: a bounded store of entries, and the generations that keep an invalidated
//! load from storing its value.
//!
//! A key's generation exists only while a load of it runs: [`Memory::begin`] registers the
//! load and reads the generation, an invalidation bumps it, and [`Memory::keep`] stores a
//! value only if it is unchanged. The check and the insert, like the bump and the removal,
//! happen under one lock, so an invalidation can never land between them. When a key's last
//! load ends, its generation is dropped: no per-key state outlives its use.
//!
//! The store is `quick_cache`'s sharded map (issue 14): a hit is one shard's read lock, a
//! foldhash lookup and the clone of the entry, with no read log or housekeeping to replay, and
//! eviction (CLOCK-Pro-like, with ghost entries for admission) bounds the number of entries.
//! It has no expiry of its own: freshness is judged from each entry's deadlines on tokio's
//! clock, and an entry past every use stays only until a lookup finds it so
//! ([`Memory::reclaim`]) or eviction takes it, always within the capacity bound.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::cache::{Key, Value};
use crate::entry::Entry;

pub(crate) struct Memory<K, V> {
    store: quick_cache::sync::Cache<K, Entry<V>>,
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
    /// A store of at most `capacity` entries (at least one).
    pub(crate) fn new(capacity: u64) -> Self {
        let capacity = capacity.max(1);
        // The estimate only sizes the ghost (recently evicted) list; the store allocates as
        // it fills, so a large capacity reserves nothing up front.
        let items = usize::try_from(capacity).unwrap_or(usize::MAX);
        Memory {
            store: quick_cache::sync::Cache::with(
                items,
                capacity,
                quick_cache::UnitWeighter,
                quick_cache::DefaultHashBuilder::default(),
                quick_cache::sync::DefaultLifecycle::default(),
            ),
            loading: Mutex::new(HashMap::new()),
        }
    }

    /// The key's entry, whatever its freshness.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<Entry<V>> {
        self.store.get(key)
    }

    /// Drops the key's entry if it is past every use at `now` (not even a fail-safe value), so
    /// that an expired value does not wait for eviction. A value stored meanwhile stays.
    pub(crate) fn reclaim(&self, key: &K, now: Instant) {
        self.store.remove_if(key, |entry| !entry.fail_safe(now));
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

    /// Registers a load of `key` only if none is registered: the first of concurrent callers
    /// reads on its own task, the others go through the key's flight.
    pub(crate) fn begin_alone(&self, key: &K) -> Option<Loading<'_, K, V>> {
        let mut loading = self.loading();
        if loading.contains_key(key) {
            return None;
        }
        loading.insert(key.clone(), Generation { value: 0, loads: 1 });
        Some(Loading {
            generation: 0,
            memory: self,
            key: key.clone(),
        })
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

    /// Whether the key was not invalidated since `load` began.
    pub(crate) fn is_current(&self, load: &Loading<'_, K, V>) -> bool {
        is_current(&self.loading(), load)
    }

    /// Drops the key's value; loads of it running now will not store theirs.
    pub(crate) fn invalidate(&self, key: &K) {
        let mut loading = self.loading();
        if let Some(generation) = loading.get_mut(key) {
            generation.value += 1;
        }
        self.store.remove(key);
    }

    /// Drops the values of every key `matches`; loads of them running now will not store theirs.
    /// A scan of the store, shard by shard under each shard's write lock (31ms over a million
    /// entries in `benches/memory.rs`): it runs only for invalidations announced by other
    /// processes.
    pub(crate) fn invalidate_where<F>(&self, matches: F)
    where
        F: Fn(&K) -> bool,
    {
        let mut loading = self.loading();
        for (key, generation) in loading.iter_mut() {
            if matches(key) {
                generation.value += 1;
            }
        }
        self.store.retain(|key, _| !matches(key));
    }

    /// Drops every value; loads running now will not store theirs.
    pub(crate) fn invalidate_all(&self) {
        let mut loading = self.loading();
        for generation in loading.values_mut() {
            generation.value += 1;
        }
        self.store.clear();
    }

    /// How many entries the store holds.
    pub(crate) fn entry_count(&self) -> u64 {
        self.store.len() as u64
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        let memory = Memory::<u32, u32>::new(100);
        let (one, two) = (memory.begin(&1), memory.begin(&2));
        memory.invalidate(&1);
        assert!(!memory.keep(&one, entry(10)), "key 1 was invalidated");
        assert!(memory.keep(&two, entry(20)), "key 2 was not");
        assert!(memory.get(&1).is_none());
        assert_eq!(memory.get(&2).map(|e| e.value), Some(20));
    }

    #[tokio::test]
    async fn a_load_that_began_after_the_invalidation_stores_its_value() {
        let memory = Memory::<u32, u32>::new(100);
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
        let memory = Memory::<u32, u32>::new(100);
        for key in 0..1_000 {
            let load = memory.begin(&key);
            memory.invalidate_where(|k| k % 2 == 0);
            memory.keep(&load, entry(key));
        }
        assert_eq!(memory.loading_count(), 0);
    }

    #[tokio::test]
    async fn the_store_never_holds_more_than_its_capacity() {
        let memory = Memory::<u32, u32>::new(1_000);
        for key in 0..100_000 {
            let load = memory.begin(&key);
            memory.keep(&load, entry(key));
            assert!(memory.entry_count() <= 1_000, "at key {key}");
        }
        assert!(memory.entry_count() > 0);
    }

    #[tokio::test]
    async fn a_predicate_drops_the_keys_it_matches_and_only_those() {
        let memory = Memory::<u32, u32>::new(100);
        for key in 0..10 {
            memory.keep(&memory.begin(&key), entry(key));
        }
        let running = memory.begin(&4);
        memory.invalidate_where(|key| key % 2 == 0);
        assert!(
            !memory.keep(&running, entry(4)),
            "a matched load stores nothing"
        );
        assert_eq!(memory.entry_count(), 5);
        assert!((0..10).all(|key| memory.get(&key).is_some() == (key % 2 == 1)));
    }

    #[tokio::test(start_paused = true)]
    async fn reclaim_drops_only_an_entry_past_every_use() {
        let memory = Memory::<u32, u32>::new(100);
        memory.keep(&memory.begin(&1), entry(1));
        memory.reclaim(&1, Instant::now());
        assert!(memory.get(&1).is_some(), "still fresh");
        tokio::time::advance(Duration::from_secs(61)).await;
        memory.reclaim(&1, Instant::now());
        assert!(memory.get(&1).is_none(), "expired: dropped");
    }
}
