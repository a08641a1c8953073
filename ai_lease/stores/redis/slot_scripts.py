"""The Redis store's slot scripts: one per slot operation, on one limit's keys.

Every key of a limit shares the hash tag ``{<ns>:slot:<limit>}`` (:func:`~ai_lease.stores.
redis.keys.slot_keys`), so each script touches one Cluster slot. Times are microseconds of
the server's clock. A waiter's order is one score: ``(100 - priority) * 10^12 + number``,
its number from the limit's counter (the tokens' too), so a higher priority sorts first and
then the first to ask. A weighted holder's units are in the ``weights`` hash (only a weight
above 1; the field ``''`` holds their sum less one each), so the units in use are the holders
counted plus that sum. Each script is safe to run twice (a resend after a lost reply): a
holder asking again gets its own slot back, a waiter keeps its place.
"""

from __future__ import annotations

from ai_lease.stores.redis.prelude import PRELUDE

__all__ = [
    "ACQUIRE_SLOT",
    "PAUSE_SLOT",
    "RELEASE_SLOT",
    "RENEW_SLOT",
    "REWEIGH_SLOT",
    "SLOT_STATE",
]

_COMMON = r"""
-- A holder gone: its weight (above 1) out of the weights and their sum.
local function unweigh(owner)
  local w = redis.call('HGET', KEYS[8], owner)
  if w then
    redis.call('HDEL', KEYS[8], owner)
    redis.call('HINCRBY', KEYS[8], '', 1 - tonumber(w))
  end
end
-- Reclaim the lapsed slots and drop the waiters that stopped asking.
local function sweep(kh, kt, kw, ko, now)
  local gone = redis.call('ZRANGEBYSCORE', kh, '-inf', fmt(now))
  for _, o in ipairs(gone) do redis.call('HDEL', kt, o); unweigh(o) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', kh, '-inf', fmt(now)) end
  local left = redis.call('ZRANGEBYSCORE', kw, '-inf', fmt(now))
  for _, o in ipairs(left) do redis.call('ZREM', ko, o) end
  if #left > 0 then redis.call('ZREMRANGEBYSCORE', kw, '-inf', fmt(now)) end
  return #gone
end
-- Every key of the limit lives at least ms longer (an idle limit's keys go by themselves).
local function keep(ms)
  for _, i in ipairs({1, 2, 3, 4, 5, 8}) do
    local t = redis.call('PTTL', KEYS[i])
    if t == -1 or (t >= 0 and t < ms) then redis.call('PEXPIRE', KEYS[i], ms) end
  end
end
-- The holder's token and lease expiry, if owner holds a slot (lapsed or not).
local function held(owner)
  local token = redis.call('HGET', KEYS[2], owner)
  if not token then return nil, 0 end
  return token, num(redis.call('ZSCORE', KEYS[1], owner))
end
"""

# KEYS: holders, tokens, waiting, order, counter, wake, paused, weights · ARGV: owner, capacity,
# ttl (us), wait_ttl (us), priority, keep (ms), weight · returns {'granted', token, expires
# (us), now (us)} or {'wait', ahead, in_use (units), now (us), paused (ms left, 0: not paused)}
ACQUIRE_SLOT = (
    PRELUDE
    + _COMMON
    + r"""
local now, owner, cap = now_us(), ARGV[1], tonumber(ARGV[2])
local ttl, wttl, prio = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now)
keep(tonumber(ARGV[6]))
local token = held(owner)
if token then  -- asked again (a lost reply): its own slot, renewed
  redis.call('ZADD', KEYS[1], fmt(now + ttl), owner)
  return {'granted', token, fmt(now + ttl), fmt(now)}
end
local w = tonumber(ARGV[7])
local in_use = redis.call('ZCARD', KEYS[1]) + (tonumber(redis.call('HGET', KEYS[8], '')) or 0)
local score = redis.call('ZSCORE', KEYS[4], owner)
local ahead
if score then
  ahead = redis.call('ZRANK', KEYS[4], owner)
else  -- a newcomer comes after every waiter of its priority or a higher one
  ahead = redis.call('ZCOUNT', KEYS[4], '-inf', fmt((101 - prio) * 1000000000000 - 1))
end
local paused = redis.call('PTTL', KEYS[7])
if paused < 0 then paused = 0 end
if paused == 0 and (w == 1 or ahead == 0) and ahead + w <= cap - in_use then
  redis.call('ZREM', KEYS[4], owner)
  redis.call('ZREM', KEYS[3], owner)
  token = redis.call('INCR', KEYS[5])
  redis.call('HSET', KEYS[2], owner, token)
  if w > 1 then
    redis.call('HSET', KEYS[8], owner, w)
    redis.call('HINCRBY', KEYS[8], '', w - 1)
  end
  redis.call('ZADD', KEYS[1], fmt(now + ttl), owner)
  return {'granted', tostring(token), fmt(now + ttl), fmt(now)}
end
if not score then
  score = fmt((100 - prio) * 1000000000000 + redis.call('INCR', KEYS[5]))
end
redis.call('ZADD', KEYS[4], score, owner)
redis.call('ZADD', KEYS[3], fmt(now + wttl), owner)
return {'wait', ahead, in_use, fmt(now), paused}
"""
)

# KEYS: paused · ARGV: ms · returns the ms the pause now lasts (a later end already set stays)
PAUSE_SLOT = r"""
local left, ms = redis.call('PTTL', KEYS[1]), tonumber(ARGV[1])
if left >= ms then return left end
redis.call('SET', KEYS[1], '1', 'PX', ms)
return ms
"""

# KEYS: holders, tokens, waiting, order, counter, wake, paused, weights · ARGV: owner, token,
# ttl (us), keep (ms) · returns {1 renewed | 0 lapsed or stale, expires (us), now (us)}. A
# lapsed slot of this fence is reclaimed here (and its waiters woken); a stale fence touches
# nothing.
RENEW_SLOT = (
    PRELUDE
    + _COMMON
    + r"""
local now, owner = now_us(), ARGV[1]
local token, expires = held(owner)
if token ~= ARGV[2] then return {0, '', fmt(now)} end
if expires <= now then
  redis.call('HDEL', KEYS[2], owner)
  redis.call('ZREM', KEYS[1], owner)
  unweigh(owner)
  redis.call('PUBLISH', KEYS[6], 'lapsed')
  return {0, '', fmt(now)}
end
redis.call('ZADD', KEYS[1], fmt(now + tonumber(ARGV[3])), owner)
keep(tonumber(ARGV[4]))
return {1, fmt(now + tonumber(ARGV[3])), fmt(now)}
"""
)

# KEYS: holders, tokens, waiting, order, counter, wake, paused, weights · ARGV: owner, token
# ('': the owner gave up: its place in line and any slot it holds go) · returns 1 when a live
# slot of this fence was freed, else 0 (a stale fence frees nothing). Whatever is freed wakes
# the waiters.
RELEASE_SLOT = (
    PRELUDE
    + _COMMON
    + r"""
local now, owner = now_us(), ARGV[1]
local token, expires = held(owner)
local freed = 0
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[3], owner)
  freed = redis.call('ZREM', KEYS[4], owner)
  if not token then
    if freed > 0 then redis.call('PUBLISH', KEYS[6], 'left') end
    return 0
  end
elseif token ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[2], owner)
redis.call('ZREM', KEYS[1], owner)
unweigh(owner)
redis.call('PUBLISH', KEYS[6], 'released')
if expires > now then return 1 end
return 0
"""
)

# KEYS: holders, waiting, weights · ARGV: none · returns {live holders' units, live waiters}
SLOT_STATE = (
    PRELUDE
    + r"""
local now = fmt(now_us())
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local units = #live
if redis.call('HLEN', KEYS[3]) > 0 then
  for _, o in ipairs(live) do
    local w = redis.call('HGET', KEYS[3], o)
    if w then units = units + tonumber(w) - 1 end
  end
end
return {units, redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
"""
)

# KEYS: holders, tokens, waiting, order, counter, wake, paused, weights · ARGV: owner, token,
# weight · returns 1 when the fence's live slot now takes weight units, else 0 (lapsed or
# stale: nothing changes). Fewer units wake the waiters.
REWEIGH_SLOT = (
    PRELUDE
    + _COMMON
    + r"""
local now, owner, w = now_us(), ARGV[1], tonumber(ARGV[3])
local token, expires = held(owner)
if token ~= ARGV[2] or expires <= now then return 0 end
local old = tonumber(redis.call('HGET', KEYS[8], owner)) or 1
if w > 1 then redis.call('HSET', KEYS[8], owner, w) else redis.call('HDEL', KEYS[8], owner) end
redis.call('HINCRBY', KEYS[8], '', w - old)
if w < old then redis.call('PUBLISH', KEYS[6], 'reweighed') end
return 1
"""
)
