//! An upstream circuit breaker per cache (`breaker = N`): after N consecutive failed loads of
//! the cache (any key), loads are skipped for `breaker_cooldown`: a call that would load gets
//! its fail-safe value if there is one, else [`Error::CircuitOpen`] at once, and the source is
//! not called. After the cool-down one probe load decides: success closes the breaker, failure
//! opens it again.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::error::Error;

pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    failures: AtomicU32,
    state: Mutex<State>,
    open: metrics::Gauge,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    /// The cool-down is over and one probe load runs.
    Probing,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration, open: metrics::Gauge) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            failures: AtomicU32::new(0),
            state: Mutex::new(State::Closed),
            open,
        }
    }

    /// Whether a load may run now: `Err(CircuitOpen)` while the breaker is open, and while the
    /// probe after the cool-down runs.
    pub(crate) fn admit(&self, cache: &Arc<str>) -> Result<(), Error> {
        let mut state = self.state();
        match *state {
            State::Closed => Ok(()),
            State::Open { until } if Instant::now() >= until => {
                *state = State::Probing;
                Ok(())
            }
            State::Open { until } => Err(Error::CircuitOpen {
                cache: cache.clone(),
                retry_in: until.saturating_duration_since(Instant::now()),
            }),
            State::Probing => Err(Error::CircuitOpen {
                cache: cache.clone(),
                retry_in: Duration::ZERO,
            }),
        }
    }

    /// A load succeeded: the breaker closes.
    pub(crate) fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        let mut state = self.state();
        if *state != State::Closed {
            *state = State::Closed;
            self.open.set(0.0);
        }
    }

    /// A load failed (every attempt): the breaker opens at the threshold, or again after a
    /// failed probe.
    pub(crate) fn failed(&self) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let mut state = self.state();
        if failures >= self.threshold || *state == State::Probing {
            *state = State::Open {
                until: after(Instant::now(), self.cooldown),
            };
            self.open.set(1.0);
        }
    }

    /// Whether the breaker is open (or probing) now.
    pub(crate) fn is_open(&self) -> bool {
        *self.state() != State::Closed
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
