use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use super::*;

const MAX_VALUE_BYTES: usize = 1 << 20;

/// A payload as written without `compress`, which most tests read.
fn encode<V: Serialize + ?Sized>(value: &V, max_bytes: usize) -> Result<Vec<u8>, PayloadError> {
    super::encode(value, max_bytes, None)
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: T) {
    let payload = encode(&value, MAX_VALUE_BYTES).unwrap();
    assert_eq!(
        decode::<T>(&payload, MAX_VALUE_BYTES).unwrap(),
        value,
        "{payload:x?}"
    );
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Hash, Clone)]
struct Marker;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Wrapper(Option<Marker>);

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Hash, Clone)]
enum Kinds {
    Unit,
    Newtype(Option<()>),
    Tuple(u8, Option<Option<u8>>),
    Struct {
        x: Option<Marker>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        y: Option<Option<u8>>,
    },
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
#[serde(untagged)]
enum Untagged {
    Maybe(Option<Option<u8>>),
    Text(String),
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
#[serde(tag = "type")]
enum Internally {
    A { x: Option<Option<u8>> },
    B { s: String, k: Kinds },
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
#[serde(tag = "t", content = "c")]
enum Adjacently {
    A(Option<()>),
    B,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Flattened {
    a: u8,
    #[serde(flatten)]
    rest: Inner,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Inner {
    b: Option<Option<u8>>,
    c: String,
}

#[test]
fn every_kind_of_value_comes_back_as_it_was() {
    round_trip(Some(None::<u8>));
    round_trip(Some(()));
    round_trip(Some(Some(None::<()>)));
    round_trip(Some(Marker));
    round_trip(Wrapper(None));
    round_trip(Some(Wrapper(None)));
    round_trip(Kinds::Unit);
    round_trip(Kinds::Newtype(Some(())));
    round_trip(Kinds::Tuple(1, Some(None)));
    round_trip(Kinds::Struct {
        x: Some(Marker),
        y: None,
    });
    round_trip(Kinds::Struct {
        x: None,
        y: Some(None),
    });
    let map: BTreeMap<(u8, i8), Option<()>> = [((1, -2), Some(())), ((3, 4), None)].into();
    round_trip(map);
    let map: HashMap<Option<Kinds>, Vec<()>> =
        [(Some(Kinds::Unit), vec![()]), (None, vec![])].into();
    round_trip(map);
    round_trip(Arc::new(String::from("x\"y\n\u{0}\u{1F600}")));
    round_trip(Arc::<str>::from(""));
    round_trip((i128::MIN, u128::MAX, i64::MIN, u64::MAX, -1i8, 0u8));
    round_trip((
        4_047_561_100_602_009_770u128,
        7i128,
        -7i128,
        u128::from(u64::MAX),
    ));
    round_trip((f64::INFINITY, -0.0f64, f32::MIN_POSITIVE, 0.1f32, 1e300f64));
    round_trip(('\'', '\u{10FFFF}', true, false));
    round_trip(vec![Some(Some(Some(()))), None]);
    round_trip(Untagged::Maybe(Some(None)));
    round_trip(Untagged::Maybe(None));
    round_trip(Untagged::Text("x".into()));
    round_trip(Internally::A { x: Some(None) });
    round_trip(Internally::B {
        s: "q".into(),
        k: Kinds::Tuple(2, None),
    });
    round_trip(Adjacently::A(Some(())));
    round_trip(Adjacently::B);
    round_trip(Flattened {
        a: 1,
        rest: Inner {
            b: Some(None),
            c: "z".into(),
        },
    });
    round_trip(Bytes(vec![0, 255, 10]));
    round_trip(Some(Bytes(vec![])));
}

/// Bytes written with `serialize_bytes`, as `serde_bytes` does.
#[derive(Debug, PartialEq)]
struct Bytes(Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
        }
        d.deserialize_byte_buf(Visit)
    }
}

#[test]
fn a_nan_keeps_its_bits() {
    let nan = f64::from_bits(0x7ff8_0000_dead_beef);
    let back: f64 = decode(&encode(&nan, MAX_VALUE_BYTES).unwrap(), MAX_VALUE_BYTES).unwrap();
    assert_eq!(back.to_bits(), nan.to_bits());
}

#[derive(Serialize, Deserialize, Debug)]
#[allow(dead_code)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

fn nested(depth: usize) -> Tree {
    (0..depth).fold(Tree::Leaf, |tree, _| Tree::Node(Box::new(tree)))
}

#[test]
fn nesting_is_bounded_when_writing_and_when_reading() {
    assert!(
        decode::<Tree>(
            &encode(&nested(MAX_DEPTH - 1), MAX_VALUE_BYTES).unwrap(),
            MAX_VALUE_BYTES
        )
        .is_ok()
    );
    assert_eq!(
        encode(&nested(MAX_DEPTH + 1), MAX_VALUE_BYTES).unwrap_err(),
        PayloadError::TooDeep
    );
    let mut payload = MAGIC.to_vec();
    for _ in 0..200_000 {
        payload.push(write::NEWTYPE_VARIANT);
        payload.extend_from_slice(b"\x04Node");
    }
    payload.extend_from_slice(b"\x10\x04Leaf");
    assert_eq!(
        decode::<Tree>(&payload, usize::MAX).unwrap_err(),
        PayloadError::TooDeep
    );
    // Read as anything (an untagged enum buffers its input so): bounded too.
    let mut payload = MAGIC.to_vec();
    payload.extend(std::iter::repeat_n(write::SOME, 200_000));
    payload.push(write::UNIT);
    assert_eq!(
        decode::<Untagged>(&payload, usize::MAX).unwrap_err(),
        PayloadError::TooDeep
    );
}

#[test]
fn size_is_bounded_when_writing_and_when_reading() {
    let big = "x".repeat(MAX_VALUE_BYTES);
    assert!(matches!(
        encode(&big, MAX_VALUE_BYTES),
        Err(PayloadError::TooLarge(..))
    ));
    let mut payload = MAGIC.to_vec();
    payload.resize(MAX_VALUE_BYTES + 1, 0);
    assert!(matches!(
        decode::<u8>(&payload, MAX_VALUE_BYTES),
        Err(PayloadError::TooLarge(..))
    ));
    // A count larger than the bytes that follow is refused before anything is allocated.
    let mut payload = MAGIC.to_vec();
    payload.push(write::SEQ);
    payload.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode::<Vec<()>>(&payload, MAX_VALUE_BYTES).is_err());
}

#[test]
fn earlier_payloads_and_foreign_bytes_do_not_decode() {
    // MessagePack of `{"id": 7}` (what S1 envelopes held), and bytes of no format.
    for bytes in [
        &b"\x81\xa2id\x07"[..],
        b"",
        b"\xc1",
        b"\xc1\x01\x05\x07",
        b"hello",
    ] {
        assert!(decode::<u64>(bytes, MAX_VALUE_BYTES).is_err(), "{bytes:x?}");
    }
    // Trailing bytes, a cut value, a wrong tag for the type asked.
    let payload = encode(&7u64, MAX_VALUE_BYTES).unwrap();
    assert!(decode::<u64>(&[&payload[..], b"\0"].concat(), MAX_VALUE_BYTES).is_err());
    assert!(
        decode::<String>(
            &encode("hello", MAX_VALUE_BYTES).unwrap()[..5],
            MAX_VALUE_BYTES
        )
        .is_err()
    );
    assert!(
        decode::<Option<u8>>(&encode(&7u8, MAX_VALUE_BYTES).unwrap(), MAX_VALUE_BYTES).is_err()
    );
    assert!(decode::<Kinds>(&encode(&7u8, MAX_VALUE_BYTES).unwrap(), MAX_VALUE_BYTES).is_err());
}

/// A generated family of values: every kind serde has, nested.
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Family {
    Unit,
    Marker(Marker),
    Opt(Option<Box<Family>>),
    Ints(i8, u16, i64, u128),
    Float(f64),
    Text(String, char),
    List(Vec<Family>),
    Map(BTreeMap<Option<i32>, Family>),
    Named {
        #[serde(skip_serializing_if = "Option::is_none", default)]
        maybe: Option<Option<()>>,
        inner: Box<Family>,
        shared: Arc<Family>,
    },
    Kinds(Kinds),
}

fn family() -> impl Strategy<Value = Family> {
    let leaf = prop_oneof![
        Just(Family::Unit),
        Just(Family::Marker(Marker)),
        Just(Family::Opt(None)),
        (any::<i8>(), any::<u16>(), any::<i64>(), any::<u128>())
            .prop_map(|(a, b, c, d)| Family::Ints(a, b, c, d)),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(Family::Float),
        (".*", any::<char>()).prop_map(|(s, c)| Family::Text(s, c)),
        Just(Family::Kinds(Kinds::Newtype(Some(())))),
        Just(Family::Kinds(Kinds::Struct {
            x: None,
            y: Some(None)
        })),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|f| Family::Opt(Some(Box::new(f)))),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Family::List),
            proptest::collection::btree_map(
                proptest::option::of(any::<i32>()),
                inner.clone(),
                0..3
            )
            .prop_map(Family::Map),
            (
                proptest::option::of(proptest::option::of(Just(()))),
                inner.clone(),
                inner
            )
                .prop_map(|(maybe, a, b)| Family::Named {
                    maybe,
                    inner: Box::new(a),
                    shared: Arc::new(b),
                }),
        ]
    })
}

proptest! {
    #[test]
    fn generated_values_round_trip(value in family()) {
        let payload = encode(&value, MAX_VALUE_BYTES).unwrap();
        prop_assert_eq!(decode::<Family>(&payload, MAX_VALUE_BYTES).unwrap(), value);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        for magic in [MAGIC, MAGIC_LZ4] {
            let payload = [&magic[..], &bytes].concat();
            let _ = decode::<Family>(&payload, MAX_VALUE_BYTES);
            let _ = decode::<Untagged>(&payload, MAX_VALUE_BYTES);
        }
    }

    #[test]
    fn generated_values_round_trip_compressed(value in family()) {
        let payload = super::encode(&value, MAX_VALUE_BYTES, Some(0)).unwrap();
        prop_assert_eq!(decode::<Family>(&payload, MAX_VALUE_BYTES).unwrap(), value);
    }
}

/// A JSON-like value of about 100 KiB: a catalog page of products, much of it repeated text.
fn catalog() -> Vec<BTreeMap<String, String>> {
    (0..400)
        .map(|i| {
            BTreeMap::from([
                ("id".to_owned(), i.to_string()),
                ("name".to_owned(), format!("Kettle model {i}")),
                (
                    "description".to_owned(),
                    "A stainless steel kettle with a 1.7 litre capacity. ".repeat(4),
                ),
            ])
        })
        .collect()
}

#[cfg(feature = "compress")]
mod compressed {
    use super::*;

    #[test]
    fn a_payload_over_the_threshold_is_compressed_and_reads_back() {
        let value = catalog();
        let plain = encode(&value, MAX_VALUE_BYTES).unwrap();
        let packed = super::super::encode(&value, MAX_VALUE_BYTES, Some(1024)).unwrap();
        assert!(plain.starts_with(&MAGIC) && packed.starts_with(&MAGIC_LZ4));
        assert!(
            packed.len() * 4 < plain.len(),
            "{} bytes compressed, {} plain",
            packed.len(),
            plain.len()
        );
        assert_eq!(
            decode::<Vec<BTreeMap<String, String>>>(&packed, MAX_VALUE_BYTES).unwrap(),
            value
        );
        // At or under the threshold, as it is.
        let under = super::super::encode(&value, MAX_VALUE_BYTES, Some(plain.len())).unwrap();
        assert_eq!(under, plain);
    }

    #[test]
    fn a_payload_that_compressing_would_not_shrink_is_written_as_it_is() {
        // Bytes with no repeats for LZ4 to find (xorshift64).
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let value = Bytes(noise);
        let plain = encode(&value, MAX_VALUE_BYTES).unwrap();
        let written = super::super::encode(&value, MAX_VALUE_BYTES, Some(0)).unwrap();
        assert!(written.starts_with(&MAGIC), "written as it is");
        assert!(written == plain);
    }

    /// Bytes written as bytes (serde writes a `Vec<u8>` as a sequence of numbers).
    struct Bytes(Vec<u8>);

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(&self.0)
        }
    }

    #[test]
    fn the_size_bound_is_the_values_before_compression() {
        let value = catalog();
        let plain = encode(&value, MAX_VALUE_BYTES).unwrap();
        let max = plain.len() - 1;
        assert!(matches!(
            super::super::encode(&value, max, Some(0)),
            Err(PayloadError::TooLarge(..))
        ));
        // Read back under a bound below the value's size, a compressed payload is refused
        // before it is decompressed.
        let packed = super::super::encode(&value, MAX_VALUE_BYTES, Some(0)).unwrap();
        assert!(packed.len() < max);
        assert_eq!(
            decode::<Vec<BTreeMap<String, String>>>(&packed, max),
            Err(PayloadError::TooLarge(plain.len(), max))
        );
    }

    #[test]
    fn a_compressed_payload_that_lies_about_its_length_is_malformed() {
        let value = catalog();
        let packed = super::super::encode(&value, MAX_VALUE_BYTES, Some(0)).unwrap();
        let stated = u32::from_le_bytes(packed[2..6].try_into().unwrap());
        let restate = |length: u32| {
            let mut bytes = packed.clone();
            bytes[2..6].copy_from_slice(&length.to_le_bytes());
            bytes
        };
        for lie in [restate(stated - 1), restate(stated + 1), restate(0)] {
            assert!(matches!(
                decode::<Vec<BTreeMap<String, String>>>(&lie, MAX_VALUE_BYTES),
                Err(PayloadError::Malformed(_))
            ));
        }
        // A length that claims more than the bound allocates nothing and is too large.
        assert_eq!(
            decode::<Vec<BTreeMap<String, String>>>(&restate(u32::MAX), MAX_VALUE_BYTES),
            Err(PayloadError::TooLarge(
                u32::MAX as usize + MAGIC.len(),
                MAX_VALUE_BYTES
            ))
        );
        for cut in [&packed[..4], &packed[..packed.len() / 2]] {
            assert!(matches!(
                decode::<Vec<BTreeMap<String, String>>>(cut, MAX_VALUE_BYTES),
                Err(PayloadError::Malformed(_))
            ));
        }
    }
}

/// A build without the feature reads a compressed payload as malformed, naming the feature.
#[cfg(not(feature = "compress"))]
#[test]
fn without_the_feature_a_compressed_payload_is_malformed_and_says_why() {
    let payload = [&MAGIC_LZ4[..], &[4, 0, 0, 0, 0x40, 1, 2, 3, 4]].concat();
    let error = decode::<Vec<u8>>(&payload, MAX_VALUE_BYTES).unwrap_err();
    assert!(error.to_string().contains("`compress` feature"), "{error}");
    // And writing with a threshold writes the plain form.
    let value = catalog();
    assert_eq!(
        super::encode(&value, MAX_VALUE_BYTES, Some(0)).unwrap(),
        encode(&value, MAX_VALUE_BYTES).unwrap()
    );
}
