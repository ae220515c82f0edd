//! The protocol's operations on one [`Endpoint`]: each a script, a command or a pipeline, in
//! one round trip (see `scripts` for what each script does; a hit on a standalone server reads
//! with a pipeline, and a longer value with a second one), run through [`Endpoint::call`].

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Lifetime;
use crate::redis::codec::envelope;
use crate::redis::codec::keys::RedisKeys;
use crate::redis::protocol::scripts;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::invalidate;
use crate::redis::transport::link::CommandConnection;

/// What `READ_OR_LOCK` found.
pub(crate) struct Read {
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) state: ReadState,
    /// The server's clock when it read, in ms.
    pub(crate) now_ms: u64,
    /// The key's fence: the one this flow took with the lock, else the current one.
    pub(crate) fence: u64,
    /// The value in Redis is over the connection's size bound, and was left there unread.
    pub(crate) oversized: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadState {
    /// The value is fresh; no lock was taken.
    Fresh,
    /// The caller now holds the lock.
    Locked,
    /// Another holder has the lock for this much longer.
    Busy(Duration),
    /// No lock was asked for.
    NoLock,
}

/// A time on the server's clock (ms), taken from a reply that had reached this process by
/// `replied`: the server's time at a later instant here is bounded from below by it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ServerTime {
    ms: u64,
    replied: Instant,
}

impl ServerTime {
    /// The server's time `ms`, from a reply that has just come.
    pub(crate) fn replied(ms: u64) -> ServerTime {
        ServerTime {
            ms,
            replied: Instant::now(),
        }
    }

    /// The server's time (ms) at `then`, rounded down: the server's clock said `ms` before the
    /// reply came, and has run since about as long as this process's.
    pub(crate) fn at(self, then: Instant) -> u64 {
        self.ms + millis(then.saturating_duration_since(self.replied))
    }
}

/// What `FILL` did.
pub(crate) struct Written {
    /// False when the key's fence moved since it was read (another holder, fill, prime or an
    /// invalidation), or the value stored has a newer source version: nothing was written.
    pub(crate) written: bool,
    /// Nothing was written because the value stored has a newer source version.
    pub(crate) newer: bool,
    /// When nothing was written: the envelope Redis holds instead, if any and within the bound.
    pub(crate) stored: Option<Vec<u8>>,
    pub(crate) now_ms: u64,
    pub(crate) fresh_until: u64,
    pub(crate) stale_until: u64,
}

/// One key's fill (`FILL`): a load's or a prime's value, ready to be written.
pub(crate) struct Fill<'a> {
    pub(crate) keys: &'a RedisKeys,
    /// The lock's token, empty for a key loaded without the lock (and for a prime).
    pub(crate) token: &'a str,
    /// Fresh, stale, then kept past its stale deadline for `fail_safe` (`Handle::lifetime`).
    pub(crate) lifetime: Lifetime,
    pub(crate) load: Duration,
    /// The fence the read returned: the fill is refused unless it is still the key's fence.
    /// `None` for a prime, the latest write by definition: written whatever the fence, which it
    /// moves on, so that no load running now fills after it.
    pub(crate) fence: Option<u64>,
    /// The value's source version: the fill is refused if the value stored has a newer one.
    pub(crate) source_version: Option<u64>,
    /// The server's time (ms) when the value was read from the source (the start of the load's
    /// attempt that gave it, bounded from below; after the read that gave `fence`), written as
    /// the envelope's `read_at`: a refused fill deletes a value whose source was read before
    /// it, which is older (see `FILL`). 0 for a prime (read now).
    pub(crate) read_from: u64,
    pub(crate) payload: &'a [u8],
}

/// The most a hit reads with `GETRANGE` (see [`Endpoint::read_fresh`]): a value this long or
/// longer is read again by `READ_FRESH`, which checks the size bound on the server.
const HIT_WINDOW: usize = 16 << 10;

impl Endpoint {
    /// The value at `value_key` if it is fresh by the server's clock, with that clock's time
    /// (ms). On a standalone server, a pipelined `GETRANGE` of the first [`HIT_WINDOW`] bytes
    /// and `TIME`: a hit's one round trip without a script, which costs the server about as
    /// much as the `GET` itself. On a cluster (where `TIME` could reach another node, with
    /// another clock) and for a longer value, `READ_FRESH`.
    pub(crate) async fn read_fresh(
        &self,
        value_key: &str,
    ) -> Result<Option<(Vec<u8>, u64)>, Failure> {
        let window = HIT_WINDOW.min(self.most_read());
        let ranged = self
            .call(|mut connection| async move {
                if !matches!(connection, CommandConnection::Single(_)) {
                    return Ok(None);
                }
                let (bytes, (seconds, micros)): (Vec<u8>, (u64, u64)) = redis::pipe()
                    .cmd("GETRANGE")
                    .arg(value_key)
                    .arg(0)
                    .arg(window - 1)
                    .cmd("TIME")
                    .query_async(&mut connection)
                    .await?;
                Ok(Some((bytes, seconds * 1_000 + micros / 1_000)))
            })
            .await?;
        match ranged {
            // Nothing there (`GETRANGE` of a missing key is empty; no envelope is).
            Some((bytes, _)) if bytes.is_empty() => Ok(None),
            Some((bytes, now_ms)) if bytes.len() < window => {
                let fresh = envelope::Envelope::parse(&bytes)
                    .is_some_and(|envelope| envelope.fresh_until > now_ms);
                Ok(fresh.then_some((bytes, now_ms)))
            }
            // A cluster, or a value that may be longer than the window.
            _ => {
                let (value, now_ms) = one(self.read_fresh_many(&[value_key]).await?)?;
                Ok(value.map(|value| (value, now_ms)))
            }
        }
    }

    /// The longest envelope the read scripts return: the payload's bound and its header.
    pub(crate) fn most_read(&self) -> usize {
        self.config.max_value_bytes + envelope::HEADER_ROOM
    }

    /// `FILL` of one key: fenced, published, and the lock released.
    pub(crate) async fn fill(&self, fill: &Fill<'_>) -> Result<Written, Failure> {
        one(self.fill_many(std::slice::from_ref(fill)).await?)
    }

    /// Drops one identity's key: its value deleted (or with `expire` only no longer fresh:
    /// `expire_lua!`) and its fence moved on; announces `message` on the invalidation channel,
    /// unless `None`. On a standalone server the script announces it (one round trip); on a
    /// cluster the announcement follows on the feed's master (see `invalidate`), once the value
    /// is changed. Whether Redis held a value for the key. (A
    /// key's invalidation goes through `Endpoint::invalidate`, which reaches every shape.)
    pub(in crate::redis) async fn invalidate_one(
        &self,
        keys: &RedisKeys,
        message: Option<&[u8]>,
        expire: bool,
    ) -> Result<bool, Failure> {
        self.call(|mut connection| async move {
            let (channel, log, most) = self.feed_path(&connection);
            let (in_script, after) = match message {
                Some(message) if connection.mode().is_cluster() => ("", Some(message)),
                Some(_) => (channel.as_str(), None),
                None => ("", None),
            };
            let mut script = scripts::INVALIDATE.key(&keys.value);
            script.key(&keys.fence);
            if !in_script.is_empty() {
                script.key(&log);
            }
            let deleted: i64 = script
                .arg(in_script)
                .arg(message.unwrap_or_default())
                .arg(most)
                .arg(if expire { "1" } else { "" })
                .invoke_async(&mut connection)
                .await?;
            if let Some(message) = after {
                invalidate::announce(&mut connection, (&channel, &log, most), message).await?;
            }
            Ok(deleted == 1)
        })
        .await
    }

    /// Announces `message` on the invalidation channel, on its own (a tag's invalidation, or a
    /// key's announced again): `PUBLISH`, or on a cluster `SPUBLISH` on the feed's master.
    pub(in crate::redis) async fn announce(&self, message: &[u8]) -> Result<(), Failure> {
        self.call(|mut connection| async move {
            let (channel, log, most) = self.feed_path(&connection);
            invalidate::announce(&mut connection, (&channel, &log, most), message).await
        })
        .await
    }

    /// The invalidation feed on `connection`'s server: its channel, its log and the log's
    /// length.
    fn feed_path(&self, connection: &CommandConnection) -> (String, String, usize) {
        let mode = connection.mode();
        let (log, most) = self.log_of(mode);
        (
            invalidate::channel(&self.config.prefix, self.config.db(), mode),
            log,
            most,
        )
    }
}

/// The one answer of a script run for one key (`grouped` answers each key it is given).
fn one<T>(mut answers: Vec<T>) -> Result<T, Failure> {
    answers.pop().ok_or_else(|| {
        Failure::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a script answered no key of one",
        )))
    })
}

pub(in crate::redis) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
