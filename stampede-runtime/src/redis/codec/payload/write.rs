//! Writes a value in the payload form (see the parent module), bounded in size and depth.

use serde::ser::{self, Serialize};

use super::{MAX_DEPTH, PayloadError};

pub(super) const NONE: u8 = 0x00;
pub(super) const SOME: u8 = 0x01;
pub(super) const UNIT: u8 = 0x02;
pub(super) const FALSE: u8 = 0x03;
pub(super) const TRUE: u8 = 0x04;
pub(super) const UINT: u8 = 0x05;
pub(super) const NINT: u8 = 0x06;
pub(super) const U128: u8 = 0x07;
pub(super) const I128: u8 = 0x08;
pub(super) const F32: u8 = 0x09;
pub(super) const F64: u8 = 0x0A;
pub(super) const CHAR: u8 = 0x0B;
pub(super) const STR: u8 = 0x0C;
pub(super) const BYTES: u8 = 0x0D;
pub(super) const SEQ: u8 = 0x0E;
pub(super) const MAP: u8 = 0x0F;
pub(super) const UNIT_VARIANT: u8 = 0x10;
pub(super) const NEWTYPE_VARIANT: u8 = 0x11;
pub(super) const TUPLE_VARIANT: u8 = 0x12;
pub(super) const STRUCT_VARIANT: u8 = 0x13;

type Result<T = ()> = std::result::Result<T, PayloadError>;

pub(super) struct Writer {
    pub(super) out: Vec<u8>,
    depth: usize,
    max_bytes: usize,
}

impl Writer {
    pub(super) fn new(max_bytes: usize) -> Self {
        Writer {
            out: Vec::new(),
            depth: 0,
            max_bytes,
        }
    }

    pub(super) fn finish(self) -> Result<Vec<u8>> {
        self.check_size()?;
        Ok(self.out)
    }

    fn check_size(&self) -> Result {
        match self.out.len() > self.max_bytes {
            true => Err(PayloadError::TooLarge(self.out.len(), self.max_bytes)),
            false => Ok(()),
        }
    }

    fn varint(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.out.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.out.push(n as u8);
    }

    fn text(&mut self, text: &[u8]) -> Result {
        self.varint(text.len() as u64);
        self.out.extend_from_slice(text);
        self.check_size()
    }

    fn enter(&mut self) -> Result {
        self.depth += 1;
        match self.depth > MAX_DEPTH {
            true => Err(PayloadError::TooDeep),
            false => Ok(()),
        }
    }

    /// Opens a sequence or map of `len` entries (when known; else patched at the end).
    fn open(&mut self, tag: u8, len: Option<usize>) -> Result<Compound<'_>> {
        self.enter()?;
        self.out.push(tag);
        Ok(self.counted(len))
    }

    fn counted(&mut self, len: Option<usize>) -> Compound<'_> {
        let at = self.out.len();
        let count = len.and_then(|len| u32::try_from(len).ok()).unwrap_or(0);
        self.out.extend_from_slice(&count.to_le_bytes());
        Compound {
            writer: self,
            at,
            count: 0,
        }
    }
}

/// The entries of a sequence, map, struct or variant being written; their count is written
/// when it ends.
pub(super) struct Compound<'a> {
    writer: &'a mut Writer,
    /// Where the count goes.
    at: usize,
    count: u64,
}

impl Compound<'_> {
    fn entry<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
        self.count += 1;
        value.serialize(&mut *self.writer)
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result {
        self.count += 1;
        self.writer.out.push(STR);
        self.writer.text(name.as_bytes())?;
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Result {
        let count = u32::try_from(self.count)
            .map_err(|_| PayloadError::TooLarge(self.writer.out.len(), self.writer.max_bytes))?;
        self.writer.out[self.at..self.at + 4].copy_from_slice(&count.to_le_bytes());
        self.writer.depth -= 1;
        Ok(())
    }
}

macro_rules! entries {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = PayloadError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
                self.entry(value)
            }
            fn end(self) -> Result {
                Compound::end(self)
            }
        }
    )*};
}

entries!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = PayloadError;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result {
                self.field(name, value)
            }
            fn end(self) -> Result {
                Compound::end(self)
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = PayloadError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result {
        self.entry(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result {
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Result {
        Compound::end(self)
    }
}

impl<'a> ser::Serializer for &'a mut Writer {
    type Ok = ();
    type Error = PayloadError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Result {
        self.out.push(if v { TRUE } else { FALSE });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result {
        match u64::try_from(v) {
            Ok(v) => self.serialize_u64(v),
            Err(_) => {
                self.out.push(NINT);
                self.varint(!(v as u64)); // -1 - v
                Ok(())
            }
        }
    }
    fn serialize_i128(self, v: i128) -> Result {
        if let Ok(v) = i64::try_from(v) {
            return self.serialize_i64(v);
        }
        if let Ok(v) = u64::try_from(v) {
            return self.serialize_u64(v);
        }
        self.out.push(I128);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Result {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Result {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Result {
        self.out.push(UINT);
        self.varint(v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result {
        if let Ok(v) = u64::try_from(v) {
            return self.serialize_u64(v);
        }
        self.out.push(U128);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result {
        self.out.push(F32);
        self.out.extend_from_slice(&v.to_bits().to_le_bytes());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result {
        self.out.push(F64);
        self.out.extend_from_slice(&v.to_bits().to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result {
        self.out.push(CHAR);
        self.varint(v.into());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result {
        self.out.push(STR);
        self.text(v.as_bytes())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result {
        self.out.push(BYTES);
        self.text(v)
    }
    fn serialize_none(self) -> Result {
        self.out.push(NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result {
        self.enter()?;
        self.out.push(SOME);
        value.serialize(&mut *self)?;
        self.depth -= 1;
        Ok(())
    }
    fn serialize_unit(self) -> Result {
        self.out.push(UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result {
        self.out.push(UNIT_VARIANT);
        self.text(variant.as_bytes())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result {
        self.enter()?;
        self.out.push(NEWTYPE_VARIANT);
        self.text(variant.as_bytes())?;
        value.serialize(&mut *self)?;
        self.depth -= 1;
        Ok(())
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>> {
        self.open(SEQ, len)
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>> {
        self.open(SEQ, Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>> {
        self.open(SEQ, Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>> {
        self.enter()?;
        self.out.push(TUPLE_VARIANT);
        self.text(variant.as_bytes())?;
        Ok(self.counted(Some(len)))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a>> {
        self.open(MAP, len)
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Compound<'a>> {
        self.open(MAP, Some(len))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>> {
        self.enter()?;
        self.out.push(STRUCT_VARIANT);
        self.text(variant.as_bytes())?;
        Ok(self.counted(Some(len)))
    }
}
