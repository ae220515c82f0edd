//! The error every caller of a cached function can receive.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a cached call could not produce a value.
///
/// One load serves every concurrent caller of a key, so its failure is shared: each waiter
/// receives a clone of the same `Error`. A function returning `Result<T, E>` receives what the
/// cache itself failed with (a timeout, a panic, an open breaker, ...) as `E::from(error)`; the
/// function's own error comes back as itself when it can (see [`Error::upstream`]). A function
/// returning a plain `T` has no error channel and panics with the error's message instead.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// One load attempt ran longer than the cache's `timeout` (and no retry was left).
    #[error("cache `{cache}`: the load timed out after {after:?}")]
    Timeout {
        /// The cache's name.
        cache: Arc<str>,
        /// The `timeout` that was exceeded.
        after: Duration,
    },
    /// The load panicked; the panic was caught so that every waiter gets this error.
    #[error("cache `{cache}`: the load panicked: {message}")]
    LoadPanicked {
        /// The cache's name.
        cache: Arc<str>,
        /// The panic's message, when it was a string.
        message: Arc<str>,
    },
    /// The load returned an error. Every caller that shared the load receives it, wrapped.
    #[error("cache `{}`: the load failed: {}", .0.cache(), .0)]
    Upstream(UpstreamError),
    /// The load was dropped before it finished, which happens when the tokio runtime that ran it
    /// shuts down.
    #[error("cache `{cache}`: the load was dropped before it finished (its runtime shut down)")]
    LoadAborted {
        /// The cache's name.
        cache: Arc<str>,
    },
    /// Another process holds the key's Redis lock and the cache's `busy` policy is `"error"`.
    #[error("cache `{cache}`: another process is loading this key (busy = \"error\")")]
    LockBusy {
        /// The cache's name.
        cache: Arc<str>,
    },
    /// Redis could not be reached for an operation that cannot fall back to this process alone
    /// (an invalidation).
    #[error("cache `{cache}`: Redis is unavailable: {message}")]
    RedisUnavailable {
        /// The cache's name.
        cache: Arc<str>,
        /// What failed.
        message: Arc<str>,
    },
    /// A setting is unusable: a Redis URL that does not parse, or an invalidation of a cache
    /// that does not exist.
    #[error("{message}")]
    InvalidConfig {
        /// What is wrong, and how to fix it.
        message: Arc<str>,
    },
    /// The cache's circuit breaker is open after repeated failed loads (`breaker = N`): the
    /// source was not called. It is tried again after the cool-down.
    #[error(
        "cache `{cache}`: the upstream is failing; loads are skipped for {retry_in:?} (breaker open)"
    )]
    CircuitOpen {
        /// The cache's name.
        cache: Arc<str>,
        /// How long until the next probe load.
        retry_in: Duration,
    },
    /// The cache already runs `max_loads` loads in this process: a miss beyond them waited
    /// `timeout` for a free one, or (`max_loads_full = "error"`) failed at once. The source was
    /// not called.
    #[error(
        "cache `{cache}`: its {most} loads (max_loads) were all running{}",
        match waited {
            Some(waited) => format!("; none was free within {waited:?} (the cache's timeout)"),
            None => " (max_loads_full = \"error\")".to_owned(),
        }
    )]
    LoadsFull {
        /// The cache's name.
        cache: Arc<str>,
        /// Its `max_loads`.
        most: u32,
        /// How long it waited for a free load; `None` when it did not wait.
        waited: Option<Duration>,
    },
    /// A cached function was called outside a tokio runtime, where its load cannot be spawned.
    #[error("cache `{cache}`: called outside a tokio runtime; the load must be spawned on one")]
    NoRuntime {
        /// The cache's name.
        cache: Arc<str>,
    },
}

impl Error {
    /// The original error of a failed load, when it is an `E`.
    ///
    /// The function's own error reaches the only caller of its load as itself, and every
    /// caller of a shared load as a clone when `E: Clone`. An `E` that is not `Clone` cannot be
    /// handed to several waiters by value, so it is shared behind an `Arc` and each of them
    /// receives `E::from(Error::Upstream(..))`. This gets the original back, to match on it:
    ///
    /// ```
    /// # #[derive(Debug, Clone)] enum AppError { NotFound, Cache(stampede::Error) }
    /// impl From<stampede::Error> for AppError {
    ///     fn from(error: stampede::Error) -> Self {
    ///         match error.upstream::<AppError>() {
    ///             Some(original) => original.clone(),
    ///             None => AppError::Cache(error),
    ///         }
    ///     }
    /// }
    /// ```
    pub fn upstream<E: 'static>(&self) -> Option<&E> {
        match self {
            Error::Upstream(upstream) => upstream.downcast_ref(),
            _ => None,
        }
    }

    /// The name of the cache that produced this error (empty for a configuration error).
    pub fn cache(&self) -> &str {
        match self {
            Error::Timeout { cache, .. }
            | Error::LoadPanicked { cache, .. }
            | Error::LoadAborted { cache }
            | Error::LockBusy { cache }
            | Error::RedisUnavailable { cache, .. }
            | Error::NoRuntime { cache }
            | Error::CircuitOpen { cache, .. }
            | Error::LoadsFull { cache, .. } => cache,
            Error::Upstream(upstream) => upstream.cache(),
            Error::InvalidConfig { .. } => "",
        }
    }

    pub(crate) fn invalid_config(message: impl Into<String>) -> Self {
        Error::InvalidConfig {
            message: Arc::from(message.into()),
        }
    }

    pub(crate) fn panicked(cache: &Arc<str>, payload: &(dyn Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| Arc::from(*s))
            .or_else(|| {
                payload
                    .downcast_ref::<String>()
                    .map(|s| Arc::from(s.as_str()))
            })
            .unwrap_or_else(|| Arc::from("(a non-string panic payload)"));
        Error::LoadPanicked {
            cache: cache.clone(),
            message,
        }
    }
}

/// The error a load returned, shared by every caller of that load.
#[derive(Clone)]
pub struct UpstreamError {
    cache: Arc<str>,
    error: Arc<dyn LoadError>,
}

impl UpstreamError {
    pub(crate) fn new<E: LoadError>(cache: &Arc<str>, error: E) -> Self {
        UpstreamError {
            cache: cache.clone(),
            error: Arc::new(error),
        }
    }

    /// The original error itself, when it is an `E` and no other caller holds it (the load was
    /// not shared); otherwise this error back.
    pub(crate) fn into_original<E: LoadError>(self) -> Result<E, UpstreamError> {
        let any: &dyn Any = &*self.error;
        if !any.is::<E>() {
            return Err(self);
        }
        let UpstreamError { cache, error } = self;
        let any: Arc<dyn Any + Send + Sync> = error;
        let typed = any
            .downcast::<E>()
            .unwrap_or_else(|_| unreachable!("checked to be an `E` above"));
        Arc::try_unwrap(typed).map_err(|typed| UpstreamError {
            cache,
            error: typed,
        })
    }

    /// The original error, when it is an `E`.
    pub fn downcast_ref<E: 'static>(&self) -> Option<&E> {
        let any: &dyn Any = &*self.error;
        any.downcast_ref()
    }

    /// The name of the cache whose load failed.
    pub fn cache(&self) -> &str {
        &self.cache
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.error, f)
    }
}

impl fmt::Debug for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.error, f)
    }
}

/// What a load's error type must be to be shared with every waiter: printable and thread-safe.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of a cached function cannot be shared with the callers waiting on its load",
    label = "this error type must be `Display + Debug + Send + Sync + 'static`",
    note = "one load serves every concurrent caller, so its error is kept behind an `Arc` and handed to each of them"
)]
pub trait LoadError: fmt::Display + fmt::Debug + Any + Send + Sync {}

impl<E: fmt::Display + fmt::Debug + Any + Send + Sync> LoadError for E {}
