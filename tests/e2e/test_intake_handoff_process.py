"""The intake's hand-off in a real ``autom run`` (ROLE=all): an idle process runs the job of a
webhook it just stored without a claim statement, and under a burst to one chat the jobs of
that chat still run one at a time, in order, each once.

"Without a claim" is read from SQL state: a handed-off job was claimed in its event's own
transaction (its ``claimed_at`` is the event's ``received_at``, that transaction's
``now()``); a claim is a later transaction.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from tests.support.processes import AutomProcesses
from tests.support.service import post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import TelegramStub

JOBS = ("select j.id, j.status, j.attempts, autom_lease_generation(j.lease) as lease, j.claimed_at,"
        " j.finished_at, j.claimed_at = e.received_at as handed"
        " from jobs j join events e on e.id = j.event_id where j.recipient = %(chat)s order by j.id")


async def test_an_idle_process_runs_its_webhooks_job_without_a_claim(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    proc = await procs.start(dsn=dsn, telegram_url=stub.url)
    # idle first: the jobs its schedules enqueue at start (heartbeat, prune) have run
    await wait_until(lambda: db.fetch_val("select count(*) = 0 from jobs where status in ('pending', 'running')"),
                     timeout=30)
    chats = [910_000 + n for n in range(3)]
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
        for n, chat in enumerate(chats):
            response = await post_telegram(client, telegram_update(30_000 + n, chat, "/ping"))
            assert response.status_code == 202, response.text
            await wait_until(lambda n=n: len(stub.calls_of("sendMessage")) == n + 1)  # idle again
    for chat in chats:
        async def done(chat: int = chat) -> bool:
            return [r["status"] for r in await db.fetch_all(JOBS, {"chat": str(chat)})] == ["done"]

        await wait_until(done)
        [row] = await db.fetch_all(JOBS, {"chat": str(chat)})
        assert (row["attempts"], row["lease"], row["handed"]) == (1, 1, True)
    assert {int(c.params["chat_id"]) for c in stub.calls_of("sendMessage")} == set(chats)
    assert len(proc.logged("job done", kind="telegram.message")) == len(chats)


async def test_a_burst_to_one_chat_runs_one_at_a_time_in_order(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    """20 updates to one chat sent together (plain text: the handler sends nothing, so the
    chat's send limit does not defer them): whichever were handed off or claimed, each ran
    once, in the chat's line order, none before the previous one had finished."""
    proc = await procs.start(dsn=dsn, telegram_url=stub.url)
    chat = 920_000
    async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client, trio.open_nursery() as nursery:
        async def send(n: int) -> None:
            response = await post_telegram(client, telegram_update(40_000 + n, chat, f"hello {n}"))
            assert response.status_code == 202, response.text

        for n in range(20):
            nursery.start_soon(send, n)

    async def all_done() -> bool:
        return [r["status"] for r in await db.fetch_all(JOBS, {"chat": str(chat)})] == ["done"] * 20

    await wait_until(all_done, timeout=30, interval=0.1)
    # the chat's line: creation order, as the claim and the hand-off read it (jobs_recipient_line)
    rows = await db.fetch_all(JOBS.replace("order by j.id", "order by coalesce(j.queued_at, j.run_at), j.id"),
                              {"chat": str(chat)})
    assert all(r["attempts"] == 1 for r in rows)
    # One at a time, in that order, read from the process's own log (one process, its lines in
    # the order things happened there): each job's handler starts after the previous job is
    # done. The jobs' timestamps cannot show it: now() is when the server read a statement, and
    # a backend descheduled before its snapshot (2 loaded cores) claimed the next job with a
    # claimed_at 3 ms before the previous job's finished_at, having seen it finished.
    ids = {r["id"] for r in rows}
    steps = [(r["msg"], r["job_id"]) for r in proc.log_records()
             if r.get("job_id") in ids and r.get("msg") in ("message received", "job done")]
    assert steps == [(msg, r["id"]) for r in rows for msg in ("message received", "job done")], steps
    # (a hand-off over a line that was not finished: the race itself is tested in
    # tests/integration/test_intake_handoff.py)
    assert len(proc.logged("job done", kind="telegram.message")) == 20
