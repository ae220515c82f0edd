//! The text of a key's arguments in its Redis keys, written by a serde serializer.
//!
//! Arguments are written by a serde serializer: numbers and booleans as themselves, text with
//! every character outside `[A-Za-z0-9_.@/-]` percent-encoded (so the delimiters below never
//! appear in it), `None` as `~` and `Some(x)` as `+x`, sequences, tuples and structs as
//! `[a,b]`, maps as `{k=v,..}` in iteration order (use a `BTreeMap` for a stable key), enum
//! variants by name with their fields in parentheses. The arguments of one call are joined by
//! `:`. For one key type, distinct values give distinct text. Arguments longer than
//! [`MAX_ARGS`] bytes keep a readable head and end in `#` and the SHA-256 of the whole text.

use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser;
use sha2::{Digest, Sha256};

/// The longest argument text kept whole; longer ones are cut and end in a digest.
pub(crate) const MAX_ARGS: usize = 200;
pub(crate) const HEAD: usize = 64;

/// The argument text of a key, bounded in length.
pub(crate) fn args_text<K: Serialize>(key: &K) -> Result<String, KeyError> {
    let mut out = String::new();
    key.serialize(TextSerializer {
        out: &mut out,
        top: true,
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

fn push_escaped(out: &mut String, text: &str) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'@' | b'/' | b'-') {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// Writes one value. `top` is true for the key itself, whose tuple elements (the arguments) are
/// joined by `:` rather than bracketed.
struct TextSerializer<'a> {
    out: &'a mut String,
    top: bool,
}

impl<'a> TextSerializer<'a> {
    fn display(self, value: impl fmt::Display) -> Result<(), KeyError> {
        let _ = write!(self.out, "{value}");
        Ok(())
    }

    fn nested(&mut self) -> TextSerializer<'_> {
        TextSerializer {
            out: self.out,
            top: false,
        }
    }

    fn open(self, open: &'static str, separator: char, close: &'static str) -> Compound<'a> {
        let (open, separator, close) = if self.top {
            ("", ':', "")
        } else {
            (open, separator, close)
        };
        self.out.push_str(open);
        Compound {
            out: self.out,
            separator,
            close,
            first: true,
        }
    }
}

/// Elements of a sequence, tuple, struct or map, separated and closed.
struct Compound<'a> {
    out: &'a mut String,
    separator: char,
    close: &'static str,
    first: bool,
}

impl Compound<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        if !self.first {
            self.out.push(self.separator);
        }
        self.first = false;
        value.serialize(TextSerializer {
            out: self.out,
            top: false,
        })
    }

    fn finish(self) -> Result<(), KeyError> {
        self.out.push_str(self.close);
        Ok(())
    }
}

macro_rules! compound_impl {
    ($trait:ident, $method:ident $(, $key:ident)?) => {
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = KeyError;
            fn $method<T: Serialize + ?Sized>(&mut self, $($key: &'static str,)? value: &T) -> Result<(), KeyError> {
                $(let _ = $key;)?
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
compound_impl!(SerializeStruct, serialize_field, _name);
compound_impl!(SerializeStructVariant, serialize_field, _name);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = KeyError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), KeyError> {
        self.element(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), KeyError> {
        self.out.push('=');
        value.serialize(TextSerializer {
            out: self.out,
            top: false,
        })
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
        self.display(format_args!("{v:?}"))
    }
    fn serialize_f64(self, v: f64) -> Result<(), KeyError> {
        self.display(format_args!("{v:?}"))
    }
    fn serialize_char(self, v: char) -> Result<(), KeyError> {
        push_escaped(self.out, v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), KeyError> {
        push_escaped(self.out, v);
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
        value.serialize(TextSerializer {
            out: self.out,
            top: false,
        })
    }
    fn serialize_unit(self) -> Result<(), KeyError> {
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
        push_escaped(self.out, variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), KeyError> {
        push_escaped(self.out, variant);
        self.out.push('(');
        value.serialize(self.nested())?;
        self.out.push(')');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, KeyError> {
        Ok(self.open("[", ',', "]"))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Compound<'a>, KeyError> {
        Ok(self.open("[", ',', "]"))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        Ok(self.open("[", ',', "]"))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        push_escaped(self.out, variant);
        Ok(TextSerializer {
            out: self.out,
            top: false,
        }
        .open("(", ',', ")"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, KeyError> {
        Ok(TextSerializer {
            out: self.out,
            top: false,
        }
        .open("{", ',', "}"))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'a>, KeyError> {
        Ok(self.open("[", ',', "]"))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, KeyError> {
        self.serialize_tuple_variant(_name, _index, variant, _len)
    }
}
