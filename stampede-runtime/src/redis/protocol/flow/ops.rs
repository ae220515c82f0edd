//! The operations of a batch on one [`Endpoint`]: each a script over many keys, in one call
//! bounded by the operation timeout. On a standalone server the keys go in one script (in
//! scripts of at most [`MOST_PER_SCRIPT`] keys, sent at once on the one connection); on a
//! Redis Cluster, whose scripts must keep to one slot, in one script per slot, sent at once to
//! the masters that own them.

use std::future::Future;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::cluster_routing::Slot;
use redis::{RedisResult, Value};

use crate::redis::codec::keys::RedisKeys;
use crate::redis::protocol::ops::{Fill, Read, ReadState, Written, millis};
use crate::redis::protocol::scripts;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::link::CommandConnection;

/// The most keys one script of a batch handles, so that one script never keeps a server busy
/// for long; the scripts of a larger batch are sent at once.
const MOST_PER_SCRIPT: usize = 256;

impl Endpoint {
    /// `READ_FRESH`: each value key's value if it is fresh by the server's clock (and
    /// within the size bound), with that clock's time (ms).
    pub(crate) async fn read_fresh_many(
        &self,
        value_keys: &[impl AsRef<str> + Sync],
    ) -> Result<Vec<(Option<Vec<u8>>, u64)>, Failure> {
        let slotted: Vec<&str> = value_keys.iter().map(AsRef::as_ref).collect();
        let most = self.most_read();
        self.grouped(&slotted, |mut connection, group| async move {
            let mut script = scripts::READ_FRESH.prepare_invoke();
            script.arg(most);
            for &at in &group {
                script.key(value_keys[at].as_ref());
            }
            let reply: Vec<Value> = script.invoke_async(&mut connection).await?;
            let mut reply = reply.into_iter();
            let now_ms: u64 = next(&mut reply)?;
            group
                .iter()
                .map(|_| Ok((next::<Option<Vec<u8>>>(&mut reply)?, now_ms)))
                .collect()
        })
        .await
    }

    /// `READ_OR_LOCK`: each key's value and state, as `read_or_lock` reads one key.
    pub(crate) async fn read_or_lock_many(
        &self,
        keys: &[&RedisKeys],
        token: Option<&str>,
        value_unusable: &[bool],
    ) -> Result<Vec<Read>, Failure> {
        let token = token.unwrap_or("");
        let lease = millis(self.config.lease);
        let most = self.most_read();
        let slotted: Vec<&str> = keys.iter().map(|keys| keys.value.as_str()).collect();
        self.grouped(&slotted, |mut connection, group| async move {
            let mut script = scripts::READ_OR_LOCK.prepare_invoke();
            script.arg(token).arg(lease).arg(most);
            for &at in &group {
                let of = keys[at];
                script.key(&of.value).key(&of.lock).key(&of.fence);
                script.arg(if value_unusable[at] { "1" } else { "0" });
            }
            let reply: Vec<Value> = script.invoke_async(&mut connection).await?;
            let mut reply = reply.into_iter();
            let now_ms: u64 = next(&mut reply)?;
            group
                .iter()
                .map(|_| {
                    let value: Option<Vec<u8>> = next(&mut reply)?;
                    let state: String = next(&mut reply)?;
                    let fence: u64 = next(&mut reply)?;
                    let pttl: i64 = next(&mut reply)?;
                    let oversized: u8 = next(&mut reply)?;
                    let state = match state.as_str() {
                        "fresh" => ReadState::Fresh,
                        "locked" => ReadState::Locked,
                        "nolock" => ReadState::NoLock,
                        // A lock with no expiry (pttl -1) was not set by us: a full lease.
                        _ => ReadState::Busy(Duration::from_millis(
                            u64::try_from(pttl).unwrap_or(lease),
                        )),
                    };
                    Ok(Read {
                        value,
                        state,
                        now_ms,
                        fence,
                        oversized: oversized == 1,
                    })
                })
                .collect()
        })
        .await
    }

    /// `FILL`: each loaded value written (fenced, and not over a newer source version),
    /// published, and its lock released.
    pub(crate) async fn fill_many(&self, fills: &[Fill<'_>]) -> Result<Vec<Written>, Failure> {
        let slotted: Vec<&str> = fills.iter().map(|fill| fill.keys.value.as_str()).collect();
        let most = self.most_read();
        let versions: Vec<String> = fills
            .iter()
            .map(|fill| {
                fill.source_version
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            })
            .collect();
        let versions = &versions;
        self.grouped(&slotted, |mut connection, group| async move {
            let mut script = scripts::FILL.prepare_invoke();
            script.arg(connection.publish_command()).arg(most);
            for &at in &group {
                let fill = &fills[at];
                script
                    .key(&fill.keys.value)
                    .key(&fill.keys.lock)
                    .key(&fill.keys.fence);
                script
                    .arg(fill.token)
                    .arg(millis(fill.lifetime.fresh).max(1))
                    .arg(millis(fill.lifetime.stale))
                    .arg(millis(fill.load))
                    .arg(
                        fill.fence
                            .map(|fence| fence.to_string())
                            .unwrap_or_default(),
                    )
                    .arg(fill.payload)
                    .arg(&fill.keys.channel)
                    .arg(millis(fill.lifetime.fail_safe))
                    .arg(&versions[at])
                    .arg(fill.read_from);
            }
            let reply: Vec<Value> = script.invoke_async(&mut connection).await?;
            let mut reply = reply.into_iter();
            let now_ms: u64 = next(&mut reply)?;
            group
                .iter()
                .map(|_| {
                    let written: u8 = next(&mut reply)?;
                    let fresh_until = next(&mut reply)?;
                    let stale_until = next(&mut reply)?;
                    let stored: Option<Vec<u8>> = next(&mut reply)?;
                    Ok(Written {
                        written: written == 1,
                        newer: written == 2,
                        stored,
                        now_ms,
                        fresh_until,
                        stale_until,
                    })
                })
                .collect()
        })
        .await
    }

    /// `RELEASE`: the locks `token` still holds released, and their waiters told.
    pub(crate) async fn release_many(
        &self,
        keys: &[&RedisKeys],
        token: &str,
    ) -> Result<(), Failure> {
        let slotted: Vec<&str> = keys.iter().map(|keys| keys.value.as_str()).collect();
        self.grouped(&slotted, |mut connection, group| async move {
            let mut script = scripts::RELEASE.prepare_invoke();
            script.arg(token).arg(connection.publish_command());
            for &at in &group {
                script.key(&keys[at].lock).arg(&keys[at].channel);
            }
            let _: i64 = script.invoke_async(&mut connection).await?;
            Ok(group.iter().map(|_| ()).collect())
        })
        .await
        .map(|_| ())
    }

    /// `EXTEND`: the leases `token` still holds renewed; how many were.
    pub(crate) async fn extend_many(
        &self,
        keys: &[&RedisKeys],
        token: &str,
    ) -> Result<usize, Failure> {
        let lease = millis(self.config.lease);
        let slotted: Vec<&str> = keys.iter().map(|keys| keys.value.as_str()).collect();
        let extended = self
            .grouped(&slotted, |mut connection, group| async move {
                let mut script = scripts::EXTEND.prepare_invoke();
                script.arg(token).arg(lease);
                for &at in &group {
                    script.key(&keys[at].lock).key(&keys[at].fence);
                }
                let extended: usize = script.invoke_async(&mut connection).await?;
                Ok(spread(extended, group.len()))
            })
            .await?;
        Ok(extended.into_iter().sum())
    }

    /// `KEEP_FENCE`: keeps alive the fence of each key a flow loads without its lock, while it
    /// is still the one the load read (see `lock::Locks`); how many still were.
    pub(crate) async fn keep_fences(&self, fenced: &[(&RedisKeys, u64)]) -> Result<usize, Failure> {
        let lease = millis(self.config.lease);
        let slotted: Vec<&str> = fenced.iter().map(|(keys, _)| keys.value.as_str()).collect();
        let kept = self
            .grouped(&slotted, |mut connection, group| async move {
                let mut script = scripts::KEEP_FENCE.prepare_invoke();
                script.arg(lease);
                for &at in &group {
                    let (keys, fence) = fenced[at];
                    script.key(&keys.fence).arg(fence);
                }
                let kept: usize = script.invoke_async(&mut connection).await?;
                Ok(spread(kept, group.len()))
            })
            .await?;
        Ok(kept.into_iter().sum())
    }

    /// Runs `script` once per group of the items whose first keys are `slotted` (the groups of
    /// a standalone server, or one per slot on a cluster), all at once in one call bounded by
    /// the operation timeout; each item's answer, in the items' order. `script` answers each
    /// item of its group, in the group's order.
    async fn grouped<'a, T, F, Fut>(
        &'a self,
        slotted: &[&str],
        script: F,
    ) -> Result<Vec<T>, Failure>
    where
        F: Fn(CommandConnection, Vec<usize>) -> Fut + 'a,
        Fut: Future<Output = RedisResult<Vec<T>>> + 'a,
    {
        if slotted.is_empty() {
            return Ok(Vec::new());
        }
        let groups = |connection: &CommandConnection| match connection {
            CommandConnection::Single(_) => (0..slotted.len())
                .collect::<Vec<usize>>()
                .chunks(MOST_PER_SCRIPT)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>(),
            CommandConnection::Cluster { .. } => {
                let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
                for (at, key) in slotted.iter().enumerate() {
                    let slot = Slot::for_key(key);
                    match groups
                        .iter_mut()
                        .find(|(other, places)| *other == slot && places.len() < MOST_PER_SCRIPT)
                    {
                        Some((_, places)) => places.push(at),
                        None => groups.push((slot, vec![at])),
                    }
                }
                groups.into_iter().map(|(_, places)| places).collect()
            }
        };
        let count = slotted.len();
        let script = &script;
        self.call(|connection| async move {
            let groups = groups(&connection);
            let answered = try_join_all(groups.into_iter().map(|group| {
                let connection = connection.clone();
                async move {
                    let places = group.clone();
                    script(connection, group)
                        .await
                        .map(|answers| (places, answers))
                }
            }))
            .await?;
            let mut answers: Vec<Option<T>> = (0..count).map(|_| None).collect();
            for (places, group_answers) in answered {
                for (at, answer) in places.into_iter().zip(group_answers) {
                    answers[at] = Some(answer);
                }
            }
            answers
                .into_iter()
                .map(|answer| {
                    answer.ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::UnexpectedReturnType,
                            "a batch script answered fewer keys than it was given",
                        ))
                    })
                })
                .collect()
        })
        .await
    }
}

/// The next value of a script's reply, as a `T`.
fn next<T: redis::FromRedisValue>(reply: &mut impl Iterator<Item = Value>) -> RedisResult<T> {
    let value = reply.next().ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a batch script's reply is shorter than its keys",
        ))
    })?;
    Ok(redis::from_redis_value(value)?)
}

/// A group's count spread over its items (one each for the first `count`), so that the groups'
/// counts add up when the answers are summed.
fn spread(count: usize, items: usize) -> Vec<usize> {
    (0..items).map(|at| usize::from(at < count)).collect()
}
