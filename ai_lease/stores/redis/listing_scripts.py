"""The Redis store's listing scripts: pages off the creation index, and its one backfill.

The creation index ``{<ns>:queue}:created`` (a sorted set: job hash -> ``created_at`` in
microseconds), the name index ``{<ns>:queue}:names`` (the same job hashes, all at score 0:
in byte order, for a prefix's range) and the counts ``{<ns>:queue}:counts`` (a sorted set: status
-> jobs) are kept by
the job scripts that create, re-date, end or delete a job (stores/redis/scripts.py), on a
standalone server. These read them; the backfill indexes the jobs stored before them.
"""

from __future__ import annotations

from ai_lease.stores.redis.prelude import PRELUDE

LIST_CHUNK = 200
"""Index entries one ZREVRANGEBYSCORE of LIST_PAGE reads."""

# KEYS: creation index, name index · ARGV: cursor's created_us ('' from the newest), cursor's
# job hash ('' none), limit, status ('' any), job-hash prefix ('' any: '<ns>:{' ..
# hash_tag(prefix), compared as bytes, never as a pattern), bound (index entries read at most)
# returns {now, next created_us ('' none), next job hash ('' none), job hash, fields | 'corrupt',
# ...}: up to limit jobs newest first (then job hash descending), each its LEAN fields (a
# nested name, value list); a hash not ours as 'corrupt'; a member whose hash is gone is
# passed over. A prefix that at most `bound` job hashes share (ZLEXCOUNT on the name index) is
# read whole, sorted by creation; otherwise the creation index is read from the cursor in
# chunks, at most `bound` entries. The next cursor is the page's last entry (job or corrupt)
# when a job beyond it matched, or the last entry read when the bound was reached first; none
# when the entries ran out.
LIST_PAGE = (
    PRELUDE
    + r"""
local idx, names, limit, status, pre = KEYS[1], KEYS[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local bound, top, after = tonumber(ARGV[6]), ARGV[1], ARGV[2]
local topn = tonumber(top)
if top == '' then top = '+inf' end
local out, found, read = {fmt(now_us()), '', ''}, 0, 0
local last_s, last_m, seen_s, seen_m
-- Byte order, as sorted sets compare members: Lua's '<' follows the server's locale (strcoll).
local function below(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function past(m, n)  -- after the cursor: older, or as old with a lower job hash
  return after == '' or n < topn or (n == topn and below(m, after))
end
local function wanted(m)
  if pre ~= '' and string.sub(m, 1, #pre) ~= pre then return nil end
  local schema = redis.pcall('HGET', m, 'schema')
  if type(schema) == 'table' or (schema and schema ~= '1') then return 'corrupt' end
  if not schema then return nil end  -- gone: passed over
  if status ~= '' and redis.call('HGET', m, 'status') ~= status then return nil end
  return 'ok'
end
local function take(m, s)  -- true: the page is full and a job beyond it matched
  read = read + 1
  local what = wanted(m)
  if what == 'ok' and found == limit then
    out[2], out[3] = last_s, last_m
    return true
  end
  if what == 'ok' then
    found, last_s, last_m = found + 1, s, m
    out[#out + 1] = m
    out[#out + 1] = lean(m)
  elseif what == 'corrupt' then  -- reported once: the cursor goes past it too
    last_s, last_m = s, m
    out[#out + 1] = m
    out[#out + 1] = 'corrupt'
  end
  seen_s, seen_m = s, m
  return false
end
if pre ~= '' then
  local b = string.byte(pre, -1)  -- a job hash's bytes are UTF-8: never 0xFF
  local stop = '(' .. string.sub(pre, 1, -2) .. string.char(b + 1)
  if redis.call('ZLEXCOUNT', names, '[' .. pre, stop) <= bound then  -- few: all, sorted
    local rows = {}
    for _, m in ipairs(redis.call('ZRANGEBYLEX', names, '[' .. pre, stop)) do
      local s = redis.call('ZSCORE', idx, m)
      if s and past(m, tonumber(s)) then rows[#rows + 1] = {tonumber(s), m, s} end
    end
    table.sort(rows, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      return below(y[2], x[2])
    end)
    for _, row in ipairs(rows) do
      if take(row[2], row[3]) then return out end
    end
    return out
  end
end
local offset = 0
while read < bound do
  local chunk = redis.call('ZREVRANGEBYSCORE', idx, top, '-inf', 'WITHSCORES', 'LIMIT', offset,
    math.min(%CHUNK%, bound - read))
  if #chunk == 0 then return out end  -- the index ran out: the last page
  offset = offset + #chunk / 2
  for i = 1, #chunk, 2 do
    local m, s = chunk[i], chunk[i + 1]
    if past(m, tonumber(s)) then
      if take(m, s) then return out end
      if read >= bound then break end
    end
  end
end
if seen_m then out[2], out[3] = seen_s, seen_m end  -- the bound: go on after the last read
return out
""".replace("%CHUNK%", str(LIST_CHUNK))
)

# KEYS: creation index, counts, name index, job hashes... · returns how many it indexed: each
# hash of ours not yet in the index goes in under its created_at (0 when it has none), counted
# under its status (PENDING is the uncounted rest), into the name index, and is marked indexed
# (its 'indexed' field); a hash not ours (or gone) is left out.
BACKFILL = (
    PRELUDE
    + r"""
local added = 0
for i = 4, #KEYS do
  local k = KEYS[i]
  if not redis.call('ZSCORE', KEYS[1], k) then
    local v = redis.pcall('HMGET', k, 'schema', 'status', 'created_at')
    if type(v) == 'table' and v[1] == '1' then
      redis.call('ZADD', KEYS[1], fmt(tonumber(v[3] or '') or 0), k)
      redis.call('ZADD', KEYS[3], 0, k)
      if v[2] ~= 'PENDING' then redis.call('ZINCRBY', KEYS[2], 1, v[2] or '') end
      redis.call('HSET', k, 'indexed', '1')
      added = added + 1
    end
  end
end
return added
"""
)

# KEYS: counts, creation index · returns {indexed jobs, status, count, status, count, ...}:
# the index's size, then the whole counts set (a few statuses). PENDING is not counted (a
# member left by an older ai-lease is stale): it is the index's size less every other count.
COUNT_JOBS = (
    "return {redis.call('ZCARD', KEYS[2]), unpack(redis.call('ZRANGE', KEYS[1], 0, -1, "
    "'WITHSCORES'))}"
)
