//! A cached value with the deadlines that say how it may be served.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::tags::Stamp;

/// A value and its deadlines, measured on tokio's clock so paused-clock tests control them.
#[derive(Clone, Debug)]
pub(crate) struct Entry<V> {
    pub(crate) value: V,
    /// When the value was loaded, for its age in the stats.
    pub(crate) filled_at: Instant,
    /// Past this (at most `fresh_until`), a hit also starts one refresh (`refresh_after`).
    refresh_at: Instant,
    fresh_until: Instant,
    stale_until: Instant,
    /// Until then, past `stale_until`, the value is served when a load fails (`fail_safe`).
    fail_safe_until: Instant,
    /// The entry's tags, for a cache with `tags`: it is served only while none was invalidated
    /// since its load began.
    stamp: Option<Arc<Stamp>>,
}

/// How an entry may be served at a given instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Serve it.
    Fresh,
    /// Serve it, and make sure one refresh is running: it is older than `refresh_after`.
    Early,
    /// Serve it, and make sure one refresh is running.
    Stale,
    /// Past the stale window: treat as missing.
    Expired,
}

impl<V> Entry<V> {
    pub(crate) fn new(
        value: V,
        filled_at: Instant,
        fresh_until: Instant,
        stale_until: Instant,
    ) -> Self {
        Entry {
            value,
            filled_at,
            refresh_at: fresh_until,
            fresh_until,
            stale_until,
            fail_safe_until: stale_until,
            stamp: None,
        }
    }

    /// The entry, tagged as its load's stamp says.
    pub(crate) fn stamped(mut self, stamp: Option<&Arc<Stamp>>) -> Self {
        self.stamp = stamp.cloned();
        self
    }

    /// Whether no tag of the entry was invalidated since its load began (an untagged entry
    /// always is).
    pub(crate) fn current(&self) -> bool {
        self.stamp.as_ref().is_none_or(|stamp| stamp.current())
    }

    /// A value loaded at `now`: fresh for `fresh`, then stale for `stale`.
    pub(crate) fn loaded(value: V, now: Instant, fresh: Duration, stale: Duration) -> Self {
        let fresh_until = after(now, fresh);
        Entry::new(value, now, fresh_until, after(fresh_until, stale))
    }

    /// The entry, refreshed early from `at` on (never later than its fresh deadline).
    pub(crate) fn refreshing_from(mut self, at: Instant) -> Self {
        self.refresh_at = at.min(self.fresh_until);
        self
    }

    /// The entry, kept as the last good value for `fail_safe` past its stale deadline.
    pub(crate) fn failing_safe_for(mut self, fail_safe: Duration) -> Self {
        self.fail_safe_until = after(self.stale_until, fail_safe);
        self
    }

    /// Whether the value may stand in for a failed load at `now`.
    pub(crate) fn fail_safe(&self, now: Instant) -> bool {
        now < self.fail_safe_until
    }

    /// The last good value served for a failed load: fresh again for `throttle`, so the
    /// failing source is asked again at most once per `throttle`, within its fail-safe window.
    pub(crate) fn throttled(mut self, now: Instant, throttle: Duration) -> Self {
        let until = after(now, throttle).min(self.fail_safe_until);
        self.refresh_at = until;
        self.fresh_until = until;
        self.stale_until = until;
        self
    }

    /// The entry, servable until `until` at the latest.
    pub(crate) fn capped(mut self, until: Instant) -> Self {
        self.fresh_until = self.fresh_until.min(until);
        self.refresh_at = self.refresh_at.min(until);
        self.stale_until = self.stale_until.min(until);
        self.fail_safe_until = self.fail_safe_until.min(until);
        self
    }

    /// Whether the entry may still be served, fresh or stale.
    pub(crate) fn servable(&self, now: Instant) -> bool {
        now < self.stale_until
    }

    pub(crate) fn freshness(&self, now: Instant) -> Freshness {
        if now < self.refresh_at {
            Freshness::Fresh
        } else if now < self.fresh_until {
            Freshness::Early
        } else if now < self.stale_until {
            Freshness::Stale
        } else {
            Freshness::Expired
        }
    }
}

/// `instant + duration`, saturated at an instant far in the future: every duration a user
/// gives is accepted up to `Duration::MAX`.
pub(crate) fn after(instant: Instant, duration: Duration) -> Instant {
    instant
        .checked_add(duration)
        .unwrap_or_else(|| Instant::now() + FAR)
}

/// Farther than any deadline needs to be (about thirty years), and far from overflowing.
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `ttl * (1 - u)` with `u` uniform in `[0, jitter / 100]`: a fill's fresh time.
pub(crate) fn jittered_ttl(ttl: Duration, jitter: u8) -> Duration {
    if jitter == 0 {
        return ttl;
    }
    let u = rand::random_range(0.0..=f64::from(jitter.min(100)) / 100.0);
    ttl.mul_f64(1.0 - u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_band() {
        let ttl = Duration::from_secs(100);
        for _ in 0..1_000 {
            let d = jittered_ttl(ttl, 30);
            assert!(d >= Duration::from_secs(70) && d <= ttl, "{d:?}");
        }
        assert_eq!(jittered_ttl(ttl, 0), ttl);
    }
}
