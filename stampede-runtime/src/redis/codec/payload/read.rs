//! Reads a value from the payload form (see the parent module), bounded in depth; every length
//! is checked against the bytes left before anything is allocated for it.

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::write::*;
use super::{MAX_DEPTH, PayloadError};

type Result<T> = std::result::Result<T, PayloadError>;

pub(super) struct Reader<'de> {
    input: &'de [u8],
    depth: usize,
}

impl<'de> Reader<'de> {
    pub(super) fn new(input: &'de [u8]) -> Self {
        Reader { input, depth: 0 }
    }

    pub(super) fn finish(&self) -> Result<()> {
        match self.input.is_empty() {
            true => Ok(()),
            false => Err(PayloadError::Malformed("bytes after the value")),
        }
    }

    fn byte(&mut self) -> Result<u8> {
        let (&first, rest) = self
            .input
            .split_first()
            .ok_or(PayloadError::Malformed("cut short"))?;
        self.input = rest;
        Ok(first)
    }

    fn peek(&self) -> Result<u8> {
        self.input
            .first()
            .copied()
            .ok_or(PayloadError::Malformed("cut short"))
    }

    fn take(&mut self, len: usize) -> Result<&'de [u8]> {
        if len > self.input.len() {
            return Err(PayloadError::Malformed("cut short"));
        }
        let (taken, rest) = self.input.split_at(len);
        self.input = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(PayloadError::Malformed("integer out of range"));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(PayloadError::Malformed("integer out of range"))
    }

    fn len(&mut self) -> Result<usize> {
        usize::try_from(self.varint()?).map_err(|_| PayloadError::Malformed("length out of range"))
    }

    fn text(&mut self) -> Result<&'de [u8]> {
        let len = self.len()?;
        self.take(len)
    }

    fn str(&mut self) -> Result<&'de str> {
        std::str::from_utf8(self.text()?).map_err(|_| PayloadError::Malformed("invalid UTF-8"))
    }

    /// A count of entries of at least `per_entry` bytes each, no more than the bytes left hold.
    fn count(&mut self, per_entry: usize) -> Result<usize> {
        let count = u32::from_le_bytes(self.array()?) as usize;
        match count.saturating_mul(per_entry) > self.input.len() {
            true => Err(PayloadError::Malformed("more entries than bytes")),
            false => Ok(count),
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        match self.depth > MAX_DEPTH {
            true => Err(PayloadError::TooDeep),
            false => Ok(()),
        }
    }

    fn leave<T>(&mut self, result: Result<T>) -> Result<T> {
        self.depth -= 1;
        result
    }

    /// Visits a sequence of `count` values.
    fn seq<V: Visitor<'de>>(&mut self, count: usize, visitor: V) -> Result<V::Value> {
        let mut access = Entries {
            reader: self,
            left: count,
        };
        let value = visitor.visit_seq(&mut access)?;
        access.done()?;
        Ok(value)
    }

    /// Visits a map of `count` entries.
    fn map<V: Visitor<'de>>(&mut self, count: usize, visitor: V) -> Result<V::Value> {
        let mut access = Entries {
            reader: self,
            left: count,
        };
        let value = visitor.visit_map(&mut access)?;
        access.done()?;
        Ok(value)
    }

    /// The content of a variant as a self-describing reader sees it: a unit variant is its
    /// name, another a map of one entry from its name to its content.
    fn any_variant<V: Visitor<'de>>(&mut self, tag: u8, visitor: V) -> Result<V::Value> {
        let name = self.str()?;
        if tag == UNIT_VARIANT {
            return visitor.visit_borrowed_str(name);
        }
        self.enter()?;
        let result = visitor.visit_map(VariantAsMap {
            reader: self,
            tag,
            name: Some(name),
        });
        self.leave(result)
    }
}

/// The entries of a sequence or map.
struct Entries<'a, 'de> {
    reader: &'a mut Reader<'de>,
    left: usize,
}

impl Entries<'_, '_> {
    fn done(&self) -> Result<()> {
        match self.left {
            0 => Ok(()),
            _ => Err(PayloadError::Malformed("entries left unread")),
        }
    }
}

impl<'de> de::SeqAccess<'de> for Entries<'_, 'de> {
    type Error = PayloadError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.reader).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = PayloadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.reader).map(Some)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value> {
        seed.deserialize(&mut *self.reader)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// A variant read through `deserialize_any`: one entry, its name, then its content.
struct VariantAsMap<'a, 'de> {
    reader: &'a mut Reader<'de>,
    tag: u8,
    name: Option<&'de str>,
}

impl<'de> de::MapAccess<'de> for VariantAsMap<'_, 'de> {
    type Error = PayloadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.name.take() {
            Some(name) => seed.deserialize(name.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value> {
        seed.deserialize(VariantContent {
            reader: &mut *self.reader,
            tag: self.tag,
        })
    }
}

/// The content of a newtype, tuple or struct variant, its name read already.
struct VariantContent<'a, 'de> {
    reader: &'a mut Reader<'de>,
    tag: u8,
}

impl<'de> de::Deserializer<'de> for VariantContent<'_, 'de> {
    type Error = PayloadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.tag {
            NEWTYPE_VARIANT => de::Deserializer::deserialize_any(&mut *self.reader, visitor),
            TUPLE_VARIANT => {
                let count = self.reader.count(1)?;
                self.reader.seq(count, visitor)
            }
            _ => {
                let count = self.reader.count(2)?;
                self.reader.map(count, visitor)
            }
        }
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// A variant read by a type that asked for an enum.
struct Variant<'a, 'de> {
    reader: &'a mut Reader<'de>,
    tag: u8,
}

impl<'a, 'de> de::EnumAccess<'de> for Variant<'a, 'de> {
    type Error = PayloadError;
    type Variant = Self;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Self)> {
        let name = self.reader.str()?;
        let value = seed.deserialize(name.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = PayloadError;

    fn unit_variant(self) -> Result<()> {
        match self.tag {
            UNIT_VARIANT => Ok(()),
            _ => Err(PayloadError::Malformed(
                "a variant with data where a unit one was asked",
            )),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        match self.tag {
            NEWTYPE_VARIANT => seed.deserialize(&mut *self.reader),
            _ => Err(PayloadError::Malformed("not a newtype variant")),
        }
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        match self.tag {
            TUPLE_VARIANT => {
                let count = self.reader.count(1)?;
                self.reader.seq(count, visitor)
            }
            _ => Err(PayloadError::Malformed("not a tuple variant")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.tag {
            STRUCT_VARIANT => {
                let count = self.reader.count(2)?;
                self.reader.map(count, visitor)
            }
            _ => Err(PayloadError::Malformed("not a struct variant")),
        }
    }
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = PayloadError;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.byte()? {
            NONE => visitor.visit_none(),
            SOME => {
                self.enter()?;
                let result = visitor.visit_some(&mut *self);
                self.leave(result)
            }
            UNIT => visitor.visit_unit(),
            FALSE => visitor.visit_bool(false),
            TRUE => visitor.visit_bool(true),
            UINT => visitor.visit_u64(self.varint()?),
            NINT => visitor.visit_i64(!self.varint()? as i64),
            U128 => visitor.visit_u128(u128::from_le_bytes(self.array()?)),
            I128 => visitor.visit_i128(i128::from_le_bytes(self.array()?)),
            F32 => visitor.visit_f32(f32::from_bits(u32::from_le_bytes(self.array()?))),
            F64 => visitor.visit_f64(f64::from_bits(u64::from_le_bytes(self.array()?))),
            CHAR => {
                let code = u32::try_from(self.varint()?).ok().and_then(char::from_u32);
                visitor.visit_char(code.ok_or(PayloadError::Malformed("not a char"))?)
            }
            STR => visitor.visit_borrowed_str(self.str()?),
            BYTES => visitor.visit_borrowed_bytes(self.text()?),
            SEQ => {
                self.enter()?;
                let result = self.count(1).and_then(|count| self.seq(count, visitor));
                self.leave(result)
            }
            MAP => {
                self.enter()?;
                let result = self.count(2).and_then(|count| self.map(count, visitor));
                self.leave(result)
            }
            tag @ (UNIT_VARIANT | NEWTYPE_VARIANT | TUPLE_VARIANT | STRUCT_VARIANT) => {
                self.any_variant(tag, visitor)
            }
            _ => Err(PayloadError::Malformed("unknown tag")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek()? {
            NONE | SOME => self.deserialize_any(visitor),
            _ => Err(PayloadError::Malformed("not an option")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let tag = self.byte()?;
        if !matches!(
            tag,
            UNIT_VARIANT | NEWTYPE_VARIANT | TUPLE_VARIANT | STRUCT_VARIANT
        ) {
            return Err(PayloadError::Malformed("not an enum variant"));
        }
        self.enter()?;
        let result = visitor.visit_enum(Variant {
            reader: &mut *self,
            tag,
        });
        self.leave(result)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}
