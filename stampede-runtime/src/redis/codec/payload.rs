//! A value's bytes in Redis: a small self-describing binary form of serde's data model that
//! gives every value back exactly as it was written, and whose reading is bounded.
//!
//! Why not MessagePack (`rmp-serde`, the earlier form), CBOR, JSON or RON: the first three
//! write `None`, `()` and a unit struct alike and `Some(x)` as `x`, so `Some(None)` and
//! `Some(())` come back as `None`; rmp-serde does not count enums against its depth limit, so a
//! deep enum payload overflows the reader's stack. RON keeps options apart, but it cannot read
//! back internally tagged enums (`#[serde(tag = "..")]`, common in services), decodes about six
//! times slower than MessagePack, and writes floats at full decimal length. A non-self-describing
//! form (bincode, postcard) cannot read back `skip_serializing_if` fields or `flatten`. So the
//! form is ours, and it is fuzzed (`fuzz/`).
//!
//! ```text
//! payload  := 0xC1 0x02 value            0xC1 is never the first byte of MessagePack: the
//!                                        payloads of earlier versions never decode as this one
//! value    := 0x00                        None
//!           | 0x01 value                  Some
//!           | 0x02                        (), unit struct
//!           | 0x03 | 0x04                 false | true
//!           | 0x05 varint                 an integer >= 0 (u8 .. u64, i8 .. i64, u128, i128)
//!           | 0x06 varint                 an integer < 0: -1 - n
//!           | 0x07 u128 | 0x08 i128       16 bytes, little-endian, outside the 64-bit range
//!           | 0x09 f32 | 0x0A f64         the bits, little-endian (NaN payloads and -0.0 kept)
//!           | 0x0B varint                 char
//!           | 0x0C varint bytes           str (UTF-8)
//!           | 0x0D varint bytes           bytes
//!           | 0x0E count value*           seq, tuple, tuple struct
//!           | 0x0F count (value value)*   map, struct (field names as str)
//!           | 0x10 name                   unit variant
//!           | 0x11 name value             newtype variant
//!           | 0x12 name count value*      tuple variant
//!           | 0x13 name count (str value)*  struct variant
//! name     := varint bytes (UTF-8)        a variant by name, so reordering variants is harmless
//! count    := u32 little-endian
//! ```
//!
//! A newtype struct is its content. Structs are written with their field names (so
//! `skip_serializing_if`, `default` and `flatten` read back), enums with their variant names.
//! Read as a self-describing input (`deserialize_any`, for untagged and internally tagged enums
//! and `flatten`), an option stays an option, a unit variant is its name and another variant a
//! map of one entry, as serde expects.
//!
//! With `compress = N` (the `compress` feature), a payload whose form above takes more than `N`
//! bytes is written compressed, when that is smaller:
//!
//! ```text
//! payload  := 0xC1 0x03 length lz4       length: the bytes of `value`, u32 little-endian;
//!                                        lz4: `value` as one LZ4 block
//! ```
//!
//! Every reader tells the two forms apart by their first bytes, whatever its own options: a
//! cache's `compress` changes neither its identity nor what it reads. A build without the
//! feature reads a compressed payload as malformed (a counted miss).
//!
//! Bounds: a payload is at most the size its caller gives (the connection's `max_value_size`),
//! checked when writing (the value is not written) and when reading (a counted miss); nesting
//! (options, sequences, maps, structs and enum variants alike) is at most [`MAX_DEPTH`] deep,
//! checked both ways, so what is written can be read and a hostile payload is an error, never a
//! stack overflow.

mod read;
mod write;

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The deepest nesting written or read: every option, sequence, map, struct and enum variant
/// with data is one level.
pub(crate) const MAX_DEPTH: usize = 128;

/// The first two bytes of a payload written as it is.
const MAGIC: [u8; 2] = [0xC1, 0x02];

/// The first two bytes of a compressed payload, then its value's length and LZ4 block.
const MAGIC_LZ4: [u8; 2] = [0xC1, 0x03];

/// Why a value could not be written, or a payload read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PayloadError {
    /// The value's own `Serialize` or `Deserialize` said so.
    Custom(String),
    /// Over the maximum size: the size reached, and the maximum.
    TooLarge(usize, usize),
    /// Over [`MAX_DEPTH`].
    TooDeep,
    /// Bytes that are not a payload of this form.
    Malformed(&'static str),
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadError::Custom(message) => f.write_str(message),
            PayloadError::TooLarge(size, max) => write!(
                f,
                "the value takes {size} bytes or more, over the maximum of {max}"
            ),
            PayloadError::TooDeep => write!(f, "the value nests deeper than {MAX_DEPTH} levels"),
            PayloadError::Malformed(what) => write!(f, "not a stampede payload: {what}"),
        }
    }
}

impl std::error::Error for PayloadError {}

impl serde::ser::Error for PayloadError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        PayloadError::Custom(message.to_string())
    }
}

impl serde::de::Error for PayloadError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        PayloadError::Custom(message.to_string())
    }
}

/// The payload of `value`, if it takes at most `max_bytes`: compressed when it takes more than
/// `compress_over` bytes (and compressing makes it smaller).
pub(crate) fn encode<V: Serialize + ?Sized>(
    value: &V,
    max_bytes: usize,
    compress_over: Option<usize>,
) -> Result<Vec<u8>, PayloadError> {
    let mut writer = write::Writer::new(max_bytes);
    writer.out.extend_from_slice(&MAGIC);
    value.serialize(&mut writer)?;
    let payload = writer.finish()?;
    Ok(match compress_over {
        Some(over) if payload.len() > over => compressed(payload),
        _ => payload,
    })
}

/// The value a payload of at most `max_bytes` holds; a compressed payload's value, too, is at
/// most `max_bytes`, checked before it is decompressed.
pub(crate) fn decode<V: DeserializeOwned>(
    payload: &[u8],
    max_bytes: usize,
) -> Result<V, PayloadError> {
    if payload.len() > max_bytes {
        return Err(PayloadError::TooLarge(payload.len(), max_bytes));
    }
    if let Some(packed) = payload.strip_prefix(&MAGIC_LZ4[..]) {
        return read(&decompressed(packed, max_bytes)?);
    }
    let body = payload
        .strip_prefix(&MAGIC[..])
        .ok_or(PayloadError::Malformed("another format or version"))?;
    read(body)
}

/// The value `body` (a payload without its first bytes) holds.
fn read<V: DeserializeOwned>(body: &[u8]) -> Result<V, PayloadError> {
    let mut reader = read::Reader::new(body);
    let value = V::deserialize(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

/// `payload` compressed, or as it is where compressing does not make it smaller. The length
/// LZ4 prepends is a `u32`: a payload is at most `max_value_size`, 512 MiB at most.
#[cfg(feature = "compress")]
fn compressed(payload: Vec<u8>) -> Vec<u8> {
    let block = lz4_flex::block::compress_prepend_size(&payload[MAGIC.len()..]);
    if MAGIC_LZ4.len() + block.len() < payload.len() {
        [&MAGIC_LZ4[..], &block].concat()
    } else {
        payload
    }
}

/// Without the feature nothing is compressed: the macro refuses `compress` then.
#[cfg(not(feature = "compress"))]
fn compressed(payload: Vec<u8>) -> Vec<u8> {
    payload
}

/// The body a compressed payload (after its first bytes) holds, if it takes at most
/// `max_bytes` as a payload: the length it states is checked before anything is allocated.
#[cfg(feature = "compress")]
fn decompressed(packed: &[u8], max_bytes: usize) -> Result<Vec<u8>, PayloadError> {
    let (length, block) = lz4_flex::block::uncompressed_size(packed)
        .map_err(|_| PayloadError::Malformed("a compressed payload cut short"))?;
    let size = length.saturating_add(MAGIC.len());
    if size > max_bytes {
        return Err(PayloadError::TooLarge(size, max_bytes));
    }
    let mut body = vec![0; length];
    match lz4_flex::block::decompress_into(block, &mut body) {
        Ok(written) if written == length => Ok(body),
        _ => Err(PayloadError::Malformed(
            "a compressed payload whose block does not decompress to its stated length",
        )),
    }
}

/// Without the feature a compressed payload cannot be read: each is a counted miss, and the
/// first is logged as a warning, since only a build change mends it.
#[cfg(not(feature = "compress"))]
fn decompressed(_packed: &[u8], _max_bytes: usize) -> Result<Vec<u8>, PayloadError> {
    const WHY: &str = "compressed (`compress`), and this build lacks stampede's `compress` feature";
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "stampede: a value in Redis is {WHY}: every compressed value is a miss here, loaded from the source; enable the feature (on by default) in every binary that shares a cache with `compress`"
        );
    });
    Err(PayloadError::Malformed(WHY))
}

#[cfg(test)]
mod tests;
