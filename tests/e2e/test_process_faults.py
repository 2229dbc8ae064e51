"""Faults with the real process: ``autom run`` children, real signals, real kills, real replicas.

The Telegram API is the in-process stub (it listens on 127.0.0.1, so the children
reach it); every handler run of a ``/ping`` job is one recorded sendMessage call to
its chat, which is how these tests count runs. The queue is read from the test's
own database connection. tests/integration/test_worker.py has the in-process
happy and failure paths; here only what needs a process boundary.
"""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from tests.support.processes import AutomProcess, AutomProcesses
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.service import post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import Reply, TelegramStub

JOB_COLUMNS = "id, status, attempts, autom_lease_generation(lease) as lease, last_error, recipient"
# "within about a second" (README, Health and metrics), with room for a loaded machine running several processes
QUICK = 2.0


async def start_replicas(
    procs: AutomProcesses, count: int, *, dsn: str, telegram_url: str, **settings: str
) -> list[AutomProcess]:
    """Start ``count`` processes at once (replicas of one database); returns them once all serve."""
    started: list[AutomProcess | None] = [None] * count

    async def one(index: int) -> None:
        started[index] = await procs.start(dsn=dsn, telegram_url=telegram_url, **settings)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return [p for p in started if p is not None]


async def ping(proc: AutomProcess, update_id: int, chat_id: int) -> dict[str, Any]:
    """POST a ``/ping`` update to ``proc``; returns the 202 body."""
    async with httpx.AsyncClient(base_url=proc.url, timeout=5) as client:
        response = await post_telegram(client, telegram_update(update_id, chat_id, "/ping"))
    assert response.status_code == 202, response.text
    return dict(response.json())


async def chat_job(db: Any, chat_id: int) -> dict[str, Any]:
    """The one ``telegram.message`` job of ``chat_id``."""
    rows = await db.fetch_all(
        f"select {JOB_COLUMNS} from jobs where kind = 'telegram.message' and recipient = %s", [str(chat_id)]
    )
    assert len(rows) == 1, rows
    return dict(rows[0])


def sends(stub: TelegramStub, chat_id: int) -> int:
    """How many times a handler called sendMessage for ``chat_id``."""
    return len(stub.calls_of("sendMessage", chat_id=chat_id))


async def wait_sends(stub: TelegramStub, chat_id: int, count: int, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        await stub.wait_for_calls(count, method="sendMessage", chat_id=chat_id)


async def wait_status(db: Any, chat_id: int, status: str, timeout: float = 15.0) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        job = await chat_job(db, chat_id)
        return job if job["status"] == status else None

    return dict(await wait_until(reached, timeout=timeout, interval=0.05))


# -- 1. SIGTERM drains -------------------------------------------------------------------


async def test_sigterm_lets_a_running_job_finish_and_exits_0(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chat = 101
    stub.plan("sendMessage", [Reply(delay=2.0)], chat_id=chat)
    first = await procs.start(dsn=dsn, telegram_url=stub.url, SHUTDOWN_GRACE_SECONDS="20")
    await ping(first, 1, chat)
    await wait_sends(stub, chat, 1)  # the handler waits on the slow answer now
    assert (await chat_job(db, chat))["status"] == "running"

    signalled = trio.current_time()
    first.terminate()
    assert await first.wait(timeout=25) == 0
    took = trio.current_time() - signalled
    # it waited for the handler (the answer came ~2 s after the call), not for the grace (20 s)
    assert 0.5 < took < 10, took

    job = await chat_job(db, chat)
    assert (job["status"], job["attempts"]) == ("done", 1), job
    assert first.logged("got SIGTERM") and first.logged("job done", job_id=job["id"])

    # a new process finds nothing to run again: it answers a fresh ping, and chat 101 got one pong
    second = await procs.start(dsn=dsn, telegram_url=stub.url)
    await ping(second, 2, 102)
    await wait_sends(stub, 102, 1)
    await wait_status(db, 102, "done")
    assert sends(stub, chat) == 1
    assert await chat_job(db, chat) == job


# -- 2. a second SIGTERM cancels ---------------------------------------------------------


async def test_second_sigterm_cancels_and_the_job_goes_back_uncounted(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chat = 201
    stub.plan("sendMessage", [Reply(hang=True)], chat_id=chat)
    first = await procs.start(dsn=dsn, telegram_url=stub.url, SHUTDOWN_GRACE_SECONDS="30")
    await ping(first, 1, chat)
    await wait_sends(stub, chat, 1)

    first.terminate()
    await first.wait_logged("shutting down: draining")  # trio folds signals not yet read into one
    assert first.returncode is None  # draining: it waits for the hung handler
    signalled = trio.current_time()
    first.terminate()
    assert await first.wait(timeout=10) == 0
    assert trio.current_time() - signalled < 5  # not the 30 s grace
    assert first.logged("shutting down now")

    job = await chat_job(db, chat)
    assert (job["status"], job["attempts"]) == ("pending", 0), job
    assert job["last_error"] == "interrupted by shutdown"

    second = await procs.start(dsn=dsn, telegram_url=stub.url)
    job = await wait_status(db, chat, "done")
    assert job["attempts"] == 1, job
    assert sends(stub, chat) == 2  # the interrupted call and the one that finished
    assert second.logged("job done", job_id=job["id"])


# -- 3. kill -9 mid-job --------------------------------------------------------------------


async def test_kill_9_mid_job_runs_again_after_the_lease(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chat = 301
    lease = 2.0
    stub.plan("sendMessage", [Reply(hang=True)], chat_id=chat)
    first = await procs.start(dsn=dsn, telegram_url=stub.url, JOB_LEASE_SECONDS=str(lease))
    await ping(first, 1, chat)
    await wait_sends(stub, chat, 1)

    first.kill()
    assert await first.wait(timeout=5) == -signal.SIGKILL
    job = await chat_job(db, chat)
    assert (job["status"], job["attempts"]) == ("running", 1), job  # nobody put it back

    await procs.start(dsn=dsn, telegram_url=stub.url, JOB_LEASE_SECONDS=str(lease))
    job = await wait_status(db, chat, "done", timeout=20)
    assert job["attempts"] == 2, job
    calls = stub.calls_of("sendMessage", chat_id=chat)
    assert len(calls) == 2
    # the second run waited for the dead process's lease (renewed last up to lease/3 before the kill)
    assert calls[1].time - calls[0].time >= lease * 2 / 3 - 0.2


# -- 4. a long job and a replica -------------------------------------------------------------


async def test_a_job_longer_than_its_lease_runs_once_beside_a_replica(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chat = 401
    # a 3 s lease, renewed every second, stops the handler only if a renewal is answered more than
    # 2.7 s after it was sent: a 1 s lease did at load 6 (the suite's own, under pytest -n)
    stub.plan("sendMessage", [Reply(delay=10.0)], chat_id=chat)  # within the HTTP deadline of 20 s
    first, second = await start_replicas(procs, 2, dsn=dsn, telegram_url=stub.url, JOB_LEASE_SECONDS="3",
                                         HTTP_TIMEOUT_SECONDS="20")
    await ping(first, 1, chat)
    await wait_sends(stub, chat, 1)

    job = await wait_status(db, chat, "done", timeout=30)
    assert (job["attempts"], job["lease"]) == (1, 1), job  # never claimed a second time
    ran = [r for p in (first, second) for r in p.logged("job done", job_id=job["id"])]
    assert len(ran) == 1 and ran[0]["duration_ms"] > 9500, ran  # over three lease periods
    assert sends(stub, chat) == 1
    assert first.returncode is None and second.returncode is None
    for proc in (first, second):
        assert not proc.logged("lease"), proc.logged("lease")


# -- 5. two replicas, hundreds of jobs -------------------------------------------------------


async def test_two_replicas_run_every_job_exactly_once(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chats = [500_000 + n for n in range(100)]
    updates = [telegram_update(10_000 + n, chats[n % len(chats)], "/ping") for n in range(300)]
    # Telegram's limits out of the way: a send deferred by them is claimed again (lease + 1)
    replicas = await start_replicas(procs, 2, dsn=dsn, telegram_url=stub.url,
                                    TELEGRAM_CHAT_RATE="10000", TELEGRAM_GLOBAL_RATE="10000")
    clients = [httpx.AsyncClient(base_url=p.url, timeout=10) for p in replicas]
    answers: dict[int, list[dict[str, Any]]] = {}

    async def deliver(index: int, update: dict[str, Any]) -> None:
        response = await post_telegram(clients[index % 2], update)
        assert response.status_code == 202, response.text
        answers.setdefault(update["update_id"], []).append(response.json())

    async def sender(batch: list[tuple[int, dict[str, Any]]]) -> None:
        for index, update in batch:
            await deliver(index, update)

    try:
        numbered = list(enumerate(updates))
        async with trio.open_nursery() as nursery:
            for lane in range(8):
                nursery.start_soon(sender, numbered[lane::8])
        # redeliveries, to the other replica than the first delivery went to
        async with trio.open_nursery() as nursery:
            for index in (0, 1, 2, 99, 150, 299):
                nursery.start_soon(deliver, index + 1, updates[index])
    finally:
        for client in clients:
            await client.aclose()
    assert sum(1 for a in answers.values() for body in a if body.get("duplicate")) == 6
    assert all(len(a) in (1, 2) and a[0]["jobs"] == 1 for a in answers.values())

    async def all_done() -> bool:
        n = await db.fetch_val("select count(*) from jobs where kind = 'telegram.message' and status = 'done'")
        return bool(n == len(updates))

    await wait_until(all_done, timeout=30, interval=0.1)
    rows = await db.fetch_all(f"select {JOB_COLUMNS} from jobs where kind = 'telegram.message'")
    assert len(rows) == len(updates)
    assert Counter((r["status"], r["attempts"], r["lease"]) for r in rows) == {("done", 1, 1): len(updates)}

    jobs_per_chat = Counter(int(r["recipient"]) for r in rows)
    sends_per_chat = Counter(int(c.params["chat_id"]) for c in stub.calls_of("sendMessage"))
    assert sends_per_chat == jobs_per_chat == Counter({chat: 3 for chat in chats})
    # each job finished in one process only, and both processes took part
    done_lines = [len(p.logged("job done", kind="telegram.message")) for p in replicas]
    assert sum(done_lines) == len(updates)
    assert all(done_lines), done_lines
    assert all(p.returncode is None for p in replicas)


# -- 6. the database goes away and comes back -------------------------------------------------


@pytest.fixture
def outage_pg() -> Iterator[RestartablePg]:
    """A throwaway PostgreSQL the test stops and starts (never the session's server)."""
    with restartable_pg() as pg:
        yield pg


def _fetch_jobs(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return list(conn.execute(f"select {JOB_COLUMNS} from jobs where kind = 'telegram.message' order by id"))


async def test_database_outage_under_a_running_process(
    outage_pg: RestartablePg, stub: TelegramStub, procs: AutomProcesses
) -> None:
    chat, late_chat = 601, 602
    # the first job is in its handler when the database stops; the second waits behind it
    stub.plan("sendMessage", [Reply(delay=1.5)], chat_id=chat)
    proc = await procs.start(dsn=outage_pg.dsn, telegram_url=stub.url)
    await ping(proc, 1, chat)
    await ping(proc, 2, chat)
    await wait_sends(stub, chat, 1)
    rows = await trio.to_thread.run_sync(_fetch_jobs, outage_pg.dsn)
    assert [r["status"] for r in rows] == ["running", "pending"]

    await trio.to_thread.run_sync(outage_pg.stop)
    async with httpx.AsyncClient(base_url=proc.url, timeout=5) as client:
        for _ in range(3):
            started = trio.current_time()
            response = await client.get("/health")
            assert response.status_code == 503, response.text
            assert trio.current_time() - started < QUICK
    # the first handler finishes while the database is down; its completion has to wait
    await proc.wait_logged("job done", kind="telegram.message", timeout=5)
    assert proc.returncode is None

    await trio.to_thread.run_sync(outage_pg.start)
    async with httpx.AsyncClient(base_url=proc.url, timeout=5) as client:
        async def healthy() -> bool:
            return (await client.get("/health")).status_code == 200

        await wait_until(healthy, timeout=15, interval=0.1)
        # the same process, no restart: a new ping is answered
        response = await post_telegram(client, telegram_update(3, late_chat, "/ping"))
        assert response.status_code == 202, response.text
    await wait_sends(stub, late_chat, 1, timeout=15)
    assert stub.messages(late_chat)[0]["text"] == "pong"

    async def settled() -> list[dict[str, Any]] | None:
        rows = await trio.to_thread.run_sync(_fetch_jobs, outage_pg.dsn)
        return rows if all(r["status"] == "done" for r in rows) else None

    rows = await wait_until(settled, timeout=15, interval=0.1)
    assert [(r["recipient"], r["status"], r["attempts"]) for r in rows] == [
        (str(chat), "done", 1), (str(chat), "done", 1), (str(late_chat), "done", 1),
    ]
    assert sends(stub, chat) == 2 and sends(stub, late_chat) == 1
    assert proc.returncode is None
    proc.terminate()
    assert await proc.wait(timeout=10) == 0


async def test_webhooks_get_a_quick_503_from_the_real_process_while_the_database_is_down(
    outage_pg: RestartablePg, stub: TelegramStub, procs: AutomProcesses
) -> None:
    proc = await procs.start(dsn=outage_pg.dsn, telegram_url=stub.url)
    await trio.to_thread.run_sync(outage_pg.stop)
    async with httpx.AsyncClient(base_url=proc.url, timeout=15) as client:
        started = trio.current_time()
        response = await post_telegram(client, telegram_update(1, 701, "/ping"))
        took = trio.current_time() - started
    assert (response.status_code, response.json()) == (503, {"error": "database unavailable"})
    assert took < QUICK, f"503 after {took:.2f} s"
