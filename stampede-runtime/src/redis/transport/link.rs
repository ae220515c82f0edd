//! This runtime's connections to one Redis: a command connection and the pub/sub subscriber
//! (and, on a cluster of Redis 7 or later, the sharded subscriptions), made together by one
//! attempt, since a connection's driver task dies with the runtime that made it.
//!
//! The command connection is a [`CommandConnection`]: one multiplexed connection to a standalone
//! server, or the `redis` crate's async cluster connection, which keeps the slot map, sends each
//! command and script to the master owning its first key's slot and follows `MOVED`/`ASK`. Which
//! one is decided when connecting: several URLs are a cluster; one is asked (`HELLO`, else `INFO
//! cluster`, else `CLUSTER INFO`, see `mode`). It is replaced after an IO error, after a
//! `READONLY` reply (a failover behind DNS: a new connection reaches the new primary), and after
//! [`TIMEOUTS_BEFORE_RECONNECT`] timeouts in a row (a half-open connection never answers).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use tokio::time::Instant;

use crate::redis::transport::failure::{Failure, Scope, scope};
use crate::redis::transport::mode::{self, Mode};
use crate::redis::transport::pubsub::{Shards, Subscriber, master_slots};
use crate::redis::transport::tls::{self, Tls};

/// Timeouts in a row after which a command connection is replaced.
pub(crate) const TIMEOUTS_BEFORE_RECONNECT: u32 = 2;

/// This runtime's connections to the tier's Redis.
#[derive(Default)]
pub(in crate::redis) struct Link {
    state: Mutex<LinkState>,
}

#[derive(Default)]
pub(in crate::redis) struct LinkState {
    pub(in crate::redis) commands: Option<Arc<Commands>>,
    /// Set once its first session was up; from then on it replaces its own connection.
    pub(in crate::redis) events: Option<Arc<Subscriber>>,
    /// On a cluster of Redis 7 or later, the sharded subscriptions of wake-ups.
    pub(in crate::redis) shards: Option<Arc<Shards>>,
    /// The one attempt at making what is missing, shared by every call that needs it.
    pub(in crate::redis) connecting: Option<Connecting>,
}

pub(in crate::redis) type Connecting = Shared<BoxFuture<'static, Result<(), Failure>>>;

/// A link ready for a call.
pub(in crate::redis) struct Ready {
    pub(in crate::redis) commands: Arc<Commands>,
    pub(in crate::redis) events: Arc<Subscriber>,
    /// Present on a cluster of Redis 7 or later: wake-ups are subscribed there.
    pub(in crate::redis) shards: Option<Arc<Shards>>,
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
    /// What this connection reaches.
    pub(crate) fn mode(&self) -> Mode {
        match self {
            CommandConnection::Single(_) => Mode::Standalone,
            CommandConnection::Cluster { sharded, .. } => Mode::Cluster { sharded: *sharded },
        }
    }

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

    /// Where a scan of every key goes: the server (`None`), or one slot of each master of a
    /// cluster (`CLUSTER SLOTS`, asked of any node).
    pub(in crate::redis) async fn scan_targets(&mut self) -> redis::RedisResult<Vec<Option<u16>>> {
        match self {
            CommandConnection::Single(_) => Ok(vec![None]),
            CommandConnection::Cluster { connection, .. } => {
                let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
                let reply = connection
                    .route_command(
                        slots,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                Ok(master_slots(&reply).into_iter().map(Some).collect())
            }
        }
    }

    /// One page of `SCAN cursor MATCH pattern` on the node `target` names (see
    /// [`CommandConnection::scan_targets`]): the next cursor (0 when done) and the keys found.
    pub(in crate::redis) async fn scan_page(
        &mut self,
        target: Option<u16>,
        cursor: u64,
        pattern: &str,
    ) -> redis::RedisResult<(u64, Vec<String>)> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000);
        let reply = match (self, target) {
            (CommandConnection::Cluster { connection, .. }, Some(slot)) => {
                let route = Route::new(slot, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                connection.route_command(scan, routing).await?
            }
            (connection, _) => scan.query_async::<redis::Value>(connection).await?,
        };
        Ok(redis::from_redis_value(reply)?)
    }

    /// Whether wake-ups go through sharded pub/sub.
    pub(in crate::redis) fn sharded(&self) -> bool {
        matches!(self, CommandConnection::Cluster { sharded: true, .. })
    }

    /// Connects to `nodes`: a cluster if there are several or the first says it is one. A
    /// cluster's connections use `tls`'s certificates (the nodes' own clients carry them too).
    pub(in crate::redis) async fn open(
        nodes: &[redis::Client],
        tls: &Tls,
        timeout: Duration,
    ) -> Result<Self, Failure> {
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
            // HELLO, then INFO, then CLUSTER INFO: a refused INFO is not a standalone server.
            if !mode::is_cluster(&mut connection).await? {
                return Ok(CommandConnection::Single(connection));
            }
        }
        let client = tls::cluster_builder(nodes, tls)
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

/// One command connection, and whether it must be replaced.
pub(in crate::redis) struct Commands {
    pub(in crate::redis) connection: CommandConnection,
    /// Timeouts in a row.
    timeouts: AtomicU32,
    broken: AtomicBool,
}

impl Link {
    pub(in crate::redis) fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether nothing of it can serve again: its runtime shut down, or it never connected.
    pub(in crate::redis) fn is_dead(&self) -> bool {
        let state = self.lock();
        match &state.events {
            Some(events) => events.is_dead(),
            None => state.connecting.is_none(),
        }
    }
}

impl LinkState {
    pub(in crate::redis) fn ready(&self) -> Option<Ready> {
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
    pub(in crate::redis) fn new(connection: CommandConnection) -> Self {
        Commands {
            connection,
            timeouts: AtomicU32::new(0),
            broken: AtomicBool::new(false),
        }
    }

    pub(in crate::redis) fn usable(&self) -> bool {
        !self.broken.load(Ordering::Acquire)
    }

    /// Runs `operation` until `deadline`, and notes what its outcome says of the connection.
    pub(in crate::redis) async fn run<'a, T, F, Fut>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
