"""An open-loop sender of signed mixed deliveries, and the stubs it runs against (bench/sustained.py --rate).

The sender (``OpenLoop``) offers a FIXED rate whatever the answers do: request i is due
at ``start + i / rate`` (wrk2's schedule), sent on a free keep-alive connection (a new
one when none is free, up to ``max_connections``), and its latency counts from when it
was due, so a stall shows as the wait of every request due meanwhile (no coordinated
omission). The mix (issue 27): 70 % Telegram updates from ``chats`` chats (2 % of them
``/ping``, which asks for a reply), 10 % each GitHub, Stripe and site deliveries, each
new (a new update id, delivery id, event id, form id) and signed as its sender signs.
Each carries its ``t0`` (: in the message text after the command,
in the body of the others): the wall time it was due, so the database says how long
each waited from then until its job was claimed (bench/sustained.py). A connection that closes without an answer has its
request sent again on a new one (one not answered within ``ANSWER_SECONDS`` counts as not
answered, its connection closed), the same bytes (the same dedup key, so stored once, as
for a real sender's retry) and counted.

The stubs (``python bench/openloop.py stubs``, a process of their own so they do not
share the sender's event loop): a Telegram Bot API stub that enforces Telegram's limits
(one message a second per chat, 30 a second in all with a burst of 30; beyond them 429
with ``retry_after``), and a CRM answering ``{}`` after 20 ms. ``GET /_stats`` on the
CRM's address gives their counters.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import random
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from autom.testing.telegram_stub import (  # noqa: E402
    Receive,
    Reply,
    Scope,
    Send,
    TelegramStub,
    _lifespan,
    _read_body,
    _send_bytes,
    serving,
)

GITHUB_SECRET = "bench-github-secret"
STRIPE_SECRET = "whsec_bench_stripe_secret"
CHAT_BASE = 700_000_000
#: the mix: (source, share)
MIX = (("telegram", 0.70), ("github", 0.10), ("stripe", 0.10), ("site", 0.10))
PING_SHARE = 0.02
#: how long the sender waits for an answer (s): beyond, the request counts as not answered
ANSWER_SECONDS = 10.0
#: an idle connection unused this long (s) is closed, not reused: the server closes its own
#: after 130 s (autom/web/serve.py KEEP_ALIVE_TIMEOUT), and a request sent on one as it does
#: gets no answer (the keep-alive race: the idle ones are a stack, the bottom ones age)
IDLE_SECONDS = 100.0
#: the CRM's answer time (s)
CRM_SECONDS = 0.020
#: Telegram's limits as the stub enforces them
CHAT_INTERVAL = 1.0
GLOBAL_RATE = 30.0
GLOBAL_BURST = 30.0


# --- the stubs ---------------------------------------------------------------------------


class LimitedTelegram(TelegramStub):
    """The Telegram stub, with Telegram's limits on ``sendMessage``: a chat's second message within
    ``CHAT_INTERVAL`` of its last, or one beyond the global bucket (``GLOBAL_RATE`` a second, a burst
    of ``GLOBAL_BURST``), gets 429 with ``retry_after`` (whole seconds, as Telegram's). Counts what
    it accepted and refused; keeps no calls (a long run would hold them all)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.refused = 0
        self._last: dict[str, float] = {}
        self._tokens = GLOBAL_BURST
        self._at = time.monotonic()

    def _record(self, call: Any) -> None:  # no call kept
        pass

    def _next_reply(self, method: str, params: dict[str, Any]) -> Reply:
        if method.lower() != "sendmessage":
            return super()._next_reply(method, params)
        now = time.monotonic()
        self._tokens = min(GLOBAL_BURST, self._tokens + (now - self._at) * GLOBAL_RATE)
        self._at = now
        chat = str(params.get("chat_id"))
        last = self._last.get(chat)
        wait = 0.0
        if last is not None and now - last < CHAT_INTERVAL:
            wait = CHAT_INTERVAL - (now - last)
        if self._tokens < 1:
            wait = max(wait, (1 - self._tokens) / GLOBAL_RATE)
        if wait > 0:
            self.refused += 1
            return Reply(status=429, retry_after=max(1, math.ceil(wait)))
        self._tokens -= 1
        self._last[chat] = now
        self.sent += 1
        return super()._next_reply(method, params)


@dataclass
class Crm:
    """The CRM: every POST answered ``{}`` after ``CRM_SECONDS``; ``GET /_stats``: the counters."""

    telegram: LimitedTelegram
    requests: int = 0
    _held: set[trio.CancelScope] = field(default_factory=set)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        await _read_body(receive)
        if scope["path"] == "/_stats":
            stats = {"crm": self.requests, "sent": self.telegram.sent, "refused": self.telegram.refused}
            await _send_bytes(send, 200, json.dumps(stats).encode(), [])
            return
        self.requests += 1
        with trio.CancelScope() as held:
            self._held.add(held)
            try:
                await trio.sleep(CRM_SECONDS)
                await _send_bytes(send, 200, b"{}", [])
            finally:
                self._held.discard(held)

    def release(self) -> None:
        for scope in list(self._held):
            scope.cancel()


async def serve_stubs() -> None:
    """Serve both stubs until SIGTERM; print ``READY <telegram url> <crm url>``."""
    import signal

    telegram = LimitedTelegram()
    crm = Crm(telegram)
    async with serving(telegram, host="127.0.0.1", port=0, logger="bench.stub.telegram") as tg_url, \
            serving(crm, host="127.0.0.1", port=0, logger="bench.stub.crm") as crm_url:
        telegram.url = tg_url
        print("READY", tg_url, crm_url, flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                return


# --- the sender --------------------------------------------------------------------------


def _sha256(secret: bytes, *parts: bytes) -> str:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.hexdigest()


class Deliveries:
    """Request i of the mix, as bytes ready to send (``build``): its source and its HTTP/1.1 request."""

    def __init__(self, host: str, telegram_secret: str, site_secret: str, chats: int, seed: int) -> None:
        self.host = host
        self.telegram_secret = telegram_secret
        self.site_secret = site_secret.encode()
        self.chats = chats
        self.seed = seed
        self.nonce = uuid.uuid4().hex[:10]
        self.update_base = (int(time.time() * 1000) % 10**9) * 1000  # update ids unique across runs
        self.sources = [s for s, _ in MIX]
        self.weights = [w for _, w in MIX]

    def build(self, i: int, t0: float) -> tuple[str, bytes]:
        """Request i, due at wall time ``t0``: its source and bytes. Built once and sent as they are on
        every retry (a resend is the same delivery, same dedup key). Its draws come from a generator of
        its own, seeded by (seed, i), so ``--seed`` gives the same mix whatever order the sends and
        retries run in; its ids come from the run's nonce and i, unique across runs."""
        rng = random.Random(f"{self.seed}:{i}")
        source = rng.choices(self.sources, self.weights)[0]
        if source == "telegram":
            chat = CHAT_BASE + rng.randrange(self.chats)
            text = ("/ping" if rng.random() < PING_SHARE else "hello") + f" {t0:.6f}"  # sustained.py: 1e-5 s of slack
            body = json.dumps({"update_id": self.update_base + i, "message": {
                "message_id": i, "date": int(t0), "chat": {"id": chat, "type": "private"},
                "from": {"id": chat, "is_bot": False, "first_name": "Sustained"}, "text": text}}).encode()
            headers = {"X-Telegram-Bot-Api-Secret-Token": self.telegram_secret}
        elif source == "github":
            body = json.dumps({"t0": t0, "ref": "refs/heads/main", "after": f"{i:040x}",
                               "repository": {"full_name": f"bench/repo{rng.randrange(100)}"}}).encode()
            delivery = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{self.nonce}.{i}"))
            headers = {"X-GitHub-Event": "push", "X-GitHub-Delivery": delivery,
                       "X-Hub-Signature-256": "sha256=" + _sha256(GITHUB_SECRET.encode(), body)}
        elif source == "stripe":
            body = json.dumps({"id": f"evt_{self.nonce}_{i}", "object": "event", "type": "customer.updated",
                               "t0": t0, "data": {"object": {"id": f"cus_{rng.randrange(1000)}",
                                                             "object": "customer"}}}).encode()
            t = str(int(time.time()))
            headers = {"Stripe-Signature": f"t={t},v1=" + _sha256(STRIPE_SECRET.encode(), t.encode(), b".", body)}
        else:
            body = json.dumps({"id": f"{self.nonce}-{i}", "email": f"u{rng.randrange(1000)}@example.com",
                               "t0": t0}).encode()
            headers = {"X-Signature": "sha256=" + _sha256(self.site_secret, body)}
        head = [f"POST /hooks/{source} HTTP/1.1", f"Host: {self.host}", "Content-Type: application/json",
                f"Content-Length: {len(body)}"] + [f"{k}: {v}" for k, v in headers.items()]
        return source, ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Closed(Exception):
    """The server closed the connection before the whole answer."""


class Connection:
    """One keep-alive HTTP/1.1 connection: a request, then its answer (Content-Length bodies only)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""
        self.idle_since = trio.current_time()
        self.closing = False  # the last answer said "Connection: close"

    async def exchange(self, data: bytes) -> int:
        await self.stream.send_all(data)
        while b"\r\n\r\n" not in self.buf:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise Closed
            self.buf += chunk
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                # the server closes it after this answer (hypercorn: every 1,000th request on a
                # connection, keep_alive_max_requests); a request sent on it after gets no answer
                self.closing = True
        while len(rest) < length:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise Closed
            rest += chunk
        self.buf = rest[length:]
        return status


@dataclass
class Window:
    """What the sender saw of the requests due in one window (a minute, a search step)."""

    due: int = 0
    answered: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # status: count
    errors: int = 0  # no answer at all (after the resends)
    resent: int = 0
    why: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # what a failed send ran into
    by_source: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # 202s
    latencies: list[float] = field(default_factory=list)  # s, from due to answer
    lag: list[float] = field(default_factory=list)  # s, from due to sent

    @property
    def accepted(self) -> int:
        return self.answered.get(202, 0)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100, nearest rank) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class OpenLoop:
    """Offers ``rate`` requests a second to ``targets`` (host, port), request i to target i mod
    their number, as a load balancer in front of several replicas would (the schedule: the
    module docstring)."""

    def __init__(self, targets: list[tuple[str, int]], deliveries: Deliveries, max_connections: int = 512) -> None:
        self.targets = targets
        self.deliveries = deliveries
        self.idle: dict[tuple[str, int], list[Connection]] = {t: [] for t in targets}
        self.slots = trio.Semaphore(max_connections)
        self.counter = 0  # request numbers: unique over every run of this sender
        self.wall_start = 0.0  # when the last offer began (epoch s): request i's t0 is this + i / rate

    async def _connection(self, target: tuple[str, int]) -> Connection:
        idle = self.idle[target]
        while idle:
            conn = idle.pop()
            if trio.current_time() - conn.idle_since < IDLE_SECONDS:
                return conn
            await conn.stream.aclose()
        return Connection(await trio.open_tcp_stream(*target))

    async def _one(self, due: float, due_wall: float, window: Window) -> None:
        i = self.counter
        self.counter += 1
        source, data = self.deliveries.build(i, due_wall)
        target = self.targets[i % len(self.targets)]
        async with self.slots:
            for attempt in range(3):
                try:
                    conn = await self._connection(target)
                except OSError as exc:
                    window.why[f"connect: {exc.strerror or type(exc).__name__}"] += 1
                    window.resent += attempt < 2
                    continue
                sent = trio.current_time()
                try:
                    with trio.fail_after(ANSWER_SECONDS):
                        status = await conn.exchange(data)
                except trio.TooSlowError:  # no answer: counted as none, not sent again
                    window.why["timeout"] += 1
                    await conn.stream.aclose()
                    break
                except (Closed, OSError, trio.BrokenResourceError) as exc:
                    window.why[type(exc).__name__] += 1
                    await conn.stream.aclose()
                    window.resent += attempt < 2
                    continue
                if conn.closing:
                    await conn.stream.aclose()
                else:
                    conn.idle_since = trio.current_time()
                    self.idle[target].append(conn)
                now = trio.current_time()
                window.answered[status] += 1
                if status == 202:
                    window.by_source[source] += 1
                window.latencies.append(now - due)
                window.lag.append(sent - due)
                return
            window.errors += 1

    async def offer(self, rate: float, seconds: float, windows: list[tuple[float, Window]]) -> None:
        """Offer ``rate`` a second for ``seconds``; request due at offset s goes to the window of the
        last (start offset, window) pair with start <= s. Returns when every answer came."""
        total = int(rate * seconds)
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            self.wall_start = time.time()
            i = 0
            w = 0
            while i < total:
                await trio.sleep_until(start + i / rate)
                now = trio.current_time()
                while i < total and start + i / rate <= now:
                    offset = i / rate
                    while w + 1 < len(windows) and windows[w + 1][0] <= offset:
                        w += 1
                    window = windows[w][1]
                    window.due += 1
                    nursery.start_soon(self._one, start + offset, self.wall_start + offset, window)
                    i += 1

    async def aclose(self) -> None:
        for idle in self.idle.values():
            for conn in idle:
                await conn.stream.aclose()
            idle.clear()


async def get_json(url: str, path: str) -> Any:
    """GET ``path`` of ``url`` (``http://host:port``) on a new connection; the JSON answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return json.loads(data.partition(b"\r\n\r\n")[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["stubs"])
    parser.parse_args()
    trio.run(serve_stubs)


if __name__ == "__main__":
    main()
