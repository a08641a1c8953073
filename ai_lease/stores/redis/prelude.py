"""What every Redis script of the store starts with (:data:`PRELUDE`): the server's clock,
number formatting, the record's fields in the order the scripts read them
(:data:`LEAN_FIELDS`), the schema check and the timeline writer, as Lua locals."""

from __future__ import annotations

from ai_lease.lease.timeline import TIMELINE_CAP

__all__ = ["LEAN_FIELDS", "PRELUDE"]

# The record without its big fields (spec, result, stall_snapshot), in the order FINISH
# returns their values: the fence's five first (the order every fenced script reads them in).
LEAN_FIELDS = (
    *("status", "owner_id", "token", "lease_expires_at", "schema"),
    *("stage", "progress_version", "heartbeat_at", "last_progress_at", "max_no_progress"),
    *("stall_policy", "attempts", "takeovers", "missed_renewals", "last_error"),
    *("fingerprint", "created_at", "updated_at", "started_at", "finish_reason"),
    *("renew_interval", "takeover_cause", "stalled_attempt", "last_error_attempt"),
    *("last_error_owner", "finished_at", "provider", "model", "prompt_tokens"),
    *("completion_tokens", "first_token_s", "stage_durations", "reasoning_tokens"),
    *("first_visible_s", "failure_kind"),
    # Bookkeeping the scripts keep for themselves (never part of a JobState): the timeline's
    # last entry number, and whether the job is in the creation index (both ride on the reads
    # and writes a script makes anyway, so that noting and counting cost no read of their own)
    *("timeline_seq", "indexed"),
)


def _lean_lua() -> str:
    """``LEAN`` (the names) and ``AT_<FIELD>`` (each one's position) as Lua locals."""
    names = ", ".join(f"'{name}'" for name in LEAN_FIELDS)
    ats = ", ".join(f"AT_{name.upper()}" for name in LEAN_FIELDS)
    places = ", ".join(str(i) for i in range(1, len(LEAN_FIELDS) + 1))
    return f"local LEAN = {{{names}}}\nlocal {ats} =\n  {places}"


PRELUDE = r"""
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
-- Every field but the big ones (spec, result, stall_snapshot): what acquire sends back, so
-- an input or a result never crosses the network twice. LEAN and the AT_<FIELD> positions
-- are written from LEAN_FIELDS (the Python side, above).
%LEAN%
local function lean(k)
  local v = redis.call('HMGET', k, unpack(LEAN))
  local out = {}
  for i, name in ipairs(LEAN) do
    out[#out + 1] = name
    out[#out + 1] = v[i] or ''
  end
  return out
end
local function add(t, name, value)  -- one field of an HSET's argument list
  t[#t + 1] = name
  t[#t + 1] = value
end
local function with_checkpoint(k)  -- lean(k) and the checkpoint: for the lease's owner
  local out = lean(k)
  add(out, 'checkpoint', redis.call('HGET', k, 'checkpoint') or '')
  return out
end
-- The lease index (standalone only): where DUE finds leases that lapsed.
local function index_lease(k, expires_us)
  if KEYS[4] then redis.call('ZADD', KEYS[4], fmt(expires_us), k) end
end
local function unindex(k)
  if KEYS[4] then redis.call('ZREM', KEYS[4], k) end
end
-- The creation index (ci), its per-status counts (cc) and the name index (cn: job hashes at
-- score 0, in byte order), standalone only: a job counts under its status while it is in
-- the index (a job from before the index is counted when the backfill indexes it). PENDING is
-- not counted: it is the rest of the index (stores/redis/listing.py), so that a new job and
-- its first acquire move no counter. A record says it is indexed (its 'indexed' field, read
-- with the fields a script reads anyway); one from before that field is looked up.
local function counted(status) return status and status ~= '' and status ~= 'PENDING' end
local function created(ci, cc, k, at, status, cn)  -- a new job: true when it is indexed
  if not ci then return false end
  if redis.call('ZADD', ci, fmt(at), k) == 1 then
    if counted(status) then redis.call('ZINCRBY', cc, 1, status) end
    redis.call('ZADD', cn, 0, k)
  end
  return true
end
local function recount(ci, cc, k, from, to, indexed)  -- an indexed job's status moved
  if not ci or from == to then return end
  if indexed ~= '1' and not redis.call('ZSCORE', ci, k) then return end
  if counted(from) then redis.call('ZINCRBY', cc, -1, from) end
  if counted(to) then redis.call('ZINCRBY', cc, 1, to) end
end
local function uncreated(ci, cc, k, status, cn)  -- a deleted job
  if not ci then return end
  redis.call('ZREM', cn, k)
  if redis.call('ZREM', ci, k) == 1 and counted(status) then
    redis.call('ZINCRBY', cc, -1, status)
  end
end
-- The job's timeline (KEYS[3], a list): one entry per event, written by the script that
-- caused it: seq, time (us), kind, owner, token, stage, detail, tab-separated. The last
-- TIMELINE_CAP are kept; the first one's seq says how many were dropped.
local function flat(s, n)  -- a field of an entry: one line, no tabs, bounded (n, or 200)
  s, n = s or '', n or 200
  if #s > n then s = string.sub(s, 1, n) end
  if string.find(s, '[\t\r\n]') then s = (string.gsub(s, '[\t\r\n]', ' ')) end
  return s
end
local function seq_of(entry)  -- an entry's seq (0: none)
  if not entry then return 0 end
  return tonumber(string.match(entry, '^%d+')) or 0
end
-- One entry: one RPUSH (and an LTRIM once the list is full). Its seq follows the record's
-- timeline_seq (`last`, read with the script's other fields), written back in the caller's
-- HSET (`w`) or, without one, in an HSET of its own. A record without that field, a full
-- list, or a list whose length disagrees with it (another writer, e.g. an older ai-lease)
-- takes the seq from the list's own entries instead.
local function note(now, kind, owner, token, stage, detail, n, last, w)
  local t, seq = KEYS[3], tonumber(last or '')
  if seq == nil or seq >= %CAP% then seq = seq_of(redis.call('LINDEX', t, -1)) end
  seq = seq + 1
  local rest = '\t' .. fmt(now) .. '\t' .. kind .. '\t' .. flat(owner) .. '\t' .. (token or '')
    .. '\t' .. flat(stage) .. '\t' .. flat(detail, n)
  local len = redis.call('RPUSH', t, fmt(seq) .. rest)
  if len ~= seq and seq <= %CAP% then  -- the record's count is not the list's: the list says
    seq = seq_of(redis.call('LINDEX', t, -2)) + 1
    redis.call('LSET', t, -1, fmt(seq) .. rest)
  end
  if len > %CAP% then redis.call('LTRIM', t, -%CAP%, -1) end
  if w then
    add(w, 'timeline_seq', fmt(seq))
  else
    redis.call('HSET', KEYS[1], 'timeline_seq', fmt(seq))
  end
end
local function node_of(o)  -- an owner id's node: the part before its last '#'
  local n = string.match(o, '^(.*)#[^#]*$')
  if n == nil or n == '' then return o end
  return n
end
local function ended(status)  -- a terminal status: DONE, FAILED or CANCELLED
  return status == 'DONE' or status == 'FAILED' or status == 'CANCELLED'
end
local function corrupt(schema)
  return redis.error_reply('AILEASE_CORRUPT schema marker is ' .. tostring(schema))
end
-- A whole record (HGETALL), checked: {} when there is no such hash, an error reply (a table
-- with .err) when it is not ours. One read, where EXISTS + HGET + HGETALL were three.
local function whole(k)
  local all = redis.call('HGETALL', k)
  if #all == 0 then return all end
  for i = 1, #all, 2 do
    if all[i] == 'schema' then
      if all[i + 1] == '1' then return all end
      return corrupt(all[i + 1])
    end
  end
  return corrupt(nil)
end
-- check() for a hash whose schema field was already read (with the fields a script needs):
-- EXISTS only when the field is missing.
local function ours(k, schema)
  if schema == '1' then return true end
  if not schema and redis.call('EXISTS', k) == 0 then return false end
  return corrupt(schema)
end
""".replace("%LEAN%", _lean_lua()).replace("%CAP%", str(TIMELINE_CAP))
