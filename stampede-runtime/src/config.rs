//! The options of one cache, as `#[cached(...)]` wrote them.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

/// How long one value stays fresh, read from the value itself (`ttl_from = "path"`): its own
/// fresh time, or `None` for the cache's `ttl`. Erased so that [`Config`] names no value type:
/// the code `#[cached]` generates downcasts to the function's value type, which is always the
/// one stored.
pub type TtlFrom = fn(&(dyn Any + Send + Sync)) -> Option<Duration>;

/// How concurrent misses on one key are coordinated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lock {
    /// One load per key per process; every other caller waits for it (singleflight).
    Local,
    /// One load per key across every process sharing the tier (Redis); others wait for its
    /// value.
    Redis,
    /// No coordination: every caller that misses runs the load itself.
    None,
}

/// Where values are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// In this process only (a bounded quick_cache store).
    Memory,
    /// In Redis only: every call reads Redis, on the caller's task when Redis holds a fresh
    /// value; otherwise concurrent calls of one process share one flight.
    Redis,
    /// In this process (L1) in front of Redis (L2).
    Tiered,
}

/// What a miss does when its cache already runs `max_loads` loads in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadsFull {
    /// Wait for a free load, at most the cache's `timeout`.
    Wait,
    /// Fail at once with [`Error::LoadsFull`](crate::Error::LoadsFull).
    Error,
}

/// The options of one cache. Built by `#[cached]`; listed by [`caches`](crate::caches), and
/// serialized (durations as milliseconds) for debug pages.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Config {
    /// The cache's name in stats, metrics and errors.
    pub name: Arc<str>,
    /// How long a value is fresh, before jitter.
    #[serde(rename = "ttl_ms", serialize_with = "crate::config::millis")]
    pub ttl: Duration,
    /// Percent (0..=100) by which a fill may shorten `ttl`, drawn uniformly per fill.
    pub jitter: u8,
    /// Window after the fresh time in which the old value is served while one refresh runs.
    #[serde(rename = "stale_ms", serialize_with = "crate::config::millis")]
    pub stale: Duration,
    /// Bound on one load attempt.
    #[serde(rename = "timeout_ms", serialize_with = "crate::config::millis")]
    pub timeout: Duration,
    /// Extra attempts after a failed or timed-out attempt.
    pub retries: u32,
    /// Base delay before a retry; doubled per retry and jittered.
    #[serde(rename = "backoff_ms", serialize_with = "crate::config::millis")]
    pub backoff: Duration,
    /// How concurrent misses are coordinated.
    pub lock: Lock,
    /// Where values are kept.
    pub backend: Backend,
    /// Maximum number of entries kept in memory.
    pub capacity: u64,
    /// Refresh-ahead: past this age (jittered like `ttl`, always below it), a hit also starts
    /// one background refresh, so a key read steadily never expires. `None`: off.
    #[serde(
        rename = "refresh_after_ms",
        serialize_with = "crate::config::millis_opt"
    )]
    pub refresh_after: Option<Duration>,
    /// Probabilistic early refresh (XFetch, Vattani et al., VLDB 2015) with this `beta`: a hit
    /// starts one background refresh when `now - load time * beta * ln(u) >= fresh deadline`
    /// (`u` drawn per hit, uniform in (0, 1)), so the chance rises as the deadline nears and
    /// with how long the value's load took in this process. `None`: off.
    pub xfetch: Option<f64>,
    /// Fail-safe: when a load fails (error, timeout, panic), the last good value is served
    /// instead for this long past its stale deadline. `None`: off.
    #[serde(rename = "fail_safe_ms", serialize_with = "crate::config::millis_opt")]
    pub fail_safe: Option<Duration>,
    /// With `fail_safe`, how long a served last good value stands before the source is asked
    /// again.
    #[serde(
        rename = "fail_safe_throttle_ms",
        serialize_with = "crate::config::millis"
    )]
    pub fail_safe_throttle: Duration,
    /// Fail-safe's companion: with a fail-safe value, a caller waiting for a load gets it after
    /// this, while the load goes on and stores its result. `None`: off.
    #[serde(
        rename = "soft_timeout_ms",
        serialize_with = "crate::config::millis_opt"
    )]
    pub soft_timeout: Option<Duration>,
    /// For a tiered cache: how long this process serves a value from memory before it reads
    /// Redis again (at most `ttl`), counted from when the read or load began; Redis keeps the
    /// value for its own windows. Past it the value is still the key's last good value for
    /// `fail_safe`. `None`: memory keeps a value as long as Redis does.
    #[serde(rename = "memory_ttl_ms", serialize_with = "crate::config::millis_opt")]
    pub memory_ttl: Option<Duration>,
    /// With a Redis tier and the `compress` feature: a value whose payload takes more than this
    /// many bytes is written to Redis LZ4-compressed, where that makes it smaller. Every reader
    /// reads either form, so it is not part of the cache's identity. `None`: off.
    pub compress: Option<usize>,
    /// The circuit breaker: after this many consecutive failed loads of the cache, loads are
    /// skipped for `breaker_cooldown`. `None`: off.
    pub breaker: Option<u32>,
    /// How long an open breaker skips loads before one probe.
    #[serde(
        rename = "breaker_cooldown_ms",
        serialize_with = "crate::config::millis"
    )]
    pub breaker_cooldown: Duration,
    /// The `key` template as written (`"user:{id}"`), if one was; part of the cache's identity
    /// in a shared tier.
    pub key: Option<Arc<str>>,
    /// `version = ".."` as written, if given: part of the cache's identity in a shared tier,
    /// beside its name, its key template and the shapes of its key and value types.
    pub version: Option<Arc<str>>,
    /// `ttl_from = "path"`: each value's own fresh time, capped at `ttl` (which also stands when
    /// it gives none); jitter and `stale` apply on top, except to a value whose own time is
    /// zero, which is not cached at all. `None`: every value
    /// lives `ttl`. Shown as whether it is set.
    #[serde(serialize_with = "crate::config::is_set")]
    pub ttl_from: Option<TtlFrom>,
    /// For a batch function's cache: the most keys one call of the function loads (a larger
    /// batch is split into loads of at most this many keys, run at once). `None`: no bound.
    pub batch_max: Option<usize>,
    /// The most loads of the cache that run at once in this process (a batch's one load counts
    /// once). `None`: no bound.
    pub max_loads: Option<u32>,
    /// What a miss does when `max_loads` loads run already.
    pub max_loads_full: LoadsFull,
}

/// The options `#[cached]` wrote as literals, as a constant: [`Config`] but for the cache's name
/// and `ttl_from` (which the generated code gives beside it: a method's name is made at run
/// time, and `ttl_from` names the function's value type), and with its texts `&'static str`.
/// The generated code holds it as data and makes its `Config` with one call of
/// [`Config::written`], where a literal of every field was code in every cached function
/// (issue 38: 393 bytes of a release build per function).
#[doc(hidden)]
#[derive(Debug)]
pub struct Written {
    pub ttl: Duration,
    pub jitter: u8,
    pub stale: Duration,
    pub timeout: Duration,
    pub retries: u32,
    pub backoff: Duration,
    pub lock: Lock,
    pub backend: Backend,
    pub capacity: u64,
    pub refresh_after: Option<Duration>,
    pub xfetch: Option<f64>,
    pub fail_safe: Option<Duration>,
    pub fail_safe_throttle: Duration,
    pub soft_timeout: Option<Duration>,
    pub memory_ttl: Option<Duration>,
    pub compress: Option<usize>,
    pub breaker: Option<u32>,
    pub breaker_cooldown: Duration,
    pub key: Option<&'static str>,
    pub version: Option<&'static str>,
    pub batch_max: Option<usize>,
    pub max_loads: Option<u32>,
    pub max_loads_full: LoadsFull,
}

impl Config {
    /// The options of the cache `name` as its attribute wrote them.
    #[doc(hidden)]
    pub fn written(name: &str, ttl_from: Option<TtlFrom>, written: &Written) -> Config {
        Config {
            name: Arc::from(name),
            ttl: written.ttl,
            jitter: written.jitter,
            stale: written.stale,
            timeout: written.timeout,
            retries: written.retries,
            backoff: written.backoff,
            lock: written.lock,
            backend: written.backend,
            capacity: written.capacity,
            refresh_after: written.refresh_after,
            xfetch: written.xfetch,
            fail_safe: written.fail_safe,
            fail_safe_throttle: written.fail_safe_throttle,
            soft_timeout: written.soft_timeout,
            memory_ttl: written.memory_ttl,
            compress: written.compress,
            breaker: written.breaker,
            breaker_cooldown: written.breaker_cooldown,
            key: written.key.map(Arc::from),
            version: written.version.map(Arc::from),
            ttl_from,
            batch_max: written.batch_max,
            max_loads: written.max_loads,
            max_loads_full: written.max_loads_full,
        }
    }
}

/// An option's value that [`Config::check`] refuses: which option, and why.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) option: &'static str,
    pub(crate) why: String,
}

/// The windows of a value's life, each after the one before: fresh, stale (served while one
/// refresh runs), then kept as the last good value for a failed load (`fail_safe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lifetime {
    pub(crate) fresh: Duration,
    pub(crate) stale: Duration,
    pub(crate) fail_safe: Duration,
}

/// No window at all: the value answers its load's callers and is kept nowhere.
impl Default for Lifetime {
    fn default() -> Self {
        Lifetime {
            fresh: Duration::ZERO,
            stale: Duration::ZERO,
            fail_safe: Duration::ZERO,
        }
    }
}

impl Config {
    /// The windows of `value`'s life, before jitter. It is fresh for its own time (`ttl_from`,
    /// or a batch function's `missing_ttl` for a key left out) capped at `ttl`, else `ttl`; the
    /// cap keeps every bound derived from `ttl` (tag marks, tag sets in Redis, `refresh_after`)
    /// a bound for every value. Then `stale` and `fail_safe` follow, except for a value whose
    /// own time is zero: that one is not cached at all (`missing_ttl = "0s"`), so no stale or
    /// fail-safe window serves it either.
    pub(crate) fn lifetime_of(&self, value: &(dyn Any + Send + Sync)) -> Lifetime {
        let fresh = match self.ttl_from.and_then(|own| own(value)) {
            Some(own) if own.is_zero() => return Lifetime::default(),
            Some(own) => own.min(self.ttl),
            None => self.ttl,
        };
        Lifetime {
            fresh,
            stale: self.stale,
            fail_safe: self.fail_safe.unwrap_or_default(),
        }
    }

    /// How long after it was stored an entry may still be served, fail-safe included.
    pub(crate) fn longest_use(&self) -> Duration {
        let servable = self.ttl.saturating_add(self.stale);
        servable.saturating_add(self.fail_safe.unwrap_or_default())
    }

    /// Whether these values fit together as the attribute's checks of its literals require,
    /// for the values it cannot check at compile time: those given by a path
    /// (`ttl = config::product_ttl`, read when the cache is built) and those set at run time
    /// (`stampede::configure`). What the attribute fixes (which options are on, the backend,
    /// the lock) it has checked already.
    pub(crate) fn check(&self) -> Result<(), Refusal> {
        let refuse = |option, why: String| Err(Refusal { option, why });
        if self.ttl.is_zero() {
            return refuse("ttl", "it must be above zero".into());
        }
        if self.timeout.is_zero() {
            return refuse("timeout", "it must be above zero".into());
        }
        if self.jitter > 100 {
            return refuse(
                "jitter",
                format!("{} is not a percent (0..=100)", self.jitter),
            );
        }
        if self.capacity == 0 {
            return refuse("capacity", "0 would keep nothing".into());
        }
        if self.lock == Lock::None && !self.stale.is_zero() {
            return refuse(
                "stale",
                "it must be zero with `lock = \"none\"` (a stale value's one refresh takes a lock)"
                    .into(),
            );
        }
        if let Some(after) = self.refresh_after
            && (after.is_zero() || after >= self.ttl)
        {
            return refuse(
                "refresh_after",
                format!(
                    "{after:?} must be above zero and below `ttl` ({:?})",
                    self.ttl
                ),
            );
        }
        if let Some(memory_ttl) = self.memory_ttl
            && (memory_ttl.is_zero() || memory_ttl > self.ttl)
        {
            return refuse(
                "memory_ttl",
                format!(
                    "{memory_ttl:?} must be above zero and at most `ttl` ({:?})",
                    self.ttl
                ),
            );
        }
        if let Some(beta) = self.xfetch
            && !(beta.is_finite() && beta > 0.0)
        {
            return refuse("xfetch", format!("beta {beta} must be above zero"));
        }
        for (option, zero) in [
            ("breaker", self.breaker == Some(0)),
            ("max_loads", self.max_loads == Some(0)),
            ("batch_max", self.batch_max == Some(0)),
        ] {
            if zero {
                return refuse(option, "0 would never let a load run".into());
            }
        }
        Ok(())
    }

    /// Whether values are kept in this process.
    pub(crate) fn in_memory(&self) -> bool {
        self.backend != Backend::Redis
    }

    /// The delay before retry number `retry` (0 for the first retry): `backoff * 2^retry`,
    /// scaled by a factor drawn uniformly from `[0.5, 1.5)` so that processes retrying the same
    /// upstream do not stay in step.
    pub(crate) fn backoff_delay(&self, retry: u32) -> Duration {
        let base = self.backoff.saturating_mul(1 << retry.min(16));
        base.mul_f64(crate::random::uniform(0.5..1.5))
    }
}

/// Serializes an optional function as whether it is given.
pub(crate) fn is_set<T, S: serde::Serializer>(
    option: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bool(option.is_some())
}

/// Serializes an optional duration as whole milliseconds, or `null`.
pub(crate) fn millis_opt<S: serde::Serializer>(
    duration: &Option<std::time::Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => millis(duration, serializer),
        None => serializer.serialize_none(),
    }
}

/// Serializes a duration as whole milliseconds (the field says `_ms`).
pub(crate) fn millis<S: serde::Serializer>(
    duration: &std::time::Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}
