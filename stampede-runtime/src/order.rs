//! Which of two values of a key is newer, where the tiers need to know it of values they did
//! not load themselves.
//!
//! A load's value is as new as the moment its source was read, which the runtime knows from
//! below only (`read_from`: when the attempt that gave it began, on the shared store's clock),
//! and the store keeps that moment with the value (the envelope's `read_at`). So a stored value
//! whose source was read *before* a load's is older than that load's value, certainly; one read
//! at or after it may be newer (on a tie the two reads cannot be ordered, and the value others
//! are served already wins). When it was written does not order it: a slow load writes late
//! what it read early.
//!
//! The store also keeps, per key, a *fence*: a number that every lock taken, value written and
//! invalidation moves on, and that a write or an invalidation moves to at least its *stamp*,
//! the moment (µs on the store's clock) its source was read or it happened. So the fence is the
//! greatest stamp of the key's writes and invalidations since it was created (created from the
//! clock, it is above every earlier one), and a load whose source was read after it is newer
//! than anything written or invalidated: its fill lands even where nothing is stored to compare
//! with (the value written since its read has expired).
//!
//! Memory orders the values it keeps by the same reads, on this process's clock ([`held_stays`]):
//! a flight's value whose source was read before the one memory holds (or one the key's running
//! loads kept already) does not replace it.
//!
//! These rules decide both what the Redis `FILL` and `INVALIDATE` scripts do and what the fake
//! tier of the tests does; `redis::scripts`' tests check the scripts against them on a real
//! redis-server. Times here are µs on the store's clock (Redis's are ms, times 1,000).

/// Whether a stored value whose source was read at `stored_read_at` may be newer than a load's
/// value whose source was read at `read_from`: `false` means it is older, for certain. A tie
/// counts as "may be newer": the one tie rule, which the store applies from the stored value's
/// side and memory from the incoming one's (see [`held_stays`]).
pub(crate) fn may_be_newer<T: Ord>(stored_read_at: T, read_from: T) -> bool {
    stored_read_at >= read_from
}

/// Whether a load's fill lands, as `FILL` decides it once source versions allow it, given
/// whether the key's fence is still the one the load read (`fenced`), the fence now, when the
/// source of the value stored was read (`None`: nothing stored, or a value expired since it
/// was written: `expire` moves the fence as an invalidation does, and keeps the value only to
/// serve it stale) and when the load's was.
///
/// Over a stored value: exactly when that value is older, whatever the fence (a stored value
/// was read after the last invalidation, which deleted what was there, so a value read later
/// is too). Over nothing: under the fence the load read, or when its source was read after the
/// fence's stamp (after every write and invalidation since). Refused, its callers are handed
/// what is stored (or, with nothing stored, their own value, kept nowhere shared).
///
/// Over a value expired since it was written (`expired`), a fill that may not land as over
/// nothing (its source read before the expiry) but is newer than that value lands all the same,
/// expired too ([`Landing::Expired`]): the key's last good value is then the newest read, and
/// nothing read before the expiry is served fresh.
#[cfg(any(feature = "simulation", test))]
pub(crate) fn fill_lands(
    fenced: bool,
    fence: u64,
    stored: Option<(u64, bool)>,
    read_from: u64,
) -> Landing {
    let newer = |stored| !may_be_newer(stored, read_from);
    match stored {
        Some((stored, false)) if newer(stored) => Landing::Lands,
        Some((_, false)) => Landing::Refused,
        _ if fenced || read_from > fence => Landing::Lands,
        Some((stored, true)) if newer(stored) => Landing::Expired,
        _ => Landing::Refused,
    }
}

/// How a load's fill lands ([`fill_lands`]).
#[cfg(any(feature = "simulation", test))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landing {
    /// Written, fresh for its windows.
    Lands,
    /// Written, no longer fresh (over a value expired since the load read its source), stale
    /// for its stale window from now.
    Expired,
    /// Not written.
    Refused,
}

/// The key's fence after a write or an invalidation stamped `stamp` (a fill's: its source read,
/// no later than its writing; a prime's or an invalidation's: its moment): moved on, to at
/// least the stamp. A lock taken moves it by one.
#[cfg(any(feature = "simulation", test))]
pub(crate) fn moved_fence(fence: u64, stamp: u64) -> u64 {
    (fence + 1).max(stamp)
}

/// Why a value memory holds stays where another value of its key was to be kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stays {
    /// Its source version is greater (`source_version`): the other is counted as older.
    Version,
    /// Its source was read after the other's.
    Read,
}

/// Whether a value memory holds stays rather than give way to `other` (each: its source
/// version, if the cache has one, and when its source was read, bounded from below, on this
/// process's clock). By source version when both have one; else by the reads, with
/// [`may_be_newer`] asked of the incoming value: the held one stays when the other is older for
/// certain, and a tie goes to the value kept last. Memory's reads are stamped to the nanosecond,
/// and a tie there is one value kept again with new deadlines (the fail-safe throttle); the
/// store's are to the millisecond, where a tie is two loads, and the value stored stays.
pub(crate) fn held_stays<T: Ord>(held: (Option<u64>, T), other: (Option<u64>, T)) -> Option<Stays> {
    match (held.0, other.0) {
        (Some(held), Some(other)) => (held > other).then_some(Stays::Version),
        _ => (!may_be_newer(other.1, held.1)).then_some(Stays::Read),
    }
}
