//! The Redis tier (feature `redis`): values shared by every process, a distributed lock so that
//! one process loads a key while the others wait for its publication, and a fall back to local
//! singleflight whenever Redis is down, slow or not configured.
//!
//! The protocol of one key, as a flight of this process runs it (`flow`):
//!
//! 1. `READ_OR_LOCK`: read the value; unless it is fresh, try `SET lock token NX PX lease`, in
//!    the same round trip.
//! 2. Holder: load (a watchdog renews the lease), then `FILL`: write the envelope, publish it
//!    on the key's channel and release the lock by compare-and-delete, in one round trip.
//! 3. Not the holder: subscribe to the key's channel, read again (a fill that happened before
//!    the subscription is not missed), then wait for the publication, which carries the value.
//!    If the holder dies, its lease runs out; the waiters read again then and one takes over.
//!
//! # Redis Cluster
//!
//! [`RedisConfig::new`] takes one node's URL (whether it is a cluster is asked of the server,
//! `HELLO`, else `INFO cluster`, else `CLUSTER INFO`, when connecting) or a comma-separated list of nodes (always a cluster). On a
//! cluster the command connection is the `redis` crate's async cluster client: it sends each
//! script to the master owning the slot of its first key and follows `MOVED`/`ASK`. Every key
//! of one cache key (value, lock, fence) and its channel carry one hash tag
//! (`{prefix}:{{identity|args}}:v|l|f|c`), so each script touches one slot.
//!
//! Wake-ups use sharded pub/sub on a cluster (Redis 7): `FILL` and `RELEASE` run `SPUBLISH` on
//! the key's channel (same hash tag, so same slot as the script's keys), and waiters
//! `SSUBSCRIBE` on the master owning the slot, through a RESP3 cluster connection of their own
//! (`pubsub::Shards`). A wake-up is then carried to the shard's replicas only: 1 cluster-bus
//! message on 3 masters with a replica each, instead of the 5 of a plain `PUBLISH`
//! (`tests/redis_cluster.rs` measures it). On a standalone server they stay plain
//! (`SUBSCRIBE`/`PUBLISH`), and so they do on a cluster of servers older than Redis 7 (asked
//! with `INFO server` when connecting).
//!
//! The invalidation feed has one path on a cluster, the one its heartbeats prove: every process
//! announces invalidations, and publishes its heartbeats, on the master owning the slot of the
//! feed's hash tag (`{prefix}:{feed|{prefix}}:invalidations`, `SPUBLISH`; `PUBLISH` before Redis
//! 7), and its subscriber subscribes there, on a connection of its own to that master (see
//! `invalidate` and `pubsub`). A heartbeat heard then proves that every invalidation published
//! before it was heard, whatever becomes of the other nodes or of the cluster bus between them:
//! a lost path (that master dead or unreachable, its slot moved, the subscription dropped) stops
//! the heartbeats as well, and is noticed within the documented bound. An invalidation costs a
//! second round trip there (its script runs on the key's master), and with `SPUBLISH` the
//! cluster bus carries it to that master's replicas only. The subscriber finds that master by
//! asking the nodes known in turn for the slot map (`CLUSTER SLOTS`): the nodes given, then every
//! node the cluster named, through which the links connect too, so a process given one node's
//! URL finds the feed, and the cluster, again once that node is gone.
//!
//! Every process of a service must run a version that agrees on all this: one that publishes
//! fills with plain `PUBLISH` does not wake waiters that `SSUBSCRIBE`d (they read again when the
//! lease runs out), and one that announces invalidations on another channel or node is not heard.
//!
//! The tier reaches the cache only through the `Handle` of each flight, and reports what each
//! flight did (`tier::Fetched`); its options (the
//! connection's name, the busy policy), its counters and its wire protocol stay in here.

pub(crate) mod codec;
pub(crate) mod protocol;
pub(crate) mod transport;

use std::sync::Arc;

pub(crate) use protocol::tags::invalidate_tag;
pub use protocol::tier::redis;
pub use transport::config::{REDIS_URL_VAR, RedisConfig};

use crate::error::Error;

/// What a process does when another holds a key's Redis lock and no stale value can be served:
/// the `busy` option of `#[cached]`, `busy = "wait" | "compute" | "error"`, as a
/// debug page shows it.
///
/// ```
/// use stampede::Busy;
///
/// fn describe(busy: Busy) -> &'static str {
///     match busy {
///         Busy::Wait => "waits for the holder's value",
///         Busy::Compute => "loads it here",
///         Busy::Error => "fails with LockBusy",
///     }
/// }
/// assert_eq!(describe(Busy::Compute), "loads it here");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Busy {
    /// Wait for the holder's value (woken by its publication), up to the connection's lock wait;
    /// then load it here.
    Wait,
    /// Load it here at once, without the lock.
    Compute,
    /// Fail the call with [`Error::LockBusy`].
    Error,
}

/// Checks at start-up that the Redis connection named `connection` (`None`: the default one,
/// from [`RedisConfig::install`] or the `STAMPEDE_REDIS_URL` variable) is configured, answers,
/// and lets this process run what the caches run: its credentials, its ACL user's keys,
/// channels and commands, its TLS certificates.
///
/// Caches never need this: without Redis they run on local singleflight, count it and warn
/// once. Call it where a missing or misconfigured Redis should stop the service instead, before
/// it takes traffic. Needs a tokio runtime.
///
/// Fails with [`Error::InvalidConfig`] when the connection is not configured, or when Redis
/// refuses this process (a wrong or missing password, an ACL `NOPERM` on the cache's keys,
/// channels or commands, a server certificate that does not verify or a client certificate the
/// server refuses): waiting will not fix those, and the message says what to change. Fails with
/// [`Error::RedisUnavailable`] when Redis does not answer in time.
///
/// ```no_run
/// # async fn start() -> Result<(), stampede::Error> {
/// stampede::require_redis(None).await?; // fails with the reason: not configured, refused, no answer
/// # Ok(()) }
/// ```
pub async fn require_redis(connection: Option<&str>) -> Result<(), Error> {
    let shown = connection.unwrap_or("default");
    let Some(redis) = transport::installed::lookup(connection) else {
        return Err(not_configured(connection, ""));
    };
    redis
        .preflight()
        .await
        .map_err(|failure| match transport::refusal::of(&failure) {
            Some(refused) => Error::invalid_config(format!(
                "the `{shown}` Redis connection: {} ({failure})",
                refused.fix(&redis.config.prefix)
            )),
            None => Error::RedisUnavailable {
                cache: Arc::from(format!("(connection `{shown}`)")),
                message: failure.to_string().into(),
            },
        })
}

/// The connection named `connection` (`None`: the default one) is not configured in this
/// process; `what` says what that cost (empty: nothing more to say).
pub(crate) fn not_configured(connection: Option<&str>, what: &str) -> Error {
    let shown = connection.unwrap_or("default");
    Error::invalid_config(format!(
        "the `{shown}` Redis connection is not configured{what}: install a RedisConfig under that \
         name, or set {REDIS_URL_VAR} for the default one"
    ))
}
