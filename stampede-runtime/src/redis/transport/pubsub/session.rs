//! One session of the subscriber: a pub/sub connection subscribed to the feed (the invalidation
//! channel and the subscriber's heartbeat channel) and to the channels listened to, on the node
//! the feed's messages are published on.
//!
//! - On a standalone server: a plain RESP2 pub/sub connection (`SUBSCRIBE`), to the nodes given
//!   in turn.
//! - On a cluster: the master that owns the feed's slot, asked of the nodes known in turn
//!   ([`Topology`](super::Topology): the seeds, then every node the cluster named), where
//!   invalidations and heartbeats are published (see `invalidate`). With sharded pub/sub
//!   (Redis 7 and later) a RESP3 connection `SSUBSCRIBE`s the feed there, and the master's own
//!   unsubscription (the slot moved away) ends the session; before Redis 7, a plain connection
//!   `SUBSCRIBE`s it there.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::settings::Settings;
use super::topology;
use crate::redis::transport::log::{self, LogId};

/// One pub/sub connection, subscribed to the feed and the channels listened to.
pub(super) struct Session {
    /// When the feed's subscription was sent.
    pub(super) sent: Instant,
    connection: Connection,
    /// The server's run (`INFO server`'s `run_id`), read before the feed was subscribed; `None`
    /// if it could not be (an ACL that refuses `INFO`): its log's positions are then unknown.
    pub(super) run: Option<Arc<str>>,
    /// A connection to the session's server for commands (on a cluster of Redis 7 or later, the
    /// session's own RESP3 connection): the invalidation log is read through it when the session
    /// is a recovery, and it is closed once the session is up ([`Session::up`]).
    direct: Option<MultiplexedConnection>,
}

enum Connection {
    Plain {
        sink: PubSubSink,
        stream: PubSubStream,
    },
    /// RESP3, its push messages on `pushes`.
    Sharded {
        connection: MultiplexedConnection,
        pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    },
}

/// What a session hears next.
pub(super) enum Heard {
    Message(Message),
    /// The session is lost, and why.
    Lost(&'static str),
}

/// A message published on a channel subscribed to.
pub(super) enum Message {
    Plain(redis::Msg),
    Pushed { channel: Vec<u8>, payload: Vec<u8> },
}

impl Message {
    pub(super) fn channel(&self) -> &[u8] {
        match self {
            Message::Plain(message) => message.get_channel_name().as_bytes(),
            Message::Pushed { channel, .. } => channel,
        }
    }

    pub(super) fn payload(&self) -> &[u8] {
        match self {
            Message::Plain(message) => message.get_payload_bytes(),
            Message::Pushed { payload, .. } => payload,
        }
    }
}

impl Session {
    /// Opens the session of attempt number `attempt`, subscribed to the feed and to `channels`;
    /// `None` if it could not be (the caller bounds the wait).
    pub(super) async fn open(
        settings: &Settings,
        attempt: usize,
        channels: &[String],
    ) -> Option<Session> {
        let Some(cluster) = &settings.cluster else {
            let node = settings.nodes.get(attempt % settings.nodes.len().max(1))?;
            return open_plain(node, settings, channels).await;
        };
        let owner = cluster
            .topology
            .owner(topology::slot(settings.invalidations.as_bytes()))
            .await?;
        if cluster.sharded {
            open_sharded(&owner, settings, channels).await
        } else {
            open_plain(&owner, settings, channels).await
        }
    }

    /// The next message, or why the session is lost.
    pub(super) async fn next(&mut self) -> Heard {
        match &mut self.connection {
            Connection::Plain { stream, .. } => match stream.next().await {
                Some(message) => Heard::Message(Message::Plain(message)),
                None => Heard::Lost("the connection closed"),
            },
            Connection::Sharded { pushes, .. } => loop {
                let Some(push) = pushes.recv().await else {
                    return Heard::Lost("the connection closed");
                };
                match push.kind {
                    redis::PushKind::SMessage | redis::PushKind::Message => {
                        let mut data = push.data.into_iter();
                        if let (
                            Some(redis::Value::BulkString(channel)),
                            Some(redis::Value::BulkString(payload)),
                        ) = (data.next(), data.next())
                        {
                            return Heard::Message(Message::Pushed { channel, payload });
                        }
                    }
                    redis::PushKind::Disconnection => {
                        return Heard::Lost("the connection closed");
                    }
                    // This session never unsubscribes the feed: the master dropped it itself,
                    // the feed's slot having moved to another.
                    redis::PushKind::SUnsubscribe => {
                        return Heard::Lost("the feed's master dropped its subscription");
                    }
                    _ => {}
                }
            },
        }
    }

    /// Subscribes to a channel listened to (plain pub/sub).
    pub(super) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match &mut self.connection {
            Connection::Plain { sink, .. } => sink.subscribe(channel).await,
            Connection::Sharded { connection, .. } => connection.subscribe(channel).await,
        }
    }

    pub(super) async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match &mut self.connection {
            Connection::Plain { sink, .. } => sink.unsubscribe(channel).await,
            Connection::Sharded { connection, .. } => connection.unsubscribe(channel).await,
        }
    }

    /// The session is up (and its recovery, if any, done): the connection the log was read
    /// through is closed, so that a session holds one connection of its own.
    pub(super) fn up(&mut self) {
        self.direct = None;
    }

    /// The invalidation log's messages after `from` on the session's server (see
    /// [`log::read_after`]); `None` when the log does not hold `from` any more, or
    /// cannot be read.
    pub(super) async fn log_after(
        &mut self,
        log: &str,
        from: LogId,
        count: usize,
    ) -> Option<Vec<(LogId, Vec<u8>)>> {
        let direct = self.direct.as_mut()?;
        log::read_after(direct, log, from, count)
            .await
            .inspect_err(|error| {
                tracing::debug!(%error, "stampede: cannot read the invalidation log");
            })
            .ok()
            .flatten()
    }
}

/// The run id of the server `connection` reaches (`INFO server`), if it tells.
async fn run_of(connection: &mut MultiplexedConnection) -> Option<Arc<str>> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(connection)
        .await
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|run| Arc::from(run.trim()))
}

/// A plain (RESP2) session on `node`.
async fn open_plain(
    node: &redis::Client,
    settings: &Settings,
    channels: &[String],
) -> Option<Session> {
    let pubsub = match node.get_async_pubsub().await {
        Ok(pubsub) => pubsub,
        Err(error) => {
            tracing::debug!(%error, "stampede: cannot open the Redis pub/sub connection");
            return None;
        }
    };
    let mut direct = node.get_multiplexed_async_connection().await.ok();
    let run = match &mut direct {
        Some(direct) => run_of(direct).await,
        None => None,
    };
    let (mut sink, stream) = pubsub.split();
    let sent = Instant::now();
    let feed = [
        settings.invalidations.as_str(),
        settings.heartbeats.as_str(),
    ];
    sink.subscribe(&feed[..]).await.ok()?;
    if !channels.is_empty() {
        sink.subscribe(channels).await.ok()?;
    }
    Some(Session {
        sent,
        connection: Connection::Plain { sink, stream },
        run,
        direct,
    })
}

/// A RESP3 session on the feed's master `owner`, the feed `SSUBSCRIBE`d.
async fn open_sharded(
    owner: &redis::Client,
    settings: &Settings,
    channels: &[String],
) -> Option<Session> {
    let info = owner.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(resp3)).ok()?;
    let (pushed, pushes) = mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new()
        .set_push_sender(pushed)
        .set_connection_timeout(Some(settings.connect_timeout))
        // Every command here is bounded by its caller.
        .set_response_timeout(None::<Duration>);
    let mut connection = match client
        .get_multiplexed_async_connection_with_config(&config)
        .await
    {
        Ok(connection) => connection,
        Err(error) => {
            tracing::debug!(%error, "stampede: cannot open the Redis pub/sub connection");
            return None;
        }
    };
    let run = run_of(&mut connection).await;
    let sent = Instant::now();
    // One channel per command: each is confirmed by one reply.
    for channel in [&settings.invalidations, &settings.heartbeats] {
        if let Err(error) = redis::cmd("SSUBSCRIBE")
            .arg(channel)
            .query_async::<redis::Value>(&mut connection)
            .await
        {
            tracing::debug!(%error, "stampede: cannot subscribe to the invalidation feed");
            return None;
        }
    }
    for channel in channels {
        connection.subscribe(channel).await.ok()?;
    }
    Some(Session {
        sent,
        run,
        direct: Some(connection.clone()),
        connection: Connection::Sharded { connection, pushes },
    })
}
