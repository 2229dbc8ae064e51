"""``intake_store`` (queries_intake.sql) must enqueue exactly as the queue's ``enqueue_many`` does.

The intake stores an event and its jobs in one statement for speed, through
``autom_enqueue``; ``insert_jobs`` runs ``enqueue_each`` (``autom_enqueue_each``), which
answers per job (migrations/0022). These tests run the same jobs through both (the
reference: ``enqueue_each`` in a transaction after inserting the event) and compare every column of ``jobs`` and
``recipients`` but ids and clock readings, so the event wrapper can never change
how jobs are stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from autom.db.queries import Q
from autom.events import store_params
from autom.jobs.models import NewJob
from autom.jobs.store import jobs_json

# set from the clock, so they differ between two runs of the same input
CLOCK_COLUMNS = {"created_at", "updated_at", "run_at", "due_at", "next_due_at", "locked_until", "received_at"}
ID_COLUMNS = {"id", "event_id"}

LATER = datetime.now(UTC) + timedelta(hours=1)

EXISTING = [NewJob(kind="site.form", payload={"n": 0}, key="old-1", recipient="r1")]
JOBS = [
    NewJob(kind="telegram.message", payload={"n": 1, "text": "héllo ✓"}, key="k-1", recipient="r1"),
    NewJob(kind="telegram.message", payload={"n": 2}, key="k-2", recipient="r2"),
    NewJob(kind="site.form", payload={"nested": {"a": [1, 2.5, None, True]}}, key=None),
    NewJob(kind="site.form", payload={"n": 3}, key="old-1"),  # kind and key exist: skipped
    NewJob(kind="telegram.message", payload={"n": 4}, key="old-1"),  # the key under another kind: created
    NewJob(kind="later", payload={}, key="k-later", recipient="r3", run_at=LATER, max_attempts=3),
]


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """An autocommit connection with dict rows, as the bridge's pool hands out."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as connection:
        yield connection


def insert_jobs_sync(conn: psycopg.Connection[Any], jobs: list[NewJob]) -> list[int | None]:
    """The statement ``autom.jobs.store.insert_jobs`` runs, on a sync connection: per job its id or None."""
    return [row["id"] for row in conn.execute(Q.enqueue_each, {"jobs": jobs_json(jobs)}).fetchall()]


def reset(conn: psycopg.Connection[Any]) -> None:
    """Empty the queue's tables, restarting ids, and put the EXISTING job back."""
    conn.execute("truncate jobs, events, recipients restart identity cascade")
    with conn.transaction():
        insert_jobs_sync(conn, EXISTING)


def reference(conn: psycopg.Connection[Any], jobs: list[NewJob]) -> tuple[int, int]:
    """The event insert plus the queue's own enqueue, in one transaction."""
    with conn.transaction():
        event_id = conn.execute(
            "insert into events (source, headers, body, dedup_key) values ('s', '{}', 'b', 'd') returning id"
        ).fetchone()["id"]  # type: ignore[index]
        ids = insert_jobs_sync(conn, [NewJob(**{**j.__dict__, "event_id": event_id}) for j in jobs])
    return event_id, len([i for i in ids if i is not None])


def intake(conn: psycopg.Connection[Any], jobs: list[NewJob]) -> tuple[int, int]:
    """The intake's single statement."""
    row = conn.execute(Q.intake_store, store_params("s", {}, "b", "d", jobs)).fetchone()
    assert row is not None
    return row["id"], row["jobs"]


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Every row of jobs and recipients, clock readings reduced to set / not set."""

    def clean(row: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in row.items():
            if name in ID_COLUMNS:
                continue
            out[name] = (value is not None) if name in CLOCK_COLUMNS else value
        return out

    jobs = [clean(r) for r in conn.execute("select * from jobs order by kind, key nulls first, id").fetchall()]
    recipients = [clean(r) for r in conn.execute("select * from recipients order by recipient").fetchall()]
    future = conn.execute("select key from jobs where run_at > now() + interval '30 minutes'").fetchall()
    links = conn.execute(
        "select count(*) as n from jobs j join events e on e.id = j.event_id"
    ).fetchone()
    return {"jobs": jobs, "recipients": recipients, "future": future, "linked": links}


def run(conn: psycopg.Connection[Any], how: Callable[[psycopg.Connection[Any], list[NewJob]], tuple[int, int]]
        ) -> tuple[tuple[int, int], dict[str, Any]]:
    reset(conn)
    result = how(conn, JOBS)
    return result, snapshot(conn)


def test_intake_store_enqueues_exactly_like_enqueue_many(conn: psycopg.Connection[Any]) -> None:
    ref_result, ref_rows = run(conn, reference)
    got_result, got_rows = run(conn, intake)
    assert got_result == ref_result == (1, 5)
    assert got_rows == ref_rows
    assert json.dumps(got_rows, default=str)  # (a readable diff above if it fails)


def test_intake_store_notifies_workers_like_enqueue_many(conn: psycopg.Connection[Any], dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("listen autom_jobs")
        reset(conn)
        list(listener.notifies(timeout=0.2))  # drain the EXISTING job's notification
        intake(conn, JOBS)
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1


def test_intake_store_stores_nothing_for_a_redelivery(conn: psycopg.Connection[Any]) -> None:
    reset(conn)
    intake(conn, JOBS)
    before = snapshot(conn)
    row = conn.execute(Q.intake_store, store_params("s", {}, "other", "d", JOBS[:1])).fetchone()
    assert row is not None and (row["go"], row["id"]) == (True, None)
    assert snapshot(conn) == before
    assert conn.execute("select count(*) as n from events").fetchone() == {"n": 1}


def test_intake_store_without_jobs_stores_the_event(conn: psycopg.Connection[Any]) -> None:
    reset(conn)
    row = conn.execute(Q.intake_store, store_params("s", {"a": "b"}, "body", None, [])).fetchone()
    assert row is not None and row["jobs"] == 0
    event = conn.execute("select headers, body, dedup_key from events").fetchone()
    assert event == {"headers": {"a": "b"}, "body": "body", "dedup_key": None}


@pytest.mark.parametrize("statement", ["intake_store", "intake_store_handoff", "intake_store_many"])
def test_a_statement_the_server_starts_after_its_cut_off_stores_nothing(
    conn: psycopg.Connection[Any], statement: str,
) -> None:
    """The cut-off (``until``, the server's clock) is when the intake stops waiting: a server
    that gets to the statement later (it was stopped) stores nothing and says so (go false),
    so the intake's 503 is true; before it, the statement stores as usual."""
    reset(conn)
    before = snapshot(conn)
    now = conn.execute("select date_part('epoch', clock_timestamp()) as t").fetchone()["t"]  # type: ignore[index]

    def run(n: int, until: float) -> list[dict[str, Any]]:
        params = store_params("s", {}, f"body {n}", f"d{n}", JOBS[:1])
        params.update(until=until, lease_seconds=60.0, items=f"[{params['item']}]")
        return conn.execute(getattr(Q, statement), params).fetchall()

    [late] = run(1, now - 1.0)
    assert late["go"] is False and late["at"] >= now
    assert all(value is None for name, value in late.items() if name not in ("go", "at")), late
    assert snapshot(conn) == before
    assert conn.execute("select count(*) as n from events").fetchone() == {"n": 0}
    assert conn.execute("select count(*) as n from intake_commits").fetchone() == {"n": 0}

    [stored] = run(2, now + 60.0)
    assert stored["go"] is True
    assert conn.execute("select dedup_key from events").fetchall() == [{"dedup_key": "d2"}]
    assert conn.execute("select count(*) as n from intake_commits").fetchone() == {"n": 1}
