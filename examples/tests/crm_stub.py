"""A stub of the shop's CRM on 127.0.0.1 (the network edge): records requests, answers as told."""

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
class CrmStub:
    """Requests seen (method, path, query, headers, JSON body) and the next answers to give."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    answers: list[tuple[int, Any]] = field(default_factory=list)  # (status, JSON body), used in order
    summary: dict[str, Any] = field(default_factory=lambda: {"count": 0, "total": 0})

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
            "json": json.loads(body) if body else None,
        })
        status, answer = self.answers.pop(0) if self.answers else (200, self.summary)
        payload = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


@asynccontextmanager
async def running_crm() -> AsyncIterator[CrmStub]:
    """Serve a ``CrmStub`` on 127.0.0.1 (any free port) for the block."""
    stub = CrmStub()
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
