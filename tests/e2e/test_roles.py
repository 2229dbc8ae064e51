"""Roles: one ``autom run --role intake`` and one ``--role worker`` process on one database.

The intake-only process takes the webhooks and runs no job; the worker-only
process runs every job once (the schedule and its heartbeat included), answers
only /health and /metrics, and refuses every webhook with 404. Jobs are counted
from the database, the Telegram stub's recorded calls and each process's log.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx

from tests.support.processes import AutomProcess, AutomProcesses
from tests.support.service import ADMIN_TOKEN, post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import TelegramStub


async def get(proc: AutomProcess, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=proc.url, timeout=5) as client:
        return await client.get(path, **kwargs)


async def test_an_intake_and_a_worker_process_do_the_work_once(
    dsn: str, db: Any, stub: TelegramStub, procs: AutomProcesses
) -> None:
    # the worker first: it must run without anyone serving webhooks; --role on the
    # command line for one, ROLE in the environment for the other
    worker = await procs.start(dsn=dsn, telegram_url=stub.url, ROLE="worker")
    intake = await procs.start(dsn=dsn, telegram_url=stub.url, args=["--role", "intake"])
    await worker.wait_logged("autom serving", role="worker")
    await intake.wait_logged("autom serving", role="intake")
    # a source without its secret is said to be disabled at start, where webhooks are taken
    assert [r["msg"] for r in intake.logged("is disabled")] == [
        f"source {name} is disabled: POST /hooks/{name} answers 404 until {name.upper()}_WEBHOOK_SECRET is set"
        for name in ("github", "stripe", "standard")
    ]
    assert worker.logged("is disabled") == []
    # and a delivery to one is still 404, with the setting named in the log
    async with httpx.AsyncClient(base_url=intake.url, timeout=5) as client:
        disabled = await client.post("/hooks/github", content=b"{}")
    assert disabled.status_code == 404 and disabled.json() == {"error": "unknown source"}
    await intake.wait_logged("webhook for the disabled source github: set GITHUB_WEBHOOK_SECRET to enable it")

    chats = [700_000 + n for n in range(20)]
    updates = [telegram_update(20_000 + n, chats[n % len(chats)], "/ping") for n in range(60)]
    async with httpx.AsyncClient(base_url=intake.url, timeout=10) as client:
        for update in updates:
            response = await post_telegram(client, update)
            assert response.status_code == 202, response.text
        again = await post_telegram(client, updates[0])  # a redelivery: nothing new
        assert again.json() == {"duplicate": True}
        # the intake serves the operator's API too
        stats = await client.get("/admin/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert stats.status_code == 200

    async def all_done() -> bool:
        n = await db.fetch_val("select count(*) from jobs where kind = 'telegram.message' and status = 'done'")
        return bool(n == len(updates))

    await wait_until(all_done, timeout=30, interval=0.1)
    rows = await db.fetch_all("select status, attempts, recipient from jobs where kind = 'telegram.message'")
    assert Counter((r["status"], r["attempts"]) for r in rows) == {("done", 1): len(updates)}
    # no hand-off across processes: every job was claimed by the worker process's pool. Each of
    # its claims writes the pool's worker_starts row in claimed_by (migrations/0021); a hand-off
    # stores the job claimed in its event's own transaction with claimed_by NULL (migrations/0029,
    # tests/integration/test_intake_handoff.py), and a pool in the intake would be a second row.
    # Not read from the times: a claim takes only jobs due by its now(), and a delivery's job is
    # due at its event's received_at (one now()), so "claimed_at <= received_at" found only
    # equal times: a hand-off's, or two transactions started in the same microsecond (it failed
    # once, 1 job in 3 runs of the suite under -n 2, and could not be made to again)
    claims = await db.fetch_all("select j.id, j.claimed_by, j.claimed_at, e.received_at from jobs j"
                                " join events e on e.id = j.event_id order by j.id")
    claimants = Counter(r["claimed_by"] for r in claims)
    assert len(claims) == len(updates) and len(claimants) == 1 and None not in claimants, (
        claimants, [r for r in claims if r["claimed_by"] is None])
    # and never before its event: equal times pass (see above), an earlier claim would be a bug
    assert [r for r in claims if r["claimed_at"] < r["received_at"]] == []
    sends_per_chat = Counter(int(c.params["chat_id"]) for c in stub.calls_of("sendMessage"))
    assert sends_per_chat == Counter({chat: 3 for chat in chats})  # each job once: one pong each

    # every job ran in the worker process, none in the intake process
    assert len(worker.logged("job done", kind="telegram.message")) == len(updates)
    assert intake.logged("job done") == []
    # the schedule runs where the workers run: the heartbeat slot was enqueued by the worker and done
    heartbeat = await db.fetch_all("select status from jobs where kind = 'heartbeat'")
    assert [r["status"] for r in heartbeat] == ["done"]
    assert worker.logged("scheduled job enqueued") and not intake.logged("scheduled job enqueued")

    # the worker serves its health and metrics only
    assert (await get(worker, "/health")).status_code == 200
    metrics = await get(worker, "/metrics")
    assert metrics.status_code == 200 and "autom_workers 4.0" in metrics.text
    for method, path in [("POST", "/hooks/telegram"), ("GET", "/admin/stats"), ("GET", "/openapi.json"),
                         ("GET", "/")]:
        async with httpx.AsyncClient(base_url=worker.url, timeout=5) as client:
            response = await client.request(method, path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert response.status_code == 404, (method, path, response.text)
    # the intake runs no workers
    assert "autom_workers 0.0" in (await get(intake, "/metrics")).text

    # both drain and exit 0 on SIGTERM
    for proc in (intake, worker):
        proc.terminate()
    for proc in (intake, worker):
        assert await proc.wait(timeout=30) == 0
    assert await db.fetch_val("select count(*) from jobs where status in ('pending', 'running')") == 0
