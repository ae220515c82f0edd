//! One configured Redis: its connections (one command and one pub/sub connection per tokio
//! runtime, since a connection's driver task dies with the runtime that made it), its health,
//! and the protocol's operations, each bounded by the operation timeout.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::runtime::{self, Handle};
use tokio::time::Instant;

use crate::entry::after;
use crate::redis::config::RedisConfig;
use crate::redis::keys::RedisKeys;
use crate::redis::pubsub::{Listener, Subscriber};
use crate::redis::scripts;

/// How long a generation outlives the invalidation that bumped it: longer than any load.
const GENERATION_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The least time between two warnings that Redis is failing.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct Connection {
    name: String,
    pub(crate) config: RedisConfig,
    links: Mutex<HashMap<runtime::Id, Arc<Link>>>,
    health: Health,
}

/// The metrics of one connection, labelled with its name.
struct ConnectionMetrics {
    /// `redis_error_total`: failed calls.
    errors: metrics::Counter,
    /// `cache_degraded`: 1 while the connection is skipped.
    degraded: metrics::Gauge,
}

/// This runtime's connections to the tier's Redis.
struct Link {
    commands: MultiplexedConnection,
    events: Arc<Subscriber>,
    broken: AtomicBool,
}

impl Link {
    fn usable(&self) -> bool {
        !self.broken.load(Ordering::Acquire) && !self.events.is_dead()
    }
}

/// Why a Redis operation did not happen.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Redis is being skipped after repeated failures.
    CoolingDown,
    NoRuntime,
    Timeout(Duration),
    Redis(redis::RedisError),
    /// The pub/sub connection failed or did not confirm a subscription in time.
    Subscription,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::CoolingDown => {
                f.write_str("skipped during the cool-down after repeated failures")
            }
            Failure::NoRuntime => f.write_str("no tokio runtime to connect on"),
            Failure::Timeout(after) => write!(f, "no answer within {after:?}"),
            Failure::Redis(error) => write!(f, "{error}"),
            Failure::Subscription => f.write_str("the pub/sub connection failed"),
        }
    }
}

/// What `READ_OR_LOCK` found.
pub(crate) struct Read {
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) state: ReadState,
    /// The server's clock when it read, in ms.
    pub(crate) now_ms: u64,
    pub(crate) generation: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadState {
    /// The value is fresh; no lock was taken.
    Fresh,
    /// The caller now holds the lock.
    Locked,
    /// Another holder has the lock for this much longer.
    Busy(Duration),
    /// No lock was asked for.
    NoLock,
}

/// What `FILL` did.
pub(crate) struct Filled {
    /// False when the key was invalidated since it was read: nothing was written.
    pub(crate) written: bool,
    pub(crate) now_ms: u64,
    pub(crate) fresh_until: u64,
    pub(crate) stale_until: u64,
}

/// The load's result, ready to be written.
pub(crate) struct Fill<'a> {
    pub(crate) token: &'a str,
    pub(crate) fresh: Duration,
    pub(crate) stale: Duration,
    pub(crate) load: Duration,
    pub(crate) generation: u64,
    pub(crate) payload: &'a [u8],
}

impl Connection {
    pub(crate) fn new(name: &str, config: RedisConfig) -> Self {
        let label = [("redis", display_name(name).to_owned())];
        let metrics = ConnectionMetrics {
            errors: metrics::counter!("redis_error_total", &label),
            degraded: metrics::gauge!("cache_degraded", &label),
        };
        Connection {
            name: name.to_owned(),
            config,
            links: Mutex::new(HashMap::new()),
            health: Health {
                failures: AtomicU32::new(0),
                state: Mutex::new(HealthState::default()),
                metrics,
            },
        }
    }

    /// The channel on which invalidations are announced to every process.
    pub(crate) fn invalidations_channel(&self) -> String {
        format!("{}:invalidations", self.config.prefix)
    }

    /// Whether Redis is worth asking now: false during a cool-down.
    pub(crate) fn usable(&self) -> bool {
        self.health.usable()
    }

    pub(crate) async fn read_or_lock(
        &self,
        keys: &RedisKeys,
        token: Option<&str>,
        value_unusable: bool,
    ) -> Result<Read, Failure> {
        let token = token.unwrap_or("");
        let lease = millis(self.config.lease);
        let (value, state, now_ms, generation, pttl): (Option<Vec<u8>>, String, u64, u64, i64) =
            self.call(|mut connection| async move {
                scripts::READ_OR_LOCK
                    .key(&keys.value)
                    .key(&keys.lock)
                    .key(&keys.generation)
                    .arg(token)
                    .arg(lease)
                    .arg(if value_unusable { "1" } else { "0" })
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        let state = match state.as_str() {
            "fresh" => ReadState::Fresh,
            "locked" => ReadState::Locked,
            "nolock" => ReadState::NoLock,
            // A lock with no expiry (pttl -1) was not set by us; treat it as a full lease.
            _ => ReadState::Busy(Duration::from_millis(u64::try_from(pttl).unwrap_or(lease))),
        };
        Ok(Read {
            value,
            state,
            now_ms,
            generation,
        })
    }

    pub(crate) async fn fill(&self, keys: &RedisKeys, fill: Fill<'_>) -> Result<Filled, Failure> {
        let (written, now_ms, fresh_until, stale_until): (u8, u64, u64, u64) = self
            .call(|mut connection| async move {
                scripts::FILL
                    .key(&keys.value)
                    .key(&keys.lock)
                    .key(&keys.generation)
                    .arg(fill.token)
                    .arg(millis(fill.fresh).max(1))
                    .arg(millis(fill.stale))
                    .arg(millis(fill.load))
                    .arg(fill.generation)
                    .arg(fill.payload)
                    .arg(&keys.channel)
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        Ok(Filled {
            written: written == 1,
            now_ms,
            fresh_until,
            stale_until,
        })
    }

    /// Releases the lock if `token` still holds it.
    pub(crate) async fn release(&self, keys: &RedisKeys, token: &str) -> Result<bool, Failure> {
        self.call(|mut connection| async move {
            scripts::RELEASE
                .key(&keys.lock)
                .arg(token)
                .arg(&keys.channel)
                .invoke_async(&mut connection)
                .await
        })
        .await
    }

    /// Renews the lease if `token` still holds the lock; `false` if it was lost.
    pub(crate) async fn extend(&self, keys: &RedisKeys, token: &str) -> Result<bool, Failure> {
        let lease = millis(self.config.lease);
        self.call(|mut connection| async move {
            scripts::EXTEND
                .key(&keys.lock)
                .arg(token)
                .arg(lease)
                .invoke_async(&mut connection)
                .await
        })
        .await
    }

    pub(crate) async fn invalidate(&self, keys: &RedisKeys, message: &[u8]) -> Result<(), Failure> {
        let channel = self.invalidations_channel();
        let _: i64 = self
            .call(|mut connection| async move {
                scripts::INVALIDATE
                    .key(&keys.value)
                    .key(&keys.generation)
                    .arg(channel)
                    .arg(message)
                    .arg(millis(GENERATION_TTL))
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Subscribes to a key's channel; the listener hears the next fill published on it.
    pub(crate) async fn listen(&self, keys: &RedisKeys) -> Result<Listener, Failure> {
        if !self.usable() {
            return Err(Failure::CoolingDown);
        }
        let timeout = self.config.op_timeout;
        let link = tokio::time::timeout(timeout, self.link())
            .await
            .map_err(|_| Failure::Timeout(timeout))
            .and_then(|link| link);
        let listened = match link {
            Ok(link) => link
                .events
                .listen(&keys.channel, timeout)
                .await
                .ok_or(Failure::Subscription),
            Err(failure) => Err(failure),
        };
        match listened {
            Ok(listener) => Ok(listener),
            Err(failure) => {
                self.health.failure(&self.name, &failure, &self.config);
                Err(failure)
            }
        }
    }

    /// Runs one operation on this runtime's command connection, bounded by the operation
    /// timeout, and keeps the tier's health up to date.
    async fn call<'a, T, F, Fut>(&'a self, operation: F) -> Result<T, Failure>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + 'a,
    {
        if !self.usable() {
            return Err(Failure::CoolingDown);
        }
        let timeout = self.config.op_timeout;
        let attempt = async {
            let link = self.link().await?;
            operation(link.commands.clone()).await.map_err(|error| {
                if error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_unrecoverable_error()
                {
                    link.broken.store(true, Ordering::Release);
                }
                Failure::Redis(error)
            })
        };
        let outcome = tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or(Err(Failure::Timeout(timeout)));
        match &outcome {
            Ok(_) => self.health.success(&self.name),
            Err(failure) => self.health.failure(&self.name, failure, &self.config),
        }
        outcome
    }

    /// This runtime's connections, made on first use and remade when broken.
    async fn link(&self) -> Result<Arc<Link>, Failure> {
        let runtime = Handle::try_current().map_err(|_| Failure::NoRuntime)?.id();
        if let Some(link) = self.links().get(&runtime).filter(|link| link.usable()) {
            return Ok(link.clone());
        }
        let client = &self.config.client;
        let commands = client
            .get_multiplexed_async_connection()
            .await
            .map_err(Failure::Redis)?;
        let pubsub = client.get_async_pubsub().await.map_err(Failure::Redis)?;
        let events =
            Subscriber::start(pubsub, self.config.op_timeout, self.invalidations_channel());
        let link = Arc::new(Link {
            commands,
            events,
            broken: AtomicBool::new(false),
        });
        let mut links = self.links();
        // Links of runtimes that have shut down are dead: their tasks are gone.
        links.retain(|_, link| link.usable());
        links.insert(runtime, link.clone());
        Ok(link)
    }

    fn links(&self) -> MutexGuard<'_, HashMap<runtime::Id, Arc<Link>>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Failures in a row, the cool-down they trigger, and warnings at most once per interval.
struct Health {
    failures: AtomicU32,
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
    fn usable(&self) -> bool {
        let state = self.lock();
        state.skip_until.is_none_or(|until| Instant::now() >= until)
    }

    fn success(&self, name: &str) {
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

    fn failure(&self, name: &str, failure: &Failure, config: &RedisConfig) {
        if matches!(failure, Failure::CoolingDown) {
            return;
        }
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
        if state
            .last_warning
            .is_none_or(|last| now.duration_since(last) >= WARN_EVERY)
        {
            state.last_warning = Some(now);
            tracing::warn!(
                redis = display_name(name),
                error = %failure,
                failures,
                "stampede: Redis call failed; caches fall back to local singleflight and their own loads"
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn display_name(name: &str) -> &str {
    if name.is_empty() { "default" } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cooldown_of_duration_max_does_not_overflow() {
        let config = RedisConfig::new("redis://127.0.0.1:1")
            .unwrap()
            .cooldown(Duration::MAX, 1);
        let connection = Connection::new("max_cooldown_unit", config);
        connection.health.failure(
            &connection.name,
            &Failure::Timeout(Duration::from_millis(1)),
            &connection.config,
        );
        assert!(!connection.usable(), "skipped during the cool-down");
        connection.health.success(&connection.name);
        assert!(connection.usable());
    }
}
