//! The value stored under a key's `:v` and published on its channel: a text header that
//! `redis-cli` shows and a Lua script can read, then the payload.
//!
//! ```text
//! S3 <fresh_until> <stale_until> <written_at> <read_at> <fence> <load_ms> <source_version or ->\n<payload>
//! ```
//!
//! `S3` is the format and its version (`S2` had no `read_at`, `S1` no source version either; a
//! reader refuses both). The four instants are wall-clock milliseconds of the Redis server's
//! clock (the scripts read `TIME`), so every process agrees on them whatever its own clock says;
//! a reader turns the deadlines into local ones relative to `written_at` or to the server time
//! its read returned. `read_at` is when the value's source was read (bounded from below): what
//! orders it against another load's value (`order::may_be_newer`), since a slow load may write
//! an older value after a faster one read a newer. The source version (`-` for a cache without
//! `source_version`) is what `FILL` compares a newer fill's with. The payload is the value in the
//! form `payload` writes: it gives every value back exactly, and its reading is bounded in size
//! (the connection's `max_value_size`, checked by the scripts before a value leaves the server)
//! and depth.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::clock::after;
use crate::entry::Entry;
use crate::redis::codec::payload::{self, PayloadError};

/// The largest payload written to or read from Redis unless the connection says otherwise
/// (`RedisConfig::max_value_size`): 8 MiB. A larger value is not written (kept in memory only,
/// with a warning naming the cache); a larger one in Redis is a miss, counted as a decode error,
/// and the reads leave it on the server (a hit reads at most its first 16 KiB).
pub(crate) const DEFAULT_MAX_VALUE_BYTES: usize = 8 << 20;

/// Room for the header on top of the payload's bound: the longest header a script writes (the
/// format word and seven numbers of at most 20 digits, spaced, and the newline) fits in it.
pub(crate) const HEADER_ROOM: usize = 128;

/// The header's first word. A reader refuses any other.
pub(crate) const FORMAT: &str = "S3";

/// The fence a stored envelope carries once its value was expired (`expire`): no fill writes
/// it (fences start from the server's clock in µs), and `FILL` orders a fill over such a value
/// as over nothing. A waiter never takes it for the fill it waits for. (The scripts write the
/// number itself; their tests check it is this.)
#[cfg(test)]
pub(crate) const EXPIRED: u64 = 0;

/// A parsed envelope; the payload still encoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub(crate) fresh_until: u64,
    pub(crate) stale_until: u64,
    pub(crate) written_at: u64,
    /// When the value's source was read, bounded from below: orders it against other loads'.
    pub(crate) read_at: u64,
    /// The fence of the fill that wrote it.
    pub(crate) fence: u64,
    pub(crate) load_ms: u64,
    /// The value's source version, for a cache with `source_version`.
    pub(crate) source_version: Option<u64>,
    pub(crate) payload: &'a [u8],
}

impl<'a> Envelope<'a> {
    /// Reads an envelope, or `None` for bytes that are not one (another format, another writer).
    pub(crate) fn parse(bytes: &'a [u8]) -> Option<Envelope<'a>> {
        let newline = bytes.iter().position(|&b| b == b'\n')?;
        let header = std::str::from_utf8(&bytes[..newline]).ok()?;
        let mut words = header.split(' ');
        if words.next()? != FORMAT {
            return None;
        }
        let mut number = || words.next()?.parse::<u64>().ok();
        let (fresh_until, stale_until, written_at, read_at, fence, load_ms) = (
            number()?,
            number()?,
            number()?,
            number()?,
            number()?,
            number()?,
        );
        let source_version = match words.next()? {
            "-" => None,
            version => Some(version.parse().ok()?),
        };
        let envelope = Envelope {
            fresh_until,
            stale_until,
            written_at,
            read_at,
            fence,
            load_ms,
            source_version,
            payload: &bytes[newline + 1..],
        };
        (words.next().is_none() && envelope.fresh_until <= envelope.stale_until).then_some(envelope)
    }

    /// The header a script writes, for tests of the format.
    #[cfg(test)]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let source_version = self
            .source_version
            .map_or_else(|| "-".to_owned(), |version| version.to_string());
        let mut bytes = format!(
            "{FORMAT} {} {} {} {} {} {} {source_version}\n",
            self.fresh_until,
            self.stale_until,
            self.written_at,
            self.read_at,
            self.fence,
            self.load_ms
        )
        .into_bytes();
        bytes.extend_from_slice(self.payload);
        bytes
    }
}

/// Whether published `bytes` are a fill at `fence` or later: what a waiter that read `fence`
/// may take. A subscriber that lags may hand a new listener a fill published before it
/// subscribed, older than an invalidation since.
pub(crate) fn filled_at_or_after(bytes: &[u8], fence: u64) -> bool {
    Envelope::parse(bytes).is_some_and(|envelope| envelope.fence >= fence)
}

/// Encodes a value as an envelope's payload, compressed over `compress_over` bytes; an error
/// for a value over `max` bytes (before compression) or nested too deep, which is then not
/// written to Redis.
pub(crate) fn encode<V: Serialize>(
    value: &V,
    max: usize,
    compress_over: Option<usize>,
) -> Result<Vec<u8>, PayloadError> {
    payload::encode(value, max, compress_over)
}

/// Decodes an envelope's payload; an error for anything but a payload of this form and type,
/// within the bounds (`max` bytes).
pub(crate) fn decode<V: DeserializeOwned>(payload: &[u8], max: usize) -> Result<V, PayloadError> {
    payload::decode(payload, max)
}

/// What an envelope read from Redis holds, on this process's clock.
pub(crate) enum Decoded<V> {
    Nothing,
    Undecodable,
    /// Fresh or stale.
    Servable(Entry<V>),
    /// Past its stale deadline.
    Unservable(Entry<V>),
}

/// Reads an envelope. Deadlines are turned into this process's instants relative to
/// `server_now` (the server's clock at the read) or, for a publication, to its writing. A payload
/// over `max` bytes is undecodable.
pub(crate) fn decoded<V: DeserializeOwned>(
    bytes: Option<&[u8]>,
    server_now: Option<u64>,
    max: usize,
) -> Decoded<V> {
    let Some(bytes) = bytes else {
        return Decoded::Nothing;
    };
    let Some(envelope) = Envelope::parse(bytes) else {
        return Decoded::Undecodable;
    };
    let Ok(value) = decode(envelope.payload, max) else {
        return Decoded::Undecodable;
    };
    let reference = server_now.unwrap_or(envelope.written_at);
    let now = Instant::now();
    let back = |at: u64| now.checked_sub(since(reference, at));
    let filled_at = back(envelope.written_at).unwrap_or(now);
    let entry = Entry::new(
        value,
        filled_at,
        after(now, since(envelope.fresh_until, reference)),
        after(now, since(envelope.stale_until, reference)),
    )
    // At the latest: the server's clock said `reference` before now.
    .read_from(back(envelope.read_at).unwrap_or(filled_at).min(filled_at));
    if entry.servable(now) {
        Decoded::Servable(entry)
    } else {
        Decoded::Unservable(entry)
    }
}

/// How long after `reference` (ms of the server's clock) `deadline` falls.
pub(crate) fn since(deadline: u64, reference: u64) -> Duration {
    Duration::from_millis(deadline.saturating_sub(reference))
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Product {
        id: u64,
        name: String,
        tags: Vec<String>,
    }

    #[test]
    fn an_envelope_round_trips() {
        let product = Product {
            id: 7,
            name: "Kettle".into(),
            tags: vec!["kitchen".into()],
        };
        let payload = encode(&product, DEFAULT_MAX_VALUE_BYTES, None).unwrap();
        let envelope = Envelope {
            fresh_until: 1_700_000_060_000,
            stale_until: 1_700_000_090_000,
            written_at: 1_700_000_000_000,
            read_at: 1_699_999_999_880,
            fence: 3,
            load_ms: 120,
            source_version: Some(41),
            payload: &payload,
        };
        let bytes = envelope.to_bytes();
        assert!(
            bytes.starts_with(
                b"S3 1700000060000 1700000090000 1700000000000 1699999999880 3 120 41\n"
            )
        );
        let parsed = Envelope::parse(&bytes).unwrap();
        assert_eq!(parsed, envelope);
        assert_eq!(
            decode::<Product>(parsed.payload, DEFAULT_MAX_VALUE_BYTES).unwrap(),
            product
        );
    }

    #[test]
    fn foreign_bytes_are_not_envelopes() {
        for garbage in [
            &b""[..],
            b"hello",
            b"S1 1 2 3 4 5\nx",
            b"S2 1 2 3 4 5 -\nx",
            b"S3 1 2 3 4 5 6\nx",
            b"S3 1 2 3 4 5 6 x\nx",
            b"S3 1 2 3 4 5 6 - 7\nx",
            b"S3 9 2 3 4 5 6 -\nx",
            b"S3 a 2 3 4 5 6 -\n",
        ] {
            assert_eq!(
                Envelope::parse(garbage),
                None,
                "{:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    #[test]
    fn values_that_encode_as_nothing_inside_options_round_trip() {
        fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T) {
            let payload = encode(&value, DEFAULT_MAX_VALUE_BYTES, None).unwrap();
            assert_eq!(
                decode::<T>(&payload, DEFAULT_MAX_VALUE_BYTES).unwrap(),
                value
            );
        }
        #[derive(Serialize, Deserialize, Debug, PartialEq)]
        struct Marker;
        round_trip(Some(None::<u8>));
        round_trip(Some(()));
        round_trip(Some(Some(None::<()>)));
        round_trip(Some(Marker));
        round_trip(vec![Some(None::<Marker>), None, Some(Some(Marker))]);
    }

    /// A payload nested deeper than any reader's stack, in enums (which a decoder may not
    /// count as nesting): another process, or anyone who can write to Redis, can store it.
    #[test]
    fn a_deeply_nested_enum_payload_is_undecodable_not_a_crash() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        enum Tree {
            Leaf,
            Node(Box<Tree>),
        }
        // MessagePack: `{"Node": {"Node": ... "Leaf"}}`, 200_000 levels (the earlier form;
        // `payload`'s tests nest its own form).
        let mut payload = Vec::new();
        for _ in 0..200_000 {
            payload.extend_from_slice(&[0x81, 0xa4]);
            payload.extend_from_slice(b"Node");
        }
        payload.extend_from_slice(&[0xa4]);
        payload.extend_from_slice(b"Leaf");
        assert!(decode::<Tree>(&payload, DEFAULT_MAX_VALUE_BYTES).is_err());
    }

    #[test]
    fn a_changed_type_fails_to_decode() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct ProductV2 {
            id: u64,
            price_cents: u64,
        }
        let payload = encode(
            &Product {
                id: 1,
                name: "x".into(),
                tags: vec![],
            },
            DEFAULT_MAX_VALUE_BYTES,
            None,
        )
        .unwrap();
        assert!(decode::<ProductV2>(&payload, DEFAULT_MAX_VALUE_BYTES).is_err());
    }
}
