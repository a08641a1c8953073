"""Bringing an SQLite file made by an older ai_lease up to this one's schema, in place.

Each step adds what a newer version reads, once, in one write transaction (a racing process
finds it done and does nothing); nothing already stored is lost.
"""

from __future__ import annotations

import sqlite3

__all__ = ["CREATED_FROM_RECORD", "migrate"]

# A record's creation time in microseconds, read from its JSON (0 for one that is not ours):
# how a file from before the created_us column fills it in, once.
CREATED_FROM_RECORD = (
    "CASE WHEN json_valid(CAST(record AS TEXT)) THEN coalesce(CAST(round("
    "json_extract(CAST(record AS TEXT), '$.created_at') * 1000000) AS INTEGER), 0) ELSE 0 END"
)


def migrate(conn: sqlite3.Connection) -> None:
    """Give a file made before the listing its ``created_us`` column, filled in from each
    record, and one made before weighted slots their ``weight`` column (1: one slot each), in
    one write transaction (a racing process finds it done and does nothing)."""
    if _missing(conn) == (False, False):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        created, weight = _missing(conn)
        if created:
            conn.execute("ALTER TABLE ai_lease_jobs ADD created_us INTEGER NOT NULL DEFAULT 0")
            conn.execute(f"UPDATE ai_lease_jobs SET created_us = {CREATED_FROM_RECORD}")
        if weight:
            conn.execute("ALTER TABLE ai_lease_slots ADD weight INTEGER NOT NULL DEFAULT 1")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _missing(conn: sqlite3.Connection) -> tuple[bool, bool]:
    """Whether the jobs' ``created_us`` and the slots' ``weight`` columns are missing."""
    jobs, slots = (
        {c[1] for c in conn.execute(f"PRAGMA table_info({table})")}
        for table in ("ai_lease_jobs", "ai_lease_slots")
    )
    return "created_us" not in jobs, "weight" not in slots
