//! What a cache counts. Each event bumps an atomic (read by [`stats`](fn@crate::stats)) and the
//! matching handle of the `metrics` facade, registered once per cache so that recording costs
//! no allocation and no lookup: a no-op when no recorder is installed, an atomic add when one is.
//!
//! Metric handles are taken when a cache is first called: install the metrics recorder (the
//! exporter) before that, as one does at the start of `main`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, SharedString};

use crate::config::{Backend, Config};

/// One counted event: the stats' atomic and the metric.
pub(crate) struct Count {
    value: AtomicU64,
    metric: Counter,
}

impl Count {
    pub(crate) fn new(name: &'static str, labels: &Labels) -> Self {
        Count {
            value: AtomicU64::new(0),
            metric: metrics::counter!(name, labels.cache()),
        }
    }

    /// Records one event and returns how many there were before it.
    #[inline]
    pub(crate) fn bump(&self) -> u64 {
        self.metric.increment(1);
        self.value.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A counted event as frequent as a hit: the count is split over cache-line-sized cells, one
/// per thread that holds a [`Claim`] and one that the threads past them share, so that tasks on
/// different cores never contend on one cache line, and a thread with a cell of its own adds
/// with a plain load and store rather than an atomic add (whose locked instruction was a third
/// of a hit's lookup, issue 38); reading the total sums them (exact, as the other counters are).
pub(crate) struct StripedCount {
    stripes: Box<[Stripe; CLAIMS + 1]>,
    metric: Counter,
}

/// How many threads at once may hold a cell of their own.
const CLAIMS: usize = 16;

/// One cell of a [`StripedCount`], alone on its cache line (two lines: adjacent-line prefetch).
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// Which cells are held, by index.
static CLAIMED: [AtomicBool; CLAIMS] = [const { AtomicBool::new(false) }; CLAIMS];

/// A thread's claim on one cell index of every [`StripedCount`], taken when it first counts and
/// given back when it ends: while held, no other thread writes those cells. `None` when every
/// index was held: the thread adds to the shared cell.
struct Claim(Option<usize>);

impl Claim {
    fn take() -> Claim {
        Claim((0..CLAIMS).find(|&at| {
            CLAIMED[at]
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Release: the next holder's loads see this thread's last stores to the cells.
        if let Some(at) = self.0 {
            CLAIMED[at].store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static CLAIM: Claim = Claim::take();
}

impl StripedCount {
    pub(crate) fn new(name: &'static str, labels: &Labels) -> Self {
        StripedCount {
            stripes: Box::default(),
            metric: metrics::counter!(name, labels.cache()),
        }
    }

    /// Records one event and returns how many this thread's cell had before it: a count that
    /// grows by one per event of the threads sharing the cell, which is what sampling 1 in N
    /// needs.
    #[inline]
    pub(crate) fn bump(&self) -> u64 {
        self.metric.increment(1);
        match CLAIM.try_with(|claim| claim.0) {
            Ok(Some(at)) => {
                // This thread is the cell's one writer: no other add can fall between the two.
                let cell = &self.stripes[at].0;
                let before = cell.load(Ordering::Relaxed);
                cell.store(before + 1, Ordering::Relaxed);
                before
            }
            // No cell of its own, or the thread is ending.
            _ => self.stripes[CLAIMS].0.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// A level that goes up and down (callers waiting, loads running); the handle is released on
/// drop, so a cancelled waiter or a dropped load never leaves it high.
pub(crate) struct Level {
    value: AtomicU64,
    metric: Gauge,
}

impl Level {
    fn new(name: &'static str, labels: &Labels) -> Self {
        Level {
            value: AtomicU64::new(0),
            metric: metrics::gauge!(name, labels.cache()),
        }
    }

    pub(crate) fn raise(&self) -> Raised<'_> {
        self.value.fetch_add(1, Ordering::Relaxed);
        self.metric.increment(1.0);
        Raised(self)
    }

    pub(crate) fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// One unit of a [`Level`], given back on drop.
pub(crate) struct Raised<'a>(&'a Level);

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.value.fetch_sub(1, Ordering::Relaxed);
        self.0.metric.decrement(1.0);
    }
}

/// Why a load ran, as the `reason` label and span field say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// No servable value: callers wait for it.
    Miss,
    /// A stale value was served; this refreshes it in the background.
    Stale,
    /// A fresh value older than `refresh_after` was served; this refreshes it in the background.
    Early,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Miss => "miss",
            Reason::Stale => "stale",
            Reason::Early => "early",
        }
    }
}

/// The counters, levels and timings of one cache.
pub(crate) struct Telemetry {
    /// Counted on every memory hit, from every core: striped.
    pub(crate) hits: StripedCount,
    pub(crate) misses: Count,
    pub(crate) stale_served: Count,
    pub(crate) loads: Count,
    pub(crate) load_errors: Count,
    pub(crate) timeouts: Count,
    /// Background refreshes, stale and early; `cache_refresh_total{reason}` counts each reason.
    pub(crate) refreshes: AtomicU64,
    pub(crate) shared: Count,
    pub(crate) fail_safe_served: Count,
    /// Values read from a shared tier because this process had none.
    pub(crate) remote_hits: Count,
    /// Values not stored, in memory or in the shared tier, because the one stored has a newer
    /// source version.
    pub(crate) older_versions: Count,
    /// Loads that waited for a free load (`max_loads`), and those that found none.
    pub(crate) loads_queued: Count,
    pub(crate) loads_refused: Count,
    miss_loads: Counter,
    stale_loads: Counter,
    early_loads: Counter,
    pub(crate) waiters: Level,
    pub(crate) in_flight: Level,
    load_duration: Histogram,
    /// `cache_key_age_seconds`: the age of values served from memory, one hit in 64.
    pub(crate) key_age: Histogram,
}

impl Telemetry {
    pub(crate) fn new(config: &Config) -> Self {
        let labels = Labels::new(config);
        Telemetry {
            hits: StripedCount::new("cache_hit_total", &labels),
            misses: Count::new("cache_miss_total", &labels),
            stale_served: Count::new("cache_stale_served_total", &labels),
            loads: Count::new("cache_load_total", &labels),
            load_errors: Count::new("cache_refresh_error_total", &labels),
            timeouts: Count::new("cache_refresh_timeout_total", &labels),
            refreshes: AtomicU64::new(0),
            shared: Count::new("singleflight_shared_result_total", &labels),
            fail_safe_served: Count::new("cache_fail_safe_served_total", &labels),
            remote_hits: Count::new("cache_remote_hit_total", &labels),
            older_versions: Count::new("cache_older_version_total", &labels),
            loads_queued: Count::new("cache_load_queued_total", &labels),
            loads_refused: Count::new("cache_load_refused_total", &labels),
            miss_loads: metrics::counter!("cache_refresh_total", labels.with_reason(Reason::Miss)),
            stale_loads: metrics::counter!(
                "cache_refresh_total",
                labels.with_reason(Reason::Stale)
            ),
            early_loads: metrics::counter!(
                "cache_refresh_total",
                labels.with_reason(Reason::Early)
            ),
            waiters: Level::new("singleflight_waiters", &labels),
            in_flight: Level::new("inflight_refresh_count", &labels),
            load_duration: metrics::histogram!("cache_refresh_duration_seconds", labels.cache()),
            key_age: metrics::histogram!("cache_key_age_seconds", labels.cache()),
        }
    }

    /// A load started for this reason (its first attempt).
    pub(crate) fn load_started(&self, reason: Reason) {
        let metric = match reason {
            Reason::Miss => &self.miss_loads,
            Reason::Stale => &self.stale_loads,
            Reason::Early => &self.early_loads,
        };
        metric.increment(1);
        if !matches!(reason, Reason::Miss) {
            self.refreshes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How long a load took, every attempt included.
    pub(crate) fn load_took(&self, duration: Duration) {
        self.load_duration.record(duration);
    }
}

/// The labels every metric of a cache carries.
pub(crate) struct Labels {
    cache: SharedString,
    backend: &'static str,
}

impl Labels {
    pub(crate) fn new(config: &Config) -> Self {
        Labels {
            cache: SharedString::from(config.name.clone()),
            backend: match config.backend {
                Backend::Memory => "memory",
                Backend::Tiered => "tiered",
                Backend::Redis => "redis",
            },
        }
    }

    pub(crate) fn cache(&self) -> Vec<Label> {
        vec![
            Label::new("cache", self.cache.clone()),
            Label::new("backend", self.backend),
        ]
    }

    fn with_reason(&self, reason: Reason) -> Vec<Label> {
        let mut labels = self.cache();
        labels.push(Label::new("reason", reason.as_str()));
        labels
    }
}

/// Describes every metric to the recorder (units and help texts), so that exporters show them.
/// Called once, when the first cache is built.
pub(crate) fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "cache_hit_total",
        "Calls answered with a fresh value from memory"
    );
    describe_counter!(
        "cache_miss_total",
        "Calls that found no servable value in memory"
    );
    describe_counter!(
        "cache_stale_served_total",
        "Calls answered with a stale value while a refresh ran"
    );
    describe_counter!(
        "cache_load_total",
        "Times a cached function's body ran (each retry counts)"
    );
    describe_counter!(
        "cache_refresh_total",
        "Loads started, by reason: a miss, a stale value to refresh, or an early refresh"
    );
    describe_counter!(
        "cache_refresh_error_total",
        "Load attempts that failed, panicked or timed out"
    );
    describe_counter!(
        "cache_refresh_timeout_total",
        "Load attempts that ran past the timeout"
    );
    describe_gauge!(
        "cache_breaker_open",
        "1 while the cache's circuit breaker skips loads (breaker = N)"
    );
    describe_counter!(
        "cache_fail_safe_served_total",
        "Failed loads answered with the last good value (fail_safe)"
    );
    describe_counter!(
        "cache_remote_hit_total",
        "Values read from the shared tier (Redis) because this process had none"
    );
    describe_counter!(
        "singleflight_shared_result_total",
        "Callers that joined a load another caller had started"
    );
    describe_gauge!("singleflight_waiters", "Callers waiting for a load now");
    describe_gauge!("inflight_refresh_count", "Loads running now");
    describe_histogram!(
        "cache_key_age_seconds",
        Unit::Seconds,
        "Age of the values served from memory (one hit in 64): alert when data gets old"
    );
    describe_histogram!(
        "cache_refresh_duration_seconds",
        Unit::Seconds,
        "How long a load took, retries included"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads with a cell of their own add without an atomic add; the count stays exact with
    /// more threads counting at once than there are cells, and when ended threads' cells are
    /// taken by new ones.
    #[test]
    fn a_striped_count_is_exact_whatever_the_threads() {
        let count = StripedCount {
            stripes: Box::default(),
            metric: Counter::noop(),
        };
        let (waves, threads, adds) = (3, 2 * CLAIMS + 3, 20_000);
        for _ in 0..waves {
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(|| {
                        for _ in 0..adds {
                            count.bump();
                        }
                    });
                }
            });
        }
        assert_eq!(count.get(), (waves * threads * adds) as u64);
    }
}
