//! The Lua scripts of the protocol. Each does in one round trip what would otherwise take
//! several, and reads the server's clock so that every process agrees on deadlines.
//!
//! Each script of a key's protocol takes many keys (a batch's), and a single-key call runs it
//! with one: one script per step, so a rule is written once. A script's keys all share one
//! Redis Cluster slot: on a cluster a batch runs one script per slot.

use std::sync::LazyLock;

use redis::Script;

use crate::redis::transport::invalidate::announce_lua;

// The fence of a key (`:f`) orders its fills (`order`). Every lock acquisition increments it in
// the same script; every write moves it on to at least its stamp (when the value's source was
// read, or a prime's moment), and an invalidation to at least its moment, when the fence
// exists. A fill lands under the fence its flow read; over a value stored, exactly when that
// value is older; over nothing under a moved fence, only when its source was read after the
// fence's stamp: so neither a holder whose lease lapsed (a paused process) nor a load that read
// before an invalidation can write its value over a newer one, and a value read after every
// write and invalidation is not refused because the value written meanwhile has expired.
//
// A fence exists only while a key is being filled or has a value: a read that may lead to a fill
// creates it with the lease as its time to live, the watchdog keeps it alive with the lock, and
// a fill gives it the value's. When it is created it starts from the server's clock in
// microseconds, so a fence that expired and was created again is above every one handed out
// before it. Invalidating a key that nobody fills creates nothing: Redis holds no state per
// invalidation.

/// The server's clock in Lua, for the scripts that read it: `t` (its `TIME`) and `now` (ms).
macro_rules! now_ms {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"
    };
}

/// `order::moved_fence` in Lua, for the scripts that move a key's fence: `move(fk, current,
/// stamp, keep)` moves the fence `fk` (whose value is `current`, or none) on by one, to at least
/// `stamp` (µs on the server's clock); a fence created here starts from the clock (`micros`, the
/// script's `TIME` in µs), as `READ_OR_LOCK` creates one. It keeps the fence's time to live, and
/// makes it at least `keep` ms when given (`FILL`: the value's), in the same `SET`, with the
/// commands an ACL user of the README already has (`SET ... KEEPTTL` would need Redis 6). Numbers
/// are formatted whole: a µs count is above what Lua prints in full.
macro_rules! move_fence {
    () => {
        r"
local function move(fk, current, stamp, keep)
  local pttl = redis.call('PTTL', fk)
  local fence = string.format('%.0f', math.max((tonumber(current) or micros) + 1, stamp))
  pttl = math.max(pttl, keep or 0)
  if pttl > 0 then
    redis.call('SET', fk, fence, 'PX', pttl)
  else
    redis.call('SET', fk, fence)
  end
end
"
    };
}

/// A value's read in Lua, for the scripts that return one: `read_value(key, most)` is the value
/// of `key` and `0`, or `false` and `1` when it is longer than `most` bytes (it stays on the
/// server: unusable), or `false` and `0` when there is none. `STRLEN` first, so that neither a
/// missing value nor one too long is read.
macro_rules! read_value {
    () => {
        r"
local function read_value(key, most)
  local length = redis.call('STRLEN', key)
  if length > most then
    return false, 1
  elseif length > 0 then
    -- No envelope is empty: 0 is a missing key.
    return redis.call('GET', key), 0
  end
  return false, 0
end
"
    };
}

/// Reads each value if it is fresh, and nothing else: a call's read on its own task, which
/// serves a fresh value and leaves anything else to the key's flight (`READ_OR_LOCK`).
///
/// KEYS: the value keys. ARGV: the largest value to return, in bytes (a larger one stays on the
/// server, and is answered as nil).
///
/// Returns `{now_ms, value or nil, ...}`, one value per key.
pub(crate) static READ_FRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        read_value!(),
        r"
local out = {now}
local most = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local value = read_value(key, most)
  local fresh = value and tonumber(string.match(value, '^S3 (%d+) '))
  if fresh and fresh > now then
    out[i + 1] = value
  else
    out[i + 1] = false
  end
end
return out
",
    ))
});

/// Reads each value and, for each that is not fresh (or is unusable), makes sure the key has a
/// fence and, with a token, tries to take its lock.
///
/// KEYS: value, lock, fence of each key. ARGV: token (empty: take no lock), lease ms, the
/// largest value to return in bytes (a larger one stays on the server and is unusable), then
/// per key `1` to treat a present value as unusable.
///
/// Returns `{now_ms, then per key: value or nil, state, fence, lock_pttl, oversized (0 or 1)}`
/// where state is `fresh`, `locked` (this caller holds the lock now, with the fence returned),
/// `busy` (another holder has it) or `nolock`.
pub(crate) static READ_OR_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        read_value!(),
        r"
local token = ARGV[1]
local lease = ARGV[2]
local most = tonumber(ARGV[3])
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local vk, lk, fk = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local value, oversized = read_value(vk, most)
  local state, fence, pttl = false, 0, 0
  if value and ARGV[4 + i] ~= '1' then
    local fresh = tonumber(string.match(value, '^S3 (%d+) '))
    if fresh and fresh > now then
      state = 'fresh'
    end
  end
  if not state then
    fence = redis.call('GET', fk)
    if not fence then
      fence = t[1] .. string.format('%06d', tonumber(t[2]))
      redis.call('SET', fk, fence, 'PX', lease)
    elseif redis.call('PTTL', fk) < tonumber(lease) then
      redis.call('PEXPIRE', fk, lease)
    end
    if token == '' then
      state = 'nolock'
    elseif redis.call('SET', lk, token, 'NX', 'PX', lease) then
      state = 'locked'
      fence = redis.call('INCR', fk)
    else
      state = 'busy'
      pttl = redis.call('PTTL', lk)
    end
  end
  out[#out + 1] = value or false
  out[#out + 1] = state
  out[#out + 1] = fence
  out[#out + 1] = pttl
  out[#out + 1] = oversized
end
return out
",
    ))
});

/// Writes each envelope if `order::fill_lands` lets it (and the value stored has no newer source
/// version), moving the key's fence on to at least its stamp; publishes it on the key's channel
/// (an empty message when nothing was written, so that waiters read again at once), and
/// releases the key's lock if the token still holds it (compare-and-delete).
///
/// KEYS: value, lock, fence of each key. ARGV: the publishing command (`SPUBLISH` on a cluster,
/// else `PUBLISH`), the largest value to return in bytes, then per key 10 values: token (empty:
/// the key was loaded without the lock), fresh ms, stale ms, load ms, the fence read (empty for
/// a prime: written whatever the fence, which it moves on), the payload, the channel, how long
/// to keep the value past its stale deadline (the cache's `fail_safe`, ms), the value's source
/// version (decimal; empty for none), the server's time (ms) when the value was read from the
/// source (the start of the attempt that gave it, after the read that gave the fence).
///
/// Returns `{now_ms, then per key: written, fresh_until, stale_until, stored}`: written is 1,
/// or 0 when the fill is refused (`order::fill_lands`), or 2 when the value stored has a newer
/// source version; when nothing was written, `stored` is the value Redis holds (nil when none,
/// or over the size given).
///
/// Over a stored value, a fill lands exactly when that value's source was read before this
/// load's (`order::may_be_newer` of the two reads is false: another load began since and has
/// not filled, a prime came while the first attempt stalled and a retry read the source after
/// it, or a slower load that read earlier filled after this one read), whatever the fence: a
/// stored value was read after the last invalidation (which deleted what was there), so a value
/// read after it is too, and the load that moved the fence is fenced off in turn and gets this
/// value unless its own is newer. Otherwise the stored value stays, and it is what the refused
/// load's callers get: what Redis keeps is what they are handed. When nothing is stored and the
/// fence moved, a refused load's callers get its own value, which Redis does not keep. A value
/// expired since it was written (`expire`, the fence 0 in its envelope) orders a fill as nothing
/// does, but a fill newer than it that may not land anew is written no longer fresh, carrying
/// the fence 0 too (`order::Landing::Expired`): the newest read is the key's last good value,
/// and nothing read before the expiry is fresh.
pub(crate) static FILL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local micros = tonumber(t[1]) * 1000000 + tonumber(t[2])
",
        move_fence!(),
        read_value!(),
        r"
local publish = ARGV[1]
local most = tonumber(ARGV[2])
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local vk, lk, fk = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local a = 2 + 10 * i
  local token, fence, channel, version = ARGV[a + 1], ARGV[a + 5], ARGV[a + 7], ARGV[a + 9]
  if token ~= '' and redis.call('GET', lk) == token then
    redis.call('DEL', lk)
  end
  local refused, expired = false, false
  if version ~= '' then
    local have = string.match(redis.call('GETRANGE', vk, 0, 160), '^S3 %d+ %d+ %d+ %d+ %d+ %d+ (%d+)\n')
    if have and (#have > #version or (#have == #version and have > version)) then
      refused = 2
    end
  end
  local current = redis.call('GET', fk)
  if not refused and fence ~= '' then
    -- `order::fill_lands`: over a stored value, exactly when that value's source was read
    -- before this load's; over nothing (or a value expired since it was written), under the
    -- fence read, or when this load's source was read after the fence's stamp (every write,
    -- invalidation and expiry of the key since).
    -- A value expired (`expire`) carries the fence 0: ordered as nothing stored, but a fill
    -- newer than it that may not land anew lands expired (`order::Landing::Expired`).
    local from = tonumber(ARGV[a + 10])
    local stored, carried = string.match(redis.call('GETRANGE', vk, 0, 160), '^S3 %d+ %d+ %d+ (%d+) (%d+) ')
    stored = tonumber(stored)
    if stored and carried ~= '0' then
      if stored >= from then
        refused = 0
      end
    elseif current ~= fence and not (current and from * 1000 > tonumber(current)) then
      if stored and stored < from then
        expired = true
      else
        refused = 0
      end
    end
  end
  if refused then
    redis.call(publish, channel, '')
    local stored = read_value(vk, most)
    out[#out + 1] = refused
    out[#out + 1] = 0
    out[#out + 1] = 0
    out[#out + 1] = stored
  else
    local fresh = now + tonumber(ARGV[a + 2])
    local stale = fresh + tonumber(ARGV[a + 3])
    local ttl = math.max(1, stale - now + tonumber(ARGV[a + 8]))
    if expired then
      fresh, stale = now, math.min(stale, now + tonumber(ARGV[a + 3]))
    end
    if version == '' then
      version = '-'
    end
    -- A prime's source is read now; a load's no later than now. Its stamp, in µs.
    local read, stamp = now, micros
    if fence ~= '' then
      read = math.min(now, tonumber(ARGV[a + 10]))
      stamp = read * 1000
    end
    -- The envelope carries the fence it was written over, which moves on to at least the
    -- value's stamp (`order::moved_fence`).
    fence = tonumber(current) or micros
    -- The fence lives at least as long as the value.
    move(fk, current, stamp, ttl)
    if expired then
      fence = 0
    end
    local envelope = string.format('S3 %.0f %.0f %.0f %.0f %.0f %s %s\n', fresh, stale, now, read, fence, ARGV[a + 4], version) .. ARGV[a + 6]
    redis.call('SET', vk, envelope, 'PX', ttl)
    redis.call(publish, channel, envelope)
    out[#out + 1] = 1
    out[#out + 1] = fresh
    out[#out + 1] = stale
    out[#out + 1] = false
  end
end
return out
",
    ))
});

/// Each lock the token still holds is deleted (compare-and-
/// delete), and an empty message published on its key's channel so that waiters read again at
/// once instead of at the end of the lease.
///
/// KEYS: the locks. ARGV: token, the publishing command, then each key's channel.
///
/// Returns how many locks were released.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local released = 0
for i, lk in ipairs(KEYS) do
  if redis.call('GET', lk) == ARGV[1] then
    redis.call('DEL', lk)
    redis.call(ARGV[2], ARGV[2 + i], '')
    released = released + 1
  end
end
return released
",
    )
});

/// Renews each lock's lease if the token still holds it (compare-and-pexpire), and keeps the
/// key's fence alive as long.
///
/// KEYS: lock, fence of each key. ARGV: token, lease ms.
///
/// Returns how many leases were renewed.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local extended = 0
for i = 0, #KEYS / 2 - 1 do
  local lk, fk = KEYS[2 * i + 1], KEYS[2 * i + 2]
  if redis.call('GET', lk) == ARGV[1] then
    if redis.call('PTTL', fk) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', fk, ARGV[2])
    end
    extended = extended + redis.call('PEXPIRE', lk, ARGV[2])
  end
end
return extended
",
    )
});

/// Keeps each key's fence alive (as long as a lease) for a load that runs without the lock
/// (`lock = "local"`, `busy = "compute"`, a wait that ran out) while it is still the one the
/// load read: its fill is written only over that fence.
///
/// KEYS: the fence of each key. ARGV: lease ms, then each key's fence as read, in KEYS' order.
///
/// Returns how many fences were still the ones read.
pub(crate) static KEEP_FENCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kept = 0
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    if redis.call('PTTL', key) < lease then
      redis.call('PEXPIRE', key, lease)
    end
    kept = kept + 1
  end
end
return kept
",
    )
});

/// `expire(vk, now)` in Lua (`Entry::expire`'s rule): the envelope under `vk` (see `envelope`)
/// is no longer fresh from `now` (ms on the server's clock) on, and stale for its own stale
/// window at most (its stale deadline less its fresh one), never past its stale deadline; its
/// payload, its source read and its time to live stay, and the fence it carries becomes 0
/// (`envelope::EXPIRED`): `FILL` orders a fill over it as over nothing (`order::fill_lands`),
/// so that a load that read the source before the expiry does not replace it. Returns 1 if it
/// held an envelope.
macro_rules! expire_lua {
    () => {
        r"
local function expire(vk, now)
  local value = redis.call('GET', vk)
  local fresh, stale, written, read, rest =
    string.match(value or '', '^S3 (%d+) (%d+) (%d+) (%d+) %d+( .*)$')
  if not fresh then
    return 0
  end
  local pttl = redis.call('PTTL', vk)
  fresh, stale = tonumber(fresh), tonumber(stale)
  stale = math.min(stale, now + math.max(0, stale - fresh))
  fresh = math.min(fresh, now)
  local header = string.format('S3 %.0f %.0f %s %s 0', fresh, stale, written, read)
  redis.call('SET', vk, header .. rest)
  if pttl > 0 then
    redis.call('PEXPIRE', vk, pttl)
  end
  return 1
end
"
    };
}

/// Deletes the value, or only ends its fresh time (`expire_lua!`: the companion's `expire`),
/// moves the fence on to at least now if the key has one (so a load that read the source
/// before cannot write back; a key nobody fills gets no state), and announces
/// the invalidation to every process (`announce_lua!`). KEYS: value, fence, and when it
/// announces, the feed's log. ARGV: the invalidation channel (empty: announce nothing: a tag's
/// invalidation announces itself once, and on a cluster the announcement follows on the feed's
/// master), the message, the log's length, whether to expire (empty: delete). Returns 1 if a
/// value was deleted (or expired).
pub(crate) static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        r"
local t = redis.call('TIME')
local micros = tonumber(t[1]) * 1000000 + tonumber(t[2])
",
        move_fence!(),
        announce_lua!(),
        expire_lua!(),
        r"
local deleted
if ARGV[4] == '' then
  deleted = redis.call('DEL', KEYS[1])
else
  deleted = expire(KEYS[1], math.floor(micros / 1000))
end
local current = redis.call('GET', KEYS[2])
if current then
  move(KEYS[2], current, micros)
end
if ARGV[1] ~= '' then
  announce(KEYS[3], 'PUBLISH', ARGV[1], ARGV[2], ARGV[3])
end
return deleted
",
    ))
});

/// Registers an identity under its cache's name (see `keys::shapes_key`), until at least
/// `keep` from now, and forgets the name's registrations that ran out. KEYS: the name's set.
/// ARGV: the identity, keep (ms).
pub(crate) static REGISTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
local keep = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local until_ms = now + keep
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held or tonumber(held) < until_ms then
  redis.call('ZADD', KEYS[1], string.format('%d', until_ms), ARGV[1])
end
if redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return 1
",
    ))
});

/// The identities registered under a cache's name that have not run out. KEYS: the name's set.
pub(crate) static SHAPES: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        now_ms!(),
        r"
return redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%d', now), '+inf')
",
    ))
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

/// Copies every key base of a tag's set into its pending set, and returns the pending bases:
/// this invalidation's and those of one that failed midway. The set keeps its members until it
/// expires with the values it stands for: a load tagged before this invalidation may read its
/// source after it and write its value (`order::fill_lands`), and the tag's next invalidation
/// must still find that key. KEYS: the tag's set, its pending set.
pub(crate) static TAKE_TAGGED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('SUNIONSTORE', KEYS[2], KEYS[2], KEYS[1])
  if ttl > 0 and redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return redis.call('SMEMBERS', KEYS[2])
",
    )
});

#[cfg(test)]
mod tests;
