"""TelegramClient against the Bot API stub over real HTTP on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from autom.config import Settings
from autom.errors import ChatBlocked, JobError, PermanentError, Retry, TransientError
from autom.telegram import MAX_TEXT, TelegramClient, open_telegram
from tests.support.fixtures_telegram import telegram_stub  # noqa: F401
from tests.support.telegram_stub import Reply, TelegramStub

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TIMEOUT = 0.5
ROOT = Path(__file__).resolve().parents[2]


def settings_for(url: str, **changes: object) -> Settings:
    base = Settings(
        telegram_api=url,
        telegram_bot_token=TOKEN,
        telegram_alert_chat_id="-1001",
        http_timeout_seconds=TIMEOUT,
    )
    return base.replace(**changes)


@pytest.fixture
async def client(telegram_stub: TelegramStub) -> AsyncIterator[TelegramClient]:  # noqa: F811
    async with open_telegram(settings_for(telegram_stub.url)) as tg:
        yield tg


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_no_token(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert TOKEN not in text and TOKEN not in repr(exc)
    assert exc.__cause__ is None and exc.__context__ is None, "the httpx exception must not be chained"


async def test_send_message_ok(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    first = await client.send_message(42, "hello")
    second = await client.send_message("42", "again", parse_mode="HTML")
    assert first["text"] == "hello" and first["chat"]["id"] == 42
    assert second["message_id"] > first["message_id"]
    assert [m["text"] for m in telegram_stub.messages(chat_id=42)] == ["hello", "again"]
    call = telegram_stub.calls[1]
    assert (call.method, call.token, call.params["parse_mode"]) == ("sendMessage", TOKEN, "HTML")


async def test_generic_call_returns_the_envelope(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("setWebhook", [Reply(200, result=True, description="Webhook was set")])
    answer = await client.call("setWebhook", url="https://example.org/hooks/telegram", secret_token="s3cret")
    assert answer == {"ok": True, "result": True, "description": "Webhook was set"}
    assert telegram_stub.calls_of("setWebhook")[0].params["secret_token"] == "s3cret"


async def test_502_is_transient(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(502)])
    with pytest.raises(TransientError) as info:
        await client.send_message(42, "x")
    assert not isinstance(info.value, Retry)
    assert str(info.value) == "telegram sendMessage: HTTP 502 Bad Gateway"
    # the plan is used up: the next call succeeds
    assert (await client.send_message(42, "y"))["text"] == "y"


async def test_429_is_retry_after(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(429, retry_after=2, description="Too Many Requests: retry after 2")])
    with pytest.raises(Retry) as info:
        await client.send_message(42, "x")
    assert info.value.after == 2
    assert str(info.value) == "telegram sendMessage: HTTP 429 Too Many Requests: retry after 2"


@pytest.mark.parametrize(
    ("status", "description"),
    [(400, "Bad Request: chat not found"), (403, "Forbidden: bot was blocked by the user")],
)
async def test_4xx_is_permanent(
    client: TelegramClient,
    telegram_stub: TelegramStub,  # noqa: F811
    status: int,
    description: str,
) -> None:
    telegram_stub.plan("sendMessage", [Reply(status, description=description)], chat_id=42)
    with pytest.raises(PermanentError) as info:
        await client.send_message(42, "x")
    assert str(info.value) == f"telegram sendMessage: HTTP {status} {description}"


@pytest.mark.parametrize(("description", "blocked"), [
    ("Forbidden: bot was blocked by the user", True),
    ("Forbidden: user is deactivated", True),
    ("Forbidden: bot was kicked from the supergroup chat", True),
    ("Forbidden: bot can't initiate conversation with a user", False),
    ("Forbidden: bot is not a member of the channel chat", False),
])
async def test_a_403_saying_the_chat_blocked_the_bot_is_chat_blocked(
    client: TelegramClient, telegram_stub: TelegramStub, description: str, blocked: bool,  # noqa: F811
) -> None:
    telegram_stub.plan("sendMessage", [Reply(403, description=description)], chat_id=42)
    with pytest.raises(PermanentError) as info:  # ChatBlocked is a PermanentError too
        await client.send_message(42, "x")
    assert isinstance(info.value, ChatBlocked) == blocked
    assert str(info.value) == f"telegram sendMessage: HTTP 403 {description}"
    if blocked:
        assert isinstance(info.value, ChatBlocked) and info.value.chat_id == 42


async def test_plans_per_chat_leave_other_chats_alone(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(403, description="Forbidden: bot was blocked by the user")], chat_id=7)
    await client.send_message(8, "to eight")
    with pytest.raises(PermanentError):
        await client.send_message(7, "to seven")


async def test_200_with_ok_false_is_permanent(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(200, ok=False, description="something odd")])
    with pytest.raises(PermanentError, match="ok=false something odd"):
        await client.send_message(42, "x")


async def test_200_that_is_not_json_is_transient(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(200, body="<html>captive portal</html>")])
    with pytest.raises(TransientError, match="not JSON"):
        await client.send_message(42, "x")


async def test_hanging_server_is_transient_after_the_timeout(
    client: TelegramClient,
    telegram_stub: TelegramStub,  # noqa: F811
) -> None:
    telegram_stub.plan("sendMessage", [Reply(hang=True)])
    started = trio.current_time()
    with pytest.raises(TransientError) as info:
        await client.send_message(42, "x")
    elapsed = trio.current_time() - started
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT + 1.5, elapsed
    assert_no_token(info.value)
    # the client is still usable after a cancelled request
    assert (await client.send_message(42, "y"))["text"] == "y"


async def test_slow_answer_within_the_timeout_is_fine(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(delay=0.2)])
    assert (await client.send_message(42, "x"))["text"] == "x"


async def test_trickled_body_is_cut_by_the_total_deadline(
    client: TelegramClient,
    telegram_stub: TelegramStub,  # noqa: F811
) -> None:
    # one byte every 0.1 s never trips httpx's per-read timeout of 0.5 s; only the total
    # deadline (trio.fail_after) stops it
    telegram_stub.plan("sendMessage", [Reply(trickle=0.1)])
    started = trio.current_time()
    with pytest.raises(TransientError) as info:
        await client.send_message(42, "x")
    elapsed = trio.current_time() - started
    assert elapsed < TIMEOUT + 1.5, elapsed
    assert str(info.value) == "telegram sendMessage: no complete answer within the deadline"
    assert_no_token(info.value)


async def test_server_down_is_transient_without_token() -> None:
    async with open_telegram(settings_for(closed_port_url())) as tg:
        with pytest.raises(TransientError) as info:
            await tg.send_message(42, "x")
    assert str(info.value).startswith("telegram sendMessage: ConnectError")
    assert_no_token(info.value)


@pytest.mark.parametrize("road", ["own", "httpx"])
async def test_token_never_in_logs_or_errors(
    telegram_stub: TelegramStub,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
    road: str,
) -> None:
    """On either road to the Bot API: its own (autom.origin), or httpx (a proxy, tracing, a
    client handed in), whose request log carries the URL."""
    caplog.set_level(logging.DEBUG)
    errors: list[JobError] = []
    telegram_stub.plan(
        "sendMessage",
        [Reply(502), Reply(400, description=f"Bad Request: echo /bot{TOKEN}/sendMessage"), Reply(hang=True)],
    )
    async with httpx.AsyncClient(timeout=2.0) as http:
        tg = TelegramClient(settings_for(telegram_stub.url), http if road == "httpx" else None)
        for _ in range(3):
            try:
                await tg.send_message(42, "x")
            except JobError as exc:
                errors.append(exc)
        await tg.send_message(42, "ok")
        assert TOKEN not in repr(tg)
        await tg.aclose()
    async with open_telegram(settings_for(closed_port_url())) as down:
        assert not await down.alert("the stub is down")
    assert len(errors) == 3
    for exc in errors:
        assert_no_token(exc)
    if road == "httpx":
        assert any("HTTP Request" in r.getMessage() for r in caplog.records), "httpx's request log was expected"
    else:
        assert "telegram sendMessage: HTTP 502" in caplog.messages
    for record in caplog.records:
        assert TOKEN not in record.getMessage(), record.getMessage()
        assert record.exc_info is None or TOKEN not in "".join(traceback.format_exception(*record.exc_info))
    assert TOKEN not in caplog.text


async def test_odd_shaped_token_is_redacted_in_httpx_logs_too(
    telegram_stub: TelegramStub,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = "not-shaped-like-a-bot-token"
    caplog.set_level(logging.DEBUG)
    async with httpx.AsyncClient() as http:  # the road whose request log carries the URL
        await TelegramClient(settings_for(telegram_stub.url, telegram_bot_token=odd), http).send_message(1, "x")
    assert telegram_stub.calls[0].token == odd
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)
    assert odd not in caplog.text


async def test_long_text_is_split_into_messages_of_4096(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    await client.send_message(42, "x" * 10_000)
    await client.send_message(42, "y" * MAX_TEXT)
    await client.send_message(42, "😀" * 3000)  # 6000 UTF-16 units
    texts = [m["text"] for m in telegram_stub.messages(42)]
    assert [len(t) for t in texts[:3]] == [MAX_TEXT, MAX_TEXT, 10_000 - 2 * MAX_TEXT]
    assert "".join(texts[:3]) == "x" * 10_000
    assert texts[3] == "y" * MAX_TEXT
    emoji = texts[4:]
    assert len(emoji) == 2 and "".join(emoji) == "😀" * 3000
    assert all(len(t.encode("utf-16-le")) // 2 <= MAX_TEXT for t in emoji)


async def test_alert_goes_to_the_alert_chat(client: TelegramClient, telegram_stub: TelegramStub) -> None:  # noqa: F811
    assert await client.alert("disk on fire")
    assert telegram_stub.messages(chat_id="-1001")[0]["text"] == "disk on fire"


async def test_alert_never_raises(telegram_stub: TelegramStub, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    async with open_telegram(settings_for(closed_port_url())) as tg:
        assert await tg.alert("down") is False
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found"), Reply(hang=True)])
    async with open_telegram(settings_for(telegram_stub.url)) as tg:
        assert await tg.alert("no such chat") is False
        started = trio.current_time()
        assert await tg.alert("hangs") is False
        assert trio.current_time() - started < TIMEOUT + 1.5
    failures = [r.getMessage() for r in caplog.records if r.name == "autom.telegram" and r.levelno == logging.WARNING]
    assert len(failures) == 3
    assert all("\n" not in line for line in failures)
    assert "chat not found" in failures[1]


async def test_without_an_alert_chat_alerts_go_to_the_log_once_each(
    telegram_stub: TelegramStub, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    # only `autom dev` runs without TELEGRAM_ALERT_CHAT_ID (its banner says so once): each
    # alert is logged and counts as delivered, so the outbox does not try it again every minute
    async with open_telegram(settings_for(telegram_stub.url, telegram_alert_chat_id=None)) as tg:
        result = await tg.deliver_alert("nowhere to send")
    assert result.delivered and telegram_stub.calls == []
    lines = [r.getMessage() for r in caplog.records if r.name == "autom.telegram"]
    assert lines == ["alert (TELEGRAM_ALERT_CHAT_ID is not set, so only logged): nowhere to send"]


async def test_alert_lets_cancellation_through(telegram_stub: TelegramStub) -> None:  # noqa: F811
    telegram_stub.plan("sendMessage", [Reply(hang=True)])
    async with open_telegram(settings_for(telegram_stub.url, http_timeout_seconds=10)) as tg:
        with trio.move_on_after(0.2) as scope:
            await tg.alert("x")
        assert scope.cancelled_caught


async def test_log_only_makes_no_calls(telegram_stub: TelegramStub, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.INFO, logger="autom.telegram")
    async with open_telegram(settings_for(telegram_stub.url, telegram_bot_token=None)) as tg:
        assert tg.log_only
        assert await tg.send_message(42, "hi there") == {"message_id": 0, "log_only": True}
        assert await tg.alert("alert text")
        await tg.call("setWebhook", url="https://x", secret_token="s3cret-value")
    assert telegram_stub.calls == []
    lines = [r.getMessage() for r in caplog.records if r.name == "autom.telegram"]
    assert "sendMessage chat=42 text='hi there'" in lines[0]
    assert "chat=-1001 text='alert text'" in lines[1]
    assert "setWebhook" in lines[2] and "s3cret-value" not in lines[2]


async def test_log_only_forced_even_with_a_token(telegram_stub: TelegramStub) -> None:  # noqa: F811
    async with open_telegram(settings_for(telegram_stub.url), log_only=True) as tg:
        await tg.send_message(42, "x")
    assert telegram_stub.calls == []


async def test_borrowed_http_client_is_not_closed(telegram_stub: TelegramStub) -> None:  # noqa: F811
    async with httpx.AsyncClient() as http:
        tg = TelegramClient(settings_for(telegram_stub.url), http)
        await tg.send_message(1, "x")
        await tg.aclose()
        assert not http.is_closed


def test_no_token_without_log_only_is_a_config_error() -> None:
    from autom.errors import ConfigError

    with pytest.raises(ConfigError, match="TELEGRAM_BOT_TOKEN"):
        TelegramClient(Settings())


async def test_stub_wrong_token_gets_401() -> None:
    from tests.support.telegram_stub import running_stub

    async with running_stub(token="1:right") as stub, open_telegram(settings_for(stub.url)) as tg:
        with pytest.raises(PermanentError, match="HTTP 401 Unauthorized"):
            await tg.send_message(1, "x")


# -- the stub itself (its behaviours are what the tests above rely on) ----------------------


async def test_stub_trickle_really_trickles(telegram_stub: TelegramStub) -> None:  # noqa: F811
    # headers at once, then a byte every 0.05 s: a per-read timeout of 0.3 s never fires,
    # although the whole answer takes longer than that
    telegram_stub.plan("getMe", [Reply(trickle=0.05, body="x" * 10)])
    async with httpx.AsyncClient(timeout=httpx.Timeout(0.3)) as http:
        started = trio.current_time()
        response = await http.post(f"{telegram_stub.url}/bot1:t/getMe", json={})
        assert response.text == "x" * 10
        assert trio.current_time() - started > 0.4


async def test_stub_control_api_over_http(telegram_stub: TelegramStub) -> None:  # noqa: F811
    async with httpx.AsyncClient(base_url=telegram_stub.url, timeout=5) as http:
        planned = await http.post(
            "/_stub/plan", json={"method": "sendMessage", "chat_id": 5, "replies": [{"status": 429, "retry_after": 3}]}
        )
        assert planned.json() == {"ok": True, "planned": 1}
        limited = await http.post("/bot1:t/sendMessage", json={"chat_id": 5, "text": "a"})
        assert limited.status_code == 429
        assert limited.json()["parameters"] == {"retry_after": 3}
        assert limited.json()["description"] == "Too Many Requests: retry after 3"
        form = await http.post("/bot1:t/sendMessage", data={"chat_id": "5", "text": "b"})
        assert form.json()["result"]["chat"]["id"] == 5
        calls = (await http.get("/_stub/calls", params={"method": "sendMessage", "min": 2, "timeout": 1})).json()
        assert [c["params"]["text"] for c in calls["calls"]] == ["a", "b"]
        assert calls["calls"][0]["token"] == "1:t"
        bad = await http.post("/_stub/plan", json={"method": "x", "replies": [{"statsu": 500}]})
        assert bad.status_code == 400
        assert (await http.post("/_stub/reset")).json() == {"ok": True}
        assert (await http.get("/_stub/calls")).json() == {"calls": []}


async def test_stub_waits_for_calls(telegram_stub: TelegramStub) -> None:  # noqa: F811
    async with open_telegram(settings_for(telegram_stub.url)) as tg, trio.open_nursery() as nursery:
        nursery.start_soon(tg.send_message, 9, "later")
        with trio.fail_after(5):
            calls = await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=9)
        assert calls[0].params["text"] == "later"


async def test_stub_runs_as_a_process() -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.support.telegram_stub", "--port", "0", "--print-port"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert process.stdout is not None
        with trio.fail_after(15):
            first = b""
            while not first.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                assert chunk, "the stub exited before printing its port"
                first += chunk
        port = int(first)
        url = f"http://127.0.0.1:{port}"
        async with open_telegram(settings_for(url)) as tg, httpx.AsyncClient(base_url=url, timeout=5) as http:
            await http.post("/_stub/plan", json={"method": "sendMessage", "replies": [{"status": 502}]})
            with pytest.raises(TransientError):
                await tg.send_message(3, "one")
            await tg.send_message(3, "two")
            calls = (await http.get("/_stub/calls", params={"method": "sendMessage"})).json()["calls"]
            assert [c["params"]["text"] for c in calls] == ["one", "two"]
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
