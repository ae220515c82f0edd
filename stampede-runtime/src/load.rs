//! The function's load: what it must be, and how one load runs its attempts (timeout, retries
//! with jittered backoff).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

use crate::config::Config;
use crate::error::{Error, LoadError, UpstreamError};
use crate::previous::{self, Lent};
use crate::telemetry::Telemetry;

/// The body of a cached function, turned by `#[cached]` into a function of the key: called once
/// per attempt, each call a new future.
pub trait Load<K, V>: Send + Sync + 'static {
    /// The function's error type (`Infallible` for a function returning a plain value).
    type Error: LoadError;
    /// The future of one attempt.
    type Attempt: Future<Output = Result<V, Self::Error>> + Send + 'static;
    /// Starts one attempt.
    fn attempt(&self, key: &K) -> Self::Attempt;
    /// Whether a failed attempt's error is worth another attempt (`retry_if`); timeouts always
    /// are.
    fn retryable(&self, error: &Self::Error) -> bool {
        let _ = error;
        true
    }
    /// One attempt, boxed: what an [`Erased`] load makes. A load whose attempts are boxed
    /// already ([`Bound`]) hands them over as they are.
    fn boxed(&self, key: &K) -> ErasedAttempt<V, Self::Error> {
        ErasedAttempt(Boxed::Fallible(Box::pin(self.attempt(key))))
    }
}

/// The future of one attempt, boxed: what an erased load makes, and the load `#[cached]`
/// generates.
pub struct ErasedAttempt<V, E>(Boxed<V, E>);

/// What an [`ErasedAttempt`] holds. A plain value's future is boxed as it is, its value made
/// the `Ok` of an attempt that cannot fail where it is polled: so what wraps it is compiled
/// once per value type, not once per cached function (issue 38: two items of a debug build),
/// and it costs no second allocation.
enum Boxed<V, E> {
    /// The future of a function returning `Result<V, E>` (or of any [`Load`]).
    Fallible(Pin<Box<dyn Future<Output = Result<V, E>> + Send>>),
    /// The future of a function returning a plain value.
    Plain(Pin<Box<dyn Future<Output = V> + Send>>),
}

impl<V, E> Future for ErasedAttempt<V, E> {
    type Output = Result<V, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<V, E>> {
        match &mut self.get_mut().0 {
            Boxed::Fallible(future) => future.as_mut().poll(cx),
            Boxed::Plain(future) => future.as_mut().poll(cx).map(Ok),
        }
    }
}

/// A load as an object: what [`Erased`] holds.
trait DynLoad<K, V, E>: Send + Sync {
    fn attempt(&self, key: &K) -> ErasedAttempt<V, E>;
    fn retryable(&self, error: &E) -> bool;
}

impl<K, V, L: Load<K, V>> DynLoad<K, V, L::Error> for L {
    fn attempt(&self, key: &K) -> ErasedAttempt<V, L::Error> {
        Load::boxed(self, key)
    }

    fn retryable(&self, error: &L::Error) -> bool {
        Load::retryable(self, error)
    }
}

/// A load whose type names only the key, value and error types, not the function it comes
/// from: the miss path below a cache (flights, tiers, the Redis flow) is then compiled once per
/// key, value, error and tier, not once per cached function (issue 38: the build cost of a
/// cached function). It costs a miss two allocations, and a hit nothing (it is made on a miss).
pub(crate) struct Erased<K, V, E>(Box<dyn DynLoad<K, V, E>>);

impl<K: 'static, V: 'static, E: 'static> Erased<K, V, E> {
    /// `load`, erased.
    pub(crate) fn of<L: Load<K, V, Error = E>>(load: L) -> Self {
        Erased(Box::new(load))
    }
}

impl<K: 'static, V: Send + 'static, E: LoadError> Load<K, V> for Erased<K, V, E> {
    type Error = E;
    type Attempt = ErasedAttempt<V, E>;

    fn attempt(&self, key: &K) -> ErasedAttempt<V, E> {
        self.0.attempt(key)
    }

    fn retryable(&self, error: &E) -> bool {
        self.0.retryable(error)
    }
}

/// A load's builder ([`Cache::get`](crate::cache::Cache)'s `prepare`), erased with its load:
/// called only when a load must start.
pub(crate) type ErasedPrepare<'a, K, V, E> = Box<dyn FnOnce() -> Erased<K, V, E> + Send + 'a>;

/// `prepare`, erased.
pub(crate) fn erased<'a, K, V, L, P>(prepare: P) -> ErasedPrepare<'a, K, V, L::Error>
where
    K: 'static,
    V: 'static,
    L: Load<K, V>,
    P: FnOnce() -> L + Send + 'a,
{
    Box::new(move || Erased::of(prepare()))
}

/// A load whose errors are retried only when `retry_if` accepts them (`#[cached(retry_if =
/// "path")]`): a permanent error (not found, invalid input) is tried once.
pub(crate) struct RetryIf<L, E> {
    pub(crate) load: L,
    pub(crate) retry_if: fn(&E) -> bool,
}

impl<K, V, L: Load<K, V>> Load<K, V> for RetryIf<L, L::Error> {
    type Error = L::Error;
    type Attempt = L::Attempt;

    fn attempt(&self, key: &K) -> L::Attempt {
        self.load.attempt(key)
    }

    fn retryable(&self, error: &L::Error) -> bool {
        (self.retry_if)(error)
    }

    fn boxed(&self, key: &K) -> ErasedAttempt<V, L::Error> {
        self.load.boxed(key)
    }
}

/// The load `#[cached]` generates: what it needs beyond the key (`context`: a method's
/// receiver, the arguments left out of the key, each owned) and a function that starts one
/// attempt from it and the key, its future boxed there. Its type names no cached function, so
/// the miss path above [`Erased`] (the call's entry, the erasure) is compiled once per key,
/// value, error and context, not once per function (issue 38).
pub(crate) struct Bound<C, K, V, E> {
    pub(crate) context: C,
    pub(crate) attempt: fn(&C, &K) -> ErasedAttempt<V, E>,
}

impl<C, K, V, E> Load<K, V> for Bound<C, K, V, E>
where
    C: Send + Sync + 'static,
    K: 'static,
    V: Send + 'static,
    E: LoadError,
{
    type Error = E;
    type Attempt = ErasedAttempt<V, E>;

    fn attempt(&self, key: &K) -> ErasedAttempt<V, E> {
        (self.attempt)(&self.context, key)
    }

    fn boxed(&self, key: &K) -> ErasedAttempt<V, E> {
        Load::attempt(self, key)
    }
}

/// One attempt of a function returning `Result<V, E>`, boxed: what the load `#[cached]`
/// generates makes of the body's future. Pinned once erased (not `Box::pin`): only `Box::new`
/// is then compiled per cached function in a debug build, `into_pin` once per value type.
pub fn attempt<V, E, F>(future: F) -> ErasedAttempt<V, E>
where
    F: Future<Output = Result<V, E>> + Send + 'static,
{
    let future: Box<dyn Future<Output = Result<V, E>> + Send> = Box::new(future);
    ErasedAttempt(Boxed::Fallible(Box::into_pin(future)))
}

/// One attempt of a function returning a plain value, boxed (pinned once erased, as
/// [`attempt`]'s): the body's value as the `Ok` of a load that cannot fail.
pub fn plain_attempt<V, F>(future: F) -> ErasedAttempt<V, Infallible>
where
    F: Future<Output = V> + Send + 'static,
{
    let future: Box<dyn Future<Output = V> + Send> = Box::new(future);
    ErasedAttempt(Boxed::Plain(Box::into_pin(future)))
}

/// What a function whose load needs nothing beyond the key (a free function whose arguments
/// all make the key) makes its load's context with: one function for all of them.
pub fn no_context((): ()) {}

impl<K, V, E, F, Fut> Load<K, V> for F
where
    E: LoadError,
    F: Fn(&K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<V, E>> + Send + 'static,
{
    type Error = E;
    type Attempt = Fut;

    fn attempt(&self, key: &K) -> Fut {
        self(key)
    }
}

/// The load of a batch function that returns a plain map, which has no error channel: each
/// attempt's value is the `Ok` of a load that cannot fail. A wrapper rather than an `async`
/// block around each attempt, so that a cached function compiles no coroutine for it (issue 38).
pub(crate) struct Plain<L>(pub(crate) L);

/// The future of one attempt of a batch function's load that returns a plain map ([`Plain`]),
/// and of such a function's call: `F`'s value, as the `Ok` of a future that cannot fail. Its
/// `poll` is one call of `F`'s, where an `async` block or a combinator compiles a state machine
/// per function.
pub(crate) struct Infallibly<F>(pub(crate) F);

impl<F: Future> Future for Infallibly<F> {
    type Output = Result<F::Output, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: the inner future is pinned with `self` (structural pinning): it is never
        // moved out of it, and `Infallibly` implements neither `Drop` nor `Unpin` by hand. Not
        // `map_unchecked_mut`: its closure would be two more items to compile per cached batch
        // function in a debug build (issue 38).
        let future = unsafe { Pin::new_unchecked(&mut self.get_unchecked_mut().0) };
        future.poll(cx).map(Ok)
    }
}

impl<K, V, L, Fut> Load<K, V> for Plain<L>
where
    L: Fn(&K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = V> + Send + 'static,
{
    type Error = Infallible;
    type Attempt = Infallibly<Fut>;

    fn attempt(&self, key: &K) -> Infallibly<Fut> {
        Infallibly((self.0)(key))
    }
}

/// A loaded value, with when the attempt that gave it began: it is at least as new as the
/// source was then, and newer than any value stored before (which was read from the source
/// earlier still).
#[derive(Clone)]
pub(crate) struct Loaded<V> {
    pub(crate) value: V,
    pub(crate) read_from: Instant,
}

impl<V> Loaded<V> {
    /// A value given now (a companion's `prime`): as new as the source is now.
    pub(crate) fn now(value: V) -> Self {
        Loaded {
            value,
            read_from: Instant::now(),
        }
    }
}

/// Runs `load` for `key`: each attempt bounded by the cache's timeout, failed or timed-out ones
/// retried up to `retries` times after a jittered backoff, and lent `previous` (what
/// [`previous`](fn@crate::previous) reads in it).
pub(crate) async fn attempts<K, V, L: Load<K, V>>(
    config: &Config,
    telemetry: &Telemetry,
    key: &K,
    load: &L,
    previous: Lent,
) -> Result<Loaded<V>, Error> {
    let started = Instant::now();
    let mut retry = 0;
    let outcome = loop {
        telemetry.loads.bump();
        let read_from = Instant::now();
        let attempt = previous::lend(&previous, || load.attempt(key));
        let (error, retryable) = match tokio::time::timeout(config.timeout, attempt).await {
            Ok(Ok(value)) => break Ok(Loaded { value, read_from }),
            Ok(Err(error)) => {
                let retryable = load.retryable(&error);
                (
                    Error::Upstream(UpstreamError::new(&config.name, error)),
                    retryable,
                )
            }
            Err(_elapsed) => {
                telemetry.timeouts.bump();
                let timeout = Error::Timeout {
                    cache: config.name.clone(),
                    after: config.timeout,
                };
                (timeout, true)
            }
        };
        telemetry.load_errors.bump();
        if retry == config.retries || !retryable {
            break Err(error);
        }
        tokio::time::sleep(config.backoff_delay(retry)).await;
        retry += 1;
    };
    telemetry.load_took(started.elapsed());
    outcome
}
