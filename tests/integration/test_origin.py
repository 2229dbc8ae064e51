"""autom.origin.OriginClient against a real HTTP/1.1 server on 127.0.0.1 (h11 over trio):
kept-alive reuse, a server that closes, a cancel mid-exchange, timeouts, bad answers, TLS,
the Telegram client's road through a proxy the environment names; ``ctx.http``'s road
(httpx's client on ``OriginTransport``)."""

from __future__ import annotations

import gzip
import json
import os
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11
import httpx
import pytest
import trio

from autom.config import Settings
from autom.context import BoundedHTTP
from autom.origin import MAX_LEAN_BODY, OriginClient, OriginTransport, environment_proxied
from autom.telegram import open_telegram

Handler = Callable[[h11.Request, bytes], list[bytes] | None]


@dataclass
class Server:
    """Counts its connections and requests; answers each with ``answer`` (raw bytes to write,
    or None: hang), or 200 ``{"ok": true}`` kept alive."""

    url: str = ""
    connections: int = 0
    requests: list[tuple[h11.Request, bytes]] = field(default_factory=list)
    answer: Handler | None = None
    #: close the connection after this many requests on it (0: never)
    close_after: int = 0
    #: when set, every answer waits for it (``inflight``/``most``: requests waiting at once)
    gate: trio.Event | None = None
    inflight: int = 0
    most: int = 0
    #: connections that ended (the client closed its side, or the server did)
    ended: int = 0

    async def serve(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        try:
            await self._serve(stream)
        finally:
            self.ended += 1

    async def _serve(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        served = 0
        try:
            while True:
                request, body = None, b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                        continue
                    if isinstance(event, h11.Request):
                        request = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert request is not None
                self.requests.append((request, body))
                if self.gate is not None:
                    self.inflight += 1
                    self.most = max(self.most, self.inflight)
                    await self.gate.wait()
                    self.inflight -= 1
                raw = self.answer(request, body) if self.answer is not None else ok(conn)
                if raw is None:
                    await trio.sleep_forever()
                for chunk in raw:
                    await stream.send_all(chunk)
                served += 1
                if self.close_after and served >= self.close_after:
                    await stream.aclose()
                    return
                if self.answer is not None:  # raw answers: one a connection unless they keep it alive
                    conn = h11.Connection(h11.SERVER)
                else:
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return


def ok(conn: h11.Connection, payload: bytes = b'{"ok":true}') -> list[bytes]:
    head = conn.send(h11.Response(status_code=200, headers=[("Content-Type", "application/json"),
                                                           ("Content-Length", str(len(payload)))]))
    return [head + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())]


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Server]:
    srv = Server()
    listeners = await nursery.start(trio.serve_tcp, srv.serve, 0)
    srv.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    yield srv


async def test_one_connection_kept_alive_for_many_requests(server: Server) -> None:
    client = OriginClient(server.url + "/base/", timeout=5)
    for i in range(5):
        response = await client.post_json("/call", {"i": i, "text": "привет"})
        assert response.status_code == 200 and response.json() == {"ok": True}
    await client.aclose()
    assert server.connections == 1
    request, body = server.requests[0]
    assert request.method == b"POST" and request.target == b"/base/call"
    headers = dict(request.headers)
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"host"] == server.url.removeprefix("http://").encode()
    assert json.loads(body) == {"i": 0, "text": "привет"}
    assert "привет".encode() in body  # UTF-8 as is, as httpx's json=


async def test_a_server_that_closes_idle_connections_costs_a_new_one_not_an_error(server: Server) -> None:
    server.close_after = 1
    client = OriginClient(server.url, timeout=5)
    for _ in range(3):
        assert (await client.post_json("/x", {})).status_code == 200
        await trio.sleep(0.2)  # the server's close reaches us: the idle socket reads EOF
    assert server.connections == 3


async def test_connection_close_answers_are_not_reused(server: Server) -> None:
    def closing(request: h11.Request, body: bytes) -> list[bytes]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"]

    server.answer = closing
    client = OriginClient(server.url, timeout=5)
    for _ in range(3):
        assert (await client.post_json("/x", {})).json() == {}
    assert server.connections == 3


async def test_idle_connections_expire(server: Server) -> None:
    client = OriginClient(server.url, timeout=5, keepalive_seconds=0.5)
    await client.post_json("/x", {})
    await client.post_json("/x", {})
    await trio.sleep(0.6)
    await client.post_json("/x", {})
    assert server.connections == 2


async def test_chunked_answer_and_headers_reach_the_caller(server: Server) -> None:
    def chunked(request: h11.Request, body: bytes) -> list[bytes]:
        return [b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\n{\"ok\"\r\n", b"7\r\n:false}\r\n0\r\n\r\n"]

    server.answer = chunked
    response = await OriginClient(server.url, timeout=5).post_json("/x", {})
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.json() == {"ok": False}


async def test_a_cancel_mid_exchange_closes_that_connection(server: Server) -> None:
    hang = True

    def maybe_hang(request: h11.Request, body: bytes) -> list[bytes] | None:
        return None if hang else [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]

    server.answer = maybe_hang
    client = OriginClient(server.url, timeout=5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.post_json, "/x", {})
        with trio.fail_after(5):  # cancelled once the server has the request: mid-exchange
            while not server.requests:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    hang = False
    assert (await client.post_json("/x", {})).json() == {}
    assert server.connections == 2  # the cancelled one was closed, not reused half-read


async def test_failures_raise_httpx_exceptions(server: Server) -> None:
    server.answer = lambda request, body: None  # hangs
    with pytest.raises(httpx.ReadTimeout):
        await OriginClient(server.url, timeout=0.2).post_json("/x", {})
    server.answer = lambda request, body: [b"NOT HTTP AT ALL\r\n\r\n"]
    with pytest.raises(httpx.RemoteProtocolError):
        await OriginClient(server.url, timeout=5).post_json("/x", {})
    server.answer = lambda request, body: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}"]
    server.close_after = 1
    with pytest.raises(httpx.RemoteProtocolError):  # closed before the whole body
        await OriginClient(server.url, timeout=5).post_json("/x", {})
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await OriginClient(f"http://127.0.0.1:{port}", timeout=5).post_json("/x", {})
    with pytest.raises(httpx.InvalidURL):
        OriginClient("ftp://example.com", timeout=5)
    closed = OriginClient(server.url, timeout=5)
    await closed.aclose()
    with pytest.raises(httpx.ConnectError):
        await closed.post_json("/x", {})


async def test_at_most_max_connections_at_once(server: Server) -> None:
    server.gate = trio.Event()
    client = OriginClient(server.url, timeout=5, max_connections=2)
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(client.post_json, "/x", {"i": i})
        with trio.fail_after(5):
            while len(server.requests) < 2:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        assert server.most == 2 and len(server.requests) == 2  # the other four wait for a connection
        server.gate.set()
    assert len(server.requests) == 6 and server.connections == 2


async def test_bytes_after_an_answer_are_never_the_next_requests_answer(server: Server) -> None:
    """A server (or a proxy) that writes a second answer, or more body than it announced: the
    connection is closed with its answer, and the next request gets its own on a new one."""
    def twice(request: h11.Request, body: bytes) -> list[bytes]:
        n = len(server.requests)
        return [b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"n":%d}' % n
                + b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"stale":%d}' % n]

    server.answer = twice
    client = OriginClient(server.url, timeout=5)
    assert [(await client.post_json("/x", {})).json() for _ in range(3)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert server.connections == 3


async def test_idle_connections_a_burst_left_are_closed_once_past_their_keep_alive(server: Server) -> None:
    """After a burst, steady single calls keep one connection in use: the rest are closed once
    they have waited too long, not left open (half-closed by the server) until the next burst."""
    server.gate = trio.Event()
    client = OriginClient(server.url, timeout=5, max_connections=4, keepalive_seconds=0.3)
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(client.post_json, "/x", {})
        with trio.fail_after(5):
            while server.inflight < 4:
                await trio.sleep(0.01)
        server.gate.set()
    assert server.connections == 4 and server.ended == 0
    with trio.fail_after(10):  # single calls, 0.1 s apart, on the one connection that stays fresh
        while server.ended < 3:
            await client.post_json("/x", {})
            await trio.sleep(0.1)
    assert server.connections == 4  # the three the burst left closed, none opened anew


async def test_timeouts_say_what_was_cut_short(server: Server, nursery: trio.Nursery) -> None:
    """A wait for a free connection (PoolTimeout) or a connect that never completes
    (ConnectTimeout: a TLS handshake no one answers) sent nothing; a silent server: ReadTimeout."""
    server.answer = lambda request, body: None  # hangs
    client = OriginClient(server.url, timeout=0.3, max_connections=1)
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await client.post_json("/x", {})
        except httpx.HTTPError as exc:
            errors.append(exc)

    async with trio.open_nursery() as calls:  # both at once: their deadlines come together
        calls.start_soon(call)
        calls.start_soon(call)
    assert sorted(type(e).__name__ for e in errors) == ["PoolTimeout", "ReadTimeout"]
    assert len(server.requests) == 1

    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    listeners = await nursery.start(trio.serve_tcp, silent, 0)
    port = listeners[0].socket.getsockname()[1]
    with pytest.raises(httpx.ConnectTimeout):
        await OriginClient(f"https://127.0.0.1:{port}", timeout=0.3).post_json("/x", {})


async def test_a_path_http_cannot_carry_is_a_bad_url_without_the_path_in_it(server: Server) -> None:
    client = OriginClient(server.url, timeout=5)
    for token in ("123:with space", "123:line\r\nX-Injected: 1", "123:ключ"):
        with pytest.raises(httpx.InvalidURL) as caught:
            await client.post_json(f"/bot{token}/sendMessage", {})
        assert token not in str(caught.value) and "123" not in str(caught.value)
    assert server.requests == []


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


async def serve_tls(server: Server, nursery: trio.Nursery, cert: Path, key: Path) -> int:
    """``server`` behind TLS (``cert``, ``key``) on a new port of 127.0.0.1; the port."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def tls(stream: trio.SocketStream) -> None:
        wrapped = trio.SSLStream(stream, server_ctx, server_side=True, https_compatible=True)
        try:
            await wrapped.do_handshake()
        except trio.BrokenResourceError:
            await stream.aclose()
            return
        await server.serve(wrapped)

    listeners = await nursery.start(trio.serve_tcp, tls, 0)
    return int(listeners[0].socket.getsockname()[1])


async def test_https_verifies_the_server(server: Server, nursery: trio.Nursery, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = await serve_tls(server, nursery, cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))
    client = OriginClient(f"https://localhost:{port}", timeout=5, ssl_context=trusted)
    assert (await client.post_json("/x", {"a": 1})).json() == {"ok": True}
    assert (await client.post_json("/x", {"a": 2})).status_code == 200
    assert server.connections == 1
    assert dict(server.requests[0][0].headers)[b"host"] == f"localhost:{port}".encode()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(httpx.ConnectError) as refused:  # an unknown issuer: refused, not sent
            await OriginClient(f"https://localhost:{port}", timeout=5,
                               ssl_context=ssl.create_default_context()).post_json("/x", {})
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)  # the cause, not an empty BrokenResourceError
    assert len(server.requests) == 2
    with trio.fail_after(5):  # the refused handshakes' sockets closed (not left to the garbage collector)
        while len(os.listdir("/proc/self/fd")) > before:
            await trio.sleep(0.01)


async def test_telegram_goes_through_the_proxy_the_environment_names(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """With HTTP(S)_PROXY set, the Telegram client keeps httpx, which sends through the proxy
    (here the test server, which sees the absolute URL a proxy is asked for)."""
    api = "http://api.telegram.invalid"
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert environment_proxied(api)
    monkeypatch.setenv("NO_PROXY", "api.telegram.invalid")
    assert not environment_proxied(api)
    monkeypatch.delenv("NO_PROXY")
    payload = b'{"ok":true,"result":{"message_id":5}}'
    server.answer = lambda request, body: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)]
    settings = Settings(telegram_api=api, telegram_bot_token="123:proxy", http_timeout_seconds=5)
    async with open_telegram(settings) as tg:
        sent = await tg.send_message(1, "via the proxy")
    assert sent == {"message_id": 5}
    request, body = server.requests[0]
    assert request.target == b"http://api.telegram.invalid/bot123:proxy/sendMessage"
    assert json.loads(body)["text"] == "via the proxy"


# ctx.http's road: httpx's client on OriginTransport (autom.context.BoundedHTTP)

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy in the environment (with one, ``ctx.http`` keeps httpx's own transport)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_ctx_http_keeps_httpx_behaviour_on_the_lean_road(server: Server, no_proxy: None) -> None:
    """What a handler sends and reads through ``ctx.http`` is httpx's (query, headers, JSON,
    methods, status, a HEAD's answer), on one kept-alive connection."""
    def answers(request: h11.Request, body: bytes) -> list[bytes]:
        length = b"Content-Length: 11\r\n\r\n"
        return [b"HTTP/1.1 200 OK\r\n" + length + (b"" if request.method == b"HEAD" else b'{"ok":true}')]

    server.answer = answers
    async with BoundedHTTP(deadline=5) as http:
        assert isinstance(http._transport, OriginTransport)
        got = await http.post(server.url + "/crm/leads", params={"q": "a b", "n": 2}, json={"name": "Анна"},
                              headers={"X-Api-Key": "k1"})
        assert got.status_code == 200 and got.json() == {"ok": True}
        assert got.http_version == "HTTP/1.1" and got.request.url.path == "/crm/leads"
        assert (await http.put(server.url + "/crm/1", content=b"raw")).status_code == 200
        head = await http.head(server.url + "/crm/1")
        assert head.status_code == 200 and head.content == b""  # no body read after a HEAD's answer
        assert head.headers["content-length"] == "11"
        assert (await http.get(server.url + "/crm/2")).json() == {"ok": True}
    assert server.connections == 1
    (first, body), (put, put_body) = server.requests[0], server.requests[1]
    assert first.method == b"POST" and first.target == b"/crm/leads?q=a+b&n=2"
    headers = dict(first.headers)
    assert headers[b"x-api-key"] == b"k1" and headers[b"content-type"] == b"application/json"
    assert headers[b"host"] == server.url.removeprefix("http://").encode()
    assert json.loads(body) == {"name": "Анна"}
    assert put.method == b"PUT" and put_body == b"raw"
    assert [r.method for r, _ in server.requests] == [b"POST", b"PUT", b"HEAD", b"GET"]


async def test_ctx_http_answers_decoded_and_redirects_followed_as_httpx_does(server: Server, no_proxy: None) -> None:
    packed = gzip.compress(b'{"packed":true}')

    def answers(request: h11.Request, body: bytes) -> list[bytes]:
        if request.target == b"/old":
            return [b"HTTP/1.1 302 Found\r\nLocation: /new\r\nContent-Length: 0\r\n\r\n"]
        if request.target == b"/new":
            return [b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed) + packed]
        return [b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n"]

    server.answer = answers
    async with BoundedHTTP(deadline=5) as http:
        moved = await http.get(server.url + "/old", follow_redirects=True)
        assert moved.json() == {"packed": True} and [r.status_code for r in moved.history] == [302]
        assert (await http.get(server.url + "/old")).status_code == 302  # httpx's default: not followed
        busy = await http.get(server.url + "/x")
        assert busy.status_code == 503 and busy.reason_phrase == "Service Unavailable" and busy.text == "busy"
        with pytest.raises(httpx.HTTPStatusError) as caught:
            busy.raise_for_status()
        assert caught.value.request.url == server.url + "/x"


async def test_ctx_http_streamed_requests_and_bodies(server: Server, no_proxy: None) -> None:
    """``client.stream`` and a body that is not bytes already (an async generator) go to
    httpx's own transport: the answer read as it comes, the body sent chunked as it comes;
    so does a body over ``MAX_LEAN_BODY`` (the lean road holds a body whole)."""
    async def parts() -> AsyncIterator[bytes]:
        yield b"one,"
        yield b"two"

    async with BoundedHTTP(deadline=5) as http:
        transport = http._transport
        assert isinstance(transport, OriginTransport)
        assert (await http.post(server.url + "/upload", content=parts())).status_code == 200
        async with http.stream("GET", server.url + "/download") as streamed:
            assert b"".join([chunk async for chunk in streamed.aiter_bytes()]) == b'{"ok":true}'
        big = b"x" * (MAX_LEAN_BODY + 1)
        assert (await http.put(server.url + "/big", content=big)).status_code == 200
        assert transport._origins == {}  # none of them took the lean road
        assert (await http.post(server.url + "/small", content=b"s")).status_code == 200
        assert len(transport._origins) == 1
    upload, body = server.requests[0]
    assert body == b"one,two" and dict(upload.headers)[b"transfer-encoding"] == b"chunked"
    assert server.requests[2][1] == big
    assert server.connections == 2  # httpx's pool's connection, then the lean road's


async def test_an_early_answer_to_a_body_not_read_is_the_answer(nursery: trio.Nursery) -> None:
    """A server that answers before reading the body (413) and closes: its answer, as
    httpx's transport gives it, not the write's error."""
    async def refuse(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while conn.next_event() is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
        await stream.send_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbig!")
        await trio.sleep(0.2)
        await stream.aclose()  # the body unread: the client's write is reset

    listeners = await nursery.start(trio.serve_tcp, refuse, 0)
    client = OriginClient(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}", timeout=5)
    refused = await client.request("POST", "/up", b"x" * (16 * 1024 * 1024))
    assert refused.status_code == 413 and refused.text == "big!"


async def test_ctx_http_idle_connections_of_origins_no_longer_called_are_closed(
        server: Server, nursery: trio.Nursery) -> None:
    listeners = await nursery.start(trio.serve_tcp, server.serve, 0)
    other = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    transport = OriginTransport(httpx.AsyncHTTPTransport(), timeout=5, keepalive_seconds=0.2)
    async with httpx.AsyncClient(transport=transport) as http:
        assert (await http.get(server.url + "/a")).status_code == 200
        await trio.sleep(0.3)
        assert (await http.get(other + "/b")).status_code == 200  # the first origin's is past its keep-alive
        with trio.fail_after(5):
            while server.ended < 1:
                await trio.sleep(0.01)
        assert server.connections == 2 and server.ended == 1


async def test_ctx_http_a_requests_own_timeout_bounds_it(server: Server) -> None:
    server.answer = lambda request, body: None  # hangs
    async with BoundedHTTP(deadline=30) as http:
        with trio.fail_after(5), pytest.raises(httpx.ReadTimeout) as caught:
            await http.get(server.url + "/slow", timeout=0.3)
        assert caught.value.request.url == server.url + "/slow"
        with trio.socket.socket() as sock:
            await sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/nobody")


async def test_ctx_http_keeps_clients_for_the_most_recent_origins(server: Server, nursery: trio.Nursery) -> None:
    """A client per origin, at most ``max_origins``: the least recently used one is closed
    with its idle connections."""
    urls = [server.url]
    for _ in range(2):
        listeners = await nursery.start(trio.serve_tcp, server.serve, 0)
        urls.append(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    transport = OriginTransport(httpx.AsyncHTTPTransport(), timeout=5, max_origins=2)
    async with httpx.AsyncClient(transport=transport) as http:
        for url in (urls[0], urls[1], urls[0], urls[2]):  # urls[1] the least recently used
            assert (await http.get(url + "/x")).status_code == 200
        with trio.fail_after(5):
            while server.ended < 1:
                await trio.sleep(0.01)
        assert server.connections == 3 and server.ended == 1
        assert (await http.get(urls[0] + "/x")).status_code == 200
        assert server.connections == 3  # urls[0] kept its connection
    with trio.fail_after(5):
        while server.ended < 3:
            await trio.sleep(0.01)


async def test_ctx_http_goes_through_the_proxy_the_environment_names(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx ignores the environment's proxies when given a transport: with one named,
    ``ctx.http`` keeps httpx's own, which sends through it."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    async with BoundedHTTP(deadline=5) as http:
        assert not isinstance(http._transport, OriginTransport)
        assert (await http.post("http://crm.invalid/leads", json={"a": 1})).json() == {"ok": True}
    request, body = server.requests[0]
    assert request.target == b"http://crm.invalid/leads" and json.loads(body) == {"a": 1}


async def test_ctx_http_upgrades_and_switched_protocols_never_hang(server: Server, no_proxy: None) -> None:
    """A request asking for an Upgrade goes to httpx's own transport (its 101 answer is
    httpx's); a 101 the lean road did not ask for is a protocol error, at once."""
    def switching(request: h11.Request, body: bytes) -> list[bytes]:
        return [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"]

    server.answer = switching
    async with BoundedHTTP(deadline=30) as http:
        with trio.fail_after(5):
            switched = await http.get(server.url + "/ws", headers={"Upgrade": "websocket", "Connection": "Upgrade"})
            assert switched.status_code == 101
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(server.url + "/plain")
    client = OriginClient(server.url, timeout=30)  # the lean road itself, asked to upgrade: an error, not a freeze
    request = h11.Request(method="GET", target="/ws", headers=[("Host", "x"), ("Upgrade", "websocket"),
                                                               ("Connection", "Upgrade")])
    with trio.fail_after(5), pytest.raises(httpx.RemoteProtocolError, match="switched protocols"):
        await client.exchange(request, b"")


async def test_ctx_http_shares_httpx_limits_across_origins(server: Server, nursery: trio.Nursery) -> None:
    """Requests under way are capped for the whole transport, not per origin; idle
    connections kept are capped in all (the longest idle closed); a client with a request
    waiting is never the one closed to make room for another origin."""
    urls = [server.url]
    for _ in range(2):
        listeners = await nursery.start(trio.serve_tcp, server.serve, 0)
        urls.append(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    server.gate = trio.Event()
    transport = OriginTransport(httpx.AsyncHTTPTransport(), timeout=5, max_connections=2, max_idle=1, max_origins=1)
    answers: list[int] = []
    async with httpx.AsyncClient(transport=transport) as http:
        async def call(url: str) -> None:
            answers.append((await http.get(url + "/x")).status_code)

        async with trio.open_nursery() as calls:
            for url in (urls[0], urls[1], urls[2], urls[0]):
                calls.start_soon(call, url)
            with trio.fail_after(5):
                while len(server.requests) < 2:
                    await trio.sleep(0.01)
            await trio.sleep(0.2)
            assert server.inflight == 2  # the other two wait for a slot, their clients kept
            server.gate.set()
        assert answers == [200] * 4
        with trio.fail_after(5):  # one idle connection kept of the (at least) three opened
            while server.connections - server.ended > 1:
                await trio.sleep(0.01)
        assert server.most == 2


async def test_ctx_http_a_requests_own_timeout_is_per_operation_as_httpx(nursery: trio.Nursery) -> None:
    """``timeout=`` on one request keeps httpx's meaning (each read within it): an answer
    that trickles in slower than that in all but faster per read is read whole."""
    async def trickle(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while conn.next_event() is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n")
        for byte in b"slowly":
            await trio.sleep(0.15)
            await stream.send_all(bytes([byte]))

    listeners = await nursery.start(trio.serve_tcp, trickle, 0)
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/t"
    async with BoundedHTTP(deadline=30) as http:
        got = await http.get(url, timeout=0.5)  # 0.9 s in all, 0.15 s a read
        assert got.text == "slowly"


async def test_ctx_http_big_heads_raw_header_names_and_bad_headers(
        server: Server, nursery: trio.Nursery, no_proxy: None) -> None:
    async def big_head(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while conn.next_event() is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        await stream.send_all(b"HTTP/1.1 200 OK\r\nX-Custom-Name: v\r\nX-Big: " + b"b" * 30_000)
        await trio.sleep(0.1)  # the client holds an incomplete head of 30 KB
        await stream.send_all(b"b" * 10_000 + b"\r\nContent-Length: 2\r\n\r\n{}")

    listeners = await nursery.start(trio.serve_tcp, big_head, 0)
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/big"
    async with BoundedHTTP(deadline=5) as http:
        got = await http.get(url)
        assert len(got.headers["x-big"]) == 40_000  # past h11's 16 KiB default, as httpx reads it
        assert (b"X-Custom-Name", b"v") in got.headers.raw
        with pytest.raises(httpx.LocalProtocolError) as caught:
            await http.get(server.url + "/x", headers={"Authorization": "Bearer sec\nret"})
        assert "sec" not in str(caught.value)
    assert server.requests == []


async def test_ctx_http_https_on_the_lean_road_trusts_the_environments_ca(
        server: Server, nursery: trio.Nursery, tmp_path: Path, no_proxy: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """https origins share one TLS context, made as httpx makes its own (SSL_CERT_FILE)."""
    cert, key = self_signed(tmp_path)
    ports = [await serve_tls(server, nursery, cert, key) for _ in range(2)]
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    async with BoundedHTTP(deadline=5) as http:
        transport = http._transport
        assert isinstance(transport, OriginTransport)
        for port in ports + ports:
            assert (await http.post(f"https://localhost:{port}/x", json={"p": port})).json() == {"ok": True}
        assert transport._ssl is not None and len(transport._origins) == 2
    assert server.connections == 2
