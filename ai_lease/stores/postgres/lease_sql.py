"""The PostgreSQL store's lease functions: the rules of :mod:`ai_lease.lease.rules` in plpgsql.

One function per lease operation (``ail_acquire``, ``ail_renew``, ``ail_release``,
``ail_finish`` for commit and fail, ``ail_report_stall``, ``ail_cancel``, ``ail_note_job``),
each called by one ``SELECT``: one round trip, one transaction. Each locks the job's row
(``FOR UPDATE``), judges by the database's clock (``clock_timestamp()``, read once per call)
and notes what it did in the job's timeline in the same transaction (``ail_timeline``, one
row per entry numbered after the key's last one under that row lock: the details the Redis
scripts and the SQLite store write). A function that ends a lease or a job wakes its
followers (``pg_notify``: the namespace's channel, the key as payload, as ``ail_notify``
sends it), delivered when the transaction commits. Each function is one plpgsql body with
no nested function call (see the helpers below). Fencing tokens are
``greatest(nextval('ail_tokens'), previous + 1)``: from a WAL-logged sequence, so they keep
increasing across restarts and a promoted standby, and never go down for a record.

A refusal is returned as its code (a :class:`~ai_lease.refusal.Refusal` value). A row
whose status is none of ours raises ``AILEASE_CORRUPT`` (the key as the hint), changing
nothing. The connection layer resends a call whose connection broke under it, so these
are safe to run twice: a repeated acquire by the same owner returns its token, a repeated
renew renews again, a repeated commit or fail of the same fence answers with the stored
record, a repeated cancel returns the cancelled job (a repeated release answers False, the
lease being released already). ``ail_note_job`` is not (a second run appends the entry
again): it is never resent.

The job-returning functions hand back an ``ail_jobs`` row, which the caller expands in the
same statement (``SELECT a.o_kind, …, (a.o_job).* FROM ail_acquire(…) a``); a lease's
grant or refusal and a fresh write leave out the big fields (spec, result, snapshot), as
the Redis scripts do.
"""

from __future__ import annotations

from ai_lease.lease.storable import SNAPSHOT_LIMIT
from ai_lease.lease.timeline import TIMELINE_CAP

__all__ = ["FUNCTIONS"]

# The helpers below are spelled out inside each function rather than called: each nested
# plpgsql or SQL function call (with its own search_path setting) was server CPU of its own
# (ail_finish, with its three helper calls spelled out: ~10 % less per call, measured).


def _flat(expr: str, limit: int | str = 200) -> str:
    """``expr`` on one line, at most ``limit`` characters (tabs and newlines as spaces)."""
    return rf"translate(left(coalesce({expr}, ''), {limit}), E'\t\r\n', '   ')"


def _first_line(expr: str) -> str:
    return rf"split_part(coalesce({expr}, ''), E'\n', 1)"


def _clip(expr: str) -> str:
    return f"left({expr}, %SNAP%)"


def _ended(status: str) -> str:
    return f"{status} IN ('DONE', 'FAILED', 'CANCELLED')"


def _node_of(owner: str) -> str:
    """The node part of an owner id (<node_id>#<n>.<random>: before the last '#')."""
    return f"coalesce(nullif(substring({owner} FROM '^(.*)#[^#]*$'), ''), {owner})"


def _ours(row: str) -> str:
    """A row whose status is none of ours is not a job record: refuse it, change nothing."""
    return f"""IF {row}.status IS NULL
    OR {row}.status NOT IN ('PENDING', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED') THEN
    RAISE EXCEPTION USING MESSAGE = 'AILEASE_CORRUPT', HINT = p_key,
      DETAIL = format('field ''status'' holds %L', left({row}.status, 40));
  END IF;"""


def _lean(row: str, keep_checkpoint: bool) -> str:
    """The record without its big fields (what a grant, a refusal or a fresh write returns)."""
    drop = "" if keep_checkpoint else f" {row}.checkpoint := NULL;"
    return f"{row}.spec := NULL; {row}.result := NULL; {row}.stall_snapshot := NULL;{drop}"


def _note(kind: str, owner: str, token: str, stage: str, detail: str, limit: str = "200") -> str:
    """One timeline entry, numbered from 1 per key (the last one's seq + 1: every caller
    holds the job's row lock, so the numbers of one key are taken one at a time); the last
    %CAP% are kept, and the first kept one's seq says how many were dropped."""
    return f"""INSERT INTO ail_timeline (key, seq, at, kind, owner_id, token, stage, detail)
    SELECT p_key, coalesce(max(x.seq), 0) + 1, v_now, {kind}, {_flat(owner)},
      coalesce({token}, 0), {_flat(stage)}, {_flat(detail, limit)}
    FROM ail_timeline x WHERE x.key = p_key RETURNING seq INTO v_seq;
  IF v_seq > %CAP% THEN
    DELETE FROM ail_timeline x WHERE x.key = p_key AND x.seq <= v_seq - %CAP%;
  END IF;"""


# Wake the job's followers (schema.py's ail_notify, spelled out; {channel} is filled in by
# the migration).
_NOTIFY = """PERFORM pg_notify({channel}, CASE WHEN octet_length(p_key) <= %PAYLOAD_LIMIT%
    THEN p_key ELSE 'sha256:' || encode(sha256(convert_to(p_key, 'UTF8')), 'hex') END);"""

_TAKEN = "format('%s from %s token %s', v_cause, r.owner_id, r.token)"

# rules.acquire: o_kind acquired | following | finished | conflict; o_taken with o_cause
# (expired | released | stalled) for another node's takeover.
_ACQUIRE = rf"""
CREATE FUNCTION ail_acquire(p_key text, p_owner text, p_ttl double precision,
  p_mnp double precision, p_policy text, p_fp text, p_max_attempts int,
  p_renew_interval double precision)
RETURNS TABLE (o_kind text, o_at double precision, o_taken boolean, o_cause text,
  o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := %NOW%; v_seq int; v_judged boolean := false;
  r ail_jobs; n ail_jobs; v_new boolean := false; v_cause text; v_token bigint;
BEGIN
  LOOP  -- a job nobody held (submitted) granted in one statement; else locked and judged
    UPDATE ail_jobs j SET status = 'RUNNING', owner_id = p_owner,
      token = greatest(nextval('ail_tokens'), j.token + 1),
      stage = NULL, progress_version = 0, heartbeat_at = v_now, last_progress_at = v_now,
      lease_expires_at = v_now + p_ttl, max_no_progress = p_mnp, stall_policy = p_policy,
      renew_interval = p_renew_interval, attempts = j.attempts + 1,
      started_at = coalesce(j.started_at, v_now),
      fingerprint = coalesce(nullif(j.fingerprint, ''), nullif(p_fp, '')), updated_at = v_now,
      takeovers = j.takeovers + (v_cause IS NOT NULL)::int,
      takeover_cause = coalesce(v_cause, j.takeover_cause)
    WHERE j.key = p_key AND (v_judged OR (j.status = 'PENDING' AND coalesce(j.owner_id, '') = ''
      AND (p_max_attempts IS NULL OR j.attempts < p_max_attempts)
      AND (p_fp = '' OR coalesce(j.fingerprint, '') IN ('', p_fp))))
    RETURNING * INTO n;
    EXIT WHEN FOUND;
    -- Again only if the record went (a forced remove) between a lost insert and the lock.
    LOOP
      SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
      EXIT WHEN FOUND;
      IF coalesce(p_max_attempts, 1) > 0 THEN  -- a new job, granted in one write
        v_token := nextval('ail_tokens');
        INSERT INTO ail_jobs AS j (key, status, owner_id, token, heartbeat_at, last_progress_at,
          lease_expires_at, max_no_progress, stall_policy, renew_interval, attempts, started_at,
          fingerprint, created_at, updated_at)
        VALUES (p_key, 'RUNNING', p_owner, v_token, v_now, v_now, v_now + p_ttl, p_mnp,
          p_policy, p_renew_interval, 1, v_now, nullif(p_fp, ''), v_now, v_now)
        ON CONFLICT (key) DO NOTHING RETURNING * INTO n;
        IF n.key IS NOT NULL THEN
          {_note("'acquired'", "p_owner", "v_token", "''", "'attempt 1'")}
          {_lean("n", True)}
          RETURN QUERY SELECT 'acquired'::text, v_now, false, NULL::text, n;
          RETURN;
        END IF;  -- a racing acquirer made it first: judged below like any record
      ELSE  -- a new job with no attempts allowed: given up at once
        INSERT INTO ail_jobs (key, status, created_at, updated_at)
        VALUES (p_key, 'PENDING', v_now, v_now) ON CONFLICT (key) DO NOTHING;
        v_new := FOUND;
      END IF;
    END LOOP;
    {_ours("r")}
    IF NOT v_new THEN
      IF p_fp <> '' AND coalesce(r.fingerprint, '') <> '' AND r.fingerprint <> p_fp THEN
        RETURN QUERY SELECT 'conflict'::text, v_now, false, NULL::text, NULL::ail_jobs;
        RETURN;
      END IF;
      IF {_ended("r.status")} THEN
        RETURN QUERY SELECT 'finished'::text, v_now, false, NULL::text, r;
        RETURN;
      END IF;
      IF r.status = 'RUNNING' AND coalesce(r.lease_expires_at, 0) > v_now THEN
        IF r.owner_id = p_owner THEN  -- a repeated acquire (a lost reply): the same token
          {_lean("r", True)}
          RETURN QUERY SELECT 'acquired'::text, v_now, false, NULL::text, r;
        ELSE
          {_lean("r", False)}
          RETURN QUERY SELECT 'following'::text, v_now, false, NULL::text, r;
        END IF;
        RETURN;
      END IF;
    END IF;
    IF p_max_attempts IS NOT NULL AND r.attempts >= p_max_attempts THEN  -- given up
      UPDATE ail_jobs j SET status = 'FAILED', lease_expires_at = NULL, checkpoint = NULL,
        updated_at = v_now, fingerprint = coalesce(nullif(j.fingerprint, ''), nullif(p_fp, '')),
        failure_kind = 'gave_up'  -- a code; the last error is kept, Python renders the words
      WHERE j.key = p_key RETURNING * INTO n;
      IF NOT v_new THEN
        {_note("'failed'", "r.owner_id", "r.token", "''", "format('gave_up:%s', r.attempts)")}
      END IF;
      {_NOTIFY}
      RETURN QUERY SELECT 'finished'::text, v_now, false, NULL::text, n;
      RETURN;
    END IF;
    IF coalesce(r.owner_id, '') <> '' AND {_node_of("r.owner_id")} <> {_node_of("p_owner")} THEN
      v_cause := CASE WHEN r.stalled_attempt > 0 AND r.stalled_attempt = r.attempts
        THEN 'stalled' WHEN r.status = 'PENDING' THEN 'released' ELSE 'expired' END;
    END IF;
    v_judged := true;  -- the record is locked and may be taken: written on the next turn
  END LOOP;
  IF v_cause IS NOT NULL THEN
    {_note("'taken_over'", "p_owner", "n.token", "''", _TAKEN)}
  ELSE
    {_note("'acquired'", "p_owner", "n.token", "''", "format('attempt %s', n.attempts)")}
  END IF;
  {_lean("n", True)}
  RETURN QUERY SELECT 'acquired'::text, v_now, v_cause IS NOT NULL, v_cause, n;
END $$;
"""

_RENEWED = """format('progress +%s', v_version - r.progress_version)
      || CASE WHEN v_stalled THEN ', stalled (alert)' ELSE '' END"""

# rules.renew: o_code ok | missing | not_owner | not_running | expired | no_progress, with
# the lease's remaining seconds and (refused) the fence the store holds.
_RENEW = rf"""
CREATE FUNCTION ail_renew(p_key text, p_owner text, p_token bigint, p_ttl double precision,
  p_stage text, p_version bigint, p_mnp double precision, p_grace double precision,
  p_checkpoint text)
RETURNS TABLE (o_code text, o_remaining double precision, o_token bigint, o_owner text,
  o_stalled boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := %NOW%; v_seq int;
  r ail_jobs; v_code text; v_last double precision; v_version bigint;
  v_stalled boolean; v_granted boolean;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'missing'::text, 0::double precision, NULL::bigint, NULL::text, false;
    RETURN;
  END IF;
  {_ours("r")}
  v_code := CASE
    WHEN r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner THEN 'not_owner'
    WHEN r.status <> 'RUNNING' THEN 'not_running'
    WHEN coalesce(r.lease_expires_at, 0) <= v_now THEN 'expired' END;
  IF v_code IS NOT NULL THEN
    {_note("'renew_refused'", "p_owner", "p_token", "p_stage", "v_code")}
    RETURN QUERY SELECT v_code, 0::double precision, r.token, r.owner_id, false;
    RETURN;
  END IF;
  v_last := coalesce(r.last_progress_at, v_now);
  v_version := r.progress_version;
  IF p_version > v_version THEN v_version := p_version; v_last := v_now; END IF;
  v_stalled := v_now - v_last > p_mnp + p_grace;
  v_granted := NOT v_stalled OR r.stall_policy = 'alert';
  UPDATE ail_jobs j SET stage = p_stage, max_no_progress = p_mnp, renew_interval = p_grace,
    progress_version = v_version, last_progress_at = v_last, updated_at = v_now,
    missed_renewals = j.missed_renewals + v_stalled::int,
    stalled_attempt = CASE WHEN v_stalled THEN j.attempts ELSE j.stalled_attempt END,
    heartbeat_at = CASE WHEN v_granted THEN v_now ELSE j.heartbeat_at END,
    lease_expires_at = CASE WHEN v_granted THEN v_now + p_ttl ELSE j.lease_expires_at END,
    checkpoint = CASE WHEN v_granted THEN coalesce(p_checkpoint, j.checkpoint)
      ELSE j.checkpoint END
  WHERE j.key = p_key;
  IF NOT v_granted THEN
    {_note("'renew_refused'", "p_owner", "p_token", "p_stage", "'no_progress'")}
    RETURN QUERY SELECT 'no_progress'::text,
      greatest(0, coalesce(r.lease_expires_at, v_now) - v_now), p_token, p_owner, false;
    RETURN;
  END IF;
  {_note("'renewed'", "p_owner", "p_token", "p_stage", _RENEWED)}
  RETURN QUERY SELECT 'ok'::text, p_ttl, NULL::bigint, NULL::text, v_stalled;
END $$;
"""

_RELEASED = f"""concat_ws('; ', CASE WHEN p_interrupted THEN 'interrupted' END,
      CASE WHEN p_snapshot <> '' THEN 'snapshot stored' END,
      CASE WHEN p_error <> '' THEN {_first_line("p_error")} END)"""

# rules.release: true when the fence held a RUNNING job (its lease may have lapsed).
_RELEASE = rf"""
CREATE FUNCTION ail_release(p_key text, p_owner text, p_token bigint, p_error text,
  p_snapshot text, p_interrupted boolean) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := %NOW%; v_seq int; r ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  {_ours("r")}
  IF r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner OR r.status <> 'RUNNING' THEN
    RETURN false;
  END IF;
  UPDATE ail_jobs j SET status = 'PENDING', lease_expires_at = v_now, updated_at = v_now,
    attempts = CASE WHEN p_interrupted THEN greatest(0, j.attempts - 1) ELSE j.attempts END,
    last_error = coalesce({_clip("p_error")}, j.last_error),
    last_error_attempt = CASE WHEN p_error IS NULL THEN j.last_error_attempt ELSE j.attempts END,
    last_error_owner = CASE WHEN p_error IS NULL THEN j.last_error_owner ELSE j.owner_id END,
    stalled_attempt = CASE WHEN p_snapshot IS NULL THEN j.stalled_attempt ELSE j.attempts END,
    stall_snapshot = coalesce({_clip("p_snapshot")}, j.stall_snapshot)
  WHERE j.key = p_key;
  {_note("'released'", "p_owner", "p_token", "r.stage", _RELEASED)}
  {_NOTIFY}
  RETURN true;
END $$;
"""

# rules.finish (commit: DONE with the result; fail: FAILED with the reason), fenced on the
# (token, owner) pair: o_kind written (this call wrote it) | ok (its owner's repeat: the
# stored record) | rejected (o_code the refusal, o_token/o_owner the fence the store holds).
_FINISH = rf"""
CREATE FUNCTION ail_finish(p_key text, p_owner text, p_token bigint, p_status text,
  p_value text, p_reason text, p_provider text, p_model text, p_prompt int,
  p_completion int, p_reasoning int, p_first_token double precision,
  p_first_visible double precision, p_durations text, p_failure_kind text)
RETURNS TABLE (o_kind text, o_at double precision, o_code text, o_token bigint,
  o_owner text, o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := %NOW%; v_seq int;
  r ail_jobs; n ail_jobs; v_mine boolean; v_code text; v_done boolean := p_status = 'DONE';
BEGIN
  -- The fence holding a job not yet ended (the common case): written in one statement,
  -- no lock taken first; else the record is locked and judged.
  LOOP
    UPDATE ail_jobs j SET status = p_status, lease_expires_at = NULL, updated_at = v_now,
      finished_at = v_now, checkpoint = NULL,
      result = CASE WHEN v_done THEN p_value ELSE j.result END,
      stage = CASE WHEN v_done THEN 'done' ELSE j.stage END,
      finish_reason = CASE WHEN v_done THEN nullif(p_reason, '') ELSE j.finish_reason END,
      last_error = CASE WHEN v_done THEN j.last_error ELSE {_clip("p_value")} END,
      failure_kind = CASE WHEN v_done THEN NULL ELSE coalesce(p_failure_kind, 'error') END,
      last_error_attempt = CASE WHEN v_done THEN j.last_error_attempt ELSE j.attempts END,
      last_error_owner = CASE WHEN v_done THEN j.last_error_owner ELSE j.owner_id END,
      provider = coalesce(nullif(p_provider, ''), j.provider),
      model = coalesce(nullif(p_model, ''), j.model),
      prompt_tokens = coalesce(p_prompt, j.prompt_tokens),
      completion_tokens = coalesce(p_completion, j.completion_tokens),
      reasoning_tokens = coalesce(p_reasoning, j.reasoning_tokens),
      first_token_s = coalesce(p_first_token, j.first_token_s),
      first_visible_s = coalesce(p_first_visible, j.first_visible_s),
      stage_durations = coalesce(p_durations, j.stage_durations)
    WHERE j.key = p_key AND j.token = p_token AND j.owner_id = p_owner
      AND j.status IN ('PENDING', 'RUNNING') RETURNING * INTO n;
    EXIT WHEN FOUND;
    SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'rejected'::text, v_now, 'missing'::text, NULL::bigint, NULL::text,
        NULL::ail_jobs;
      RETURN;
    END IF;
    {_ours("r")}
    v_mine := coalesce(r.token = p_token AND r.owner_id = p_owner, false);
    IF {_ended("r.status")} AND v_mine AND r.status = p_status THEN  -- repeated: as stored
      RETURN QUERY SELECT 'ok'::text, v_now, NULL::text, NULL::bigint, NULL::text, r;
      RETURN;
    END IF;
    IF {_ended("r.status")} OR NOT v_mine THEN
      v_code := CASE WHEN NOT {_ended("r.status")} THEN 'newer_owner'
        WHEN r.status = 'CANCELLED' THEN 'cancelled'
        WHEN r.status = 'DONE' AND v_done THEN 'already_committed'
        ELSE 'already_finished' END;
      {_note("'fenced_write_rejected'", "p_owner", "p_token", "r.stage", "v_code")}
      RETURN QUERY SELECT 'rejected'::text, v_now, v_code, r.token, r.owner_id, NULL::ail_jobs;
      RETURN;
    END IF;
  END LOOP;  -- the fence holds after all: written on the next turn
  IF v_done THEN
    {_note("'committed'", "p_owner", "p_token", "n.stage", "coalesce(p_reason, '')")}
  ELSE
    {_note("'failed'", "p_owner", "p_token", "n.stage", _first_line("p_value"))}
  END IF;
  DELETE FROM ail_queue q WHERE q.key = p_key;  -- off the workers' schedule: nothing to run
  DELETE FROM ail_recovery q WHERE q.key = p_key;
  {_NOTIFY}
  {_lean("n", False)}
  RETURN QUERY SELECT 'written'::text, v_now, NULL::text, NULL::bigint, NULL::text, n;
END $$;
"""

_STALLED = "'snapshot stored: ' || " + _first_line("p_snapshot")

# rules.report_stall: true when the fence holds a job not yet ended.
_REPORT_STALL = rf"""
CREATE FUNCTION ail_report_stall(p_key text, p_owner text, p_token bigint, p_stage text,
  p_snapshot text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := %NOW%; v_seq int; r ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  {_ours("r")}
  IF r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner OR {_ended("r.status")} THEN
    RETURN false;
  END IF;
  UPDATE ail_jobs j SET stall_snapshot = {_clip("p_snapshot")}, stage = p_stage,
    updated_at = v_now, last_error = {_clip(_first_line("p_snapshot"))},
    last_error_attempt = j.attempts, last_error_owner = j.owner_id,
    stalled_attempt = j.attempts
  WHERE j.key = p_key;
  {_note("'stalled'", "p_owner", "p_token", "p_stage", _STALLED)}
  RETURN true;
END $$;
"""

# rules.cancel: not fenced; a job not yet ended becomes CANCELLED (and leaves the queue and
# the recovery looks); an ended one is returned as it is; an unknown key returns no row.
_CANCEL = rf"""
CREATE FUNCTION ail_cancel(p_key text, p_reason text)
RETURNS TABLE (o_at double precision, o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := %NOW%; v_seq int; r ail_jobs; n ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN; END IF;
  {_ours("r")}
  IF {_ended("r.status")} THEN
    RETURN QUERY SELECT v_now, r;
    RETURN;
  END IF;
  UPDATE ail_jobs j SET status = 'CANCELLED', lease_expires_at = NULL, checkpoint = NULL,
    last_error_attempt = NULL, last_error_owner = NULL, last_error = {_clip("p_reason")},
    updated_at = v_now
  WHERE j.key = p_key RETURNING * INTO n;
  {_note("'cancelled'", "r.owner_id", "r.token", "r.stage", "p_reason")}
  DELETE FROM ail_queue q WHERE q.key = p_key;
  DELETE FROM ail_recovery q WHERE q.key = p_key;
  {_NOTIFY}
  RETURN QUERY SELECT v_now, n;
END $$;
"""

# The termination ladder's notes (NOTE_KINDS): not fenced, appended to an existing job only.
_NOTE = rf"""
CREATE FUNCTION ail_note_job(p_key text, p_kind text, p_detail text, p_owner text,
  p_token bigint, p_stage text, p_limit int) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := %NOW%; v_seq int;
BEGIN
  PERFORM 1 FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  {_note("p_kind", "p_owner", "p_token", "p_stage", "p_detail", "p_limit")}
  RETURN true;
END $$;
"""

FUNCTIONS = (
    (_ACQUIRE + _RENEW + _RELEASE + _FINISH + _REPORT_STALL + _CANCEL + _NOTE)
    .replace("%NOW%", "extract(epoch FROM clock_timestamp())")
    .replace("%CAP%", str(TIMELINE_CAP))
    .replace("%SNAP%", str(SNAPSHOT_LIMIT))
)
"""The lease functions' DDL (one part of the migration, stores/postgres/schema.py)."""
