"""HEARTBEAT_URL: the heartbeat job pings a dead-man's switch, and a failed ping never fails it.

The outside service is a local HTTP stub (``autom.testing.running_http_stub``) that answers
200, 503, nothing at all, or is not there. The job runs in the real service, from
its schedule, against a real database; the ping's own bounds are tested on ``ping``.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
import trio

from autom.handlers.heartbeat import ping
from autom.schedule import Schedule
from autom.testing import HttpStub, Reply, running_http_stub
from tests.support.service import running_service, service_settings, wait_until
from tests.support.telegram_stub import TelegramStub

SECRET_PATH = "/ping/0f3c2a9e-secret-uuid"
HOURLY = [Schedule("heartbeat", every_minutes=60)]


@pytest.fixture
async def switch() -> Any:
    async with running_http_stub() as stub:
        yield stub


async def heartbeat_done(db: Any) -> bool:
    row = await db.fetch_one("select status, attempts from jobs where kind = 'heartbeat'")
    return row is not None and (row["status"], row["attempts"]) == ("done", 1)


async def test_the_heartbeat_job_gets_the_url(dsn, db, telegram_stub: TelegramStub, switch: HttpStub):
    settings = service_settings(dsn, telegram_stub.url, heartbeat_url=switch.url + SECRET_PATH + "?rid=1")
    async with running_service(settings, schedules=HOURLY):  # the ticker enqueues the slot at start
        with trio.fail_after(20):
            [request] = await switch.wait_for_requests(1)
        await wait_until(lambda: heartbeat_done(db), timeout=20)
    assert (request["method"], request["path"], request["query"]) == ("GET", SECRET_PATH, "rid=1")
    assert await db.fetch_val("select count(*) from service_state where name = 'heartbeat'") == 1
    assert len(switch.requests) == 1  # one job, one ping


async def test_without_a_url_nothing_is_fetched(dsn, db, telegram_stub: TelegramStub, switch: HttpStub):
    async with running_service(service_settings(dsn, telegram_stub.url), schedules=HOURLY):
        await wait_until(lambda: heartbeat_done(db), timeout=20)
    assert switch.requests == []


async def test_an_error_answer_is_logged_without_the_secret_and_the_job_is_done(
    dsn, db, telegram_stub: TelegramStub, switch: HttpStub, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="autom.handlers.heartbeat")
    switch.answers.append(Reply(status=503, body="down"))
    settings = service_settings(dsn, telegram_stub.url, heartbeat_url=switch.url + SECRET_PATH)
    async with running_service(settings, schedules=HOURLY):
        await wait_until(lambda: heartbeat_done(db), timeout=20)  # done at the first attempt
    assert len(switch.requests) == 1
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "autom.handlers.heartbeat" and r.levelno == logging.WARNING]
    assert warnings == [f"heartbeat ping to {switch.url} answered HTTP 503"]
    assert "secret" not in caplog.text


async def test_a_ping_that_gets_no_answer_gives_up_at_its_deadline(switch: HttpStub, caplog):
    caplog.set_level(logging.WARNING, logger="autom.handlers.heartbeat")
    switch.answers.append(Reply(hang=True))
    with trio.fail_after(30):  # a backstop for the test, not a timing assertion
        assert await ping(switch.url + SECRET_PATH, within=0.5) is False
    # one try, no retry (on a machine at load 15 the deadline can pass before the stub has read the request)
    assert len(switch.requests) <= 1
    assert [r.getMessage() for r in caplog.records if r.name == "autom.handlers.heartbeat"] == [
        f"heartbeat ping to {switch.url} got no answer within 0.5s"]


async def test_a_ping_to_a_closed_port_is_logged_without_the_secret(caplog):
    caplog.set_level(logging.WARNING, logger="autom.handlers.heartbeat")
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert await ping(f"http://user:pw@127.0.0.1:{port}{SECRET_PATH}", within=5) is False
    [message] = [r.getMessage() for r in caplog.records if r.name == "autom.handlers.heartbeat"]
    assert message.startswith(f"heartbeat ping to http://127.0.0.1:{port} failed: ConnectError")
    assert "secret" not in message and "pw" not in message


async def test_a_2xx_answer_is_success(switch: HttpStub):
    assert await ping(switch.url + SECRET_PATH, within=5) is True
    assert switch.requests[0]["method"] == "GET"
