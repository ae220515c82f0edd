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

/// Whether a load's fill lands, as `FILL` decides it once source versions allow it, given
/// whether the key's fence is still the one the load read (`fenced`), when the source of the
/// value stored was read (`None`: nothing stored) and when the load's was: exactly over an older
/// stored value, whatever the fence (a stored value was read after the last invalidation, which
/// deleted what was there, so a value read later is too); over nothing, only under the fence
/// the load read. `Some(true)`: it lands over a fence that moved, which it moves on past the
/// load that moved it; `Some(false)`: under its own fence; `None`: refused, and its callers are
/// handed what is stored (or, with nothing stored, their own value, kept nowhere shared).
pub(crate) fn fill_lands<T: Ord>(
    fenced: bool,
    stored_read_at: Option<T>,
    read_from: T,
) -> Option<bool> {
    match stored_read_at.map(|stored| may_be_newer(stored, read_from)) {
        Some(true) => None,
        Some(false) => Some(!fenced),
        None => fenced.then_some(false),
    }
}

/// Whether a fill that landed (`over_moved`: over a fence that had moved, see [`fill_lands`])
/// moves the key's fence on: when it holds no lock (a holder's own lock, taken with the fence's
/// increment, orders it already), or when it landed over a moved fence.
pub(crate) fn fill_moves_fence(locked: bool, over_moved: bool) -> bool {
    !locked || over_moved
}
