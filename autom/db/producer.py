"""Enqueueing from outside the service: the database side of ``autom.enqueue`` / ``enqueue_sync``.

``conn``: a psycopg connection of the caller's (its transaction: the jobs commit or
roll back with the caller's own writes). ``dsn``: a connection string (one short
autocommit connection per call).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import tuple_row

from autom.db.queries import Q

#: how long connecting may take before the call fails (the caller's request is waiting)
CONNECT_TIMEOUT_SECONDS = 10


def insert_on(conn: Any, jobs: str) -> list[tuple[int | None, int | None]]:
    """Run ``autom_enqueue_each(jobs)`` on the caller's psycopg connection, inside its transaction;
    per job, in order, ``(new id or None, the existing job's id or None)``."""
    if not isinstance(conn, psycopg.Connection):
        raise TypeError("autom.enqueue_sync needs a DSN string or a psycopg (3) Connection, "
                        f"got {type(conn).__name__}")
    return _pairs(conn, jobs)


def insert_at(dsn: str, jobs: str) -> list[tuple[int | None, int | None]]:
    """``insert_on`` on a short connection of its own (committed when it returns)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                         application_name="autom-enqueue") as conn:
        return _pairs(conn, jobs)


def _pairs(conn: psycopg.Connection[Any], jobs: str) -> list[tuple[int | None, int | None]]:
    # the caller's row factory may be anything: the columns by position from a cursor of ours
    with conn.cursor(row_factory=tuple_row) as cur:
        return [(row[1], row[2]) for row in cur.execute(Q.enqueue_each, {"jobs": jobs}).fetchall()]
