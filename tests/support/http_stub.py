"""A plain HTTP stub on 127.0.0.1 for the outside services that are not Telegram (a
heartbeat URL): records every request, answers with the next scripted ``Reply``.

``async with running_http_stub() as stub:`` then ``stub.url``; ``stub.plan(Reply(status=503))``,
``Reply(hang=True)`` (no answer until the stub stops); ``stub.requests`` and
``await stub.wait_for_requests(n)``. Served by hypercorn like the Telegram stub, with its
helpers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from tests.support.telegram_stub import Receive, Reply, Scope, Send, _lifespan, _read_body, _send_bytes, serving


@dataclass(frozen=True)
class Request:
    """One recorded request."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    time: float


class HttpStub:
    """The stub's state and its ASGI app (``self`` is the app). ``url`` is set once it serves."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[Request] = []
        self._plan: deque[Reply] = deque()
        self._changed = trio.Event()
        self._held: set[trio.CancelScope] = set()

    def plan(self, *replies: Reply) -> None:
        """Answer the next requests with ``replies``, in order (afterwards: 200 ``ok``)."""
        self._plan.extend(replies)

    async def wait_for_requests(self, count: int = 1) -> list[Request]:
        """Wait until ``count`` requests were recorded (wrap it in ``trio.fail_after``)."""
        while len(self.requests) < count:
            await self._changed.wait()
        return self.requests

    def release(self) -> None:
        """Cut every held answer short."""
        for scope in list(self._held):
            scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        self.requests.append(Request(
            method=scope["method"], path=scope["path"], query=scope.get("query_string", b"").decode(),
            headers={k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}, body=body,
            time=time.time(),
        ))
        self._changed.set()
        self._changed = trio.Event()
        reply = self._plan.popleft() if self._plan else Reply(body="ok")
        with trio.CancelScope() as held:
            self._held.add(held)
            try:
                if reply.hang:
                    await trio.sleep_forever()
                await _send_bytes(send, reply.status, (reply.body or "").encode(),
                                  [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()])
            finally:
                self._held.discard(held)


@asynccontextmanager
async def running_http_stub(*, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[HttpStub]:
    """Serve an ``HttpStub`` on ``host:port`` (0 = any free port) for the duration of the block."""
    stub = HttpStub()
    async with serving(stub, host=host, port=port, logger="tests.http_stub.hypercorn") as url:
        stub.url = url
        yield stub
