//! One configured Redis: its links (per tokio runtime, since a connection's driver task dies
//! with the runtime that made it: a command connection and the pub/sub subscriber), its health,
//! and the protocol's operations, each bounded by the operation timeout.
//!
//! A link recovers from every failure, not only from the socket closing:
//!
//! - the command connection is replaced after an IO error, after a `READONLY` reply (a failover
//!   behind DNS: a new connection reaches the new primary), and after
//!   [`TIMEOUTS_BEFORE_RECONNECT`] timeouts in a row (a half-open connection never answers);
//! - making connections is bounded by `connect_timeout` and runs in a task of its own, shared by
//!   every call that needs it (no thundering reconnects); a call waits for it at most its
//!   operation timeout;
//! - the subscriber replaces its own connection in the background (see `pubsub`);
//! - a reply about one key (`WRONGTYPE`, `OOM`) fails that call only: the server answered, so
//!   the connection is neither replaced nor counted as down.
//!
//! The command connection is a [`CommandConnection`]: one multiplexed connection to a standalone
//! server, or the `redis` crate's async cluster connection, which keeps the slot map, sends each
//! command and script to the master owning its first key's slot and follows `MOVED`/`ASK`. Which
//! one is decided when connecting: several URLs are a cluster; one is asked `INFO cluster`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::runtime::{self, Handle};
use tokio::time::Instant;

use crate::entry::after;
use crate::redis::config::RedisConfig;
use crate::redis::keys::RedisKeys;
use crate::redis::pubsub::{Listener, Settings, Shards, Subscriber};
use crate::redis::scripts;

/// The least time between two warnings that Redis is failing.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Timeouts in a row after which a command connection is replaced.
pub(crate) const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;

pub(crate) struct Connection {
    name: String,
    pub(crate) config: RedisConfig,
    links: Mutex<HashMap<runtime::Id, Arc<Link>>>,
    health: Health,
    /// This connection, for the tasks it starts (which must not keep it alive).
    me: Weak<Connection>,
}

/// The metrics of one connection, labelled with its name.
struct ConnectionMetrics {
    /// `redis_error_total`: failed calls.
    errors: metrics::Counter,
    /// `cache_degraded`: 1 while the connection is skipped.
    degraded: metrics::Gauge,
}

/// This runtime's connections to the tier's Redis.
#[derive(Default)]
struct Link {
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    commands: Option<Arc<Commands>>,
    /// Set once its first session was up; from then on it replaces its own connection.
    events: Option<Arc<Subscriber>>,
    /// On a cluster of Redis 7 or later, the sharded subscriptions of wake-ups.
    shards: Option<Arc<Shards>>,
    /// The one attempt at making what is missing, shared by every call that needs it.
    connecting: Option<Connecting>,
}

type Connecting = Shared<BoxFuture<'static, Result<(), Failure>>>;

/// A link ready for a call.
struct Ready {
    commands: Arc<Commands>,
    events: Arc<Subscriber>,
    /// Present on a cluster of Redis 7 or later: wake-ups are subscribed there.
    shards: Option<Arc<Shards>>,
}

/// A connection that runs commands: to a standalone server, or to a cluster, where each command
/// goes to the node owning the slot of its first key (every script's keys share one hash tag).
#[derive(Clone)]
pub(crate) enum CommandConnection {
    Single(MultiplexedConnection),
    Cluster {
        connection: ClusterConnection,
        /// Whether the cluster has sharded pub/sub (Redis 7 and later): wake-ups use it.
        sharded: bool,
    },
}

impl redis::aio::ConnectionLike for CommandConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            CommandConnection::Single(connection) => connection.req_packed_command(cmd),
            CommandConnection::Cluster { connection, .. } => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            CommandConnection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            CommandConnection::Cluster { connection, .. } => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            CommandConnection::Single(connection) => connection.get_db(),
            CommandConnection::Cluster { connection, .. } => connection.get_db(),
        }
    }
}

impl CommandConnection {
    /// The command that publishes a fill on a key's channel: `SPUBLISH` on a cluster of Redis 7
    /// or later (the channel shares the key's hash tag, so it reaches the shard owning the key
    /// only, where the waiters `SSUBSCRIBE`d), `PUBLISH` on a standalone server or an older
    /// cluster (carried to every node).
    pub(crate) fn publish_command(&self) -> &'static str {
        if self.sharded() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Whether wake-ups go through sharded pub/sub.
    fn sharded(&self) -> bool {
        matches!(self, CommandConnection::Cluster { sharded: true, .. })
    }

    /// Connects to `nodes`: a cluster if there are several or the first says it is one.
    async fn open(nodes: &[redis::Client], timeout: Duration) -> Result<Self, Failure> {
        let first = nodes.first().ok_or(Failure::Unavailable)?;
        if nodes.len() == 1 {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                // Every call has its own bound, the operation timeout.
                .set_response_timeout(None);
            let mut connection = first
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(Failure::Redis)?;
            let info: String = match redis::cmd("INFO")
                .arg("cluster")
                .query_async(&mut connection)
                .await
            {
                Ok(info) => info,
                // A server that refuses INFO (an ACL without it) is taken to be standalone.
                Err(error) if error.code().is_some() => String::new(),
                Err(error) => return Err(Failure::Redis(error)),
            };
            if !cluster_enabled(&info) {
                return Ok(CommandConnection::Single(connection));
            }
        }
        let client = redis::cluster::ClusterClientBuilder::new(
            nodes.iter().map(|node| node.get_connection_info().clone()),
        )
        .connection_timeout(timeout)
        .build()
        .map_err(Failure::Redis)?;
        let mut connection = client
            .get_async_connection()
            .await
            .map_err(Failure::Redis)?;
        let info = connection
            .route_command(
                redis::cmd("INFO").arg("server").clone(),
                redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::Random,
                ),
            )
            .await;
        // A node that refuses INFO (an ACL without it) is taken to be recent enough.
        let sharded = match info {
            Ok(info) => redis::from_redis_value::<String>(info)
                .map_or(true, |info| has_sharded_pubsub(&info)),
            Err(error) if error.code().is_some() => true,
            Err(error) => return Err(Failure::Redis(error)),
        };
        Ok(CommandConnection::Cluster {
            connection,
            sharded,
        })
    }
}

/// Whether an `INFO server` reply is from Redis 7 or later, which has sharded pub/sub.
fn has_sharded_pubsub(info: &str) -> bool {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
        .and_then(|version| version.split('.').next()?.parse::<u32>().ok())
        .is_none_or(|major| major >= 7)
}

/// Whether an `INFO cluster` reply says the server runs in cluster mode.
fn cluster_enabled(info: &str) -> bool {
    info.lines().any(|line| line.trim() == "cluster_enabled:1")
}

/// One command connection, and whether it must be replaced.
struct Commands {
    connection: CommandConnection,
    /// Timeouts in a row.
    timeouts: AtomicU32,
    broken: AtomicBool,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether nothing of it can serve again: its runtime shut down, or it never connected.
    fn is_dead(&self) -> bool {
        let state = self.lock();
        match &state.events {
            Some(events) => events.is_dead(),
            None => state.connecting.is_none(),
        }
    }
}

impl LinkState {
    fn ready(&self) -> Option<Ready> {
        let commands = self
            .commands
            .as_ref()
            .filter(|commands| commands.usable())?;
        let events = self.events.as_ref().filter(|events| !events.is_dead())?;
        let shards = if commands.connection.sharded() {
            Some(
                self.shards
                    .as_ref()
                    .filter(|shards| !shards.is_dead())?
                    .clone(),
            )
        } else {
            None
        };
        Some(Ready {
            commands: commands.clone(),
            events: events.clone(),
            shards,
        })
    }
}

impl Commands {
    fn usable(&self) -> bool {
        !self.broken.load(Ordering::Acquire)
    }

    /// Runs `operation` until `deadline`, and notes what its outcome says of the connection.
    async fn run<'a, T, F, Fut>(
        &self,
        deadline: Instant,
        timeout: Duration,
        operation: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(CommandConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + 'a,
    {
        match tokio::time::timeout_at(deadline, operation(self.connection.clone())).await {
            Ok(Ok(value)) => {
                self.timeouts.store(0, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(error)) => match scope(&error) {
                Scope::Key => {
                    self.timeouts.store(0, Ordering::Relaxed);
                    Err(Failure::Refused(error))
                }
                Scope::Link => {
                    self.broken.store(true, Ordering::Release);
                    Err(Failure::Redis(error))
                }
                Scope::Server => Err(Failure::Redis(error)),
            },
            Err(_) => {
                let timeouts = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
                if timeouts >= TIMEOUTS_BEFORE_RECONNECT {
                    self.broken.store(true, Ordering::Release);
                }
                Err(Failure::Timeout(timeout))
            }
        }
    }
}

/// What a Redis error reply says about the connection it came on.
#[derive(Debug, PartialEq, Eq)]
enum Scope {
    /// Only the key the call was about (`WRONGTYPE`, `OOM`): the connection is fine.
    Key,
    /// The connection must be replaced (IO, dropped, `READONLY`).
    Link,
    /// The server cannot serve now (`LOADING`, `BUSY`, `MASTERDOWN`, ...): a failure.
    Server,
}

fn scope(error: &redis::RedisError) -> Scope {
    if has_code(error, "READONLY")
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        Scope::Link
    } else if has_code(error, "WRONGTYPE") || has_code(error, "OOM") {
        Scope::Key
    } else {
        Scope::Server
    }
}

/// Whether the reply's code is `code`, or (before Redis 7) a script's `ERR Error running
/// script` reply quotes it.
fn has_code(error: &redis::RedisError, code: &str) -> bool {
    match error.code() {
        Some(found) if found == code => true,
        Some("ERR") => error.detail().is_some_and(|detail| {
            detail
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| word == code)
        }),
        _ => false,
    }
}

/// Why a Redis operation did not happen.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// Redis is being skipped after repeated failures.
    CoolingDown,
    NoRuntime,
    Timeout(Duration),
    /// Redis refused the call because of the key it is about (`WRONGTYPE`, `OOM`).
    Refused(redis::RedisError),
    Redis(redis::RedisError),
    /// The pub/sub connection failed or did not confirm a subscription in time.
    Subscription,
    /// No usable connection could be made.
    Unavailable,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::CoolingDown => {
                f.write_str("skipped during the cool-down after repeated failures")
            }
            Failure::NoRuntime => f.write_str("no tokio runtime to connect on"),
            Failure::Timeout(after) => write!(f, "no answer within {after:?}"),
            Failure::Refused(error) | Failure::Redis(error) => write!(f, "{error}"),
            Failure::Subscription => f.write_str("the pub/sub connection failed"),
            Failure::Unavailable => f.write_str("no usable connection could be made"),
        }
    }
}

/// What `READ_OR_LOCK` found.
pub(crate) struct Read {
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) state: ReadState,
    /// The server's clock when it read, in ms.
    pub(crate) now_ms: u64,
    /// The key's fence: the one this flow took with the lock, else the current one.
    pub(crate) fence: u64,
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
    /// How long Redis keeps the value past its stale deadline: the cache's `fail_safe`.
    pub(crate) keep_for: Duration,
    pub(crate) load: Duration,
    /// The fence the read returned: the fill is refused unless it is still the key's fence.
    pub(crate) fence: u64,
    pub(crate) payload: &'a [u8],
}

impl Fill<'_> {
    /// The fill, with how long its load took (the envelope records it).
    pub(crate) fn loaded_in(mut self, load: Duration) -> Self {
        self.load = load;
        self
    }
}

impl Connection {
    pub(crate) fn new(name: &str, config: RedisConfig) -> Arc<Self> {
        let label = [("redis", display_name(name).to_owned())];
        let metrics = ConnectionMetrics {
            errors: metrics::counter!("redis_error_total", &label),
            degraded: metrics::gauge!("cache_degraded", &label),
        };
        Arc::new_cyclic(|me| Connection {
            name: name.to_owned(),
            config,
            links: Mutex::new(HashMap::new()),
            health: Health {
                failures: AtomicU32::new(0),
                state: Mutex::new(HealthState::default()),
                metrics,
            },
            me: me.clone(),
        })
    }

    /// The channel on which invalidations are announced to every process.
    pub(crate) fn invalidations_channel(&self) -> String {
        format!("{}:invalidations", self.config.prefix)
    }

    /// Whether Redis is worth asking now: false during a cool-down.
    pub(crate) fn usable(&self) -> bool {
        self.health.usable()
    }

    /// The value at `value_key` if it is fresh by the server's clock, with that clock's time
    /// (ms).
    pub(crate) async fn read_fresh(
        &self,
        value_key: &str,
    ) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        self.call(|mut connection| async move {
            scripts::READ_FRESH
                .key(value_key)
                .invoke_async(&mut connection)
                .await
        })
        .await
    }

    pub(crate) async fn read_or_lock(
        &self,
        keys: &RedisKeys,
        token: Option<&str>,
        value_unusable: bool,
    ) -> Result<Read, Failure> {
        let token = token.unwrap_or("");
        let lease = millis(self.config.lease);
        let (value, state, now_ms, fence, pttl): (Option<Vec<u8>>, String, u64, u64, i64) = self
            .call(|mut connection| async move {
                scripts::READ_OR_LOCK
                    .key(&keys.value)
                    .key(&keys.lock)
                    .key(&keys.fence)
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
            fence,
        })
    }

    pub(crate) async fn fill(&self, keys: &RedisKeys, fill: Fill<'_>) -> Result<Filled, Failure> {
        let (written, now_ms, fresh_until, stale_until): (u8, u64, u64, u64) = self
            .call(|mut connection| async move {
                scripts::FILL
                    .key(&keys.value)
                    .key(&keys.lock)
                    .key(&keys.fence)
                    .arg(fill.token)
                    .arg(millis(fill.fresh).max(1))
                    .arg(millis(fill.stale))
                    .arg(millis(fill.load))
                    .arg(fill.fence)
                    .arg(fill.payload)
                    .arg(&keys.channel)
                    .arg(millis(fill.keep_for))
                    .arg(connection.publish_command())
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
                .arg(connection.publish_command())
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
                .key(&keys.fence)
                .arg(token)
                .arg(lease)
                .invoke_async(&mut connection)
                .await
        })
        .await
    }

    /// Drops a key's value and moves its fence on; announces `message` on the invalidation
    /// channel, unless `None` (a tag's keys: the tag is announced once for all).
    pub(crate) async fn invalidate(
        &self,
        keys: &RedisKeys,
        message: Option<&[u8]>,
    ) -> Result<(), Failure> {
        let (channel, message) = match message {
            Some(message) => (self.invalidations_channel(), message),
            None => (String::new(), &[][..]),
        };
        let _: i64 = self
            .call(|mut connection| async move {
                scripts::INVALIDATE
                    .key(&keys.value)
                    .key(&keys.fence)
                    .arg(channel)
                    .arg(message)
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Subscribes to a key's channel (sharded on a cluster); the listener hears the next fill
    /// published on it.
    pub(crate) async fn listen(&self, keys: &RedisKeys) -> Result<Listener, Failure> {
        if !self.usable() {
            return Err(Failure::CoolingDown);
        }
        let timeout = self.config.op_timeout;
        let deadline = after(Instant::now(), timeout);
        let listened = match tokio::time::timeout_at(deadline, self.link()).await {
            Ok(Ok(link)) => {
                let wait = deadline.saturating_duration_since(Instant::now());
                let listened = match &link.shards {
                    Some(shards) => shards.listen(&keys.channel, wait).await,
                    None => link.events.listen(&keys.channel, wait).await,
                };
                listened.ok_or(Failure::Subscription)
            }
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Timeout(timeout)),
        };
        if let Err(failure) = &listened {
            self.health.failure(&self.name, failure, &self.config);
        }
        listened
    }

    /// How long this process may keep in memory a value it reads from or writes to Redis now:
    /// `None` (as long as the cache's own deadlines say) while the invalidation feed is live,
    /// `Some(bound)` while it is not known to be (`2 × heartbeat + op_timeout`, see `pubsub`):
    /// an invalidation missed meanwhile is then outlived by at most that bound.
    /// `Some(Duration::ZERO)` would mean: keep nothing.
    pub(crate) fn memory_trusted_for(&self) -> Option<Duration> {
        let now = Instant::now();
        let live = self.links().values().any(|link| {
            link.lock()
                .events
                .as_ref()
                .is_some_and(|events| events.is_live(now))
        });
        if live {
            None
        } else {
            Some(self.config.staleness_bound())
        }
    }

    /// Publishes a heartbeat token for this runtime's subscriber to hear. Not skipped during a
    /// cool-down: it is the probe that ends it, and it replaces a command connection that stopped
    /// answering even when no cache calls Redis.
    pub(crate) async fn heartbeat(&self, channel: &str, token: u64) {
        let _ = self
            .attempt(|mut connection| async move {
                redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(token)
                    .query_async::<i64>(&mut connection)
                    .await
            })
            .await;
    }

    /// This runtime's invalidation feed was lost (its subscriber dropped every cache's memory).
    pub(crate) fn feed_lost(&self, reason: &'static str) {
        if self.health.warn_now() {
            tracing::warn!(
                redis = display_name(&self.name),
                reason,
                "stampede: the Redis invalidation feed was lost; memory of Redis-backed caches \
                 dropped, resubscribing in the background"
            );
        }
    }

    /// This runtime's invalidation feed is back after a loss.
    pub(crate) fn feed_restored(&self) {
        tracing::info!(
            redis = display_name(&self.name),
            "stampede: the Redis invalidation feed is back"
        );
    }

    /// Asks Redis for a `PONG`, connecting first if needed, within the connection and operation
    /// timeouts; for a start-up check.
    pub(crate) async fn ping(&self) -> Result<(), Failure> {
        let deadline = after(
            Instant::now(),
            self.config
                .connect_timeout
                .saturating_add(self.config.op_timeout),
        );
        tokio::time::timeout_at(deadline, async {
            loop {
                match self
                    .attempt(|mut connection| async move {
                        redis::cmd("PING")
                            .query_async::<String>(&mut connection)
                            .await
                    })
                    .await
                {
                    Ok(_) => return Ok(()),
                    // A connection being made for another call: wait for it.
                    Err(Failure::Timeout(_)) => continue,
                    Err(failure) => return Err(failure),
                }
            }
        })
        .await
        .unwrap_or(Err(Failure::Timeout(self.config.connect_timeout)))
    }

    /// Runs one operation on this runtime's command connection, unless Redis is cooling down.
    pub(super) async fn call<'a, T, F, Fut>(&'a self, operation: F) -> Result<T, Failure>
    where
        F: FnOnce(CommandConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + 'a,
    {
        if !self.usable() {
            return Err(Failure::CoolingDown);
        }
        self.attempt(operation).await
    }

    /// Runs one operation on this runtime's command connection, bounded by the operation
    /// timeout (the wait for a connection included), and keeps the tier's health up to date.
    async fn attempt<'a, T, F, Fut>(&'a self, operation: F) -> Result<T, Failure>
    where
        F: FnOnce(CommandConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>> + 'a,
    {
        let timeout = self.config.op_timeout;
        let deadline = after(Instant::now(), timeout);
        let outcome = match tokio::time::timeout_at(deadline, self.link()).await {
            Ok(Ok(link)) => link.commands.run(deadline, timeout, operation).await,
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Timeout(timeout)),
        };
        match &outcome {
            Ok(_) => self.health.success(&self.name),
            Err(refused @ Failure::Refused(_)) => self.health.refused(&self.name, refused),
            Err(failure) => self.health.failure(&self.name, failure, &self.config),
        }
        outcome
    }

    /// This runtime's link, made on first use; what is missing or broken is remade by one
    /// attempt that every caller shares.
    async fn link(&self) -> Result<Ready, Failure> {
        let runtime = Handle::try_current().map_err(|_| Failure::NoRuntime)?;
        let link = self.runtime_link(runtime.id());
        for _ in 0..2 {
            let attempt = {
                let mut state = link.lock();
                if let Some(ready) = state.ready() {
                    return Ok(ready);
                }
                match &state.connecting {
                    Some(attempt) => attempt.clone(),
                    None => {
                        let attempt = self.connect(&runtime, &link, &state);
                        state.connecting = Some(attempt.clone());
                        attempt
                    }
                }
            };
            attempt.await?;
        }
        link.lock().ready().ok_or(Failure::Unavailable)
    }

    fn runtime_link(&self, runtime: runtime::Id) -> Arc<Link> {
        let mut links = self.links();
        if let Some(link) = links.get(&runtime) {
            return link.clone();
        }
        // Links of runtimes that have shut down are dead: their tasks are gone.
        links.retain(|_, link| !link.is_dead());
        let link = Arc::new(Link::default());
        links.insert(runtime, link.clone());
        link
    }

    /// Makes, in a task of its own bounded by the connect timeout, what `state` lacks: a command
    /// connection, a subscriber whose first session is up and, on a cluster of Redis 7 or
    /// later, the sharded subscriptions.
    fn connect(&self, runtime: &Handle, link: &Arc<Link>, state: &LinkState) -> Connecting {
        let usable = state.commands.as_ref().filter(|c| c.usable());
        let commands_needed = usable.is_none();
        let known_sharded = usable.is_some_and(|c| c.connection.sharded());
        let shards_needed = state.shards.as_ref().is_none_or(|shards| shards.is_dead());
        let events_needed = state.events.as_ref().is_none_or(|events| events.is_dead());
        let settings = events_needed.then(|| self.subscriber_settings());
        let nodes = self.config.nodes.clone();
        let timeout = self.config.connect_timeout;
        let (op_timeout, retry_every) = (self.config.op_timeout, self.config.heartbeat);
        let link = link.clone();
        let task = runtime.spawn(async move {
            let commands = async {
                let commands = if commands_needed {
                    let connection = CommandConnection::open(&nodes, timeout).await?;
                    Some(Arc::new(Commands {
                        connection,
                        timeouts: AtomicU32::new(0),
                        broken: AtomicBool::new(false),
                    }))
                } else {
                    None
                };
                let sharded = commands
                    .as_ref()
                    .map_or(known_sharded, |c| c.connection.sharded());
                let shards = if sharded && shards_needed {
                    let shards = Shards::open(&nodes, timeout, op_timeout, retry_every)
                        .await
                        .map_err(Failure::Redis)?;
                    Some(shards)
                } else {
                    None
                };
                Ok((commands, shards))
            };
            let events = async {
                let Some(settings) = settings else {
                    return Ok(None);
                };
                let events = Subscriber::start(settings);
                events.wait_up().await;
                Ok(Some(events))
            };
            let made = tokio::time::timeout(timeout, async { tokio::try_join!(commands, events) })
                .await
                .unwrap_or(Err(Failure::Timeout(timeout)));
            let mut state = link.lock();
            state.connecting = None;
            let ((commands, shards), events) = made?;
            if let Some(commands) = commands {
                state.commands = Some(commands);
            }
            if let Some(shards) = shards {
                state.shards = Some(shards);
            }
            if let Some(events) = events {
                state.events = Some(events);
            }
            Ok(())
        });
        async move { task.await.unwrap_or(Err(Failure::NoRuntime)) }
            .boxed()
            .shared()
    }

    fn subscriber_settings(&self) -> Settings {
        Settings {
            nodes: self.config.nodes.clone(),
            invalidations: self.invalidations_channel(),
            heartbeats: format!(
                "{}:heartbeat:{:016x}",
                self.config.prefix,
                rand::random::<u64>()
            ),
            heartbeat: self.config.heartbeat,
            op_timeout: self.config.op_timeout,
            connect_timeout: self.config.connect_timeout,
            bound: self.config.staleness_bound(),
            connection: self.me.clone(),
        }
    }

    fn links(&self) -> MutexGuard<'_, HashMap<runtime::Id, Arc<Link>>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) fn millis(duration: Duration) -> u64 {
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
        drop(state);
        if self.warn_now() {
            tracing::warn!(
                redis = display_name(name),
                error = %failure,
                failures,
                "stampede: Redis call failed; caches fall back to local singleflight and their own loads"
            );
        }
    }

    /// A call refused because of its key: the server answers, so the connection is not down.
    fn refused(&self, name: &str, failure: &Failure) {
        self.success(name);
        self.metrics.errors.increment(1);
        if self.warn_now() {
            tracing::warn!(
                redis = display_name(name),
                error = %failure,
                "stampede: Redis refused a call about one key; that key is loaded locally"
            );
        }
    }

    /// Whether a warning may be logged now: at most one per interval, whatever it is about.
    fn warn_now(&self) -> bool {
        let now = Instant::now();
        let mut state = self.lock();
        let due = state
            .last_warning
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY);
        if due {
            state.last_warning = Some(now);
        }
        due
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

    fn reply(code: &str, detail: &str) -> redis::RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn an_error_about_one_key_does_not_condemn_the_connection() {
        let wrong_type = reply(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value script: 1f, on @user_script:1.",
        );
        assert_eq!(scope(&wrong_type), Scope::Key);
        let oom = reply("OOM", "command not allowed when used memory > 'maxmemory'.");
        assert_eq!(scope(&oom), Scope::Key);
        // Redis 6 wraps a script's error in `ERR Error running script`.
        let wrapped = reply(
            "ERR",
            "Error running script (call to f_1f): @user_script:1: WRONGTYPE Operation against a key",
        );
        assert_eq!(scope(&wrapped), Scope::Key);
    }

    #[test]
    fn readonly_and_io_errors_replace_the_connection_and_others_count_as_failures() {
        let readonly = reply("READONLY", "You can't write against a read only replica.");
        assert_eq!(scope(&readonly), Scope::Link);
        let reset =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(scope(&reset), Scope::Link);
        let loading = reply("LOADING", "Redis is loading the dataset in memory");
        assert_eq!(scope(&loading), Scope::Server);
        let script = reply(
            "ERR",
            "Error running script: attempt to compare nil with number",
        );
        assert_eq!(scope(&script), Scope::Server);
    }

    #[test]
    fn sharded_pubsub_is_used_from_redis_7_on() {
        assert!(has_sharded_pubsub("# Server\r\nredis_version:7.0.15\r\n"));
        assert!(has_sharded_pubsub("redis_version:8.2.1"));
        assert!(!has_sharded_pubsub("# Server\r\nredis_version:6.2.14\r\n"));
        assert!(
            has_sharded_pubsub(""),
            "no version said: taken to be recent"
        );
    }

    #[test]
    fn cluster_mode_is_read_from_info_cluster() {
        assert!(cluster_enabled("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!cluster_enabled("# Cluster\r\ncluster_enabled:0\r\n"));
        assert!(!cluster_enabled(""), "no INFO: standalone");
    }

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

    #[tokio::test]
    async fn memory_is_not_trusted_without_a_live_feed() {
        let config = RedisConfig::new("redis://127.0.0.1:1").unwrap();
        let connection = Connection::new("untrusted_unit", config);
        assert_eq!(
            connection.memory_trusted_for(),
            Some(Duration::from_millis(2_250)),
            "never subscribed: values are kept at most the staleness bound"
        );
    }
}
