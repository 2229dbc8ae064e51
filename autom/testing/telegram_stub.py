"""A Telegram Bot API stub for autom's tests and yours: a real HTTP server on 127.0.0.1.

It records calls and answers as scripted (``TelegramStub``: its routes). In a trio test:
``async with running_stub() as stub:`` (or the ``telegram_stub`` fixture of
``tests/support/fixtures_telegram.py``), then point ``TELEGRAM_API`` at ``stub.url``. As a
process for end-to-end tests: ``python -m autom.testing.telegram_stub --port 0 --print-port``
prints the port on its first stdout line, serves until SIGTERM/SIGINT and is steered
over HTTP (``/_stub/...``).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qsl

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: Telegram's answer to a second answerCallbackQuery of one query (or one too late)
ANSWERED_TWICE = "Bad Request: query is too old and response timeout expired or query ID is invalid"

_METHOD_PATH = re.compile(r"/bot([^/]+)/([A-Za-z0-9_]+)/?")


@dataclass
class Reply:
    """One scripted answer.

    ``status`` with Telegram's envelope: ``{"ok": true, "result": ...}`` for 2xx, else
    ``{"ok": false, "error_code": status, "description": ...}``. ``retry_after`` adds
    ``parameters.retry_after`` (the JSON form Telegram uses; add a ``Retry-After`` header
    through ``headers`` to test that form). ``ok=False`` with 200 gives the "200 but not
    ok" answer; ``result`` overrides the default result; ``body`` (str) replaces the
    whole body (not JSON then, unless you make it so). ``delay`` answers after that many
    seconds; ``hang`` never answers (until the stub stops); ``trickle`` sends the body
    one byte every ``trickle`` seconds (headers at once).
    """

    status: int = 200
    description: str | None = None
    retry_after: float | None = None
    result: Any = None
    ok: bool | None = None
    body: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False
    trickle: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reply:
        """A Reply from the control API's JSON (unknown keys are an error, to catch typos)."""
        return cls(**data)


@dataclass
class Call:
    """One recorded Bot API call; ``time`` is wall-clock epoch seconds (comparable across processes)."""

    method: str
    token: str
    params: dict[str, Any]
    time: float

    def to_json(self) -> dict[str, Any]:
        """The call as the control API returns it."""
        return asdict(self)


class TelegramStub:
    """The stub's state and its ASGI app (``self`` is the app). ``url`` is set once it serves.

    Routes:

    * ``POST /bot{token}/{method}``: recorded (method, token, params, time), then
      answered by the next planned ``Reply`` for (method, chat_id), else for method,
      else 200 with a plausible result (sendMessage: a Message with increasing
      ``message_id``; editMessageText: the edited Message; answerCallbackQuery: true,
      and, as Telegram, 400 "query is too old ... or query ID is invalid" to a second
      answer to one query). Params are read from JSON, a form body or the query string.
    * ``POST /_stub/plan``: ``{"method": "sendMessage", "chat_id": 42 (optional),
      "replies": [{"status": 502}, {"status": 429, "retry_after": 2}, {"hang": true}]}``.
    * ``GET /_stub/calls?method=&chat_id=&min=&timeout=``: ``{"calls": [...]}``;
      with ``min`` it waits (up to ``timeout`` s, default 5) for that many matching calls.
    * ``POST /_stub/reset``: forget calls and plans.
    """

    # a raw ASGI app on hypercorn.trio.serve (no Quart): less to start per test, and
    # hypercorn's keep-alive timer works with it (quart-trio's is broken: autom/web/serve.py)

    def __init__(self, *, token: str | None = None) -> None:
        #: if set, calls with another token get 401 Unauthorized, as from Telegram
        self.token = token
        self.url = ""
        self.calls: list[Call] = []
        self._plans: dict[tuple[str, str | None], deque[Reply]] = defaultdict(deque)
        self._next_message_id = 1
        self._answered: set[str] = set()
        self._changed = trio.Event()
        self._held: set[trio.CancelScope] = set()

    # -- scripting and inspection -------------------------------------------------------

    def plan(self, method: str, replies: Iterable[Reply], *, chat_id: int | str | None = None) -> None:
        """Queue ``replies`` for the next calls of ``method`` (only those to ``chat_id`` if given)."""
        key = (method.lower(), None if chat_id is None else str(chat_id))
        self._plans[key].extend(replies)

    def reset(self) -> None:
        """Forget recorded calls and planned replies, and cut held answers (message ids keep increasing).

        A process stub lives across tests: a hang planned by the last test must not hold a
        connection into the next one.
        """
        self.release()
        self.calls.clear()
        self._plans.clear()

    def calls_of(self, method: str | None = None, chat_id: int | str | None = None) -> list[Call]:
        """Recorded calls, optionally only of ``method`` and/or to ``chat_id``."""
        return [c for c in self.calls if _matches(c, method, chat_id)]

    def messages(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """The params of every sendMessage call (to ``chat_id`` if given), oldest first."""
        return [c.params for c in self.calls_of("sendMessage", chat_id)]

    def edits(self, chat_id: int | str | None = None) -> list[dict[str, Any]]:
        """The params of every editMessageText call (to ``chat_id`` if given), oldest first."""
        return [c.params for c in self.calls_of("editMessageText", chat_id)]

    def answers(self, callback_id: str | None = None) -> list[dict[str, Any]]:
        """The params of every answerCallbackQuery call (for ``callback_id`` if given), oldest first."""
        return [c.params for c in self.calls_of("answerCallbackQuery")
                if callback_id is None or c.params.get("callback_query_id") == callback_id]

    async def wait_for_calls(
        self, count: int = 1, *, method: str | None = None, chat_id: int | str | None = None
    ) -> list[Call]:
        """Wait until at least ``count`` matching calls were recorded; return them.

        No timeout of its own: wrap it in ``trio.fail_after`` in the test.
        """
        while len(found := self.calls_of(method, chat_id)) < count:
            await self._changed.wait()
        return found

    def release(self) -> None:
        """Cut every held answer (hang, delay, trickle) short, e.g. before shutting down."""
        for scope in list(self._held):
            scope.cancel()

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        path: str = scope["path"]
        if path.startswith("/_stub/"):
            await self._control(scope, path, body, send)
            return
        match = _METHOD_PATH.fullmatch(path)
        if match is None:
            await _send_json(send, 404, {"ok": False, "error_code": 404, "description": "Not Found"})
            return
        token, method = match.groups()
        params = _params(scope, body)
        self._record(Call(method=method, token=token, params=params, time=time.time()))
        if self.token is not None and token != self.token:
            await _send_json(send, 401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
            return
        await self._answer(self._next_reply(method, params), method, params, send)

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self._changed.set()
        self._changed = trio.Event()

    def _next_reply(self, method: str, params: dict[str, Any]) -> Reply:
        chat_id = params.get("chat_id")
        for key in ((method.lower(), None if chat_id is None else str(chat_id)), (method.lower(), None)):
            queue = self._plans.get(key)
            if queue:
                return queue.popleft()
        if method.lower() == "answercallbackquery":
            query_id = str(params.get("callback_query_id"))
            if query_id in self._answered:
                return Reply(status=400, description=ANSWERED_TWICE)
            self._answered.add(query_id)
        return Reply()

    async def _answer(self, reply: Reply, method: str, params: dict[str, Any], send: Send) -> None:
        payload = self._payload(reply, method, params)
        headers = [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()]
        with trio.CancelScope() as held:
            self._held.add(held)
            try:
                if reply.hang:
                    await trio.sleep_forever()
                if reply.delay:
                    await trio.sleep(reply.delay)
                if reply.trickle is None:
                    await _send_bytes(send, reply.status, payload, headers)
                    return
                await send(_start(reply.status, payload, headers))
                for index in range(len(payload)):
                    await send({"type": "http.response.body", "body": payload[index : index + 1], "more_body": True})
                    await trio.sleep(reply.trickle)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                self._held.discard(held)
        # cut short by release(): nothing (more) is sent; hypercorn closes the connection

    def _payload(self, reply: Reply, method: str, params: dict[str, Any]) -> bytes:
        if reply.body is not None:
            return reply.body.encode()
        ok = (200 <= reply.status < 300) if reply.ok is None else reply.ok
        envelope: dict[str, Any] = {"ok": ok}
        if ok:
            envelope["result"] = reply.result if reply.result is not None else self._default_result(method, params)
        else:
            envelope["error_code"] = reply.status if reply.status >= 400 else 400
            envelope["description"] = reply.description or _default_description(reply.status, reply.retry_after)
        if reply.description and ok:
            envelope["description"] = reply.description
        if reply.retry_after is not None:
            envelope["parameters"] = {"retry_after": reply.retry_after}
        return json.dumps(envelope).encode()

    def _default_result(self, method: str, params: dict[str, Any]) -> Any:
        name = method.lower()
        if name in ("sendmessage", "editmessagetext"):
            message_id: Any
            if name == "sendmessage":
                message_id, self._next_message_id = self._next_message_id, self._next_message_id + 1
            else:
                message_id = params.get("message_id")
            chat_id = params.get("chat_id")
            with_int = int(chat_id) if isinstance(chat_id, str) and re.fullmatch(r"-?\d+", chat_id) else chat_id
            message: dict[str, Any] = {
                "message_id": message_id,
                "date": int(time.time()),
                "chat": {"id": with_int, "type": "private"},
                "text": params.get("text"),
            }
            if params.get("reply_markup") is not None:
                message["reply_markup"] = params["reply_markup"]
            if name == "editmessagetext":
                message["edit_date"] = int(time.time())
            return message
        if name == "getme":
            return {"id": 1, "is_bot": True, "first_name": "autom stub", "username": "autom_stub_bot"}
        if name == "getwebhookinfo":
            return {"url": "", "has_custom_certificate": False, "pending_update_count": 0}
        return True

    async def _control(self, scope: Scope, path: str, body: bytes, send: Send) -> None:
        method = scope["method"]
        try:
            if path == "/_stub/plan" and method == "POST":
                data = json.loads(body)
                replies = [Reply.from_json(r) for r in data.get("replies", [])]
                self.plan(data["method"], replies, chat_id=data.get("chat_id"))
                await _send_json(send, 200, {"ok": True, "planned": len(replies)})
            elif path == "/_stub/calls" and method == "GET":
                query = dict(parse_qsl(scope.get("query_string", b"").decode()))
                await self._control_calls(query, send)
            elif path == "/_stub/reset" and method == "POST":
                self.reset()
                await _send_json(send, 200, {"ok": True})
            else:
                await _send_json(send, 404, {"ok": False, "description": "no such control route"})
        except (ValueError, KeyError, TypeError) as exc:
            await _send_json(send, 400, {"ok": False, "description": f"{type(exc).__name__}: {exc}"})

    async def _control_calls(self, query: dict[str, str], send: Send) -> None:
        method = query.get("method") or None
        chat_id = query.get("chat_id") or None
        wanted = int(query.get("min", "0"))
        with trio.move_on_after(float(query.get("timeout", "5"))):
            await self.wait_for_calls(wanted, method=method, chat_id=chat_id)
        calls = self.calls_of(method, chat_id)
        await _send_json(send, 200, {"calls": [c.to_json() for c in calls]})


def _matches(call: Call, method: str | None, chat_id: int | str | None) -> bool:
    if method is not None and call.method.lower() != method.lower():
        return False
    return chat_id is None or str(call.params.get("chat_id")) == str(chat_id)


def _default_description(status: int, retry_after: float | None) -> str:
    if status == 429 and retry_after is not None:
        return f"Too Many Requests: retry after {retry_after:g}"
    return {
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        429: "Too Many Requests",
        500: "Internal Server Error",
        502: "Bad Gateway",
    }.get(status, f"Error {status}")


def _params(scope: Scope, body: bytes) -> dict[str, Any]:
    params: dict[str, Any] = dict(parse_qsl(scope.get("query_string", b"").decode()))
    headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
    content_type = headers.get("content-type", "")
    if body and "json" in content_type:
        decoded = json.loads(body)
        if isinstance(decoded, dict):
            params.update(decoded)
    elif body and "x-www-form-urlencoded" in content_type:
        params.update(parse_qsl(body.decode()))
    return params


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _start(status: int, payload: bytes, extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    return {"type": "http.response.start", "status": status, "headers": headers + extra}


async def _send_bytes(send: Send, status: int, payload: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send(_start(status, payload, extra))
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _send_json(send: Send, status: int, data: Any) -> None:
    await _send_bytes(send, status, json.dumps(data).encode(), [])


def stub_config(bind: str, logger: str) -> Config:
    """Hypercorn's settings for serving a stub on ``bind`` (``host:port``), errors to ``logger``."""
    config = Config()
    config.bind = [bind]
    config.graceful_timeout = 1.0
    config.accesslog = None
    # a Logger object (not "-") so hypercorn adds no handler of its own
    config.errorlog = logging.getLogger(logger)
    # Longer than httpx's keepalive_expiry (5 s), as real servers' are: the client drops
    # an idle connection first. With both at 5 s, the stub now and then closed a
    # connection just as a worker reused it, and that call failed with a reset that
    # no fault of the test had asked for.
    config.keep_alive_timeout = 75.0
    return config


@asynccontextmanager
async def running_stub(
    *, host: str = "127.0.0.1", port: int = 0, token: str | None = None
) -> AsyncIterator[TelegramStub]:
    """Serve a ``TelegramStub`` on ``host:port`` (0 = any free port) for the duration of the block.

    On exit held answers are cut and the server shuts down gracefully (hypercorn's
    ``shutdown_trigger``; cancelling ``serve`` can leave peers hanging, hypercorn #106).
    """
    stub = TelegramStub(token=token)
    async with serving(stub, host=host, port=port, logger="autom.testing.telegram_stub.hypercorn") as url:
        stub.url = url
        yield stub


@asynccontextmanager
async def serving(app: Any, *, host: str, port: int, logger: str) -> AsyncIterator[str]:
    """Serve the ASGI ``app`` (a stub with a ``release()``) on ``host:port``; yield its URL.

    On exit the stub's held answers are cut and the server shuts down gracefully.
    """
    config = stub_config(f"{host}:{port}", logger)
    stopping = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(
            serve, app, config, shutdown_trigger=stopping.wait, mode="asgi",
        ))
        try:
            yield binds[0]
        finally:
            app.release()
            stopping.set()
            # backstop: the graceful shutdown should take milliseconds once answers are released
            nursery.cancel_scope.deadline = trio.current_time() + 5


async def _main(host: str, port: int, token: str | None, print_port: bool) -> None:
    async with running_stub(host=host, port=port, token=token) as stub:
        bound_port = int(stub.url.rsplit(":", 1)[1])
        if print_port:
            print(bound_port, flush=True)
        print(f"telegram stub serving on {stub.url}", file=sys.stderr, flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break


def main(argv: list[str] | None = None) -> None:
    """Run the stub as a process until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m autom.testing.telegram_stub", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default=None, help="answer 401 to calls with another token")
    parser.add_argument("--print-port", action="store_true", help="print the bound port on the first stdout line")
    args = parser.parse_args(argv)
    trio.run(_main, args.host, args.port, args.token, args.print_port)


if __name__ == "__main__":
    main()
