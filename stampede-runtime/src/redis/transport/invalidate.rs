//! Invalidations announced by any process drop the key from every process's memory.
//!
//! The message on the invalidation channel ([`channel`]) is `{cache name}\n{argument text}`:
//! each process drops, from its caches of that name, the entries whose key writes as that text;
//! for a tag's invalidation it is `\0tag\n{tag}`, and each process drops its entries with that
//! tag (the messages' form, and what a process does with one, are `feed`'s).
//!
//! # The log
//!
//! Every message is appended to the feed's log ([`log_key`], a stream capped at about
//! `RedisConfig::invalidation_log` entries) before it is published, in the same script
//! (`announce_lua!`). A subscriber's heartbeat (`BEAT`) returns the log's last entry when its
//! token was published, so once the token is heard the process has handled the log up to there
//! (`log::Position`, with the server's run id). When the feed was lost, memory is taken out of
//! service (`feed::suspend_all`); when a session is up again on the same run, the process reads
//! the log after its position and handles each message as if heard, then serves the rest again
//! (`feed::resume_all`). When the log cannot tell what was missed (another run: the server
//! restarted; the position trimmed away; a read failed), the process drops all it holds
//! instead (`feed::forget_all`).
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
use crate::redis::transport::log::LogId;
use crate::redis::transport::mode::Mode;
use redis::Script;
use std::sync::LazyLock;

/// The channel invalidations of `prefix` in database `db` are announced on.
pub(crate) fn channel(prefix: &str, db: i64, mode: Mode) -> String {
    let channel = match mode {
        Mode::Standalone => format!("{prefix}:invalidations"),
        Mode::Cluster { .. } => format!("{prefix}:{{feed|{prefix}}}:invalidations"),
    };
    in_database(channel, db)
}

/// The invalidation feed's log of `prefix` (a stream in the database the connection selects):
/// every message announced on [`channel`] is appended to it first, in the same script. On a
/// cluster, in the feed's slot, where it is published.
pub(crate) fn log_key(prefix: &str, mode: Mode) -> String {
    match mode {
        Mode::Standalone => format!("{prefix}:invalidations:log"),
        Mode::Cluster { .. } => format!("{prefix}:{{feed|{prefix}}}:log"),
    }
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

/// Announces `message` on the invalidation feed `channel` the way the feed's messages travel on
/// `connection`, appended to the feed's `log` (of about `most` entries) first (`ANNOUNCE`).
pub(crate) async fn announce(
    connection: &mut CommandConnection,
    (channel, log, most): (&str, &str, usize),
    message: &[u8],
) -> redis::RedisResult<()> {
    ANNOUNCE
        .key(log)
        .arg(connection.publish_command())
        .arg(channel)
        .arg(message)
        .arg(most)
        .invoke_async::<i64>(connection)
        .await
        .map(drop)
}

/// The invalidation feed's publication in Lua: `announce(log, publish, channel, message, most)`
/// appends `message` to the feed's log `log` (a stream of at most about `most` entries, its
/// oldest trimmed first), then publishes it on `channel` with `publish` (`PUBLISH`, or
/// `SPUBLISH` on a cluster). In that order, in one script: a subscriber that missed the
/// publication finds the message in the log (see `pubsub`'s replay).
macro_rules! announce_lua {
    () => {
        r"
local function announce(log, publish, channel, message, most)
  redis.call('XADD', log, 'MAXLEN', '~', most, '*', 'm', message)
  redis.call(publish, channel, message)
end
"
    };
}
pub(crate) use announce_lua;

/// Announces an invalidation on its own (`announce_lua!`): a tag's, a key's again, or on a cluster
/// a key's, on the feed's master. KEYS: the feed's log. ARGV: the publishing command, the
/// invalidation channel, the message, the log's length.
pub(crate) static ANNOUNCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        announce_lua!(),
        r"
announce(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return 1
",
    ))
});

/// A subscriber's heartbeat: publishes its token, and returns the id of the feed log's last
/// entry, which every invalidation announced before the token was published precedes: once the
/// token is heard, the log up to it has been handled (the subscriber's position). An empty log
/// gets a first entry (an empty message, which no process acts on), so that a position always
/// names an entry, and a log trimmed past it tells. KEYS: the feed's log. ARGV: the publishing
/// command, the heartbeat channel, the token, the log's length.
pub(crate) static BEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'm', '')
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
redis.call(ARGV[1], ARGV[2], ARGV[3])
return last[1][1]
",
    )
});

/// Publishes the heartbeat `token` on `channel` (`BEAT`): the id of the feed log's last entry
/// then, which every invalidation announced before the token precedes.
pub(crate) async fn beat(
    connection: &mut CommandConnection,
    (channel, log, most): (&str, &str, usize),
    token: &[u8],
) -> redis::RedisResult<Option<LogId>> {
    let last: Vec<u8> = BEAT
        .key(log)
        .arg(connection.publish_command())
        .arg(channel)
        .arg(token)
        .arg(most)
        .invoke_async(connection)
        .await?;
    Ok(LogId::parse(&last))
}
