"""The fetcher's own claim connection (``autom-claim``, app.py) on a server that restarts.

The service claims on a pool of one connection of its own, so the claim stays
prepared; after the server restarts, that connection is replaced like the main
pool's and the claims, prepared again on the new one, find the jobs enqueued
meanwhile (no "prepared statement does not exist" reaching the fetcher).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg
import trio

from autom.app import Control, Service, run_service
from autom.db import open_database
from autom.jobs.models import Job, NewJob
from autom.jobs.store import JobStore
from tests.support.restartable_pg import restartable_pg
from tests.support.service import service_settings, wait_until


def claim_backends(dsn: str) -> list[str]:
    """The queries of the ``autom-claim`` sessions (run in a thread)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("select query from pg_stat_activity where application_name = 'autom-claim'").fetchall()
    return [row[0] for row in rows]


async def test_claims_run_on_their_own_connection_and_come_back_after_a_restart() -> None:
    done: list[int] = []

    async def handler(ctx: Any, job: Job) -> None:
        done.append(job.payload["n"])

    with restartable_pg() as pg:
        settings = service_settings(pg.dsn, "http://127.0.0.1:9")
        control = Control()
        async with trio.open_nursery() as nursery:
            service: Service = await nursery.start(partial(
                run_service, settings, control=control, schedules=(), handlers={"t": handler},
                binds=["127.0.0.1:0"], telegram_log_only=True))
            store = service.deps.store
            assert store.claim_db is not store.db
            for n in range(3):  # the claim is prepared on its connection from the first run
                await store.enqueue(NewJob(kind="t", payload={"n": n}))
                await wait_until(lambda n=n: n in done)
            queries = await trio.to_thread.run_sync(claim_backends, pg.dsn)
            assert len(queries) == 1 and "Claim up to" in queries[0]

            await trio.to_thread.run_sync(pg.stop)
            await trio.sleep(0.3)  # claims fail meanwhile: logged, retried with backoff
            await trio.to_thread.run_sync(pg.start)

            # enqueued from elsewhere after the restart: claimed on a new claim connection
            async with open_database(pg.dsn, min_size=1, max_size=1, name="other") as other:
                for n in range(3, 6):
                    await JobStore(other).enqueue(NewJob(kind="t", payload={"n": n}))
            await wait_until(lambda: sorted(done) == list(range(6)), timeout=30, interval=0.1)
            queries = await trio.to_thread.run_sync(claim_backends, pg.dsn)
            assert len(queries) == 1 and "Claim up to" in queries[0]
            control.request_stop()
