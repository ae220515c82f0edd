//! Which of two values of a key is newer, where the tiers need to know it of values they did
//! not load themselves.
//!
//! A load's value is as new as the moment its source was read, which the runtime knows from
//! below only (`read_from`: when the attempt that gave it began, on the shared store's clock).
//! A value the store holds was written after its own source read. So a stored value written
//! *before* a load read its source is older than that load's value, certainly; one written at
//! or after it may be newer (on a tie the two reads cannot be ordered, and the value others are
//! served already wins). This one rule decides both what the Redis `FILL` script retires and
//! what the fake tier of the tests retires; `redis::scripts`' tests check the script against it
//! on a real redis-server.

/// Whether a value written at `written_at` may be newer than a load's value whose source was
/// read at `read_from` (both on the shared store's clock): `false` means it is older, for
/// certain. A tie counts as "may be newer".
pub(crate) fn may_be_newer<T: Ord>(written_at: T, read_from: T) -> bool {
    written_at >= read_from
}
