"""A TCP proxy in front of PostgreSQL that can drop a connection right after a commit.

``async with pg_proxy(dsn) as proxy:`` listens on 127.0.0.1 and forwards every
connection to the server of ``dsn`` (over TCP, or its Unix socket when ``dsn``
names a socket folder); ``proxy.dsn`` is ``dsn`` through the proxy (with
``sslmode=disable``, so the proxy can read the protocol).

``proxy.cut_after_commit(marker)``: the next statement whose text (as the client
sends it) contains ``marker`` runs on the server to its end: its answer is held
back and, as soon as the server says it is ready for the next query (its
ReadyForQuery message: an implicit transaction has committed by then), the
connection is closed on both sides. The client sees its connection lost
mid-statement, though the statement committed: exactly the case a client must not
answer as "nothing stored". ``proxy.cuts`` counts the connections cut so.

``proxy.hold_after_commit(marker, seconds)``: the same, but instead of cutting the
connection the held answer is forwarded ``seconds`` after ReadyForQuery (``proxy.holds``
counts them): a statement that committed while its client, past its deadline, had
cancelled it.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class PgProxy:
    """See the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._marker: bytes | None = None
        self._hold: float | None = None  # cut_after_commit: None; hold_after_commit: the seconds
        self.cuts = 0
        self.holds = 0  # answers held back and then forwarded (hold_after_commit)
        self.dsn = ""

    def cut_after_commit(self, marker: bytes) -> None:
        """Cut the connection that next sends ``marker``, once the server finished that statement."""
        self._marker = marker
        self._hold = None

    def hold_after_commit(self, marker: bytes, seconds: float) -> None:
        """Hold back the answer of the statement that next sends ``marker`` until ``seconds`` after it ended."""
        self._marker = marker
        self._hold = seconds

    async def handle(self, client: trio.SocketStream) -> None:
        """Forward one client connection (serve_listeners calls it)."""
        try:
            if self._host.startswith("/"):  # a socket folder, as libpq names it
                server: trio.abc.Stream = await trio.open_unix_socket(f"{self._host}/.s.PGSQL.{self._port}")
            else:
                server = await trio.open_tcp_stream(self._host, self._port)
        except OSError:
            await client.aclose()
            return
        mark = _Mark()  # this connection sent the marker: hold back its answer
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(self._upstream, client, server, mark, nursery.cancel_scope)
            nursery.start_soon(self._downstream, server, client, mark, nursery.cancel_scope)

    async def _upstream(self, client: trio.abc.Stream, server: trio.abc.Stream, mark: _Mark,
                        scope: trio.CancelScope) -> None:
        try:
            async for chunk in client:
                if self._marker is not None and self._marker in chunk:
                    self._marker = None
                    mark.active, mark.hold = True, self._hold
                await server.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    async def _downstream(self, server: trio.abc.Stream, client: trio.abc.Stream, mark: _Mark,
                          scope: trio.CancelScope) -> None:
        held = b""  # the marked statement's answer so far
        pending = b""  # of which not yet parsed into messages
        try:
            async for chunk in server:
                if not mark.active:
                    await client.send_all(chunk)
                    continue
                # the marked statement's answer: read message by message, forward nothing yet
                held += chunk
                pending += chunk
                while len(pending) >= 5:
                    kind = pending[:1]
                    (length,) = struct.unpack("!I", pending[1:5])
                    if len(pending) < 1 + length:
                        break
                    pending = pending[1 + length:]
                    if kind != b"Z":
                        continue
                    # ReadyForQuery: the statement (and its commit) is over
                    if mark.hold is None:
                        self.cuts += 1
                        scope.cancel()
                        return
                    await trio.sleep(mark.hold)
                    self.holds += 1
                    await client.send_all(held)
                    mark.active, held, pending = False, b"", b""
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


class _Mark:
    """Whether a connection's answers are being held back (it sent the marker), and how."""

    def __init__(self) -> None:
        self.active = False
        self.hold: float | None = None


@asynccontextmanager
async def pg_proxy(dsn: str) -> AsyncIterator[PgProxy]:
    """Run a ``PgProxy`` in front of ``dsn``'s server for the block."""
    info: dict[str, Any] = conninfo_to_dict(dsn)
    proxy = PgProxy(str(info.get("host") or "/var/run/postgresql"), int(info.get("port") or 5432))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        proxy.dsn = make_conninfo(dsn, host="127.0.0.1", port=port, sslmode="disable")
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
