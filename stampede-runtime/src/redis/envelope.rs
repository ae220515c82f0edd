//! The value stored under a key's `:v` and published on its channel: a text header that
//! `redis-cli` shows and a Lua script can read, then the payload.
//!
//! ```text
//! S1 <fresh_until> <stale_until> <written_at> <fence> <load_ms>\n<payload>
//! ```
//!
//! `S1` is the format and its version. The three instants are wall-clock milliseconds of the
//! Redis server's clock (the scripts read `TIME`), so every process agrees on them whatever its
//! own clock says; a reader turns them into local deadlines relative to `written_at` or to the
//! server time its read returned. The payload is the value in MessagePack with named fields
//! (`rmp-serde`): compact, and a changed type fails to decode instead of decoding as garbage.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The header's first word. A reader refuses any other.
pub(crate) const FORMAT: &str = "S1";

/// A parsed envelope; the payload still encoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub(crate) fresh_until: u64,
    pub(crate) stale_until: u64,
    pub(crate) written_at: u64,
    /// The fence of the fill that wrote it.
    pub(crate) fence: u64,
    pub(crate) load_ms: u64,
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
        let envelope = Envelope {
            fresh_until: number()?,
            stale_until: number()?,
            written_at: number()?,
            fence: number()?,
            load_ms: number()?,
            payload: &bytes[newline + 1..],
        };
        (words.next().is_none() && envelope.fresh_until <= envelope.stale_until).then_some(envelope)
    }

    /// The header a script writes, for tests of the format.
    #[cfg(test)]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = format!(
            "{FORMAT} {} {} {} {} {}\n",
            self.fresh_until, self.stale_until, self.written_at, self.fence, self.load_ms
        )
        .into_bytes();
        bytes.extend_from_slice(self.payload);
        bytes
    }
}

/// Encodes a value as an envelope's payload.
pub(crate) fn encode<V: Serialize>(value: &V) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    rmp_serde::to_vec_named(value)
}

/// Decodes an envelope's payload.
pub(crate) fn decode<V: DeserializeOwned>(payload: &[u8]) -> Result<V, rmp_serde::decode::Error> {
    rmp_serde::from_slice(payload)
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
        let payload = encode(&product).unwrap();
        let envelope = Envelope {
            fresh_until: 1_700_000_060_000,
            stale_until: 1_700_000_090_000,
            written_at: 1_700_000_000_000,
            fence: 3,
            load_ms: 120,
            payload: &payload,
        };
        let bytes = envelope.to_bytes();
        assert!(bytes.starts_with(b"S1 1700000060000 1700000090000 1700000000000 3 120\n"));
        let parsed = Envelope::parse(&bytes).unwrap();
        assert_eq!(parsed, envelope);
        assert_eq!(decode::<Product>(parsed.payload).unwrap(), product);
    }

    #[test]
    fn foreign_bytes_are_not_envelopes() {
        for garbage in [
            &b""[..],
            b"hello",
            b"S2 1 2 3 4 5\nx",
            b"S1 1 2 3 4\nx",
            b"S1 9 2 3 4 5\nx",
            b"S1 a 2 3 4 5\n",
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
    fn a_changed_type_fails_to_decode() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct ProductV2 {
            id: u64,
            price_cents: u64,
        }
        let payload = encode(&Product {
            id: 1,
            name: "x".into(),
            tags: vec![],
        })
        .unwrap();
        assert!(decode::<ProductV2>(&payload).is_err());
    }
}
