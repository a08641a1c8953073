"""The PostgreSQL store's lease functions: the rules of :mod:`ai_lease.lease.rules` in plpgsql.

One function per lease operation (``ail_acquire``, ``ail_renew``, ``ail_release``,
``ail_finish`` for commit and fail, ``ail_report_stall``, ``ail_cancel``, ``ail_note``), each
called by one ``SELECT``: one round trip, one transaction. Each locks the job's row
(``FOR UPDATE``), judges by the database's clock (``ail_now()``: ``clock_timestamp()``, read
once per call) and notes what it did in the job's timeline in the same transaction
(``ail_timeline`` / ``ail_timeline_heads``: the details the Redis scripts and the SQLite
store write). A function that ends a lease or a job wakes its followers
(``ail_notify``: NOTIFY on the namespace's channel, the key as payload), delivered when the
transaction commits. Fencing tokens are ``greatest(nextval('ail_tokens'), previous + 1)``:
from a WAL-logged sequence, so they keep increasing across restarts and a promoted
standby, and never go down for a record.

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

_HELPERS = r"""
CREATE FUNCTION ail_flat(s text, n int DEFAULT 200) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT translate(left(coalesce(s, ''), n), E'\t\r\n', '   ') $$;

CREATE FUNCTION ail_first_line(s text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT split_part(coalesce(s, ''), E'\n', 1) $$;

CREATE FUNCTION ail_clip(s text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT left(s, %SNAP%) $$;

-- The node part of an owner id (<node_id>#<n>.<random>: before the last '#').
CREATE FUNCTION ail_node_of(o text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT coalesce(nullif(substring(o FROM '^(.*)#[^#]*$'), ''), o) $$;

CREATE FUNCTION ail_ended(s text) RETURNS boolean LANGUAGE sql IMMUTABLE
AS $$ SELECT s IN ('DONE', 'FAILED', 'CANCELLED') $$;

-- A row whose status is none of ours is not a job record: refuse it, change nothing.
CREATE FUNCTION ail_ours(p_key text, p_status text) RETURNS void LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF p_status IS NULL OR p_status NOT IN ('PENDING', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED')
  THEN
    RAISE EXCEPTION USING MESSAGE = 'AILEASE_CORRUPT', HINT = p_key,
      DETAIL = format('field ''status'' holds %L', left(p_status, 40));
  END IF;
END $$;

-- A record without its big fields (what a grant, a refusal or a fresh write returns).
CREATE FUNCTION ail_lean(r ail_jobs, keep_checkpoint boolean) RETURNS ail_jobs
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  r.spec := NULL; r.result := NULL; r.stall_snapshot := NULL;
  IF NOT keep_checkpoint THEN r.checkpoint := NULL; END IF;
  RETURN r;
END $$;

-- One timeline entry, numbered from 1 per key; the last %CAP% are kept, and the first kept
-- one's seq says how many were dropped.
CREATE FUNCTION ail_note(p_key text, p_at double precision, p_kind text, p_owner text,
  p_token bigint, p_stage text, p_detail text, p_limit int DEFAULT 200) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE v_seq int;
BEGIN
  INSERT INTO ail_timeline_heads AS h (key, next_seq, dropped) VALUES (p_key, 2, 0)
  ON CONFLICT (key) DO UPDATE SET next_seq = h.next_seq + 1
  RETURNING h.next_seq - 1 INTO v_seq;
  INSERT INTO ail_timeline (key, seq, at, kind, owner_id, token, stage, detail)
  VALUES (p_key, v_seq, p_at, p_kind, ail_flat(p_owner), coalesce(p_token, 0),
    ail_flat(p_stage), ail_flat(p_detail, p_limit));
  IF v_seq > %CAP% THEN
    DELETE FROM ail_timeline t WHERE t.key = p_key AND t.seq <= v_seq - %CAP%;
    UPDATE ail_timeline_heads h SET dropped = v_seq - %CAP% WHERE h.key = p_key;
  END IF;
END $$;
"""

# rules.acquire: o_kind acquired | following | finished | conflict; o_taken with o_cause
# (expired | released | stalled) for another node's takeover.
_ACQUIRE = r"""
CREATE FUNCTION ail_acquire(p_key text, p_owner text, p_ttl double precision,
  p_mnp double precision, p_policy text, p_fp text, p_max_attempts int,
  p_renew_interval double precision)
RETURNS TABLE (o_kind text, o_at double precision, o_taken boolean, o_cause text,
  o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := ail_now();
  r ail_jobs; n ail_jobs; v_new boolean := false; v_cause text; v_token bigint;
BEGIN
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
        PERFORM ail_note(p_key, v_now, 'acquired', p_owner, v_token, '', 'attempt 1');
        RETURN QUERY SELECT 'acquired'::text, v_now, false, NULL::text, ail_lean(n, true);
        RETURN;
      END IF;  -- a racing acquirer made it first: judged below like any record
    ELSE  -- a new job with no attempts allowed: given up at once
      INSERT INTO ail_jobs (key, status, created_at, updated_at)
      VALUES (p_key, 'PENDING', v_now, v_now) ON CONFLICT (key) DO NOTHING;
      v_new := FOUND;
    END IF;
  END LOOP;
  PERFORM ail_ours(p_key, r.status);
  IF NOT v_new THEN
    IF p_fp <> '' AND coalesce(r.fingerprint, '') <> '' AND r.fingerprint <> p_fp THEN
      RETURN QUERY SELECT 'conflict'::text, v_now, false, NULL::text, NULL::ail_jobs;
      RETURN;
    END IF;
    IF ail_ended(r.status) THEN
      RETURN QUERY SELECT 'finished'::text, v_now, false, NULL::text, r;
      RETURN;
    END IF;
    IF r.status = 'RUNNING' AND coalesce(r.lease_expires_at, 0) > v_now THEN
      IF r.owner_id = p_owner THEN  -- a repeated acquire (a lost reply): the same token
        RETURN QUERY SELECT 'acquired'::text, v_now, false, NULL::text, ail_lean(r, true);
      ELSE
        RETURN QUERY SELECT 'following'::text, v_now, false, NULL::text, ail_lean(r, false);
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
      PERFORM ail_note(p_key, v_now, 'failed', r.owner_id, r.token, '',
        format('gave_up:%s', r.attempts));
    END IF;
    PERFORM ail_notify(p_key);
    RETURN QUERY SELECT 'finished'::text, v_now, false, NULL::text, n;
    RETURN;
  END IF;
  IF coalesce(r.owner_id, '') <> '' AND ail_node_of(r.owner_id) <> ail_node_of(p_owner) THEN
    v_cause := CASE WHEN r.stalled_attempt > 0 AND r.stalled_attempt = r.attempts
      THEN 'stalled' WHEN r.status = 'PENDING' THEN 'released' ELSE 'expired' END;
  END IF;
  v_token := greatest(nextval('ail_tokens'), r.token + 1);
  UPDATE ail_jobs j SET status = 'RUNNING', owner_id = p_owner, token = v_token,
    stage = NULL, progress_version = 0, heartbeat_at = v_now, last_progress_at = v_now,
    lease_expires_at = v_now + p_ttl, max_no_progress = p_mnp, stall_policy = p_policy,
    renew_interval = p_renew_interval, attempts = j.attempts + 1,
    started_at = coalesce(j.started_at, v_now),
    fingerprint = coalesce(nullif(j.fingerprint, ''), nullif(p_fp, '')), updated_at = v_now,
    takeovers = j.takeovers + (v_cause IS NOT NULL)::int,
    takeover_cause = coalesce(v_cause, j.takeover_cause)
  WHERE j.key = p_key RETURNING * INTO n;
  IF v_cause IS NOT NULL THEN
    PERFORM ail_note(p_key, v_now, 'taken_over', p_owner, v_token, '',
      format('%s from %s token %s', v_cause, r.owner_id, r.token));
  ELSE
    PERFORM ail_note(p_key, v_now, 'acquired', p_owner, v_token, '',
      format('attempt %s', n.attempts));
  END IF;
  RETURN QUERY SELECT 'acquired'::text, v_now, v_cause IS NOT NULL, v_cause, ail_lean(n, true);
END $$;
"""

# rules.renew: o_code ok | missing | not_owner | not_running | expired | no_progress, with
# the lease's remaining seconds and (refused) the fence the store holds.
_RENEW = r"""
CREATE FUNCTION ail_renew(p_key text, p_owner text, p_token bigint, p_ttl double precision,
  p_stage text, p_version bigint, p_mnp double precision, p_grace double precision,
  p_checkpoint text)
RETURNS TABLE (o_code text, o_remaining double precision, o_token bigint, o_owner text,
  o_stalled boolean)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := ail_now();
  r ail_jobs; v_code text; v_last double precision; v_version bigint;
  v_stalled boolean; v_granted boolean;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'missing'::text, 0::double precision, NULL::bigint, NULL::text, false;
    RETURN;
  END IF;
  PERFORM ail_ours(p_key, r.status);
  v_code := CASE
    WHEN r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner THEN 'not_owner'
    WHEN r.status <> 'RUNNING' THEN 'not_running'
    WHEN coalesce(r.lease_expires_at, 0) <= v_now THEN 'expired' END;
  IF v_code IS NOT NULL THEN
    PERFORM ail_note(p_key, v_now, 'renew_refused', p_owner, p_token, p_stage, v_code);
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
    PERFORM ail_note(p_key, v_now, 'renew_refused', p_owner, p_token, p_stage, 'no_progress');
    RETURN QUERY SELECT 'no_progress'::text,
      greatest(0, coalesce(r.lease_expires_at, v_now) - v_now), p_token, p_owner, false;
    RETURN;
  END IF;
  PERFORM ail_note(p_key, v_now, 'renewed', p_owner, p_token, p_stage,
    format('progress +%s', v_version - r.progress_version)
      || CASE WHEN v_stalled THEN ', stalled (alert)' ELSE '' END);
  RETURN QUERY SELECT 'ok'::text, p_ttl, NULL::bigint, NULL::text, v_stalled;
END $$;
"""

# rules.release: true when the fence held a RUNNING job (its lease may have lapsed).
_RELEASE = r"""
CREATE FUNCTION ail_release(p_key text, p_owner text, p_token bigint, p_error text,
  p_snapshot text, p_interrupted boolean) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := ail_now(); r ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  PERFORM ail_ours(p_key, r.status);
  IF r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner OR r.status <> 'RUNNING' THEN
    RETURN false;
  END IF;
  UPDATE ail_jobs j SET status = 'PENDING', lease_expires_at = v_now, updated_at = v_now,
    attempts = CASE WHEN p_interrupted THEN greatest(0, j.attempts - 1) ELSE j.attempts END,
    last_error = coalesce(ail_clip(p_error), j.last_error),
    last_error_attempt = CASE WHEN p_error IS NULL THEN j.last_error_attempt ELSE j.attempts END,
    last_error_owner = CASE WHEN p_error IS NULL THEN j.last_error_owner ELSE j.owner_id END,
    stalled_attempt = CASE WHEN p_snapshot IS NULL THEN j.stalled_attempt ELSE j.attempts END,
    stall_snapshot = coalesce(ail_clip(p_snapshot), j.stall_snapshot)
  WHERE j.key = p_key;
  PERFORM ail_note(p_key, v_now, 'released', p_owner, p_token, r.stage,
    concat_ws('; ', CASE WHEN p_interrupted THEN 'interrupted' END,
      CASE WHEN p_snapshot <> '' THEN 'snapshot stored' END,
      CASE WHEN p_error <> '' THEN ail_first_line(p_error) END));
  PERFORM ail_notify(p_key);
  RETURN true;
END $$;
"""

# rules.finish (commit: DONE with the result; fail: FAILED with the reason), fenced on the
# (token, owner) pair: o_kind written (this call wrote it) | ok (its owner's repeat: the
# stored record) | rejected (o_code the refusal, o_token/o_owner the fence the store holds).
_FINISH = r"""
CREATE FUNCTION ail_finish(p_key text, p_owner text, p_token bigint, p_status text,
  p_value text, p_reason text, p_provider text, p_model text, p_prompt int,
  p_completion int, p_reasoning int, p_first_token double precision,
  p_first_visible double precision, p_durations text, p_failure_kind text)
RETURNS TABLE (o_kind text, o_at double precision, o_code text, o_token bigint,
  o_owner text, o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := ail_now();
  r ail_jobs; n ail_jobs; v_mine boolean; v_code text; v_done boolean := p_status = 'DONE';
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'rejected'::text, v_now, 'missing'::text, NULL::bigint, NULL::text,
      NULL::ail_jobs;
    RETURN;
  END IF;
  PERFORM ail_ours(p_key, r.status);
  v_mine := coalesce(r.token = p_token AND r.owner_id = p_owner, false);
  IF ail_ended(r.status) AND v_mine AND r.status = p_status THEN  -- repeated: as stored
    RETURN QUERY SELECT 'ok'::text, v_now, NULL::text, NULL::bigint, NULL::text, r;
    RETURN;
  END IF;
  IF ail_ended(r.status) OR NOT v_mine THEN
    v_code := CASE WHEN NOT ail_ended(r.status) THEN 'newer_owner'
      WHEN r.status = 'CANCELLED' THEN 'cancelled'
      WHEN r.status = 'DONE' AND v_done THEN 'already_committed'
      ELSE 'already_finished' END;
    PERFORM ail_note(p_key, v_now, 'fenced_write_rejected', p_owner, p_token, r.stage, v_code);
    RETURN QUERY SELECT 'rejected'::text, v_now, v_code, r.token, r.owner_id, NULL::ail_jobs;
    RETURN;
  END IF;
  UPDATE ail_jobs j SET status = p_status, lease_expires_at = NULL, updated_at = v_now,
    finished_at = v_now, checkpoint = NULL,
    result = CASE WHEN v_done THEN p_value ELSE j.result END,
    stage = CASE WHEN v_done THEN 'done' ELSE j.stage END,
    finish_reason = CASE WHEN v_done THEN nullif(p_reason, '') ELSE j.finish_reason END,
    last_error = CASE WHEN v_done THEN j.last_error ELSE ail_clip(p_value) END,
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
  WHERE j.key = p_key RETURNING * INTO n;
  IF v_done THEN
    PERFORM ail_note(p_key, v_now, 'committed', p_owner, p_token, n.stage,
      coalesce(p_reason, ''));
  ELSE
    PERFORM ail_note(p_key, v_now, 'failed', p_owner, p_token, n.stage,
      ail_first_line(p_value));
  END IF;
  PERFORM ail_notify(p_key);
  RETURN QUERY SELECT 'written'::text, v_now, NULL::text, NULL::bigint, NULL::text,
    ail_lean(n, false);
END $$;
"""

# rules.report_stall: true when the fence holds a job not yet ended.
_REPORT_STALL = r"""
CREATE FUNCTION ail_report_stall(p_key text, p_owner text, p_token bigint, p_stage text,
  p_snapshot text) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := ail_now(); r ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  PERFORM ail_ours(p_key, r.status);
  IF r.token <> p_token OR r.owner_id IS DISTINCT FROM p_owner OR ail_ended(r.status) THEN
    RETURN false;
  END IF;
  UPDATE ail_jobs j SET stall_snapshot = ail_clip(p_snapshot), stage = p_stage,
    updated_at = v_now, last_error = ail_clip(ail_first_line(p_snapshot)),
    last_error_attempt = j.attempts, last_error_owner = j.owner_id,
    stalled_attempt = j.attempts
  WHERE j.key = p_key;
  PERFORM ail_note(p_key, v_now, 'stalled', p_owner, p_token, p_stage,
    'snapshot stored: ' || ail_first_line(p_snapshot));
  RETURN true;
END $$;
"""

# rules.cancel: not fenced; a job not yet ended becomes CANCELLED (and leaves the queue and
# the recovery looks); an ended one is returned as it is; an unknown key returns no row.
_CANCEL = r"""
CREATE FUNCTION ail_cancel(p_key text, p_reason text)
RETURNS TABLE (o_at double precision, o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := ail_now(); r ail_jobs; n ail_jobs;
BEGIN
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN; END IF;
  PERFORM ail_ours(p_key, r.status);
  IF ail_ended(r.status) THEN
    RETURN QUERY SELECT v_now, r;
    RETURN;
  END IF;
  UPDATE ail_jobs j SET status = 'CANCELLED', lease_expires_at = NULL, checkpoint = NULL,
    last_error_attempt = NULL, last_error_owner = NULL, last_error = ail_clip(p_reason),
    updated_at = v_now
  WHERE j.key = p_key RETURNING * INTO n;
  PERFORM ail_note(p_key, v_now, 'cancelled', r.owner_id, r.token, r.stage, p_reason);
  DELETE FROM ail_queue q WHERE q.key = p_key;
  DELETE FROM ail_recovery q WHERE q.key = p_key;
  PERFORM ail_notify(p_key);
  RETURN QUERY SELECT v_now, n;
END $$;
"""

# The termination ladder's notes (NOTE_KINDS): not fenced, appended to an existing job only.
_NOTE = r"""
CREATE FUNCTION ail_note_job(p_key text, p_kind text, p_detail text, p_owner text,
  p_token bigint, p_stage text, p_limit int) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
  PERFORM 1 FROM ail_jobs j WHERE j.key = p_key FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  PERFORM ail_note(p_key, ail_now(), p_kind, p_owner, p_token, p_stage, p_detail, p_limit);
  RETURN true;
END $$;
"""

FUNCTIONS = (
    (_HELPERS + _ACQUIRE + _RENEW + _RELEASE + _FINISH + _REPORT_STALL + _CANCEL + _NOTE)
    .replace("%CAP%", str(TIMELINE_CAP))
    .replace("%SNAP%", str(SNAPSHOT_LIMIT))
)
"""The lease functions' DDL (one part of the migration, stores/postgres/schema.py)."""
