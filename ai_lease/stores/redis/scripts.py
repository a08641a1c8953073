"""The Redis store's Lua scripts: the rules of :mod:`ai_lease.lease.rules`, one round trip each.

The job scripts touch ``KEYS[1]`` (the job's hash, ``<ns>:{<tag>}:job``), publish on
``KEYS[2]`` (``<ns>:{<tag>}:events``) and note what they did in ``KEYS[3]`` (the job's
timeline, a list ``<ns>:{<tag>}:timeline`` of at most ``TIMELINE_CAP`` entries, written in
the same script: no round trip of its own); all three share one hash tag, so each script is
valid on Redis Cluster. On a standalone server they also keep ``KEYS[4]``, the lease index
(a sorted set of job hash -> lease expiry in microseconds), which ``DUE`` scans for lapsed
leases even when a job has no queue entry; ``SUBMIT`` writes the queue entry (``KEYS[5]``)
with the record. The scripts that create, re-date, end or delete a job also keep
``KEYS[7]`` (created: a sorted set of job hash -> ``created_at`` in microseconds, the
dashboard's pages, stores/redis/listing.py), ``KEYS[8]`` (counts: indexed jobs per status
but PENDING, the index's rest; a sorted set) and ``KEYS[9]`` (names: the job hashes at score
0, for a key prefix's range), so that a listing never scans the namespace; ``KEYS[5]`` and
``KEYS[6]`` are the queue and the recovery looks. On Cluster those keys live in another slot
and are left out (``KEYS[4]`` onwards are nil).
On their common paths the scripts read the record once (one HMGET, or one HGETALL where the
whole record is the reply) and write it once (one HSET); the record carries the scripts' own
bookkeeping in that read and write, ``timeline_seq`` (its timeline's last entry number: an
entry is one RPUSH) and ``indexed`` (it is in the creation index: a recount needs no ZSCORE).
The namespace's own keys (queue, lease index, epoch marker) share the hash tag
``{<ns>:queue}``; a worker's keys share ``{<ns>:workers}``. Time is the Redis server's
``TIME`` in microseconds; durations arrive in microseconds. Numbers are written with ``%d``
because Lua's default number formatting (``%.14g``) would round 16-digit tokens. A hash
without ``schema = 1`` is not ours: the scripts answer ``AILEASE_CORRUPT`` and change
nothing. Each script is safe to run twice (redis-py may resend after a dropped reply).
A refusal is returned as its code, a value of :class:`~ai_lease.refusal.Refusal`
(never English text); each script's header lists the codes it can return, and
tests/test_refusal.py holds the script text to that list and to the enum.
"""

from __future__ import annotations

from ai_lease.lease.timeline import NOTE_LIMIT
from ai_lease.stores.redis.prelude import PRELUDE

SCHEMA = "1"


# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: owner, ttl_us, max_no_progress_us, stall_policy,
# fingerprint ('' none), max_attempts ('' none), spec ('' none: written only into a record
# this call creates, i.e. one re-created after the store lost its data), renew_interval_us
# ('' none) · takeover: another node's earlier owner (a same-node retry is an attempt only),
# its cause (expired | released | stalled) written to takeover_cause
# · a granted lease's reply carries the stored checkpoint (a resumable stream's, for the new
# owner); a following one does not
# returns {'acquired', now, takeover(0|1), read, written} | {'following', now, read}
#       | {'finished', now, fields...} | {'conflict'} | error AILEASE_CORRUPT, where read is
# the record's LEAN_FIELDS values and its checkpoint as read (nil: no such field; a follower
# ignores the checkpoint) and written the field, value list this call wrote over them
ACQUIRE = (
    PRELUDE
    + r"""
local k, owner = KEYS[1], ARGV[1]
local ttl, fp, maxatt = tonumber(ARGV[2]), ARGV[5], tonumber(ARGV[6])
local READ = {unpack(LEAN)}
READ[#READ + 1] = 'checkpoint'
local v = redis.call('HMGET', k, unpack(READ))  -- the one read: the reply is built from it
local ok = ours(k, v[AT_SCHEMA])
if type(ok) == 'table' then return ok end
local now = now_us()
local at = fmt(now)
local prev, attempts, takeovers, cause, last_error = 0, 0, 0, nil, ''
local first = {}  -- the fields a new record (or one without a fingerprint yet) gets
if ok then
  if fp ~= '' and v[AT_FINGERPRINT] and v[AT_FINGERPRINT] ~= '' and v[AT_FINGERPRINT] ~= fp then
    return {'conflict'}
  end
  if ended(v[AT_STATUS]) then
    return {'finished', at, unpack(redis.call('HGETALL', k))}
  end
  if v[AT_STATUS] == 'RUNNING' and num(v[AT_LEASE_EXPIRES_AT]) > now then
    if v[AT_OWNER_ID] == owner then return {'acquired', at, 0, v, {}} end
    return {'following', at, v}
  end
  prev, attempts, takeovers = num(v[AT_TOKEN]), num(v[AT_ATTEMPTS]), num(v[AT_TAKEOVERS])
  last_error = v[AT_LAST_ERROR] or ''
  local was = v[AT_OWNER_ID]
  if was and was ~= '' and node_of(was) ~= node_of(owner) then
    if num(v[AT_STALLED_ATTEMPT]) > 0 and num(v[AT_STALLED_ATTEMPT]) == attempts then
      cause = 'stalled'
    elseif v[AT_STATUS] == 'PENDING' then
      cause = 'released'
    else
      cause = 'expired'
    end
  end
  if fp ~= '' and (not v[AT_FINGERPRINT] or v[AT_FINGERPRINT] == '') then
    first = {'fingerprint', fp}
  end
else
  first = {'schema', '1', 'created_at', at, 'fingerprint', fp}
  if ARGV[7] and ARGV[7] ~= '' then add(first, 'spec', ARGV[7]) end
end
-- the record's timeline_seq ('0' for a new one: no timeline yet)
local seq = ok and v[AT_TIMELINE_SEQ] or '0'
local function write(w)  -- one HSET: w and the first fields; indexed or recounted
  for _, f in ipairs(first) do w[#w + 1] = f end
  if ok then
    recount(KEYS[7], KEYS[8], k, v[AT_STATUS], w[2], v[AT_INDEXED])
  elseif created(KEYS[7], KEYS[8], k, now, w[2], KEYS[9]) then
    add(w, 'indexed', '1')
  end
  redis.call('HSET', k, unpack(w))
  return w
end
if maxatt and attempts >= maxatt then
  -- a code, and the last error kept as it is: Python renders the sentence (ai_lease.failure)
  if v[#READ] then redis.call('HDEL', k, 'checkpoint') end
  local w = {'status', 'FAILED', 'lease_expires_at', '', 'updated_at', at,
    'failure_kind', 'gave_up'}
  note(now, 'failed', v[AT_OWNER_ID], v[AT_TOKEN], '', 'gave_up:' .. fmt(attempts), nil, seq, w)
  write(w)
  redis.call('PUBLISH', KEYS[2], 'FAILED')
  unindex(k)
  return {'finished', at, unpack(redis.call('HGETALL', k))}
end
local token = fmt(math.max(prev + 1, now))
local w = {'status', 'RUNNING', 'owner_id', owner, 'token', token,
  'stage', '', 'progress_version', '0', 'heartbeat_at', at, 'last_progress_at', at,
  'lease_expires_at', fmt(now + ttl), 'max_no_progress', ARGV[3], 'stall_policy', ARGV[4],
  'attempts', fmt(attempts + 1), 'updated_at', at, 'renew_interval', ARGV[8] or ''}
if cause then add(w, 'takeovers', fmt(takeovers + 1)); add(w, 'takeover_cause', cause) end
if (v[AT_STARTED_AT] or '') == '' then add(w, 'started_at', at) end  -- the job deadline starts
if cause then
  local from = cause .. ' from ' .. v[AT_OWNER_ID] .. ' token ' .. (v[AT_TOKEN] or '')
  note(now, 'taken_over', owner, token, '', from, nil, seq, w)
else
  note(now, 'acquired', owner, token, '', 'attempt ' .. fmt(attempts + 1), nil, seq, w)
end
write(w)
index_lease(k, now + ttl)
return {'acquired', at, cause and 1 or 0, v, w}  -- v as read, w as written over it
"""
)

# A fenced script reads the fence's fields (LEAN_FIELDS' first five), and whatever else it
# needs after them, in one HMGET: READ names them (FINISH reads all of LEAN and the checkpoint).
_FENCE_CHECK = r"""
local k, owner, token = KEYS[1], ARGV[1], tonumber(ARGV[2])
local v = redis.call('HMGET', k, unpack(READ))
local ok = ours(k, v[5])
if type(ok) == 'table' then return ok end
local now = now_us()
local mine = num(v[3]) == token and ok and v[2] == owner
"""

# KEYS: job, events, timeline ·
# ARGV: owner, token, ttl_us, stage, progress_version, max_no_progress_us,
# grace_us (the owner's renew interval: kept as renew_interval), checkpoint ('' or absent:
# keep the stored one; written only with a granted renewal) · a stall is written to
# stalled_attempt · returns {'ok', lease_remaining_us, stalled(0|1)}
#       | {refusal, lease_remaining_us, current_token, current_owner}
# refusals (ai_lease.refusal.Refusal): missing, not_owner, not_running, expired, no_progress
RENEW = (
    PRELUDE
    + "local READ = {'status', 'owner_id', 'token', 'lease_expires_at', 'schema',\n"
    + "  'progress_version', 'last_progress_at', 'stall_policy', 'attempts', 'timeline_seq'}\n"
    + _FENCE_CHECK
    + r"""
if not ok then return {'missing', 0, '', ''} end
local function refused(code, w)  -- a refusal, noted in the timeline (in w's HSET, if any)
  note(now, 'renew_refused', owner, ARGV[2], ARGV[4], code, nil, v[10], w)
end
if not mine then
  refused('not_owner')
  return {'not_owner', 0, v[3] or '', v[2] or ''}
end
if v[1] ~= 'RUNNING' then
  refused('not_running')
  return {'not_running', 0, v[3], v[2]}
end
local expires = num(v[4])
if expires <= now then
  refused('expired')
  return {'expired', 0, v[3], v[2]}
end
local version, last = num(v[6]), num(v[7])
if last == 0 then last = now end
if tonumber(ARGV[5]) > version then version, last = tonumber(ARGV[5]), now end
local w = {'stage', ARGV[4], 'max_no_progress', ARGV[6], 'progress_version', fmt(version),
  'last_progress_at', fmt(last), 'updated_at', fmt(now), 'renew_interval', ARGV[7]}
local stalled = (now - last) > (tonumber(ARGV[6]) + tonumber(ARGV[7]))
if stalled then
  redis.call('HINCRBY', k, 'missed_renewals', 1)
  add(w, 'stalled_attempt', fmt(num(v[9])))
  if v[8] ~= 'alert' then
    refused('no_progress', w)
    redis.call('HSET', k, unpack(w))
    return {'no_progress', fmt(expires - now), v[3], v[2]}
  end
end
add(w, 'heartbeat_at', fmt(now))
add(w, 'lease_expires_at', fmt(now + tonumber(ARGV[3])))
if ARGV[8] and ARGV[8] ~= '' then add(w, 'checkpoint', ARGV[8]) end
local moved = 'progress +' .. fmt(version - num(v[6]))
moved = stalled and moved .. ', stalled (alert)' or moved
note(now, 'renewed', owner, ARGV[2], ARGV[4], moved, nil, v[10], w)
redis.call('HSET', k, unpack(w))
index_lease(k, now + tonumber(ARGV[3]))
return {'ok', ARGV[3], stalled and 1 or 0}
"""
)

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: owner, token, error ('' keep), snapshot ('' keep),
# interrupted ('1': give the attempt back) · an error names its attempt and owner
# (last_error_attempt, last_error_owner); a snapshot marks the attempt stalled · returns 1 | 0
RELEASE = (
    PRELUDE
    + "local READ = {'status', 'owner_id', 'token', 'lease_expires_at', 'schema',\n"
    + "  'attempts', 'stage', 'timeline_seq', 'indexed'}\n"
    + _FENCE_CHECK
    + r"""
if not mine or v[1] ~= 'RUNNING' then return 0 end
local w = {'status', 'PENDING', 'lease_expires_at', fmt(now), 'updated_at', fmt(now)}
recount(KEYS[7], KEYS[8], k, 'RUNNING', 'PENDING', v[9])
local attempt = v[6] or '0'
local why = {}
if ARGV[5] == '1' then why[#why + 1] = 'interrupted' end
if ARGV[4] ~= '' then why[#why + 1] = 'snapshot stored' end
if ARGV[3] ~= '' then why[#why + 1] = string.match(ARGV[3], '^[^\n]*') end
note(now, 'released', owner, ARGV[2], v[7], table.concat(why, '; '), nil, v[8], w)
if ARGV[3] ~= '' then
  add(w, 'last_error', ARGV[3]); add(w, 'last_error_attempt', attempt)
  add(w, 'last_error_owner', owner)
end
if ARGV[4] ~= '' then add(w, 'stall_snapshot', ARGV[4]); add(w, 'stalled_attempt', attempt) end
if ARGV[5] == '1' then  -- interrupted, not failed: the attempt is handed back
  add(w, 'attempts', fmt(math.max(0, num(attempt) - 1)))
end
redis.call('HSET', k, unpack(w))  -- one write
index_lease(k, now)  -- free at once: the next sweep takes it first
redis.call('PUBLISH', KEYS[2], 'PENDING')
return 1
"""
)

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: owner, token, status (DONE|FAILED), field (result|last_error), value,
# finish reason ('' = none; kept on a DONE record), then what ran ('' = keep): provider, model,
# prompt_tokens, completion_tokens, first_token_us, stage_durations (JSON); sets finished_at;
# a FAILED one names its attempt and owner (last_error_attempt, last_error_owner); either
# clears the checkpoint
# returns {'written', now, LEAN_FIELDS values...} (this call wrote it; nil: no such field)
#       | {'ok', now, fields...} (it was already written: the whole record)
#       | {'rejected', refusal, current_token, current_owner}
# refusals (ai_lease.refusal.Refusal): missing, newer_owner, already_committed,
# already_finished, cancelled
# (what ran goes on: ARGV[13] is reasoning_tokens, part of completion_tokens, told apart;
# ARGV[14] first_visible_us, to the first answer text; ARGV[15] a FAILED one's failure_kind;
# ARGV[16] the job key: a written end takes it off the workers' schedule, standalone only)
FINISH = (
    PRELUDE
    + "local READ = {unpack(LEAN)}\nREAD[#READ + 1] = 'checkpoint'\n"
    + _FENCE_CHECK
    + r"""
if not ok then return {'rejected', 'missing', '', ''} end
if ended(v[1]) then
  if mine and v[1] == ARGV[3] then return {'ok', fmt(now), unpack(redis.call('HGETALL', k))} end
  local why = 'already_finished'
  if v[1] == 'CANCELLED' then
    why = 'cancelled'
  elseif v[1] == 'DONE' and ARGV[3] == 'DONE' then
    why = 'already_committed'
  end
  note(now, 'fenced_write_rejected', owner, ARGV[2], v[AT_STAGE], why, nil, v[AT_TIMELINE_SEQ])
  return {'rejected', why, v[3], v[2]}
end
if not mine then
  local seq = v[AT_TIMELINE_SEQ]
  note(now, 'fenced_write_rejected', owner, ARGV[2], v[AT_STAGE], 'newer_owner', nil, seq)
  return {'rejected', 'newer_owner', v[3], v[2]}
end
local at, was = fmt(now), v[1]
local w = {'status', ARGV[3], ARGV[4], ARGV[5], 'lease_expires_at', '', 'updated_at', at}
v[AT_STATUS], v[AT_LEASE_EXPIRES_AT], v[AT_UPDATED_AT] = ARGV[3], '', at
if ARGV[4] == 'last_error' then
  v[AT_LAST_ERROR], v[AT_LAST_ERROR_ATTEMPT] = ARGV[5], v[AT_ATTEMPTS]
  v[AT_LAST_ERROR_OWNER] = owner
  add(w, 'last_error_attempt', v[AT_ATTEMPTS] or '0')
  add(w, 'last_error_owner', owner)
  v[AT_FAILURE_KIND] = ARGV[15] or 'error'
  add(w, 'failure_kind', v[AT_FAILURE_KIND])
end
add(w, 'finished_at', at)
v[AT_FINISHED_AT] = at
local facts = {{'provider', AT_PROVIDER}, {'model', AT_MODEL}, {'prompt_tokens', AT_PROMPT_TOKENS},
  {'completion_tokens', AT_COMPLETION_TOKENS}, {'first_token_s', AT_FIRST_TOKEN_S},
  {'stage_durations', AT_STAGE_DURATIONS}, {'reasoning_tokens', AT_REASONING_TOKENS},
  {'first_visible_s', AT_FIRST_VISIBLE_S}}
for i, f in ipairs(facts) do
  local value = ARGV[6 + i] or ''
  if value ~= '' then
    add(w, f[1], value)
    v[f[2]] = value
  end
end
if ARGV[3] == 'DONE' then  -- a final stage
  add(w, 'stage', 'done')
  v[AT_STAGE] = 'done'
end
if (ARGV[6] or '') ~= '' then
  add(w, 'finish_reason', ARGV[6])
  v[AT_FINISH_REASON] = ARGV[6]
end
local what = ARGV[6] or ''
if ARGV[3] ~= 'DONE' then what = string.match(ARGV[5], '^[^\n]*') end
note(now, ARGV[3] == 'DONE' and 'committed' or 'failed', owner, ARGV[2], v[AT_STAGE], what, nil,
  v[AT_TIMELINE_SEQ], w)
v[AT_TIMELINE_SEQ] = w[#w]
redis.call('HSET', k, unpack(w))
if v[#READ] then redis.call('HDEL', k, 'checkpoint') end  -- only when there is one
v[#READ] = nil  -- the reply is LEAN's values
unindex(k)
if KEYS[5] and (ARGV[16] or '') ~= '' then  -- off the schedule: nothing left to run
  redis.call('ZREM', KEYS[5], ARGV[16])
  redis.call('ZREM', KEYS[6], ARGV[16])
end
recount(KEYS[7], KEYS[8], k, was, ARGV[3], v[AT_INDEXED])
redis.call('PUBLISH', KEYS[2], ARGV[3])
return {'written', at, unpack(v)}  -- the record's LEAN_FIELDS values, as written
"""
)

# KEYS: job, events, timeline ·
# ARGV: owner, token, stage, snapshot (its first line becomes last_error,
# named by attempt and owner; the attempt is marked stalled) · returns 1 | 0
REPORT_STALL = (
    PRELUDE
    + "local READ = {'status', 'owner_id', 'token', 'lease_expires_at', 'schema',\n"
    + "  'attempts', 'timeline_seq'}\n"
    + _FENCE_CHECK
    + r"""
if not mine or ended(v[1]) then return 0 end
local attempt = v[6] or '0'
local first_line = string.match(ARGV[4], '^[^\n]*')
local w = {'stall_snapshot', ARGV[4], 'stage', ARGV[3], 'updated_at', fmt(now),
  'last_error', first_line, 'last_error_attempt', attempt,
  'last_error_owner', owner, 'stalled_attempt', attempt}
note(now, 'stalled', owner, ARGV[2], ARGV[3], 'snapshot stored: ' .. first_line, nil, v[7], w)
redis.call('HSET', k, unpack(w))
return 1
"""
)

# KEYS: job, events, timeline ·
# ARGV: kind (one of NOTE_KINDS, checked by the caller), owner, token, stage, detail
# (clipped by the caller to NOTE_LIMIT characters; only flattened here) · returns 1 (noted)
# | 0 (no such job: nothing written). Not fenced: the entry says what happened to an old
# owner's process (a ladder step), often after its lease was lost; nothing is published.
NOTE = (
    PRELUDE
    + r"""
local v = redis.call('HMGET', KEYS[1], 'schema', 'timeline_seq')
local ok = ours(KEYS[1], v[1])
if type(ok) == 'table' then return ok end
if not ok then return 0 end
note(now_us(), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], %NOTE_LIMIT%, v[2])
return 1
""".replace("%NOTE_LIMIT%", str(NOTE_LIMIT))
)

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: reason · returns {now, fields...} (no fields when
# the job is unknown). Not fenced: a job not yet ended becomes CANCELLED (its owner's next
# RENEW answers not_running, its FINISH is rejected; its checkpoint is cleared); an ended one
# is returned unchanged.
CANCEL = (
    PRELUDE
    + r"""
local k = KEYS[1]
local c = redis.call('HMGET', k, 'schema', 'status', 'owner_id', 'token', 'stage',
  'timeline_seq', 'indexed')
local ok = ours(k, c[1])
if type(ok) == 'table' then return ok end
local now = now_us()
if not ok then return {fmt(now)} end
if not ended(c[2]) then
  local w = {'status', 'CANCELLED', 'lease_expires_at', '', 'last_error', ARGV[1],
    'last_error_attempt', '', 'last_error_owner', '', 'updated_at', fmt(now)}
  note(now, 'cancelled', c[3], c[4], c[5], ARGV[1], nil, c[6], w)
  redis.call('HSET', k, unpack(w))
  redis.call('HDEL', k, 'checkpoint')
  unindex(k)
  recount(KEYS[7], KEYS[8], k, c[2], 'CANCELLED', c[7])
  redis.call('PUBLISH', KEYS[2], 'CANCELLED')
end
return {fmt(now), unpack(redis.call('HGETALL', k))}
"""
)

# KEYS: job · returns {now, fields...} (no fields when the job is unknown)
GET = (
    PRELUDE
    + r"""
local all = whole(KEYS[1])
if all.err then return all end
return {fmt(now_us()), unpack(all)}
"""
)

# KEYS: job, events, timeline[, lease index, queue, recovery looks, created, counts, names] ·
# ARGV: spec, fingerprint, job key (the queue's member)
# returns {'ok', now, fields...} | {'conflict'}. The record and its queue entry are written
# together: a job is never stored without the entry that makes a worker look at it.
SUBMIT = (
    PRELUDE
    + r"""
local k = KEYS[1]
local all = whole(k)  -- one read: empty for a new job (the common case), else the reply
if all.err then return all end
local now = now_us()
local function queued()  -- add, or bring forward
  if KEYS[5] then
    redis.call('ZADD', KEYS[5], 'LT', string.format('%.6f', now / 1000000), ARGV[3])
  end
end
if #all > 0 then
  local f = {}
  for i = 1, #all, 2 do f[all[i]] = all[i + 1] end
  if f.fingerprint and f.fingerprint ~= '' and f.fingerprint ~= ARGV[2] then
    return {'conflict'}
  end
  if not f.spec or f.spec == '' then
    local w = {'spec', ARGV[1], 'fingerprint', ARGV[2], 'updated_at', fmt(now)}
    redis.call('HSET', k, unpack(w))
    for _, x in ipairs(w) do all[#all + 1] = x end  -- a later field wins: read back as written
  end
  if not ended(f.status) then queued() end
  return {'ok', fmt(now), unpack(all)}
end
local w = {'schema', '1', 'status', 'PENDING', 'token', '0', 'spec', ARGV[1],
  'fingerprint', ARGV[2], 'created_at', fmt(now), 'updated_at', fmt(now), 'timeline_seq', '0'}
if created(KEYS[7], KEYS[8], k, now, 'PENDING', KEYS[9]) then add(w, 'indexed', '1') end
redis.call('HSET', k, unpack(w))
queued()
return {'ok', fmt(now), unpack(w)}  -- a new record: all it holds
"""
)
