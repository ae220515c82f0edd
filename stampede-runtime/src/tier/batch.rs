//! A flight of many keys at once: the keys a batch function's call (or a window of single-key
//! calls, `batch_window`) found neither usable in memory nor loading already. Each key keeps
//! its own [`Handle`] (its registration with the memory tier and its tags, its leader, the
//! stale value handed to its waiters, its last good value), so every per-key rule holds inside
//! a batch: an invalidation of one key detaches that key only, and the core settles each key
//! from what the tier reports for it. What the batch adds is one load of all its keys: one call
//! of the function, with the timeout, retries and breaker of a single load.
//!
//! The tier reports each key's outcome as soon as it knows it ([`Batch::report`]), and the core
//! settles that key and ends its flight then: a key is never held in flight by another key's
//! wait (a call of it made after its load ended starts a load of its own, rather than join a
//! flight and get an outcome from before it began).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::core::Core;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::tier::{Fetched, Handle, admitted};

/// A batch function's load: called with the keys to load, it answers each of them, in their
/// order (the generated code puts `None` where the function's map left a key out).
pub trait BatchLoad<K, V>: Load<Vec<K>, Vec<V>> {}
impl<K, V, L: Load<Vec<K>, Vec<V>>> BatchLoad<K, V> for L {}

/// A batch load used for one key: a single-key call of a batch function's cache (its
/// `batch_loader` function, a companion's `refresh`, a background refresh) calls the function
/// with that one key.
pub struct One<L>(pub(crate) Arc<L>);

impl<L> One<L> {
    /// The batch load `load`, for one key at a time.
    pub(crate) fn new(load: Arc<L>) -> Self {
        One(load)
    }
}

/// The future of one attempt of a single key's load through its batch load.
type OneAttempt<V, E> = Pin<Box<dyn Future<Output = Result<V, E>> + Send>>;

impl<K: Key, V: Value, L: BatchLoad<K, V>> Load<K, V> for One<L> {
    type Error = L::Error;
    type Attempt = OneAttempt<V, L::Error>;

    fn attempt(&self, key: &K) -> Self::Attempt {
        let attempt = self.0.attempt(&vec![key.clone()]);
        Box::pin(async move {
            let mut values = attempt.await?;
            // The generated load answers every key it was given, in order.
            Ok(values.pop().expect("a batch load answers each of its keys"))
        })
    }

    fn retryable(&self, error: &L::Error) -> bool {
        self.0.retryable(error)
    }
}

/// The keys a shared tier takes through its protocol together: a batch ([`Batch`]), or one
/// key's flight ([`Single`], a group of one), so that one implementation of the protocol serves
/// both. Each key has its [`Handle`]; the group loads any of them with one call of the function,
/// and is told each key's outcome as soon as the tier knows it.
pub(crate) trait Group<K: Key, V: Value>: Sync {
    /// The load each key's handle carries.
    type Load: Load<K, V>;

    /// The handle of each key, in the group's order.
    fn handles(&self) -> &[Handle<'_, K, V, Self::Load>];

    /// Loads the keys at `indices` (of [`Group::handles`]) with one call, with the timeout and
    /// retries of one load, if the breaker admits it; stores nothing. Each key gets its value,
    /// or every key the same error.
    fn load(&self, indices: &[usize])
    -> impl Future<Output = Vec<Result<Loaded<V>, Error>>> + Send;

    /// Reports the outcome of the key at `at`: its first report is its outcome.
    fn report(&self, at: usize, fetched: Fetched<V>);
}

/// One key's flight as a [`Group`] of one.
pub(crate) struct Single<'h, 'a, K: Key, V: Value, L> {
    handle: &'h Handle<'a, K, V, L>,
    outcome: Mutex<Option<Fetched<V>>>,
}

impl<'h, 'a, K: Key, V: Value, L: Load<K, V>> Single<'h, 'a, K, V, L> {
    pub(crate) fn new(handle: &'h Handle<'a, K, V, L>) -> Self {
        Single {
            handle,
            outcome: Mutex::new(None),
        }
    }

    /// The key's outcome; if the tier reported none (a tier bug), the load's abort.
    pub(crate) fn outcome(self) -> Fetched<V> {
        let reported = self
            .outcome
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        reported.unwrap_or_else(|| {
            Fetched::Failed(Error::LoadAborted {
                cache: self.handle.config().name.clone(),
            })
        })
    }
}

impl<K: Key, V: Value, L: Load<K, V>> Group<K, V> for Single<'_, '_, K, V, L> {
    type Load = L;

    fn handles(&self) -> &[Handle<'_, K, V, L>] {
        std::slice::from_ref(self.handle)
    }

    async fn load(&self, indices: &[usize]) -> Vec<Result<Loaded<V>, Error>> {
        match indices.is_empty() {
            true => Vec::new(),
            false => vec![self.handle.load().await],
        }
    }

    fn report(&self, _at: usize, fetched: Fetched<V>) {
        let mut outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if outcome.is_none() {
            *outcome = Some(fetched);
        }
    }
}

impl<K: Key, V: Value, L: BatchLoad<K, V>> Group<K, V> for Batch<'_, K, V, L> {
    type Load = One<L>;

    fn handles(&self) -> &[Handle<'_, K, V, One<L>>] {
        &self.handles
    }

    /// Loads the keys at `indices` (of [`Batch::handles`]) with one call of the function, with
    /// the timeout and retries of one load, if the breaker admits it; stores nothing. Each key
    /// gets its value, or every key the same error (the breaker's verdict is the call's).
    ///
    /// The function is given each key once: a batch may hold two flights of one key (a window
    /// that a call joined after an invalidation detached the key's first flight), and both get
    /// the one value loaded.
    async fn load(&self, indices: &[usize]) -> Vec<Result<Loaded<V>, Error>> {
        let core = self.core;
        let mut keys: Vec<K> = Vec::with_capacity(indices.len());
        let mut first: HashMap<&K, usize> = HashMap::with_capacity(indices.len());
        // For each index, the place of its key in `keys`.
        let places: Vec<usize> = indices
            .iter()
            .map(|&at| {
                let key = self.handles[at].key();
                *first.entry(key).or_insert_with(|| {
                    keys.push(key.clone());
                    keys.len() - 1
                })
            })
            .collect();
        drop(first);
        let started = || {
            for &at in indices {
                self.handles[at].started();
            }
        };
        let previous = indices
            .iter()
            .filter_map(|&at| {
                let handle = &self.handles[at];
                Some((handle.key().clone(), handle.previous()?))
            })
            .collect();
        let previous = crate::previous::many(previous);
        let options = core.options();
        let attempts = crate::load::attempts(&options, &core.telemetry, &keys, self.load, previous);
        match admitted(core, started, attempts).await {
            Ok(Loaded {
                value: values,
                read_from,
            }) if values.len() == keys.len() => places
                .iter()
                .map(|&place| {
                    let value = values[place].clone();
                    Ok(Loaded { value, read_from })
                })
                .collect(),
            Ok(Loaded { value: values, .. }) => {
                // Only a hand-written load can get here: the generated one answers each key.
                let error = Error::LoadPanicked {
                    cache: core.config.name.clone(),
                    message: format!(
                        "the batch load answered {} keys of {}",
                        values.len(),
                        keys.len()
                    )
                    .into(),
                };
                vec![Err(error); indices.len()]
            }
            Err(error) => vec![Err(error); indices.len()],
        }
    }

    /// Reports the outcome of the key at `at` (of [`Batch::handles`]): the core settles that key
    /// and ends its flight now, whatever the batch's other keys still wait for. A key's first
    /// report is its outcome; a key never reported fails once the tier returns.
    fn report(&self, at: usize, fetched: Fetched<V>) {
        self.reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((at, fetched));
        self.news.notify_one();
    }
}

/// A cache's core lent to its tier for one flight of many keys: a [`Handle`] per key, and the
/// one load that serves them all.
pub struct Batch<'a, K: Key, V: Value, L> {
    core: &'a Core<K, V>,
    handles: Vec<Handle<'a, K, V, One<L>>>,
    load: &'a L,
    /// The outcomes the tier reported that the core has not taken yet: (index, outcome).
    reported: Mutex<Vec<(usize, Fetched<V>)>>,
    /// Notified on each report (a permit is kept when the core is not waiting).
    news: Notify,
}

impl<'a, K: Key, V: Value, L: BatchLoad<K, V>> Batch<'a, K, V, L> {
    pub(crate) fn new(
        core: &'a Core<K, V>,
        handles: Vec<Handle<'a, K, V, One<L>>>,
        load: &'a L,
    ) -> Self {
        Batch {
            core,
            handles,
            load,
            reported: Mutex::new(Vec::new()),
            news: Notify::new(),
        }
    }

    /// The outcomes reported since the last call.
    pub(crate) fn take_reported(&self) -> Vec<(usize, Fetched<V>)> {
        std::mem::take(&mut *self.reported.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Resolves once an outcome was reported since the last time it resolved.
    pub(crate) async fn news(&self) {
        self.news.notified().await;
    }

    /// The handle of each key, in the batch's order.
    pub(crate) fn handles(&self) -> &[Handle<'a, K, V, One<L>>] {
        &self.handles
    }

    /// How many keys the batch holds.
    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    /// Loads every key here with one call, keeps each value in memory for its jittered `ttl`,
    /// then `stale`, no longer than `trusted_for`, and reports each: the path without a shared
    /// tier.
    pub(crate) async fn load_here(&self, trusted_for: Option<Duration>) {
        let all: Vec<usize> = (0..self.handles.len()).collect();
        let loaded = self.load(&all).await;
        for ((at, handle), loaded) in self.handles.iter().enumerate().zip(loaded) {
            let fetched = match loaded {
                Ok(loaded) => Fetched::Loaded(handle.keep_loaded(loaded, trusted_for)),
                Err(error) => Fetched::Failed(error),
            };
            self.report(at, fetched);
        }
    }
}
