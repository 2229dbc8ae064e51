"""HEARTBEAT_URL: the heartbeat job pings a dead-man's switch, and a failed ping never fails it.

The outside service is a local HTTP stub (tests/support/http_stub.py) that answers
200, 503, nothing at all, or is not there; the job runs through the real handler
against a real database.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime

import trio

from autom.config import Settings
from autom.handlers import HandlerContext, heartbeat
from autom.jobs.models import Job
from autom.telegram import open_telegram
from tests.support.http_stub import running_http_stub
from tests.support.telegram_stub import Reply

SECRET_PATH = "/ping/0f3c2a9e-secret-uuid"


def heartbeat_job(job_id: int = 7) -> Job:
    return Job(id=job_id, kind="heartbeat", payload={}, attempts=1, max_attempts=8, lease=1,
               locked_until=datetime.now(UTC), key=f"heartbeat:{job_id}")


async def run_heartbeat(db: object, url: str | None, timeout: float = 5.0) -> None:
    settings = Settings(heartbeat_url=url, http_timeout_seconds=timeout)
    async with open_telegram(settings, log_only=True) as telegram:
        await heartbeat.handle(HandlerContext(settings=settings, db=db, telegram=telegram), heartbeat_job())


async def beat_recorded(db: object) -> bool:
    return await db.fetch_val("select count(*) from service_state where name = 'heartbeat'") == 1


async def test_each_heartbeat_job_gets_the_url_once(db):
    async with running_http_stub() as stub:
        await run_heartbeat(db, stub.url + SECRET_PATH + "?rid=1")
        await run_heartbeat(db, stub.url + SECRET_PATH + "?rid=1")
        assert [(r.method, r.path, r.query) for r in stub.requests] == [("GET", SECRET_PATH, "rid=1")] * 2
    assert await beat_recorded(db)


async def test_no_url_no_ping(db):
    async with running_http_stub() as stub:
        await run_heartbeat(db, None)
        assert stub.requests == []
    assert await beat_recorded(db)


async def test_an_error_answer_is_logged_without_the_secret_and_the_job_succeeds(db, caplog):
    caplog.set_level(logging.INFO, logger="autom.handlers.heartbeat")
    async with running_http_stub() as stub:
        stub.plan(Reply(status=503, body="down"))
        await run_heartbeat(db, stub.url + SECRET_PATH)  # returns: the job is done
        assert len(stub.requests) == 1
    assert await beat_recorded(db)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"heartbeat ping to {stub.url} answered HTTP 503"]
    assert "secret" not in caplog.text


async def test_a_ping_that_gets_no_answer_gives_up_at_the_timeout(db, caplog):
    caplog.set_level(logging.WARNING, logger="autom.handlers.heartbeat")
    async with running_http_stub() as stub:
        stub.plan(Reply(hang=True))
        with trio.fail_after(30):  # a backstop for the test, not a timing assertion
            await run_heartbeat(db, stub.url + SECRET_PATH, timeout=0.5)
        assert len(stub.requests) == 1
    assert await beat_recorded(db)
    assert [r.getMessage() for r in caplog.records] == [f"heartbeat ping to {stub.url} got no answer within 0.5s"]


async def test_a_ping_to_a_closed_port_is_logged_and_the_job_succeeds(db, caplog):
    caplog.set_level(logging.WARNING, logger="autom.handlers.heartbeat")
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await run_heartbeat(db, f"http://127.0.0.1:{port}{SECRET_PATH}")
    assert await beat_recorded(db)
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"heartbeat ping to http://127.0.0.1:{port} failed: ConnectError")
    assert "secret" not in message
