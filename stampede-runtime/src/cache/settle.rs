//! What the callers of a flight get, from what its tier reported: the core's one place for
//! stale-if-error, fail-safe and its throttle, a busy lock, and the counters and span outcome of
//! each, the same for every tier and backend. (The breaker's accounting is the load's own, in
//! `tier::Handle::load`: only loads say anything of the source.)

use tokio::time::Instant;

use super::Cache;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::Load;
use crate::tier::{Fetched, Handle, Tier};

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// The answer to the flight's callers, and the refresh span's `outcome`.
    pub(super) fn settle<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        fetched: Fetched<V>,
    ) -> (Result<V, Error>, &'static str) {
        let core = &self.core;
        match fetched {
            Fetched::Loaded(value) => (Ok(value), "ok"),
            Fetched::Read(value) => {
                core.telemetry.remote_hits.bump();
                (Ok(value), "read")
            }
            Fetched::Busy => {
                let busy = Error::LockBusy {
                    cache: core.config.name.clone(),
                };
                (Err(busy), "busy")
            }
            Fetched::Failed(error) => match handle.served_at(Instant::now()) {
                // Stale-if-error: the waiters keep the stale value they were served.
                Some(stale) => (Ok(stale), "stale"),
                None => match self.fail_safe(handle, error) {
                    Ok(value) => (Ok(value), "fail_safe"),
                    Err(error) => {
                        let outcome = outcome_name(&error);
                        (Err(error), outcome)
                    }
                },
            },
        }
    }

    /// What a failed load gives its callers: with `fail_safe`, the key's last good value
    /// (unless the key was invalidated since the flight began), kept for the throttle where
    /// values live in memory; else `error`.
    fn fail_safe<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        error: Error,
    ) -> Result<V, Error> {
        let config = &self.core.config;
        if config.fail_safe.is_none() {
            return Err(error);
        }
        let now = Instant::now();
        let Some(last_good) = handle.last_good_at(now) else {
            return Err(error);
        };
        if !handle.keep_throttled(last_good.clone(), now) {
            return Err(error); // invalidated meanwhile: the last good value is no good
        }
        self.core.telemetry.fail_safe_served.bump();
        tracing::debug!(cache = %config.name, %error, "stampede: a load failed; serving the last good value");
        Ok(last_good.value)
    }
}

/// The `outcome` field of a refresh span whose callers get an error.
fn outcome_name(error: &Error) -> &'static str {
    match error {
        Error::Timeout { .. } => "timeout",
        Error::LoadPanicked { .. } => "panic",
        Error::CircuitOpen { .. } => "circuit_open",
        _ => "error",
    }
}
