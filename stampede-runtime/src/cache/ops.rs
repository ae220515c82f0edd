//! What a cached function's companion (`product::invalidate`, `refresh`, `prime`, `peek`) does
//! with its cache, beyond a call.

use std::convert::Infallible;
use std::future::Pending;

use tokio::time::Instant;

use super::Cache;
use crate::config::Lock;
use crate::error::{Error, LoadError};
use crate::flight::Joined;
use crate::kv::{Key, Value};
use crate::load::{ErasedPrepare, Load};
use crate::memory::Invalidation;
use crate::tier::{Handle, Run, Start, Tier};

/// The load of a flight that loads nothing: [`Cache::prime`] lends its tier a [`Handle`] to keep
/// a value it was given.
struct NoLoad;

impl<K, V: Send + 'static> Load<K, V> for NoLoad {
    type Error = Infallible;
    type Attempt = Pending<Result<V, Infallible>>;

    fn attempt(&self, _key: &K) -> Self::Attempt {
        std::future::pending()
    }
}

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// The value this process holds for `key` if it may be served now (fresh or stale), without
    /// loading, waiting or counting a call.
    pub(crate) fn peek(&self, key: &K) -> Option<V> {
        if !self.core.config.in_memory() {
            return None;
        }
        let entry = self.core.entry(key)?;
        entry.servable(Instant::now()).then_some(entry.value)
    }

    /// Stores `value` for `key` as if it had been loaded now: fresh for a jittered `ttl`, then
    /// stale for `stale`; the tier shares it (written to Redis, with a new fence, so that a
    /// load that read the key before cannot write its value over it).
    pub(crate) async fn prime(&self, key: K, value: V) -> Result<(), Error> {
        // A load of the key running now read its source before this value was given: it must
        // not store its value over it. The value held stays until this one replaces it (or, of
        // a newer source version, is kept).
        self.core.flights.forget(&key);
        self.core.memory.detach(&key);
        let handle = Handle::new(&self.core, &key, &NoLoad, Start::miss(Run::Get), None);
        let primed = self.tier.prime(&handle, value).await;
        let overtaken = !handle.current();
        drop(handle);
        // A load or read begun while the value was on its way may have read the value it
        // replaces: it neither keeps it nor serves it to a caller that joins it after this.
        self.core.flights.forget(&key);
        self.core.memory.detach(&key);
        if overtaken {
            // Another prime or an invalidation detached this one before it kept its value: what
            // memory holds may be from before this prime, which must not outlive its return.
            self.core.memory.invalidate(&key);
        }
        primed
    }

    /// The companion's `refresh` (`Call::Refresh`), its load erased: loads `key` now and
    /// stores the value, through the key's flight: joins the load running for it, if any; else
    /// starts one that ignores the value held (here and in the tier).
    pub(super) async fn refresh_erased<E: LoadError>(
        &'static self,
        key: K,
        prepare: ErasedPrepare<'_, K, V, E>,
    ) -> Result<V, Error> {
        let core = &self.core;
        if core.config.lock == Lock::None {
            return self.run_here(&key, prepare(), Run::Refresh).await;
        }
        let waiter = match core.flights.join(&key, self.tier.trusted_for()) {
            Joined::Shared(waiter) => {
                core.telemetry.shared.bump();
                waiter
            }
            Joined::Led(leader, waiter) => {
                self.spawn_load(leader, prepare(), Start::miss(Run::Refresh))?;
                waiter
            }
        };
        // A flight it joined may be serving the value it replaces: the refresh waits for the load.
        let mut waiter = waiter.loaded_only();
        let _waiting = core.telemetry.waiters.raise();
        waiter.wait(&core.config.name).await
    }

    /// Drops every value of the cache here and detaches its running loads; then in the tier,
    /// every key of the cache's name there and every other process's memory of it (`clear`).
    pub(crate) async fn clear(&self) -> Result<(), Error> {
        self.clear_by(&self.core.config.name).await
    }

    /// [`Cache::clear`] asked for by `name`, as for [`Cache::invalidate_by`].
    pub(crate) async fn clear_by(&self, name: &str) -> Result<(), Error> {
        self.clear_here();
        let cleared = self.tier.clear(&self.core.config, name).await;
        // A call meanwhile may have read an old value from a shared tier before it was dropped
        // there, and kept it: clear again, rather than wait for the announcement's echo.
        if self.tier.key_name().is_some() {
            self.clear_here();
        }
        cleared
    }

    /// Drops this process's copy of `key` (or with [`Invalidation::Expire`] ends its fresh
    /// time) and detaches its running load (which stores nothing); then does the same in the
    /// tier. Whether a value was held for it, here or in the shared tier.
    pub(crate) async fn invalidate_as(&self, key: &K, how: Invalidation) -> Result<bool, Error> {
        self.invalidate_by(&self.core.config.name, key, how).await
    }

    /// [`Cache::invalidate_as`] asked for by `name`: the cache's own, or the stem it shares
    /// with its function's other caches (`names::stem`), which the tier announces so that
    /// every process's caches of that function hear it.
    pub(crate) async fn invalidate_by(
        &self,
        name: &str,
        key: &K,
        how: Invalidation,
    ) -> Result<bool, Error> {
        let here = self.forget_as(key, how);
        let dropped = self
            .tier
            .invalidate(&self.core.config, name, key, how)
            .await;
        // A call meanwhile may have read the old value from a shared tier before it was dropped
        // there, and kept it: forget again, rather than wait for the announcement's echo.
        if self.tier.key_name().is_some() {
            self.forget_as(key, how);
        }
        dropped.map(|shared| here || shared)
    }
}
