"""``serve_http`` over real sockets: health, JSON errors, and keep-alive connections at shutdown.

The keep-alive tests guard ``ShieldFinalSend`` (autom/web/serve.py says why): with
quart-trio 0.12 and hypercorn 0.18, a connection that served one request loses its
idle timer, never times out, and keeps serving new requests after shutdown began.
They talk raw HTTP/1.1 on a trio socket so nothing in a client library hides
whether the server closed the connection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from hypercorn.trio import serve

from autom.errors import VerificationError
from autom.web import create_app
from autom.web.serve import KEEP_ALIVE_TIMEOUT, hypercorn_config
from tests.support.http_app import RunningApp, app_settings, count_rows, make_deps, running_app

KEEP_ALIVE = 0.5


@pytest.fixture
async def app(db: Any) -> AsyncIterator[RunningApp]:
    """The app with a short keep-alive timeout (SHUTDOWN_GRACE_SECONDS=5, so graceful_timeout=5)."""
    async with running_app(db, keep_alive_timeout=KEEP_ALIVE) as running:
        yield running


async def request(stream: trio.SocketStream, raw: bytes) -> tuple[int, bytes]:
    """Send one raw HTTP/1.1 request on ``stream`` and read its answer: (status, body)."""
    await stream.send_all(raw)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, "connection closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "connection closed mid-answer"
        body += chunk
    return int(lines[0].split()[1]), body


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
# refused by verification: touches no database, but reads a body (the intake's path)
POST_UNSIGNED = (
    b"POST /hooks/telegram HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    b"Content-Length: 17\r\n\r\n{\"update_id\": 1}\n"
)


async def closed_within(stream: trio.SocketStream, seconds: float) -> float | None:
    """Seconds until the server closes ``stream`` (EOF or reset), or None if it stays open that long."""
    started = trio.current_time()
    with trio.move_on_after(seconds):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return trio.current_time() - started
    return None


async def test_health_answers_ok_with_the_database_up(app: RunningApp) -> None:
    response = await app.client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["database"]) == ("ok", "ok")
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"


class ExplodingSource:
    """A source with a bug: its verify raises something it promised never to raise."""

    name = "boom"
    secret_headers: frozenset[str] = frozenset()

    def verify(self, headers: Any, body: bytes, now: float) -> None:
        raise RuntimeError("secret-ish internal detail")

    def dedup_key(self, headers: Any, body: bytes) -> None:
        return None

    def parse(self, headers: Any, text: str) -> Any:
        raise AssertionError("not reached")


async def test_an_unexpected_error_is_a_json_500_without_details(db: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="autom.intake")
    async with running_app(db, sources={"boom": ExplodingSource()}) as app:
        response = await app.client.post("/hooks/boom", content=b"{}")
        # the connection stays usable after it
        again = await app.client.post("/hooks/boom", content=b"{}")
    assert response.status_code == again.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert "secret-ish" not in response.text and "Traceback" not in response.text
    assert await count_rows(db, "events") == 0
    # the details go to the log, with the traceback (the door answers it: Quart never sees a delivery)
    failures = [r for r in caplog.records if r.name == "autom.intake" and r.exc_info]
    assert len(failures) == 2 and "secret-ish" in caplog.text


async def test_a_verification_error_from_a_fake_source_is_401(db: Any) -> None:
    class Refusing(ExplodingSource):
        def verify(self, headers: Any, body: bytes, now: float) -> None:
            raise VerificationError("nope")

    async with running_app(db, sources={"boom": Refusing()}) as app:
        response = await app.client.post("/hooks/boom", content=b"{}")
    assert (response.status_code, response.json()) == (401, {"error": "verification failed"})


@pytest.mark.parametrize("raw", [GET_HEALTH, POST_UNSIGNED], ids=["get-health", "post-hook"])
async def test_an_idle_keep_alive_connection_times_out_after_a_request(app: RunningApp, raw: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", app.port)
    async with stream:
        status, _ = await request(stream, raw)
        assert status in (200, 401)
        closed_after = await closed_within(stream, KEEP_ALIVE + 2)
    assert closed_after is not None, "an idle keep-alive connection was never closed"
    assert closed_after >= KEEP_ALIVE - 0.2


async def test_a_connection_idle_as_long_as_a_client_keeps_it_is_still_served(db: Any) -> None:
    """The server keeps an idle connection longer than clients keep theirs for reuse (httpx
    5 s, the soak's sender). Before, both were 5 s: a request sent on the connection just
    as the server closed it got no answer (httpx: RemoteProtocolError "Server disconnected
    without sending a response"; 14 of 400 reuses at the boundary, none with the server's
    timeout above the client's). The default configuration, a raw socket, idle a second
    longer than httpx's expiry."""
    idle = httpx.Limits().keepalive_expiry
    assert idle is not None
    async with running_app(db) as app:
        stream = await trio.open_tcp_stream("127.0.0.1", app.port)
        async with stream:
            assert (await request(stream, GET_HEALTH))[0] == 200
            assert await closed_within(stream, idle + 1) is None, "the server closed the idle connection first"
            assert (await request(stream, POST_UNSIGNED))[0] == 401  # answered on the same connection


@pytest.mark.parametrize("raw", [GET_HEALTH, POST_UNSIGNED], ids=["get-health", "post-hook"])
async def test_shutdown_closes_idle_keep_alive_connections_at_once(db: Any, raw: bytes) -> None:
    # keep-alive long enough that only the shutdown can close the connection in time
    async with running_app(db, keep_alive_timeout=30) as app:
        stream = await trio.open_tcp_stream("127.0.0.1", app.port)
        async with stream:
            status, _ = await request(stream, raw)
            assert status in (200, 401)
            # the connection is idle and open: it serves a second request
            assert (await request(stream, GET_HEALTH))[0] == 200

            app.shutdown()
            closed_after = await closed_within(stream, 1.0)
            assert closed_after is not None, "an idle keep-alive connection outlived the shutdown"
        with trio.fail_after(1.0):  # well before graceful_timeout (5 s): nothing held the server
            await app.done.wait()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", app.port)


async def test_a_keep_alive_request_after_shutdown_is_not_served(db: Any) -> None:
    async with running_app(db, keep_alive_timeout=30) as app:
        stream = await trio.open_tcp_stream("127.0.0.1", app.port)
        async with stream:
            assert (await request(stream, GET_HEALTH))[0] == 200
            app.shutdown()
            await trio.sleep(0.2)
            answer = b""
            with trio.move_on_after(1.0):
                try:
                    await stream.send_all(GET_HEALTH)
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                except trio.BrokenResourceError:
                    pass
            assert b"HTTP/1.1 200" not in answer


async def test_without_the_middleware_the_upstream_bug_is_still_there(db: Any) -> None:
    """The reason for ShieldFinalSend; when this starts skipping, upstream fixed it and it may go."""
    deps = make_deps(app_settings(), db)
    config = hypercorn_config(deps.settings, ["127.0.0.1:0"], keep_alive_timeout=KEEP_ALIVE)
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(serve, create_app(deps), config, shutdown_trigger=partial(deps.shutdown.wait_value, True))
        )
        port = int(urls[0].rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await request(stream, GET_HEALTH)
            closed_after = await closed_within(stream, KEEP_ALIVE + 1.5)
        deps.shutdown.value = True
    if closed_after is not None:
        pytest.skip("quart-trio/hypercorn keep the idle timer now: ShieldFinalSend may be unnecessary")


async def test_health_json_is_compact_and_complete(app: RunningApp) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", app.port)
    async with stream:
        status, body = await request(stream, GET_HEALTH)
    assert status == 200
    assert set(json.loads(body)) >= {"status", "database", "uptime_seconds"}


def test_hypercorn_config_follows_the_settings() -> None:
    config = hypercorn_config(app_settings(shutdown_grace_seconds=2, host="::", port=8123))
    assert config.bind == ["[::]:8123"]
    assert config.graceful_timeout == 2  # never longer than the service's own grace
    assert hypercorn_config(app_settings(shutdown_grace_seconds=600)).graceful_timeout <= 600
    # above the idle time of the clients and proxies that reuse connections (README, "Keep-alive")
    assert config.keep_alive_timeout == KEEP_ALIVE_TIMEOUT > 90
    assert hypercorn_config(app_settings(), ["127.0.0.1:0"]).bind == ["127.0.0.1:0"]
    # loggers, not "-": hypercorn adds no handler of its own (no duplicate lines)
    assert config.errorlog is logging.getLogger("hypercorn.error")
    assert not logging.getLogger("hypercorn.error").handlers


async def test_serving_freezes_the_start_up_objects_out_of_the_collectors_sight(db: Any) -> None:
    """A full collection walked every object of hypercorn, Quart and psycopg (33 ms, once a
    second under load: the intake's p99); serve_http freezes what start-up made, once."""
    import gc

    async with running_app(db) as app:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000
        assert (await app.client.get("/health")).status_code == 200
    async with running_app(db):
        assert gc.get_freeze_count() <= frozen  # once per process (frozen objects can still be freed)


async def test_serve_http_tells_a_departed_client_without_waiting(db: Any) -> None:
    """The door asks ``receive.departure_check()`` (DrainRequestBody's) whether a sender whose
    delivery waits for a hop has gone, instead of waiting on ``receive`` (web/door.py). It can
    only when hypercorn's receive is a trio memory channel's; when this fails after an
    upgrade, the intake falls back to waiting on ``receive`` (correct, ~40 µs slower a delivery)."""
    from autom.web.serve import serve_http

    checks: list[Any] = []
    read = trio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body", False):
            pass
        checks.append(receive.departure_check())
        read.set()
        with trio.fail_after(5):
            while not checks[0]():  # the client closes without waiting for an answer
                await trio.sleep(0.005)
        checks.append("gone")

    deps = make_deps(app_settings(), db)
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve_http, deps, app, binds=["127.0.0.1:0"]))
        stream = await trio.open_tcp_stream("127.0.0.1", int(urls[0].rsplit(":", 1)[1]))
        await stream.send_all(POST_UNSIGNED)
        with trio.fail_after(5):
            await read.wait()
        assert checks[0] is not None and checks[0]() is False  # connected: nothing waits in its channel
        await stream.aclose()
        with trio.fail_after(5):
            while len(checks) < 2:
                await trio.sleep(0.005)
        deps.shutdown.value = True
