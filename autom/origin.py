"""A lean HTTP/1.1 client for one origin: kept-alive connections, h11 over trio (TLS for https).

The Telegram client's road to the Bot API (why not httpx: docs/design/telegram.md).
``OriginClient.post_json``/``request``: one exchange on an idle kept-alive connection (or a
new one, at most ``max_connections`` at once); the answer an ``httpx.Response``, failures
httpx's exceptions (``autom.checks.classify_exception`` sorts both roads alike).
Invariants: a connection is reused only after a whole exchange with nothing read past its
answer; anything else, a cancel included, closes it. Idle ones past ``keepalive_seconds``
or closed by the server are closed before use; nothing written is ever retried. Every
request is bounded by ``timeout``, the wait for a connection included (``PoolTimeout``,
``ConnectTimeout``: nothing sent; ``ReadTimeout``). Not for: proxies, HTTP/2, redirects.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import httpx
import trio

__all__ = ["OriginClient", "environment_proxied"]

#: how long a connection may wait idle before it is closed instead of reused (httpx's default)
KEEPALIVE_SECONDS: Final = 5.0
_READ: Final = 65536


def environment_proxied(url: str) -> bool:
    """Whether the environment sends requests to ``url`` through a proxy (HTTP(S)_PROXY,
    ALL_PROXY, less NO_PROXY): what httpx's ``trust_env`` would do."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


class _Conn:
    __slots__ = ("h11", "idle_since", "sock", "stream")

    def __init__(self, stream: trio.abc.Stream, sock: Any) -> None:
        self.stream = stream
        self.sock = sock  # the trio socket underneath (TLS or not): readability, a forced close
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def close(self) -> None:
        self.sock.close()


class OriginClient:
    """Kept-alive HTTP/1.1 connections to the origin of ``base_url`` (``http`` or ``https``);
    paths are relative to ``base_url``'s path. Share it between the tasks of one trio run."""

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 20,
                 keepalive_seconds: float = KEEPALIVE_SECONDS, ssl_context: ssl.SSLContext | None = None,
                 user_agent: str = "autom") -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise httpx.InvalidURL("the URL is not an absolute http(s) URL")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        default_port = (self._tls and self._port == 443) or (not self._tls and self._port == 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._prefix = parts.path.rstrip("/")
        self._timeout = float(timeout)
        self._keepalive = float(keepalive_seconds)
        self._ssl = ssl_context if ssl_context is not None or not self._tls else httpx.create_ssl_context()
        self._idle: list[_Conn] = []
        self._slots = trio.Semaphore(max_connections)
        self._user_agent = user_agent
        self._closed = False

    async def post_json(self, path: str, data: Any) -> httpx.Response:
        """POST ``data`` as JSON (UTF-8, as httpx's ``json=``) to ``path``; the whole answer."""
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return await self.request("POST", path, body, content_type="application/json")

    async def request(self, method: str, path: str, body: bytes = b"", *,
                      content_type: str | None = None) -> httpx.Response:
        """One exchange on a kept-alive connection; raises httpx's exceptions (see the module)."""
        headers = [("Host", self._host_header), ("User-Agent", self._user_agent), ("Accept", "*/*"),
                   ("Content-Length", str(len(body)))]
        if content_type is not None:
            headers.append(("Content-Type", content_type))
        try:
            request = h11.Request(method=method, target=self._prefix + path, headers=headers)
        except (h11.LocalProtocolError, UnicodeError):
            # a path (a bot token) with a space, a line break or a non-ASCII character: a
            # mistake of configuration, not of the network; the path is not repeated (secrets)
            raise httpx.InvalidURL("the request's path or a header is not valid in HTTP/1.1") from None
        phase = "slot"  # what the deadline cut short: waiting for a connection, connecting, the exchange
        try:
            with trio.fail_after(self._timeout):
                async with self._slots:
                    if self._closed:  # (also when it closed while this request waited for a slot)
                        raise httpx.ConnectError("the client is closed")
                    conn = self._reuse()
                    if conn is None:
                        phase = "connect"
                        conn = await self._connect()
                    phase = "exchange"
                    whole = False
                    try:
                        status, reason, answer, content = await self._exchange(conn, request, body)
                        whole = True
                    finally:
                        if not whole:
                            conn.close()  # half an exchange: the connection's state is unknown
        except trio.TooSlowError:
            if phase == "slot":
                raise httpx.PoolTimeout(f"no free connection within {self._timeout:g}s") from None
            if phase == "connect":  # nothing was sent
                raise httpx.ConnectTimeout(f"cannot connect within {self._timeout:g}s") from None
            raise httpx.ReadTimeout(f"no complete answer within {self._timeout:g}s") from None
        return httpx.Response(status, headers=answer, content=content, extensions={"reason_phrase": reason})

    def _reuse(self) -> _Conn | None:
        """The most recently used idle connection still open, after closing every one idle
        past ``keepalive_seconds`` (the oldest, at the front: a clock reading each, so the
        ones a burst left are not kept half-closed while single calls use the newest)."""
        idle = self._idle
        too_old = time.monotonic() - self._keepalive
        stale = 0
        while stale < len(idle) and idle[stale].idle_since <= too_old:
            idle[stale].close()
            stale += 1
        del idle[:stale]
        while idle:
            conn = idle.pop()
            if not conn.sock.is_readable():
                return conn
            conn.close()  # the server closed it (EOF readable)
        return None

    async def _connect(self) -> _Conn:
        try:
            if self._ssl is not None:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    self._host, self._port, ssl_context=self._ssl, https_compatible=True)
                sock = stream.transport_stream.socket  # type: ignore[attr-defined]
                shaken = False
                try:
                    await stream.do_handshake()  # type: ignore[attr-defined]
                    shaken = True
                finally:
                    if not shaken:
                        sock.close()  # a refused or cut-short handshake leaves no socket open
            else:
                stream = await trio.open_tcp_stream(self._host, self._port)
                sock = stream.socket
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ else exc
            raise httpx.ConnectError(f"cannot connect: {type(cause).__name__}: {cause}") from None
        return _Conn(stream, sock)

    async def _exchange(self, conn: _Conn, request: h11.Request, body: bytes
                        ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        h = conn.h11
        try:
            out = h.send(request) or b""
            if body:
                out += h.send(h11.Data(data=body)) or b""
            out += h.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc)) from None
        try:
            await conn.stream.send_all(out)  # one write: head and body together
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise httpx.WriteError(f"{type(exc).__name__}: {exc}") from None
        response: h11.Response | None = None
        content = bytearray()
        while True:
            try:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    try:
                        chunk = await conn.stream.receive_some(_READ)
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
                    h.receive_data(bytes(chunk))  # b"": the server closed its side
                    continue
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(f"invalid answer: {exc}") from None
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError("the server closed the connection without a whole answer")
            # an InformationalResponse (100 Continue...) is passed over
        assert response is not None  # h11 gives a Response before any Data or EndOfMessage
        # reused only when nothing came after the answer: bytes read past it (a second answer, a
        # body longer than its Content-Length) would be the next request's answer
        if (h.our_state is h11.DONE and h.their_state is h11.DONE and h.trailing_data == (b"", False)
                and not self._closed):
            h.start_next_cycle()
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:  # "Connection: close", or the server said more than its answer
            conn.close()
        return response.status_code, response.reason, list(response.headers), bytes(content)

    async def aclose(self) -> None:
        """Close every idle connection; requests under way close theirs as they end."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
