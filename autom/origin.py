"""A lean HTTP/1.1 client: kept-alive connections, h11 over trio (TLS for https).

``OriginClient`` (one origin; the Telegram client's road): one exchange on an idle
kept-alive connection or a new one, at most ``max_connections`` at once; the answer an
``httpx.Response``, failures httpx's exceptions. A connection is reused only after a
whole exchange with nothing read past its answer; anything else, a cancel included,
closes it; nothing written is retried. Every request is bounded by ``timeout`` in all.
``OriginTransport``: the same under httpx's client (``ctx.http``), one ``OriginClient``
an origin, their limits shared (``ConnectionBudget``). Why, what each road takes and
what it measured: docs/design/telegram.md, docs/design/http.md.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections import OrderedDict
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import httpx
import trio

__all__ = ["OriginClient", "OriginTransport", "environment_has_proxy", "environment_proxied"]

#: how long a connection may wait idle before it is closed instead of reused (httpx's default)
KEEPALIVE_SECONDS: Final = 5.0
_READ: Final = 65536
#: the largest answer head h11 reads (its default is 16 KiB; httpcore's, 100 KiB)
MAX_HEAD_BYTES: Final = 100 * 1024


def environment_has_proxy() -> bool:
    """Whether the environment names a proxy for http or https (HTTP(S)_PROXY, ALL_PROXY)."""
    proxies = urllib.request.getproxies()
    return any(proxies.get(scheme) for scheme in ("http", "https", "all"))


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
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.idle_since = 0.0

    def close(self) -> None:
        self.sock.close()


class ConnectionBudget:
    """Limits several ``OriginClient``s share (an ``OriginTransport``'s): requests under way
    at once in all (each holds one connection, opened or reused), and idle connections kept
    in all, the longest idle closed first when one more would pass ``max_idle``."""

    def __init__(self, *, max_connections: int, max_idle: int) -> None:
        self.slots = trio.Semaphore(max_connections)
        self.max_idle = max_idle
        #: every idle connection of the clients sharing this budget, longest idle first, with
        #: the list of idle connections it is in (its client's)
        self.idle: OrderedDict[_Conn, list[_Conn]] = OrderedDict()

    def kept(self, conn: _Conn, owner: list[_Conn]) -> None:
        """``conn`` is idle now, in ``owner`` (its client's list): past ``max_idle``, the
        longest idle is closed."""
        self.idle[conn] = owner
        while len(self.idle) > self.max_idle:
            self._close_oldest()

    def sweep(self, idle_since: float) -> None:
        """Close the idle connections idle since before ``idle_since`` (monotonic clock),
        whichever client's: an origin no longer called keeps no socket past its keep-alive."""
        while self.idle and next(iter(self.idle)).idle_since <= idle_since:
            self._close_oldest()

    def forget(self, conn: _Conn) -> None:
        """``conn`` is no longer idle (its client took or closed it)."""
        self.idle.pop(conn, None)

    def _close_oldest(self) -> None:
        oldest, its = self.idle.popitem(last=False)
        its.remove(oldest)
        oldest.close()


class OriginClient:
    """Kept-alive HTTP/1.1 connections to the origin of ``base_url`` (``http`` or ``https``);
    paths are relative to ``base_url``'s path. Share it between the tasks of one trio run.
    ``budget``: limits shared with other clients, instead of ``max_connections`` of its own."""

    def __init__(self, base_url: str, *, timeout: float, max_connections: int = 20,
                 keepalive_seconds: float = KEEPALIVE_SECONDS, ssl_context: ssl.SSLContext | None = None,
                 user_agent: str = "autom", budget: ConnectionBudget | None = None) -> None:
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
        self._budget = budget
        self._slots = budget.slots if budget is not None else trio.Semaphore(max_connections)
        #: requests in ``exchange`` now (waiting for a connection included)
        self.busy = 0
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
        status, reason, answer, content = await self.exchange(request, body)
        return httpx.Response(status, headers=answer, content=content, extensions={"reason_phrase": reason})

    async def exchange(self, request: h11.Request, body: bytes
                       ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        """One exchange of ``request`` (its headers exactly: Host and the body's framing
        included) with ``body``: the answer's status, reason, headers (as sent) and whole
        body, within the client's ``timeout`` in all."""
        limit = self._timeout  # (the messages below name it)
        phase = "slot"  # what the deadline cut short: waiting for a connection, connecting, the exchange
        self.busy += 1
        try:
            with trio.fail_after(limit):
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
                        answer = await self._exchange(conn, request, body)
                        whole = True
                    finally:
                        if not whole:
                            conn.close()  # half an exchange: the connection's state is unknown
        except trio.TooSlowError:
            if phase == "slot":
                raise httpx.PoolTimeout(f"no free connection within {limit:g}s") from None
            if phase == "connect":  # nothing was sent
                raise httpx.ConnectTimeout(f"cannot connect within {limit:g}s") from None
            raise httpx.ReadTimeout(f"no complete answer within {limit:g}s") from None
        finally:
            self.busy -= 1
        return answer

    def _reuse(self) -> _Conn | None:
        """The most recently used idle connection still open, after closing every one idle
        past ``keepalive_seconds`` (the oldest, at the front: a clock reading each, so the
        ones a burst left are not kept half-closed while single calls use the newest)."""
        idle = self._idle
        too_old = time.monotonic() - self._keepalive
        stale = 0
        while stale < len(idle) and idle[stale].idle_since <= too_old:
            self._forget(idle[stale])
            idle[stale].close()
            stale += 1
        del idle[:stale]
        while idle:
            conn = idle.pop()
            self._forget(conn)
            if not conn.sock.is_readable():
                return conn
            conn.close()  # the server closed it (EOF readable)
        return None

    def _forget(self, conn: _Conn) -> None:
        """``conn`` leaves this client's idle list: the budget's too."""
        if self._budget is not None:
            self._budget.forget(conn)

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
        unsent: httpx.WriteError | None = None
        try:
            await conn.stream.send_all(out)  # one write: head and body together
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # a server may answer early and close without reading the body (a 413): its
            # answer is read if it came whole, as httpcore does; else this is the error
            unsent = httpx.WriteError(f"{type(exc).__name__}: {exc}")
        try:
            return self._kept_or_closed(conn, *await self._answer(conn), reusable=unsent is None)
        except httpx.TransportError:
            if unsent is not None:
                raise unsent from None
            raise

    async def _answer(self, conn: _Conn) -> tuple[h11.Response, bytes]:
        """Read one whole answer on ``conn``: its head and body."""
        h = conn.h11
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
            elif event is h11.PAUSED:  # a protocol switched (101, CONNECT): not HTTP past here
                raise httpx.RemoteProtocolError("the server switched protocols")
            # an InformationalResponse (100 Continue...) is passed over
        assert response is not None  # h11 gives a Response before any Data or EndOfMessage
        return response, bytes(content)

    def _kept_or_closed(self, conn: _Conn, response: h11.Response, content: bytes, *, reusable: bool
                        ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        """Keep ``conn`` idle for the next request, or close it; the answer's parts."""
        h = conn.h11
        # reused only when nothing came after the answer: bytes read past it (a second answer, a
        # body longer than its Content-Length) would be the next request's answer
        if (reusable and h.our_state is h11.DONE and h.their_state is h11.DONE
                and h.trailing_data == (b"", False) and not self._closed):
            h.start_next_cycle()
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
            if self._budget is not None:
                self._budget.kept(conn, self._idle)
        else:  # "Connection: close", or the server said more than its answer
            conn.close()
        return response.status_code, response.reason, response.headers.raw_items(), content

    def close(self) -> None:
        """Close every idle connection; requests under way close theirs as they end."""
        self._closed = True
        while self._idle:
            conn = self._idle.pop()
            self._forget(conn)
            conn.close()

    async def aclose(self) -> None:
        """``close``, for ``async with`` and the callers that await it."""
        self.close()


#: how many origins an ``OriginTransport`` keeps clients for (beyond it, the least recently
#: used with no request under way is closed)
MAX_ORIGINS: Final = 64
#: the request extension that sends a request to ``OriginTransport``'s fallback
STREAMED: Final = "autom_streamed"
#: the largest request body the lean road sends (it holds the body whole; larger ones go
#: to httpx's transport, which sends them in parts)
MAX_LEAN_BODY: Final = 1024 * 1024


class OriginTransport(httpx.AsyncBaseTransport):
    """httpx's transport on ``OriginClient``s, one per origin (``ctx.http``'s road).

    The client's layers stay httpx's (URLs, cookies, auth, redirects, event hooks, traces;
    a client given a transport ignores the environment's proxies: ``BoundedHTTP`` keeps
    httpx's own when one is named, ``environment_has_proxy``); the exchange is the lean
    one (why, and what it saves: docs/design/http.md). It takes the http(s)
    requests whose every httpx timeout is the transport's ``timeout`` (the client's total
    bound, ``BoundedHTTP``'s deadline), and reads each answer whole. The rest goes to
    ``fallback`` (httpx's own transport): a request sent with ``stream=True``
    (``client.stream``: read as it comes), a body that is not bytes already (a generator,
    a file, a multipart form) or is over ``MAX_LEAN_BODY``, an ``Upgrade`` or a ``CONNECT``
    (the connection leaves HTTP), a request with its own ``timeout=`` (httpx bounds each
    operation), an ``sni_hostname`` extension, and other schemes. The lean road's limits
    are httpx's defaults, over all its origins: 100 requests under way (each on one
    connection) and 20 idle connections besides; the fallback keeps its own pool with the
    same limits. One TLS context for every https origin.
    """

    def __init__(self, fallback: httpx.AsyncBaseTransport, *, timeout: float, max_connections: int = 100,
                 max_idle: int = 20, max_origins: int = MAX_ORIGINS,
                 keepalive_seconds: float = KEEPALIVE_SECONDS) -> None:
        self._fallback = fallback
        self._timeout = float(timeout)
        self._keepalive = float(keepalive_seconds)
        self._budget = ConnectionBudget(max_connections=max_connections, max_idle=max_idle)
        self._max_origins = max_origins
        self._origins: dict[tuple[bytes, bytes, int | None], OriginClient] = {}
        self._ssl: ssl.SSLContext | None = None

    def _lean(self, request: httpx.Request) -> bool:
        """Whether ``request`` takes the lean road (see the class)."""
        if request.extensions.get(STREAMED) or request.url.scheme not in ("http", "https"):
            return False
        if request.method == "CONNECT" or "upgrade" in request.headers or "sni_hostname" in request.extensions:
            return False
        # bytes already (content=, json=; a redirect's copy not read yet: read() is sync for it)
        if not isinstance(request.stream, httpx.ByteStream) or len(request.read()) > MAX_LEAN_BODY:
            return False
        timeouts = request.extensions.get("timeout")
        return isinstance(timeouts, dict) and all(value == self._timeout for value in timeouts.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        # every request, either road's: no idle socket of an origin no longer called stays
        # open past its keep-alive (httpcore's pool does the same on each request)
        self._budget.sweep(time.monotonic() - self._keepalive)
        if not self._lean(request):
            return await self._fallback.handle_async_request(request)
        url = request.url
        try:
            lean = h11.Request(method=request.method, target=url.raw_path, headers=request.headers.raw)
        except h11.LocalProtocolError:
            # as httpx's own transport raises it, without the value (a header may carry a secret)
            raise httpx.LocalProtocolError("the request's target or a header is not valid in HTTP/1.1") from None
        key = (url.raw_scheme, url.raw_host, url.port)
        origin = self._origins.pop(key, None)
        if origin is None:
            self._make_room()
            origin = OriginClient(f"{url.scheme}://{url.netloc.decode('ascii')}", timeout=self._timeout,
                                  keepalive_seconds=self._keepalive, budget=self._budget,
                                  ssl_context=self._tls() if url.scheme == "https" else None)
        # the most recently used at the end; nothing awaited before exchange counts it busy
        self._origins[key] = origin
        status, reason, headers, content = await origin.exchange(lean, request.content)
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(content),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    def _make_room(self) -> None:
        """Below ``max_origins``, close the least recently used clients with no request under
        way (their idle connections); a request waiting for a connection keeps its client
        (with every client busy, there are more for a while: as many as requests under way)."""
        while len(self._origins) >= self._max_origins:
            free = next((key for key, origin in self._origins.items() if not origin.busy), None)
            if free is None:
                return
            self._origins.pop(free).close()

    def _tls(self) -> ssl.SSLContext:
        """One TLS context for every origin (making one costs tens of ms of CPU)."""
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
            self._ssl.set_alpn_protocols(["http/1.1"])  # as httpcore offers it
        return self._ssl

    async def aclose(self) -> None:
        while self._origins:
            self._origins.popitem()[1].close()
        await self._fallback.aclose()
