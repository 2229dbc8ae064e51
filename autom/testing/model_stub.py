"""A stub of an OpenAI-compatible chat-completions API on 127.0.0.1: the model at the network edge.

::

    async with running_model_stub(answer=lambda text: "Needs: a roof repair") as model:
        model.refuse(2, status=429, retry_after=1)    # the next two requests: 429, Retry-After: 1
        ...                                           # point your handler at model.url
    assert model.requests[-1]["json"]["messages"][-1]["content"] == "..."

``POST {url}/chat/completions`` is recorded (path, lower-cased headers, JSON body) and
answered with a ``chat.completion`` object whose one choice says ``answer(last user
message)``; a planned refusal is answered first (status, an OpenAI-style error body,
and a ``Retry-After`` header when given). Other paths are 404.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from autom.testing.telegram_stub import Receive, Scope, Send, _lifespan, _read_body, _send_bytes, serving


def _default_answer(text: str) -> str:
    return f"Needs: {' '.join(text.split())[:200]}"


@dataclass
class ModelStub:
    """Requests seen and the answers to give (module docstring)."""

    url: str = ""
    answer: Callable[[str], str] = _default_answer
    requests: list[dict[str, Any]] = field(default_factory=list)
    _refusals: deque[tuple[int, float | None]] = field(default_factory=deque)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def refuse(self, count: int = 1, *, status: int = 429, retry_after: float | None = 1.0) -> None:
        """Answer the next ``count`` requests with ``status`` (429 rate limited, 503/529 overloaded),
        with ``Retry-After: retry_after`` unless it is None."""
        self._refusals.extend([(status, retry_after)] * count)

    def completions(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests, oldest first."""
        return [r["json"] for r in self.requests if r["path"].endswith("/chat/completions")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        try:
            decoded: Any = json.loads(body) if body else None
        except ValueError:
            decoded = body.decode("utf-8", "replace")
        self.requests.append({"path": scope["path"], "json": decoded,
                              "headers": {k.decode().lower(): v.decode() for k, v in scope["headers"]},
                              "time": time.time()})
        if not scope["path"].endswith("/chat/completions") or scope["method"] != "POST":
            await _send_bytes(send, 404, b'{"error": {"message": "not found"}}', [])
            return
        if self._refusals:
            status, after = self._refusals.popleft()
            kind = "rate_limit_error" if status == 429 else "overloaded_error"
            error = json.dumps({"error": {"message": f"stub: {kind}", "type": kind}}).encode()
            headers = [] if after is None else [(b"retry-after", f"{after:g}".encode())]
            await _send_bytes(send, status, error, headers)
            return
        messages = decoded.get("messages") if isinstance(decoded, dict) else None
        users = [m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
        text = users[-1] if users and isinstance(users[-1], str) else ""
        completion = {
            "id": f"chatcmpl-stub-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": decoded.get("model", "stub") if isinstance(decoded, dict) else "stub",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.answer(text)},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 5,
                      "total_tokens": len(text.split()) + 5},
        }
        await _send_bytes(send, 200, json.dumps(completion).encode(), [])

    def release(self) -> None:
        """Nothing to cut short: every answer is given at once (``serving`` calls it on exit)."""


@asynccontextmanager
async def running_model_stub(answer: Callable[[str], str] | None = None) -> AsyncIterator[ModelStub]:
    """Serve a ``ModelStub`` on 127.0.0.1 (any free port) for the block; its ``url`` is the API's base
    (``{url}/chat/completions``). ``answer``: the reply to the last user message (default "Needs: ...")."""
    stub = ModelStub() if answer is None else ModelStub(answer=answer)
    async with serving(stub, host="127.0.0.1", port=0, logger="autom.testing.model_stub.hypercorn") as url:
        stub.url = url
        yield stub
