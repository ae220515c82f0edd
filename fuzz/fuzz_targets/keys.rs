//! Key encoding: two keys that encode to the same Redis key text are equal, and equal keys
//! encode to the same text.

#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use stampede_runtime::__fuzz;

/// Every serde shape a key may have, with field skipping and nesting.
#[derive(Arbitrary, Serialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Unit,
    Empty(()),
    Text(String),
    Texts(Vec<String>),
    Char(char),
    Int(i64),
    Wide(i128),
    Flag(bool),
    Float(Float),
    Bytes(#[serde(with = "bytes")] Vec<u8>),
    Maybe(Option<Box<Key>>),
    List(Vec<Key>),
    Pair(Box<Key>, Box<Key>),
    Map(BTreeMap<Key, Key>),
    Fields {
        #[serde(skip_serializing_if = "Option::is_none")]
        a: Option<Box<Key>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        b: Option<Box<Key>>,
    },
    Variant(Variant),
}

#[derive(Arbitrary, Serialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    A,
    B(u8),
    C(u8, String),
    D { x: String },
}

/// A float compared as the key text writes it: `-0.0` equals `0.0`, NaNs equal each other.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct Float(f64);

impl Float {
    fn canonical(self) -> u64 {
        if self.0.is_nan() {
            f64::NAN.to_bits()
        } else if self.0 == 0.0 {
            0
        } else {
            self.0.to_bits()
        }
    }
}

impl PartialEq for Float {
    fn eq(&self, other: &Self) -> bool {
        self.canonical() == other.canonical()
    }
}
impl Eq for Float {}
impl PartialOrd for Float {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Float {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.canonical().cmp(&other.canonical())
    }
}
impl Serialize for Float {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

mod bytes {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
}

fuzz_target!(|keys: (Key, Key, Option<Key>)| {
    let (a, b, c) = keys;
    // The arguments of a call, as the generated code builds them: a tuple.
    let (ta, tb) = (__fuzz::key_text(&(&a, &c)), __fuzz::key_text(&(&b, &c)));
    assert_eq!(
        ta,
        __fuzz::key_text(&(a.clone(), c.clone())),
        "equal keys, one text"
    );
    if ta.is_some() && ta == tb {
        assert_eq!(a, b, "one text {ta:?} for two keys");
    }
});
