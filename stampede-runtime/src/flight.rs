//! Per-key singleflight: at most one load per key in flight, its result shared by every caller
//! that asked while it ran.
//!
//! A [`Leader`] owns the right to load a key; it removes its in-flight entry when it finishes or
//! is dropped (a panic past `catch_unwind`, a runtime shutting down), so no key is ever left
//! marked in flight and no [`Waiter`] waits forever: a dropped leader closes the channel and its
//! waiters get [`Error::LoadAborted`].

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::entry::Entry;
use crate::error::Error;

/// What a flight's waiters can see of it.
enum Outcome<V> {
    Running,
    /// A stale value handed out while the refresh runs: taken only while it is servable.
    Serving(Entry<V>),
    Done(Result<V, Error>),
    /// The outcome is in the flight's hand-off, for its only caller to take.
    HandedOff,
}

impl<V> Outcome<V> {
    /// Whether a waiter can take this outcome: a stale value only if it takes one, and only
    /// while it is servable.
    fn ready(&self, takes_stale: bool) -> bool {
        match self {
            Outcome::Running => false,
            Outcome::Serving(entry) => takes_stale && entry.servable(Instant::now()),
            Outcome::Done(_) | Outcome::HandedOff => true,
        }
    }
}

/// What a flight's leader and waiters share: its outcome, and the notification of its changes
/// (a `Notify` wakes its waiters in the order they came, so a simulation's run replays).
struct Shared<V> {
    outcome: Mutex<Outcome<V>>,
    changed: Notify,
    /// The leader is gone: nothing more will change.
    closed: AtomicBool,
    /// How many callers wait for it.
    callers: AtomicUsize,
    /// The failure of a load that had one caller, moved to it rather than shared: the only
    /// copy, so the caller can have the function's own error back.
    handoff: Mutex<Option<Result<V, Error>>>,
    /// Notified when a caller with no value joins: a refresh waiting for its turn starts now.
    urgent: Notify,
    /// A last good value the flight's tier found (`fail_safe`), for a waiter's soft timeout.
    last_good: Mutex<Option<Entry<V>>>,
    /// Another flight of the key (begun before this one, and detached) answered since this one
    /// read what it serves: the stale and last good values it read are older than that answer,
    /// and stand in for nothing any more.
    overtaken: AtomicBool,
}

/// The loads in flight for one cache, by key.
pub(crate) struct Flights<K, V> {
    map: Mutex<HashMap<K, Flight<V>>>,
    next_id: AtomicU64,
}

struct Flight<V> {
    id: u64,
    shared: Arc<Shared<V>>,
    /// When it began: a caller joins it only while its tier trusts it (`Flights::join`).
    began: Instant,
}

/// What a caller became when it asked for a key's load.
pub(crate) enum Joined<'a, K: Hash + Eq + Clone, V: Clone> {
    /// Nobody was loading the key: this caller must start the load, and may wait for it too.
    Led(Leader<'a, K, V>, Waiter<V>),
    /// A load was already in flight: wait for its result.
    Shared(Waiter<V>),
}

impl<K: Hash + Eq + Clone, V: Clone> Flights<K, V> {
    pub(crate) fn new() -> Self {
        Flights {
            map: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        }
    }

    /// Joins the key's load, or becomes its leader when none is in flight, or when the one in
    /// flight began `trusted_for` ago or longer (detached: its callers still get its result).
    /// `trusted_for` is how long its tier trusts a flight to hear of invalidations made
    /// elsewhere (`Tier::trusted_for`): past it, the flight may have read a value that another
    /// process invalidated since, and this caller began after that invalidation.
    pub(crate) fn join(&self, key: &K, trusted_for: Option<Duration>) -> Joined<'_, K, V> {
        let mut map = self.lock();
        let trusted =
            |flight: &&Flight<V>| trusted_for.is_none_or(|bound| flight.began.elapsed() < bound);
        if let Some(flight) = map.get(key).filter(trusted) {
            flight.shared.callers.fetch_add(1, Ordering::Relaxed);
            // `notify_one` keeps the wake-up for a refresh that has not started waiting yet.
            flight.shared.urgent.notify_one();
            return Joined::Shared(Waiter {
                shared: flight.shared.clone(),
                takes_stale: true,
            });
        }
        let leader = self.insert(&mut map, key);
        let shared = leader.shared.clone();
        shared.callers.fetch_add(1, Ordering::Relaxed);
        Joined::Led(
            leader,
            Waiter {
                shared,
                takes_stale: true,
            },
        )
    }

    /// Becomes the key's leader only if no load is in flight (a background refresh).
    pub(crate) fn lead(&self, key: &K) -> Option<Leader<'_, K, V>> {
        let mut map = self.lock();
        if map.contains_key(key) {
            return None;
        }
        Some(self.insert(&mut map, key))
    }

    /// Detaches the key's load, if one is in flight (an invalidation): its waiters still get its
    /// result, but later callers start a new load instead of joining it.
    pub(crate) fn forget(&self, key: &K) {
        self.lock().remove(key);
    }

    /// The key's flight in the map, if it serves a stale value, serves it no more: its callers
    /// from now on wait for its outcome (see [`Leader::finish`]).
    fn stop_serving(&self, key: &K) {
        let map = self.lock();
        if let Some(flight) = map.get(key) {
            flight.shared.overtaken.store(true, Ordering::Release);
            *lock(&flight.shared.last_good) = None;
            let mut outcome = lock(&flight.shared.outcome);
            if matches!(*outcome, Outcome::Serving(_)) {
                *outcome = Outcome::Running;
            }
        }
    }

    /// Whether the key has a load in flight now.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    /// The keys with a load in flight now.
    pub(crate) fn keys(&self) -> Vec<K> {
        self.lock().keys().cloned().collect()
    }

    /// How many keys have a load in flight.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn insert(&self, map: &mut HashMap<K, Flight<V>>, key: &K) -> Leader<'_, K, V> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            outcome: Mutex::new(Outcome::Running),
            changed: Notify::new(),
            closed: AtomicBool::new(false),
            callers: AtomicUsize::new(0),
            handoff: Mutex::new(None),
            urgent: Notify::new(),
            last_good: Mutex::new(None),
            overtaken: AtomicBool::new(false),
        });
        map.insert(
            key.clone(),
            Flight {
                id,
                shared: shared.clone(),
                began: Instant::now(),
            },
        );
        Leader {
            flights: self,
            key: key.clone(),
            id,
            shared,
            removed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }

    fn remove(&self, key: &K, id: u64) {
        let mut map = self.lock();
        // Only our own flight: a newer one may have taken the key after we were removed.
        if map.get(key).is_some_and(|flight| flight.id == id) {
            map.remove(key);
            if map.is_empty() && map.capacity() > 1024 {
                map.shrink_to_fit();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Flight<V>>> {
        // A panic in a user's `Hash` or `Eq` while the lock was held leaves the map consistent
        // (std's map does not expose half-done states), so poisoning is ignored.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The right and the duty to load one key. Finish it with [`Leader::finish`]; dropping it
/// unfinished releases the key and wakes the waiters with [`Error::LoadAborted`].
pub(crate) struct Leader<'a, K: Hash + Eq + Clone, V: Clone> {
    flights: &'a Flights<K, V>,
    key: K,
    id: u64,
    shared: Arc<Shared<V>>,
    removed: AtomicBool,
    /// Finished: the outcome is handed out, and nothing the leader does after changes it.
    finished: AtomicBool,
}

impl<K: Hash + Eq + Clone, V: Clone> Leader<'_, K, V> {
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    /// Whether the flight is no longer the key's (an invalidation detached it, or it ended).
    pub(crate) fn detached(&self) -> bool {
        self.flights
            .lock()
            .get(&self.key)
            .is_none_or(|flight| flight.id != self.id)
    }

    /// Notified when a caller with no value joins this flight.
    pub(crate) fn urgent(&self) -> &Notify {
        &self.shared.urgent
    }

    /// Hands a stale entry to the waiters now while the load goes on. Callers that join later
    /// get it at once too while it is servable; the key stays in flight, so no second refresh
    /// starts, until [`finish`](Self::finish) replaces it with the outcome.
    pub(crate) fn serve(&self, entry: Entry<V>) {
        if !self.finished.load(Ordering::Acquire) {
            self.publish(Outcome::Serving(entry));
        }
    }

    /// Offers the waiters a last good value, which a soft timeout may give them (`None`: none
    /// any more), unless the flight was overtaken.
    pub(crate) fn offer(&self, entry: Option<Entry<V>>) {
        let mut last_good = lock(&self.shared.last_good);
        *last_good = entry.filter(|_| !self.overtaken());
    }

    /// Whether another flight of the key answered since this one read the stale or last good
    /// value it holds (see [`Flights::stop_serving`]): those stand in for no failure now.
    pub(crate) fn overtaken(&self) -> bool {
        self.shared.overtaken.load(Ordering::Acquire)
    }

    /// Releases the key, then hands the outcome to every waiter (the first outcome only: a
    /// leader finishes once). Store the value before calling this, so that a caller arriving
    /// after the release finds it. A batch's flight finishes each of its keys' leaders as soon
    /// as that key is settled, while it still holds the others.
    ///
    /// A value this flight answers with is as new as any stale value another flight of the key
    /// (begun after this one was detached) serves meanwhile: that flight stops serving it, so
    /// that no caller joining it after this answer gets an older value (its joiners wait for
    /// its outcome instead).
    pub(crate) fn finish(&self, outcome: Result<V, Error>) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.release();
        if outcome.is_ok() {
            self.flights.stop_serving(&self.key);
        }
        // Released: nobody joins any more, so the count of callers is final.
        if let Err(Error::Upstream(_)) = &outcome
            && self.shared.callers.load(Ordering::Relaxed) == 1
        {
            *lock(&self.shared.handoff) = Some(outcome);
            self.publish(Outcome::HandedOff);
        } else {
            self.publish(Outcome::Done(outcome));
        }
    }

    /// Sets the flight's outcome and wakes its waiters.
    fn publish(&self, outcome: Outcome<V>) {
        *lock(&self.shared.outcome) = outcome;
        self.shared.changed.notify_waiters();
    }

    fn release(&self) {
        if !self.removed.swap(true, Ordering::AcqRel) {
            self.flights.remove(&self.key, self.id);
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for Leader<'_, K, V> {
    fn drop(&mut self) {
        self.release();
        // Finished or not, nothing more will change: a waiter of an unfinished flight stops.
        self.shared.closed.store(true, Ordering::Release);
        self.shared.changed.notify_waiters();
    }
}

/// A caller waiting for a key's load.
pub(crate) struct Waiter<V> {
    shared: Arc<Shared<V>>,
    /// Whether a stale value the flight serves while it loads answers this caller.
    takes_stale: bool,
}

impl<V: Clone> Waiter<V> {
    /// This waiter for a companion's `refresh`: it asked for the value the load gives, so
    /// neither the stale value the flight serves meanwhile nor a last good value answers it.
    pub(crate) fn loaded_only(self) -> Self {
        Waiter {
            takes_stale: false,
            ..self
        }
    }

    /// Whether anything but the load's outcome may answer this waiter (a stale value served,
    /// a last good value after a soft timeout).
    pub(crate) fn takes_stale(&self) -> bool {
        self.takes_stale
    }

    /// The last good value the flight's tier offered, if any.
    pub(crate) fn last_good(&self) -> Option<Entry<V>> {
        lock(&self.shared.last_good).clone()
    }

    /// The load's outcome, or [`Error::LoadAborted`] when its leader was dropped unfinished.
    pub(crate) async fn wait(&mut self, cache: &Arc<str>) -> Result<V, Error> {
        let aborted = || Error::LoadAborted {
            cache: cache.clone(),
        };
        loop {
            // Registered before the outcome is read: a change after the read wakes it.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let outcome = lock(&self.shared.outcome);
                if outcome.ready(self.takes_stale) {
                    return match &*outcome {
                        Outcome::Serving(entry) => Ok(entry.value.clone()),
                        Outcome::Done(outcome) => outcome.clone(),
                        Outcome::HandedOff => lock(&self.shared.handoff)
                            .take()
                            .unwrap_or_else(|| Err(aborted())),
                        Outcome::Running => Err(aborted()),
                    };
                }
            }
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(aborted());
            }
            changed.await;
        }
    }
}
