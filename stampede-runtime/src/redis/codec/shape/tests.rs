use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use super::*;

fn shape<T: DeserializeOwned>() -> String {
    trace::<T>().unwrap().description
}

mod node {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    pub(super) struct Product {
        pub(super) id: u64,
        pub(super) name: String,
        pub(super) tags: Vec<String>,
    }
}

mod admin {
    /// Another binary's copy of `node::Product`, fields in another order.
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    pub(super) struct Item {
        pub(super) tags: Vec<String>,
        pub(super) id: u64,
        pub(super) name: String,
    }
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Renamed {
    id: u64,
    title: String,
    tags: Vec<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Retyped {
    id: u32,
    name: String,
    tags: Vec<String>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Grown {
    id: u64,
    name: String,
    tags: Vec<String>,
    #[serde(default)]
    price: Option<u64>,
}

#[test]
fn copies_of_a_type_have_its_shape_whatever_their_path_name_or_field_order() {
    assert_eq!(
        shape::<node::Product>(),
        r#"struct{"id":u64,"name":str,"tags":seq<str>}"#
    );
    assert_eq!(shape::<node::Product>(), shape::<admin::Item>());
}

#[test]
fn a_renamed_retyped_or_added_field_is_another_shape() {
    let product = shape::<node::Product>();
    assert_ne!(product, shape::<Renamed>());
    assert_ne!(product, shape::<Retyped>());
    assert_ne!(product, shape::<Grown>());
}

#[derive(Deserialize)]
#[allow(dead_code)]
enum Status {
    Active,
    Suspended(String),
    Moved(u32, u32),
    Merged { into: u64 },
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Account {
    status: Status,
    previous: Option<Status>,
    history: BTreeMap<u64, Vec<Status>>,
    shared: Arc<str>,
    unit: (),
    pair: (u8, i128),
}

#[test]
fn every_variant_of_every_nested_enum_is_traced() {
    let status = r#"enum{"Active","Merged"{"into":u64},"Moved"[u32,u32],"Suspended"(str)}"#;
    assert_eq!(shape::<Status>(), status);
    assert_eq!(
        shape::<Account>(),
        format!(
            r#"struct{{"history":map<u64,seq<{status}>>,"pair":(u8,i128),"previous":option<{status}>,"shared":str,"status":{status},"unit":()}}"#
        )
    );
}

#[derive(Deserialize)]
#[allow(dead_code)]
enum Tree {
    Node(Box<Tree>, Box<Tree>),
    Leaf(u8),
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Folder {
    name: String,
    children: Vec<Folder>,
    parent: Option<Box<Folder>>,
}

#[test]
fn recursive_types_are_traced_with_references_to_themselves() {
    assert_eq!(shape::<Tree>(), r#"enum{"Leaf"(u8),"Node"[^1,^1]}"#);
    assert_eq!(
        shape::<Folder>(),
        r#"struct{"children":seq<^1>,"name":str,"parent":option<^1>}"#
    );
}

/// Like `uuid::Uuid` read by a binary format: exactly 16 bytes.
#[allow(dead_code)]
struct Id([u8; 16]);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes = serde_bytes_like(d)?;
        let array = bytes
            .try_into()
            .map_err(|_| serde::de::Error::custom("16 bytes expected"))?;
        Ok(Id(array))
    }
}

fn serde_bytes_like<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Visit;
    impl serde::de::Visitor<'_> for Visit {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
    }
    d.deserialize_bytes(Visit)
}

/// Like `chrono::DateTime`: a string it parses.
#[allow(dead_code)]
struct Timestamp(String);

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.len() == 20 && text.ends_with('Z') {
            true => Ok(Timestamp(text)),
            false => Err(serde::de::Error::custom("not an RFC 3339 UTC timestamp")),
        }
    }
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Event {
    id: Id,
    at: Timestamp,
    count: NonZeroU64,
}

#[test]
fn types_that_reject_some_values_are_traced_with_values_they_accept() {
    assert_eq!(
        shape::<Event>(),
        r#"struct{"at":str,"count":u64,"id":bytes}"#
    );
}

#[derive(Deserialize)]
#[serde(untagged)]
#[allow(dead_code)]
enum Untagged {
    A(u8),
    B(String),
}

#[derive(Deserialize)]
#[serde(tag = "type")]
#[allow(dead_code)]
enum Internally {
    A { x: u8 },
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Flattened {
    a: u8,
    #[serde(flatten)]
    rest: BTreeMap<String, u8>,
}

/// Like `serde_json::Value`: whatever the input holds.
struct Anything;

impl<'de> Deserialize<'de> for Anything {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(serde::de::IgnoredAny).map(|_| Anything)
    }
}

#[test]
fn self_describing_types_cannot_be_traced_and_the_error_names_the_type_and_the_fix() {
    let error = trace::<Vec<Anything>>().unwrap_err();
    assert!(
        error
            .type_name
            .ends_with("Vec<stampede_runtime::redis::codec::shape::tests::Anything>")
    );
    let message = error.to_string();
    assert!(message.contains("shape::tests::Anything>`"), "{message}");
    assert!(message.contains("version = \"...\""), "{message}");
    assert!(trace::<Untagged>().is_err());
    assert!(trace::<Internally>().is_err());
    assert!(trace::<Flattened>().is_err());
}

#[test]
fn key_tuples_are_traced_as_tuples() {
    assert_eq!(shape::<(u64, String)>(), "(u64,str)");
    assert_eq!(shape::<()>(), "()");
    assert_eq!(shape::<(Option<Vec<u8>>,)>(), "(option<seq<u8>>)");
}

#[derive(Deserialize, Debug)]
#[allow(dead_code)]
struct Marker;

#[derive(Deserialize, Debug)]
#[allow(dead_code)]
enum Kinds {
    Unit,
    Newtype(Option<()>),
    Tuple(u8, Option<Option<u8>>),
    Struct {
        x: Option<Marker>,
        #[serde(default)]
        y: Option<Option<u8>>,
    },
}

#[derive(Deserialize, Debug)]
#[allow(dead_code)]
enum Family {
    Unit(()),
    Marker(Marker),
    Opt(Option<Box<Family>>),
    Ints(i8, u16, i64, u128),
    Float(f64),
    Text(String, char),
    List(Vec<Family>),
    Map(BTreeMap<(i32, Option<bool>), Family>),
    Named {
        #[serde(default)]
        maybe: Option<Option<()>>,
        inner: Box<Family>,
        shared: Arc<Family>,
    },
    Kinds(Kinds),
}

/// An enum nested in a variant of a recursive enum, reached only through that variant.
#[test]
fn enums_reached_only_through_a_variant_are_traced_whole() {
    let traced = shape::<Family>();
    for variant in [
        "\"Unit\"",
        "\"Newtype\"(option<()>)",
        "\"Tuple\"[u8,option<option<u8>>]",
    ] {
        assert!(traced.contains(variant), "{variant} in {traced}");
    }
    assert!(
        traced.contains(r#""Struct"{"x":option<unit_struct>,"y":option<option<u8>>}"#),
        "{traced}"
    );
}
