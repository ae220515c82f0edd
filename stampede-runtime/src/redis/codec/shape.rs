//! The shape of a type as serde sees it, traced from its `Deserialize`: what two processes must
//! agree on to share a cache's values, whatever the types' Rust paths.
//!
//! The tracer is a serde `Deserializer` that answers each request with a made-up value and
//! writes down what was asked: field names, element and variant shapes, each primitive's kind.
//! A type is traced again until every variant of every enum in it has been seen (one variant
//! per enum per pass, as a visitor can be used once). The description is canonical: fields
//! and variants sorted by name (the payload form reads them by name, so their order does not
//! matter), tuples in order, containers by content (a renamed struct keeps its shape),
//! recursion written as a reference to the enclosing container (`^1`).
//!
//! Why not the `serde-reflection` crate: it needs a sample value for every type whose
//! `Deserialize` validates (a `Uuid`, a `DateTime`, a `NonZeroU64`) and the name of every
//! enum nested in a type, neither of which a generic cache has; and it names containers, so a
//! renamed struct would be another cache. This tracer tries a few typical values for a leaf
//! its type rejects (`0`, `1`, `""`, a UTC timestamp, a nil UUID, 16 zero bytes ...) and
//! explores nested enums itself.
//!
//! Not traceable: a type whose `Deserialize` asks the input what it holds (`deserialize_any`:
//! `serde_json::Value`, untagged and internally tagged enums, `#[serde(flatten)]`) or that
//! rejects every value tried. Such a cache needs `version = "..."`, which then stands for the
//! shape (see `tier::identity`).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};

/// The traced shape of a type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The canonical description, e.g. `struct{id:u64,tags:seq<str>}`.
    pub(crate) description: String,
}

/// Why a type's shape could not be traced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Untraceable {
    /// The type asked for (`std::any::type_name`, for the message only).
    pub(crate) type_name: &'static str,
    /// What stopped the trace.
    pub(crate) reason: String,
}

impl fmt::Display for Untraceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the shape of `{}` cannot be traced through its `Deserialize` ({}); give the cache \
             `version = \"...\"` and change it whenever the type changes",
            self.type_name, self.reason
        )
    }
}

/// Traces the shape of `T`.
pub(crate) fn trace<T: DeserializeOwned>() -> Result<Shape, Untraceable> {
    let untraceable = |reason: String| Untraceable {
        type_name: std::any::type_name::<T>(),
        reason,
    };
    let mut state = State::default();
    let mut root = Format::Unknown;
    for _ in 0..MAX_PASSES {
        let mut format = Format::Unknown;
        state.begin_pass();
        let outcome = T::deserialize(Tracer {
            state: &mut state,
            format: &mut format,
        });
        root.merge(format);
        match outcome {
            Ok(_) => {
                if state.complete() {
                    return Ok(Shape {
                        description: render(&root, &state.containers),
                    });
                }
            }
            Err(Error::Custom(message)) => {
                // The last leaf's type rejected its value: try its next one.
                let Some(leaf) = state.last_leaf else {
                    return Err(untraceable(format!("its `Deserialize` failed: {message}")));
                };
                let tried = state.candidates.entry(leaf).or_default();
                *tried += 1;
                if *tried >= CANDIDATES {
                    return Err(untraceable(format!(
                        "`{leaf}` rejected every value tried: {message}"
                    )));
                }
            }
            Err(Error::TooDeep) => {
                // A recursive enum re-entered by a variant that recurses: take another one.
                let Some(id) = state.last_reentered else {
                    return Err(untraceable("it nests too deep".into()));
                };
                let choice = state.reentry.entry(id).or_default();
                *choice += 1;
                if *choice > MAX_VARIANTS {
                    return Err(untraceable(format!(
                        "no variant of `{id}` ends its recursion"
                    )));
                }
            }
            Err(Error::Untraceable(reason)) => return Err(untraceable(reason)),
        }
    }
    Err(untraceable(
        "it has more variants than the tracer explores".into(),
    ))
}

const MAX_PASSES: usize = 4096;
const MAX_DEPTH: usize = 64;
const MAX_VARIANTS: usize = 4096;

/// How many values a leaf is tried with (every list of candidates below is this long).
const CANDIDATES: usize = 8;
const STRS: [&str; CANDIDATES] = [
    "",
    "0",
    "1970-01-01T00:00:00Z",
    "00000000-0000-0000-0000-000000000000",
    "1970-01-01",
    "00:00:00",
    "127.0.0.1",
    "a",
];
const BYTES: [&[u8]; CANDIDATES] = [
    &[],
    &[0; 16],
    &[0; 4],
    &[0; 32],
    &[0; 8],
    &[0],
    &[0; 12],
    &[0; 64],
];
const UINTS: [u64; CANDIDATES] = [0, 1, 2, 10, 100, 1000, 60, 255];
const FLOATS: [f64; CANDIDATES] = [0.0, 1.0, 0.5, 2.0, 10.0, 100.0, 1000.0, -1.0];
const CHARS: [char; CANDIDATES] = ['a', '0', 'A', ' ', 'z', '9', '_', 'x'];

/// A node of a traced shape.
#[derive(Clone, Debug, PartialEq)]
enum Format {
    /// Not seen yet (a sequence traced empty, an option traced `None`).
    Unknown,
    Leaf(&'static str),
    Option(Box<Format>),
    Seq(Box<Format>),
    Map(Box<Format>, Box<Format>),
    Tuple(Vec<Format>),
    /// A struct or an enum, by the id of its type (see [`State::containers`]).
    Container(&'static str),
}

impl Format {
    /// Fills in what `other` saw and this did not.
    fn merge(&mut self, other: Format) {
        match (self, other) {
            (_, Format::Unknown) => {}
            (this @ Format::Unknown, other) => *this = other,
            (Format::Option(a), Format::Option(b)) | (Format::Seq(a), Format::Seq(b)) => {
                a.merge(*b)
            }
            (Format::Map(ak, av), Format::Map(bk, bv)) => {
                ak.merge(*bk);
                av.merge(*bv);
            }
            (Format::Tuple(a), Format::Tuple(b)) => merge_all(a, b),
            _ => {}
        }
    }
}

fn merge_all(a: &mut Vec<Format>, b: Vec<Format>) {
    for (i, format) in b.into_iter().enumerate() {
        match a.get_mut(i) {
            Some(known) => known.merge(format),
            None => a.push(format),
        }
    }
}

#[derive(Clone, Debug)]
enum Container {
    UnitStruct,
    Newtype(Format),
    TupleStruct(Vec<Format>),
    Struct(&'static [&'static str], Vec<Format>),
    Enum(&'static [&'static str], Vec<Option<Variant>>),
}

#[derive(Clone, Debug)]
enum Variant {
    Unit,
    Newtype(Format),
    Tuple(Vec<Format>),
    Struct(&'static [&'static str], Vec<Format>),
}

impl Container {
    fn merge(&mut self, other: Container) {
        match (self, other) {
            (Container::Newtype(a), Container::Newtype(b)) => a.merge(b),
            (Container::TupleStruct(a), Container::TupleStruct(b))
            | (Container::Struct(_, a), Container::Struct(_, b)) => merge_all(a, b),
            _ => {}
        }
    }
}

impl Variant {
    /// The formats of its fields.
    fn formats(&self) -> impl Iterator<Item = &Format> {
        let formats: &[Format] = match self {
            Variant::Unit => &[],
            Variant::Newtype(inner) => std::slice::from_ref(inner),
            Variant::Tuple(elements) | Variant::Struct(_, elements) => elements,
        };
        formats.iter()
    }

    fn merge(&mut self, other: Variant) {
        match (self, other) {
            (Variant::Newtype(a), Variant::Newtype(b)) => a.merge(b),
            (Variant::Tuple(a), Variant::Tuple(b))
            | (Variant::Struct(_, a), Variant::Struct(_, b)) => merge_all(a, b),
            _ => {}
        }
    }
}

/// What the passes over one type have found, and the choices of the pass running.
#[derive(Default)]
struct State {
    /// Structs and enums by the `type_name` of the value their visitor builds (for this
    /// bookkeeping only: the description names none).
    containers: HashMap<&'static str, Container>,
    /// For each leaf type that rejected a value, which candidate it gets now.
    candidates: HashMap<&'static str, usize>,
    /// For each recursive enum, which variant a recursive occurrence takes.
    reentry: HashMap<&'static str, usize>,
    /// The containers being traced, outermost first.
    stack: Vec<&'static str>,
    last_leaf: Option<&'static str>,
    last_reentered: Option<&'static str>,
}

impl State {
    fn begin_pass(&mut self) {
        self.stack.clear();
        self.last_leaf = None;
        self.last_reentered = None;
    }

    /// Whether every variant of every enum has been seen.
    fn complete(&self) -> bool {
        self.containers.values().all(|container| match container {
            Container::Enum(_, variants) => variants.iter().all(Option::is_some),
            _ => true,
        })
    }

    /// Whether a container is traced inside itself now: options, sequences and maps are then
    /// traced empty, so that a recursive type ends.
    fn recursing(&self) -> bool {
        let stack = &self.stack;
        (1..stack.len()).any(|i| stack[..i].contains(&stack[i]))
    }

    fn enter(&mut self, id: &'static str) -> Result<(), Error> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        self.stack.push(id);
        Ok(())
    }

    fn record(&mut self, id: &'static str, container: Container) {
        match self.containers.get_mut(id) {
            Some(known) => known.merge(container),
            None => {
                self.containers.insert(id, container);
            }
        }
    }

    /// The variant an occurrence of enum `id` takes: one not seen yet, or, inside itself, the
    /// variant chosen to end the recursion.
    fn choose(&mut self, id: &'static str, variants: &'static [&'static str]) -> usize {
        let container = self
            .containers
            .entry(id)
            .or_insert_with(|| Container::Enum(variants, vec![None; variants.len()]));
        let unseen = match container {
            Container::Enum(_, seen) => seen.iter().position(Option::is_none),
            _ => None,
        };
        if self.stack.contains(&id) {
            self.last_reentered = Some(id);
            return self.reentry.get(id).copied().unwrap_or(0) % variants.len();
        }
        // Every variant seen: take one that leads to an enum whose variants are not all seen
        // yet (an enum nested in a variant is only reached through it).
        unseen.unwrap_or_else(|| self.towards_unseen(id).unwrap_or(0))
    }

    /// The first variant of enum `id` whose content reaches an enum with a variant not seen.
    fn towards_unseen(&self, id: &'static str) -> Option<usize> {
        let Some(Container::Enum(_, variants)) = self.containers.get(id) else {
            return None;
        };
        variants.iter().position(|variant| {
            let mut seen = vec![id];
            variant
                .as_ref()
                .is_some_and(|variant| variant.formats().any(|f| self.reaches_unseen(f, &mut seen)))
        })
    }

    /// Whether `format` contains an enum with a variant not seen yet.
    fn reaches_unseen(&self, format: &Format, seen: &mut Vec<&'static str>) -> bool {
        match format {
            Format::Unknown | Format::Leaf(_) => false,
            Format::Option(inner) | Format::Seq(inner) => self.reaches_unseen(inner, seen),
            Format::Map(key, value) => {
                self.reaches_unseen(key, seen) || self.reaches_unseen(value, seen)
            }
            Format::Tuple(elements) => elements.iter().any(|f| self.reaches_unseen(f, seen)),
            Format::Container(id) => {
                if seen.contains(id) {
                    return false;
                }
                seen.push(id);
                match self.containers.get(id) {
                    None => false,
                    Some(Container::UnitStruct) => false,
                    Some(Container::Newtype(inner)) => self.reaches_unseen(inner, seen),
                    Some(Container::TupleStruct(elements) | Container::Struct(_, elements)) => {
                        elements.iter().any(|f| self.reaches_unseen(f, seen))
                    }
                    Some(Container::Enum(_, variants)) => {
                        variants.iter().any(|variant| match variant {
                            None => true,
                            Some(variant) => {
                                variant.formats().any(|f| self.reaches_unseen(f, seen))
                            }
                        })
                    }
                }
            }
        }
    }

    fn record_variant(&mut self, id: &'static str, index: usize, variant: Variant) {
        if let Some(Container::Enum(_, seen)) = self.containers.get_mut(id)
            && let Some(slot) = seen.get_mut(index)
        {
            match slot {
                Some(known) => known.merge(variant),
                None => *slot = Some(variant),
            }
        }
    }

    fn leaf<T>(&mut self) -> usize {
        let id = std::any::type_name::<T>();
        self.last_leaf = Some(id);
        self.candidates.get(id).copied().unwrap_or(0)
    }
}

#[derive(Debug)]
enum Error {
    /// The traced type's own `Deserialize` failed (a value it rejects).
    Custom(String),
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// The type cannot be traced at all.
    Untraceable(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Custom(message) | Error::Untraceable(message) => f.write_str(message),
            Error::TooDeep => f.write_str("too deep"),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Error::Custom(message.to_string())
    }
}

fn self_describing(what: &str) -> Error {
    Error::Untraceable(format!(
        "it reads {what} whatever the input holds, as serde_json::Value, untagged and \
         internally tagged enums and #[serde(flatten)] do"
    ))
}

/// The deserializer of one node: answers its request and writes the node's format.
struct Tracer<'s> {
    state: &'s mut State,
    format: &'s mut Format,
}

impl Tracer<'_> {
    fn leaf(self, kind: &'static str) {
        self.format.merge(Format::Leaf(kind));
    }
}

/// Traces one value into `format`, through `seed`.
fn trace_seed<'de, T: DeserializeSeed<'de>>(
    state: &mut State,
    format: &mut Format,
    seed: T,
) -> Result<T::Value, Error> {
    seed.deserialize(Tracer { state, format })
}

/// The elements of a sequence, tuple or struct, each traced into its format.
struct Elements<'s> {
    state: &'s mut State,
    formats: std::slice::IterMut<'s, Format>,
}

impl<'de> de::SeqAccess<'de> for Elements<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.formats.next() {
            Some(format) => trace_seed(self.state, format, seed).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.formats.len())
    }
}

/// One entry of a map (or none, when cut), traced into its key's and value's formats.
struct Entry<'s> {
    state: &'s mut State,
    formats: Option<(&'s mut Format, &'s mut Format)>,
    value: Option<&'s mut Format>,
}

impl<'de> de::MapAccess<'de> for Entry<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.formats.take() else {
            return Ok(None);
        };
        self.value = Some(value);
        trace_seed(self.state, key, seed).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| Error::Untraceable("a map's value was asked before its key".into()))?;
        trace_seed(self.state, value, seed)
    }
}

/// Traces `count` elements through `visitor` (a tuple, tuple struct or struct, positionally).
fn elements<'de, V: Visitor<'de>>(
    state: &mut State,
    count: usize,
    visitor: V,
) -> Result<(V::Value, Vec<Format>), Error> {
    let mut formats = vec![Format::Unknown; count];
    let value = visitor.visit_seq(Elements {
        state,
        formats: formats.iter_mut(),
    })?;
    Ok((value, formats))
}

/// The variant chosen for one occurrence of an enum.
struct Chosen<'s> {
    state: &'s mut State,
    id: &'static str,
    index: usize,
    name: &'static str,
}

impl<'de, 's> de::EnumAccess<'de> for Chosen<'s> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let value = seed.deserialize(self.name.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Chosen<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        self.state
            .record_variant(self.id, self.index, Variant::Unit);
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        let mut format = Format::Unknown;
        let value = trace_seed(self.state, &mut format, seed);
        self.state
            .record_variant(self.id, self.index, Variant::Newtype(format));
        value
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        let (value, formats) = elements(self.state, len, visitor)?;
        self.state
            .record_variant(self.id, self.index, Variant::Tuple(formats));
        Ok(value)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let (value, formats) = elements(self.state, fields.len(), visitor)?;
        self.state
            .record_variant(self.id, self.index, Variant::Struct(fields, formats));
        Ok(value)
    }
}

macro_rules! uint_leaf {
    ($($method:ident $visit:ident $ty:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            let candidate = self.state.leaf::<V::Value>();
            self.leaf(stringify!($ty));
            visitor.$visit(UINTS[candidate] as $ty)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Tracer<'_> {
    type Error = Error;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(self_describing("a value"))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(self_describing("a value it ignores"))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(self_describing("an identifier"))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("bool");
        visitor.visit_bool(candidate % 2 == 1)
    }

    uint_leaf!(
        deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64,
        deserialize_u128 visit_u128 u128, deserialize_i8 visit_i8 i8,
        deserialize_i16 visit_i16 i16, deserialize_i32 visit_i32 i32,
        deserialize_i64 visit_i64 i64, deserialize_i128 visit_i128 i128
    );

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("f32");
        visitor.visit_f32(FLOATS[candidate] as f32)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("f64");
        visitor.visit_f64(FLOATS[candidate])
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("char");
        visitor.visit_char(CHARS[candidate])
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("str");
        visitor.visit_str(STRS[candidate])
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let candidate = self.state.leaf::<V::Value>();
        self.leaf("bytes");
        visitor.visit_bytes(BYTES[candidate])
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let Tracer { state, format } = self;
        let mut inner = Format::Unknown;
        let value = if state.recursing() {
            visitor.visit_none()
        } else {
            visitor.visit_some(Tracer {
                state,
                format: &mut inner,
            })
        };
        format.merge(Format::Option(Box::new(inner)));
        value
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.leaf("()");
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let id = std::any::type_name::<V::Value>();
        self.state.record(id, Container::UnitStruct);
        self.format.merge(Format::Container(id));
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let id = std::any::type_name::<V::Value>();
        let Tracer { state, format } = self;
        format.merge(Format::Container(id));
        state.enter(id)?;
        let mut inner = Format::Unknown;
        let value = visitor.visit_newtype_struct(Tracer {
            state,
            format: &mut inner,
        });
        state.stack.pop();
        state.record(id, Container::Newtype(inner));
        value
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let Tracer { state, format } = self;
        let count = usize::from(!state.recursing());
        let (value, mut formats) = elements(state, count, visitor)?;
        format.merge(Format::Seq(Box::new(
            formats.pop().unwrap_or(Format::Unknown),
        )));
        Ok(value)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        let Tracer { state, format } = self;
        let (value, formats) = elements(state, len, visitor)?;
        format.merge(Format::Tuple(formats));
        Ok(value)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let id = std::any::type_name::<V::Value>();
        let Tracer { state, format } = self;
        format.merge(Format::Container(id));
        state.enter(id)?;
        let traced = elements(state, len, visitor);
        state.stack.pop();
        let (value, formats) = traced?;
        state.record(id, Container::TupleStruct(formats));
        Ok(value)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let Tracer { state, format } = self;
        let (mut key, mut value) = (Format::Unknown, Format::Unknown);
        let cut = state.recursing();
        let result = visitor.visit_map(Entry {
            state,
            formats: (!cut).then_some((&mut key, &mut value)),
            value: None,
        });
        format.merge(Format::Map(Box::new(key), Box::new(value)));
        result
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let id = std::any::type_name::<V::Value>();
        let Tracer { state, format } = self;
        format.merge(Format::Container(id));
        state.enter(id)?;
        let traced = elements(state, fields.len(), visitor);
        state.stack.pop();
        let (value, formats) = traced?;
        state.record(id, Container::Struct(fields, formats));
        Ok(value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if variants.is_empty() {
            return Err(Error::Untraceable("an enum without variants".into()));
        }
        let id = std::any::type_name::<V::Value>();
        let Tracer { state, format } = self;
        format.merge(Format::Container(id));
        let index = state.choose(id, variants);
        state.enter(id)?;
        let value = visitor.visit_enum(Chosen {
            state: &mut *state,
            id,
            index,
            name: variants[index],
        });
        state.stack.pop();
        value
    }
}

/// The canonical description of `format`: containers by content, fields and variants sorted by
/// name, recursion as `^n` (the container `n` levels out).
fn render(format: &Format, containers: &HashMap<&'static str, Container>) -> String {
    let mut out = String::new();
    Renderer {
        containers,
        stack: Vec::new(),
        out: &mut out,
    }
    .format(format);
    out
}

struct Renderer<'a> {
    containers: &'a HashMap<&'static str, Container>,
    stack: Vec<&'static str>,
    out: &'a mut String,
}

impl Renderer<'_> {
    fn format(&mut self, format: &Format) {
        match format {
            Format::Unknown => self.out.push('?'),
            Format::Leaf(kind) => self.out.push_str(kind),
            Format::Option(inner) => self.wrapped("option<", inner, ">"),
            Format::Seq(inner) => self.wrapped("seq<", inner, ">"),
            Format::Map(key, value) => {
                self.out.push_str("map<");
                self.format(key);
                self.out.push(',');
                self.format(value);
                self.out.push('>');
            }
            Format::Tuple(elements) => self.list("(", elements, ")"),
            Format::Container(id) => self.container(id),
        }
    }

    fn wrapped(&mut self, open: &str, inner: &Format, close: &str) {
        self.out.push_str(open);
        self.format(inner);
        self.out.push_str(close);
    }

    fn list(&mut self, open: &str, elements: &[Format], close: &str) {
        self.out.push_str(open);
        for (i, element) in elements.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.format(element);
        }
        self.out.push_str(close);
    }

    fn fields(&mut self, names: &[&str], formats: &[Format]) {
        if names.len() != formats.len() {
            // Not one format per name (aliases among the names): both, as they are.
            let _ = write!(self.out, "{names:?}");
            return self.list("(", formats, ")");
        }
        let mut fields: Vec<(&str, &Format)> = names.iter().copied().zip(formats).collect();
        fields.sort_by_key(|(name, _)| *name);
        self.out.push('{');
        for (i, (name, format)) in fields.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            let _ = write!(self.out, "{name:?}:");
            self.format(format);
        }
        self.out.push('}');
    }

    fn container(&mut self, id: &'static str) {
        if let Some(depth) = self.stack.iter().rev().position(|open| *open == id) {
            let _ = write!(self.out, "^{}", depth + 1);
            return;
        }
        let Some(container) = self.containers.get(id) else {
            return self.out.push('?');
        };
        self.stack.push(id);
        match container {
            Container::UnitStruct => self.out.push_str("unit_struct"),
            Container::Newtype(inner) => self.wrapped("newtype(", inner, ")"),
            Container::TupleStruct(elements) => {
                self.out.push_str("tuple_struct");
                self.list("(", elements, ")");
            }
            Container::Struct(names, formats) => {
                self.out.push_str("struct");
                self.fields(names, formats);
            }
            Container::Enum(names, variants) => {
                let mut order: Vec<usize> = (0..names.len()).collect();
                order.sort_by_key(|&i| names[i]);
                self.out.push_str("enum{");
                for (n, i) in order.into_iter().enumerate() {
                    if n > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{:?}", names[i]);
                    match &variants[i] {
                        None => self.out.push('?'),
                        Some(Variant::Unit) => {}
                        Some(Variant::Newtype(inner)) => self.wrapped("(", inner, ")"),
                        Some(Variant::Tuple(elements)) => self.list("[", elements, "]"),
                        Some(Variant::Struct(names, formats)) => self.fields(names, formats),
                    }
                }
                self.out.push('}');
            }
        }
        self.stack.pop();
    }
}

#[cfg(test)]
mod tests;
