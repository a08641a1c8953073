"""The Redis store's Lua scripts: the rules of :mod:`ai_lease.lease.rules`, one round trip each.

Every script touches only ``KEYS[1]`` (the job's hash, ``<ns>:{<key>}:job``) and publishes on
``KEYS[2]`` (``<ns>:{<key>}:events``); both share the ``{<key>}`` hash tag, so each script is
valid on Redis Cluster. Time is the Redis server's ``TIME`` in microseconds; durations arrive
in microseconds. Numbers are written with ``%d`` because Lua's default number formatting
(``%.14g``) would round 16-digit tokens. A hash without ``schema = 1`` is not ours: the
scripts answer ``AILEASE_CORRUPT`` and change nothing. Each script is safe to run twice
(redis-py may resend after a dropped reply).
"""

from __future__ import annotations

SCHEMA = "1"

_PRELUDE = r"""
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(n) return string.format('%d', n) end
local function num(v)
  if v == false or v == nil or v == '' then return 0 end
  local n = tonumber(v)
  if n == nil then error('AILEASE_CORRUPT a number field holds ' .. string.sub(v, 1, 40)) end
  return n
end
-- Every field but the big ones (spec, result, stall_snapshot): what acquire and a fresh
-- commit send back, so an input or a result never crosses the network twice.
local LEAN = {'schema', 'status', 'owner_id', 'token', 'stage', 'progress_version',
  'heartbeat_at', 'last_progress_at', 'lease_expires_at', 'max_no_progress', 'stall_policy',
  'attempts', 'takeovers', 'missed_renewals', 'last_error', 'fingerprint', 'created_at',
  'updated_at', 'started_at'}
local function lean(k)
  local v = redis.call('HMGET', k, unpack(LEAN))
  local out = {}
  for i, name in ipairs(LEAN) do
    out[#out + 1] = name
    out[#out + 1] = v[i] or ''
  end
  return out
end
local function check(k)
  if redis.call('EXISTS', k) == 0 then return false end
  local s = redis.call('HGET', k, 'schema')
  if s ~= '1' then return redis.error_reply('AILEASE_CORRUPT schema marker is ' .. tostring(s)) end
  return true
end
"""

# KEYS: job, events · ARGV: owner, ttl_us, max_no_progress_us, stall_policy, fingerprint ('' none),
# max_attempts ('' none)
# returns {'acquired', now, takeover(0|1), fields...} | {'following', now, fields...}
#       | {'finished', now, fields...} | {'conflict'} | error AILEASE_CORRUPT
ACQUIRE = (
    _PRELUDE
    + r"""
local k, owner = KEYS[1], ARGV[1]
local ttl, fp, maxatt = tonumber(ARGV[2]), ARGV[5], tonumber(ARGV[6])
local ok = check(k)
if type(ok) == 'table' then return ok end
local now = now_us()
local prev, attempts, takeovers, had_owner, last_error = 0, 0, 0, false, ''
if ok then
  local v = redis.call('HMGET', k, 'status', 'owner_id', 'token', 'lease_expires_at',
    'fingerprint', 'attempts', 'takeovers', 'last_error')
  if fp ~= '' and v[5] and v[5] ~= '' and v[5] ~= fp then return {'conflict'} end
  if v[1] == 'DONE' or v[1] == 'FAILED' then
    return {'finished', fmt(now), unpack(redis.call('HGETALL', k))}
  end
  if v[1] == 'RUNNING' and num(v[4]) > now then
    if v[2] == owner then return {'acquired', fmt(now), 0, unpack(lean(k))} end
    return {'following', fmt(now), unpack(lean(k))}
  end
  prev, attempts, takeovers = num(v[3]), num(v[6]), num(v[7])
  had_owner, last_error = (v[2] and v[2] ~= ''), (v[8] or '')
  if fp ~= '' and (not v[5] or v[5] == '') then redis.call('HSET', k, 'fingerprint', fp) end
else
  redis.call('HSET', k, 'schema', '1', 'created_at', fmt(now), 'fingerprint', fp)
end
if maxatt and attempts >= maxatt then
  if last_error == '' then last_error = 'lease lapsed' end
  redis.call('HSET', k, 'status', 'FAILED', 'lease_expires_at', '', 'updated_at', fmt(now),
    'last_error', 'gave up after ' .. fmt(attempts) .. ' attempts: ' .. last_error)
  redis.call('PUBLISH', KEYS[2], 'FAILED')
  return {'finished', fmt(now), unpack(redis.call('HGETALL', k))}
end
local token = math.max(prev + 1, now)
if had_owner then takeovers = takeovers + 1 end
redis.call('HSET', k, 'status', 'RUNNING', 'owner_id', owner, 'token', fmt(token),
  'stage', '', 'progress_version', '0', 'heartbeat_at', fmt(now), 'last_progress_at', fmt(now),
  'lease_expires_at', fmt(now + ttl), 'max_no_progress', ARGV[3], 'stall_policy', ARGV[4],
  'attempts', fmt(attempts + 1), 'takeovers', fmt(takeovers), 'updated_at', fmt(now))
if (redis.call('HGET', k, 'started_at') or '') == '' then  -- the job deadline starts here
  redis.call('HSET', k, 'started_at', fmt(now))
end
return {'acquired', fmt(now), had_owner and 1 or 0, unpack(lean(k))}
"""
)

_FENCE_CHECK = r"""
local k, owner, token = KEYS[1], ARGV[1], tonumber(ARGV[2])
local ok = check(k)
if type(ok) == 'table' then return ok end
local now = now_us()
local v = redis.call('HMGET', k, 'status', 'owner_id', 'token', 'lease_expires_at')
local mine = num(v[3]) == token and ok and v[2] == owner
"""

# KEYS: job, events · ARGV: owner, token, ttl_us, stage, progress_version, max_no_progress_us,
# grace_us · returns {'ok', lease_remaining_us, stalled(0|1)}
#       | {reason, lease_remaining_us, current_token, current_owner}
RENEW = (
    _PRELUDE
    + _FENCE_CHECK
    + r"""
if not ok then return {'missing', 0, '', ''} end
if not mine then return {'not_owner', 0, v[3] or '', v[2] or ''} end
if v[1] ~= 'RUNNING' then return {'not_running', 0, v[3], v[2]} end
local expires = num(v[4])
if expires <= now then return {'expired', 0, v[3], v[2]} end
local p = redis.call('HMGET', k, 'progress_version', 'last_progress_at', 'stall_policy')
local version, last = num(p[1]), num(p[2])
if last == 0 then last = now end
if tonumber(ARGV[5]) > version then version, last = tonumber(ARGV[5]), now end
redis.call('HSET', k, 'stage', ARGV[4], 'max_no_progress', ARGV[6],
  'progress_version', fmt(version), 'last_progress_at', fmt(last), 'updated_at', fmt(now))
local stalled = (now - last) > (tonumber(ARGV[6]) + tonumber(ARGV[7]))
if stalled then
  redis.call('HINCRBY', k, 'missed_renewals', 1)
  if p[3] ~= 'alert' then return {'no_progress', fmt(expires - now), v[3], v[2]} end
end
redis.call('HSET', k, 'heartbeat_at', fmt(now), 'lease_expires_at', fmt(now + tonumber(ARGV[3])))
return {'ok', ARGV[3], stalled and 1 or 0}
"""
)

# KEYS: job, events · ARGV: owner, token, error ('' keep), snapshot ('' keep),
# interrupted ('1': give the attempt back) · returns 1 | 0
RELEASE = (
    _PRELUDE
    + _FENCE_CHECK
    + r"""
if not mine or v[1] ~= 'RUNNING' then return 0 end
redis.call('HSET', k, 'status', 'PENDING', 'lease_expires_at', fmt(now), 'updated_at', fmt(now))
if ARGV[3] ~= '' then redis.call('HSET', k, 'last_error', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', k, 'stall_snapshot', ARGV[4]) end
if ARGV[5] == '1' then  -- interrupted, not failed: the attempt is handed back
  redis.call('HSET', k, 'attempts', fmt(math.max(0, num(redis.call('HGET', k, 'attempts')) - 1)))
end
redis.call('PUBLISH', KEYS[2], 'PENDING')
return 1
"""
)

# KEYS: job, events · ARGV: owner, token, status (DONE|FAILED), field (result|last_error), value
# returns {'ok', now, fields...} | {'rejected', reason, current_token, current_owner}
FINISH = (
    _PRELUDE
    + _FENCE_CHECK
    + r"""
if not ok then return {'rejected', 'the store holds no record for this job', '', ''} end
if v[1] == 'DONE' or v[1] == 'FAILED' then
  if mine and v[1] == ARGV[3] then return {'ok', fmt(now), unpack(redis.call('HGETALL', k))} end
  local why = 'the job already ended ' .. v[1]
  if v[1] == 'DONE' and ARGV[3] == 'DONE' then
    why = 'another owner already committed its result'
  end
  return {'rejected', why, v[3], v[2]}
end
if not mine then return {'rejected', 'a newer owner took the job over', v[3], v[2]} end
redis.call('HSET', k, 'status', ARGV[3], ARGV[4], ARGV[5], 'lease_expires_at', '',
  'updated_at', fmt(now))
if ARGV[3] == 'DONE' then redis.call('HSET', k, 'stage', 'done') end  -- a final stage
redis.call('PUBLISH', KEYS[2], ARGV[3])
return {'ok', fmt(now), unpack(lean(k))}
"""
)

# KEYS: job, events · ARGV: owner, token, stage, snapshot · returns 1 | 0
REPORT_STALL = (
    _PRELUDE
    + _FENCE_CHECK
    + r"""
if not mine or v[1] == 'DONE' or v[1] == 'FAILED' then return 0 end
redis.call('HSET', k, 'stall_snapshot', ARGV[4], 'stage', ARGV[3], 'updated_at', fmt(now),
  'last_error', string.match(ARGV[4], '^[^\n]*'))
return 1
"""
)

# KEYS: job · returns {now, fields...} (no fields when the job is unknown)
GET = (
    _PRELUDE
    + r"""
local ok = check(KEYS[1])
if type(ok) == 'table' then return ok end
return {fmt(now_us()), unpack(redis.call('HGETALL', KEYS[1]))}
"""
)

# KEYS: job · ARGV: spec, fingerprint · returns {'ok', now, fields...} | {'conflict'}
SUBMIT = (
    _PRELUDE
    + r"""
local k = KEYS[1]
local ok = check(k)
if type(ok) == 'table' then return ok end
local now = now_us()
if ok then
  local v = redis.call('HMGET', k, 'fingerprint', 'spec')
  if v[1] and v[1] ~= '' and v[1] ~= ARGV[2] then return {'conflict'} end
  if not v[2] or v[2] == '' then
    redis.call('HSET', k, 'spec', ARGV[1], 'fingerprint', ARGV[2], 'updated_at', fmt(now))
  end
else
  redis.call('HSET', k, 'schema', '1', 'status', 'PENDING', 'token', '0', 'spec', ARGV[1],
    'fingerprint', ARGV[2], 'created_at', fmt(now), 'updated_at', fmt(now))
end
return {'ok', fmt(now), unpack(redis.call('HGETALL', k))}
"""
)
