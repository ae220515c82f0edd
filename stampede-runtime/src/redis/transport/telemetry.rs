//! What the Redis tier counts for each cache, next to the core's counters.

use std::sync::Once;
use std::time::Duration;

use metrics::Histogram;

use crate::config::Config;
use crate::stats::Stats;
use crate::telemetry::{Count, Labels};

pub(crate) struct RedisTelemetry {
    pub(crate) lock_acquired: Count,
    pub(crate) lock_busy: Count,
    pub(crate) degraded: Count,
    pub(crate) decode_errors: Count,
    lock_wait: Histogram,
}

impl RedisTelemetry {
    pub(crate) fn new(config: &Config) -> Self {
        static DESCRIBED: Once = Once::new();
        DESCRIBED.call_once(describe);
        let labels = Labels::new(config);
        RedisTelemetry {
            lock_acquired: Count::new("redis_lock_acquire_success_total", &labels),
            lock_busy: Count::new("redis_lock_acquire_fail_total", &labels),
            degraded: Count::new("cache_degraded_load_total", &labels),
            decode_errors: Count::new("cache_decode_error_total", &labels),
            lock_wait: metrics::histogram!("redis_lock_wait_duration_seconds", labels.cache()),
        }
    }

    /// How long a process waited for another's Redis lock.
    pub(crate) fn lock_waited(&self, duration: Duration) {
        self.lock_wait.record(duration);
    }

    pub(crate) fn add_to(&self, stats: &mut Stats) {
        stats.lock_acquired = self.lock_acquired.get();
        stats.lock_busy = self.lock_busy.get();
        stats.degraded = self.degraded.get();
        stats.decode_errors = self.decode_errors.get();
    }
}

/// Describes the Redis tier's metrics to the recorder, once.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "redis_lock_acquire_success_total",
        "Redis locks this process took to load a key"
    );
    describe_counter!(
        "redis_lock_acquire_fail_total",
        "Times a key's Redis lock was held by another process"
    );
    describe_counter!(
        "cache_degraded_load_total",
        "Loads that ran without Redis because it was down, slow or not configured"
    );
    describe_counter!(
        "cache_decode_error_total",
        "Values in Redis that did not decode"
    );
    describe_counter!("redis_error_total", "Failed Redis calls, by connection");
    describe_gauge!(
        "cache_degraded",
        "1 while a Redis connection is skipped after repeated failures"
    );
    describe_histogram!(
        "redis_lock_wait_duration_seconds",
        Unit::Seconds,
        "How long a process waited for another's Redis lock"
    );
}
