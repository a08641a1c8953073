"""The Redis store's scripts for the jobs' lifecycle for people (``ai-lease retry`` / ``rm``
/ ``prune``): one round trip each, keys and replies as in :mod:`ai_lease.stores.redis.scripts`."""

from __future__ import annotations

from ai_lease.stores.redis.prelude import PRELUDE

__all__ = ["PRUNE", "REMOVE", "RETRY"]

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: job key (the queue's member)
# returns {now, fields...} (no fields when the job is unknown). A FAILED or CANCELLED job goes
# back to PENDING with a fresh attempt budget (rules.retry): attempts 0, no owner, no lease,
# its deadlines restarted, no checkpoint, due for workers at once; any other job is returned
# unchanged.
RETRY = (
    PRELUDE
    + r"""
local k = KEYS[1]
local v = redis.call('HMGET', k, 'schema', 'status', 'indexed')
local ok = ours(k, v[1])
if type(ok) == 'table' then return ok end
local now = now_us()
if not ok then return {fmt(now)} end
local status = v[2]
if status == 'FAILED' or status == 'CANCELLED' then
  redis.call('HSET', k, 'status', 'PENDING', 'attempts', '0', 'owner_id', '',
    'lease_expires_at', '', 'started_at', '', 'created_at', fmt(now), 'updated_at', fmt(now))
  redis.call('HDEL', k, 'checkpoint', 'failure_kind')
  unindex(k)
  recount(KEYS[7], KEYS[8], k, status, 'PENDING', v[3])
  if KEYS[7] then redis.call('ZADD', KEYS[7], 'XX', fmt(now), k) end  -- created again: now
  if KEYS[5] then
    redis.call('ZADD', KEYS[5], string.format('%.6f', now / 1000000), ARGV[1])
    redis.call('ZREM', KEYS[6], ARGV[1])
  end
  redis.call('PUBLISH', KEYS[2], 'PENDING')
end
return {fmt(now), unpack(redis.call('HGETALL', k))}
"""
)

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: job key (the queue's member),
# force ('1': even a RUNNING job under a live lease)
# returns {now} (no such job) | {now, 'removed' | 'kept', fields...}: the record as it was.
# A removed job's hash and its entries in the lease index, queue, recovery looks and creation
# index (and its count) go in one step (rules.removable); its followers wake (they find no job).
REMOVE = (
    PRELUDE
    + r"""
local k = KEYS[1]
local v = redis.call('HMGET', k, 'schema', 'status', 'lease_expires_at')
local ok = ours(k, v[1])
if type(ok) == 'table' then return ok end
local now = now_us()
local function forget()
  unindex(k)
  uncreated(KEYS[7], KEYS[8], k, v[2], KEYS[9])
  if KEYS[5] then
    redis.call('ZREM', KEYS[5], ARGV[1])
    redis.call('ZREM', KEYS[6], ARGV[1])
  end
end
if not ok then
  forget()
  redis.call('DEL', KEYS[3])
  return {fmt(now)}
end
local was = redis.call('HGETALL', k)
if ARGV[2] ~= '1' and v[2] == 'RUNNING' and num(v[3]) > now then
  return {fmt(now), 'kept', unpack(was)}
end
redis.call('DEL', k, KEYS[3])
forget()
redis.call('PUBLISH', KEYS[2], 'REMOVED')
return {fmt(now), 'removed', unpack(was)}
"""
)

# KEYS: job hashes... (n of them), their timelines (n, in the same order)[, lease index,
# queue, recovery looks, created, counts, names] (standalone: a batch and the namespace's
# keys; on Cluster one job hash and its timeline alone) · ARGV: older than (microseconds),
# statuses (',' between), n, job keys... (the queue's members, in the order of the hashes)
# returns the number removed: each job one of the statuses (terminal ones) and last written
# more than ARGV[1] ago by the server's clock (rules.prunable); a hash not ours is left alone.
PRUNE = (
    PRELUDE
    + r"""
local cutoff, n, wanted = now_us() - tonumber(ARGV[1]), tonumber(ARGV[3]), {}
for s in string.gmatch(ARGV[2], '[^,]+') do wanted[s] = true end
local leases, queue, looks = KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3]
local ci, cc, cn = KEYS[2 * n + 4], KEYS[2 * n + 5], KEYS[2 * n + 6]
local removed = 0
for i = 1, n do
  local k = KEYS[i]
  local v = redis.call('HMGET', k, 'schema', 'status', 'updated_at', 'created_at')
  local written = tonumber((v[3] and v[3] ~= '') and v[3] or (v[4] or ''))
  if v[1] == '1' and ended(v[2]) and wanted[v[2]] and written and written < cutoff then
    redis.call('DEL', k, KEYS[n + i])
    if leases then
      redis.call('ZREM', leases, k)
      redis.call('ZREM', queue, ARGV[3 + i])
      redis.call('ZREM', looks, ARGV[3 + i])
      uncreated(ci, cc, k, v[2], cn)
    end
    removed = removed + 1
  end
end
return removed
"""
)
