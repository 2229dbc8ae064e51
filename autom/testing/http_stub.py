"""A stub of any JSON HTTP API on 127.0.0.1 (a CRM, a payment provider): the network edge of a test.

::

    async with running_http_stub() as crm:          # point your handler's CRM URL at crm.url
        crm.answers = [(503, {"error": "busy"})]    # the next answers, in order; then `default`
        ...
    assert crm.requests[0]["method"] == "PUT"

Every request is recorded (method, path, query, lower-cased headers, JSON body);
``await crm.wait_for_requests(n)`` waits for them. An answer is ``(status, JSON)``, or a
``Reply`` for the rest: a raw ``body``, ``headers``, a ``delay``, or ``hang`` (no answer
until the stub stops).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from autom.testing.telegram_stub import Receive, Reply, Scope, Send, _lifespan, _read_body, _send_bytes, serving


@dataclass
class HttpStub:
    """Requests seen (method, path, query, headers, JSON body) and the answers to give.

    ``answers``: given in order, one per request: ``(status, JSON body)`` pairs, or a
    ``Reply`` (its ``status``, ``headers``, ``delay`` and ``hang``; its ``body`` sent as
    is, else its ``result`` as JSON). When they run out, every request gets 200 with
    ``default``.
    """

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    answers: list[tuple[int, Any] | Reply] = field(default_factory=list)
    default: Any = field(default_factory=dict)
    _seen: trio.Event = field(default_factory=trio.Event, init=False, repr=False)
    _held: set[trio.CancelScope] = field(default_factory=set, init=False, repr=False)

    async def wait_for_requests(self, count: int = 1) -> list[dict[str, Any]]:
        """Wait until ``count`` requests were recorded; returns them all (wrap it in ``trio.fail_after``)."""
        while len(self.requests) < count:
            await self._seen.wait()
        return self.requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        self.requests.append({
            "method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
            "headers": {k.decode().lower(): v.decode() for k, v in scope["headers"]},
            "json": _json_or_text(body),
        })
        self._seen.set()
        self._seen = trio.Event()
        answer = self.answers.pop(0) if self.answers else (200, self.default)
        reply = answer if isinstance(answer, Reply) else Reply(status=answer[0], result=answer[1])
        with trio.CancelScope() as held:  # release() cuts a hanging answer short
            self._held.add(held)
            try:
                await _answer(reply, send)
            finally:
                self._held.discard(held)

    def release(self) -> None:
        """Cut every held answer (``hang``, ``delay``) short; ``serving`` calls it on exit."""
        for scope in list(self._held):
            scope.cancel()


@asynccontextmanager
async def running_http_stub() -> AsyncIterator[HttpStub]:
    """Serve an ``HttpStub`` on 127.0.0.1 (any free port) for the block (the Telegram stub's server)."""
    stub = HttpStub()
    async with serving(stub, host="127.0.0.1", port=0, logger="autom.testing.http_stub.hypercorn") as url:
        stub.url = url
        yield stub


async def _answer(reply: Reply, send: Send) -> None:
    if reply.hang:
        await trio.sleep_forever()
    if reply.delay:
        await trio.sleep(reply.delay)
    # the body as is, else the result as JSON; sent as application/json either way, plus the reply's headers
    payload = (json.dumps({} if reply.result is None else reply.result) if reply.body is None else reply.body).encode()
    await _send_bytes(send, reply.status, payload, [(k.lower().encode(), v.encode()) for k, v in reply.headers.items()])


def _json_or_text(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
