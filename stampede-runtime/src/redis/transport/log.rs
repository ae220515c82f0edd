//! The invalidation feed's log as a reader sees it (`invalidate` writes it): the ids of its
//! entries, how far a process has handled it, and the entries after a position.

use std::sync::Arc;

/// An entry's id in the feed's log (`{ms}-{seq}`, as Redis gives a stream entry), which orders
/// the invalidations as the server ran them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LogId {
    ms: u64,
    seq: u64,
}

impl LogId {
    pub(crate) fn parse(text: &[u8]) -> Option<LogId> {
        let (ms, seq) = std::str::from_utf8(text).ok()?.split_once('-')?;
        Some(LogId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    fn text(self) -> String {
        format!("{}-{}", self.ms, self.seq)
    }

    /// The least id after this one (an exclusive start that Redis before 6.2 reads too).
    fn next(self) -> String {
        match self.seq.checked_add(1) {
            Some(seq) => format!("{}-{seq}", self.ms),
            None => format!("{}-0", self.ms.saturating_add(1)),
        }
    }
}

/// How far this process has handled the feed's log of one server: every invalidation the log
/// held up to `id` reached its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// The server's run (`INFO server`'s `run_id`): a restarted server's log is another, even
    /// one loaded back from a snapshot that holds `id`.
    pub(crate) run: Arc<str>,
    pub(crate) id: LogId,
}

/// The messages of the feed's `log` after `from`, oldest first, at most `count` of them; `None`
/// when the log no longer holds `from` itself (trimmed past it, or gone: what came between may
/// be lost). One round trip.
pub(crate) async fn read_after(
    connection: &mut impl redis::aio::ConnectionLike,
    log: &str,
    from: LogId,
    count: usize,
) -> redis::RedisResult<Option<Vec<(LogId, Vec<u8>)>>> {
    let (held, after): (redis::Value, redis::Value) = redis::pipe()
        .cmd("XRANGE")
        .arg(log)
        .arg(from.text())
        .arg(from.text())
        .cmd("XRANGE")
        .arg(log)
        .arg(from.next())
        .arg("+")
        .arg("COUNT")
        .arg(count)
        .query_async(connection)
        .await?;
    if entries(held).is_empty() {
        return Ok(None);
    }
    Ok(Some(entries(after)))
}

/// The entries of an `XRANGE` reply: each id with its message (field `m`); an entry of another
/// form is read as an empty message, which no process acts on.
fn entries(reply: redis::Value) -> Vec<(LogId, Vec<u8>)> {
    let redis::Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let redis::Value::Array(entry) = entry else {
                return None;
            };
            let mut parts = entry.into_iter();
            let (Some(redis::Value::BulkString(id)), fields) = (parts.next(), parts.next()) else {
                return None;
            };
            let message = match fields {
                Some(redis::Value::Array(fields)) => match fields.into_iter().nth(1) {
                    Some(redis::Value::BulkString(message)) => message,
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            Some((LogId::parse(&id)?, message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_orders_as_redis_does_and_its_successor_is_the_least_after_it() {
        let id = LogId::parse(b"1733400000000-7").unwrap();
        assert!(id < LogId::parse(b"1733400000000-8").unwrap());
        assert!(id < LogId::parse(b"1733400000001-0").unwrap());
        assert_eq!(id.next(), "1733400000000-8");
        assert_eq!(LogId::parse(&u64::MAX.to_string().into_bytes()), None);
        let last = LogId::parse(format!("5-{}", u64::MAX).as_bytes()).unwrap();
        assert_eq!(last.next(), "6-0");
    }
}
