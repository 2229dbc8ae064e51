"""Enqueueing from another program: ``autom.enqueue_sync`` in the caller's transaction,
``autom.enqueue`` from async code, and the documented SQL function."""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

import autom


def jobs(dsn: str) -> list[tuple[str, dict, str | None, str | None, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select kind, payload, key, recipient, max_attempts from jobs order by id").fetchall()


def test_a_job_enqueued_in_the_callers_transaction_commits_or_rolls_back_with_it(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        autom.enqueue_sync(conn, "shop.order", {"id": 1})
        conn.rollback()  # the caller's own work failed: no job either
        job_id = autom.enqueue_sync(conn, "shop.order", {"id": 2}, key="order:2", recipient=7, max_attempts=3)
        conn.commit()
    assert isinstance(job_id, int)
    assert jobs(dsn) == [("shop.order", {"id": 2}, "order:2", "7", 3)]


def test_a_dsn_commits_at_once_and_a_known_key_is_skipped(dsn: str) -> None:
    assert autom.enqueue_sync(dsn, "shop.order", {"id": 3}, key="order:3") is not None
    assert autom.enqueue_sync(dsn, "shop.order", {"id": 3}, key="order:3") is None
    assert jobs(dsn) == [("shop.order", {"id": 3}, "order:3", None, 8)]


async def test_enqueue_from_async_code(dsn: str) -> None:
    job_id = await autom.enqueue(dsn, "report", {"month": "2026-11"})
    assert isinstance(job_id, int) and jobs(dsn) == [("report", {"month": "2026-11"}, None, None, 8)]


def test_the_documented_sql_function(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        [(job_id,)] = conn.execute(
            """select autom_enqueue('[{"kind": "shop.order", "payload": {"id": 42}, "key": "order:42",
                                      "recipient": "customer:7", "run_at": null, "max_attempts": 5}]'::jsonb)"""
        ).fetchall()
    assert isinstance(job_id, int)
    assert jobs(dsn) == [("shop.order", {"id": 42}, "order:42", "customer:7", 5)]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"kind": "", "payload": {}}, "a job needs a kind"),
    ({"kind": "x", "payload": [1]}, "payload must be a JSON object"),
    ({"kind": "x", "payload": {"at": datetime(2026, 1, 1)}}, "not JSON-serialisable"),
    ({"kind": "x", "payload": {}, "run_at": datetime(2026, 1, 1)}, "timezone-aware"),
    ({"kind": "x", "payload": {}, "max_attempts": 0}, "max_attempts"),
])
def test_bad_input_is_refused_before_the_database(kwargs: dict, error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        autom.enqueue_sync("postgresql://nowhere.invalid/x", **kwargs)
