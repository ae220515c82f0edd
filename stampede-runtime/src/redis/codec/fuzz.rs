//! What the fuzz targets (`fuzz/`) call: the decoders and the key encoding, built only under
//! `cfg(fuzzing)` (which `cargo fuzz` sets). Not an API.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::redis::codec::envelope::{self, DEFAULT_MAX_VALUE_BYTES, Envelope};
use crate::redis::codec::keys;

/// Parses `bytes` as an envelope read from Redis and decodes its payload as a `V`.
pub fn decode_envelope<V: DeserializeOwned>(bytes: &[u8]) -> Option<V> {
    let envelope = Envelope::parse(bytes)?;
    envelope::decode(envelope.payload, DEFAULT_MAX_VALUE_BYTES).ok()
}

/// Decodes a payload as a `V`.
pub fn decode<V: DeserializeOwned>(payload: &[u8]) -> Option<V> {
    envelope::decode(payload, DEFAULT_MAX_VALUE_BYTES).ok()
}

/// Encodes `value` as a payload, compressed where that makes it smaller (with `compress`).
pub fn encode<V: Serialize>(value: &V) -> Option<Vec<u8>> {
    envelope::encode(value, DEFAULT_MAX_VALUE_BYTES, Some(0)).ok()
}

/// The text of a key's arguments in its Redis keys.
pub fn key_text<K: Serialize>(key: &K) -> Option<String> {
    keys::args_text(key).ok()
}
