"""The Redis store's namespace scripts: the queue, the lease index, the epoch marker, workers.

The job scripts (one per lease operation) are in :mod:`ai_lease.stores.redis.scripts`; these
touch the namespace's own keys, which share the hash tag ``{<ns>:queue}`` (a worker's keys
share ``{<ns>:workers}``), but for ``LOOK``, a worker's look, which is called as a job script
(the job's keys, then the namespace's on a standalone server). Each is safe to run twice.
"""

from __future__ import annotations

from ai_lease.stores.redis.prelude import PRELUDE

_EPOCH = r"""
-- The data-loss marker: KEYS[e] holds this store's epoch id, written at first contact. A
-- caller that saw epoch X and now finds none (or another) knows the data was lost; the
-- first to notice writes a note (KEYS[n], kept 7 days) that later processes read. A look
-- (fresh = '') writes nothing: no marker is epoch ''.
local function epoch(ke, kn, expected, fresh, now)
  local e = redis.call('GET', ke)
  if fresh == '' then
    return {e or '', redis.call('GET', kn) or ''}
  elseif not e then
    e = fresh
    redis.call('SET', ke, e)
    if expected ~= '' then
      redis.call('SET', kn, fmt(now) .. ' ' .. expected .. ' ' .. e, 'PX', 604800000)
    end
  elseif expected ~= '' and e ~= expected and not redis.call('GET', kn) then
    redis.call('SET', kn, fmt(now) .. ' ' .. expected .. ' ' .. e, 'PX', 604800000)
  end
  return {e, redis.call('GET', kn) or ''}
end
"""

# KEYS: epoch, loss note · ARGV: expected epoch ('' none yet), fresh epoch id ('' a look:
# nothing written) · returns {epoch ('' none), note ('' none)}
EPOCH = (
    PRELUDE
    + _EPOCH
    + r"""
return epoch(KEYS[1], KEYS[2], ARGV[1], ARGV[2], now_us())
"""
)

# KEYS: queue, lease index, epoch, loss note · ARGV: limit, expected epoch, fresh epoch id
# returns {epoch, note, n_lapsed, lapsed job hashes..., due job keys...}: jobs whose lease
# lapsed first (at most limit, oldest lapse first; found even without a queue entry), then
# the queue's due keys.
DUE = (
    PRELUDE
    + _EPOCH
    + r"""
local now, limit = now_us(), tonumber(ARGV[1])
local e = epoch(KEYS[3], KEYS[4], ARGV[2], ARGV[3], now)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', fmt(now), 'LIMIT', 0, limit)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now / 1000000),
  'LIMIT', 0, limit)
local out = {e[1], e[2], #lapsed}
for _, name in ipairs(lapsed) do out[#out + 1] = name end
for _, key in ipairs(due) do out[#out + 1] = key end
return out
"""
)

# KEYS: queue, lease index, recovery looks · ARGV: job key, job hash, at (seconds; '' = leave
# the schedule) · returns 1. Any recovery look goes; leaving the schedule also leaves the lease
# index: a worker gave the job up.
RESCHEDULE = r"""
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""

# KEYS: queue, recovery looks · ARGV: job key, at (seconds) · returns 1: a look at a job
# someone owns, when its lease may lapse; it stays visible to DUE as well.
RECOVER_AT = r"""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
"""

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: job key (the queue's member), ttl_us · a worker's look (ai_lease.lease.queue.next_look):
# the record, and its queue entry moved: off the schedule (and the lease index) when there is
# nothing to run (no record, an ended job, no spec), to a live owner's lease expiry, or ttl on
# (the worker is about to run it: its own lease could lapse then). On Cluster the queue is in
# another slot: nothing is moved, the caller moves it by the returned time.
# returns {now, at (seconds, '%.6f'; '' = off the schedule; '-' = a status none of ours:
# nothing moved), fields...} (no fields: unknown)
LOOK = (
    PRELUDE
    + r"""
local all = whole(KEYS[1])
if all.err then return all end
local now, at = now_us(), ''
local f = {}
for i = 1, #all, 2 do f[all[i]] = all[i + 1] end
local known = {PENDING = true, RUNNING = true, DONE = true, FAILED = true, CANCELLED = true}
if #all > 0 and not known[f.status] then  -- not a record of ours: nothing moved
  return {fmt(now), '-', unpack(all)}
end
if #all > 0 and not ended(f.status) and (f.spec or '') ~= '' then
  local expires = tonumber(f.lease_expires_at or '')
  if f.status == 'RUNNING' and expires and expires > now then
    at = string.format('%.6f', expires / 1000000)
  else
    at = string.format('%.6f', (now + tonumber(ARGV[2])) / 1000000)
  end
end
if KEYS[5] then
  if at == '' then
    redis.call('ZREM', KEYS[5], ARGV[1])
    redis.call('ZREM', KEYS[6], ARGV[1])
    unindex(KEYS[1])
  else
    redis.call('ZADD', KEYS[5], at, ARGV[1])
    redis.call('ZADD', KEYS[6], at, ARGV[1])
  end
end
return {fmt(now), at, unpack(all)}
"""
)

# KEYS: recovery looks · ARGV: limit · returns the due recovery looks, longest-due first
DUE_RECOVERIES = (
    PRELUDE
    + r"""
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now_us() / 1000000),
  'LIMIT', 0, tonumber(ARGV[1]))
"""
)

# KEYS: worker, worker index · ARGV: worker id, info JSON (without last_seen), ttl_ms
# returns 1; last_seen is the server's clock
BEAT = (
    PRELUDE
    + r"""
local seen = now_us() / 1000000
local blob = string.sub(ARGV[2], 1, -2) .. ',"last_seen":' .. string.format('%.6f', seen) .. '}'
redis.call('SET', KEYS[1], blob, 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%.6f', seen + tonumber(ARGV[3]) / 1000), ARGV[1])
return 1
"""
)

# KEYS: worker, worker index · ARGV: worker id · returns 1
WORKER_GONE = r"""
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

# KEYS: worker index · ARGV: worker key prefix · returns id, info JSON, id, info JSON, ... of
# the live workers
LIST_WORKERS = (
    PRELUDE
    + r"""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.6f', now_us() / 1000000))
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local blob = redis.call('GET', ARGV[1] .. id)
  if blob then
    out[#out + 1] = id
    out[#out + 1] = blob
  end
end
return out
"""
)

# KEYS: queue, lease index · returns {due, scheduled, live leases, lapsed leases}: counts for
# the metrics (ai_lease/observe/store_metrics.py), read-only, O(log n) each. Due keys and
# lapsed leases are judged by the server's clock, as DUE judges them; a lapsed lease is one
# that expired or was handed back, not yet taken again.
COUNTS = (
    PRELUDE
    + r"""
local now = now_us()
local at, us = string.format('%.6f', now / 1000000), fmt(now)
return {redis.call('ZCOUNT', KEYS[1], '-inf', at), redis.call('ZCOUNT', KEYS[1], '(' .. at, '+inf'),
  redis.call('ZCOUNT', KEYS[2], '(' .. us, '+inf'), redis.call('ZCOUNT', KEYS[2], '-inf', us)}
"""
)
