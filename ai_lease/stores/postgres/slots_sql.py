"""The PostgreSQL store's provider-slot tables and functions (plpgsql), one call per operation.

The tables (:data:`TABLES`, migration 5): ``ail_slot_limits`` (one row per limit: its
counter, and the row every acquire of that limit locks first, so one caller at a time
decides), ``ail_slots`` (the holders: token, lease expiry), ``ail_slot_waiters`` (the line:
priority, number from the counter, when the entry lapses) and ``ail_slot_pauses`` (when a
paused limit grants again: :data:`PAUSES`, migration 6). A holder's ``weight`` is the units
it takes of a weighted limit (1 otherwise: :data:`WEIGHTS`, migration 7). Each function
judges time by the server's clock and is one transaction; the migration installs them with
``SET search_path FROM CURRENT``, so tables are named unqualified.

A slot freed (released, left, found lapsed by a renewal) NOTIFYs the namespace's channel with
the payload ``chr(31) || limit`` (:data:`~ai_lease.stores.postgres.slots.WAKE`): no job key
holds a control character, so it never wakes a job's followers. The connection layer resends
a call whose connection broke, so each is safe to run twice: a holder asking again gets its
own slot back, a waiter keeps its place, a renewal renews again, a second release answers
False.
"""

from __future__ import annotations

__all__ = ["FUNCTIONS", "PAUSES", "TABLES", "WEIGHTS"]

PAUSES = """
CREATE TABLE IF NOT EXISTS ail_slot_pauses (limit_name text COLLATE "C" PRIMARY KEY,
  paused_until double precision NOT NULL);
"""
"""The limits' pauses, made by a fresh install and by the upgrade to migration 6."""

WEIGHTS = """
ALTER TABLE ail_slots ADD COLUMN IF NOT EXISTS weight bigint NOT NULL DEFAULT 1;
"""
"""The holders' weights, made by a fresh install and by the upgrade to migration 7."""

TABLES = (
    """
CREATE TABLE IF NOT EXISTS ail_slot_limits (limit_name text COLLATE "C" PRIMARY KEY,
  last bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS ail_slots (limit_name text COLLATE "C",
  owner_id text COLLATE "C", token bigint NOT NULL, expires_at double precision NOT NULL,
  PRIMARY KEY (limit_name, owner_id));
CREATE TABLE IF NOT EXISTS ail_slot_waiters (limit_name text COLLATE "C",
  owner_id text COLLATE "C", priority int NOT NULL, seq bigint NOT NULL,
  expires_at double precision NOT NULL,
  PRIMARY KEY (limit_name, owner_id));
"""
    + PAUSES
    + WEIGHTS
)
"""The slot tables, made by a fresh install and by the upgrade to migration 5 (``IF NOT
EXISTS``: a schema taken back to an older migration by hand may still hold them)."""

_WAKE = "PERFORM pg_notify({channel}, chr(31) || p_limit);"

_NOW = "extract(epoch FROM clock_timestamp())"

# o_kind granted (o_token, o_expires) | wait (o_ahead waiters first, o_in_use units taken,
# o_paused seconds left of the limit's pause). A weighted caller (p_weight > 1) is granted
# only first in line.
_ACQUIRE = rf"""
CREATE FUNCTION ail_slot_acquire(p_limit text, p_owner text, p_capacity bigint,
  p_ttl double precision, p_wait_ttl double precision, p_priority int, p_weight bigint)
RETURNS TABLE (o_kind text, o_token bigint, o_expires double precision, o_ahead int,
  o_in_use bigint, o_at double precision, o_paused double precision)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := {_NOW}; v_token bigint; v_prio int; v_seq bigint;
  v_in_use bigint; v_ahead int; v_paused double precision;
BEGIN
  INSERT INTO ail_slot_limits VALUES (p_limit, 0) ON CONFLICT (limit_name) DO NOTHING;
  PERFORM 1 FROM ail_slot_limits l WHERE l.limit_name = p_limit FOR UPDATE;  -- the limit's lock
  v_now := {_NOW};  -- read again once the lock is had: a wait for it must not age the grant
  DELETE FROM ail_slots s WHERE s.limit_name = p_limit AND s.expires_at <= v_now;
  DELETE FROM ail_slot_waiters w WHERE w.limit_name = p_limit AND w.expires_at <= v_now;
  UPDATE ail_slots s SET expires_at = v_now + p_ttl
    WHERE s.limit_name = p_limit AND s.owner_id = p_owner RETURNING s.token INTO v_token;
  IF FOUND THEN  -- asked again (a lost reply): its own slot, renewed
    RETURN QUERY SELECT 'granted'::text, v_token, v_now + p_ttl, 0, 0::bigint, v_now, 0::float8;
    RETURN;
  END IF;
  SELECT coalesce(sum(s.weight), 0) INTO v_in_use FROM ail_slots s
    WHERE s.limit_name = p_limit;
  SELECT w.priority, w.seq INTO v_prio, v_seq FROM ail_slot_waiters w
    WHERE w.limit_name = p_limit AND w.owner_id = p_owner;
  IF NOT FOUND THEN v_prio := p_priority; v_seq := NULL; END IF;
  SELECT count(*) INTO v_ahead FROM ail_slot_waiters w
    WHERE w.limit_name = p_limit AND w.owner_id <> p_owner
      AND (w.priority > v_prio OR (w.priority = v_prio AND (v_seq IS NULL OR w.seq < v_seq)));
  SELECT greatest(0, p.paused_until - v_now) INTO v_paused FROM ail_slot_pauses p
    WHERE p.limit_name = p_limit;
  v_paused := coalesce(v_paused, 0);
  IF v_paused = 0 AND (p_weight = 1 OR v_ahead = 0)
      AND v_ahead + p_weight <= p_capacity - v_in_use THEN
    DELETE FROM ail_slot_waiters w WHERE w.limit_name = p_limit AND w.owner_id = p_owner;
    UPDATE ail_slot_limits l SET last = l.last + 1 WHERE l.limit_name = p_limit
      RETURNING l.last INTO v_token;
    INSERT INTO ail_slots (limit_name, owner_id, token, expires_at, weight)
      VALUES (p_limit, p_owner, v_token, v_now + p_ttl, p_weight);
    RETURN QUERY SELECT 'granted'::text, v_token, v_now + p_ttl, 0, 0::bigint, v_now, 0::float8;
    RETURN;
  END IF;
  IF v_seq IS NULL THEN
    UPDATE ail_slot_limits l SET last = l.last + 1 WHERE l.limit_name = p_limit
      RETURNING l.last INTO v_seq;
  END IF;
  INSERT INTO ail_slot_waiters AS w VALUES (p_limit, p_owner, v_prio, v_seq, v_now + p_wait_ttl)
    ON CONFLICT (limit_name, owner_id) DO UPDATE SET expires_at = excluded.expires_at;
  RETURN QUERY SELECT 'wait'::text, NULL::bigint, NULL::double precision, v_ahead, v_in_use,
    v_now, v_paused;
END $$;
"""

# true: renewed; false: the fence is stale, or its lease lapsed (then reclaimed here).
_RENEW = rf"""
CREATE FUNCTION ail_slot_renew(p_limit text, p_owner text, p_token bigint,
  p_ttl double precision) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := {_NOW}; r ail_slots;
BEGIN
  SELECT * INTO r FROM ail_slots s WHERE s.limit_name = p_limit AND s.owner_id = p_owner
    FOR UPDATE;
  v_now := {_NOW};  -- after the row's lock, as in ail_slot_acquire
  IF NOT FOUND OR r.token <> p_token THEN RETURN false; END IF;
  IF r.expires_at <= v_now THEN
    DELETE FROM ail_slots s WHERE s.limit_name = p_limit AND s.owner_id = p_owner;
    {_WAKE}
    RETURN false;
  END IF;
  UPDATE ail_slots s SET expires_at = v_now + p_ttl
    WHERE s.limit_name = p_limit AND s.owner_id = p_owner;
  RETURN true;
END $$;
"""

# p_token NULL: the owner gave up (its place in line and any slot it holds go). Else fenced:
# true when this fence's live slot was freed; a stale fence frees nothing.
_RELEASE = rf"""
CREATE FUNCTION ail_slot_release(p_limit text, p_owner text, p_token bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := {_NOW}; v_expires double precision; v_left int;
BEGIN
  IF p_token IS NULL THEN
    DELETE FROM ail_slot_waiters w WHERE w.limit_name = p_limit AND w.owner_id = p_owner;
    GET DIAGNOSTICS v_left = ROW_COUNT;
    DELETE FROM ail_slots s WHERE s.limit_name = p_limit AND s.owner_id = p_owner;
    IF FOUND OR v_left > 0 THEN {_WAKE} END IF;
    RETURN false;
  END IF;
  DELETE FROM ail_slots s
    WHERE s.limit_name = p_limit AND s.owner_id = p_owner AND s.token = p_token
    RETURNING s.expires_at INTO v_expires;
  IF NOT FOUND THEN RETURN false; END IF;
  {_WAKE}
  RETURN v_expires > v_now;
END $$;
"""

# true: the fence's live slot now takes p_weight units; false: lapsed or stale (nothing
# changes). Fewer units wake the waiters.
_REWEIGH = rf"""
CREATE FUNCTION ail_slot_reweigh(p_limit text, p_owner text, p_token bigint, p_weight bigint)
RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := {_NOW}; v_old bigint;
BEGIN
  SELECT s.weight INTO v_old FROM ail_slots s
    WHERE s.limit_name = p_limit AND s.owner_id = p_owner AND s.token = p_token
      AND s.expires_at > v_now FOR UPDATE;
  IF NOT FOUND THEN RETURN false; END IF;
  UPDATE ail_slots s SET weight = p_weight
    WHERE s.limit_name = p_limit AND s.owner_id = p_owner;
  IF p_weight < v_old THEN {_WAKE} END IF;
  RETURN true;
END $$;
"""

# The seconds the limit's pause now lasts (a later end already set is kept).
_PAUSE = rf"""
CREATE FUNCTION ail_slot_pause(p_limit text, p_seconds double precision)
RETURNS double precision
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE v_now double precision := {_NOW}; v_until double precision;
BEGIN
  INSERT INTO ail_slot_pauses AS p VALUES (p_limit, v_now + p_seconds)
    ON CONFLICT (limit_name) DO UPDATE
    SET paused_until = greatest(p.paused_until, excluded.paused_until)
    RETURNING p.paused_until INTO v_until;
  RETURN v_until - v_now;
END $$;
"""

FUNCTIONS = _ACQUIRE + _RENEW + _RELEASE + _PAUSE + _REWEIGH
"""The slot functions (made again by every upgrade, like the lease's and the queue's)."""
