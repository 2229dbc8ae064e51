"""``serve_http``: Hypercorn's trio server for the app, inside the caller's nursery.

``await nursery.start(serve_http, deps, app)`` returns the bound URLs once the sockets
listen; when ``deps.shutdown`` turns true the listeners close, idle keep-alive
connections are closed and requests in flight get ``graceful_timeout`` (at most
SHUTDOWN_GRACE_SECONDS). Two ASGI middlewares work around upstream behaviour:
``ShieldFinalSend`` (a quart-trio × hypercorn bug that kills the keep-alive timer) and
``DrainRequestBody`` (keep-alive after an answer given before the body was read); tests
in tests/e2e notice when an upgrade makes them unnecessary. The stories: docs/design/http.md.
"""

from __future__ import annotations

import errno
import gc
import logging
from collections.abc import Callable, Iterable
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

from autom.config import Settings
from autom.deps import Deps
from autom.errors import AddressInUse

#: Idle keep-alive connections are closed after this many seconds: longer than the clients
#: and proxies that reuse connections keep theirs idle (httpx 5 s, Go's net/http 90 s,
#: Caddy's reverse_proxy 120 s (measured), nginx upstreams and AWS load balancers 60 s),
#: so they close first. At hypercorn's 5 s (ours before), a sender keeping them 5 s
#: sometimes reused one just as the server closed it: no answer (RemoteProtocolError).
#: Hypercorn's idle timer also bounds the wait for a request's head (from the connection's
#: start, or the last answer): a slow head gets this long. Shutdown closes idle ones at once.
KEEP_ALIVE_TIMEOUT = 130.0
#: Longest the rest of an unread request body may take to arrive once the answer is ready.
DRAIN_TIMEOUT = 5.0
#: Longest requests in flight get at shutdown (capped by SHUTDOWN_GRACE_SECONDS).
#: Intake requests take milliseconds; this is for a database that is slow right then.
GRACEFUL_TIMEOUT = 10.0


class ShieldFinalSend:
    """ASGI middleware: the last ``http.response.body`` send of a request cannot be cancelled.

    That send is where hypercorn restarts the connection's idle timer; shielding
    it lets the timer start even when quart-trio cancels the request's tasks
    (module docstring). The send itself is bounded: hypercorn writes with its own
    shielded ``send_all`` and only then re-arms the timer.
    """

    def __init__(self, app: ASGIFramework) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """Pass the call through, shielding the final body send of HTTP requests."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def shielded_send(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await self.app(scope, receive, shielded_send)


class DrainRequestBody:
    """ASGI middleware: read the unread rest of a request body (bounded) before the response ends.

    ``receive`` is watched to know how much of the body the app (Quart's own reader
    task) has taken. At the last ``http.response.body`` the rest is read here,
    while at most ``max_body_bytes`` have come in all and for at most ``timeout``
    seconds; then the message goes on and hypercorn can recycle the connection.
    A body known to be larger (its Content-Length, or what came in already) is
    not read: the response gets ``Connection: close``.
    """

    def __init__(self, app: ASGIFramework, max_body_bytes: int, timeout: float = DRAIN_TIMEOUT) -> None:
        """Wrap ``app``; ``max_body_bytes`` bounds what is ever read."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        """Pass the call through with a watched ``receive`` and a draining ``send``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _RequestBody(receive, self.max_body_bytes, content_length(scope["headers"]))

        async def draining_send(message: ASGISendEvent) -> None:
            if body.complete or body.abandoned:
                pass  # the common case: the app read the whole body (or closes the connection)
            elif message["type"] == "http.response.start" and _closes(message.get("headers", ())):
                body.abandoned = True  # the door refused it: not worth reading
            elif message["type"] == "http.response.start" and body.too_large():
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            elif (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and not body.too_large()
            ):
                with trio.move_on_after(self.timeout):
                    await body.drain()
            await send(message)

        await self.app(scope, body, draining_send)


class _RequestBody:
    """What has come of one request's body, through the ``receive`` the app is given (this object)."""

    __slots__ = ("_channel", "_reader", "_receive", "abandoned", "complete", "declared", "limit", "received")

    def __init__(self, receive: ASGIReceiveCallable, limit: int, declared: int | None) -> None:
        self._receive = receive
        # hypercorn's receive is a trio memory channel's (hypercorn/trio/task_group.py):
        # what came in can be seen without waiting for it (``departure_check``)
        owner = getattr(receive, "__self__", None)
        self._channel = owner if isinstance(owner, trio.MemoryReceiveChannel) else None
        self._reader: trio.CancelScope | None = None  # drain()'s pending receive
        self.limit = limit
        self.declared = declared
        self.received = 0
        self.complete = False  # the last body message (or a disconnect) came
        self.abandoned = False  # the answer closes the connection: the rest is not read

    async def receive(self) -> ASGIReceiveEvent:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self._completed()
        elif message["type"] == "http.disconnect":
            self._completed()
        return message

    __call__ = receive  # the app's ASGI receive

    def departure_check(self) -> Callable[[], bool] | None:
        """Once the whole body was read: a check, without waiting, whether the client has gone.

        After the body, the only message a request gets is ``http.disconnect``; hypercorn
        puts it in the request's channel when the connection closes, so the client has
        gone once anything waits there. None when this server's receive is not such a
        channel (then only waiting on ``receive`` tells).
        """
        return None if self._channel is None else self._message_waiting

    def _message_waiting(self) -> bool:
        assert self._channel is not None
        stats = self._channel.statistics()  # ~1.5 µs; receive_nowait would take the message
        return stats.current_buffer_used > 0 or stats.open_send_channels == 0

    def too_large(self) -> bool:
        return self.received > self.limit or (self.declared is not None and self.declared > self.limit)

    async def drain(self) -> None:
        """Read until the body is complete, or more than ``limit`` bytes have come in all.

        The app's reader task (Quart's) may be waiting in ``receive`` too: whichever
        of the two gets the last message, the other's wait is over (a cancelled
        channel receive loses no message).
        """
        while not self.complete and self.received <= self.limit:
            with trio.CancelScope() as self._reader:
                await self.receive()
            self._reader = None

    def _completed(self) -> None:
        self.complete = True
        if self._reader is not None:
            self._reader.cancel()


def _closes(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether response headers say ``Connection: close``."""
    return any(name.lower() == b"connection" and value.lower() == b"close" for name, value in headers)


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's declared Content-Length, or None (absent or malformed)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


_frozen = False


def freeze_startup_objects() -> None:
    """Move the objects alive now (modules, the app, its routes) out of the garbage collector's sight.

    A full collection walks every tracked object, and every request in flight waits for
    it: frozen start-up objects are never walked again (nor freed: they live as long as
    the process anyway), which took the intake's p99 from ~33 ms pauses to ~1 ms
    (docs/design/http.md). Once per process, after a collection so no garbage is frozen.
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


def hypercorn_config(
    settings: Settings, binds: list[str] | None = None, *, keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
) -> Config:
    """Hypercorn's configuration for ``settings`` (``binds`` default: HOST:PORT)."""
    config = Config()
    config.bind = list(binds) if binds else [_bind(settings.host, settings.port)]
    config.keep_alive_timeout = keep_alive_timeout
    config.graceful_timeout = min(GRACEFUL_TIMEOUT, settings.shutdown_grace_seconds)
    # Loggers, not "-": hypercorn then adds no handlers of its own, and its lines go
    # through the process's logging configuration like every other line (no duplicates).
    config.errorlog = logging.getLogger("hypercorn.error")
    # The access log only if someone enabled it (autom.logs sets it to WARNING): hypercorn
    # builds every line's fields before the logger looks at its level (a measurable share
    # of a request's CPU: docs/design/http.md). The intake logs its own line per delivery.
    access = logging.getLogger("hypercorn.access")
    config.accesslog = access if access.isEnabledFor(logging.INFO) else None
    config.include_server_header = False
    return config


async def serve_http(
    deps: Deps,
    app: ASGIFramework,
    *,
    binds: list[str] | None = None,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``deps.shutdown`` turns true, then drain and return.

    ``task_status.started`` receives the bound URLs (``"http://127.0.0.1:54321"``),
    so ``binds=["127.0.0.1:0"]`` gives a free port. Open the database before
    calling this: a failing app start-up would still report started. Raises
    ``AddressInUse`` (before reporting started) when another process holds a bind.
    """
    config = hypercorn_config(deps.settings, binds, keep_alive_timeout=keep_alive_timeout)
    freeze_startup_objects()
    # the app's admission (autom/admission.py) keeps its backlog estimate current while we serve
    admission = getattr(app, "extensions", {}).get("autom.admission")
    try:
        async with trio.open_nursery() as nursery:
            if admission is not None:
                await nursery.start(admission.run)
            await serve(
                DrainRequestBody(ShieldFinalSend(app), deps.settings.max_body_bytes),
                config,
                shutdown_trigger=partial(deps.shutdown.wait_value, True),
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()
    except (OSError, BaseExceptionGroup) as exc:
        # hypercorn binds inside its nursery: the OSError arrives in an exception group
        if not _address_in_use(exc):
            raise
        raise AddressInUse(f"{', '.join(config.bind)} is already in use") from None


def _address_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` (or one inside a trio exception group) is "address already in use"."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_address_in_use(inner) for inner in exc.exceptions)
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def _bind(host: str, port: int) -> str:
    # an IPv6 literal needs brackets in a bind string ("[::]:8000")
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
