//! Invalidations announced by any process drop the key from every process's memory.
//!
//! The message on the invalidation channel ([`channel`]) is `{cache name}\n{argument text}`:
//! each process drops, from its caches of that name, the entries whose key writes as that text;
//! for a tag's invalidation it is `\0tag\n{tag}`, and each process drops its entries with that
//! tag (the messages' form, and what a process does with one, are `feed`'s). When the feed
//! itself may have lost messages, a process drops all it holds instead (`feed::forget_all`).
//!
//! # The feed's path
//!
//! A process's heartbeat proves that its subscription has heard everything published before it
//! on the path that the heartbeat took (see `pubsub`), so invalidations take the same path:
//!
//! - on a standalone server, one server: `PUBLISH` on `{prefix}:invalidations`, from the
//!   invalidation's script (one round trip), and heartbeats on `{prefix}:heartbeat:{id}`;
//! - on a cluster, the one master owning the slot of the feed's hash tag, `{feed|{prefix}}`:
//!   after the key's script (on the key's master, which publishes nothing), one `SPUBLISH` on
//!   `{prefix}:{feed|{prefix}}:invalidations` (plain `PUBLISH` before Redis 7), which the client
//!   routes to that master, the one every subscriber subscribes on; heartbeats go there too, on
//!   `{prefix}:{feed|{prefix}}:heartbeat:{id}`. Nothing of the feed crosses the cluster bus on
//!   its way to a subscriber, so no link between two nodes can lose an invalidation that a
//!   heartbeat would vouch for.
//!
//! These are database 0's names. Pub/sub ignores the database a connection selects, so on
//! database `db` every one of them ends in `@{db}` (`{prefix}:invalidations@2`, see
//! `keys::in_database`): processes on two databases of one server, with one prefix, never drop
//! each other's memory.

use crate::redis::codec::keys::in_database;
use crate::redis::transport::link::CommandConnection;
use crate::redis::transport::mode::Mode;

/// The channel invalidations of `prefix` in database `db` are announced on.
pub(crate) fn channel(prefix: &str, db: i64, mode: Mode) -> String {
    let channel = match mode {
        Mode::Standalone => format!("{prefix}:invalidations"),
        Mode::Cluster { .. } => format!("{prefix}:{{feed|{prefix}}}:invalidations"),
    };
    in_database(channel, db)
}

/// The channel of one subscriber's heartbeats (`id` tells subscribers apart): on a cluster, on
/// the invalidation channel's slot.
pub(crate) fn heartbeat_channel(prefix: &str, db: i64, mode: Mode, id: &str) -> String {
    let channel = match mode {
        Mode::Standalone => format!("{prefix}:heartbeat:{id}"),
        Mode::Cluster { .. } => format!("{prefix}:{{feed|{prefix}}}:heartbeat:{id}"),
    };
    in_database(channel, db)
}

/// Publishes `message` on `channel` the way the feed's messages travel on `connection`:
/// `SPUBLISH` on a cluster of Redis 7 or later, else `PUBLISH` (on a cluster, routed to the
/// master owning the channel's slot).
pub(crate) async fn publish(
    connection: &mut CommandConnection,
    channel: &str,
    message: &[u8],
) -> redis::RedisResult<i64> {
    redis::cmd(connection.publish_command())
        .arg(channel)
        .arg(message)
        .query_async(connection)
        .await
}
