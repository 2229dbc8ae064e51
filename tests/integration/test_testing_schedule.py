"""autom.testing's run_schedule: a slot enqueued and run as the ticker would, on a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from autom import App, HandlerContext, Job
from autom.testing import open_testbed
from autom.ticker import due_jobs


def digest_app(seen: list[Job]) -> App:
    app = App(builtins=False)

    @app.handler("digest", max_attempts=3)
    async def digest(ctx: HandlerContext, job: Job) -> None:
        seen.append(job)

    app.schedule("digest", cron="0 9 * * 1-5", payload={"to": "team"})
    return app


async def test_run_schedule_runs_the_slot_with_the_tickers_key_and_payload(dsn: str) -> None:
    seen: list[Job] = []
    app = digest_app(seen)
    at = datetime(2026, 11, 30, 8, 0, 30, tzinfo=UTC)  # Monday, 09:00:30 in Berlin
    async with open_testbed(app, database_url=dsn, settings={"tz": "Europe/Berlin"}) as bed:
        run = await bed.run_schedule("digest", at=at)
        (ticker_job,) = due_jobs(bed.registry.schedules, at, ZoneInfo("Europe/Berlin"))
        row = await bed.deps.store.get(run.id)
        assert row is not None
        # the same slot again: the ticker would enqueue nothing, and so does run_schedule
        with pytest.raises(AssertionError, match="exists already"):
            await bed.run_schedule("digest", at=at)
    assert run.status == "done", run.error
    assert [job.payload for job in seen] == [{"to": "team", "slot": "2026-11-30T08:00Z"}]
    assert row["key"] == ticker_job.key == "digest:2026-11-30T08:00Z"
    assert seen[0].payload == ticker_job.payload
    assert row["max_attempts"] == 3  # the handler's, as the ticker stores it


async def test_run_schedule_needs_the_kinds_schedule(dsn: str) -> None:
    app = digest_app([])
    async with open_testbed(app, database_url=dsn) as bed:
        with pytest.raises(AssertionError, match="one schedule of kind 'report'"):
            await bed.run_schedule("report", at=datetime.now(UTC))
