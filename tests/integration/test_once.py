"""``ctx.once`` exclusivity inside one service: two runs of one key at once, the holder
exiting cleanly or raising (tests/e2e/test_once_faults.py has the process-level faults)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from autom.handlers import default_handlers
from autom.jobs.models import NewJob
from tests.support.service import running_service, service_settings, wait_until


@pytest.mark.parametrize("holder_raises", [False, True])
async def test_a_second_run_waits_for_the_holder_of_its_key(dsn: str, db: Any, telegram_stub: Any,
                                                           holder_raises: bool) -> None:
    inside = trio.Event()
    release = trio.Event()
    seen: list[tuple[int, bool]] = []

    async def effect(ctx: Any, job: Any) -> None:
        async with ctx.once("shared") as todo:
            seen.append((job.payload["n"], todo))
            if job.payload["n"] == 1:
                inside.set()
                await release.wait()
                if holder_raises and job.attempts == 1:
                    raise RuntimeError("the effect failed")

    handlers = {**default_handlers(), "test.effect": effect}
    settings = service_settings(dsn, telegram_stub.url, workers=4, retry_base_seconds=30.0)
    async with running_service(settings, handlers=handlers) as svc:
        first = await svc.deps.store.enqueue(NewJob("test.effect", {"n": 1}))
        svc.deps.doorbell.set()
        with trio.fail_after(10):
            await inside.wait()
        second = await svc.deps.store.enqueue(NewJob("test.effect", {"n": 2}))
        svc.deps.doorbell.set()
        # the second run is claimed and running, but has not entered its block
        await wait_until(lambda: db.fetch_val("select status = 'running' from jobs where id = %s", [second]))
        await trio.sleep(0.3)
        assert seen == [(1, True)]
        release.set()
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [second]))
    # a holder that exits cleanly keeps the key: the waiter gets False; one that raises frees it
    assert seen == [(1, True), (2, holder_raises)]
    status = await db.fetch_val("select status from jobs where id = %s", [first])
    assert status == ("pending" if holder_raises else "done")
    held = await db.fetch_all("select state, job_id from autom_once where key = 'shared'")
    assert held == [{"state": "done", "job_id": second if holder_raises else first}]
