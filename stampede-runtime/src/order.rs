//! Which of two values of a key is newer, where the tiers need to know it of values they did
//! not load themselves.
//!
//! A load's value is as new as the moment its source was read, which the runtime knows from
//! below only (`read_from`: when the attempt that gave it began, on the shared store's clock),
//! and the store keeps that moment with the value (the envelope's `read_at`). So a stored value
//! whose source was read *before* a load's is older than that load's value, certainly; one read
//! at or after it may be newer (on a tie the two reads cannot be ordered, and the value others
//! are served already wins). When it was written does not order it: a slow load writes late
//! what it read early. This one rule decides both what the Redis `FILL` script retires and
//! what the fake tier of the tests retires; `redis::scripts`' tests check the script against it
//! on a real redis-server.

/// Whether a stored value whose source was read at `stored_read_at` may be newer than a load's
/// value whose source was read at `read_from` (both on the shared store's clock): `false` means
/// it is older, for certain. A tie counts as "may be newer".
pub(crate) fn may_be_newer<T: Ord>(stored_read_at: T, read_from: T) -> bool {
    stored_read_at >= read_from
}
