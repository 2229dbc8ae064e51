"""Jobs enqueued from outside a running ``autom run`` get their kind's ``max_attempts``,
and a scheduled handler's follow-up keyed with its slot is not lost to the slot's own key."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import psycopg
import trio

import autom
from autom.testing.telegram_stub import TelegramStub
from tests.support.processes import autom_processes

USER_MODULE = textwrap.dedent('''
    """Automations of a user: a kind that always fails, and a daily digest that mails."""
    from autom import App, HandlerContext, Job

    app = App()


    @app.handler("crm.sync", max_attempts=3)
    async def sync(ctx: HandlerContext, job: Job) -> None:
        raise RuntimeError("the CRM is down")


    @app.handler("orders.digest")
    async def digest(ctx: HandlerContext, job: Job) -> None:
        slot = job.payload["slot"]
        await ctx.enqueue("orders.mail", {"slot": slot}, key=f"orders.digest:{slot}")


    @app.handler("orders.mail")
    async def mail(ctx: HandlerContext, job: Job) -> None:
        pass


    app.schedule("orders.digest", every_minutes=60)
''')


def fetch(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


async def wait_rows(dsn: str, sql: str, expected: int, timeout: float = 30.0) -> list[tuple]:
    """The rows of ``sql`` once there are ``expected`` of them."""
    with trio.fail_after(timeout):
        while len(found := await trio.to_thread.run_sync(fetch, dsn, sql)) < expected:
            await trio.sleep(0.1)
    return found


async def test_outside_jobs_run_their_kinds_attempts_and_a_slot_keyed_follow_up_exists(
    dsn: str, tmp_path: Path, telegram_stub: TelegramStub,
) -> None:
    workdir = tmp_path / "autom-1"  # the first process's working directory: its modules import
    workdir.mkdir()
    (workdir / "user_automations.py").write_text(USER_MODULE)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, AUTOM_APP="user_automations:app",
                                 RETRY_BASE_SECONDS="0.05", RETRY_MAX_SECONDS="0.1")
        via_enqueue = await autom.enqueue(dsn, "crm.sync", {"via": "autom.enqueue"})
        [(via_sql,)] = await trio.to_thread.run_sync(
            fetch, dsn, "select autom_enqueue('" + json.dumps([{"kind": "crm.sync", "payload": {"via": "sql"}}])
            + "'::jsonb)")
        failed = await wait_rows(dsn, "select id, attempts, max_attempts from jobs"
                                      " where kind = 'crm.sync' and status = 'failed' order by id", 2)
        # the ticker's slot job ran, and its follow-up with the same key (another kind) exists
        digests = await wait_rows(dsn, "select kind, key, status from jobs where kind like 'orders.%'"
                                       " and status = 'done' order by id", 2)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    assert failed == [(via_enqueue, 3, 3), (via_sql, 3, 3)]
    # three runs each, each one recorded as an attempt that did not end done
    attempts = fetch(dsn, "select job_id, count(*) from job_attempts where job_id in"
                          f" ({via_enqueue}, {via_sql}) group by job_id order by job_id")
    assert attempts == [(via_enqueue, 3), (via_sql, 3)]
    [(kind_a, key_a, _), (kind_b, key_b, _)] = digests
    assert (kind_a, kind_b) == ("orders.digest", "orders.mail") and key_a == key_b
    assert key_a.startswith("orders.digest:")
