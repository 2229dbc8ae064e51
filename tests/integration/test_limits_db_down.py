"""A handler's Telegram send while PostgreSQL is away: deferred, its attempt not counted.

The send limits live in PostgreSQL (autom/limits.py). When the limiter cannot reach it,
nothing was sent and the handler is not at fault: the job is deferred like any other wait
for the limits (README, "Telegram's limits"), not retried as a failure. The database
really goes away (``tests/support/restartable_pg.py``: the server is stopped) between the
claim and the send. Before, the limiter's ``DatabaseUnavailable`` escaped the handler and
the run counted as a failed attempt (a retry with backoff).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from autom.config import Settings
from autom.db import open_database
from autom.deps import Deps
from autom.jobs.models import Job, NewJob
from autom.jobs.store import JobStore
from autom.limits import SendLimiter
from autom.telegram import TelegramClient
from autom.worker import WorkerPool
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.telegram_stub import TelegramStub


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


async def test_a_send_that_cannot_reach_the_limits_is_deferred_not_counted_as_an_attempt(
    pg: RestartablePg, telegram_stub: TelegramStub
) -> None:
    started = trio.Event()  # the handler's first run holds its claim
    go = trio.Event()  # the database is away: send now
    raised: list[str] = []  # what the send raised, per run

    async def notify(ctx: Any, job: Job) -> None:
        started.set()
        await go.wait()
        try:
            await ctx.telegram.send_message(42, "hello")
        except BaseException as exc:
            raised.append(type(exc).__name__)
            raise
        raised.append("sent")

    settings = Settings(telegram_api=telegram_stub.url, telegram_bot_token="123456:down",
                        telegram_alert_chat_id="-1001", http_timeout_seconds=5.0, workers=2)
    async with open_database(pg.dsn, min_size=1, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db:
        job_id = await JobStore(db).enqueue(NewJob("notify"))
        telegram = TelegramClient(settings)
        telegram.limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
        store = JobStore(db, lease_seconds=30)
        deps = Deps(settings=settings, db=db, store=store, sources={}, telegram=telegram)
        pool = WorkerPool(deps, {"notify": notify}, workers=2, poll_seconds=0.2)
        try:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    await nursery.start(pool.run)
                    await started.wait()
                    await trio.to_thread.run_sync(pg.stop)
                    go.set()
                    while not raised:  # the send found the database away
                        await trio.sleep(0.05)
                    await trio.to_thread.run_sync(pg.start)
                    while True:
                        row = await db.fetch_one("select status, attempts, last_error from jobs where id = %s",
                                                 [job_id])
                        if row is not None and row["status"] == "done":
                            break
                        await trio.sleep(0.05)
                    pool.deps.shutdown.value = True
        finally:
            await telegram.aclose()
    assert raised == ["Defer", "sent"], raised  # not DatabaseUnavailable: a wait, not a failure
    assert row["attempts"] == 1, dict(row)  # the deferred run gave its attempt back
    assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage")] == ["hello"]
