"""The door: the admission checks of ``POST /hooks/{source}`` that run before its body is read.

``Door`` is an ASGI middleware around Quart's ``asgi_app`` (``create_app`` installs it):
every other request passes untouched. In the README's order it refuses (429 rate or
failing client, 413 declared size, 401 header proof, 408/413 while reading), then reads
the body within ``BODY_DEADLINE_SECONDS`` and hands it to ``Intake.deliver`` directly:
a delivery to a known source never goes through Quart. Invariants: a refusal before the
body closes the connection; an answer of 401 or 404 counts as a failed delivery of its
client. The order and the reasons: docs/design/intake.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from autom import tracing
from autom.admission import BODY_DEADLINE_SECONDS, Admission, client_key, retry_after
from autom.errors import VerificationError
from autom.sources.base import Source
from autom.web.intake import Answer, Intake, error_answer, request_headers
from autom.web.serve import content_length

# a delivery the door rejects gets the intake's own one log line
intake_log = logging.getLogger("autom.intake")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HOOKS = "/hooks/"


class Door:
    """ASGI middleware: the checks that run before a webhook body is read (module docstring).

    Only ``POST /hooks/...`` is looked at; every other request passes untouched. A
    refusal closes the connection (``Connection: close``) rather than read a body
    nobody wants.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], admission: Admission,
                 intake: Intake, body_deadline: float = BODY_DEADLINE_SECONDS) -> None:
        """Wrap ``app`` (Quart's ``asgi_app``); a read body goes to ``intake``, never to ``app``."""
        self.app = app
        self.admission = admission
        self.intake = intake
        self.body_deadline = body_deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Admit, refuse, or read the body and pass the request on."""
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or not path.startswith(HOOKS):
            await self.app(scope, receive, send)
            return
        adm = self.admission
        now = adm.clock()
        raw_headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        peer = scope.get("client")
        forwarded = [v.decode("latin-1") for k, v in raw_headers if k.lower() == b"x-forwarded-for"] \
            if adm.trusted else []
        client = client_key(peer[0] if peer else None, forwarded, adm.trusted)
        source = adm.sources.get(path[len(HOOKS):])
        if source is None:
            # Quart's 404 (the first check of all)
            await self.app(scope, receive, _watch_failures(send, adm, client))
            return

        declared = content_length(raw_headers)
        headers = request_headers(raw_headers)
        proof = getattr(source, "verify_headers", None)
        proof_error: str | None = None
        if proof is not None:
            try:
                proof(headers)
            except VerificationError as exc:
                proof_error = str(exc)
        if proof is None or proof_error is not None:
            blocked = adm.failing.blocked_for(client, now)
            if blocked > 0:
                adm.refuse("failing_client", source.name, f"client {client} keeps failing verification")
                await _answer(send, 429, "too many failed deliveries, try again later", retry_after(blocked))
                return
            wait = adm.buckets.take(client, now)
            if wait > 0:
                adm.refuse("rate", source.name, f"client {client} is over CLIENT_RATE")
                await _answer(send, 429, "too many requests, try again later", retry_after(wait))
                return
        if declared is not None and declared > adm.max_body:
            await _answer(send, 413, f"body larger than {adm.max_body} bytes")
            return
        if proof_error is not None:
            adm.failing.failed(client, now)
            adm.deps.metrics.events.labels(source.name, "rejected").inc()
            intake_log.info("webhook rejected (401): %s", proof_error,
                     extra={"source": source.name, "outcome": "rejected", "error": proof_error})
            # like the intake's 401, the connection is kept (serve.py drains the bounded rest)
            await _answer(send, 401, "verification failed", close=False)
            return

        body = await self._read_body(receive, send, source.name)
        if body is None:
            return
        with tracing.delivery(source.name, headers) as traced:
            found = await self._deliver(source, headers, body, receive)
            traced.answered(None if found is None else found.status)
        if found is None:
            return  # the client left: nobody to answer
        if found.status in (401, 404):
            adm.failing.failed(client, adm.clock())
        await _send_answer(send, found)

    async def _deliver(self, source: Source, headers: dict[str, str], body: bytes, receive: Receive) -> Answer | None:
        """The intake's answer, or None if the client disconnected first (Intake.deliver).

        Whether the client has gone is checked without waiting when the server's
        ``receive`` can tell (``serve_http``'s, web/serve.py: ``departure_check``), when a
        hop would take the delivery; else the delivery waits on ``receive`` itself (dearer:
        docs/design/intake.md, "What a delivery costs").
        """
        check = getattr(receive, "departure_check", None)
        left = check() if check is not None else None

        async def gone() -> None:
            # the body is read: what comes now is http.disconnect
            while (await receive())["type"] != "http.disconnect":
                pass

        try:
            if left is not None:
                return await self.intake.deliver(source, headers, body, left=left)
            return await self.intake.deliver(source, headers, body, gone)
        except Exception:
            # what Quart's handler did for a route that raised: the traceback to the log, a bare 500
            intake_log.exception("the intake failed on a delivery to %s", source.name, extra={"source": source.name})
            return error_answer(500, "internal error")

    async def _read_body(self, receive: Receive, send: Send, source: str) -> bytes | None:
        """The whole body within the deadline and size cap, or None once answered (408, 413) or gone."""
        adm = self.admission
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self.body_deadline) as scope:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None  # http.disconnect: nobody to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > adm.max_body:
                    await _answer(send, 413, f"body larger than {adm.max_body} bytes")
                    return None
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        if scope.cancelled_caught:
            adm.refuse("slow_body", source, f"a body took more than {self.body_deadline:g} s")
            await _answer(send, 408, f"the body did not arrive within {self.body_deadline:g} s")
        return None


def _watch_failures(send: Send, adm: Admission, client: str) -> Send:
    """``send``, noting a 401 or 404 answer as a failed delivery of ``client``."""

    async def watched(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") in (401, 404):
            adm.failing.failed(client, adm.clock())
        await send(message)

    return watched


async def _send_answer(send: Send, found: Answer) -> None:
    """The intake's answer as the two ASGI messages (the connection stays open)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(found.body)),
               *found.headers]
    await send({"type": "http.response.start", "status": found.status, "headers": headers})
    await send({"type": "http.response.body", "body": found.body, "more_body": False})


async def _answer(send: Send, status: int, message: str, retry: int | None = None, *, close: bool = True) -> None:
    """A JSON error answer of the door; with ``close`` the connection closes after it (the body stays unread)."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if retry is not None:
        headers.append((b"retry-after", str(retry).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
