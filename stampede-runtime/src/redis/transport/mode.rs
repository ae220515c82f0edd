//! Whether the server behind one node's URL is a Redis Cluster node, asked when connecting.
//!
//! Managed services and ACL users often refuse `INFO` (a user limited to the commands the tier
//! runs, a renamed command): a refusal must not make a cluster node look standalone, or every
//! call about a key of another node's slots would fail with `MOVED`. So the question is asked
//! in three ways, each used only when the one before could not answer:
//!
//! 1. `HELLO` (Redis 6 and later, Valkey): its `mode` field (`standalone`, `cluster`,
//!    `sentinel`). It needs no ACL permission.
//! 2. `INFO cluster`: `cluster_enabled:1` (Redis 5, or a server where `HELLO` failed).
//! 3. `CLUSTER INFO`: it answers on a cluster node, and a standalone server says "cluster support
//!    disabled".
//!
//! When all three are refused, connecting fails with the last refusal (a `NOPERM` naming
//! `cluster|info`): stampede cannot tell, and guessing is how a quiet failure starts.
//!
//! What was found is a [`Mode`], which decides how the invalidation feed travels (see `pubsub`).

use redis::aio::MultiplexedConnection;

use crate::redis::transport::failure::Failure;

/// What a command connection reaches: a standalone server, or a cluster, whose servers have
/// sharded pub/sub (`SSUBSCRIBE`, `SPUBLISH`: Redis 7 and later) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Standalone,
    Cluster { sharded: bool },
}

impl Mode {
    pub(crate) fn is_cluster(self) -> bool {
        matches!(self, Mode::Cluster { .. })
    }
}

/// Whether the server of `connection` is a cluster node.
pub(in crate::redis) async fn is_cluster(
    connection: &mut MultiplexedConnection,
) -> Result<bool, Failure> {
    match redis::cmd("HELLO")
        .query_async::<redis::Value>(connection)
        .await
    {
        Ok(reply) => {
            if let Some(mode) = mode_of(&reply) {
                return Ok(mode == "cluster");
            }
        }
        // Not a reply of the server: the connection failed.
        Err(error) if error.code().is_none() => return Err(Failure::Redis(error)),
        // An unknown command (Redis 5) or a refusal: ask INFO.
        Err(_) => {}
    }
    match redis::cmd("INFO")
        .arg("cluster")
        .query_async::<String>(connection)
        .await
    {
        Ok(info) => return Ok(cluster_enabled(&info)),
        Err(error) if error.code().is_none() => return Err(Failure::Redis(error)),
        Err(_) => {}
    }
    match redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async::<String>(connection)
        .await
    {
        Ok(_) => Ok(true),
        Err(error) if says_cluster_disabled(&error) => Ok(false),
        Err(error) => Err(Failure::Redis(error)),
    }
}

/// The `mode` field of a `HELLO` reply (a map in RESP3, a flat list of fields and values in
/// RESP2).
fn mode_of(reply: &redis::Value) -> Option<String> {
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match reply {
        redis::Value::Map(fields) => fields
            .iter()
            .find(|(field, _)| text(field).as_deref() == Some("mode"))
            .and_then(|(_, mode)| text(mode)),
        redis::Value::Array(fields) => fields
            .chunks(2)
            .find(|pair| text(&pair[0]).as_deref() == Some("mode"))
            .and_then(|pair| pair.get(1).and_then(text)),
        _ => None,
    }
}

/// Whether an error reply is a standalone server's answer to a cluster command.
fn says_cluster_disabled(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.contains("cluster support disabled"))
}

/// Whether an `INFO cluster` reply says the server runs in cluster mode.
fn cluster_enabled(info: &str) -> bool {
    info.lines().any(|line| line.trim() == "cluster_enabled:1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> redis::Value {
        redis::Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn cluster_mode_is_read_from_info_cluster() {
        assert!(cluster_enabled("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!cluster_enabled("# Cluster\r\ncluster_enabled:0\r\n"));
        assert!(!cluster_enabled(""), "no INFO: standalone");
    }

    #[test]
    fn the_mode_is_read_from_hello_in_either_protocol() {
        let resp2 = redis::Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("proto"),
            redis::Value::Int(2),
            bulk("mode"),
            bulk("cluster"),
        ]);
        assert_eq!(mode_of(&resp2).as_deref(), Some("cluster"));
        let resp3 = redis::Value::Map(vec![
            (bulk("server"), bulk("valkey")),
            (bulk("mode"), bulk("standalone")),
        ]);
        assert_eq!(mode_of(&resp3).as_deref(), Some("standalone"));
        assert_eq!(mode_of(&redis::Value::Array(vec![bulk("proto")])), None);
        assert_eq!(mode_of(&redis::Value::Nil), None);
    }

    #[test]
    fn a_standalone_server_answering_a_cluster_command_is_told_apart_from_a_refusal() {
        let disabled = redis::make_extension_error(
            "ERR".to_owned(),
            Some("This instance has cluster support disabled".to_owned()),
        );
        assert!(says_cluster_disabled(&disabled));
        let refused = redis::make_extension_error(
            "NOPERM".to_owned(),
            Some("this user has no permissions to run the 'cluster|info' command".to_owned()),
        );
        assert!(!says_cluster_disabled(&refused));
    }
}
