"""Enqueueing from outside the service: the database side of ``autom.enqueue`` / ``enqueue_sync``.

``conn``: a psycopg connection of the caller's (its transaction: the jobs commit or
roll back with the caller's own writes). ``dsn``: a connection string (one short
autocommit connection per call).
"""

from __future__ import annotations

from typing import Any

import psycopg

from autom.db.queries import Q

#: how long connecting may take before the call fails (the caller's request is waiting)
CONNECT_TIMEOUT_SECONDS = 10


def insert_on(conn: Any, jobs: str) -> list[int]:
    """Run ``autom_enqueue(jobs)`` on the caller's psycopg connection, inside its transaction."""
    if not isinstance(conn, psycopg.Connection):
        raise TypeError("autom.enqueue_sync needs a DSN string or a psycopg (3) Connection, "
                        f"got {type(conn).__name__}")
    return [row[0] for row in conn.execute(Q.enqueue_many, {"jobs": jobs}).fetchall()]


def insert_at(dsn: str, jobs: str) -> list[int]:
    """Run ``autom_enqueue(jobs)`` on a short connection of its own (committed when it returns)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                         application_name="autom-enqueue") as conn:
        return [row[0] for row in conn.execute(Q.enqueue_many, {"jobs": jobs}).fetchall()]
