//! The clock an entry's deadlines are kept on, and the cheap reading a hit makes of it.
//!
//! Deadlines are [`Nanos`]: tokio's clock in nanoseconds, 8 bytes where an `Instant` takes 16.
//! A hit reads [`latest`], the latest the clock may read now, and serves its entry when the
//! entry's deadline is after that: surely still ahead. On Linux, when
//! tokio's clock cannot be paused, that reads the kernel's coarse monotonic clock (a value the
//! kernel keeps, about 7ns to read, against 28ns for the exact clock on a 2-core VM) and allows
//! for its lag: it moves once per kernel tick, one to two ticks behind the exact clock (4 to 8ms
//! at 250Hz on that VM), and when the tick that updates it is late the kernel lets it fall
//! behind by up to five ticks before another CPU updates it (18ms measured with more busy
//! threads than cores). [`LAG_TICKS`] ticks are allowed: only a hit within that of its deadline
//! (40ms at 250Hz) reads the exact clock (issue 14). A VM whose every CPU was stopped by its
//! host may see a larger lag for the first microseconds after it resumes.
//!
//! When tokio is built with `test-util` (any build whose tests pause time), every reading is
//! tokio's own `Instant::now()`, so a paused clock drives freshness as it drives timers.

use std::sync::LazyLock;
use std::time::Duration;

use tokio::time::Instant;

/// A point on tokio's clock: nanoseconds from a base chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Nanos(u64);

/// An instant of tokio's clock and the same instant as [`Nanos`]: every conversion goes
/// through it.
#[derive(Debug)]
struct Base {
    instant: Instant,
    nanos: u64,
    /// What a hit adds to the coarse clock's reading (the kernel's monotonic clock, in
    /// nanoseconds) to compare it with a deadline: [`HEADROOM`], and how far behind the exact
    /// clock the reading may be. `None`: no coarse reading (read tokio's clock).
    coarse_offset: Option<u64>,
}

static BASE: LazyLock<Base> = LazyLock::new(Base::new);

/// Where the base sits on the scale of [`Nanos`]: instants up to 146 years before it convert
/// without saturating. The kernel's monotonic clock counts from boot, and an instant before
/// boot is real: a value another process wrote in Redis an hour ago, read by a process whose
/// machine booted ten minutes ago, was filled before this machine's clock began.
const HEADROOM: u64 = 1 << 62;

impl Base {
    fn new() -> Self {
        let instant = Instant::now();
        match coarse::tick() {
            // The kernel's monotonic clock is the one `Instant` reads: read it right after
            // `instant`, it is the same point, some tens of nanoseconds late.
            Some(tick) if !tokio_clock_is_pausable() => {
                Base::coarse(instant, coarse::exact(), tick)
            }
            _ => Base {
                instant,
                nanos: HEADROOM,
                coarse_offset: None,
            },
        }
    }

    /// A base read on the coarse clock's scale: `instant` is `exact` on the exact clock.
    fn coarse(instant: Instant, exact: u64, tick: u64) -> Self {
        Base {
            instant,
            nanos: HEADROOM + exact,
            coarse_offset: Some(HEADROOM + LAG_TICKS * tick + MARGIN.as_nanos() as u64),
        }
    }

    /// `instant` on the scale of [`Nanos`] (saturated at its ends, which no real instant
    /// reaches).
    fn nanos_of(&self, instant: Instant) -> u64 {
        if instant >= self.instant {
            self.nanos
                .saturating_add(nanos(instant.duration_since(self.instant)))
        } else {
            self.nanos
                .saturating_sub(nanos(self.instant.duration_since(instant)))
        }
    }

    /// The instant `nanos` is on tokio's clock.
    fn instant_of(&self, nanos: u64) -> Instant {
        if nanos >= self.nanos {
            after(self.instant, Duration::from_nanos(nanos - self.nanos))
        } else {
            let before = Duration::from_nanos(self.nanos - nanos);
            self.instant.checked_sub(before).unwrap_or(self.instant)
        }
    }
}

/// How many kernel ticks the coarse clock is taken to lag the exact one by, at most.
const LAG_TICKS: u64 = 10;

/// Covers the time between the base's two readings, many times over.
const MARGIN: Duration = Duration::from_micros(10);

impl Nanos {
    /// Before every moment on this clock: a read not known (see `entry::LeanRead`).
    pub(crate) const EARLIEST: Nanos = Nanos(0);

    /// `instant` on this clock.
    pub(crate) fn of(instant: Instant) -> Self {
        Nanos(BASE.nanos_of(instant))
    }

    /// The instant this is on tokio's clock.
    pub(crate) fn instant(self) -> Instant {
        BASE.instant_of(self.0)
    }

    /// The time from `earlier` to this, zero if `earlier` is later.
    #[inline]
    pub(crate) fn since(self, earlier: Nanos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// This, `nanos` later (saturated).
    #[inline]
    pub(crate) fn plus(self, nanos: u64) -> Nanos {
        Nanos(self.0.saturating_add(nanos))
    }

    /// The point `nanos` before `point`.
    #[inline]
    pub(crate) fn before(point: Nanos, nanos: u64) -> Nanos {
        Nanos(point.0.saturating_sub(nanos))
    }
}

/// The latest tokio's clock may read now: the coarse reading and its lag, or the exact one. A
/// deadline after it is surely still ahead; one before it may be too, within the coarse clock's
/// lag: the caller then reads the exact clock.
#[inline]
pub(crate) fn latest() -> Nanos {
    match BASE.coarse_offset {
        Some(offset) => Nanos(coarse::now() + offset),
        None => Nanos::of(Instant::now()),
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether tokio was built with its `test-util` feature, under which a test may pause its
/// clock. Decided by the compiler: `Builder::start_paused` exists only with that feature, and
/// an inherent method is chosen over a trait's method of the same name, so the closure below
/// returns `&mut Builder` with the feature and `NoPause` without. Nothing is built or run.
fn tokio_clock_is_pausable() -> bool {
    use tokio::runtime::Builder;

    // Unused when tokio has `test-util`: that is the point.
    #[allow(dead_code)]
    struct NoPause;
    #[allow(dead_code)]
    trait StartPaused {
        fn start_paused(&mut self, paused: bool) -> NoPause;
    }
    impl StartPaused for Builder {
        fn start_paused(&mut self, _: bool) -> NoPause {
            NoPause
        }
    }
    trait Pausable {
        const PAUSABLE: bool;
    }
    impl Pausable for NoPause {
        const PAUSABLE: bool = false;
    }
    impl Pausable for &mut Builder {
        const PAUSABLE: bool = true;
    }
    fn answer<R: Pausable>(_: fn(&'static mut Builder) -> R) -> bool {
        R::PAUSABLE
    }
    answer(|builder| builder.start_paused(false))
}

#[cfg(target_os = "linux")]
mod coarse {
    /// The kernel's coarse monotonic clock, in nanoseconds.
    #[inline]
    pub(super) fn now() -> u64 {
        read(libc::CLOCK_MONOTONIC_COARSE)
    }

    /// The exact monotonic clock (`Instant`'s), in nanoseconds.
    pub(super) fn exact() -> u64 {
        read(libc::CLOCK_MONOTONIC)
    }

    /// The coarse clock's resolution: one kernel tick. `None` if the kernel has no coarse
    /// clock.
    pub(super) fn tick() -> Option<u64> {
        let mut resolution = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `resolution` is a valid, writable timespec.
        let status = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut resolution) };
        (status == 0).then(|| to_nanos(&resolution))
    }

    fn read(clock: libc::clockid_t) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec; a monotonic clock always exists on
        // Linux, so the call cannot fail.
        unsafe { libc::clock_gettime(clock, &mut now) };
        to_nanos(&now)
    }

    fn to_nanos(time: &libc::timespec) -> u64 {
        (time.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(time.tv_nsec as u64)
    }
}

#[cfg(not(target_os = "linux"))]
mod coarse {
    pub(super) fn now() -> u64 {
        unreachable!("no coarse clock: `tick` is None")
    }

    pub(super) fn exact() -> u64 {
        unreachable!("no coarse clock: `tick` is None")
    }

    pub(super) fn tick() -> Option<u64> {
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tests_build_of_tokio_is_pausable() {
        // This crate's tests turn on tokio's `test-util`; the benches' build does not.
        assert!(tokio_clock_is_pausable());
        assert_eq!(BASE.coarse_offset, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_moves_the_reading() {
        let deadline = Nanos::of(Instant::now() + Duration::from_secs(10));
        assert!(latest() < deadline);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(latest() >= deadline);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_coarse_clock_lags_the_exact_one_by_less_than_the_ticks_allowed() {
        let lag = LAG_TICKS * coarse::tick().expect("Linux has a coarse monotonic clock");
        for _ in 0..10_000 {
            let exact = coarse::exact();
            let coarse = coarse::now();
            assert!(coarse + lag >= exact, "{coarse} + {lag} < {exact}");
            assert!(coarse <= coarse::exact());
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn on_the_coarse_scale_an_instant_before_boot_converts_both_ways() {
        // The base of a build without `test-util`, whose scale follows the kernel's clock.
        let base = Base::coarse(Instant::now(), coarse::exact(), coarse::tick().unwrap());
        let year = Duration::from_secs(365 * 86_400);
        if let Some(before_boot) = base.instant.checked_sub(year) {
            assert_eq!(base.instant_of(base.nanos_of(before_boot)), before_boot);
            assert_eq!(
                base.nanos_of(base.instant) - base.nanos_of(before_boot),
                nanos(year)
            );
        }
        // A deadline is compared with the coarse reading on the same scale.
        let offset = base.coarse_offset.unwrap();
        let in_a_second = base.nanos_of(base.instant + Duration::from_secs(1));
        assert!(coarse::now() + offset < in_a_second);
        assert!(coarse::now() + offset >= base.nanos_of(base.instant));
    }

    #[test]
    fn instants_convert_both_ways_around_the_base() {
        let base = BASE.instant;
        for instant in [
            base,
            base + Duration::from_nanos(1),
            base + Duration::from_secs(86_400),
            base.checked_sub(Duration::from_secs(1)).unwrap_or(base),
        ] {
            assert_eq!(Nanos::of(instant).instant(), instant);
        }
        let (one, two) = (Nanos::of(base), Nanos::of(base + Duration::from_millis(3)));
        assert_eq!(two.since(one), 3_000_000);
        assert_eq!(one.since(two), 0);
        assert_eq!(one.plus(3_000_000), two);
    }
}
