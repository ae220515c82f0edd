//! The Lua scripts of a batch: the single-key scripts of `redis::scripts` (`READ_FRESH`,
//! `READ_OR_LOCK`, `FILL`, `EXTEND`) run over many keys in one round trip, each key exactly as
//! its single-key script treats it (see there for the fence's rules); and the one release, of
//! one key or many (`RELEASE_MANY`). A script's
//! keys all share one Redis Cluster slot: on a cluster a batch runs one script per slot.

use std::sync::LazyLock;

use redis::Script;

/// `READ_FRESH` of many keys: each value that is fresh by the server's clock.
///
/// KEYS: the value keys. ARGV: the largest value to return, in bytes (a larger one stays on the
/// server, and is answered as nil).
///
/// Returns `{now_ms, value or nil, ...}`, one value per key.
pub(crate) static READ_FRESH_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local most = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local value = false
  if redis.call('STRLEN', key) <= most then
    value = redis.call('GET', key)
  end
  local fresh = value and tonumber(string.match(value, '^S2 (%d+) '))
  if fresh and fresh > now then
    out[i + 1] = value
  else
    out[i + 1] = false
  end
end
return out
",
    )
});

/// `READ_OR_LOCK` of many keys: each value, and for each that is not fresh (or is unusable)
/// the key's fence and, with a token, its lock.
///
/// KEYS: value, lock, fence of each key. ARGV: token (empty: take no lock), lease ms, the
/// largest value to return in bytes (a larger one stays on the server and is unusable), then
/// per key `1` to treat a present value as unusable.
///
/// Returns `{now_ms, then per key: value or nil, state, fence, lock_pttl, oversized (0 or 1)}`
/// with the states of `READ_OR_LOCK`: `fresh`, `locked`, `busy`, `nolock`.
pub(crate) static READ_OR_LOCK_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local lease = ARGV[2]
local most = tonumber(ARGV[3])
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local vk, lk, fk = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local value, oversized = false, 0
  if redis.call('STRLEN', vk) > most then
    oversized = 1
  else
    value = redis.call('GET', vk)
  end
  local state, fence, pttl = false, 0, 0
  if value and ARGV[4 + i] ~= '1' then
    local fresh = tonumber(string.match(value, '^S2 (%d+) '))
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
    )
});

/// `FILL` of many keys: each envelope written unless the value stored has a newer source
/// version or its key's fence moved since its read, published on its channel (an empty message
/// when not written), and its lock released if the token still holds it.
///
/// KEYS: value, lock, fence of each key. ARGV: the publishing command, the largest value to
/// return in bytes, then per key 10 values: token (empty: the key was loaded without the lock),
/// fresh ms, stale ms, load ms, the fence read, the payload, the channel, how long to keep the
/// value past its stale deadline (ms), the value's source version (decimal; empty for none),
/// the server's time (ms) when the value was read from the source. A refused key's older value
/// is deleted as `FILL` deletes it.
///
/// Returns `{now_ms, then per key: written, fresh_until, stale_until, stored}` with `FILL`'s
/// written (1; 0 when the fence moved; 2 when the value stored has a newer source version);
/// when nothing was written, `stored` is the value Redis holds (nil when none, or over the size
/// given).
pub(crate) static FILL_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  local refused = false
  if version ~= '' then
    local have = string.match(redis.call('GETRANGE', vk, 0, 160), '^S2 %d+ %d+ %d+ %d+ %d+ (%d+)\n')
    if have and (#have > #version or (#have == #version and have > version)) then
      refused = 2
    end
  end
  if not refused and redis.call('GET', fk) ~= fence then
    refused = 0
    local written = tonumber(string.match(redis.call('GETRANGE', vk, 0, 160), '^S2 %d+ %d+ (%d+) '))
    if written and written < tonumber(ARGV[a + 10]) then
      redis.call('DEL', vk)
    end
  end
  if refused then
    redis.call(publish, channel, '')
    local stored = false
    if redis.call('STRLEN', vk) <= most then
      stored = redis.call('GET', vk)
    end
    out[#out + 1] = refused
    out[#out + 1] = 0
    out[#out + 1] = 0
    out[#out + 1] = stored
  else
    if token == '' then
      redis.call('INCR', fk)
    end
    local fresh = now + tonumber(ARGV[a + 2])
    local stale = fresh + tonumber(ARGV[a + 3])
    if version == '' then
      version = '-'
    end
    local envelope = string.format('S2 %.0f %.0f %.0f %s %s %s\n', fresh, stale, now, fence, ARGV[a + 4], version) .. ARGV[a + 6]
    local ttl = math.max(1, stale - now + tonumber(ARGV[a + 8]))
    redis.call('SET', vk, envelope, 'PX', ttl)
    if redis.call('PTTL', fk) < ttl then
      redis.call('PEXPIRE', fk, ttl)
    end
    redis.call(publish, channel, envelope)
    out[#out + 1] = 1
    out[#out + 1] = fresh
    out[#out + 1] = stale
    out[#out + 1] = false
  end
end
return out
",
    )
});

/// `RELEASE` (of one key or many): each lock the token still holds is deleted (compare-and-
/// delete), and an empty message published on its key's channel so that waiters read again at
/// once instead of at the end of the lease.
///
/// KEYS: the locks. ARGV: token, the publishing command, then each key's channel.
///
/// Returns how many locks were released.
pub(crate) static RELEASE_MANY: LazyLock<Script> = LazyLock::new(|| {
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

/// `EXTEND` of many keys: each lock's lease renewed if the token still holds it, and its fence
/// kept alive as long.
///
/// KEYS: lock, fence of each key. ARGV: token, lease ms.
///
/// Returns how many leases were renewed.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| {
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

/// `KEEP_FENCE` of many keys, for a batch's loads without the lock: each key's fence kept alive
/// (as long as a lease) while it is still the one its load read.
///
/// KEYS: the fence of each key. ARGV: lease ms, then each key's fence as read, in KEYS' order.
///
/// Returns how many fences were still the ones read.
pub(crate) static KEEP_FENCE_MANY: LazyLock<Script> = LazyLock::new(|| {
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
