//! How a flight runs: with a leader, on the task of the caller that leads it while that caller
//! waits for it, and on a task of its own from the moment it stops waiting (so that no caller's
//! cancellation cancels it); a background refresh on a task of its own from the start; on the
//! caller's task with `lock = "none"`. What it does (`flight`); and its report settled by the
//! core (`settle`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use futures_util::FutureExt;
use tokio::runtime::Handle as Runtime;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::Cache;
use crate::entry::Freshness;
use crate::error::Error;
use crate::flight::Leader;
use crate::kv::{Key, Value};
use crate::load::Load;
use crate::tier::{Fetched, Handle, Run, Start, Tier};

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// Runs the leader's flight detached on the caller's runtime, so that cancelling the caller
    /// neither cancels the load nor strands the other waiters.
    pub(crate) fn spawn_load<L: Load<K, V>>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: L,
        start: Start,
    ) -> Result<(), Error> {
        self.running(leader, load, start).map(Running::detach)
    }

    /// The leader's flight, to be run on the leading caller's task ([`Running::beside`]) or
    /// detached. Its span follows from the span of the call that started it.
    pub(crate) fn running<L: Load<K, V>>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: L,
        start: Start,
    ) -> Result<Running, Error> {
        let core = &self.core;
        let runtime = Runtime::try_current().map_err(|_| Error::NoRuntime {
            cache: core.config.name.clone(),
        })?;
        let span = tracing::debug_span!(
            "stampede.refresh",
            cache = %core.config.name,
            key = ?leader.key(),
            reason = start.reason.as_str(),
            outcome = Empty,
            duration_ms = Empty,
        );
        // The caller's span (the request): the lookup span is never entered.
        span.follows_from(tracing::Span::current());
        let running = async move {
            // A refresh of a value being served waits for a turn in the process's budget; a
            // load for callers with no value never does.
            let _turn = match start.reason {
                crate::telemetry::Reason::Miss => None,
                _ => crate::budget::turn(leader.urgent().notified()).await,
            };
            let _running = core.telemetry.in_flight.raise();
            let started = Instant::now();
            let handle = Handle::new(core, leader.key(), &load, start, Some(&leader));
            let answer = self.flown(&handle).await;
            drop(handle); // it borrows the leader, which the answer goes through
            tracing::Span::current().record("duration_ms", started.elapsed().as_millis() as u64);
            leader.finish(answer);
        };
        Ok(Running {
            flight: Some(Box::pin(running.instrument(span))),
            runtime,
        })
    }

    /// A flight run on the caller's task (`lock = "none"`), settled as a detached one is.
    pub(crate) async fn run_here<L: Load<K, V>>(
        &self,
        key: &K,
        load: L,
        run: Run,
    ) -> Result<V, Error> {
        let handle = Handle::new(&self.core, key, &load, Start::miss(run), None);
        self.flown(&handle).await
    }

    /// The flight through `handle`, a panic in it included, and the answer the core makes of
    /// what it reports; the span's outcome says which.
    async fn flown<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Result<V, Error> {
        if let Some(value) = self.just_stored(handle) {
            tracing::Span::current().record("outcome", "ok");
            return Ok(value);
        }
        let fetched = AssertUnwindSafe(self.flight(handle))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Fetched::Failed(Error::panicked(&self.core.config.name, &*panic))
            });
        let (answer, outcome) = self.settle(handle, fetched);
        tracing::Span::current().record("outcome", outcome);
        answer
    }

    /// A fresh value that a load which finished between this caller's miss and its taking the
    /// lead has stored already: served instead of loading twice. Not for a refresh.
    pub(super) fn just_stored<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Option<V> {
        let core = &self.core;
        if handle.start().run != Run::Get || !core.config.in_memory() {
            return None;
        }
        let entry = core.entry(handle.key())?;
        (entry.freshness(Instant::now()) == Freshness::Fresh).then_some(entry.value)
    }

    /// What one flight does through the tier: gets the key's value. For a companion's
    /// `refresh` the same fetch loads it whatever is held: the handle marks the value held as
    /// the one replaced (`Handle::replacing`) and serves no stale value, so a shared tier loads
    /// the key (under its lock) or waits for another process's load begun since.
    async fn flight<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        self.tier.fetch(handle).await
    }
}

/// A key's flight, run on the task of the caller that leads it for as long as that caller waits
/// for it: a miss pays no hand-over to another task (its wake-up on another core) before its
/// first round trip, nor after its last. From the moment the caller stops waiting (its answer
/// came first, such as a stale value handed over while the refresh goes on; its soft timeout; or
/// the call was dropped), the rest runs on a task of its own, so that no caller's cancellation
/// cancels the load or strands the other waiters.
pub(crate) struct Running {
    flight: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    runtime: Runtime,
}

impl Running {
    /// Runs the flight on a task of its own.
    pub(crate) fn detach(self) {
        drop(self); // see `Drop`
    }

    /// Awaits `waited` (the leading caller's wait for the flight's answer), running the flight on
    /// this task meanwhile: the flight first, so that an answer it gives is the caller's in the
    /// same poll. What is left of the flight when `waited` ends goes on a task of its own.
    pub(crate) async fn beside<T>(mut self, waited: impl Future<Output = T>) -> T {
        let mut waited = std::pin::pin!(waited);
        std::future::poll_fn(|cx| {
            if let Some(flight) = self.flight.as_mut()
                && flight.as_mut().poll(cx).is_ready()
            {
                self.flight = None;
            }
            waited.as_mut().poll(cx)
        })
        .await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(flight) = self.flight.take() {
            // A runtime shutting down drops it: the leader's drop then ends its waiters' wait.
            drop(self.runtime.spawn(flight));
        }
    }
}
