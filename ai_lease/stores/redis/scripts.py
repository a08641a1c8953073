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
dashboard's pages, stores/redis/listing.py), ``KEYS[8]`` (counts: indexed jobs per status, a
sorted set) and ``KEYS[9]`` (names: the job hashes at score 0, for a key prefix's range), so that
a listing never scans the namespace; ``KEYS[5]`` and ``KEYS[6]`` are the queue and the
recovery looks. On Cluster those keys live in another slot and are left out (``KEYS[4]``
onwards are nil).
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
# returns {'acquired', now, takeover(0|1), fields...} | {'following', now, fields...}
#       | {'finished', now, fields...} | {'conflict'} | error AILEASE_CORRUPT
ACQUIRE = (
    PRELUDE
    + r"""
local k, owner = KEYS[1], ARGV[1]
local ttl, fp, maxatt = tonumber(ARGV[2]), ARGV[5], tonumber(ARGV[6])
local v = redis.call('HMGET', k, 'schema', 'status', 'owner_id', 'token', 'lease_expires_at',
  'fingerprint', 'attempts', 'takeovers', 'last_error', 'started_at', 'stalled_attempt')
local ok = ours(k, v[1])
if type(ok) == 'table' then return ok end
local now = now_us()
local at = fmt(now)
local prev, attempts, takeovers, cause, last_error = 0, 0, 0, nil, ''
local first = {}  -- the fields a new record (or one without a fingerprint yet) gets
if ok then
  if fp ~= '' and v[6] and v[6] ~= '' and v[6] ~= fp then return {'conflict'} end
  if ended(v[2]) then
    return {'finished', at, unpack(redis.call('HGETALL', k))}
  end
  if v[2] == 'RUNNING' and num(v[5]) > now then
    if v[3] == owner then return {'acquired', at, 0, unpack(with_checkpoint(k))} end
    return {'following', at, unpack(lean(k))}
  end
  prev, attempts, takeovers = num(v[4]), num(v[7]), num(v[8])
  last_error = v[9] or ''
  if v[3] and v[3] ~= '' and node_of(v[3]) ~= node_of(owner) then
    if num(v[11]) > 0 and num(v[11]) == attempts then
      cause = 'stalled'
    elseif v[2] == 'PENDING' then
      cause = 'released'
    else
      cause = 'expired'
    end
  end
  if fp ~= '' and (not v[6] or v[6] == '') then first = {'fingerprint', fp} end
else
  first = {'schema', '1', 'created_at', at, 'fingerprint', fp}
  if ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', k, 'spec', ARGV[7]) end
end
local function write(w)  -- one HSET: w and the first fields; indexed or recounted
  for _, f in ipairs(first) do w[#w + 1] = f end
  redis.call('HSET', k, unpack(w))
  if ok then
    recount(KEYS[7], KEYS[8], k, v[2], w[2])
  else
    created(KEYS[7], KEYS[8], k, now, w[2], KEYS[9])
  end
  return w
end
if maxatt and attempts >= maxatt then
  -- a code, and the last error kept as it is: Python renders the sentence (ai_lease.failure)
  redis.call('HDEL', k, 'checkpoint')
  write({'status', 'FAILED', 'lease_expires_at', '', 'updated_at', at,
    'failure_kind', 'gave_up'})
  redis.call('PUBLISH', KEYS[2], 'FAILED')
  unindex(k)
  note(now, 'failed', v[3], v[4], '', 'gave_up:' .. fmt(attempts))
  return {'finished', at, unpack(redis.call('HGETALL', k))}
end
local token = fmt(math.max(prev + 1, now))
local w = {'status', 'RUNNING', 'owner_id', owner, 'token', token,
  'stage', '', 'progress_version', '0', 'heartbeat_at', at, 'last_progress_at', at,
  'lease_expires_at', fmt(now + ttl), 'max_no_progress', ARGV[3], 'stall_policy', ARGV[4],
  'attempts', fmt(attempts + 1), 'updated_at', at, 'renew_interval', ARGV[8] or ''}
if cause then add(w, 'takeovers', fmt(takeovers + 1)); add(w, 'takeover_cause', cause) end
if (v[10] or '') == '' then add(w, 'started_at', at) end  -- the job deadline starts here
write(w)
index_lease(k, now + ttl)
if cause then
  note(now, 'taken_over', owner, token, '', cause .. ' from ' .. v[3] .. ' token ' .. (v[4] or ''))
else
  note(now, 'acquired', owner, token, '', 'attempt ' .. fmt(attempts + 1))
end
if not ok then return {'acquired', at, 0, unpack(w)} end  -- a new record: all it holds
return {'acquired', at, cause and 1 or 0, unpack(with_checkpoint(k))}
"""
)

# A fenced script reads the fence's fields (LEAN_FIELDS' first five), and whatever else it
# needs after them, in one HMGET: READ names them (FINISH reads all of LEAN).
_FENCE = "local READ = {'status', 'owner_id', 'token', 'lease_expires_at', 'schema'}\n"
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
    + "  'progress_version', 'last_progress_at', 'stall_policy', 'attempts'}\n"
    + _FENCE_CHECK
    + r"""
if not ok then return {'missing', 0, '', ''} end
local function refused(code)  -- a refusal, noted in the timeline
  note(now, 'renew_refused', owner, ARGV[2], ARGV[4], code)
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
    redis.call('HSET', k, unpack(w))
    refused('no_progress')
    return {'no_progress', fmt(expires - now), v[3], v[2]}
  end
end
add(w, 'heartbeat_at', fmt(now))
add(w, 'lease_expires_at', fmt(now + tonumber(ARGV[3])))
if ARGV[8] and ARGV[8] ~= '' then add(w, 'checkpoint', ARGV[8]) end
redis.call('HSET', k, unpack(w))
index_lease(k, now + tonumber(ARGV[3]))
local moved = 'progress +' .. fmt(version - num(v[6]))
note(now, 'renewed', owner, ARGV[2], ARGV[4], stalled and moved .. ', stalled (alert)' or moved)
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
    + "  'attempts', 'stage'}\n"
    + _FENCE_CHECK
    + r"""
if not mine or v[1] ~= 'RUNNING' then return 0 end
redis.call('HSET', k, 'status', 'PENDING', 'lease_expires_at', fmt(now), 'updated_at', fmt(now))
recount(KEYS[7], KEYS[8], k, 'RUNNING', 'PENDING')
local attempt = v[6] or '0'
local why = {}
if ARGV[5] == '1' then why[#why + 1] = 'interrupted' end
if ARGV[4] ~= '' then why[#why + 1] = 'snapshot stored' end
if ARGV[3] ~= '' then why[#why + 1] = string.match(ARGV[3], '^[^\n]*') end
note(now, 'released', owner, ARGV[2], v[7], table.concat(why, '; '))
if ARGV[3] ~= '' then
  redis.call('HSET', k, 'last_error', ARGV[3], 'last_error_attempt', attempt,
    'last_error_owner', owner)
end
if ARGV[4] ~= '' then
  redis.call('HSET', k, 'stall_snapshot', ARGV[4], 'stalled_attempt', attempt)
end
index_lease(k, now)  -- free at once: the next sweep takes it first
if ARGV[5] == '1' then  -- interrupted, not failed: the attempt is handed back
  redis.call('HSET', k, 'attempts', fmt(math.max(0, num(attempt) - 1)))
end
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
# ARGV[14] first_visible_us, to the first answer text; ARGV[15] a FAILED one's failure_kind)
FINISH = (
    PRELUDE
    + "local READ = LEAN\n"
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
  note(now, 'fenced_write_rejected', owner, ARGV[2], v[AT_STAGE], why)
  return {'rejected', why, v[3], v[2]}
end
if not mine then
  note(now, 'fenced_write_rejected', owner, ARGV[2], v[AT_STAGE], 'newer_owner')
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
redis.call('HSET', k, unpack(w))
redis.call('HDEL', k, 'checkpoint')
unindex(k)
recount(KEYS[7], KEYS[8], k, was, ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[3])
if ARGV[3] == 'DONE' then
  note(now, 'committed', owner, ARGV[2], v[AT_STAGE], ARGV[6] or '')
else
  note(now, 'failed', owner, ARGV[2], v[AT_STAGE], string.match(ARGV[5], '^[^\n]*'))
end
return {'written', at, unpack(v)}  -- the record's LEAN_FIELDS values, as written
"""
)

# KEYS: job, events, timeline ·
# ARGV: owner, token, stage, snapshot (its first line becomes last_error,
# named by attempt and owner; the attempt is marked stalled) · returns 1 | 0
REPORT_STALL = (
    PRELUDE
    + _FENCE
    + _FENCE_CHECK
    + r"""
if not mine or ended(v[1]) then return 0 end
local attempt = redis.call('HGET', k, 'attempts') or '0'
redis.call('HSET', k, 'stall_snapshot', ARGV[4], 'stage', ARGV[3], 'updated_at', fmt(now),
  'last_error', string.match(ARGV[4], '^[^\n]*'), 'last_error_attempt', attempt,
  'last_error_owner', owner, 'stalled_attempt', attempt)
local first_line = string.match(ARGV[4], '^[^\n]*')
note(now, 'stalled', owner, ARGV[2], ARGV[3], 'snapshot stored: ' .. first_line)
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
local ok = check(KEYS[1])
if type(ok) == 'table' then return ok end
if not ok then return 0 end
note(now_us(), ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], %NOTE_LIMIT%)
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
local ok = check(k)
if type(ok) == 'table' then return ok end
local now = now_us()
if not ok then return {fmt(now)} end
local c = redis.call('HMGET', k, 'status', 'owner_id', 'token', 'stage')
if not ended(c[1]) then
  note(now, 'cancelled', c[2], c[3], c[4], ARGV[1])
  redis.call('HSET', k, 'status', 'CANCELLED', 'lease_expires_at', '', 'last_error', ARGV[1],
    'last_error_attempt', '', 'last_error_owner', '', 'updated_at', fmt(now))
  redis.call('HDEL', k, 'checkpoint')
  unindex(k)
  recount(KEYS[7], KEYS[8], k, c[1], 'CANCELLED')
  redis.call('PUBLISH', KEYS[2], 'CANCELLED')
end
return {fmt(now), unpack(redis.call('HGETALL', k))}
"""
)

# KEYS: job · returns {now, fields...} (no fields when the job is unknown)
GET = (
    PRELUDE
    + r"""
local ok = check(KEYS[1])
if type(ok) == 'table' then return ok end
return {fmt(now_us()), unpack(redis.call('HGETALL', KEYS[1]))}
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
  created(KEYS[7], KEYS[8], k, now, 'PENDING', KEYS[9])
end
local status = redis.call('HGET', k, 'status')
if KEYS[5] and not ended(status) then  -- add, or bring forward
  redis.call('ZADD', KEYS[5], 'LT', string.format('%.6f', now / 1000000), ARGV[3])
end
return {'ok', fmt(now), unpack(redis.call('HGETALL', k))}
"""
)
