//! The keys this process changed while Redis could not be used, which Redis must drop once it
//! answers again.
//!
//! While Redis is down, a process loads keys locally and serves those values, and its
//! invalidations cannot reach Redis. Redis then still holds what was written before the outage:
//! read after it, a value older than the one this process served meanwhile, or one an
//! invalidation meant to drop. So the keys loaded locally, invalidated or primed while Redis
//! failed are remembered here, and each is dropped from Redis (value deleted, fence moved on,
//! the invalidation announced) before this process reads it from Redis again; the rest are
//! dropped by a task that tries every operation timeout until Redis answers, whatever else the
//! process does (a writer that only invalidates delivers its failed invalidations too).
//!
//! The set is bounded ([`MOST`] keys per connection): past it, keys are no longer remembered,
//! and a warning says that they may serve their pre-outage values until those expire.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::redis::endpoint::Endpoint;
use crate::redis::failure::Failure;
use crate::redis::keys::RedisKeys;

/// The most keys one connection remembers.
pub(crate) const MOST: usize = 100_000;

/// The shortest pause between two rounds of dropping the remembered keys.
const RETRY_LEAST: std::time::Duration = std::time::Duration::from_millis(10);

/// Keys to drop from Redis, by their base, with the invalidation message to announce.
#[derive(Default)]
pub(crate) struct Dirty {
    keys: Mutex<HashMap<String, Vec<u8>>>,
    /// Whether any key is remembered: the read of a key checks this first.
    any: AtomicBool,
    /// A task drops the remembered keys now.
    cleaning: AtomicBool,
    warned: AtomicBool,
}

impl Dirty {
    /// Remembers that the key of `keys` must be dropped from Redis, announcing `message`.
    pub(crate) fn mark(&self, keys: &RedisKeys, message: Vec<u8>) {
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
        dirty.insert(keys.base().to_owned(), message);
        self.any.store(true, Ordering::Release);
    }

    /// Whether the key of `keys` must be dropped from Redis before it is read there.
    pub(crate) fn contains(&self, keys_base: &str) -> bool {
        self.any.load(Ordering::Acquire) && self.lock().contains_key(keys_base)
    }

    /// Drops the key of base `base` from Redis if it is remembered; `Err` when Redis failed
    /// (it stays remembered).
    pub(crate) async fn clean(&self, endpoint: &Endpoint, base: &str) -> Result<(), Failure> {
        let Some(message) = self.lock().get(base).cloned() else {
            return Ok(());
        };
        endpoint
            .invalidate(&RedisKeys::of_base(base), Some(&message))
            .await?;
        let mut dirty = self.lock();
        dirty.remove(base);
        if dirty.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Remembers the key of `keys` (see [`mark`](Self::mark)) and starts the task that drops
    /// the remembered keys as soon as Redis answers.
    pub(crate) fn mark_and_clean(endpoint: &Arc<Endpoint>, keys: &RedisKeys, message: Vec<u8>) {
        endpoint.dirty.mark(keys, message);
        Dirty::clean_all(endpoint);
    }

    /// Drops every remembered key from Redis, one at a time, from a task of its own (one per
    /// connection): a round that Redis fails is tried again an operation timeout later, until
    /// every key is dropped. Outside a runtime, the next call in one does it.
    pub(crate) fn clean_all(endpoint: &Arc<Endpoint>) {
        let dirty = &endpoint.dirty;
        if !dirty.any.load(Ordering::Acquire) || dirty.cleaning.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            dirty.cleaning.store(false, Ordering::Release);
            return;
        };
        let endpoint = endpoint.clone();
        runtime.spawn(async move {
            // Cleared however the task ends (its runtime may shut down mid-way), and a key
            // remembered meanwhile gets a task of its own.
            let cleaning = Cleaning(&endpoint);
            let dirty = &endpoint.dirty;
            loop {
                let bases: Vec<String> = dirty.lock().keys().cloned().collect();
                let mut failed = false;
                for base in bases {
                    if dirty.clean(&endpoint, &base).await.is_err() {
                        failed = true;
                        break;
                    }
                }
                if !failed {
                    break;
                }
                let pause = endpoint.config.op_timeout.max(RETRY_LEAST);
                tokio::time::sleep(pause).await;
            }
            drop(cleaning);
        });
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The cleaning task of a connection is running: cleared on drop, after which a key remembered
/// during its last round starts another.
struct Cleaning<'a>(&'a Arc<Endpoint>);

impl Drop for Cleaning<'_> {
    fn drop(&mut self) {
        self.0.dirty.cleaning.store(false, Ordering::Release);
        // Outside a runtime (a shut-down one's task dropped) this spawns nothing: the next call
        // starts it again.
        if tokio::runtime::Handle::try_current().is_ok() {
            Dirty::clean_all(self.0);
        }
    }
}
