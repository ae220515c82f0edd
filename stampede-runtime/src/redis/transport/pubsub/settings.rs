//! What the feed's supervisor is given: where to subscribe (the nodes of a standalone server,
//! or how a cluster's feed master is found) and the feed's channels and times.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::topology::Topology;
use crate::redis::transport::log::{LogId, Position};

/// The connection a feed belongs to (the endpoint, which implements this): it publishes the
/// heartbeats and hears of the feed being lost and back. A trait, so that the subscriber, below
/// the endpoint, names none.
pub(crate) trait FeedOwner: Send + Sync {
    /// The connection's name, as caches name it (`shared_through`).
    fn name(&self) -> &str;
    /// Publishes a heartbeat token on `channel`, the way invalidations travel; the id of the
    /// invalidation log's last entry then, if Redis answered.
    fn heartbeat<'a>(
        &'a self,
        channel: &'a str,
        token: u64,
    ) -> Pin<Box<dyn Future<Output = Option<LogId>> + Send + 'a>>;
    /// How far this process has handled the invalidation log, if it knows.
    fn position(&self) -> Option<Position>;
    /// A session of the server of run `run` handled everything its log held up to `id`.
    fn heard_up_to(&self, run: &Arc<str>, id: LogId);
    /// A session is up after a lost one: `replayed` invalidations were read from the log, or
    /// (`None`) the log could not cover the gap and memory is dropped.
    fn recovered(&self, replayed: Option<u64>);
    /// A session is up; whether it is a recovery (see `Endpoint::feed_up`).
    fn feed_up(&self) -> bool;
    /// Whether a feed of this connection is live now, in any runtime.
    fn feed_live(&self) -> bool;
    /// A session ended: lost (and why), or (`None`) with its runtime or subscriber.
    fn feed_lost(&self, reason: Option<&'static str>);
}

/// How the feed is subscribed to on a cluster.
pub(crate) struct ClusterFeed {
    /// The nodes known, shared with the links (which connect through them too).
    pub(crate) topology: Arc<Topology>,
    /// Whether the cluster has sharded pub/sub: the feed is `SSUBSCRIBE`d.
    pub(crate) sharded: bool,
}

/// What the supervisor needs to open sessions and check them.
pub(crate) struct Settings {
    /// On a standalone server, the nodes to subscribe on, tried in turn.
    pub(crate) nodes: Vec<redis::Client>,
    /// On a cluster, how the feed's master is found and subscribed to (`nodes` are unused).
    pub(crate) cluster: Option<ClusterFeed>,
    pub(crate) invalidations: String,
    /// The invalidation log (see `invalidate::log_key`).
    pub(crate) log: String,
    /// This subscriber's own heartbeat channel.
    pub(crate) heartbeats: String,
    pub(crate) heartbeat: Duration,
    pub(crate) op_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// How long after the last token heard was sent the feed stays live.
    pub(crate) bound: Duration,
    /// How long after the last token heard was sent what memory held stays in service once the
    /// feed is lost: `trust_while_deaf`, else `bound`.
    pub(crate) trusted: Duration,
    /// Publishes the heartbeats, and hears of the feed being lost and back.
    pub(crate) connection: Weak<dyn FeedOwner>,
}
