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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from autom.testing.telegram_stub import Receive, Scope, Send, _lifespan, _read_body, _send_json, serving


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
        status, answer = self.answers.pop(0) if self.answers else (200, self.default)
        await _send_json(send, status, answer)

    def release(self) -> None:
        """Nothing to cut short: every answer is given at once (``serving`` calls it on exit)."""


@asynccontextmanager
async def running_http_stub() -> AsyncIterator[HttpStub]:
    """Serve an ``HttpStub`` on 127.0.0.1 (any free port) for the block (the Telegram stub's server)."""
    stub = HttpStub()
    async with serving(stub, host="127.0.0.1", port=0, logger="autom.testing.http_stub.hypercorn") as url:
        stub.url = url
        yield stub


def _json_or_text(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
