//! The path of a batch function's call through its cache: many keys, each served as a
//! single-key call would serve it, and one load of those this call must load; and the window in
//! which single-key calls of a batch function's cache are loaded together (`batch_window`).
//!
//! A key of a batch is a key like any other: it has its own flight (a single-key call of it
//! joins a batch's flight, and a batch joins a single-key call's), its own generation (an
//! invalidation detaches that key's part of a batch only: its waiters still get the batch's
//! value, nothing is stored, and the next call loads it again), its own stale value, last good
//! value and settlement (`settle`). What a batch shares is the load: one call of the function
//! for the keys it leads, whose failure reaches only the callers of those keys.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{join_all, select_all};
use tokio::runtime::Handle as Runtime;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::{Cache, Held, Miss};
use crate::clock::after;
use crate::config::Lock;
use crate::error::Error;
use crate::flight::{Joined, Leader, Waiter};
use crate::kv::{Key, Value};
use crate::telemetry::Reason;
use crate::tier::{Batch, BatchLoad, Call, Direct, Fetched, Handle, One, Run, Start, Tier};

/// The open window of single-key calls of one cache (`batch_window`): the leaders sent to it
/// are loaded together when it closes.
pub(crate) struct Window<K: Key, V: Value> {
    open: Mutex<Option<Open<K, V>>>,
    next_id: AtomicU64,
}

struct Open<K: Key, V: Value> {
    id: u64,
    /// To the task that loads the window's keys when it closes. Only this copy exists, so
    /// dropping it (the window is full) closes the window at once.
    leaders: mpsc::UnboundedSender<Leader<'static, K, V>>,
    count: usize,
}

impl<K: Key, V: Value> Default for Window<K, V> {
    fn default() -> Self {
        Window {
            open: Mutex::new(None),
            next_id: AtomicU64::new(0),
        }
    }
}

impl<K: Key, V: Value> Window<K, V> {
    fn lock(&self) -> MutexGuard<'_, Option<Open<K, V>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The keys of a flight, with why and how each one's flight started.
type Led<K, V> = Vec<(Leader<'static, K, V>, Start)>;

/// The keys a call waits for: each one's place in the call, and its waiter.
type Waiting<V> = Vec<(usize, Waiter<V>)>;

impl<K: Key, V: Value, T: Tier<K, V>> Cache<K, V, T> {
    /// The value of each of `keys` for a batch function's call (`Call::Get`), or for its
    /// companion's `refresh` (`Call::Refresh`, which ignores the values held) or `read_through`
    /// (`Call::ReadThrough`, which reads the tier whatever memory holds): each key once, in
    /// the order first given, with its own answer.
    ///
    /// A fresh or stale value in memory is served as a single-key call would serve it (stale
    /// and early ones get one background refresh, one load for all of them); the rest are read
    /// from the shared tier together, on this task, where it reads; keys loading already in this
    /// process join those flights; this call leads the others, and one call of the function
    /// loads them (loads of at most `batch_max` keys, at once), detached from this call. The
    /// function's load is built (`prepare`) only if some key must be loaded or refreshed.
    pub(crate) async fn get_many<P, L>(
        &'static self,
        keys: Vec<K>,
        prepare: P,
        call: Call,
    ) -> Vec<(K, Result<V, Error>)>
    where
        P: FnOnce() -> L,
        L: BatchLoad<K, V>,
    {
        let core = &self.core;
        let run = match call {
            Call::Get => Run::Get,
            Call::Refresh => Run::Refresh,
            Call::ReadThrough => Run::Through,
        };
        let keys = unique(keys);
        let span = tracing::trace_span!("stampede.lookup", cache = %core.config.name, keys = keys.len(), outcome = Empty);
        let mut answers: Vec<Option<Result<V, Error>>> = keys.iter().map(|_| None).collect();
        let (refreshes, mut missed, lapsed) = self.held_many(&keys, &mut answers, call);
        if missed.is_empty() && refreshes.is_empty() {
            span.record("outcome", "hit");
            return answered(keys, answers, core);
        }
        let load = Arc::new(prepare());
        // Outside a runtime no refresh can start; the values are served regardless.
        let _ = self.spawn_batch(refreshes, &load);
        if core.config.lock == Lock::None {
            span.record("outcome", "miss");
            let one = One::new(load.clone());
            let handles = missed
                .iter()
                .map(|&at| Handle::new(core, &keys[at], &one, Start::miss(run), None))
                .collect();
            self.flown_many(handles, &*load, |at, answer| {
                answers[missed[at]] = Some(answer);
            })
            .await;
            return answered(keys, answers, core);
        }
        if run != Run::Refresh {
            self.read_many(&keys, &mut missed, &lapsed, &mut answers, &load)
                .await;
        }
        let (led, waiting) = self.join_many(&keys, &missed, run);
        span.record(
            "outcome",
            match (led.is_empty(), waiting.is_empty()) {
                (_, true) => "remote",
                (true, false) => "shared",
                (false, false) => "miss",
            },
        );
        if let Err(error) = self.spawn_batch(led, &load) {
            for (at, _) in waiting {
                answers[at] = Some(Err(error.clone()));
            }
            return answered(keys, answers, core);
        }
        let (keys_ref, span_ref) = (&keys, &span);
        let waited = join_all(waiting.into_iter().map(|(at, waiter)| async move {
            (at, self.wait(&keys_ref[at], waiter, span_ref).await)
        }))
        .await;
        for (at, answer) in waited {
            answers[at] = Some(answer);
        }
        answered(keys, answers, core)
    }

    /// What memory holds for each of `keys` (nothing for a companion's `refresh`): fresh and
    /// stale values answered, the stale and early ones with a refresh to lead (one per key not
    /// loading already); the places of the keys missed; and, by place, whether memory's value
    /// of a key lapsed ([`Held::Missed`]).
    fn held_many(
        &'static self,
        keys: &[K],
        answers: &mut [Option<Result<V, Error>>],
        call: Call,
    ) -> (Led<K, V>, Vec<usize>, Vec<bool>) {
        let core = &self.core;
        let (mut refreshes, mut missed): (Led<K, V>, _) = (Vec::new(), Vec::new());
        let mut lapsed = vec![false; keys.len()];
        for (at, key) in keys.iter().enumerate() {
            match call {
                Call::Get => {}
                Call::Refresh => {
                    missed.push(at);
                    continue;
                }
                Call::ReadThrough => {
                    core.telemetry.misses.bump();
                    missed.push(at);
                    continue;
                }
            }
            match self.held(key) {
                Held::Hit(value) => answers[at] = Some(Ok(value)),
                Held::Refresh(value, reason, of) => {
                    answers[at] = Some(Ok(value));
                    refreshes.extend(self.refresh_led(key, reason, of));
                }
                Held::Missed { lapsed: was } => {
                    core.telemetry.misses.bump();
                    missed.push(at);
                    lapsed[at] = was;
                }
            }
        }
        (refreshes, missed, lapsed)
    }

    /// Joins the flight of each key at `missed` (of `keys`), or starts it: the flights this
    /// call leads, and each key's place with its waiter (a refresh waits for the load, not the
    /// stale value a flight it joined serves).
    fn join_many(&'static self, keys: &[K], missed: &[usize], run: Run) -> (Led<K, V>, Waiting<V>) {
        let core = &self.core;
        let (mut led, mut waiting): (Led<K, V>, _) = (Vec::new(), Vec::new());
        let trusted_for = self.tier.trusted_for();
        for &at in missed {
            let waiter = match core.flights.join(&keys[at], trusted_for) {
                Joined::Shared(waiter) => {
                    core.telemetry.shared.bump();
                    waiter
                }
                Joined::Led(leader, waiter) => {
                    led.push((leader, Start::miss(run)));
                    waiter
                }
            };
            waiting.push((
                at,
                match run {
                    Run::Refresh => waiter.loaded_only(),
                    Run::Get | Run::Through => waiter,
                },
            ));
        }
        (led, waiting)
    }

    /// Reads the keys at `missed` (of `keys`) that the tier is read first for
    /// ([`Cache::reads_first`], by whether each `lapsed` in memory) and no flight of this
    /// process loads, from the shared tier together, on this task: each fresh one is answered
    /// (past `refresh_after`, refreshed in the background, one load for all of them) and taken
    /// off `missed`.
    async fn read_many<L: BatchLoad<K, V>>(
        &'static self,
        keys: &[K],
        missed: &mut Vec<usize>,
        lapsed: &[bool],
        answers: &mut [Option<Result<V, Error>>],
        load: &Arc<L>,
    ) {
        let core = &self.core;
        // The rule asked once for each answer it may give, not once per key: it reads the
        // options under their lock.
        let reads_first = [self.reads_first(false), self.reads_first(true)];
        let (read, directs): (Vec<usize>, Vec<Direct<'_, K, V>>) = missed
            .iter()
            .filter(|&&at| {
                reads_first[usize::from(lapsed[at])] && !core.flights.contains(&keys[at])
            })
            .filter_map(|&at| Some((at, Direct::new(core, &keys[at])?)))
            .unzip();
        if directs.is_empty() {
            return;
        }
        let shared = self.tier.read_many(&directs).await;
        let mut early: Led<K, V> = Vec::new();
        for ((at, direct), shared) in read.into_iter().zip(directs).zip(shared) {
            let Some(shared) = shared else {
                continue;
            };
            let Some((value, refresh_of)) = self.take_read(direct, shared) else {
                continue;
            };
            answers[at] = Some(Ok(value));
            if let Some(of) = refresh_of {
                early.extend(self.refresh_led(&keys[at], Reason::Early, of));
            }
        }
        let _ = self.spawn_batch(early, load);
        missed.retain(|&at| answers[at].is_none());
    }

    /// Runs the flights of `led` detached on the caller's runtime, in loads of at most
    /// `batch_max` keys, so that cancelling the caller neither cancels the loads nor strands
    /// the keys' other waiters. Each flight's span follows from the span of the call.
    fn spawn_batch<L: BatchLoad<K, V>>(
        &'static self,
        led: Led<K, V>,
        load: &Arc<L>,
    ) -> Result<(), Error> {
        if led.is_empty() {
            return Ok(());
        }
        let core = &self.core;
        let runtime = Runtime::try_current().map_err(|_| Error::NoRuntime {
            cache: core.config.name.clone(),
        })?;
        let most = core.options().batch_max.unwrap_or(usize::MAX).max(1);
        let mut led = led.into_iter().peekable();
        while led.peek().is_some() {
            let flight: Led<K, V> = led.by_ref().take(most).collect();
            let span = batch_span(self, &flight);
            span.follows_from(tracing::Span::current());
            runtime.spawn(self.batch_flight(flight, load.clone()).instrument(span));
        }
        Ok(())
    }

    /// One flight of many keys: a refresh of values being served first waits for a turn in the
    /// process's budget (a load for callers with no value never does); then the tier fetches
    /// them, and as each key's outcome is known the core settles it and its leader hands the
    /// answer to its waiters.
    async fn batch_flight<L: BatchLoad<K, V>>(&'static self, led: Led<K, V>, load: Arc<L>) {
        let core = &self.core;
        let background = led.iter().all(|(_, start)| start.reason != Reason::Miss);
        let _turn = match background {
            // A miss that joins any of the keys makes the refresh start at once.
            true => {
                let urgent = led
                    .iter()
                    .map(|(leader, _)| Box::pin(leader.urgent().notified()));
                crate::budget::turn(select_all(urgent).map(|_| ())).await
            }
            false => None,
        };
        let _running = core.telemetry.in_flight.raise();
        let started = Instant::now();
        let one = One::new(load.clone());
        let handles = led
            .iter()
            .map(|(leader, start)| Handle::new(core, leader.key(), &one, *start, Some(leader)))
            .collect();
        let mut failed = 0;
        self.flown_many(handles, &*load, |at, answer| {
            failed += usize::from(answer.is_err());
            led[at].0.finish(answer);
        })
        .await;
        let span = tracing::Span::current();
        span.record("duration_ms", started.elapsed().as_millis() as u64);
        span.record(
            "outcome",
            match failed {
                0 => "ok",
                _ if failed == led.len() => "error",
                _ => "partial",
            },
        );
    }

    /// The keys of `handles` through the tier, a panic in it included, each settled by the
    /// core (see `settle`) as soon as the tier reports it and handed to `answer` with its index
    /// in `handles`; a key a load stored meanwhile is served that value instead.
    async fn flown_many<L: BatchLoad<K, V>>(
        &self,
        handles: Vec<Handle<'_, K, V, One<L>>>,
        load: &L,
        mut answer: impl FnMut(usize, Result<V, Error>),
    ) {
        let (mut pending, mut fetch) = (Vec::new(), Vec::new());
        for (at, handle) in handles.into_iter().enumerate() {
            match self.just_stored(&handle) {
                Some(value) => answer(at, Ok(value)),
                None => {
                    pending.push(at);
                    fetch.push(handle);
                }
            }
        }
        if fetch.is_empty() {
            return;
        }
        let batch = Batch::new(&self.core, fetch, load);
        let mut unanswered = vec![true; batch.len()];
        let mut settle = |reported: Vec<(usize, Fetched<V>)>| {
            for (at, fetched) in reported {
                if unanswered.get(at).copied() == Some(true) {
                    unanswered[at] = false;
                    answer(pending[at], self.settle(&batch.handles()[at], fetched).0);
                }
            }
        };
        let fetching = AssertUnwindSafe(self.tier.fetch_many(&batch)).catch_unwind();
        tokio::pin!(fetching);
        let ended = loop {
            tokio::select! {
                biased;
                ended = &mut fetching => break ended,
                () = batch.news() => settle(batch.take_reported()),
            }
        };
        settle(batch.take_reported());
        // What the tier left unreported: its panic, or (a tier bug) nothing at all.
        let name = &self.core.config.name;
        let error = match ended {
            Ok(()) => Error::LoadAborted {
                cache: name.clone(),
            },
            Err(panic) => Error::panicked(name, &*panic),
        };
        let left = (0..batch.len())
            .map(|at| (at, Fetched::Failed(error.clone())))
            .collect();
        settle(left);
    }

    /// A single-key call of a batch function's cache whose load, if this call must start one,
    /// is made together with those of the other single-key calls that start one within `window`
    /// (`batch_window`): one call of the function for all their keys, of at most `batch_max`
    /// keys (a full window is loaded at once). Otherwise as [`Cache::get`].
    pub(crate) async fn get_in_window<P, L>(
        &'static self,
        key: K,
        prepare: P,
        window: Duration,
    ) -> Result<V, Error>
    where
        P: FnOnce() -> L + Send,
        L: BatchLoad<K, V>,
    {
        let (prepare, lapsed) = match self.served(&key, move || One::new(Arc::new(prepare()))) {
            Ok(value) => return Ok(value),
            Err(missed) => missed,
        };
        let miss = Miss {
            prepare,
            span: self.lookup_span(),
            run: Run::Get,
            lapsed,
        };
        self.miss(key, miss, |leader, prepare| {
            self.send_to_window(leader, prepare().0, window)
                .map(|()| None)
        })
        .await
    }

    /// Adds `leader` to the open window, or opens one whose task loads its keys when it
    /// closes: `window` after it opened, or once it holds `batch_max` keys.
    fn send_to_window<L: BatchLoad<K, V>>(
        &'static self,
        leader: Leader<'static, K, V>,
        load: Arc<L>,
        window: Duration,
    ) -> Result<(), Error> {
        let runtime = Runtime::try_current().map_err(|_| Error::NoRuntime {
            cache: self.core.config.name.clone(),
        })?;
        let most = self.core.options().batch_max.unwrap_or(usize::MAX).max(1);
        let mut open = self.window.lock();
        let leader = match open.as_mut() {
            Some(window) => match window.leaders.send(leader) {
                Ok(()) => {
                    window.count += 1;
                    if window.count >= most {
                        *open = None; // full: its task loads it now
                    }
                    return Ok(());
                }
                // Its task is gone (its runtime shut down): open another.
                Err(mpsc::error::SendError(leader)) => leader,
            },
            None => leader,
        };
        let (leaders, received) = mpsc::unbounded_channel();
        let _ = leaders.send(leader);
        let id = self.window.next_id.fetch_add(1, Ordering::Relaxed);
        *open = (most > 1).then_some(Open {
            id,
            leaders,
            count: 1,
        });
        drop(open);
        let closes = after(Instant::now(), window);
        runtime.spawn(self.window_flight(id, received, load, closes));
        Ok(())
    }

    /// Gathers the leaders sent to window `id` until it closes, then runs their flight.
    async fn window_flight<L: BatchLoad<K, V>>(
        &'static self,
        id: u64,
        mut received: mpsc::UnboundedReceiver<Leader<'static, K, V>>,
        load: Arc<L>,
        closes: Instant,
    ) {
        let mut leaders = Vec::new();
        loop {
            tokio::select! {
                biased;
                leader = received.recv() => match leader {
                    Some(leader) => leaders.push(leader),
                    None => break, // full: closed by its last caller
                },
                () = tokio::time::sleep_until(closes) => break,
            }
        }
        {
            let mut open = self.window.lock();
            if open.as_ref().is_some_and(|window| window.id == id) {
                *open = None;
            }
        }
        // No sender is left: what was sent before it was dropped is all there is.
        while let Ok(leader) = received.try_recv() {
            leaders.push(leader);
        }
        let led: Led<K, V> = leaders
            .into_iter()
            .map(|leader| (leader, Start::miss(Run::Get)))
            .collect();
        let span = batch_span(self, &led);
        self.batch_flight(led, load).instrument(span).await;
    }
}

/// `keys` without their repetitions, in the order first given.
fn unique<K: Key>(keys: Vec<K>) -> Vec<K> {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.into_iter()
        .filter(|key| seen.insert(key.clone()))
        .collect()
}

/// Each key with its answer (every key has one by now).
fn answered<K: Key, V: Value>(
    keys: Vec<K>,
    answers: Vec<Option<Result<V, Error>>>,
    core: &crate::core::Core<K, V>,
) -> Vec<(K, Result<V, Error>)> {
    keys.into_iter()
        .zip(answers)
        .map(|(key, answer)| {
            let answer = answer.unwrap_or_else(|| {
                Err(Error::LoadAborted {
                    cache: core.config.name.clone(),
                })
            });
            (key, answer)
        })
        .collect()
}

/// The span of one flight of many keys.
fn batch_span<K: Key, V: Value, T>(cache: &Cache<K, V, T>, led: &Led<K, V>) -> tracing::Span {
    let reason = led.first().map_or(Reason::Miss, |(_, start)| start.reason);
    tracing::debug_span!(
        "stampede.refresh",
        cache = %cache.core.config.name,
        keys = led.len(),
        reason = reason.as_str(),
        outcome = Empty,
        duration_ms = Empty,
    )
}
