//! A cached value with the deadlines that say how it may be served.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{Nanos, after};
use crate::tags::Stamp;

/// A value and its deadlines, measured on tokio's clock so paused-clock tests control them.
///
/// The deadline a hit checks, `refresh_at`, is a point on the [`clock`](crate::clock), which a
/// hit compares with the coarse clock's reading and nothing else. The fill time is kept as an
/// [`Offset`] before it (`filled_behind`), and the other deadlines as offsets after the fill,
/// 4 bytes each, read only past `refresh_at`: with the moment its source was read (`read_at`,
/// which orders it against another value of its key), an entry of a 24-byte value is 56 bytes
/// rather than 112 (64 with the optional tag stamp), most of what the memory tier adds per entry
/// to the store's own (issues 14 and 25).
///
/// The fill time is `refresh_at - filled_behind` exactly; whenever `refresh_at` moves, the
/// other offsets are counted again from the fill time that results, rounded down, so that no
/// deadline ever moves later than the one asked for (at most a millisecond earlier).
#[derive(Clone, Debug)]
pub(crate) struct Entry<V> {
    pub(crate) value: V,
    /// Past this (at most `fresh_until`), a hit also starts one refresh (`refresh_after`).
    refresh_at: Nanos,
    /// When the value's source was read, bounded from below (the attempt's start, or the shared
    /// store's `read_at`): which of two values memory keeps (`Memory::keep`).
    read_at: Nanos,
    /// When the value was loaded (for its age in the stats; the deadlines count from it), as
    /// the time before `refresh_at`: to the millisecond, never before the real fill.
    filled_behind: Offset,
    fresh_until: Offset,
    stale_until: Offset,
    /// Until then, past `stale_until`, the value is served when a load fails (`fail_safe`).
    fail_safe_until: Offset,
    /// The entry's tags, for a cache with `tags`: it is served only while none was invalidated
    /// since its load began.
    stamp: Option<Arc<Stamp>>,
}

/// What a lookup of a key finds in memory.
pub(crate) enum Found<V> {
    /// A value surely fresh on the coarse clock, and when it was loaded.
    Fresh(V, Nanos),
    /// An entry near or past its refresh point, to judge on the exact clock.
    Judge(Entry<V>),
    /// No entry, or one a tag's invalidation made unservable.
    Nothing,
}

/// An entry as the memory tier keeps it for a cache without `tags`, `fail_safe` or
/// `refresh_after` (issue 25). No entry of such a cache has a tag stamp, its refresh point is
/// its fresh deadline (only `refresh_after` moves it earlier) and its fail-safe deadline its
/// stale one (only `fail_safe` moves it later, and the throttle, which only a fail-safe value
/// gets): two offsets and the stamp are kept nowhere. When its value's source was read is kept
/// only where memory orders values by it ([`LeanRead`]). An entry of a 24-byte value is 40
/// bytes (48 with the read) rather than 64. [`Entry`] is what every other path handles.
#[derive(Clone, Debug)]
pub(crate) struct Lean<V, R = ()> {
    value: V,
    refresh_at: Nanos,
    read: R,
    filled_behind: Offset,
    stale_until: Offset,
}

/// What a lean entry keeps of when its value's source was read.
///
/// Nothing (`()`) in a cache whose tier shares nothing: its flights of one key never store
/// out of order (a caller joins the key's flight, an invalidation detaches it; only
/// `lock = "none"` races loads, and the README lets an older value win there), so an entry
/// needs no read to be ordered by, and a key's running loads still order their own values
/// (`Memory::keep`). The moment ([`Nanos`]) in a cache whose tier shares values: there a flight
/// loads beside one begun longer ago than the trust bound, and values come from other
/// processes.
pub(crate) trait LeanRead: Copy + std::fmt::Debug {
    /// What is kept of `read_at`.
    fn of(read_at: Nanos) -> Self;
    /// The read back: [`Nanos::EARLIEST`] where nothing is kept (it orders nothing).
    fn read_at(self) -> Nanos;
}

impl LeanRead for () {
    fn of(_: Nanos) -> Self {}

    fn read_at(self) -> Nanos {
        Nanos::EARLIEST
    }
}

impl LeanRead for Nanos {
    fn of(read_at: Nanos) -> Self {
        read_at
    }

    fn read_at(self) -> Nanos {
        self
    }
}

impl<V, R: LeanRead> Lean<V, R> {
    /// `entry` in the lean form; `None` for an entry with a tag stamp, which this form cannot
    /// check. Its deadlines are those of a lean cache's entries; any other would only come
    /// earlier: the fresh deadline to the refresh point, the fail-safe one to the stale one.
    pub(crate) fn of(entry: Entry<V>) -> Option<Self> {
        if entry.stamp.is_some() {
            return None;
        }
        debug_assert!(
            entry.fresh_until.nanos() == entry.filled_behind.nanos()
                && entry.fail_safe_until.nanos() == entry.stale_until.nanos(),
            "an entry with deadlines of its own in a lean cache"
        );
        Some(Lean {
            value: entry.value,
            refresh_at: entry.refresh_at,
            read: R::of(entry.read_at),
            filled_behind: entry.filled_behind,
            stale_until: entry.stale_until,
        })
    }

    /// What a lookup finds in this entry ([`Store::find`](crate::memory::Store::find)),
    /// surely fresh when its refresh point is after `latest` ([`Entry::found`]).
    #[inline(always)]
    pub(crate) fn found(self, latest: Nanos) -> Found<V> {
        match latest < self.refresh_at {
            true => {
                let filled = self.filled_nanos();
                Found::Fresh(self.value, filled)
            }
            false => Found::Judge(self.entry()),
        }
    }

    /// The entry, as every path but the store handles it.
    #[inline]
    pub(crate) fn entry(self) -> Entry<V> {
        Entry {
            value: self.value,
            refresh_at: self.refresh_at,
            read_at: self.read.read_at(),
            filled_behind: self.filled_behind,
            fresh_until: self.filled_behind,
            stale_until: self.stale_until,
            fail_safe_until: self.stale_until,
            stamp: None,
        }
    }

    /// Whether the value may stand in for a failed load at `now` ([`Entry::fail_safe`]).
    pub(crate) fn fail_safe(&self, now: Instant) -> bool {
        Nanos::of(now).since(self.filled_nanos()) < self.stale_until.nanos()
    }

    /// When the value was loaded ([`Entry::filled_nanos`]).
    #[inline]
    fn filled_nanos(&self) -> Nanos {
        Nanos::before(self.refresh_at, self.filled_behind.nanos())
    }
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
        Self::of_nanos(Nanos::of(deadline).since(Nanos::of(from)))
    }

    /// `nanos` as an offset, rounded down.
    fn of_nanos(nanos: u64) -> Self {
        let millis = nanos / 1_000_000;
        match u32::try_from(millis) {
            Ok(millis) if millis < Self::SECONDS => Offset(millis),
            _ => {
                let seconds = (nanos / 1_000_000_000).min(u64::from(Self::SECONDS - 1));
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
}

/// An entry's deadlines as [`Entry::saved`] read them, to be put back by [`Entry::restore`]:
/// what memory keeps of an entry it took out of service while a shared tier's invalidation feed
/// was lost, in case the feed's log shows that no invalidation of it was missed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Saved {
    /// Which value they are of: only an entry whose source was read at the same moment gets
    /// them back.
    read_at: Nanos,
    refresh_at: Nanos,
    filled_behind: Offset,
    fresh_until: Offset,
    stale_until: Offset,
    fail_safe_until: Offset,
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
        Entry {
            value,
            refresh_at: Nanos::of(filled_at).plus(fresh_until.nanos()),
            read_at: Nanos::of(filled_at),
            filled_behind: fresh_until,
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

    /// The entry, its source read at `at` (bounded from below; by default, when it was filled).
    pub(crate) fn read_from(mut self, at: Instant) -> Self {
        self.read_at = Nanos::of(at);
        self
    }

    /// When the value's source was read, bounded from below.
    pub(crate) fn read_at(&self) -> Nanos {
        self.read_at
    }

    /// Whether no tag of the entry was invalidated since its load began (an untagged entry
    /// always is).
    pub(crate) fn current(&self) -> bool {
        self.stamp.as_ref().is_none_or(|stamp| stamp.current())
    }

    /// When the value was loaded.
    pub(crate) fn filled_at(&self) -> Instant {
        self.filled_nanos().instant()
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

    /// When the value was loaded, on the entry's own clock.
    #[inline]
    pub(crate) fn filled_nanos(&self) -> Nanos {
        Nanos::before(self.refresh_at, self.filled_behind.nanos())
    }

    /// A value loaded at `now`: fresh for `fresh`, then stale for `stale`.
    pub(crate) fn loaded(value: V, now: Instant, fresh: Duration, stale: Duration) -> Self {
        let fresh_until = after(now, fresh);
        Entry::new(value, now, fresh_until, after(fresh_until, stale))
    }

    /// The point `offset` after the fill.
    fn at(&self, offset: Offset) -> Nanos {
        self.filled_nanos().plus(offset.nanos())
    }

    /// `deadline` as an offset after the fill.
    fn offset(&self, deadline: Instant) -> Offset {
        Offset::of_nanos(Nanos::of(deadline).since(self.filled_nanos()))
    }

    /// The entry with its deadlines as given (points on the clock): the hit's `refresh_at`
    /// exactly, the fill time as close before it as an offset says (or `refresh_at` itself,
    /// when that is earlier than the fill), the others counted again from that fill time,
    /// rounded down (never later than given).
    fn with_deadlines(
        mut self,
        refresh_at: Nanos,
        fresh_until: Nanos,
        stale_until: Nanos,
        fail_safe_until: Nanos,
    ) -> Self {
        self.set_deadlines(refresh_at, fresh_until, stale_until, fail_safe_until);
        self
    }

    /// [`Entry::with_deadlines`], in place.
    fn set_deadlines(
        &mut self,
        refresh_at: Nanos,
        fresh_until: Nanos,
        stale_until: Nanos,
        fail_safe_until: Nanos,
    ) {
        let filled = self.filled_nanos();
        self.refresh_at = refresh_at;
        self.filled_behind = Offset::of_nanos(refresh_at.since(filled));
        let filled = self.filled_nanos();
        self.fresh_until = Offset::of_nanos(fresh_until.since(filled));
        self.stale_until = Offset::of_nanos(stale_until.since(filled));
        self.fail_safe_until = Offset::of_nanos(fail_safe_until.since(filled));
    }

    /// The deadlines past `refresh_at`, as points on the clock.
    fn deadlines(&self) -> (Nanos, Nanos, Nanos) {
        (
            self.at(self.fresh_until),
            self.at(self.stale_until),
            self.at(self.fail_safe_until),
        )
    }

    /// The entry, refreshed early from `at` on (never later than its fresh deadline).
    pub(crate) fn refreshing_from(self, at: Instant) -> Self {
        let (fresh, stale, fail_safe) = self.deadlines();
        let refresh_at = Nanos::of(at).min(fresh);
        self.with_deadlines(refresh_at, fresh, stale, fail_safe)
    }

    /// The entry refreshed early by XFetch (see [`Entry::xfetch_due`]) for a load that took
    /// `took`, with `beta`: its refresh point [`XFETCH_REACH`] times `took * beta` before its
    /// fresh deadline (at its fill at the earliest), where a read's chance of a refresh is
    /// `e^-10` and rises from.
    pub(crate) fn xfetching(self, took: Duration, beta: f64) -> Self {
        let (fresh, ..) = self.deadlines();
        let reach = took.as_secs_f64() * beta * XFETCH_REACH * 1e9;
        let at = Nanos::before(fresh, reach.min(u64::MAX as f64) as u64).max(self.filled_nanos());
        self.refreshing_from(at.instant())
    }

    /// XFetch's draw for a read at `now` past the refresh point: whether it starts the early
    /// refresh, which it does when `now - took * beta * ln(u) >= fresh_until` for `u` uniform in
    /// (0, 1), `took * beta` being the distance from the refresh point to the fresh deadline
    /// over [`XFETCH_REACH`]. The nearer the deadline and the slower the load, the likelier.
    pub(crate) fn xfetch_due(&self, now: Instant) -> bool {
        let (fresh, ..) = self.deadlines();
        let scale = fresh.since(self.refresh_at) as f64 / XFETCH_REACH;
        let left = fresh.since(Nanos::of(now)) as f64;
        let draw = -crate::random::uniform(f64::MIN_POSITIVE..1.0).ln();
        left <= scale * draw
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
    /// A value still fresh (another load stored it meanwhile, `lock = "none"`) keeps its own
    /// deadlines: the throttle never makes a value live past its `ttl` while it is fresh.
    pub(crate) fn throttled(self, now: Instant, throttle: Duration) -> Self {
        let (fresh, _, fail_safe) = self.deadlines();
        if Nanos::of(now) < fresh {
            return self;
        }
        let until = Nanos::of(after(now, throttle)).min(fail_safe);
        self.with_deadlines(until, until, until, fail_safe)
    }

    /// The entry, servable until `until` at the latest; still its key's last good value for
    /// the rest of its fail-safe window (a failed load may be answered with it).
    pub(crate) fn capped(mut self, until: Instant) -> Self {
        self.cap(until);
        self
    }

    /// [`Entry::capped`], in place.
    pub(crate) fn cap(&mut self, until: Instant) {
        let until = Nanos::of(until);
        let (fresh, stale, fail_safe) = self.deadlines();
        let refresh_at = self.refresh_at.min(until);
        // An entry without a fail-safe window of its own keeps none.
        let fail_safe = match fail_safe > stale {
            true => fail_safe,
            false => stale.min(until),
        };
        self.set_deadlines(refresh_at, fresh.min(until), stale.min(until), fail_safe);
    }

    /// The value is no longer fresh from `now` on (`expire`): stale for its own stale window
    /// at most (its stale deadline less its fresh one: the cache's `stale`, or less), never
    /// past its stale deadline, then its key's last good value for the rest of its fail-safe
    /// window, which an entry without one does not gain. The Redis tier's `expire_lua!` is
    /// this rule in Lua.
    pub(crate) fn expire(&mut self, now: Instant) {
        let now = Nanos::of(now);
        let (fresh, stale_until, fail_safe) = self.deadlines();
        let window = stale_until.since(fresh);
        let stale_until = stale_until.min(now.plus(window));
        let fail_safe = match fail_safe > self.at(self.stale_until) {
            true => fail_safe,
            false => stale_until,
        };
        let refresh_at = self.refresh_at.min(now);
        self.set_deadlines(refresh_at, fresh.min(now), stale_until, fail_safe);
    }

    /// Its deadlines, as they are now.
    pub(crate) fn saved(&self) -> Saved {
        Saved {
            read_at: self.read_at,
            refresh_at: self.refresh_at,
            filled_behind: self.filled_behind,
            fresh_until: self.fresh_until,
            stale_until: self.stale_until,
            fail_safe_until: self.fail_safe_until,
        }
    }

    /// Whether `saved` are this value's deadlines (its source read at the same moment).
    pub(crate) fn holds(&self, saved: &Saved) -> bool {
        saved.read_at == self.read_at
    }

    /// Puts back the deadlines `saved` holds if they are of this value (its source read at the
    /// same moment); whether they were.
    pub(crate) fn restore(&mut self, saved: &Saved) -> bool {
        if !self.holds(saved) {
            return false;
        }
        self.refresh_at = saved.refresh_at;
        self.filled_behind = saved.filled_behind;
        self.fresh_until = saved.fresh_until;
        self.stale_until = saved.stale_until;
        self.fail_safe_until = saved.fail_safe_until;
        true
    }

    /// Whether the entry may still be served, fresh or stale.
    pub(crate) fn servable(&self, now: Instant) -> bool {
        self.elapsed(now) < self.stale_until.nanos()
    }

    /// Nanoseconds from the fill to `now` (zero before it).
    fn elapsed(&self, now: Instant) -> u64 {
        Nanos::of(now).since(self.filled_nanos())
    }

    /// What a lookup finds in this entry, servable as far as its tags go: its value if surely
    /// fresh, its refresh point after `latest` (the clock's latest reading now,
    /// [`clock::latest`](crate::clock::latest): a hit's one check); else itself, whose
    /// [`Entry::freshness`] then reads the exact clock (near the deadline too).
    #[inline(always)]
    pub(crate) fn found(self, latest: Nanos) -> Found<V> {
        match latest < self.refresh_at {
            true => {
                let filled = self.filled_nanos();
                Found::Fresh(self.value, filled)
            }
            false => Found::Judge(self),
        }
    }

    pub(crate) fn freshness(&self, now: Instant) -> Freshness {
        let now = Nanos::of(now);
        if now < self.refresh_at {
            return Freshness::Fresh;
        }
        let elapsed = now.since(self.filled_nanos());
        if elapsed < self.fresh_until.nanos() {
            Freshness::Early
        } else if elapsed < self.stale_until.nanos() {
            Freshness::Stale
        } else {
            Freshness::Expired
        }
    }
}

/// How many times a load's time (times `beta`) before its fresh deadline an XFetch entry's reads
/// begin to draw: a read farther than that refreshes with a chance below `e^-10`, which the
/// runtime rounds to none so that the reads before it cost nothing.
pub(crate) const XFETCH_REACH: f64 = 10.0;

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
        assert_eq!(
            size_of::<Lean<String>>(),
            40,
            "without the stamp, the fresh deadline, the fail-safe one and the read"
        );
        assert_eq!(size_of::<Lean<String, Nanos>>(), 48, "with the read");
    }

    #[test]
    fn moving_the_refresh_point_keeps_the_fill_and_never_moves_a_deadline_later() {
        let now = Instant::now();
        let ms = Duration::from_millis(1);
        let ten = Duration::from_secs(10);
        // A fill off the millisecond grid of its refresh point, as a Redis fill time is.
        let filled = now + Duration::from_micros(300);
        let entry = Entry::new((), filled, filled + ten, filled + ten * 7).failing_safe_for(ten);
        assert_eq!(
            entry.filled_at(),
            filled,
            "exact while the refresh point is the fresh one"
        );
        let early = entry
            .clone()
            .refreshing_from(filled + Duration::from_micros(5_000_700));
        assert!(early.filled_at() >= filled && early.filled_at() <= filled + ms);
        assert!(early.fresh_until() <= filled + ten && early.fresh_until() + ms >= filled + ten);
        assert!(early.stale_until() <= filled + ten * 7);
        assert_eq!(
            early.freshness(filled + Duration::from_micros(5_000_699)),
            Freshness::Fresh
        );
        assert_eq!(
            early.freshness(filled + Duration::from_micros(5_000_700)),
            Freshness::Early
        );
        assert_eq!(early.freshness(filled + ten), Freshness::Stale);
        assert!(early.fail_safe(filled + ten * 8 - ms) && !early.fail_safe(filled + ten * 8));
        // Capped before the fill (a fill time ahead of this clock): nothing servable past it,
        // and still the last good value.
        let capped = entry.clone().capped(now);
        assert_eq!(capped.freshness(now), Freshness::Expired);
        assert!(!capped.servable(now) && capped.fail_safe(now));
        assert_eq!(capped.freshness(now - ms), Freshness::Fresh);
        // Capped inside the stale window: every deadline at the cap or earlier, the fill kept.
        let cap = filled + ten * 2 + Duration::from_micros(400);
        let capped = entry.clone().capped(cap);
        assert!(capped.filled_at() >= filled && capped.filled_at() <= filled + ms);
        assert_eq!(
            capped.fresh_until(),
            capped.at(capped.fresh_until).instant()
        );
        assert!(capped.servable(cap - ms) && !capped.servable(cap));
        assert!(capped.fail_safe(cap) && capped.fail_safe(filled + ten * 8 - ms));
        assert!(
            !capped.fail_safe(filled + ten * 8),
            "its own fail-safe deadline"
        );
        // Throttled: fresh again until the throttle ends, within the fail-safe window.
        let at = filled + ten * 7 + Duration::from_micros(123);
        let throttled = entry.throttled(at, Duration::from_secs(2));
        assert_eq!(throttled.freshness(at), Freshness::Fresh);
        assert_eq!(
            throttled.freshness(at + Duration::from_secs(2)),
            Freshness::Expired
        );
        assert!(throttled.fail_safe(at + Duration::from_secs(2) - ms));
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
