"""The PostgreSQL store's queue, workers and admin functions (plpgsql), one call per operation.

The migration (stores/postgres/schema.py) installs :data:`FUNCTIONS` in the store's schema
with ``SET search_path FROM CURRENT``, so tables are named unqualified here. Each function
judges time by the server's clock (``clock_timestamp()``) and is one transaction; a function
that returns a job returns it as ``o_job`` (a row of ``ail_jobs``), read at ``o_now``.

The connection layer sends a call once more on a fresh connection when its own broke under
it (the first may have committed), so it matters which are safe to run twice. Safe, the
same state either way: ``ail_submit`` (an existing job of the same fingerprint is
returned), ``ail_reschedule`` and ``ail_recover_at`` (they set a time), ``ail_worker_beat``
(an upsert), ``ail_due`` (a claim is a hint; claimed again, it is held a little longer).
Safe for the state, though the second answer may differ from the lost first one:
``ail_retry`` (the job is PENDING already), ``ail_remove`` (the second finds it gone),
``ail_prune`` (the second deletes the next batch; the count of the first is lost). Not
safe, so never resent (``resend=False``): ``ail_add_durations`` adds to counts, which a
second run would count twice.

The schedule and the heartbeats are hints (a worker corrects them; the lease judges), so
``ail_due``, ``ail_reschedule``, ``ail_recover_at`` and ``ail_worker_beat`` commit without
waiting for the WAL flush (``synchronous_commit = off`` for their own transaction only): a
crash may forget the last few of them, which costs a look, never a job. Everything else
(submit, retry, remove, prune, the histograms) commits as the database is configured.

The claim (``ail_due``) is one statement: ``FOR UPDATE SKIP LOCKED`` over the queue (lapsed
RUNNING leases with a queue entry first, the earliest lapse first, then the due entries),
pushing each claimed entry's ``due_at`` to ``now + hold``, so two callers in the same instant
get disjoint keys. A claim is a hint, never the judge: the lease decides who runs the job.
The caller passes back the claims it made itself (key and the ``due_at`` it set), which it
still sees as due until the hold ends, so a claim hides a key from the others only.
"""

from __future__ import annotations

__all__ = ["FUNCTIONS"]

_SUBMIT = r"""
-- A job for workers: PENDING with its spec, or the one already there (rules.submit); a
-- job that has not ended is due at once (its entry added or brought forward).
-- o_outcome: ok | conflict (another fingerprint) | corrupt (a status none of ours).
CREATE FUNCTION ail_submit(p_key text, p_spec text, p_fp text,
  OUT o_outcome text, OUT o_now double precision, OUT o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  o_now := extract(epoch FROM clock_timestamp());
  LOOP  -- again only if a remove came between the two statements
    INSERT INTO ail_jobs (key, status, spec, fingerprint, created_at, updated_at)
      VALUES (p_key, 'PENDING', p_spec, p_fp, o_now, o_now) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO o_job FROM ail_jobs WHERE key = p_key FOR UPDATE;
    EXIT WHEN FOUND;
  END LOOP;
  IF o_job.status NOT IN ('PENDING', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED') THEN
    o_outcome := 'corrupt';  -- not a record of ours: left as it is
    RETURN;
  END IF;
  IF coalesce(o_job.fingerprint, '') <> '' AND o_job.fingerprint <> p_fp THEN
    o_outcome := 'conflict';
    o_job := NULL;
    RETURN;
  END IF;
  IF o_job.spec IS NULL THEN
    UPDATE ail_jobs SET spec = p_spec, fingerprint = p_fp, updated_at = o_now
      WHERE key = p_key RETURNING * INTO o_job;
  END IF;
  IF o_job.status NOT IN ('DONE', 'FAILED', 'CANCELLED') THEN
    INSERT INTO ail_queue VALUES (p_key, o_now)
      ON CONFLICT (key) DO UPDATE SET due_at = least(ail_queue.due_at, excluded.due_at);
  END IF;
  o_outcome := 'ok';
END $$;
"""

_DUE = r"""
-- Up to p_limit keys to look at: lapsed RUNNING leases with a queue entry (the earliest
-- lapse first), then due entries (the longest-due first), each claimed (FOR UPDATE SKIP
-- LOCKED, due_at pushed to now + p_hold) unless it is one of the caller's own claims
-- (p_mine / p_mine_at: key and the due_at its claim set), which it sees as it left it.
-- A lapsed entry another caller may hold (due_at within twice the hold: a claim made
-- while this call ran lands up to one hold past this call's clock) waits until then.
-- Returns (key, the due_at this call set; NULL: one of the caller's own claims).
CREATE FUNCTION ail_due(p_limit int, p_hold double precision, p_mine text[],
  p_mine_at double precision[])
RETURNS TABLE (o_key text, o_claimed double precision)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
  v_now double precision := extract(epoch FROM clock_timestamp());
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);  -- a hint: no WAL flush waited for
  RETURN QUERY
  WITH mine AS (
    SELECT m.key, m.at FROM unnest(p_mine, p_mine_at) AS m(key, at)
  ), lapsed AS (
    SELECT q.key, 0 AS part, j.lease_expires_at AS ord, true AS claim
    FROM ail_queue q JOIN ail_jobs j ON j.key = q.key
    WHERE j.status = 'RUNNING' AND j.lease_expires_at <= v_now
      AND (q.due_at <= v_now OR q.due_at > v_now + 2 * p_hold)
    ORDER BY j.lease_expires_at, q.key LIMIT p_limit
    FOR UPDATE OF q SKIP LOCKED
  ), fresh AS (
    SELECT q.key, 1 AS part, q.due_at AS ord, true AS claim
    FROM ail_queue q WHERE q.due_at <= v_now
    ORDER BY q.due_at, q.key LIMIT p_limit
    FOR UPDATE OF q SKIP LOCKED
  ), own AS (
    SELECT q.key, CASE WHEN j.status = 'RUNNING' AND j.lease_expires_at <= v_now
      THEN 0 ELSE 1 END AS part, q.due_at - p_hold AS ord, false AS claim
    FROM ail_queue q JOIN mine m ON m.key = q.key AND m.at = q.due_at
    LEFT JOIN ail_jobs j ON j.key = q.key
    WHERE q.due_at > v_now
  ), picked AS (
    SELECT DISTINCT ON (u.key) u.key, u.part, u.ord, u.claim
    FROM (SELECT * FROM lapsed UNION ALL SELECT * FROM fresh UNION ALL SELECT * FROM own) u
    ORDER BY u.key, u.part, u.ord
  ), top AS (
    SELECT * FROM picked ORDER BY part, ord, key LIMIT p_limit
  ), claimed AS (
    UPDATE ail_queue q SET due_at = v_now + p_hold FROM top t
    WHERE q.key = t.key AND t.claim RETURNING q.key, q.due_at
  )
  SELECT t.key, c.due_at FROM top t LEFT JOIN claimed c ON c.key = t.key
  ORDER BY t.part, t.ord, t.key;
END $$;
"""

_SCHEDULE = r"""
-- Look at p_key again at p_at as plain work (NULL: take it off the schedule); any recovery
-- look goes.
CREATE FUNCTION ail_reschedule(p_key text, p_at double precision) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  DELETE FROM ail_recovery WHERE key = p_key;
  IF p_at IS NULL THEN
    DELETE FROM ail_queue WHERE key = p_key;
  ELSE
    INSERT INTO ail_queue VALUES (p_key, p_at)
      ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
  END IF;
END $$;

-- Look at p_key again at p_at as a recovery (its lease may lapse then): in the recovery
-- looks and in the queue.
CREATE FUNCTION ail_recover_at(p_key text, p_at double precision) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  INSERT INTO ail_queue VALUES (p_key, p_at)
    ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
  INSERT INTO ail_recovery VALUES (p_key, p_at)
    ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
END $$;
"""

_LOOK = r"""
-- A worker's look (ai_lease.lease.queue.next_look): the job, and its queue entry moved: off
-- the schedule when there is nothing to run (no job, an ended one, no spec), to a live
-- owner's lease expiry, or p_ttl on (the worker is about to run it: its own lease could
-- lapse then). No row: no such job. A status none of ours moves nothing.
CREATE FUNCTION ail_look(p_key text, p_ttl double precision)
RETURNS TABLE (o_now double precision, o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
  v_now double precision := extract(epoch FROM clock_timestamp());
  r ail_jobs; v_found boolean; v_at double precision;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  SELECT * INTO r FROM ail_jobs j WHERE j.key = p_key;
  v_found := FOUND;
  IF v_found AND r.status NOT IN ('PENDING', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED') THEN
    NULL;  -- not a record of ours: left as it is (the caller finds it corrupt)
  ELSIF v_found AND r.status IN ('PENDING', 'RUNNING') AND coalesce(r.spec, '') <> '' THEN
    v_at := CASE WHEN r.status = 'RUNNING' AND r.lease_expires_at > v_now
      THEN r.lease_expires_at ELSE v_now + p_ttl END;
    INSERT INTO ail_queue VALUES (p_key, v_at)
      ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
    INSERT INTO ail_recovery VALUES (p_key, v_at)
      ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
  ELSE
    DELETE FROM ail_recovery q WHERE q.key = p_key;
    DELETE FROM ail_queue q WHERE q.key = p_key;
  END IF;
  IF v_found THEN
    RETURN QUERY SELECT v_now, r;
  END IF;
END $$;
"""

_WORKERS = r"""
-- A worker's heartbeat: its entry (JSON, last_seen the server's clock) live for p_ttl
-- seconds; entries long expired go.
CREATE FUNCTION ail_worker_beat(p_id text, p_info text, p_ttl double precision) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
  v_now double precision := extract(epoch FROM clock_timestamp());
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  DELETE FROM ail_workers WHERE expires_at < v_now - 3600;
  INSERT INTO ail_workers VALUES (p_id, v_now + p_ttl,
      (p_info::jsonb || jsonb_build_object('last_seen', v_now))::text)
    ON CONFLICT (worker_id) DO UPDATE SET expires_at = excluded.expires_at,
      info = excluded.info;
END $$;

-- Counts added to the duration histograms (rows in key order: two writers never wait on
-- each other in a cycle).
CREATE FUNCTION ail_add_durations(p_pipeline text[], p_kind text[], p_stage text[],
  p_bucket int[], p_count bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO ail_durations
    SELECT * FROM unnest(p_pipeline, p_kind, p_stage, p_bucket, p_count)
      AS d(pipeline, kind, stage, bucket, count)
    ORDER BY 1, 2, 3, 4
    ON CONFLICT (pipeline, kind, stage, bucket)
      DO UPDATE SET count = ail_durations.count + excluded.count;
END $$;
"""

_ADMIN = r"""
-- A FAILED or CANCELLED job back to PENDING with a fresh attempt budget (rules.retry), due
-- at once, its followers woken; any other job as it is; o_job NULL: no such job.
CREATE FUNCTION ail_retry(p_key text, OUT o_now double precision, OUT o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  o_now := extract(epoch FROM clock_timestamp());
  UPDATE ail_jobs SET status = 'PENDING', attempts = 0, owner_id = NULL, checkpoint = NULL,
      failure_kind = NULL,
      lease_expires_at = NULL, started_at = NULL, created_at = o_now, updated_at = o_now
    WHERE key = p_key AND status IN ('FAILED', 'CANCELLED') RETURNING * INTO o_job;
  IF FOUND THEN
    DELETE FROM ail_recovery WHERE key = p_key;
    INSERT INTO ail_queue VALUES (p_key, o_now)
      ON CONFLICT (key) DO UPDATE SET due_at = excluded.due_at;
    PERFORM ail_notify(p_key);
  ELSE
    SELECT * INTO o_job FROM ail_jobs WHERE key = p_key;
  END IF;
END $$;

-- Delete every trace of the keys: records, queue entries, recovery looks, timelines.
CREATE FUNCTION ail_forget(p_keys text[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  DELETE FROM ail_jobs WHERE key = ANY(p_keys);
  DELETE FROM ail_queue WHERE key = ANY(p_keys);
  DELETE FROM ail_recovery WHERE key = ANY(p_keys);
  DELETE FROM ail_timeline WHERE key = ANY(p_keys);
END $$;

-- Delete the job and its entries unless it is RUNNING under a live lease and not forced
-- (rules.removable); a record of an unknown status is not ours: left alone ('corrupt').
-- o_outcome: removed | kept | corrupt | gone (no such job; its entries go all the same);
-- o_job: the record as it was.
CREATE FUNCTION ail_remove(p_key text, p_force boolean,
  OUT o_outcome text, OUT o_now double precision, OUT o_job ail_jobs)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  o_now := extract(epoch FROM clock_timestamp());
  SELECT * INTO o_job FROM ail_jobs WHERE key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    o_outcome := 'gone';
  ELSIF o_job.status NOT IN ('PENDING', 'RUNNING', 'DONE', 'FAILED', 'CANCELLED') THEN
    o_outcome := 'corrupt';
    RETURN;
  ELSIF NOT p_force AND o_job.status = 'RUNNING'
      AND coalesce(o_job.lease_expires_at, 0) > o_now THEN
    o_outcome := 'kept';
    RETURN;
  ELSE
    o_outcome := 'removed';
    PERFORM ail_notify(p_key);
  END IF;
  PERFORM ail_forget(ARRAY[p_key]);
END $$;

-- Delete up to p_batch terminal jobs of p_statuses last written more than p_older seconds
-- ago (rules.prunable), with their entries; returns how many (fewer than p_batch: no more).
-- Rows another call holds are passed over (they are being written: not old).
CREATE FUNCTION ail_prune(p_older double precision, p_statuses text[], p_batch int)
RETURNS int LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
  v_cutoff double precision := extract(epoch FROM clock_timestamp()) - p_older;
  v_keys text[];
BEGIN
  SELECT array_agg(key) INTO v_keys FROM (
    SELECT key FROM ail_jobs
    WHERE status = ANY(p_statuses) AND status IN ('DONE', 'FAILED', 'CANCELLED')
      AND coalesce(nullif(updated_at, 0), created_at) < v_cutoff
    LIMIT p_batch FOR UPDATE SKIP LOCKED) AS old;
  IF v_keys IS NULL THEN
    RETURN 0;
  END IF;
  PERFORM ail_forget(v_keys);
  RETURN cardinality(v_keys);
END $$;
"""

FUNCTIONS = _SUBMIT + _DUE + _SCHEDULE + _LOOK + _WORKERS + _ADMIN
"""The SQL the migration runs for the queue, workers, history and admin (after the jobs'
tables and the lease functions)."""
