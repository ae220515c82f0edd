//! An upstream circuit breaker per cache (`breaker = N`): after N consecutive failed loads of
//! the cache (any key), loads are skipped for `breaker_cooldown`: a call that would load gets
//! its fail-safe value if there is one, else [`Error::CircuitOpen`] at once, and the source is
//! not called. After the cool-down one probe load decides: success closes the breaker, failure
//! opens it again.
//!
//! Only loads count: a value read from another process, a busy lock or a stale value served
//! say nothing of the source. Every load holds a [`Ticket`] from [`Breaker::admit`] and gives
//! its verdict through it; a probe whose ticket is dropped without one (its caller was
//! cancelled, its runtime shut down) lets the next load probe, so the breaker never stays in
//! the probing state.

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
    state: Arc<Mutex<State>>,
    /// `cache_breaker_open`: 1 while loads are skipped, 0 from the end of the cool-down on.
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

/// A load's right to run, and the way it reports how it went: [`Ticket::verdict`].
pub(crate) struct Ticket<'a> {
    breaker: &'a Breaker,
    /// This load is the probe after a cool-down.
    probe: bool,
    settled: bool,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration, open: metrics::Gauge) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown,
            failures: AtomicU32::new(0),
            state: Arc::new(Mutex::new(State::Closed)),
            open,
        }
    }

    /// A ticket for a load that may run now; `Err(CircuitOpen)` while the breaker is open, and
    /// while the probe after the cool-down runs.
    pub(crate) fn admit(&self, cache: &Arc<str>) -> Result<Ticket<'_>, Error> {
        let mut state = self.state();
        let now = Instant::now();
        let probe = match *state {
            State::Closed => false,
            State::Open { until } if now >= until => {
                *state = State::Probing;
                true
            }
            State::Open { until } => {
                return Err(Error::CircuitOpen {
                    cache: cache.clone(),
                    retry_in: until.saturating_duration_since(now),
                });
            }
            State::Probing => {
                return Err(Error::CircuitOpen {
                    cache: cache.clone(),
                    retry_in: Duration::ZERO,
                });
            }
        };
        Ok(Ticket {
            breaker: self,
            probe,
            settled: false,
        })
    }

    /// Whether loads are skipped now: open and cooling down, or probing.
    pub(crate) fn is_open(&self) -> bool {
        match *self.state() {
            State::Closed => false,
            State::Open { until } => Instant::now() < until,
            State::Probing => true,
        }
    }

    /// Whether a probe load runs now (for the simulation's check that none is left behind).
    #[cfg(feature = "simulation")]
    pub(crate) fn probing(&self) -> bool {
        *self.state() == State::Probing
    }

    /// A load succeeded: the breaker closes.
    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        let mut state = self.state();
        if *state != State::Closed {
            *state = State::Closed;
            self.open.set(0.0);
        }
    }

    /// A load failed (every attempt): the breaker opens at the threshold, or again after a
    /// failed probe.
    fn failed(&self, probe: bool) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let mut state = self.state();
        if failures >= self.threshold || probe {
            let until = after(Instant::now(), self.cooldown);
            *state = State::Open { until };
            drop(state);
            self.open.set(1.0);
            self.close_gauge_at(until);
        }
    }

    /// The probe ended without a verdict: the next load probes instead.
    fn abandoned(&self) {
        let mut state = self.state();
        if *state == State::Probing {
            *state = State::Open {
                until: Instant::now(),
            };
            drop(state);
            self.open.set(0.0);
        }
    }

    /// Sets the gauge back to 0 when the cool-down ends, if the breaker has not opened again
    /// since: a cache nobody calls does not read open forever. Outside a runtime the gauge is
    /// set by the next load instead.
    fn close_gauge_at(&self, until: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (state, open) = (Arc::downgrade(&self.state), self.open.clone());
        runtime.spawn(async move {
            tokio::time::sleep_until(until).await;
            let Some(state) = state.upgrade() else {
                return;
            };
            if *state.lock().unwrap_or_else(PoisonError::into_inner) == (State::Open { until }) {
                open.set(0.0);
            }
        });
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ticket<'_> {
    /// Reports how the load went: `true` if it got a value.
    pub(crate) fn verdict(mut self, succeeded: bool) {
        self.settled = true;
        if succeeded {
            self.breaker.succeeded();
        } else {
            self.breaker.failed(self.probe);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.probe && !self.settled {
            self.breaker.abandoned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(threshold: u32) -> Breaker {
        Breaker::new(threshold, Duration::from_secs(30), metrics::Gauge::noop())
    }

    fn name() -> Arc<str> {
        Arc::from("breaker::unit")
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_without_a_verdict_lets_the_next_load_probe() {
        let breaker = breaker(1);
        breaker.admit(&name()).unwrap().verdict(false);
        assert!(breaker.admit(&name()).is_err(), "open");
        tokio::time::advance(Duration::from_secs(31)).await;
        let probe = breaker.admit(&name()).unwrap();
        assert!(breaker.admit(&name()).is_err(), "one probe at a time");
        drop(probe); // its caller was cancelled
        let next = breaker.admit(&name());
        assert!(
            next.is_ok(),
            "the next load probes: the breaker is not stuck"
        );
        next.unwrap().verdict(true);
        assert!(!breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_reads_closed_once_its_cooldown_has_passed() {
        let breaker = breaker(2);
        for _ in 0..2 {
            breaker.admit(&name()).unwrap().verdict(false);
        }
        assert!(breaker.is_open());
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(!breaker.is_open(), "past the cool-down, nobody called");
    }
}
