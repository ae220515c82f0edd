//! What [`require_redis`](crate::require_redis) checks beyond a `PING`: that this process may
//! run what the tier runs, so that a wrong password, an ACL that refuses the cache's keys,
//! channels or commands, or a certificate that does not verify is an error at start-up instead
//! of a service quietly running on local loads.
//!
//! 1. The link is made and answers `PING`: authentication, TLS, the cluster's slot map, the
//!    subscriber's first session (it subscribes the invalidation and heartbeat channels).
//! 2. One script on a probe key of the cache's prefix runs every command the tier's scripts run
//!    (`GET`, `GETRANGE`, `STRLEN`, `SET`, `PEXPIRE`, `PTTL`, `EXISTS`, `INCR`, `SADD`,
//!    `SMEMBERS`, `SUNIONSTORE`, `SREM`, `ZADD`, `ZSCORE`, `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE`,
//!    `XADD`, `XLEN`, `XREVRANGE`, `XRANGE` (the invalidation log), `DEL`, `TIME`, and the fill's `PUBLISH` or, on a
//!    cluster, `SPUBLISH`), through `EVALSHA` and `SCRIPT LOAD` as the tier does; then a
//!    heartbeat's publication (with the invalidation log's `XLEN`, `XADD` and `XREVRANGE`), on a channel of the feed (`PUBLISH`, or on a cluster `SPUBLISH`
//!    on the feed's master, see `invalidate`); then a subscription to the probe key's channel,
//!    as a waiter's.
//! 3. When the link does not come up and nothing said why, a subscription of the invalidation
//!    channel on a connection of its own tells a refused channel (`NOPERM`) from an outage.
//!
//! The probe's keys live for at most 10 seconds, and are deleted by the script that makes them.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::redis::codec::keys::RedisKeys;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::invalidate;
use crate::redis::transport::mode::Mode;
use crate::redis::transport::refusal;

/// Runs every command of the tier's scripts on keys of one hash tag, each through `pcall`, so
/// that a refusal names its command: an ACL refusal inside a script is an `ERR The user executing
/// the script can't ...` naming only a line of the script.
///
/// KEYS: value, fence, a set, another set, a sorted set, a stream. ARGV: the publishing command, a
/// channel.
///
/// Returns 1, or the first refusal as a `NOPERM <COMMAND>: ...` error (another error as it came).
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local steps = {
  {'TIME'},
  {'SET', KEYS[1], '1', 'PX', 10000},
  {'GET', KEYS[1]},
  {'GETRANGE', KEYS[1], 0, 160},
  {'STRLEN', KEYS[1]},
  {'PEXPIRE', KEYS[1], 10000},
  {'PTTL', KEYS[1]},
  {'EXISTS', KEYS[1]},
  {'INCR', KEYS[2]},
  {'PEXPIRE', KEYS[2], 10000},
  {'SADD', KEYS[3], 'probe'},
  {'PEXPIRE', KEYS[3], 10000},
  {'SMEMBERS', KEYS[3]},
  {'SUNIONSTORE', KEYS[4], KEYS[3]},
  {'PEXPIRE', KEYS[4], 10000},
  {'SREM', KEYS[4], 'probe'},
  {'ZADD', KEYS[5], 1, 'probe'},
  {'PEXPIRE', KEYS[5], 10000},
  {'ZSCORE', KEYS[5], 'probe'},
  {'ZRANGEBYSCORE', KEYS[5], 0, '+inf'},
  {'ZREMRANGEBYSCORE', KEYS[5], '-inf', 2},
  {'XADD', KEYS[6], 'MAXLEN', '~', 16, '*', 'm', ''},
  {'PEXPIRE', KEYS[6], 10000},
  {'XLEN', KEYS[6]},
  {'XREVRANGE', KEYS[6], '+', '-', 'COUNT', 1},
  {'XRANGE', KEYS[6], '-', '+', 'COUNT', 1},
  {'DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]},
  {ARGV[1], ARGV[2], ''},
}
for _, step in ipairs(steps) do
  local reply = redis.pcall(unpack(step))
  if type(reply) == 'table' and reply.err then
    redis.pcall('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
    local refused = string.find(reply.err, 'NOPERM', 1, true)
      or string.find(reply.err, 'can\'t', 1, true)
      or string.find(reply.err, 'No permissions', 1, true)
    if refused then
      return redis.error_reply('NOPERM ' .. step[1] .. ' refused: ' .. reply.err)
    end
    return redis.error_reply(reply.err)
  end
end
return 1
",
    )
});

impl Endpoint {
    /// Checks that this Redis answers and lets this process run the tier (see the module).
    pub(crate) async fn preflight(&self) -> Result<(), Failure> {
        if let Err(failure) = self.ping().await {
            if refusal::of(&failure).is_some() {
                return Err(failure);
            }
            return match self.refused_channel().await {
                Some(refused) => {
                    self.health.failure(&self.name, &refused, &self.config);
                    Err(refused)
                }
                None => Err(failure),
            };
        }
        let db = self.config.db();
        let keys = RedisKeys::new(&self.config.prefix, db, "stampede~preflight", "probe");
        let base = keys.base().to_owned();
        let (value, fence, channel) = (&keys.value, &keys.fence, &keys.channel);
        let (set, other, shapes, log) = (
            format!("{base}:t"),
            format!("{base}:p"),
            format!("{base}:s"),
            format!("{base}:l"),
        );
        self.call(|mut connection| async move {
            let publish = connection.publish_command();
            PROBE
                .key(value)
                .key(fence)
                .key(&set)
                .key(&other)
                .key(&shapes)
                .key(&log)
                .arg(publish)
                .arg(channel)
                .invoke_async::<i64>(&mut connection)
                .await
        })
        .await?;
        let prefix = &self.config.prefix;
        self.call(|mut connection| async move {
            let mode = connection.mode();
            let heartbeats = invalidate::heartbeat_channel(prefix, db, mode, "preflight");
            let (log, most) = self.log_of(mode);
            invalidate::beat(&mut connection, (&heartbeats, &log, most), b"").await
        })
        .await?;
        drop(self.listen(&keys).await?);
        Ok(())
    }

    /// The refusal of a `SUBSCRIBE` of the invalidation channel on a connection of its own,
    /// if the server refuses it.
    async fn refused_channel(&self) -> Option<Failure> {
        let node = self.config.nodes.first()?;
        // Named as on a standalone server: whether this is a cluster is not known here, and an
        // ACL that refuses one name of the prefix's channels refuses the other too.
        let channel = invalidate::channel(&self.config.prefix, self.config.db(), Mode::Standalone);
        let bound = self
            .config
            .connect_timeout
            .saturating_add(self.config.op_timeout)
            .min(Duration::from_secs(10));
        let subscribed = tokio::time::timeout(bound, async {
            let mut pubsub = node.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await
        })
        .await;
        match subscribed {
            Ok(Err(error)) if refusal::of_error(&error).is_some() => Some(Failure::Redis(error)),
            _ => None,
        }
    }
}
