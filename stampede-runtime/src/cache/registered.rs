//! What the registry sees of a cache ([`AnyCache`]): its options and counters, and the
//! invalidations another process or a tag's invalidation makes of it.

use std::any::Any;

use super::Cache;
use crate::breaker::Breaker;
use crate::config::Config;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::memory::Invalidation;
use crate::registry::{AnyCache, BoxFuture};
use crate::stats::Stats;
use crate::tier::Tier;

impl<K: Key, V: Value, T: Tier<K, V>> AnyCache for Cache<K, V, T> {
    fn config(&self) -> &Config {
        &self.core.config
    }

    fn options(&self) -> std::sync::Arc<Config> {
        self.core.options()
    }

    fn retune(&self, options: Config) {
        self.core.retune(options);
    }

    fn stats(&self) -> Stats {
        let core = &self.core;
        let t = &core.telemetry;
        let mut stats = Stats {
            hits: t.hits.get(),
            misses: t.misses.get(),
            stale_served: t.stale_served.get(),
            loads: t.loads.get(),
            load_errors: t.load_errors.get(),
            timeouts: t.timeouts.get(),
            refreshes: t.refreshes.load(std::sync::atomic::Ordering::Relaxed),
            shared: t.shared.get(),
            fail_safe_served: t.fail_safe_served.get(),
            remote_hits: t.remote_hits.get(),
            older_versions: t.older_versions.get(),
            loads_queued: t.loads_queued.get(),
            loads_refused: t.loads_refused.get(),
            entries: core.memory.entry_count(),
            in_flight: core.flights.len() as u64,
            waiters: t.waiters.get(),
            hot_keys: core.hot.snapshot(t.hits.get()),
            breaker_open: core.breaker.as_ref().is_some_and(Breaker::is_open),
            ..Stats::default()
        };
        self.tier.add_stats(&mut stats);
        stats
    }

    fn invalidate<'a>(
        &'a self,
        name: &'a str,
        key: &'a (dyn Any + Send + Sync),
        how: Invalidation,
    ) -> Option<BoxFuture<'a, Result<(), Error>>> {
        let key = key.downcast_ref::<K>()?;
        Some(Box::pin(async move {
            Cache::invalidate_by(self, name, key, how)
                .await
                .map(|_found| ())
        }))
    }

    fn forget_named(&self, name: &str, how: Invalidation) {
        let Some(name_of) = self.tier.key_name() else {
            return;
        };
        for key in self.core.flights.keys() {
            if name_of(&key).is_some_and(|own| own == name) {
                self.core.flights.forget(&key);
            }
        }
        self.core.memory.invalidate_named(name, how);
    }

    fn clear<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Cache::clear_by(self, name))
    }

    fn clear_here(&self) {
        Cache::clear_here(self);
    }

    fn expire_tag(&self, tag: &str) {
        let Some(render) = self.core.tags else {
            return;
        };
        let mut keys = self.core.memory.keys();
        keys.extend(self.core.flights.keys());
        let keys: std::collections::HashSet<K> = keys.into_iter().collect();
        for key in keys {
            if render(&key).iter().any(|own| own == tag) {
                self.forget_as(&key, Invalidation::Expire);
            }
        }
    }

    fn forget_tag(&self, tag: &str) {
        let Some(render) = self.core.tags else {
            return;
        };
        // Only the running loads: stored entries are checked against the tag's mark on read.
        for key in self.core.flights.keys() {
            if render(&key).iter().any(|own| own == tag) {
                self.forget(&key);
            }
        }
    }

    fn forget_all_shared(&self, through: Option<&str>) {
        if !self.shared_through(through) {
            return;
        }
        self.forget_flights();
        // No invalidation is known, only possible: with `fail_safe`, each value stays its key's
        // last good value, served only when a load fails (the double failure: Redis and the
        // source down).
        let last_good = self.core.config.fail_safe.is_some();
        self.core
            .memory
            .abandon(tokio::time::Instant::now(), last_good);
    }

    fn suspend_shared(&self, through: Option<&str>, until: tokio::time::Instant) {
        if !self.shared_through(through) {
            return;
        }
        self.forget_flights();
        self.core.memory.suspend(tokio::time::Instant::now(), until);
    }

    fn resume_shared(&self, through: Option<&str>) {
        if self.shared_through(through) {
            self.core.memory.resume();
        }
    }
}

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// Whether the cache's tier names its keys to other processes through the connection
    /// `through` (`None`: through any).
    fn shared_through(&self, through: Option<&str>) -> bool {
        self.tier.key_name().is_some()
            && through.is_none_or(|through| self.tier.shared_through() == Some(through))
    }
}
