//! A fake shared tier for the core's unit tests: an in-memory "shared store" that several
//! caches (standing for processes) use, with a lock per key, wake-ups, and invalidations
//! announced through the registry like Redis's. It can be told to fail (the store is down),
//! stall (every operation waits) or lose messages (no wake-up, no announced invalidation), so
//! singleflight, stale serving, invalidation and degradation are tested without a Redis.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::Config;
use crate::entry::{Entry, Freshness, jittered_ttl};
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::Load;
use crate::registry;
use crate::tier::{Fetched, Handle, Shared, Tier};

/// The store several fake tiers share.
pub(crate) struct Store<K, V> {
    state: Mutex<State<K, V>>,
    filled: Notify,
    pub(crate) fail: AtomicBool,
    pub(crate) lose_messages: AtomicBool,
    pub(crate) stall: Mutex<Duration>,
}

struct State<K, V> {
    values: HashMap<K, Entry<V>>,
    locks: HashSet<K>,
    /// Bumped by invalidations: a fill whose load began before one is refused (as `FILL` does).
    generations: HashMap<K, u64>,
}

impl<K: Key, V: Value> Store<K, V> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Store {
            state: Mutex::new(State {
                values: HashMap::new(),
                locks: HashSet::new(),
                generations: HashMap::new(),
            }),
            filled: Notify::new(),
            fail: AtomicBool::new(false),
            lose_messages: AtomicBool::new(false),
            stall: Mutex::new(Duration::ZERO),
        })
    }

    /// Puts an entry in the store, as another process's fill would.
    pub(crate) fn put(&self, key: K, entry: Entry<V>) {
        self.state().values.insert(key, entry);
    }

    /// Takes the key's lock, as another process's flight would.
    pub(crate) fn lock(&self, key: K) {
        self.state().locks.insert(key);
    }

    /// Removes the key's value without an announcement: an invalidation this process missed.
    pub(crate) fn drop_silently(&self, key: &K) {
        let mut state = self.state();
        state.values.remove(key);
        *state.generations.entry(key.clone()).or_default() += 1;
    }

    /// The value the store holds for `key`, if any.
    pub(crate) fn value(&self, key: &K) -> Option<V> {
        self.state()
            .values
            .get(key)
            .map(|entry| entry.value.clone())
    }

    fn state(&self) -> MutexGuard<'_, State<K, V>> {
        self.state.lock().unwrap()
    }

    async fn stall(&self) {
        let stall = *self.stall.lock().unwrap();
        if !stall.is_zero() {
            tokio::time::sleep(stall).await;
        }
    }

    fn wake(&self) {
        if !self.lose_messages.load(Ordering::SeqCst) {
            self.filled.notify_waiters();
        }
    }
}

/// One "process"'s tier over a shared [`Store`].
pub(crate) struct Fake<K, V> {
    pub(crate) store: Arc<Store<K, V>>,
    /// How long a flight waits for another's fill before loading itself.
    pub(crate) lock_wait: Duration,
    /// While another process holds the lock, report it busy instead of waiting (as
    /// `busy = "error"` does), unless a stale value was served.
    pub(crate) busy_error: bool,
    /// How long this process may trust what it keeps (as a Redis tier whose invalidation feed
    /// is down reports it); `None`: as long as the entries' deadlines say.
    pub(crate) trusted_for: Option<Duration>,
}

pub(crate) fn tier<K: Key, V: Value>(store: &Arc<Store<K, V>>) -> Fake<K, V> {
    Fake {
        store: store.clone(),
        lock_wait: Duration::from_secs(5),
        busy_error: false,
        trusted_for: None,
    }
}

impl<K: Key, V: Value> Tier<K, V> for Fake<K, V> {
    async fn fetch<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        let store = &self.store;
        let give_up_at = Instant::now() + self.lock_wait;
        let mut served = false;
        loop {
            store.stall().await;
            if store.fail.load(Ordering::SeqCst) {
                return handle.load_here(self.trusted_for).await;
            }
            let notified = store.filled.notified();
            tokio::pin!(notified);
            let generation = {
                let mut state = store.state();
                let now = Instant::now();
                if let Some(entry) = state.values.get(handle.key()) {
                    let shared = Shared::new(entry.clone(), self.trusted_for);
                    if entry.freshness(now) == Freshness::Fresh {
                        return Fetched::Read(handle.keep(shared));
                    }
                    if entry.servable(now) && !served {
                        handle.serve(shared);
                        served = true;
                    }
                }
                if state.locks.insert(handle.key().clone()) {
                    Some(state.generations.get(handle.key()).copied())
                } else if self.busy_error && !served {
                    return Fetched::Busy;
                } else {
                    // Registered before the lock is let go: a fill after this wakes it.
                    notified.as_mut().enable();
                    None
                }
            };
            if let Some(generation) = generation {
                return self.hold(handle, generation).await;
            }
            if Instant::now() >= give_up_at {
                return handle.load_here(self.trusted_for).await;
            }
            let _ = tokio::time::timeout_at(give_up_at, notified).await;
        }
    }

    async fn invalidate(&self, config: &Config, key: &K) -> Result<(), Error> {
        self.store.stall().await;
        if self.store.fail.load(Ordering::SeqCst) {
            return Err(Error::invalid_config("the fake store is down"));
        }
        let mut state = self.store.state();
        state.values.remove(key);
        *state.generations.entry(key.clone()).or_default() += 1;
        drop(state);
        if !self.store.lose_messages.load(Ordering::SeqCst) {
            for cache in registry::named(&config.name) {
                cache.forget_named(&format!("{key:?}"));
            }
        }
        Ok(())
    }

    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        Some(|key| Some(format!("{key:?}")))
    }
}

impl<K: Key, V: Value> Fake<K, V> {
    /// Loads as the lock's holder, fills the store, releases the lock and wakes the waiters.
    async fn hold<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        generation: Option<u64>,
    ) -> Fetched<V> {
        let loaded = handle.load().await;
        let store = &self.store;
        let mut state = store.state();
        state.locks.remove(handle.key());
        let outcome = match loaded {
            Ok(value) => {
                let config = handle.config();
                let entry = Entry::loaded(
                    value,
                    Instant::now(),
                    jittered_ttl(config.ttl, config.jitter),
                    config.stale,
                );
                if state.generations.get(handle.key()).copied() == generation {
                    state.values.insert(handle.key().clone(), entry.clone());
                    Fetched::Loaded(handle.keep(Shared::new(entry, self.trusted_for)))
                } else {
                    // Invalidated while it loaded: its callers get it, nobody keeps it.
                    Fetched::Loaded(entry.value)
                }
            }
            Err(error) => Fetched::Failed(error),
        };
        drop(state);
        store.wake();
        outcome
    }
}
