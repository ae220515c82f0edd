//! The text of a key's arguments in its Redis keys, written by a serde serializer.
//!
//! Numbers and booleans are written as themselves; text with every byte outside
//! `[A-Za-z0-9_.@/-]` percent-encoded (so the delimiters below never appear in it), and the
//! empty string as `""`; `None` as `~` and `Some(x)` as `+x`; sequences, tuples and tuple
//! structs as `[a,b]`; structs as `{field=value,..}` with the name of every field written (a
//! skipped field is absent, never confused with another); maps as `{k=v,..}` sorted by the
//! text of their keys (so a map's iteration order does not matter); unit and unit structs as
//! `()`; enum variants by name, with their fields in `(..)` or, for struct variants, `{..}`;
//! bytes as `x` and hex. The arguments of one call are joined by `:`. Arguments longer than
//! [`MAX_ARGS`] bytes keep a readable head and end in `#` and the SHA-256 of the whole text.
//!
//! Unordered sets are written as sequences whose elements are sorted by their text, as a map's
//! entries are, so that two equal sets that iterate in different orders (another capacity,
//! another insertion order, another hasher's seed) give one text. serde does not tell a set
//! from a sequence, so a set is known by its Rust type, which the serializer sees for every
//! value inside another (a field, an element, an entry's key or value, the content of `Some`, of
//! a newtype struct or of a newtype variant) and for the key itself ([`unordered`]): after
//! references (`&`, `&mut`) and the standard pointers whose `Serialize` is their content's
//! (`Box`, `Rc`, `Arc`, `Cow`) are peeled off, the type's path without its generic arguments
//! ends in `::HashSet` (std's, hashbrown's, im's), `::IndexSet` (indexmap's, whose `Eq` ignores
//! the order too), `::AHashSet` or `::DashSet`. Every other sequence (`Vec`, `VecDeque`,
//! `BTreeSet`, whose order is its elements', slices, arrays) keeps its order: `[1,2]` and
//! `[2,1]` stay two keys. What is not seen is not sorted: a set inside a type whose
//! `Serialize` hands its serializer straight to the set (`#[serde(transparent)]`,
//! `#[serde(serialize_with)]`, a hand-written `Serialize`), or a hand-written `Serialize` that
//! calls `collect_seq` on an unordered iterator. Such a key must write its elements in a
//! canonical order itself (or hold a `BTreeSet`).
//!
//! For one key type, equal keys give equal text and distinct keys distinct text (the proptests
//! check it), provided the type's `Serialize` agrees with its `Eq`: a key that serializes two
//! unequal values alike (a `#[serde(skip)]` field that `Eq` compares, an untagged enum whose
//! variants write the same text, a float wrapper whose `Eq` tells `-0.0` from `0.0`) or two
//! equal values differently (a field `Eq` ignores) is the key type's bug, and shares or splits
//! Redis entries accordingly. Floats: `-0.0` is written as `0.0` and every NaN as `NaN`, as
//! the usual `Eq` wrappers of floats (ordered-float) compare them; other floats by their
//! shortest exact decimal.

use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser;
use sha2::{Digest, Sha256};

/// The longest argument text kept whole; longer ones are cut and end in a digest.
pub(crate) const MAX_ARGS: usize = 200;
pub(crate) const HEAD: usize = 64;

/// The argument text of a key, bounded in length.
pub(crate) fn args_text<K: Serialize + ?Sized>(key: &K) -> Result<String, KeyError> {
    let mut out = String::new();
    key.serialize(TextSerializer {
        out: &mut out,
        top: true,
        unordered: unordered::<K>(),
    })?;
    if out.len() > MAX_ARGS {
        let digest = Sha256::digest(out.as_bytes());
        let mut bounded = String::with_capacity(HEAD + 1 + 64);
        bounded.push_str(&out[..HEAD]); // the text is ASCII: any cut is a char boundary
        bounded.push('#');
        for byte in digest {
            let _ = write!(bounded, "{byte:02x}");
        }
        out = bounded;
    }
    Ok(out)
}

/// A key argument that cannot be written as text (a serializer's custom error).
#[derive(Debug)]
pub(crate) struct KeyError(String);

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a key argument cannot be written as a Redis key: {}",
            self.0
        )
    }
}

impl std::error::Error for KeyError {}

impl ser::Error for KeyError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        KeyError(message.to_string())
    }
}

/// Writes text: escaped, and `""` when empty, so that it is never nothing.
fn push_text(out: &mut String, text: &str) {
    if text.is_empty() {
        out.push_str("\"\"");
    }
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'@' | b'/' | b'-') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Whether a value of type `T` is an unordered set, whose elements are written sorted (see the
/// module's docs).
fn unordered<T: ?Sized>() -> bool {
    is_unordered_set(std::any::type_name::<T>())
}

/// Whether the type named `name` (as `std::any::type_name` names it) is an unordered set: after
/// references and the standard pointers whose `Serialize` is their content's are peeled off, its
/// path without generic arguments ends in one of [`UNORDERED_SETS`].
pub(super) fn is_unordered_set(name: &str) -> bool {
    let mut name = name.trim_start();
    loop {
        if let Some(referenced) = name.strip_prefix('&') {
            let referenced = referenced.trim_start();
            name = referenced
                .strip_prefix("mut ")
                .unwrap_or(referenced)
                .trim_start();
            continue;
        }
        let (path, arguments) = match name.find(['<', ',', '>']) {
            Some(at) if name[at..].starts_with('<') => (&name[..at], Some(&name[at + 1..])),
            Some(at) => (&name[..at], None),
            None => (name, None),
        };
        let path = path.trim_end();
        match arguments {
            Some(arguments) if TRANSPARENT_POINTERS.contains(&path) => {
                // The first argument that is a type (`Cow<'_, T>` has a lifetime first).
                name = arguments.trim_start();
                while let Some(lifetime) = name.strip_prefix('\'') {
                    name = lifetime
                        .split_once(',')
                        .map_or("", |(_, rest)| rest)
                        .trim_start();
                }
            }
            _ => {
                // A path: not a tuple, a slice, an array or a trait object.
                let is_path = path
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == ':');
                let last = path.rsplit("::").next().unwrap_or(path);
                return is_path && UNORDERED_SETS.contains(&last);
            }
        }
    }
}

/// The last segment of the path of a type that is an unordered set: std's, hashbrown's and im's
/// `HashSet`, indexmap's `IndexSet`, ahash's `AHashSet`, dashmap's `DashSet`.
const UNORDERED_SETS: [&str; 4] = ["HashSet", "IndexSet", "AHashSet", "DashSet"];

/// The standard pointers that serialize as their content, as `type_name` writes their paths.
const TRANSPARENT_POINTERS: [&str; 4] = [
    "alloc::boxed::Box",
    "alloc::rc::Rc",
    "alloc::sync::Arc",
    "alloc::borrow::Cow",
];

/// Writes one value. `top` is true for the key itself, whose tuple elements (the arguments) are
/// joined by `:` rather than bracketed. `unordered` is true for a value that is an unordered set
/// (see [`unordered`]): a sequence it writes is sorted.
struct TextSerializer<'a> {
    out: &'a mut String,
    top: bool,
    unordered: bool,
}

impl<'a> TextSerializer<'a> {
    /// The serializer of a value of type `T` inside another.
    fn of<T: ?Sized>(out: &'a mut String) -> Self {
        TextSerializer {
            out,
            top: false,
            unordered: unordered::<T>(),
        }
    }

    fn display(self, value: impl fmt::Display) -> Result<(), KeyError> {
        let _ = write!(self.out, "{value}");
        Ok(())
    }

    fn float(self, value: f64) -> Result<(), KeyError> {
        if value.is_nan() {
            self.out.push_str("NaN");
        } else if value == 0.0 {
            self.out.push_str("0.0");
        } else {
            let _ = write!(self.out, "{value:?}");
        }
        Ok(())
    }

    fn compound(self, open: &'static str, close: &'static str) -> Compound<'a> {
        self.out.push_str(open);
        Compound {
            out: self.out,
            separator: ',',
            close,
            first: true,
            entries: None,
        }
    }
}

/// Elements of a sequence, tuple, struct or map, separated and closed. A map's entries and an
/// unordered set's elements are kept until its end, then written sorted.
struct Compound<'a> {
    out: &'a mut String,
    separator: char,
    close: &'static str,
    first: bool,
    /// A map's entries, as `key=value` text, or an unordered set's elements, as text.
    entries: Option<Vec<String>>,
}

impl Compound<'_> {
    fn separate(&mut self) {
        if !self.first {
            self.out.push(self.separator);
        }
        self.first = false;
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        if let Some(entries) = &mut self.entries {
            // An unordered set's element.
            let mut entry = String::new();
            value.serialize(TextSerializer::of::<T>(&mut entry))?;
            entries.push(entry);
            return Ok(());
        }
        self.separate();
        value.serialize(TextSerializer::of::<T>(self.out))
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), KeyError> {
        self.separate();
        push_text(self.out, name);
        self.out.push('=');
        value.serialize(TextSerializer::of::<T>(self.out))
    }

    fn finish(self) -> Result<(), KeyError> {
        if let Some(mut entries) = self.entries {
            entries.sort_unstable();
            self.out.push_str(&entries.join(","));
        }
        self.out.push_str(self.close);
        Ok(())
    }
}

macro_rules! compound_impl {
    ($trait:ident, $method:ident) => {
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = KeyError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
                self.element(value)
            }
            fn end(self) -> Result<(), KeyError> {
                self.finish()
            }
        }
    };
}

compound_impl!(SerializeSeq, serialize_element);
compound_impl!(SerializeTuple, serialize_element);
compound_impl!(SerializeTupleStruct, serialize_field);
compound_impl!(SerializeTupleVariant, serialize_field);

macro_rules! fields_impl {
    ($trait:ident) => {
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = KeyError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                value: &T,
            ) -> Result<(), KeyError> {
                self.field(name, value)
            }
            fn end(self) -> Result<(), KeyError> {
                self.finish()
            }
        }
    };
}

fields_impl!(SerializeStruct);
fields_impl!(SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = KeyError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), KeyError> {
        let mut entry = String::new();
        key.serialize(TextSerializer::of::<T>(&mut entry))?;
        entry.push('=');
        self.entries.get_or_insert_with(Vec::new).push(entry);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        let entry = self
            .entries
            .as_mut()
            .and_then(|entries| entries.last_mut())
            .ok_or_else(|| KeyError("a map's value came before its key".into()))?;
        value.serialize(TextSerializer::of::<T>(entry))
    }

    fn end(self) -> Result<(), KeyError> {
        self.finish()
    }
}

impl<'a> ser::Serializer for TextSerializer<'a> {
    type Ok = ();
    type Error = KeyError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_i8(self, v: i8) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_u8(self, v: u8) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), KeyError> {
        self.display(v)
    }
    fn serialize_f32(self, v: f32) -> Result<(), KeyError> {
        // Widening is exact, and f64's shortest decimal of a widened f32 is unique to it.
        self.float(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), KeyError> {
        self.float(v)
    }
    fn serialize_char(self, v: char) -> Result<(), KeyError> {
        push_text(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), KeyError> {
        push_text(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), KeyError> {
        self.out.push('x');
        for byte in v {
            let _ = write!(self.out, "{byte:02x}");
        }
        Ok(())
    }
    fn serialize_none(self) -> Result<(), KeyError> {
        self.out.push('~');
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), KeyError> {
        self.out.push('+');
        value.serialize(TextSerializer::of::<T>(self.out))
    }
    fn serialize_unit(self) -> Result<(), KeyError> {
        // The key of a function without key arguments is empty.
        if !self.top {
            self.out.push_str("()");
        }
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), KeyError> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), KeyError> {
        push_text(self.out, variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        // Written as its content: a set inside is a set, and so is a set written as a newtype.
        let unordered = self.unordered || unordered::<T>();
        value.serialize(TextSerializer { unordered, ..self })
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        push_text(self.out, variant);
        self.out.push('(');
        value.serialize(TextSerializer::of::<T>(self.out))?;
        self.out.push(')');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, KeyError> {
        let unordered = self.unordered;
        let mut compound = self.compound("[", "]");
        if unordered {
            compound.entries = Some(Vec::new());
        }
        Ok(compound)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Compound<'a>, KeyError> {
        if self.top {
            // The arguments: `a:b`, never bracketed.
            let mut compound = self.compound("", "");
            compound.separator = ':';
            return Ok(compound);
        }
        Ok(self.compound("[", "]"))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        Ok(self.compound("[", "]"))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        push_text(self.out, variant);
        Ok(self.compound("(", ")"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, KeyError> {
        let mut compound = self.compound("{", "}");
        compound.entries = Some(Vec::new());
        Ok(compound)
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'a>, KeyError> {
        Ok(self.compound("{", "}"))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        push_text(self.out, variant);
        Ok(self.compound("{", "}"))
    }
}
