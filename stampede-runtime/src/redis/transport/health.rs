//! The health of one configured Redis: failures in a row, the cool-down they trigger (Redis is
//! skipped meanwhile, and the caches load locally), and warnings at most once per interval.
//! A refusal (a wrong password, an ACL's `NOPERM`, a certificate, see `refusal`) is logged at
//! error level the first time it happens to this connection (once per kind: the settings that
//! cause it cannot change without a new `RedisConfig`), then warned about with other failures,
//! and counted each time in `redis_auth_failures_total`.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::redis::transport::config::RedisConfig;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::refusal;

/// The least time between two warnings that Redis is failing.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The metrics of one connection, labelled with its name.
pub(in crate::redis) struct ConnectionMetrics {
    /// `redis_error_total`: failed calls.
    errors: metrics::Counter,
    /// `cache_degraded`: 1 while the connection is skipped.
    degraded: metrics::Gauge,
}

/// Failures in a row, the cool-down they trigger, and warnings at most once per interval.
pub(in crate::redis) struct Health {
    failures: AtomicU32,
    /// The kinds of refusal logged at error level already, one bit each.
    refusals_logged: AtomicU8,
    state: Mutex<HealthState>,
    metrics: ConnectionMetrics,
}

#[derive(Default)]
struct HealthState {
    skip_until: Option<Instant>,
    last_warning: Option<Instant>,
    down: bool,
}

impl Health {
    /// The health of the connection named `name` (empty: the default one).
    pub(in crate::redis) fn new(name: &str) -> Self {
        let label = [("redis", display_name(name).to_owned())];
        Health {
            failures: AtomicU32::new(0),
            refusals_logged: AtomicU8::new(0),
            state: Mutex::new(HealthState::default()),
            metrics: ConnectionMetrics {
                errors: metrics::counter!("redis_error_total", &label),
                degraded: metrics::gauge!("cache_degraded", &label),
            },
        }
    }

    pub(in crate::redis) fn usable(&self) -> bool {
        let state = self.lock();
        state.skip_until.is_none_or(|until| Instant::now() >= until)
    }

    pub(in crate::redis) fn success(&self, name: &str) {
        self.failures.store(0, Ordering::Relaxed);
        let mut state = self.lock();
        if state.down {
            state.down = false;
            state.skip_until = None;
            self.metrics.degraded.set(0.0);
            tracing::info!(
                redis = display_name(name),
                "stampede: Redis answers again; caches use it again"
            );
        }
    }

    pub(in crate::redis) fn failure(&self, name: &str, failure: &Failure, config: &RedisConfig) {
        if matches!(failure, Failure::CoolingDown) {
            return;
        }
        self.note_refusal(name, failure, config);
        // Not reset by the cool-down: a failed probe after it starts the next cool-down at once.
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        self.metrics.errors.increment(1);
        let now = Instant::now();
        let mut state = self.lock();
        if failures >= config.failures_before_cooldown {
            state.skip_until = Some(after(now, config.cooldown));
            state.down = true;
            self.metrics.degraded.set(1.0);
        }
        drop(state);
        if self.warn_now() {
            tracing::warn!(
                redis = display_name(name),
                error = %failure,
                failures,
                "stampede: Redis call failed; caches fall back to local singleflight and their own loads"
            );
        }
    }

    /// A call refused because of its key: the server answers, so the connection is not down.
    pub(in crate::redis) fn refused(&self, name: &str, failure: &Failure) {
        self.success(name);
        self.metrics.errors.increment(1);
        if self.warn_now() {
            tracing::warn!(
                redis = display_name(name),
                error = %failure,
                "stampede: Redis refused a call about one key; that key is loaded locally"
            );
        }
    }

    /// Counts a refusal, and logs the first of its kind at error level.
    fn note_refusal(&self, name: &str, failure: &Failure, config: &RedisConfig) {
        let Some(refusal) = refusal::of(failure) else {
            return;
        };
        static DESCRIBED: std::sync::Once = std::sync::Once::new();
        DESCRIBED.call_once(|| {
            metrics::describe_counter!(
                "redis_auth_failures_total",
                "Calls and connections Redis refused: credentials, ACL permission or certificate"
            );
        });
        metrics::counter!(
            "redis_auth_failures_total",
            "redis" => display_name(name).to_owned(),
            "reason" => refusal.reason(),
        )
        .increment(1);
        let bit = 1 << refusal as u8;
        if self.refusals_logged.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            tracing::error!(
                redis = display_name(name),
                reason = refusal.reason(),
                error = %failure,
                "stampede: {}; caches load in this process until it is fixed",
                refusal.fix(&config.prefix)
            );
        }
    }

    /// Whether a warning may be logged now: at most one per interval, whatever it is about.
    pub(in crate::redis) fn warn_now(&self) -> bool {
        let now = Instant::now();
        let mut state = self.lock();
        let due = state
            .last_warning
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY);
        if due {
            state.last_warning = Some(now);
        }
        due
    }

    fn lock(&self) -> MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(in crate::redis) fn display_name(name: &str) -> &str {
    if name.is_empty() { "default" } else { name }
}
