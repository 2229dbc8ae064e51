"""Fuzzed intake: random deliveries to every source through the live ``POST /hooks/{source}``.

Hypothesis builds each example from a source (or an unknown one), a body, a way
of signing it and some extra headers, and sends it over real HTTP to a service
running in the test's nursery (``running_service``). Bodies: JSON objects whose
id fields are of the wrong type, JSON that is not an object, deeply nested JSON,
random bytes (mostly not UTF-8), text with NUL characters, other encodings
(UTF-16, Latin-1, a UTF-8 BOM), empty bodies, bodies one byte or more over the
limit. Signatures: right (computed here for the random body, so verified but
unstorable bodies reach the 400 branch), wrong key, missing, garbage, stale
timestamps, repeated headers, huge values, Unicode. Secrets hold non-ASCII
characters where the source allows it.

Properties, every example:

* the answer is one of 202/400/401/404/413, never a 5xx; where the example pins
  it down (a single right signature, a wrong one, an unknown source, a body over
  the limit) it is exactly the contract's answer;
* a refused delivery (anything but 202) stores nothing: ``events`` counts the
  same before and after;
* a 202 with an id stored exactly one event, whose body is byte-for-byte the
  body sent; a 202 duplicate stored nothing.

The fuzzing is synchronous (Hypothesis, httpx) and runs in a worker thread while
the service runs in the trio nursery; 300 examples take well under a minute.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import psycopg
import trio
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.support.service import SITE_SECRET, TG_SECRET, running_service, service_settings

EXAMPLES = 300
MAX_BODY = 4096
ALLOWED = {202, 400, 401, 404, 413}
#: README: a request head over about 64 KiB is refused by the HTTP server itself with 431 (a huge
#: signature beside several huge extra headers makes one now and then)
HEAD_LIMIT = 64 * 1024
SOURCES = ("telegram", "site", "github", "stripe", "standard")

# Non-ASCII secrets where the sender's scheme allows any bytes (used as their UTF-8 bytes).
SITE_KEY = "sïte-秘密-🔑"
GITHUB_KEY = "gh-ßecret-✓-ключ"
STRIPE_KEY = "whsec_ünïcødé-🔒"
STANDARD_KEY = bytes(range(7, 39))  # 32 bytes, whsec_<base64>
STANDARD_SECRET = "whsec_" + base64.b64encode(STANDARD_KEY).decode()

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # each run is its own bounded sample; no replay of old examples
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)

# every header a source reads for verification; random extra headers never use these names
SIGNATURE_HEADERS = {
    "telegram": ["x-telegram-bot-api-secret-token"],
    "site": ["x-signature"],
    "github": ["x-hub-signature-256"],
    "stripe": ["stripe-signature"],
    "standard": ["webhook-id", "webhook-timestamp", "webhook-signature"],
}
_RESERVED = {h for names in SIGNATURE_HEADERS.values() for h in names} | {
    "content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te", "trailer",
    "content-encoding",
}


@dataclass
class Case:
    """One delivery: where, what, how it is signed, and which answers are right."""

    source: str
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    expect: set[int] = field(default_factory=lambda: set(ALLOWED))
    why: str = ""


# -- bodies ----------------------------------------------------------------------------------

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
_json = st.recursive(
    _scalar,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
#: what sits where a source expects an id: strings, numbers where strings are expected, and worse
_id_value = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=300), st.floats(allow_nan=False),
    st.booleans(), st.none(), st.lists(st.integers(), max_size=2), st.just("\u0000"), st.just("🔥" * 100),
)


@st.composite
def json_objects(draw: Any, source: str) -> bytes:
    """A JSON object shaped (more or less) like what ``source`` sends, with ids of any type."""
    obj: dict[str, Any] = draw(st.dictionaries(st.text(max_size=8), _json, max_size=3))
    if source == "telegram":
        obj["update_id"] = draw(_id_value)
        if draw(st.booleans()):
            obj["message"] = {
                "message_id": draw(_id_value), "text": draw(st.one_of(st.text(max_size=30), _json)),
                "chat": draw(st.one_of(st.fixed_dictionaries({"id": _id_value}), _json)),
            }
    else:
        obj["id"] = draw(_id_value)
        if source == "stripe":
            obj["type"] = draw(st.one_of(st.text(max_size=20), st.integers()))
    return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@st.composite
def nested(draw: Any) -> bytes:
    """JSON nested up to a few hundred levels (the sources cap parsing at 128)."""
    depth = draw(st.integers(min_value=1, max_value=400))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return (opener * depth + "1" + closer * depth).encode()


def bodies(source: str) -> st.SearchStrategy[tuple[str, bytes]]:
    """(kind, body) pairs: the kind says what was meant, for the failure message."""
    other_encodings = st.tuples(
        json_objects(source).map(lambda b: json.loads(b)),
        st.sampled_from(["utf-16", "utf-16-le", "latin-1", "utf-8-sig", "utf-32"]),
    ).map(lambda pair: json.dumps(pair[0], ensure_ascii=False).encode(pair[1], "replace"))
    return st.one_of(
        json_objects(source).map(lambda b: ("object", b)),
        _json.filter(lambda v: not isinstance(v, dict)).map(lambda v: ("not an object", json.dumps(v).encode())),
        nested().map(lambda b: ("nested", b)),
        nested().map(lambda b: ("nested", b)),
        st.binary(max_size=300).map(lambda b: ("bytes", b)),
        st.text(max_size=100).map(lambda t: ("text", t.encode())),
        st.text(max_size=100).map(lambda t: ("text", t.encode())),
        st.text(max_size=50).map(lambda t: ("text with NUL", (t + "\x00" + t).encode())),
        other_encodings.map(lambda b: ("other encoding", b)),
        st.just(("empty", b"")),
        st.just(("lone surrogate escape", b'{"update_id": 7, "id": "\\ud800", "message": {"text": "\\udfff"}}')),
        st.integers(min_value=1, max_value=3000).map(lambda n: ("over the limit", b"{" + b" " * (MAX_BODY + n) + b"}")),
    )


# -- signatures --------------------------------------------------------------------------------


def _hex_hmac(key: bytes, *parts: bytes) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.hexdigest()


def signed_headers(source: str, body: bytes, *, key: bytes | None = None, t: int | None = None,
                   msg_id: str = "msg_fuzz") -> list[tuple[str, str]]:
    """The headers that make ``body`` verify at ``source`` (with ``key``, the right one by default)."""
    now = int(time.time()) if t is None else t
    if source == "telegram":
        return [("X-Telegram-Bot-Api-Secret-Token", (key or TG_SECRET.encode()).decode("utf-8", "replace"))]
    if source == "site":
        return [("X-Signature", "sha256=" + _hex_hmac(key or SITE_KEY.encode(), body))]
    if source == "github":
        return [("X-Hub-Signature-256", "sha256=" + _hex_hmac(key or GITHUB_KEY.encode(), body))]
    if source == "stripe":
        return [("Stripe-Signature", f"t={now},v1=" + _hex_hmac(key or STRIPE_KEY.encode(), f"{now}.".encode(), body))]
    signature = base64.b64encode(hmac.new(key or STANDARD_KEY, f"{msg_id}.{now}.".encode() + body,
                                          hashlib.sha256).digest()).decode()
    return [("webhook-id", msg_id), ("webhook-timestamp", str(now)), ("webhook-signature", f"v1,{signature}")]


_visible = st.from_regex(r"[!-~]{1,40}", fullmatch=True)
_header_name = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,24}", fullmatch=True).filter(
    lambda n: n.lower() not in _RESERVED
)
#: header values as raw bytes: visible ASCII, UTF-8 Unicode, Latin-1 bytes, huge ones
_header_value = st.one_of(
    _visible.map(str.encode),
    st.text(min_size=1, max_size=30).map(lambda t: t.encode()),
    st.binary(min_size=1, max_size=30).map(lambda b: bytes(c if c >= 0x80 else 0x41 for c in b)),
    st.integers(min_value=8000, max_value=12000).map(lambda n: b"x" * n),
).map(lambda v: v.strip(b" \t")).filter(bool)


@st.composite
def cases(draw: Any) -> Case:
    source = draw(st.one_of(
        st.sampled_from(SOURCES), st.sampled_from(SOURCES),
        st.text(min_size=1, max_size=20).filter(lambda s: s not in SOURCES and s not in (".", "..")),
    ), label="source")
    known = source in SOURCES
    kind, body = draw(bodies(source if known else "site"), label="body")
    case = Case(source=source, body=body)
    mode = draw(st.sampled_from(
        ["right", "right", "right", "wrong key", "missing", "garbage", "stale", "repeated", "huge", "unicode"]
    ), label="signature")
    sig_source = source if known else draw(st.sampled_from(SOURCES))
    if mode == "stale" and sig_source not in ("stripe", "standard"):
        mode = "right"  # the other schemes sign no timestamp
    msg_id = draw(st.from_regex(r"msg_[A-Za-z0-9_-]{1,40}", fullmatch=True))
    right = signed_headers(sig_source, body, msg_id=msg_id)
    if mode == "right":
        headers = right
    elif mode == "wrong key":
        headers = signed_headers(sig_source, body, key=draw(st.binary(min_size=1, max_size=40)), msg_id=msg_id)
    elif mode == "missing":
        headers = right[:-1]  # standard keeps id and timestamp: only the signature is missing
    elif mode == "garbage":
        headers = [(name, draw(_visible)) for name, _ in right]
    elif mode == "stale":
        skew = draw(st.integers(min_value=301, max_value=10**9)) * draw(st.sampled_from([-1, 1]))
        headers = signed_headers(sig_source, body, t=max(1, int(time.time()) + skew), msg_id=msg_id)
    elif mode == "repeated":
        extra = draw(st.sampled_from([right, [(n, draw(_visible)) for n, _ in right]]))
        headers = right + extra if draw(st.booleans()) else extra + right
    elif mode == "huge":
        name, value = right[-1]
        headers = [*right[:-1], (name, value + " " + "a" * draw(st.integers(min_value=8200, max_value=12000)))]
    else:  # "unicode": a right signature with non-ASCII text after it, or only non-ASCII
        name, value = right[-1]
        # (not only blanks: the source strips Unicode whitespace, "\x85" included, before its ASCII check)
        tail = draw(st.text(min_size=1, max_size=10).filter(lambda t: not t.strip().isascii()))
        headers = [*right[:-1], (name, draw(st.sampled_from([value + tail, tail])))]
    if sig_source == "github" and draw(st.booleans()):
        headers += [("X-GitHub-Delivery", draw(st.one_of(st.uuids().map(str), _visible, st.text(max_size=20)))),
                    ("X-GitHub-Event", draw(st.one_of(_visible, st.text(max_size=20))))]
    content_type = draw(st.one_of(
        st.none(),
        st.sampled_from(["application/json", "application/x-www-form-urlencoded", "text/plain; charset=utf-16",
                         "application/json; charset=latin-1", "multipart/form-data; boundary=x"]),
        st.text(max_size=30),
    ), label="content-type")
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    raw = [(n.encode(), v.encode("utf-8", "surrogatepass")) for n, v in headers]
    raw += draw(st.lists(st.tuples(_header_name.map(str.encode), _header_value), max_size=4), label="extra headers")
    if draw(st.booleans()):  # the same extra header twice, with different values
        name = draw(_header_name).encode()
        raw += [(name, draw(_header_value)), (name, draw(_header_value))]
    # HTTP/1.1 cannot carry control characters in a header value (h11 refuses to send them): such a
    # header is left out, which for a signature header means "missing" (401 either way)
    case.headers = [(n, v.strip(b" \t")) for n, v in raw if v.strip(b" \t") and _sendable(v)]

    # what the contract says for the cases it pins down
    if not known:
        case.expect, case.why = {404}, "unknown source"
    elif len(body) > MAX_BODY:
        case.expect, case.why = {413}, "body over MAX_BODY_BYTES"
    elif mode in ("wrong key", "missing", "garbage", "stale", "huge"):
        case.expect, case.why = {401}, f"signature: {mode}"
    elif mode == "right" and not _touches_signature_headers(case.headers, source):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            case.expect, case.why = {400}, "verified, not UTF-8"
        else:
            if "\x00" in text:
                case.expect, case.why = {400}, "verified, NUL in body"
            else:
                case.expect, case.why = {202}, f"verified {kind} body"
    elif mode == "unicode":
        case.expect, case.why = {401}, "non-ASCII signature header"
    case.why = f"{case.why} [{kind}; signature {mode}]"
    return case


def _sendable(value: bytes) -> bool:
    return all((byte >= 0x20 and byte != 0x7F) or byte == 0x09 for byte in value)


def _touches_signature_headers(headers: list[tuple[bytes, bytes]], source: str) -> bool:
    """True if a header the source verifies appears twice (then the outcome is the source's call)."""
    names = Counter(n.decode().lower() for n, _ in headers)
    return any(names[h] > 1 for h in SIGNATURE_HEADERS[source])


# -- the property ------------------------------------------------------------------------------


def fuzz(base_url: str, dsn: str) -> Counter[tuple[int, str]]:
    """Run the property (in a worker thread); returns how many answers of each (status, reason) were seen."""
    seen: Counter[tuple[int, str]] = Counter()
    with httpx.Client(base_url=base_url, timeout=15) as client, psycopg.connect(dsn, autocommit=True) as conn:

        def events() -> int:
            return int(conn.execute("select count(*) from events").fetchone()[0])  # type: ignore[index]

        # each case comes from its own client (through a trusted proxy): most cases fail
        # verification, and one client failing over 20 times in 10 s is refused with 429
        clients = itertools.count(1)

        @FUZZ
        @given(case=cases())
        # a body over the limit every run (the sample alone missed it now and then)
        @example(case=Case("site", b"{" + b" " * MAX_BODY + b"}", expect={413}, why="body over MAX_BODY_BYTES"))
        def property_(case: Case) -> None:
            before = events()
            n = next(clients)
            headers = [*case.headers, (b"X-Forwarded-For", f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}".encode())]
            response = client.post(f"/hooks/{quote(case.source, safe='')}", content=case.body, headers=headers)
            after = events()
            status = response.status_code
            seen[(status, case.why.split(" [")[0])] += 1
            head = sum(len(name) + len(value) + 4 for name, value in headers)  # "name: value\r\n" each
            if head > HEAD_LIMIT - 1024:  # the request line, Host and Content-Length are the rest of it
                assert status == 431 or (head <= HEAD_LIMIT and status in case.expect), f"{status}: {head} bytes"
                assert after == before, f"a refused head stored {after - before} events"
                return
            assert status < 500, f"{status} {response.text[:200]} for {case.why}"
            assert status in ALLOWED, f"{status} {response.text[:200]} for {case.why}"
            assert status in case.expect, f"{status} (expected {sorted(case.expect)}) for {case.why}: {response.text}"
            if status != 202:
                assert after == before, f"a refused delivery ({status}) stored {after - before} events: {case.why}"
                return
            answer = response.json()
            if answer.get("duplicate"):
                assert after == before, f"a duplicate stored {after - before} events"
                return
            assert after == before + 1, f"a 202 stored {after - before} events"
            stored = conn.execute("select source, body from events where id = %s", [answer["id"]]).fetchone()
            assert stored == (case.source, case.body.decode("utf-8")), "the stored body differs from the one sent"

        property_()
    return seen


async def test_random_deliveries_get_only_contract_answers_and_refused_ones_store_nothing(
    dsn: str, telegram_stub: Any
) -> None:
    settings_ = service_settings(
        dsn, telegram_stub.url, site_webhook_secret=SITE_KEY, github_webhook_secret=GITHUB_KEY,
        stripe_webhook_secret=STRIPE_KEY, standard_webhook_secret=STANDARD_SECRET, max_body_bytes=MAX_BODY,
        trusted_proxies="127.0.0.1",
    )
    assert SITE_KEY != SITE_SECRET
    async with running_service(settings_) as svc:
        with trio.fail_after(150):
            seen = await trio.to_thread.run_sync(fuzz, svc.urls[0], dsn)
    print(sorted(seen.items()))
    statuses = Counter(status for status, _ in seen.elements())
    # the sample reached every answer the contract lists (a sanity check on the strategies)
    assert set(statuses) - {431} == ALLOWED, statuses


async def test_a_github_form_body_with_a_right_signature_and_odd_payloads(dsn: str, telegram_stub: Any) -> None:
    """GitHub's form encoding: ``payload=<json>``; a payload that is not an object is stored without jobs."""
    settings_ = service_settings(dsn, telegram_stub.url, github_webhook_secret=GITHUB_KEY, max_body_bytes=MAX_BODY)
    async with running_service(settings_) as svc, httpx.AsyncClient(base_url=svc.urls[0]) as client:
        for number, payload in enumerate(['{"zen": "ok"}', "[1, 2]", "7", '"text"', "{", "", "\u00e9" * 10]):
            body = urlencode({"payload": payload}).encode()
            headers = [*signed_headers("github", body), ("X-GitHub-Delivery", f"d-{number}"),
                       ("Content-Type", "application/x-www-form-urlencoded")]
            response = await client.post("/hooks/github", content=body, headers=headers)
            assert response.status_code == 202, (payload, response.text)
            assert response.json()["jobs"] == (1 if payload == '{"zen": "ok"}' else 0), payload


async def test_headers_beyond_the_servers_limit_get_a_4xx_and_store_nothing(
    dsn: str, db: Any, telegram_stub: Any
) -> None:
    """Past ~64 KiB of headers Hypercorn itself answers 431 before autom sees the request.

    That status is not among the ones the README lists for ``/hooks`` (the route never runs);
    what matters is that it is a 4xx and nothing is stored. Up to that size the
    route answers as usual (the fuzzing above sends header values up to 12 KB each).
    """
    async with running_service(service_settings(dsn, telegram_stub.url)) as svc, \
            httpx.AsyncClient(base_url=svc.urls[0]) as client:
        ok = await client.post("/hooks/telegram", content=b"{}", headers=[
            ("X-Telegram-Bot-Api-Secret-Token", TG_SECRET), ("X-Big", "a" * 40_000)])
        assert ok.status_code == 202, ok.text
        stored = await db.fetch_val("select count(*) from events")
        for size in (100_000, 1_000_000):
            response = await client.post("/hooks/telegram", content=b"{}", headers=[
                ("X-Telegram-Bot-Api-Secret-Token", TG_SECRET), ("X-Big", "a" * size)])
            assert response.status_code in (400, 431), (size, response.status_code)
        assert await db.fetch_val("select count(*) from events") == stored
