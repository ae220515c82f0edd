//! What a cached function's companion (`product::invalidate`, `refresh`, `prime`, `peek`) does
//! with its cache, beyond a call. Additive to the path of a call in `cache.rs`.

use std::convert::Infallible;
use std::future::Pending;

use tokio::time::Instant;

use super::{Cache, Key, Run, Value};
use crate::config::Lock;
use crate::error::Error;
use crate::flight::Joined;
use crate::load::Load;
use crate::telemetry::Reason;
use crate::tier::{Handle, Tier};

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
        // not store its value over it.
        self.forget(&key);
        let handle = Handle::new(&self.core, &key, &NoLoad, Reason::Miss, None);
        self.tier.prime(&handle, value).await
    }

    /// Loads `key` now and stores the value, through the key's flight: joins the load running
    /// for it, if any; else starts one that ignores the value held (here and in the tier).
    pub(crate) async fn refresh<P, L>(&'static self, key: K, prepare: P) -> Result<V, Error>
    where
        P: FnOnce() -> L,
        L: Load<K, V>,
    {
        let core = &self.core;
        if core.config.lock == Lock::None {
            let load = prepare();
            let handle = Handle::new(core, &key, &load, Reason::Miss, None);
            return self.run(&handle, Run::Refresh).await;
        }
        let waiter = match core.flights.join(&key) {
            Joined::Shared(waiter) => {
                core.telemetry.shared.bump();
                waiter
            }
            Joined::Led(leader, waiter) => {
                self.spawn_load(leader, prepare(), Reason::Miss, Run::Refresh)?;
                waiter
            }
        };
        let _waiting = core.telemetry.waiters.raise();
        waiter.wait(&core.config.name).await
    }
}
