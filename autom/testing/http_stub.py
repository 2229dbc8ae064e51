"""A stub of any JSON HTTP API on 127.0.0.1 (a CRM, a payment provider): the network edge of a test.

::

    async with running_http_stub() as crm:          # point your handler's CRM URL at crm.url
        crm.answers = [(503, {"error": "busy"})]    # the next answers, in order; then `default`
        ...
    assert crm.requests[0]["method"] == "PUT"

Every request is recorded (method, path, query, lower-cased headers, JSON body).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve


@dataclass
class HttpStub:
    """Requests seen (method, path, query, headers, JSON body) and the answers to give.

    ``answers``: (status, JSON body) pairs, given in order, one per request; when they
    run out, every request gets 200 with ``default``.
    """

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    answers: list[tuple[int, Any]] = field(default_factory=list)
    default: Any = field(default_factory=dict)

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append({
            "method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode(),
            "headers": {k.decode().lower(): v.decode() for k, v in scope["headers"]},
            "json": _json_or_text(body),
        })
        status, answer = self.answers.pop(0) if self.answers else (200, self.default)
        payload = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


@asynccontextmanager
async def running_http_stub() -> AsyncIterator[HttpStub]:
    """Serve an ``HttpStub`` on 127.0.0.1 (any free port) for the block."""
    stub = HttpStub()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stopping = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(
            serve, stub, config, shutdown_trigger=stopping.wait, mode="asgi",  # type: ignore[arg-type]
        ))
        stub.url = binds[0]
        try:
            yield stub
        finally:
            stopping.set()


def _json_or_text(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
