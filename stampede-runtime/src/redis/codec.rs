//! The codec: a value's and a key's bytes, with no Redis in it (the payload's form, the keys and
//! their names, a value's shape, the envelope's header, the size bounds).

pub(crate) mod bounds;
pub(in crate::redis) mod envelope;
#[cfg(fuzzing)]
pub mod fuzz;
pub(in crate::redis) mod keys;
pub(in crate::redis) mod payload;
pub(in crate::redis) mod shape;
