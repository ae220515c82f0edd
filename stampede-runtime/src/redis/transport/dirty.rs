//! The keys this process changed while Redis could not be used, which Redis must drop once it
//! answers again.
//!
//! While Redis is down, a process loads keys locally and serves those values, and its
//! invalidations cannot reach Redis. Redis then still holds what was written before the outage:
//! read after it, a value older than the one this process served meanwhile, or one an
//! invalidation meant to drop. So the keys loaded locally, invalidated or primed while Redis
//! failed are remembered here, and each is dropped from Redis (value deleted, fence moved on,
//! the invalidation announced: for a key loaded or primed, only if Redis held a value, see
//! [`Change::Stored`]) before this process reads it from Redis again; the rest are
//! dropped by a task that tries every operation timeout until Redis answers, whatever else the
//! process does (a writer that only invalidates delivers its failed invalidations too).
//!
//! The set is bounded ([`MOST`] keys per connection): past it, keys are no longer remembered,
//! and a warning says that they may serve their pre-outage values until those expire. The task
//! that drops them is `cleaning`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::redis::codec::keys::RedisKeys;

/// The most keys one connection remembers.
pub(crate) const MOST: usize = 100_000;

/// Keys to drop from Redis, by their base, with the invalidation message to announce and why.
#[derive(Default)]
pub(crate) struct Dirty {
    keys: Mutex<HashMap<String, (Vec<u8>, Change)>>,
    /// Whether any key is remembered: the read of a key checks this first.
    any: AtomicBool,
    /// A task drops the remembered keys now.
    cleaning: AtomicBool,
    warned: AtomicBool,
}

/// What this process did to a key while Redis could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// It loaded or primed a value that Redis does not have: Redis must drop the one it holds,
    /// if any (older), and the processes that may have read that one must drop their copies.
    /// When Redis holds none (it restarted empty, or the value expired), nobody read it since,
    /// and nothing is announced: every process's own copy stands.
    Stored,
    /// It invalidated the key: announced whatever Redis holds.
    Invalidated,
}

impl Dirty {
    /// Remembers that the key of `keys` must be dropped from Redis, announcing `message` as
    /// `change` says. An invalidation stays one, whatever is stored after it.
    pub(crate) fn mark(&self, keys: &RedisKeys, message: Vec<u8>, change: Change) {
        let mut dirty = self.lock();
        if dirty.len() >= MOST && !dirty.contains_key(keys.base()) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    most = MOST,
                    "stampede: too many keys changed while Redis was down; some may be served \
                     from Redis with their value from before the outage until it expires"
                );
            }
            return;
        }
        let change = match dirty.get(keys.base()) {
            Some((_, Change::Invalidated)) => Change::Invalidated,
            _ => change,
        };
        dirty.insert(keys.base().to_owned(), (message, change));
        self.any.store(true, Ordering::Release);
    }

    /// Whether the key of `keys` must be dropped from Redis before it is read there.
    pub(crate) fn contains(&self, keys_base: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.lock().contains_key(keys_base)
    }

    /// The invalidation message of the key of base `base` and why, if it is remembered.
    pub(crate) fn message(&self, base: &str) -> Option<(Vec<u8>, Change)> {
        self.lock().get(base).cloned()
    }

    /// Forgets the key of base `base`: Redis dropped it.
    pub(crate) fn dropped(&self, base: &str) {
        let mut dirty = self.lock();
        dirty.remove(base);
        if dirty.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// The bases of the keys remembered.
    pub(crate) fn bases(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Whether a cleaning task must start now: some key is remembered and none runs (it is
    /// then marked running, until [`cleaned`](Self::cleaned)).
    pub(crate) fn start_cleaning(&self) -> bool {
        self.any.load(Ordering::Acquire) && !self.cleaning.swap(true, Ordering::AcqRel)
    }

    /// The cleaning task ended.
    pub(crate) fn cleaned(&self) {
        self.cleaning.store(false, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (Vec<u8>, Change)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
