//! The Lua scripts of a batch: the single-key scripts of `redis::scripts` (`READ_FRESH`,
//! `READ_OR_LOCK`, `FILL`, `RELEASE`, `EXTEND`) run over many keys in one round trip, each key
//! exactly as its single-key script treats it (see there for the fence's rules). A script's
//! keys all share one Redis Cluster slot: on a cluster a batch runs one script per slot.

use std::sync::LazyLock;

use redis::Script;

/// `READ_FRESH` of many keys: each value that is fresh by the server's clock.
///
/// KEYS: the value keys.
///
/// Returns `{now_ms, value or nil, ...}`, one value per key.
pub(crate) static READ_FRESH_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  local fresh = value and tonumber(string.match(value, '^S1 (%d+) '))
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
/// KEYS: value, lock, fence of each key. ARGV: token (empty: take no lock), lease ms, then per
/// key `1` to treat a present value as unusable.
///
/// Returns `{now_ms, then per key: value or nil, state, fence, lock_pttl}` with the states of
/// `READ_OR_LOCK`: `fresh`, `locked`, `busy`, `nolock`.
pub(crate) static READ_OR_LOCK_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local lease = ARGV[2]
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local vk, lk, fk = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local value = redis.call('GET', vk)
  local state, fence, pttl = false, 0, 0
  if value and ARGV[3 + i] ~= '1' then
    local fresh = tonumber(string.match(value, '^S1 (%d+) '))
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
end
return out
",
    )
});

/// `FILL` of many keys: each envelope written unless its key's fence moved since its read,
/// published on its channel (an empty message when not written), and its lock released if the
/// token still holds it.
///
/// KEYS: value, lock, fence of each key. ARGV: the publishing command, then per key 8 values:
/// token (empty: the key was loaded without the lock), fresh ms, stale ms, load ms, the fence
/// read, the payload, the channel, how long to keep the value past its stale deadline (ms).
///
/// Returns `{now_ms, then per key: written (0 or 1), fresh_until, stale_until}`.
pub(crate) static FILL_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local publish = ARGV[1]
local out = {now}
for i = 0, #KEYS / 3 - 1 do
  local vk, lk, fk = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local a = 1 + 8 * i
  local token, fence, channel = ARGV[a + 1], ARGV[a + 5], ARGV[a + 7]
  if token ~= '' and redis.call('GET', lk) == token then
    redis.call('DEL', lk)
  end
  if redis.call('GET', fk) ~= fence then
    redis.call(publish, channel, '')
    out[#out + 1] = 0
    out[#out + 1] = 0
    out[#out + 1] = 0
  else
    if token == '' then
      redis.call('INCR', fk)
    end
    local fresh = now + tonumber(ARGV[a + 2])
    local stale = fresh + tonumber(ARGV[a + 3])
    local envelope = string.format('S1 %.0f %.0f %.0f %s %s\n', fresh, stale, now, fence, ARGV[a + 4]) .. ARGV[a + 6]
    local ttl = math.max(1, stale - now + tonumber(ARGV[a + 8]))
    redis.call('SET', vk, envelope, 'PX', ttl)
    if redis.call('PTTL', fk) < ttl then
      redis.call('PEXPIRE', fk, ttl)
    end
    redis.call(publish, channel, envelope)
    out[#out + 1] = 1
    out[#out + 1] = fresh
    out[#out + 1] = stale
  end
end
return out
",
    )
});

/// `RELEASE` of many keys: each lock the token still holds is deleted, and an empty message
/// published on its key's channel so that waiters read again at once.
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
