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
//!
//! A cache without `tags`, `fail_safe` or `refresh_after` keeps its entries in the lean form
//! ([`Lean`]: no tag stamp, two deadlines fewer; with the read where the tier shares values),
//! every other cache as [`Entry`]. The form is known when the function is compiled ([`lean`],
//! `Tier::SHARES`, `Cache::with_entries`), and the store is
//! reached through [`Store`], so that only the form a cache uses is compiled for its value type
//! (issue 38: the three forms were a third of a release build's code per value type). A hit
//! alone reaches it by its type ([`Memory::store_as`]), without an indirect call.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::clock::Nanos;
use crate::entry::{Entry, Found, Lean, LeanRead, Saved};
use crate::kv::{Key, Value};
use crate::order::{self, Stays};

pub(crate) struct Memory<K, V> {
    store: Box<dyn Store<K, V>>,
    /// The store's type, kept beside it: a hit compares it with a constant rather than asking
    /// the store's vtable ([`Memory::store_as`]).
    type_id: TypeId,
    /// `source_version`: an entry is not replaced by one of an older version.
    version: Option<fn(&V) -> Option<u64>>,
    /// The generations of the keys with a load running.
    loading: Mutex<HashMap<K, Generation>>,
    /// For a cache whose tier names its keys to other processes: each stored key by its name,
    /// so that an invalidation announced by name finds its key without a scan.
    names: Option<Names<K>>,
    /// While a shared tier's invalidation feed is lost ([`Memory::suspend`]): the deadlines of
    /// the entries taken out of service, to be put back if the feed's log shows that none of
    /// their keys was invalidated meanwhile ([`Memory::resume`]). `None` otherwise.
    suspended: Mutex<Option<HashMap<K, Saved>>>,
}

/// The keys of the store by the name the tier gives them. Every stored key is in it: a key is
/// added under the same lock as its entry's insert, and only keys the store no longer holds
/// are pruned (once the index outgrows twice the capacity, so the scan is paid once per that
/// many inserts).
struct Names<K> {
    name_of: fn(&K) -> Option<String>,
    by_name: Mutex<HashMap<String, K>>,
    prune_above: usize,
}

/// Whether a cache keeps its entries in the lean form (no tag stamp, two deadlines fewer): only
/// `tags`, `refresh_after`, `xfetch` and `fail_safe` give an entry a tag stamp, a refresh point
/// before its fresh deadline or a fail-safe deadline past its stale one. A constant
/// function, so that the generated code decides it when the function is compiled, from the
/// options the attribute turns on (run time never turns one on: `tuning`).
pub const fn lean(tags: bool, refresh_after: bool, xfetch: bool, fail_safe: bool) -> bool {
    !(tags || refresh_after || xfetch || fail_safe)
}

/// What an invalidation does to a key's value, here and (with a shared tier) everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// Drops it (`invalidate`).
    Drop,
    /// Ends its fresh time (`expire`): stale for its own stale window at most, then its key's
    /// last good value for the rest of its fail-safe window.
    Expire,
}

struct Generation {
    value: u64,
    loads: usize,
    /// The latest source read of a value kept since the generation began: a value read before
    /// it is older than one kept already, though that one may be past every use by now (kept
    /// already capped, by the trust bound), or gone. Like the store's fence, but living only
    /// as long as the key's loads, whose values are the only ones it orders.
    newest_read: Option<Nanos>,
}

impl Generation {
    fn new() -> Self {
        Generation {
            value: 0,
            loads: 1,
            newest_read: None,
        }
    }

    /// An invalidation: the loads running now store nothing, and what they kept is no measure
    /// of what comes after.
    fn bump(&mut self) {
        self.value += 1;
        self.newest_read = None;
    }
}

/// What [`Memory::keep`] did with an entry.
pub(crate) enum Kept<V> {
    Stored,
    /// The key was invalidated since the load began: nothing stored.
    Invalidated,
    /// The entry stored is newer (`order::held_stays`) and servable: it stays, and is this.
    Newer(Entry<V>, Stays),
    /// A value whose source was read later was kept since the key's loads began, and memory
    /// holds no servable one: nothing stored, and nothing newer to hand out instead.
    Older,
}

impl<V> Kept<V> {
    /// Whether the key was not invalidated since the load began.
    pub(crate) fn current(&self) -> bool {
        !matches!(self, Kept::Invalidated)
    }
}

/// A load of one key, registered with the memory tier; unregistered on drop.
pub(crate) struct Loading<'a, K: Key, V: Value> {
    memory: &'a Memory<K, V>,
    key: K,
    generation: u64,
    /// Detached before it registered (see [`Loading::detach`]): never current.
    detached: bool,
}

impl<K: Key, V: Value> Loading<'_, K, V> {
    /// The key it loads.
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    /// This load stores nothing: its flight was detached (an invalidation) before it
    /// registered, which the key's generation cannot say.
    pub(crate) fn detach(&mut self) {
        self.detached = true;
    }
}

impl<K: Key, V: Value> Memory<K, V> {
    /// A store of at most `capacity` entries (at least one), of entries `E`. `name_of`: how
    /// the tier names a key to other processes, when it does ([`Memory::invalidate_named`]);
    /// `version`: the values' source version, when the cache has one.
    pub(crate) fn new<E: Shape<V>>(
        capacity: u64,
        name_of: Option<fn(&K) -> Option<String>>,
        version: Option<fn(&V) -> Option<u64>>,
    ) -> Self {
        let capacity = capacity.max(1);
        // The estimate only sizes the ghost (recently evicted) list; the store allocates as it
        // fills, so a large capacity reserves nothing up front.
        let items = usize::try_from(capacity).unwrap_or(usize::MAX);
        let store = quick_cache::sync::Cache::<K, E>::with(
            items,
            capacity,
            quick_cache::UnitWeighter,
            quick_cache::DefaultHashBuilder::default(),
            quick_cache::sync::DefaultLifecycle::default(),
        );
        Memory {
            type_id: TypeId::of::<quick_cache::sync::Cache<K, E>>(),
            store: Box::new(store),
            version,
            loading: Mutex::new(HashMap::new()),
            names: name_of.map(|name_of| Names {
                name_of,
                by_name: Mutex::new(HashMap::new()),
                prune_above: items.saturating_mul(2).saturating_add(1024),
            }),
            suspended: Mutex::new(None),
        }
    }

    /// The store, if its entries are `E`: compared with a constant, without a call of the
    /// store's vtable, so that a hit reaches the store by its type ([`Store::find`] on it).
    #[inline(always)]
    pub(crate) fn store_as<E: Shape<V>>(&self) -> Option<&quick_cache::sync::Cache<K, E>> {
        if self.type_id != TypeId::of::<quick_cache::sync::Cache<K, E>>() {
            return None;
        }
        let store: *const dyn Store<K, V> = &*self.store;
        // SAFETY: `type_id` is the id of the store's concrete type (`Memory::new`), and it is
        // this one: the cast is `<dyn Any>::downcast_ref`'s.
        Some(unsafe { &*store.cast::<quick_cache::sync::Cache<K, E>>() })
    }

    /// What a lookup of `key` finds ([`Store::find`]), through the store's vtable, whatever its
    /// entries: a hit reaches a store of the entries it was built for without it
    /// ([`Memory::store_as`]).
    pub(crate) fn find(&self, key: &K, latest: Nanos) -> Found<V> {
        self.store.find(key, latest)
    }

    /// The key's entry, whatever its freshness.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<Entry<V>> {
        self.store.get(key)
    }

    /// Drops the key's entry if it is past every use at `now` (not even a fail-safe value), so
    /// that an expired value does not wait for eviction. A value stored meanwhile stays.
    pub(crate) fn reclaim(&self, key: &K, now: Instant) {
        self.store.reclaim(key, now);
    }

    /// Registers a load of `key`, with the key's generation now.
    pub(crate) fn begin(&self, key: &K) -> Loading<'_, K, V> {
        let mut loading = self.loading();
        let generation = loading
            .entry(key.clone())
            .and_modify(|generation| generation.loads += 1)
            .or_insert_with(Generation::new);
        Loading {
            generation: generation.value,
            memory: self,
            key: key.clone(),
            detached: false,
        }
    }

    /// Registers a load of `key` only if none is registered: the first of concurrent callers
    /// reads on its own task, the others go through the key's flight.
    pub(crate) fn begin_alone(&self, key: &K) -> Option<Loading<'_, K, V>> {
        let mut loading = self.loading();
        if loading.contains_key(key) {
            return None;
        }
        loading.insert(key.clone(), Generation::new());
        Some(Loading {
            generation: 0,
            memory: self,
            key: key.clone(),
            detached: false,
        })
    }

    /// Stores `entry` unless the key was invalidated since `load` began, or memory holds a
    /// newer value ([`order::held_stays`]): of a newer source version, or whose source was read
    /// later (a flight this process began after `entry`'s ended first). The later read counts
    /// while the key's loads run even once its value is past every use or gone.
    pub(crate) fn keep(&self, load: &Loading<'_, K, V>, entry: Entry<V>) -> Kept<V> {
        let mut loading = self.loading();
        if !is_current(&loading, load) {
            return Kept::Invalidated;
        }
        let now = Instant::now();
        let version = |entry: &Entry<V>| self.version.and_then(|version| version(&entry.value));
        let held = self.get(&load.key).filter(Entry::current);
        let newest_read = loading.get(&load.key).and_then(|g| g.newest_read);
        let held_read = held.as_ref().map(Entry::read_at).max(newest_read);
        let held_version = held
            .as_ref()
            .filter(|held| held.fail_safe(now))
            .and_then(version);
        if let Some(read) = held_read
            && let Some(stays) =
                order::held_stays((held_version, read), (version(&entry), entry.read_at()))
        {
            let newest = |held: &Entry<V>| stays == Stays::Version || held.read_at() >= read;
            return match held.filter(|held| held.servable(now) && newest(held)) {
                Some(held) => Kept::Newer(held, stays),
                None => Kept::Older,
            };
        }
        if let Some(generation) = loading.get_mut(&load.key) {
            generation.newest_read = generation.newest_read.max(Some(entry.read_at()));
        }
        if let Some(names) = &self.names
            && let Some(name) = (names.name_of)(&load.key)
        {
            let mut by_name = names.by_name.lock().unwrap_or_else(PoisonError::into_inner);
            by_name.insert(name, load.key.clone());
            if by_name.len() > names.prune_above {
                by_name.retain(|_, key| self.store.contains(key) || *key == load.key);
            }
        }
        self.store.insert(&load.key, entry);
        Kept::Stored
    }

    /// Whether the key was not invalidated since `load` began.
    pub(crate) fn is_current(&self, load: &Loading<'_, K, V>) -> bool {
        is_current(&self.loading(), load)
    }

    /// Drops the key's value (whether there was one); loads of it running now will not store
    /// theirs.
    pub(crate) fn invalidate(&self, key: &K) -> bool {
        let mut loading = self.loading();
        Self::detach_in(&mut loading, key);
        self.store.remove(key)
    }

    /// The key's value is no longer fresh from `now` on ([`Entry::expire`]: stale for its stale
    /// window at most, then its last good value); loads of it running now will not store
    /// theirs (they read the source before). A suspension's saved deadlines of it are
    /// forgotten, so that a resume leaves it as capped. Whether a value was held.
    pub(crate) fn expire(&self, key: &K, now: Instant) -> bool {
        self.expire_in(&mut self.loading(), key, now)
    }

    fn expire_in(&self, loading: &mut HashMap<K, Generation>, key: &K, now: Instant) -> bool {
        Self::detach_in(loading, key);
        if let Some(saved) = self.suspended().as_mut() {
            saved.remove(key);
        }
        self.store.update(key, &mut |held| held.expire(now))
    }

    /// Drops every value (`clear`); loads running now will not store theirs.
    pub(crate) fn clear(&self) {
        let mut loading = self.loading();
        for generation in loading.values_mut() {
            generation.bump();
        }
        self.suspended().take();
        if let Some(names) = &self.names {
            names
                .by_name
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
        self.store.clear();
    }

    /// Loads of the key running now will not store their value; the value stored stays.
    pub(crate) fn detach(&self, key: &K) {
        Self::detach_in(&mut self.loading(), key);
    }

    fn detach_in(loading: &mut HashMap<K, Generation>, key: &K) {
        if let Some(generation) = loading.get_mut(key) {
            generation.bump();
        }
    }

    /// Drops the value of the key named `name` (an invalidation another process announced), or
    /// ends its fresh time ([`Memory::expire`]); a load of it running now will not store its
    /// value. A lookup in the index of names, not a scan of the store; nothing for a store
    /// built without names.
    pub(crate) fn invalidate_named(&self, name: &str, how: Invalidation) {
        let Some(names) = &self.names else {
            return;
        };
        let mut loading = self.loading();
        for (key, generation) in loading.iter_mut() {
            if (names.name_of)(key).is_some_and(|own| own == name) {
                generation.bump();
            }
        }
        let mut by_name = names.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        let key = match how {
            Invalidation::Expire => by_name.get(name).cloned(),
            Invalidation::Drop => by_name.remove(name),
        };
        drop(by_name);
        let Some(key) = key else {
            return;
        };
        match how {
            Invalidation::Expire => {
                self.expire_in(&mut loading, &key, Instant::now());
            }
            Invalidation::Drop => {
                self.store.remove(&key);
            }
        }
    }

    /// A shared tier's feed is back, and its log cannot tell what was missed while it was lost
    /// (or memory is not known to have heard every invalidation): every value is dropped but
    /// those the suspension remembers and that are still servable within the cap they were
    /// kept or suspended with (the trust bound from their read, [`Memory::lift_later`], or the
    /// feed's deadline, [`Memory::suspend`]: an invalidation missed is outlived by no more than
    /// that); with `last_good` (`fail_safe`), a value dropped stays its key's last good value for
    /// the rest of its fail-safe window. Loads running now will not store theirs.
    pub(crate) fn abandon(&self, now: Instant, last_good: bool) {
        for generation in self.loading().values_mut() {
            generation.bump();
        }
        let saved = self.suspended().take().unwrap_or_default();
        for key in self.store.keys() {
            self.store.update(&key, &mut |held| {
                let kept_while_deaf = saved.get(&key).is_some_and(|saved| held.holds(saved));
                (kept_while_deaf && held.servable(now))
                    || (last_good && held.suspend(now, now).is_some())
            });
        }
    }

    /// Takes every value out of service from `until` on because a shared tier's invalidation
    /// feed was lost (an invalidation may have been missed, none is known), keeping what
    /// [`Memory::resume`] needs to put each back if the feed's log shows that its key was not
    /// invalidated meanwhile; a value past every use at `now` is dropped. A value stays its
    /// key's last good value for the rest of its fail-safe window, as [`Memory::abandon`]
    /// leaves it; loads running now will not store theirs. Each entry is capped in place under
    /// its shard's lock, so a value a load stores meanwhile is at worst taken out of service
    /// too, never replaced by an older one.
    pub(crate) fn suspend(&self, now: Instant, until: Instant) {
        for generation in self.loading().values_mut() {
            generation.bump();
        }
        let mut suspended = self.suspended();
        let saved = suspended.get_or_insert_with(HashMap::new);
        for key in self.store.keys() {
            self.store
                .update(&key, &mut |held| match held.suspend(now, until) {
                    Some(deadlines) => {
                        // Suspended twice before a resume: the first deadlines are the value's.
                        saved.entry(key.clone()).or_insert(deadlines);
                        true
                    }
                    None => false,
                });
        }
    }

    /// While a [`Memory::suspend`] waits for its resume: the deadlines `saved` of a value of
    /// `key` kept capped by the trust bound (read while the feed is lost), to be put back by
    /// the resume if memory then still holds that value. At most as many keys as the store
    /// holds entries are remembered.
    pub(crate) fn lift_later(&self, key: &K, saved: Saved) {
        let mut suspended = self.suspended();
        let Some(remembered) = suspended.as_mut() else {
            return;
        };
        let room = self.store.capacity();
        if remembered.contains_key(key) || (remembered.len() as u64) < room {
            remembered.insert(key.clone(), saved);
        }
    }

    /// The feed's log showed which keys were invalidated while it was lost, and they are
    /// dropped: every value [`Memory::suspend`] took out of service and memory still holds (the
    /// same value: not replaced, dropped or reloaded since) is served again as before, and
    /// every value kept capped meanwhile ([`Memory::lift_later`]) for as long as it would have
    /// been kept with the feed live.
    pub(crate) fn resume(&self) {
        let Some(saved) = self.suspended().take() else {
            return;
        };
        for (key, deadlines) in saved {
            self.store.update(&key, &mut |held| {
                held.resume(&deadlines);
                true
            });
        }
    }

    /// The keys the store holds and those loading now: what a tag's expiry visits (an expiry
    /// keeps each value, so it is capped where it is, not checked against a mark on read).
    pub(crate) fn keys(&self) -> Vec<K> {
        let mut keys: Vec<K> = self.loading().keys().cloned().collect();
        keys.extend(self.store.keys());
        keys
    }

    /// How many entries the store holds.
    pub(crate) fn entry_count(&self) -> u64 {
        self.store.len() as u64
    }

    /// How many keys have a load running.
    #[cfg(any(test, feature = "simulation"))]
    pub(crate) fn loading_count(&self) -> usize {
        self.loading().len()
    }

    fn suspended(&self) -> MutexGuard<'_, Option<HashMap<K, Saved>>> {
        self.suspended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn loading(&self) -> MutexGuard<'_, HashMap<K, Generation>> {
        // A panic in a user's `Hash` or `Eq` while the lock was held leaves the map consistent.
        self.loading.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An entry as a store holds it, in any form: what a suspension, a resume or an expiry does to
/// it.
pub(crate) trait Held {
    /// Takes it out of service from `until` on, past which it is only its key's last good value
    /// for the rest of its fail-safe window; its deadlines before, or `None` when it is past
    /// every use at `now` (to be dropped).
    fn suspend(&mut self, now: Instant, until: Instant) -> Option<Saved>;
    /// Puts back `saved`, if they are this value's deadlines.
    fn resume(&mut self, saved: &Saved);
    /// Whether `saved` are this value's deadlines.
    fn holds(&self, saved: &Saved) -> bool;
    /// Whether it may be served at `now`, fresh or stale.
    fn servable(&self, now: Instant) -> bool;
    /// [`Entry::expire`]; whether it can still be held in this form (else it is dropped).
    fn expire(&mut self, now: Instant) -> bool;
}

impl<V: Value> Held for Entry<V> {
    fn holds(&self, saved: &Saved) -> bool {
        Entry::holds(self, saved)
    }

    fn servable(&self, now: Instant) -> bool {
        Entry::servable(self, now)
    }

    fn suspend(&mut self, now: Instant, until: Instant) -> Option<Saved> {
        let saved = self.saved();
        let useful = self.fail_safe(now);
        self.cap(until);
        useful.then_some(saved)
    }

    fn resume(&mut self, saved: &Saved) {
        self.restore(saved);
    }

    fn expire(&mut self, now: Instant) -> bool {
        Entry::expire(self, now);
        true
    }
}

impl<V: Value, R: LeanRead> Held for Lean<V, R> {
    fn holds(&self, saved: &Saved) -> bool {
        self.clone().entry().holds(saved)
    }

    fn servable(&self, now: Instant) -> bool {
        self.clone().entry().servable(now)
    }

    fn suspend(&mut self, now: Instant, until: Instant) -> Option<Saved> {
        let mut entry = self.clone().entry();
        let saved = entry.suspend(now, until);
        // A lean entry stays lean when capped: its refresh point stays its fresh deadline, and
        // with no fail-safe window of its own it gets none.
        if let Some(lean) = Lean::of(entry) {
            *self = lean;
        }
        saved
    }

    fn resume(&mut self, saved: &Saved) {
        let mut entry = self.clone().entry();
        if entry.restore(saved)
            && let Some(lean) = Lean::of(entry)
        {
            *self = lean;
        }
    }

    fn expire(&mut self, now: Instant) -> bool {
        let mut entry = self.clone().entry();
        entry.expire(now);
        match Lean::of(entry) {
            Some(lean) => {
                *self = lean;
                true
            }
            None => false,
        }
    }
}

/// A store of entries of one form, seen through the operations memory makes of it: one
/// `quick_cache` store, whose form only its own code knows.
pub(crate) trait Store<K, V>: Send + Sync {
    /// What a lookup of `key` finds: its value when surely fresh, its refresh point after
    /// `latest` ([`clock::latest`](crate::clock::latest), the coarse clock: a hit's one check,
    /// without building an [`Entry`]: issue 38), else the entry to judge, unless one of its
    /// tags was invalidated since its load began.
    fn find(&self, key: &K, latest: Nanos) -> Found<V>;
    /// The key's entry, whatever its freshness.
    fn get(&self, key: &K) -> Option<Entry<V>>;
    /// Stores `entry` as the key's.
    fn insert(&self, key: &K, entry: Entry<V>);
    /// Drops the key's entry if it is past every use at `now` ([`Memory::reclaim`]).
    fn reclaim(&self, key: &K, now: Instant);
    /// Drops the key's entry; whether there was one.
    fn remove(&self, key: &K) -> bool;
    /// Whether the store holds an entry of the key.
    fn contains(&self, key: &K) -> bool;
    /// Changes the key's entry in place under its shard's lock with `change`, which tells
    /// whether the entry stays (else it is dropped); whether there was one.
    fn update(&self, key: &K, change: &mut dyn FnMut(&mut dyn Held) -> bool) -> bool;
    /// Drops every entry.
    fn clear(&self);
    /// The keys held now (each to be visited under its shard's lock after).
    fn keys(&self) -> Vec<K>;
    /// How many entries it holds.
    fn len(&self) -> usize;
    /// How many entries it may hold.
    fn capacity(&self) -> u64;
}

/// An entry in one form, as a store of that form holds it.
pub(crate) trait Shape<V>: Held + Clone + Send + Sync + 'static {
    /// Whether it is a lean form ([`lean`]).
    const LEAN: bool;
    /// `entry` in this form; `None` for one this form cannot hold (see [`Lean::of`]).
    fn of(entry: Entry<V>) -> Option<Self>;
    /// What a lookup finds in it.
    fn found(self, latest: Nanos) -> Found<V>;
    /// The entry, as every path but the store handles it.
    fn entry(self) -> Entry<V>;
    /// Whether the value may stand in for a failed load at `now` ([`Entry::fail_safe`]).
    fn fail_safe(&self, now: Instant) -> bool;
}

impl<V: Value> Shape<V> for Entry<V> {
    const LEAN: bool = false;

    fn of(entry: Entry<V>) -> Option<Self> {
        Some(entry)
    }

    #[inline(always)]
    fn found(self, latest: Nanos) -> Found<V> {
        match self.current() {
            true => Entry::found(self, latest),
            false => Found::Nothing,
        }
    }

    fn entry(self) -> Entry<V> {
        self
    }

    fn fail_safe(&self, now: Instant) -> bool {
        Entry::fail_safe(self, now)
    }
}

impl<V: Value, R: LeanRead + Send + Sync + 'static> Shape<V> for Lean<V, R> {
    const LEAN: bool = true;

    fn of(entry: Entry<V>) -> Option<Self> {
        Lean::of(entry)
    }

    #[inline(always)]
    fn found(self, latest: Nanos) -> Found<V> {
        Lean::found(self, latest)
    }

    fn entry(self) -> Entry<V> {
        Lean::entry(self)
    }

    fn fail_safe(&self, now: Instant) -> bool {
        Lean::fail_safe(self, now)
    }
}

impl<K: Key, V: Value, E: Shape<V>> Store<K, V> for quick_cache::sync::Cache<K, E> {
    #[inline(always)]
    fn find(&self, key: &K, latest: Nanos) -> Found<V> {
        match self.get(key) {
            Some(held) => held.found(latest),
            None => Found::Nothing,
        }
    }

    fn get(&self, key: &K) -> Option<Entry<V>> {
        quick_cache::sync::Cache::get(self, key).map(E::entry)
    }

    fn insert(&self, key: &K, entry: Entry<V>) {
        match E::of(entry) {
            Some(held) => quick_cache::sync::Cache::insert(self, key.clone(), held),
            None => {
                // A tag stamp a lean form cannot check: never the case, since only a cache with
                // tags stamps its entries; the value is not kept (the one stored before it is
                // older).
                debug_assert!(false, "a tagged entry in a cache without tags");
                quick_cache::sync::Cache::remove(self, key);
            }
        }
    }

    fn reclaim(&self, key: &K, now: Instant) {
        self.remove_if(key, |held| !held.fail_safe(now));
    }

    fn remove(&self, key: &K) -> bool {
        quick_cache::sync::Cache::remove(self, key).is_some()
    }

    fn contains(&self, key: &K) -> bool {
        self.contains_key(key)
    }

    fn update(&self, key: &K, change: &mut dyn FnMut(&mut dyn Held) -> bool) -> bool {
        use quick_cache::sync::{EntryAction, EntryResult};
        let held = self.entry(key, None, |_, held| match change(held) {
            true => EntryAction::Retain(()),
            false => EntryAction::Remove,
        });
        !matches!(held, EntryResult::Vacant(_))
    }

    fn clear(&self) {
        quick_cache::sync::Cache::clear(self);
    }

    fn keys(&self) -> Vec<K> {
        // `retain` takes a `Fn`: the keys are gathered through a `RefCell`.
        let keys = std::cell::RefCell::new(Vec::with_capacity(self.len()));
        self.retain(|key, _| {
            keys.borrow_mut().push(key.clone());
            true
        });
        keys.into_inner()
    }

    fn len(&self) -> usize {
        quick_cache::sync::Cache::len(self)
    }

    fn capacity(&self) -> u64 {
        quick_cache::sync::Cache::capacity(self)
    }
}

fn is_current<K: Key, V: Value>(
    loading: &HashMap<K, Generation>,
    load: &Loading<'_, K, V>,
) -> bool {
    !load.detached
        && loading
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
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, None, None);
        let (one, two) = (memory.begin(&1), memory.begin(&2));
        memory.invalidate(&1);
        assert!(
            !memory.keep(&one, entry(10)).current(),
            "key 1 was invalidated"
        );
        assert!(memory.keep(&two, entry(20)).current(), "key 2 was not");
        assert!(memory.get(&1).is_none());
        assert_eq!(memory.get(&2).map(|e| e.value), Some(20));
    }

    #[tokio::test]
    async fn a_load_that_began_after_the_invalidation_stores_its_value() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, None, None);
        let old = memory.begin(&1);
        memory.invalidate(&1);
        let new = memory.begin(&1);
        assert!(memory.keep(&new, entry(2)).current());
        assert!(
            !memory.keep(&old, entry(1)).current(),
            "the old load never overwrites"
        );
        assert_eq!(memory.get(&1).map(|e| e.value), Some(2));
    }

    fn named(key: &u32) -> Option<String> {
        Some(format!("k{key}"))
    }

    #[tokio::test]
    async fn no_generation_outlives_the_loads_of_its_key() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, Some(named), None);
        for key in 0..1_000 {
            let load = memory.begin(&key);
            memory.invalidate_named(&format!("k{}", key / 2 * 2), Invalidation::Drop);
            memory.keep(&load, entry(key));
        }
        assert_eq!(memory.loading_count(), 0);
    }

    #[tokio::test]
    async fn the_store_never_holds_more_than_its_capacity() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(1_000, None, None);
        for key in 0..100_000 {
            let load = memory.begin(&key);
            memory.keep(&load, entry(key));
            assert!(memory.entry_count() <= 1_000, "at key {key}");
        }
        assert!(memory.entry_count() > 0);
    }

    #[tokio::test]
    async fn a_name_drops_its_key_and_only_it() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, Some(named), None);
        for key in 0..10 {
            memory.keep(&memory.begin(&key), entry(key));
        }
        let running = memory.begin(&4);
        memory.invalidate_named("k4", Invalidation::Drop);
        assert!(
            !memory.keep(&running, entry(4)).current(),
            "its load stores nothing"
        );
        memory.invalidate_named("k7", Invalidation::Drop);
        assert_eq!(memory.entry_count(), 8);
        assert!((0..10).all(|key| memory.get(&key).is_some() == (key != 4 && key != 7)));
    }

    #[tokio::test]
    async fn the_index_of_names_stays_bounded_and_finds_every_stored_key() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, Some(named), None);
        for key in 0..100_000 {
            memory.keep(&memory.begin(&key), entry(key));
        }
        let indexed = memory.names.as_ref().unwrap().by_name.lock().unwrap().len();
        assert!(
            indexed <= 2 * 100 + 1024 + 1,
            "{indexed} names for 100 entries"
        );
        let stored: Vec<u32> = (0..100_000)
            .filter(|key| memory.get(key).is_some())
            .collect();
        assert!(!stored.is_empty());
        for key in stored {
            memory.invalidate_named(&format!("k{key}"), Invalidation::Drop);
            assert!(
                memory.get(&key).is_none(),
                "key {key} was stored but not indexed"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_form_gives_back_the_entry_it_kept() {
        let now = Instant::now();
        let (fresh, stale) = (Duration::from_secs(60), Duration::from_secs(30));
        let lean = Memory::<u32, u32>::new::<Lean<u32>>(100, None, None);
        lean.keep(&lean.begin(&1), Entry::loaded(1, now, fresh, stale));
        let back = lean.get(&1).expect("kept");
        assert_eq!(back.filled_at(), now);
        assert_eq!(back.fresh_until(), now + fresh);
        assert_eq!(back.stale_until(), now + fresh + stale);
        assert!(back.fail_safe(now + fresh + stale - Duration::from_millis(1)));
        assert!(!back.fail_safe(now + fresh + stale));
        assert_eq!(back.read_at(), Nanos::EARLIEST, "no read kept");

        // The lean form with reads keeps when the value's source was read.
        let read = now - Duration::from_millis(250);
        let lean = Memory::<u32, u32>::new::<Lean<u32, Nanos>>(100, None, None);
        let entry = Entry::loaded(1, now, fresh, stale).read_from(read);
        lean.keep(&lean.begin(&1), entry);
        let back = lean.get(&1).expect("kept");
        assert_eq!((back.filled_at(), back.read_at()), (now, Nanos::of(read)));
        assert_eq!(back.stale_until(), now + fresh + stale);

        // The full form keeps a tag stamp, and deadlines of their own.
        let full = Memory::<u32, u32>::new::<Entry<u32>>(100, None, None);
        let stamp = crate::tags::Stamp::new(vec!["memory-test:forms".into()]);
        let entry = Entry::loaded(2, now, fresh, stale)
            .refreshing_from(now + Duration::from_secs(10))
            .failing_safe_for(Duration::from_secs(600))
            .stamped(Some(&stamp));
        full.keep(&full.begin(&2), entry);
        let back = full.get(&2).expect("kept");
        assert_eq!(
            back.freshness(now + Duration::from_secs(10)),
            crate::entry::Freshness::Early
        );
        assert!(back.fail_safe(now + fresh + stale + Duration::from_secs(599)));
        assert!(back.current());
        crate::tags::mark("memory-test:forms");
        assert!(
            full.get(&2).is_some_and(|entry| !entry.current()),
            "its tag was invalidated"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reclaim_drops_only_an_entry_past_every_use() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, None, None);
        memory.keep(&memory.begin(&1), entry(1));
        memory.reclaim(&1, Instant::now());
        assert!(memory.get(&1).is_some(), "still fresh");
        tokio::time::advance(Duration::from_secs(61)).await;
        memory.reclaim(&1, Instant::now());
        assert!(memory.get(&1).is_none(), "expired: dropped");
    }

    #[tokio::test]
    async fn with_a_source_version_an_older_value_does_not_replace_a_newer_one() {
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(
            100,
            None,
            Some(|value: &u32| Some(u64::from(*value))),
        );
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(5)),
            Kept::Stored
        ));
        match memory.keep(&memory.begin(&1), entry(4)) {
            Kept::Newer(newer, Stays::Version) => assert_eq!(newer.value, 5),
            _ => panic!("version 4 replaced version 5"),
        }
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(5)),
            Kept::Stored
        ));
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(6)),
            Kept::Stored
        ));
        memory.invalidate(&1);
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(2)),
            Kept::Stored
        ));
        assert_eq!(memory.get(&1).map(|e| e.value), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_whose_source_was_read_earlier_does_not_replace_one_read_later() {
        let memory = Memory::<u32, u32>::new::<Lean<u32, Nanos>>(100, None, None);
        let read = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let later = entry(2).read_from(read + Duration::from_millis(2));
        assert!(matches!(
            memory.keep(&memory.begin(&1), later),
            Kept::Stored
        ));
        match memory.keep(&memory.begin(&1), entry(1).read_from(read)) {
            Kept::Newer(held, Stays::Read) => assert_eq!(held.value, 2),
            _ => panic!("a value read earlier replaced one read later"),
        }
        let again = memory.get(&1).unwrap();
        assert!(
            matches!(memory.keep(&memory.begin(&1), again), Kept::Stored),
            "the same value kept again (a tie) lands"
        );
        tokio::time::advance(Duration::from_secs(120)).await; // past every use
        assert!(
            matches!(
                memory.keep(&memory.begin(&1), entry(3).read_from(read)),
                Kept::Older
            ),
            "a value past every use still orders: nothing newer to hand out, nothing stored"
        );
        memory.reclaim(&1, Instant::now());
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(3).read_from(read)),
            Kept::Stored
        ));
        assert_eq!(memory.get(&1).map(|e| e.value), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_keys_loads_run_a_later_read_orders_them_though_its_value_is_gone() {
        // In every form: a lean store without reads orders a key's running loads too.
        let memory = Memory::<u32, u32>::new::<Lean<u32>>(100, None, None);
        let read = Instant::now();
        let (first, second) = (memory.begin(&1), memory.begin(&1));
        tokio::time::advance(Duration::from_millis(5)).await;
        let later = entry(2).read_from(read + Duration::from_millis(2));
        assert!(matches!(memory.keep(&second, later), Kept::Stored));
        memory.reclaim(&1, Instant::now() + Duration::from_secs(120)); // gone: past every use
        assert!(
            matches!(memory.keep(&first, entry(1).read_from(read)), Kept::Older),
            "the load that read first, ending last, stores nothing"
        );
        assert!(memory.get(&1).is_none());
        drop((first, second));
        assert!(matches!(
            memory.keep(&memory.begin(&1), entry(1).read_from(read)),
            Kept::Stored
        ));
    }
}
