//! The Lua scripts of the protocol. Each does in one round trip what would otherwise take
//! several, and reads the server's clock so that every process agrees on deadlines.

use std::sync::LazyLock;

use redis::Script;

// The fence of a key (`:f`) orders its fills. Every lock acquisition increments it in the same
// script, and an invalidation increments it when it exists; a fill is written only if the fence
// is still the one its flow read, so neither a holder whose lease lapsed (a paused process) nor a
// load that began before an invalidation can write its value over a newer one. A fill without
// the lock increments it too, so a slower holder of the same round cannot overwrite it.
//
// A fence exists only while a key is being filled or has a value: a read that may lead to a fill
// creates it with the lease as its time to live, the watchdog keeps it alive with the lock, and
// a fill gives it the value's. When it is created it starts from the server's clock in
// microseconds, so a fence that expired and was created again is above every one handed out
// before it. Invalidating a key that nobody fills creates nothing: Redis holds no state per
// invalidation.

/// Reads the value if it is fresh, and nothing else: a call's read on its own task, which serves
/// a fresh value and leaves anything else to the key's flight (`READ_OR_LOCK`).
///
/// KEYS: value. ARGV: the largest value to return, in bytes (a larger one stays on the server).
///
/// Returns `{value, now_ms}` when the value is fresh, else nil.
pub(crate) static READ_FRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[1]) then
  return false
end
local value = redis.call('GET', KEYS[1])
if not value then
  return false
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fresh = tonumber(string.match(value, '^S2 (%d+) '))
if fresh and fresh > now then
  return {value, now}
end
return false
",
    )
});

/// Reads the value and, unless it is fresh, makes sure the key has a fence and tries to take the
/// lock.
///
/// KEYS: value, lock, fence. ARGV: token (empty: do not lock), lease ms, `1` to treat a present
/// value as unusable (it failed to decode), the largest value to return in bytes (a larger one
/// stays on the server and is unusable).
///
/// Returns `{value or nil, state, now_ms, fence, lock_pttl, oversized (0 or 1)}` where state is
/// `fresh`, `locked` (this caller holds the lock now, with the fence returned), `busy` (another
/// holder has it) or `nolock`.
pub(crate) static READ_OR_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oversized = 0
local value = false
if redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[4]) then
  oversized = 1
else
  value = redis.call('GET', KEYS[1])
end
if value and ARGV[3] ~= '1' then
  local fresh = tonumber(string.match(value, '^S2 (%d+) '))
  if fresh and fresh > now then
    return {value, 'fresh', now, 0, 0, 0}
  end
end
local fence = redis.call('GET', KEYS[3])
if not fence then
  fence = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('SET', KEYS[3], fence, 'PX', ARGV[2])
elseif redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
if ARGV[1] == '' then
  return {value, 'nolock', now, fence, 0, oversized}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {value, 'locked', now, redis.call('INCR', KEYS[3]), 0, oversized}
end
return {value, 'busy', now, fence, redis.call('PTTL', KEYS[2]), oversized}
",
    )
});

/// Writes the envelope if the key's fence is still the one the flow read and the value stored
/// has no newer source version, publishes it on the key's channel (an empty message when
/// nothing was written, so that waiters read again at once), and releases the lock if the
/// caller still holds it (compare-and-delete).
///
/// KEYS: value, lock, fence. ARGV: token (may be empty), fresh ms, stale ms, load ms, the
/// fence read (empty for a prime: written whatever the fence, which it moves on), the payload, the channel, how long to keep the value past its stale deadline
/// (the cache's `fail_safe`, ms), the publishing command (`SPUBLISH` on a cluster, else
/// `PUBLISH`), the value's source version (decimal; empty for none), the largest value to
/// return in bytes, the server's time (ms) when the value was read from the source (the start
/// of the attempt that gave it, after the read that gave the fence; 0 for none).
///
/// Returns `{written, now_ms, fresh_until, stale_until, stored}`: written is 1, or 0 when the
/// fence moved, or 2 when the value stored has a newer source version; when nothing was
/// written, `stored` is the value Redis holds (nil when none, or over the size given).
///
/// When the fence moved and the value stored was written before the source was read (another
/// load began since and has not filled, or a prime came while the first attempt stalled and a
/// retry read the source after it), that value is older than the one this load hands out, and
/// is deleted, so that no process is served it after this one's (the next reader waits for the
/// other load, or loads).
pub(crate) static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
local function refused(why)
  redis.call(ARGV[9], ARGV[7], '')
  local stored = false
  if redis.call('STRLEN', KEYS[1]) <= tonumber(ARGV[11]) then
    stored = redis.call('GET', KEYS[1])
  end
  return {why, now, 0, 0, stored}
end
if ARGV[10] ~= '' then
  local have = string.match(redis.call('GETRANGE', KEYS[1], 0, 160), '^S2 %d+ %d+ %d+ %d+ %d+ (%d+)\n')
  if have and (#have > #ARGV[10] or (#have == #ARGV[10] and have > ARGV[10])) then
    return refused(2)
  end
end
local fence = ARGV[5]
if fence == '' then
  -- A prime: written whatever the fence, which moves on below, fencing off every load running.
  fence = redis.call('GET', KEYS[3])
  if not fence then
    fence = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', KEYS[3], fence)
  end
elseif redis.call('GET', KEYS[3]) ~= fence then
  local written = tonumber(string.match(redis.call('GETRANGE', KEYS[1], 0, 160), '^S2 %d+ %d+ (%d+) '))
  if written and written < tonumber(ARGV[12]) then
    redis.call('DEL', KEYS[1])
  end
  return refused(0)
end
if ARGV[1] == '' then
  redis.call('INCR', KEYS[3])
end
local fresh = now + tonumber(ARGV[2])
local stale = fresh + tonumber(ARGV[3])
local version = ARGV[10]
if version == '' then
  version = '-'
end
local envelope = string.format('S2 %.0f %.0f %.0f %s %s %s\n', fresh, stale, now, fence, ARGV[4], version) .. ARGV[6]
local ttl = math.max(1, stale - now + tonumber(ARGV[8]))
redis.call('SET', KEYS[1], envelope, 'PX', ttl)
if redis.call('PTTL', KEYS[3]) < ttl then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
redis.call(ARGV[9], ARGV[7], envelope)
return {1, now, fresh, stale, false}
",
    )
});

/// Extends the lock's lease if the caller still holds it (compare-and-pexpire), and keeps the
/// key's fence alive as long. KEYS: lock, fence. ARGV: token, lease ms. Returns 1 if extended,
/// 0 if the lock is someone else's or gone.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

/// Keeps the key's fence alive for a load that runs without the lock (`lock = "local"`, or the
/// `compute` busy policy) while it is still the one the load read: its fill is written only
/// over that fence. KEYS: fence. ARGV: the fence read, lease ms. Returns 1 if kept, 0 if the
/// fence moved or is gone (the fill will be refused: nothing to keep).
pub(crate) static KEEP_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
",
    )
});

/// Deletes the value, increments the fence if the key has one (so a load that read it cannot
/// write back; a key nobody fills gets no state), and announces the invalidation to every
/// process. KEYS: value, fence. ARGV: the invalidation channel (empty: announce nothing, a
/// tag's invalidation announces itself once), the message. Returns 1 if a value was deleted.
pub(crate) static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local deleted = redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[2])
end
if ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return deleted
",
    )
});

/// Adds a key base to a tag's set, and keeps the set at least as long as the value it stands
/// for. Runs before the key's load reads its source. KEYS: the tag's set. ARGV: the key base,
/// how long to keep the set (ms).
pub(crate) static TAG: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('SADD', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
",
    )
});

/// Moves every key base of a tag's set into its pending set, atomically (a key tagged after
/// this is in the next set), and returns the pending bases: this invalidation's and those of
/// one that failed midway. KEYS: the tag's set, its pending set.
pub(crate) static TAKE_TAGGED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('SUNIONSTORE', KEYS[2], KEYS[2], KEYS[1])
  redis.call('DEL', KEYS[1])
  if ttl > 0 and redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return redis.call('SMEMBERS', KEYS[2])
",
    )
});
