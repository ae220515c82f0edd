//! Envelope and payload decoding: whatever bytes Redis holds, decoding never panics and never
//! overflows the stack; a payload that decodes is written back to the same bytes' value.

#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};
use stampede_runtime::__fuzz;

/// Every kind of value serde has, nested: read typed.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Typed {
    Unit,
    Empty(()),
    Marker(Marker),
    Opt(Option<Box<Typed>>),
    Ints(i8, u16, i64, u128, i128),
    Floats(f32, f64),
    Text(String, char),
    Bytes(#[serde(with = "bytes")] Vec<u8>),
    List(Vec<Typed>),
    Map(BTreeMap<(i32, Option<bool>), Typed>),
    Named {
        #[serde(skip_serializing_if = "Option::is_none", default)]
        maybe: Option<Option<()>>,
        inner: Box<Typed>,
        shared: Arc<Typed>,
    },
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Marker;

/// Read as a self-describing input: untagged, internally tagged, flattened.
///
/// No variant is an `Option<Box<Any>>`: serde reads an untagged enum by buffering the input and
/// trying each variant on the buffer, and reads anything but a none as `Some` of itself, so
/// such a variant recurses on the same buffered value without end whatever the format (the
/// first run of this target found it with the input `0b 1a`). That is the type's loop, not
/// the payload's: the payload's own nesting is bounded.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(untagged)]
enum Any {
    Flag(bool),
    Number(i64),
    Text(String),
    List(Vec<Any>),
    Tagged(Tagged),
    Flat(Flat),
    Nothing(Option<bool>),
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(tag = "type")]
enum Tagged {
    A { x: Option<Box<Any>> },
    B,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Flat {
    id: u64,
    #[serde(flatten)]
    rest: BTreeMap<String, Any>,
}

mod bytes {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
        }
        d.deserialize_byte_buf(Visit)
    }
}

/// A decoded value, encoded again, decodes to itself (NaN aside, which is not equal to itself).
fn again<V: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug>(value: V) {
    let payload = __fuzz::encode(&value).expect("a decoded value encodes");
    let back: V = __fuzz::decode(&payload).expect("an encoded value decodes");
    let text = format!("{value:?}");
    if !text.contains("NaN") {
        assert_eq!(back, value);
    }
}

fuzz_target!(|data: &[u8]| {
    // As an envelope read from Redis (header, then payload).
    let _ = __fuzz::decode_envelope::<Typed>(data);
    let _ = __fuzz::decode_envelope::<Any>(data);
    // As a payload, with this version's first bytes so that the fuzzer reaches the values.
    let payload = [&[0xC1, 0x02][..], data].concat();
    if let Some(value) = __fuzz::decode::<Typed>(&payload) {
        again(value);
    }
    if let Some(value) = __fuzz::decode::<Any>(&payload) {
        again(value);
    }
    let _ = __fuzz::decode::<serde::de::IgnoredAny>(&payload);
    let _ = __fuzz::decode::<(String, Vec<Option<u8>>)>(&payload);
    // As a compressed payload (`compress`): a stated length, then an LZ4 block.
    let packed = [&[0xC1, 0x03][..], data].concat();
    if let Some(value) = __fuzz::decode::<Typed>(&packed) {
        again(value);
    }
    let _ = __fuzz::decode::<serde::de::IgnoredAny>(&packed);
});
