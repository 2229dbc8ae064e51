"""The intake while PostgreSQL is down: quick 503s, nothing half-written, and recovery without a restart.

The server is a throwaway embedded PostgreSQL that the test really stops and
starts (``tests/support/restartable_pg.py``), whatever server the rest of the
suite uses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from autom.db import open_database
from tests.support.http_app import TELEGRAM_SECRET, RunningApp, count_rows, running_app, sample
from tests.support.restartable_pg import RestartablePg, restartable_pg

# "within about a second" (README, Health and metrics), plus room for a loaded CI machine
QUICK = 1.5


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


def delivery(update_id: int) -> dict[str, Any]:
    """Keyword arguments of a signed Telegram message delivery."""
    update = {
        "update_id": update_id,
        "message": {"message_id": update_id, "chat": {"id": 9, "type": "private"}, "text": f"#{update_id}"},
    }
    return {"content": json.dumps(update).encode(), "headers": {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}}


async def timed(app: RunningApp, method: str, path: str, **kwargs: Any) -> tuple[int, Any, float]:
    """(status, JSON answer, seconds taken) of one request."""
    started = trio.current_time()
    response = await app.client.request(method, path, **kwargs)
    return response.status_code, response.json(), trio.current_time() - started


async def test_database_down_gives_quick_503s_and_the_same_app_recovers(pg: RestartablePg) -> None:
    async with (
        open_database(pg.dsn, min_size=2, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db,
        running_app(db) as app,
    ):
        status, answer, _ = await timed(app, "POST", "/hooks/telegram", **delivery(1))
        assert (status, answer["jobs"]) == (202, 1)

        await trio.to_thread.run_sync(pg.stop)

        status, answer, took = await timed(app, "POST", "/hooks/telegram", **delivery(2))
        assert (status, answer) == (503, {"error": "database unavailable"})
        assert took < QUICK
        status, answer, took = await timed(app, "GET", "/health")
        assert (status, answer) == (503, {"status": "unavailable", "database": "down"})
        assert took < QUICK
        # a redelivery of the stored event while the database is down: still 503, not a guess
        status, _, took = await timed(app, "POST", "/hooks/telegram", **delivery(1))
        assert status == 503 and took < QUICK
        assert sample(app.deps.metrics.events, source="telegram", outcome="rejected") == 2
        assert app.deps.metrics.db_up._value.get() == 0

        await trio.to_thread.run_sync(pg.start)

        # The same app, no restart: the sender's retry of the 503'd delivery now lands, as new
        # (the 503 wrote nothing). The pool replaces its dead connections on the way.
        with trio.fail_after(10):
            while True:
                status, answer, _ = await timed(app, "POST", "/hooks/telegram", **delivery(2))
                if status != 503:
                    break
                await trio.sleep(0.1)
        assert (status, answer["jobs"]) == (202, 1)
        status, answer, _ = await timed(app, "GET", "/health")
        assert (status, answer["status"]) == (200, "ok")
        status, answer, _ = await timed(app, "POST", "/hooks/telegram", **delivery(1))
        assert (status, answer) == (202, {"duplicate": True})

        # nothing lost, nothing doubled
        assert await count_rows(db, "events") == 2
        assert await count_rows(db, "jobs") == 2
        keys = await db.fetch_all("select dedup_key from events order by id")
        assert [row["dedup_key"] for row in keys] == ["1", "2"]
