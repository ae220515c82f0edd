//! A cached value with the deadlines that say how it may be served.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{self, Nanos, after};
use crate::tags::Stamp;

/// A value and its deadlines, measured on tokio's clock so paused-clock tests control them.
///
/// The deadline a hit checks, `refresh_at`, is a point on the [`clock`], which a hit compares
/// with the coarse clock's reading and nothing else. The others are kept as [`Offset`]s after
/// `filled_at`, 4 bytes each, read only past `refresh_at`: an entry of a 24-byte value is 56
/// bytes rather than 104 (64 with the optional tag stamp), most of what the memory tier adds
/// per entry to the store's own (issue 14).
#[derive(Clone, Debug)]
pub(crate) struct Entry<V> {
    pub(crate) value: V,
    /// When the value was loaded, for its age in the stats; the deadlines count from it.
    filled_at: Nanos,
    /// Past this (at most `fresh_until`), a hit also starts one refresh (`refresh_after`).
    refresh_at: Nanos,
    fresh_until: Offset,
    stale_until: Offset,
    /// Until then, past `stale_until`, the value is served when a load fails (`fail_safe`).
    fail_safe_until: Offset,
    /// The entry's tags, for a cache with `tags`: it is served only while none was invalidated
    /// since its load began.
    stamp: Option<Arc<Stamp>>,
}

/// A deadline as the time after an entry's `filled_at`, in 32 bits: whole milliseconds up to
/// about 24 days (top bit clear), whole seconds beyond (top bit set; up to 68 years, past the
/// farthest deadline, about 30 years). Rounded down: a deadline is never later than the one
/// asked for, and at most a millisecond (a second, past 24 days) earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Offset(u32);

impl Offset {
    const SECONDS: u32 = 1 << 31;

    /// `deadline` as an offset after `from` (zero for a deadline before it).
    fn between(from: Instant, deadline: Instant) -> Self {
        let after = deadline.saturating_duration_since(from);
        match u32::try_from(after.as_millis()) {
            Ok(millis) if millis < Self::SECONDS => Offset(millis),
            _ => {
                let seconds = after.as_secs().min(u64::from(Self::SECONDS - 1));
                Offset(Self::SECONDS | seconds as u32)
            }
        }
    }

    /// The offset in nanoseconds (at most 68 years: fits easily).
    #[inline]
    fn nanos(self) -> u64 {
        if self.0 & Self::SECONDS == 0 {
            u64::from(self.0) * 1_000_000
        } else {
            u64::from(self.0 & !Self::SECONDS) * 1_000_000_000
        }
    }

    fn duration(self) -> Duration {
        Duration::from_nanos(self.nanos())
    }

    fn min(self, other: Self) -> Self {
        if other.nanos() < self.nanos() {
            other
        } else {
            self
        }
    }
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
        let fresh_until = Offset::between(filled_at, fresh_until);
        let stale_until = Offset::between(filled_at, stale_until);
        let filled_at = Nanos::of(filled_at);
        Entry {
            value,
            filled_at,
            refresh_at: filled_at.plus(fresh_until.nanos()),
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

    /// When the value was loaded.
    pub(crate) fn filled_at(&self) -> Instant {
        self.filled_at.instant()
    }

    /// When the value stops being fresh.
    #[cfg(test)]
    pub(crate) fn fresh_until(&self) -> Instant {
        self.at(self.fresh_until).instant()
    }

    /// When the value stops being servable (fresh or stale).
    #[cfg(test)]
    pub(crate) fn stale_until(&self) -> Instant {
        self.at(self.stale_until).instant()
    }

    /// When the value was loaded, on the entry's own clock (cheaper to copy on a hit).
    pub(crate) fn filled_nanos(&self) -> Nanos {
        self.filled_at
    }

    /// A value loaded at `now`: fresh for `fresh`, then stale for `stale`.
    pub(crate) fn loaded(value: V, now: Instant, fresh: Duration, stale: Duration) -> Self {
        let fresh_until = after(now, fresh);
        Entry::new(value, now, fresh_until, after(fresh_until, stale))
    }

    /// The point `offset` after the fill.
    fn at(&self, offset: Offset) -> Nanos {
        self.filled_at.plus(offset.nanos())
    }

    /// `deadline` as an offset after the fill.
    fn offset(&self, deadline: Instant) -> Offset {
        Offset::between(self.filled_at(), deadline)
    }

    /// The entry, refreshed early from `at` on (never later than its fresh deadline).
    pub(crate) fn refreshing_from(mut self, at: Instant) -> Self {
        self.refresh_at = Nanos::of(at).min(self.at(self.fresh_until));
        self
    }

    /// The entry, kept as the last good value for `fail_safe` past its stale deadline.
    pub(crate) fn failing_safe_for(mut self, fail_safe: Duration) -> Self {
        let stale_until = after(self.filled_at(), self.stale_until.duration());
        self.fail_safe_until = self.offset(after(stale_until, fail_safe));
        self
    }

    /// Whether the value may stand in for a failed load at `now`.
    pub(crate) fn fail_safe(&self, now: Instant) -> bool {
        self.elapsed(now) < self.fail_safe_until.nanos()
    }

    /// The last good value served for a failed load: fresh again for `throttle`, so the
    /// failing source is asked again at most once per `throttle`, within its fail-safe window.
    pub(crate) fn throttled(mut self, now: Instant, throttle: Duration) -> Self {
        let until = self.offset(after(now, throttle)).min(self.fail_safe_until);
        self.refresh_at = self.at(until);
        self.fresh_until = until;
        self.stale_until = until;
        self
    }

    /// The entry, servable until `until` at the latest.
    pub(crate) fn capped(mut self, until: Instant) -> Self {
        self.refresh_at = self.refresh_at.min(Nanos::of(until));
        let until = self.offset(until);
        self.fresh_until = self.fresh_until.min(until);
        self.stale_until = self.stale_until.min(until);
        self.fail_safe_until = self.fail_safe_until.min(until);
        self
    }

    /// Whether the entry may still be served, fresh or stale.
    pub(crate) fn servable(&self, now: Instant) -> bool {
        self.elapsed(now) < self.stale_until.nanos()
    }

    /// Nanoseconds from the fill to `now` (zero before it).
    fn elapsed(&self, now: Instant) -> u64 {
        Nanos::of(now).since(self.filled_at)
    }

    /// Whether the entry is surely fresh now, read from the coarse clock: a hit's one check.
    /// `false` near the deadline too; [`Entry::freshness`] then reads the exact clock.
    #[inline]
    pub(crate) fn surely_fresh(&self) -> bool {
        clock::surely_before(self.refresh_at)
    }

    pub(crate) fn freshness(&self, now: Instant) -> Freshness {
        let now = Nanos::of(now);
        if now < self.refresh_at {
            return Freshness::Fresh;
        }
        let elapsed = now.since(self.filled_at);
        if elapsed < self.fresh_until.nanos() {
            Freshness::Early
        } else if elapsed < self.stale_until.nanos() {
            Freshness::Stale
        } else {
            Freshness::Expired
        }
    }
}

/// `ttl * (1 - u)` with `u` uniform in `[0, jitter / 100]`: a fill's fresh time.
pub(crate) fn jittered_ttl(ttl: Duration, jitter: u8) -> Duration {
    if jitter == 0 {
        return ttl;
    }
    // Half-open: `u` reaches `jitter / 100` up to one draw's resolution, which no TTL can tell.
    let u = crate::random::uniform(0.0..f64::from(jitter.min(100)) / 100.0);
    ttl.mul_f64(1.0 - u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_keep_their_instant_to_the_millisecond_and_never_move_later() {
        let now = Instant::now();
        let entry = Entry::loaded(
            (),
            now,
            Duration::from_millis(1_500),
            Duration::from_secs(3),
        );
        assert_eq!(entry.freshness(now), Freshness::Fresh);
        let almost = now + Duration::from_millis(1_500) - Duration::from_nanos(1);
        assert_eq!(entry.freshness(almost), Freshness::Fresh);
        assert_eq!(
            entry.freshness(now + Duration::from_millis(1_500)),
            Freshness::Stale
        );
        assert_eq!(
            entry.freshness(now + Duration::from_millis(4_500)),
            Freshness::Expired
        );
        // Sub-millisecond parts are dropped: the deadline comes earlier, never later.
        let odd = Entry::loaded((), now, Duration::from_micros(2_999), Duration::ZERO);
        assert_eq!(
            odd.freshness(now + Duration::from_millis(2)),
            Freshness::Expired
        );
        // Past 24 days, whole seconds; the farthest deadline still fits.
        let long = Entry::loaded((), now, Duration::from_secs(40 * 86_400), Duration::MAX);
        let day_40 = now + Duration::from_secs(40 * 86_400);
        assert_eq!(
            long.freshness(day_40 - Duration::from_secs(1)),
            Freshness::Fresh
        );
        assert_eq!(long.freshness(day_40), Freshness::Stale);
        assert!(long.servable(now + Duration::from_secs(20 * 365 * 86_400)));
        assert_eq!(
            size_of::<Entry<String>>(),
            64,
            "56, and the optional tag stamp"
        );
    }

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
