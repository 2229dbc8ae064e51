"""An alert survives a SIGKILL of the real ``autom run``: the outbox's promise, made to happen.

The job's failure is recorded (with its alert) and the sender is in the middle of
sending it (the stub never answers) when the process is killed; a restarted
service sends it once the dead sender's claim runs out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.support.processes import autom_processes
from tests.support.service import ALERT_CHAT, wait_until
from tests.support.telegram_stub import Reply, TelegramStub


async def test_an_alert_cut_off_by_sigkill_is_sent_by_the_restarted_service(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    telegram_stub.plan("sendMessage", [Reply(hang=True)], chat_id=ALERT_CHAT)
    # HTTP_TIMEOUT_SECONDS 2: the dead sender's claim (3 timeouts + 5 s) runs out in 11 s
    settings = {"HTTP_TIMEOUT_SECONDS": "2"}
    async with autom_processes(tmp_path) as procs:
        first = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **settings)
        job_id = await JobStore(db).enqueue(NewJob("no.such.kind"))
        with trio.fail_after(15):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)
        first.kill()  # while Telegram holds the answer: the alert is recorded, not sent
        await first.wait(timeout=10)
        row = await db.fetch_one("select job_id, sent_at, claimed_until from alerts")
        assert row["job_id"] == job_id and row["sent_at"] is None and row["claimed_until"] is not None
        assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "failed"

        second = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **settings)
        with trio.fail_after(30):
            calls = await telegram_stub.wait_for_calls(2, method="sendMessage", chat_id=ALERT_CHAT)
        assert await wait_until(lambda: db.fetch_val("select sent_as from alerts where sent_at is not null"),
                                timeout=10) == "single"
        second.terminate()
        assert await second.wait(timeout=20) == 0
    texts = [str(call.params["text"]) for call in calls]
    assert texts[0] == texts[1]
    assert texts[1].startswith(f"autom: job {job_id} (no.such.kind) failed after 1 attempt: ")
    assert len(telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT)) == 2  # sent, and only once more
