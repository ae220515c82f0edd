//! One configured Redis, an [`Endpoint`]: its links (one per tokio runtime, see `link`), its
//! health (see `health`), and the two ways a call reaches it, both bounded by the operation
//! timeout, the wait for a link included. The protocol's operations are in `ops`.
//!
//! A link recovers from every failure, not only from the socket closing: what is missing or
//! broken is made again by one attempt, bounded by `connect_timeout`, in a task of its own and
//! shared by every call that needs it (no thundering reconnects); a call waits for it at most
//! its operation timeout. The subscriber replaces its own connection in the background (see
//! `pubsub`).
//!
//! On a cluster, every connection is made through the nodes known ([`Topology`]): the seeds
//! given, then every node the cluster named when the subscriber last asked it for its slot map;
//! so a process given one node's URL still connects once that node is gone.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::runtime::{self, Handle};
use tokio::time::Instant;

use crate::clock::after;
use crate::redis::codec::keys::RedisKeys;
use crate::redis::transport::config::RedisConfig;
use crate::redis::transport::dirty::Dirty;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::health::{Health, display_name};
use crate::redis::transport::invalidate;
use crate::redis::transport::link::{
    CommandConnection, Commands, Connecting, Link, LinkState, Ready,
};
use crate::redis::transport::log::{LogId, Position};
use crate::redis::transport::mode::Mode;
use crate::redis::transport::pubsub::{
    ClusterFeed, FeedOwner, Listener, Settings, Shards, Subscriber, Topology, Unheard,
};

/// The states of [`Endpoint`]'s feed.
const FEED_NEVER: u8 = 0;
const FEED_HEARD: u8 = 1;
const FEED_LOST: u8 = 2;

pub(crate) struct Endpoint {
    pub(in crate::redis) name: String,
    pub(crate) config: RedisConfig,
    links: Mutex<HashMap<runtime::Id, Arc<Link>>>,
    pub(in crate::redis) health: Health,
    /// The keys this process changed while Redis could not be used (see `dirty`).
    pub(crate) dirty: Dirty,
    /// The nodes known: the seeds given and, on a cluster, those it named.
    topology: Arc<Topology>,
    /// What the invalidation feeds of this Redis heard so far, in every runtime: `FEED_NEVER`
    /// (no session was up), `FEED_HEARD` (one was), `FEED_LOST` (one was lost, and warned about,
    /// and none came up since). A session that comes up after another is a recovery, whether
    /// the other's runtime is still there or not (see `pubsub`).
    feed: AtomicU8,
    /// How far this process has handled the invalidation log, in every runtime.
    position: Mutex<Option<Position>>,
    /// This connection, for the tasks it starts (which must not keep it alive).
    me: Weak<Endpoint>,
}

impl Endpoint {
    pub(crate) fn new(name: &str, config: RedisConfig) -> Arc<Self> {
        Arc::new_cyclic(|me| Endpoint {
            name: name.to_owned(),
            topology: Arc::new(Topology::new(config.nodes.clone())),
            config,
            links: Mutex::new(HashMap::new()),
            health: Health::new(name),
            dirty: Dirty::default(),
            feed: AtomicU8::new(FEED_NEVER),
            position: Mutex::new(None),
            me: me.clone(),
        })
    }

    /// Whether Redis is worth asking now: false during a cool-down.
    pub(crate) fn usable(&self) -> bool {
        self.health.usable()
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
                listened.map_err(|unheard| match unheard {
                    Unheard::Failed => Failure::Subscription,
                    Unheard::Unconfirmed(wait) => Failure::Unconfirmed(wait),
                })
            }
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Timeout(timeout)),
        };
        if let Err(failure) = &listened {
            self.health.failure(&self.name, failure, &self.config);
        }
        listened
    }

    /// How long this process may keep in memory a value it loaded or primed here because Redis
    /// could not be used: the staleness bound (or `trust_while_deaf`), whatever the feed says. Redis does not have the
    /// value, so nothing there would ever replace it; and the process reads Redis again (where
    /// the key is dropped first, see `dirty`) only once memory no longer serves it.
    pub(crate) fn trusted_for_unshared(&self) -> Option<Duration> {
        Some(self.config.trusted_while_deaf())
    }

    /// How long this process may keep in memory a value it reads from or writes to Redis now,
    /// counted from when the read or load began (`Begun`): `None` (as long as the cache's own
    /// deadlines say) while the invalidation feed is live, `Some(bound)` while it is not known
    /// to be (`2 × heartbeat + op_timeout`, see `pubsub`, or the connection's
    /// `trust_while_deaf`): an invalidation missed meanwhile is then outlived by at most that,
    /// however long the load took.
    /// `Some(Duration::ZERO)` would mean: keep nothing.
    pub(crate) fn trusted_for(&self) -> Option<Duration> {
        if self.feed_live() {
            None
        } else {
            Some(self.config.trusted_while_deaf())
        }
    }

    /// Publishes a heartbeat token for this runtime's subscriber to hear. Not skipped during a
    /// cool-down: it is the probe that ends it, and it replaces a command connection that stopped
    /// answering even when no cache calls Redis.
    /// Published the way invalidations are (see `invalidate`).
    pub(crate) async fn heartbeat(&self, channel: &str, token: u64) -> Option<LogId> {
        let token = token.to_string();
        let token = token.as_bytes();
        self.attempt(|mut connection| async move {
            let (log, most) = self.log_of(connection.mode());
            invalidate::beat(&mut connection, (channel, &log, most), token).await
        })
        .await
        .ok()
        .flatten()
    }

    /// The invalidation feed's log on a server of `mode`, and how many entries it keeps.
    pub(crate) fn log_of(&self, mode: Mode) -> (String, usize) {
        (
            invalidate::log_key(&self.config.prefix, mode),
            self.config.log_len,
        )
    }

    /// A session of the server of run `run` handled everything its invalidation log held up to
    /// `id`: the process's position, unless it knows a later one of that run.
    fn heard_up_to(&self, run: &Arc<str>, id: LogId) {
        let mut position = self.position.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *position {
            Some(known) if known.run == *run => known.id = known.id.max(id),
            _ => {
                *position = Some(Position {
                    run: run.clone(),
                    id,
                });
            }
        }
    }

    /// A session of a runtime's invalidation feed ended (its subscriber took every cache's
    /// memory out of service): lost, and why, and resubscribing; or (`None`) ended with its runtime or its
    /// subscriber, and nothing resubscribes.
    pub(crate) fn feed_lost(&self, reason: Option<&'static str>) {
        let Some(reason) = reason else {
            tracing::debug!(
                redis = display_name(&self.name),
                "stampede: a Redis invalidation feed ended with its runtime or connection; \
                 memory of Redis-backed caches out of service until a feed is back"
            );
            return;
        };
        self.feed.store(FEED_LOST, Ordering::Release);
        if self.health.warn_now() {
            tracing::warn!(
                redis = display_name(&self.name),
                reason,
                "stampede: the Redis invalidation feed was lost; memory of Redis-backed caches \
                 out of service from the trust while deaf after the last heartbeat heard until \
                 it is back, resubscribing in the background"
            );
        }
    }

    /// Whether an invalidation feed of this Redis is live now, in any runtime: it hears every
    /// invalidation announced, so memory is trusted.
    pub(crate) fn feed_live(&self) -> bool {
        let now = Instant::now();
        self.links().values().any(|link| {
            link.lock()
                .events
                .as_ref()
                .is_some_and(|events| events.is_live(now))
        })
    }

    /// A session of a runtime's invalidation feed is up. Returns whether it is a recovery: a
    /// session of this Redis was up before, in this runtime or another (gone, or idle: either
    /// way it may have heard nothing since, and an idle one still looks live for up to the
    /// bound), so invalidations may have been missed; the subscriber reads them from the log,
    /// or drops the memory of the caches that share values through this Redis.
    pub(crate) fn feed_up(&self) -> bool {
        match self.feed.swap(FEED_HEARD, Ordering::AcqRel) {
            FEED_NEVER => false,
            // Told by `recovered`, once the log has been read.
            _ => true,
        }
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
    pub(in crate::redis) async fn call<'a, T, F, Fut>(&'a self, operation: F) -> Result<T, Failure>
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
    pub(in crate::redis) async fn link(&self) -> Result<Ready, Failure> {
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
    /// connection, then (told by it whether this is a cluster) a subscriber whose first session
    /// is up and, on a cluster of Redis 7 or later, the sharded subscriptions.
    fn connect(&self, runtime: &Handle, link: &Arc<Link>, state: &LinkState) -> Connecting {
        let usable = state.commands.as_ref().filter(|c| c.usable());
        let commands_needed = usable.is_none();
        let known_mode = usable.map(|c| c.connection.mode());
        let shards_needed = state.shards.as_ref().is_none_or(|shards| shards.is_dead());
        let events_needed = state.events.as_ref().is_none_or(|events| events.is_dead());
        let nodes = self.topology.nodes();
        let tls = self.config.tls.clone();
        let timeout = self.config.connect_timeout;
        let (op_timeout, retry_every) = (self.config.op_timeout, self.config.heartbeat);
        let me = self.me.clone();
        let link = link.clone();
        let task = runtime.spawn(async move {
            let made = tokio::time::timeout(timeout, async {
                let commands = if commands_needed {
                    let connection = CommandConnection::open(&nodes, &tls, timeout).await?;
                    Some(Arc::new(Commands::new(connection)))
                } else {
                    None
                };
                let mode = commands
                    .as_ref()
                    .map(|c| c.connection.mode())
                    .or(known_mode)
                    .unwrap_or(Mode::Standalone);
                let shards = async {
                    if matches!(mode, Mode::Cluster { sharded: true }) && shards_needed {
                        let shards = Shards::open(&nodes, &tls, timeout, op_timeout, retry_every)
                            .await
                            .map_err(Failure::Redis)?;
                        Ok(Some(shards))
                    } else {
                        Ok(None)
                    }
                };
                let events = async {
                    let settings = match me.upgrade() {
                        Some(endpoint) if events_needed => endpoint.subscriber_settings(mode),
                        _ => return Ok(None),
                    };
                    let events = Subscriber::start(settings);
                    events.wait_up().await;
                    Ok(Some(events))
                };
                let (shards, events) = tokio::try_join!(shards, events)?;
                Ok::<_, Failure>((commands, shards, events))
            })
            .await
            .unwrap_or(Err(Failure::Timeout(timeout)));
            let mut state = link.lock();
            state.connecting = None;
            let (commands, shards, events) = made?;
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

    /// The subscriber of a connection that reaches a server of `mode`.
    fn subscriber_settings(&self, mode: Mode) -> Settings {
        let (prefix, db) = (&self.config.prefix, self.config.db());
        let cluster = match mode {
            Mode::Standalone => None,
            Mode::Cluster { sharded } => Some(ClusterFeed {
                topology: self.topology.clone(),
                sharded,
            }),
        };
        Settings {
            nodes: self.config.nodes.clone(),
            cluster,
            invalidations: invalidate::channel(prefix, db, mode),
            log: invalidate::log_key(prefix, mode),
            heartbeats: invalidate::heartbeat_channel(
                prefix,
                db,
                mode,
                &format!("{:016x}", rand::random::<u64>()),
            ),
            heartbeat: self.config.heartbeat,
            op_timeout: self.config.op_timeout,
            connect_timeout: self.config.connect_timeout,
            bound: self.config.staleness_bound(),
            trusted: self.config.trusted_while_deaf(),
            connection: self.me.clone(),
        }
    }

    fn links(&self) -> MutexGuard<'_, HashMap<runtime::Id, Arc<Link>>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The feed's subscriber reaches its endpoint through this (it names no endpoint).
impl FeedOwner for Endpoint {
    fn name(&self) -> &str {
        &self.name
    }

    fn heartbeat<'a>(
        &'a self,
        channel: &'a str,
        token: u64,
    ) -> Pin<Box<dyn Future<Output = Option<LogId>> + Send + 'a>> {
        Box::pin(Endpoint::heartbeat(self, channel, token))
    }

    fn position(&self) -> Option<Position> {
        self.position
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn heard_up_to(&self, run: &Arc<str>, id: LogId) {
        Endpoint::heard_up_to(self, run, id);
    }

    fn recovered(&self, replayed: Option<u64>) {
        let redis = display_name(&self.name);
        match replayed {
            Some(count) => {
                metrics::counter!("cache_feed_replayed_total", "redis" => redis.to_owned())
                    .increment(count);
                tracing::info!(
                    redis,
                    count,
                    "stampede: the Redis invalidation feed is back; the invalidations it missed \
                     were read from its log, the rest of memory is served again"
                );
            }
            None => {
                metrics::counter!("cache_feed_gap_total", "redis" => redis.to_owned()).increment(1);
                tracing::info!(
                    redis,
                    "stampede: the Redis invalidation feed is back; its log does not reach back \
                     to what this process last heard (the server restarted, the log was \
                     trimmed, or INFO is refused), so memory of Redis-backed caches is dropped but for \
                     what was kept, bounded, while the feed was lost"
                );
            }
        }
    }

    fn feed_up(&self) -> bool {
        Endpoint::feed_up(self)
    }

    fn feed_live(&self) -> bool {
        Endpoint::feed_live(self)
    }

    fn feed_lost(&self, reason: Option<&'static str>) {
        Endpoint::feed_lost(self, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cooldown_of_duration_max_does_not_overflow() {
        let config = RedisConfig::new("redis://127.0.0.1:1")
            .unwrap()
            .cooldown(Duration::MAX, 1);
        let connection = Endpoint::new("max_cooldown_unit", config);
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
        let connection = Endpoint::new("untrusted_unit", config);
        assert_eq!(
            connection.trusted_for(),
            Some(Duration::from_millis(2_250)),
            "never subscribed: values are kept at most the staleness bound"
        );
    }
}
