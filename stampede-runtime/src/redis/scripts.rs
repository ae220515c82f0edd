//! The Lua scripts of the protocol. Each does in one round trip what would otherwise take
//! several, and reads the server's clock so that every process agrees on deadlines.

use std::sync::LazyLock;

use redis::Script;

/// Reads the value and, unless it is fresh, tries to take the lock.
///
/// KEYS: value, lock, generation. ARGV: token (empty: do not lock), lease ms, `1` to treat a
/// present value as unusable (it failed to decode).
///
/// Returns `{value or nil, state, now_ms, generation, lock_pttl}` where state is `fresh`,
/// `locked` (this caller holds the lock now), `busy` (another holder has it) or `nolock`.
pub(crate) static READ_OR_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = redis.call('GET', KEYS[1])
local generation = redis.call('GET', KEYS[3]) or '0'
if value and ARGV[3] ~= '1' then
  local fresh = tonumber(string.match(value, '^S1 (%d+) '))
  if fresh and fresh > now then
    return {value, 'fresh', now, generation, 0}
  end
end
if ARGV[1] == '' then
  return {value or false, 'nolock', now, generation, 0}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {value or false, 'locked', now, generation, 0}
end
return {value or false, 'busy', now, generation, redis.call('PTTL', KEYS[2])}
",
    )
});

/// Writes the envelope unless the key was invalidated since the read, publishes it on the key's
/// channel (an empty message when nothing was written, so that waiters read again at once), and
/// releases the lock if the caller still holds it (compare-and-delete).
///
/// KEYS: value, lock, generation. ARGV: token (may be empty), fresh ms, stale ms, load ms,
/// the generation read with the lock, the payload, the channel.
///
/// Returns `{written (0 or 1), now_ms, fresh_until, stale_until}`.
pub(crate) static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
if (redis.call('GET', KEYS[3]) or '0') ~= ARGV[5] then
  redis.call('PUBLISH', ARGV[7], '')
  return {0, now, 0, 0}
end
local fresh = now + tonumber(ARGV[2])
local stale = fresh + tonumber(ARGV[3])
local envelope = string.format('S1 %.0f %.0f %.0f %s %s\n', fresh, stale, now, ARGV[5], ARGV[4]) .. ARGV[6]
redis.call('SET', KEYS[1], envelope, 'PX', math.max(1, stale - now))
redis.call('PUBLISH', ARGV[7], envelope)
return {1, now, fresh, stale}
",
    )
});

/// Releases the lock if the caller still holds it (compare-and-delete), and publishes an empty
/// message so that waiters read again at once instead of at the end of the lease. KEYS: lock.
/// ARGV: token, channel. Returns 1 if released.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
",
    )
});

/// Extends the lock's lease if the caller still holds it (compare-and-pexpire). KEYS: lock.
/// ARGV: token, lease ms. Returns 1 if extended, 0 if the lock is someone else's or gone.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

/// Deletes the value, bumps the generation (so a load that read the old one cannot write back),
/// and announces the invalidation to every process. KEYS: value, generation. ARGV: the
/// invalidation channel, the message, how long to keep the generation (ms).
pub(crate) static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return redis.call('PUBLISH', ARGV[1], ARGV[2])
",
    )
});
