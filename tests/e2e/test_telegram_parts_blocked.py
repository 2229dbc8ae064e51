"""Split texts and blocked chats in the real ``autom run`` against the Telegram stub (README, Telegram).

* A text over 4,096 characters goes out in parts; a part Telegram refuses (429, 502)
  is sent again, the parts before it are not: each part reaches the chat once.
* A 403 "bot was blocked by the user" ends the job ``cancelled`` without an alert,
  cancels the chat's other pending Telegram jobs and marks the chat; a send to the
  marked chat is cancelled without calling Telegram; an update from the chat (or a
  ``my_chat_member`` "member") clears the mark, "kicked" sets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from autom import enqueue
from autom.limits import split_text
from tests.support.processes import AutomProcess, autom_processes
from tests.support.service import ALERT_CHAT, post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import Reply, TelegramStub

CHAT = 42
BLOCKED = "Forbidden: bot was blocked by the user"
# quick sends: the parts of a message are one chat interval apart
FAST = {"TELEGRAM_CHAT_RATE": "20"}


def _long_text(parts: int) -> str:
    """A text that splits into ``parts`` parts, of numbered lines."""
    text = "".join(f"line {i:04d} " + "x" * 78 + "\n" for i in range(40 * parts))
    assert len(split_text(text)) == parts
    return text


async def _status(db: Any, job_id: int | None) -> str:
    return str(await db.fetch_val("select status from jobs where id = %(id)s", {"id": job_id}))


async def _ended(db: Any, job_id: int | None) -> bool:
    return await _status(db, job_id) in ("done", "failed", "cancelled")


async def _stop(proc: AutomProcess) -> None:
    proc.terminate()
    assert await proc.wait(timeout=20) == 0


async def _send(dsn: str, text: str, *, recipient: str | None = str(CHAT)) -> int:
    job_id = await enqueue(dsn, "telegram.send", {"chat_id": CHAT, "text": text}, recipient=recipient)
    assert job_id is not None
    return job_id


async def _split_send(dsn: str, db: Any, tmp_path: Path, stub: TelegramStub, count: int,
                      replies: list[Reply]) -> tuple[list[str], list[str], dict[str, Any]]:
    """Send a text of ``count`` parts through ``autom run`` while the stub answers the chat's
    sends with ``replies`` (then 200s): the parts, the texts Telegram got, the job's end."""
    text = _long_text(count)
    stub.plan("sendMessage", replies, chat_id=CHAT)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=stub.url, **FAST)
        job_id = await _send(dsn, text)
        await wait_until(lambda: _ended(db, job_id), timeout=30)
        await _stop(proc)
    sent = [c.params["text"] for c in stub.calls_of("sendMessage", chat_id=CHAT)]
    job = await db.fetch_one("select status, attempts from jobs where id = %(id)s", {"id": job_id})
    assert job is not None
    return split_text(text), sent, job


async def test_a_part_refused_with_429_is_sent_again_and_the_parts_before_it_are_not(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    parts, sent, job = await _split_send(dsn, db, tmp_path, telegram_stub, 2,
                                         [Reply(), Reply(status=429, retry_after=1)])
    # part 1, part 2 refused (429), part 2 again: two messages delivered, in order
    assert sent == [parts[0], parts[1], parts[1]], [s[:12] for s in sent]
    assert job == {"status": "done", "attempts": 1}  # the 429 was a deferral, not an attempt


async def test_three_parts_with_failures_on_the_second_and_third_each_reach_the_chat_once(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    # part 2 gets a 429 (deferred), part 3 a 502 (a failed attempt, retried with backoff)
    parts, sent, job = await _split_send(dsn, db, tmp_path, telegram_stub, 3,
                                         [Reply(), Reply(status=429, retry_after=1), Reply(), Reply(status=502)])
    assert sent == [parts[0], parts[1], parts[1], parts[2], parts[2]], [s[:12] for s in sent]
    assert job == {"status": "done", "attempts": 2}  # the 502's attempt and the one that finished


async def test_a_process_killed_mid_message_leaves_the_next_one_to_send_only_the_parts_not_recorded(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    """The window the README names: the part in flight when the process died is sent again,
    the part before it (recorded) is not."""
    text = _long_text(3)
    parts = split_text(text)
    telegram_stub.plan("sendMessage", [Reply(), Reply(hang=True)], chat_id=CHAT)
    quick = {**FAST, "JOB_LEASE_SECONDS": "2"}
    async with autom_processes(tmp_path) as procs:
        first = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **quick)
        job_id = await _send(dsn, text)
        with trio.fail_after(30):
            await telegram_stub.wait_for_calls(2, method="sendMessage", chat_id=CHAT)
        first.kill()
        await first.wait(timeout=10)
        second = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **quick)
        await wait_until(lambda: _ended(db, job_id), timeout=30)
        await _stop(second)
    sent = [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=CHAT)]
    assert sent == [parts[0], parts[1], parts[1], parts[2]], [s[:12] for s in sent]
    job = await db.fetch_one("select status, attempts from jobs where id = %(id)s", {"id": job_id})
    assert job == {"status": "done", "attempts": 2}


async def test_a_chat_that_blocked_the_bot_cancels_its_jobs_without_an_alert_until_it_writes_again(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    telegram_stub.plan("sendMessage", [Reply(status=403, description=BLOCKED)], chat_id=CHAT)
    # queued before the process starts: the chat's line runs them one at a time, in order
    first = await _send(dsn, "one")
    second = await _send(dsn, "two")
    mine = await enqueue(dsn, "site.form", {"chat": CHAT}, recipient=str(CHAT))  # a kind that sends nothing
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **FAST)
        for job_id in (first, second, mine):
            await wait_until(lambda job_id=job_id: _ended(db, job_id), timeout=30)
        assert [await _status(db, j) for j in (first, second, mine)] == ["cancelled", "cancelled", "done"]
        # marked: a new send is cancelled at once, Telegram is not asked (in the chat's line or not)
        later = await _send(dsn, "three")
        loose = await _send(dsn, "four", recipient=None)
        for job_id in (later, loose):
            await wait_until(lambda job_id=job_id: _ended(db, job_id), timeout=30)
        assert [await _status(db, j) for j in (later, loose)] == ["cancelled", "cancelled"]
        assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=CHAT)] == ["one"]
        # the user writes again: the mark goes with the update, and the bot answers
        async with httpx.AsyncClient(base_url=proc.url) as client:
            assert (await post_telegram(client, telegram_update(7, CHAT, "/ping"))).status_code == 202
        with trio.fail_after(30):
            await telegram_stub.wait_for_calls(
                len(telegram_stub.calls_of("sendMessage", chat_id=CHAT)) + 1, method="sendMessage", chat_id=CHAT)
        await wait_until(lambda: _done_message(db), timeout=30)
        await _stop(proc)
    assert telegram_stub.messages(CHAT)[-1]["text"] == "pong"
    assert await db.fetch_val("select count(*) from telegram_blocked") == 0
    job = await db.fetch_one("select attempts, last_error from jobs where id = %(id)s", {"id": first})
    assert job["attempts"] == 1 and "bot was blocked by the user" in job["last_error"], job
    (attempt,) = await db.fetch_all("select outcome from job_attempts where job_id = %(id)s", {"id": first})
    assert attempt == {"outcome": "cancelled"}
    # no alert: none recorded, none sent
    assert await db.fetch_val("select count(*) from alerts") == 0
    assert telegram_stub.calls_of("sendMessage", chat_id=ALERT_CHAT) == []
    assert proc.logged("job cancelled", job_id=first)
    assert not proc.logged("job failed")


async def test_my_chat_member_kicked_marks_the_chat_and_member_clears_it(
    dsn: str, db: Any, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **FAST)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            assert (await post_telegram(client, _member_update(1, CHAT, "kicked"))).status_code == 202
            refused = await _send(dsn, "hello")
            await wait_until(lambda: _ended(db, refused), timeout=30)
            assert (await post_telegram(client, _member_update(2, CHAT, "member"))).status_code == 202
            sent = await _send(dsn, "welcome back")
            await wait_until(lambda: _ended(db, sent), timeout=30)
        await _stop(proc)
    assert [await _status(db, j) for j in (refused, sent)] == ["cancelled", "done"]
    assert [m["text"] for m in telegram_stub.messages(CHAT)] == ["welcome back"]
    members = await db.fetch_all("select status, payload->>'status' as new from jobs where kind = 'telegram.member' "
                                 "order by id")
    assert members == [{"status": "done", "new": "kicked"}, {"status": "done", "new": "member"}]
    assert await db.fetch_val("select count(*) from alerts") == 0


async def _done_message(db: Any) -> bool:
    return bool(await db.fetch_val("select count(*) from jobs where kind = 'telegram.message' and status = 'done'"))


def _member_update(update_id: int, chat_id: int, status: str) -> dict[str, Any]:
    """A ``my_chat_member`` update: the bot's status in a private chat became ``status``."""
    bot = {"id": 1, "is_bot": True, "first_name": "autom stub"}
    return {
        "update_id": update_id,
        "my_chat_member": {
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "T"},
            "date": 1700000000,
            "old_chat_member": {"user": bot, "status": "member" if status == "kicked" else "kicked"},
            "new_chat_member": {"user": bot, "status": status},
        },
    }
