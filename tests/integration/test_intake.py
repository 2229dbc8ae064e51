"""``POST /hooks/{source}`` over real HTTP against a real PostgreSQL (README: Sources, Operations).

Signatures are computed here with ``hmac`` from each sender's documentation, not
with the sources' own helpers, so a source that signs wrongly cannot pass by agreeing
with itself. Every refused delivery is checked to have written nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from tests.support.http_app import (
    GITHUB_SECRET,
    SITE_SECRET,
    STANDARD_KEY,
    STRIPE_SECRET,
    TELEGRAM_SECRET,
    RunningApp,
    app_settings,
    count_rows,
    running_app,
    sample,
)

# --- signing, as each sender documents it ----------------------------------------------


def telegram(update: dict[str, Any] | bytes, secret: str = TELEGRAM_SECRET) -> tuple[bytes, dict[str, str]]:
    """A Telegram delivery: the body and the secret-token header."""
    body = update if isinstance(update, bytes) else json.dumps(update).encode()
    return body, {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}


def site(body: bytes, secret: str = SITE_SECRET) -> tuple[bytes, dict[str, str]]:
    """A site delivery: ``X-Signature: sha256=<hex HMAC-SHA256 of the body>``."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"X-Signature": f"sha256={digest}", "Content-Type": "application/json"}


def github(body: bytes, delivery: str | None = None, secret: str = GITHUB_SECRET) -> tuple[bytes, dict[str, str]]:
    """A GitHub delivery: X-Hub-Signature-256 over the raw body, a delivery id, an event name."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-GitHub-Event": "push",
        "Content-Type": "application/json",
    }


def stripe(body: bytes, t: int | None = None, secret: str = STRIPE_SECRET) -> tuple[bytes, dict[str, str]]:
    """A Stripe delivery: ``Stripe-Signature: t=<unix>,v1=<hex HMAC of "t.body">`` (secret used as is)."""
    t = int(time.time()) if t is None else t
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return body, {"Stripe-Signature": f"t={t},v1={digest}", "Content-Type": "application/json"}


def standard(
    body: bytes, msg_id: str | None = None, t: int | None = None, key: bytes = STANDARD_KEY
) -> tuple[bytes, dict[str, str]]:
    """A Standard Webhooks delivery: ``v1,<base64 HMAC of "id.timestamp.body">`` keyed with the whsec_ bytes."""
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    t = int(time.time()) if t is None else t
    mac = hmac.new(key, f"{msg_id}.{t}.".encode() + body, hashlib.sha256).digest()
    return body, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(t),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
        "Content-Type": "application/json",
    }


def tg_update(update_id: int, text: str = "/ping", chat_id: int = 4242) -> dict[str, Any]:
    """A Telegram message update."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id + 1000,
            "date": 1700000000,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "T", "username": "tester"},
            "text": text,
        },
    }


# --- fixtures ----------------------------------------------------------------------------

MAX_BODY = 4096


@pytest.fixture
async def app(db: Any) -> AsyncIterator[RunningApp]:
    """The app on this test's database, every source enabled, MAX_BODY_BYTES=4096."""
    async with running_app(db, app_settings(max_body_bytes=MAX_BODY)) as running:
        yield running


async def post(app: RunningApp, source: str, delivery: tuple[bytes, dict[str, str]], **kw: Any) -> httpx.Response:
    """POST a (body, headers) delivery to /hooks/<source>."""
    body, headers = delivery
    return await app.client.post(f"/hooks/{source}", content=body, headers={**headers, **kw.pop("headers", {})}, **kw)


async def assert_nothing_written(db: Any) -> None:
    """Neither an event nor a job exists."""
    assert await count_rows(db, "events") == 0
    assert await count_rows(db, "jobs") == 0


# --- happy paths ---------------------------------------------------------------------------


async def test_telegram_message_is_stored_with_its_job_and_rings_the_doorbell(app: RunningApp, db: Any) -> None:
    rings = app.deps.doorbell.count
    body, headers = telegram(tg_update(1001))
    response = await post(app, "telegram", (body, headers))
    assert response.status_code == 202
    answer = response.json()
    assert set(answer) == {"id", "jobs"} and answer["jobs"] == 1
    assert app.deps.doorbell.count > rings  # in-process workers are woken

    event = await db.fetch_one("select * from events where id = %(id)s", {"id": answer["id"]})
    assert event["source"] == "telegram"
    assert event["dedup_key"] == "1001"
    assert event["body"].encode() == body
    jobs = await db.fetch_all("select * from jobs")
    assert len(jobs) == 1
    job = jobs[0]
    assert (job["kind"], job["event_id"], job["recipient"], job["status"]) == (
        "telegram.message", answer["id"], "4242", "pending",
    )
    assert job["payload"]["text"] == "/ping"


SOURCES = {
    "telegram": (lambda n: telegram(tg_update(n)), "telegram.message"),
    "site": (lambda n: site(json.dumps({"id": f"form-{n}", "email": "a@example.org"}).encode()), "site.form"),
    "github": (lambda n: github(json.dumps({"ref": "refs/heads/main", "n": n}).encode()), "github.event"),
    "stripe": (lambda n: stripe(json.dumps({"id": f"evt_{n}", "type": "charge.succeeded"}).encode()), "stripe.event"),
    "standard": (lambda n: standard(json.dumps({"type": "user.created", "n": n}).encode()), "standard.event"),
}


@pytest.mark.parametrize("source", list(SOURCES))
async def test_each_source_accepts_a_signed_delivery_once(app: RunningApp, db: Any, source: str) -> None:
    make, kind = SOURCES[source]
    delivery = make(7)
    first = await post(app, source, delivery)
    assert first.status_code == 202, first.text
    assert first.json()["jobs"] == 1
    again = await post(app, source, delivery)
    assert (again.status_code, again.json()) == (202, {"duplicate": True})

    assert await count_rows(db, "events") == 1
    job = await db.fetch_one("select kind, event_id from jobs")
    assert job == {"kind": kind, "event_id": first.json()["id"]}
    assert await count_rows(db, "jobs") == 1
    metrics = app.deps.metrics
    assert sample(metrics.events, source=source, outcome="accepted") == 1
    assert sample(metrics.events, source=source, outcome="duplicate") == 1
    assert metrics.registry.get_sample_value("autom_intake_seconds_count", {"source": source}) == 2


async def test_a_storm_of_identical_deliveries_stores_one_event(app: RunningApp, db: Any) -> None:
    delivery = telegram(tg_update(555))
    answers: list[dict[str, Any]] = []

    async def send() -> None:
        response = await post(app, "telegram", delivery)
        assert response.status_code == 202
        answers.append(response.json())

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(send)

    accepted = [a for a in answers if "id" in a]
    assert len(accepted) == 1 and accepted[0]["jobs"] == 1
    assert answers.count({"duplicate": True}) == 19
    assert await count_rows(db, "events") == 1
    assert await count_rows(db, "jobs") == 1


@pytest.mark.parametrize(
    "text",
    [
        '  {"id": "ws-1",\t"note": "tabs\tand  spaces"}   \n\n',
        '\r\n{"id":"crlf-1",\r\n "text":"line1\r\nline2"}\r\n',
        '{"id":"uni-1","text":"héllo wörld ✓ 😀 日本語 \\u00e9"}',
        '\ufeff{"id":"bom-1"}',
        '{"id":"dup-keys","a":1,"a":2}',
    ],
    ids=["whitespace", "crlf", "unicode", "bom", "duplicate-keys"],
)
async def test_the_stored_body_is_byte_for_byte_what_was_sent(app: RunningApp, db: Any, text: str) -> None:
    body = text.encode("utf-8")
    response = await post(app, "site", site(body))
    assert response.status_code == 202, response.text
    stored = await db.fetch_val("select body from events where id = %(id)s", {"id": response.json()["id"]})
    assert stored.encode("utf-8") == body


@pytest.mark.parametrize(
    "body",
    [b"this is not json", b"[1, 2, 3]", b'{"id": "x", "text": "\\u0000"}', b""],
    ids=["not-json", "array", "escaped-nul", "empty"],
)
async def test_a_verified_body_that_does_not_parse_is_stored_without_jobs(
    app: RunningApp, db: Any, body: bytes
) -> None:
    response = await post(app, "site", site(body))
    assert response.status_code == 202, response.text
    assert response.json()["jobs"] == 0
    stored = await db.fetch_val("select body from events where id = %(id)s", {"id": response.json()["id"]})
    assert stored.encode() == body
    assert await count_rows(db, "jobs") == 0


async def test_an_unparseable_redelivery_is_still_recognised(app: RunningApp, db: Any) -> None:
    # the dedup key comes from the header, so it survives a body that does not parse
    delivery = github(b"{not json", delivery="d-123")
    first = await post(app, "github", delivery)
    assert first.json()["jobs"] == 0
    assert (await post(app, "github", delivery)).json() == {"duplicate": True}
    assert await count_rows(db, "events") == 1


async def test_secret_bearing_headers_are_not_stored(app: RunningApp, db: Any) -> None:
    body, headers = github(b'{"zen": "hi"}')
    headers.update({
        "Authorization": "Bearer leaked",
        "Cookie": "session=leaked",
        "Proxy-Authorization": "Basic leaked",
        "X-Hub-Signature": "sha1=0123",
        "X-Custom-Thing": "Kept",
    })
    response = await post(app, "github", (body, headers))
    assert response.status_code == 202
    stored = await db.fetch_val("select headers from events")
    assert "leaked" not in json.dumps(stored)
    for name in ("authorization", "cookie", "proxy-authorization", "x-hub-signature", "x-hub-signature-256"):
        assert name not in stored
    assert stored["x-custom-thing"] == "Kept"
    assert stored["x-github-event"] == "push"
    assert stored["content-type"] == "application/json"

    await post(app, "telegram", telegram(tg_update(77)))
    tg_headers = await db.fetch_val("select headers from events where source = 'telegram'")
    assert "x-telegram-bot-api-secret-token" not in tg_headers
    assert TELEGRAM_SECRET not in json.dumps(tg_headers)


async def test_a_body_of_exactly_the_limit_is_accepted(app: RunningApp, db: Any) -> None:
    head = b'{"id":"big","pad":"'
    body = head + b"x" * (MAX_BODY - len(head) - 2) + b'"}'
    assert len(body) == MAX_BODY
    response = await post(app, "site", site(body))
    assert response.status_code == 202
    assert response.json()["jobs"] == 1


# --- refusals write nothing -------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


REFUSED = {
    "unknown-source": ("nope", telegram(tg_update(1)), 404),
    "telegram-wrong-token": ("telegram", telegram(tg_update(1), secret="wrong"), 401),
    "telegram-no-token": ("telegram", (json.dumps(tg_update(1)).encode(), {}), 401),
    "site-wrong-secret": ("site", site(b'{"id": 1}', secret="wrong"), 401),
    "site-no-signature": ("site", (b'{"id": 1}', {}), 401),
    "github-wrong-secret": ("github", github(b"{}", secret="wrong"), 401),
    "stripe-wrong-secret": ("stripe", stripe(b'{"id": "evt_1"}', secret="whsec_wrong"), 401),
    "stripe-stale": ("stripe", stripe(b'{"id": "evt_1"}', t=_now() - 3600), 401),
    "standard-wrong-key": ("standard", standard(b"{}", key=b"another-key-of-32-bytes-exactly!"), 401),
    "standard-stale": ("standard", standard(b"{}", t=_now() - 3600), 401),
    "site-not-utf8": ("site", site(b'{"id": "\xff\xfe latin \xe9"}'), 400),
    "site-nul": ("site", site(b'{"id": "a\x00b"}'), 400),
    "telegram-not-utf8": ("telegram", telegram(b'{"update_id": 1, "x": "\xc3\x28"}'), 400),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_a_refused_delivery_writes_nothing(app: RunningApp, db: Any, case: str) -> None:
    source, delivery, status = REFUSED[case]
    response = await post(app, source, delivery)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"error"}
    if status == 400:
        assert ("NUL" if case.endswith("nul") else "UTF-8") in response.json()["error"]
    await assert_nothing_written(db)
    if status != 404:
        assert sample(app.deps.metrics.events, source=source, outcome="rejected") == 1


async def test_a_disabled_source_is_unknown(db: Any) -> None:
    settings = app_settings(github_webhook_secret=None)
    async with running_app(db, settings) as app:
        response = await post(app, "github", github(b"{}"))
    assert response.status_code == 404
    await assert_nothing_written(db)


async def test_too_large_by_content_length(app: RunningApp, db: Any) -> None:
    body = b'{"id": "x", "pad": "' + b"x" * MAX_BODY + b'"}'
    response = await post(app, "site", site(body))
    assert response.status_code == 413
    assert response.json() == {"error": f"body larger than {MAX_BODY} bytes"}
    await assert_nothing_written(db)


async def test_too_large_chunked_is_refused_mid_stream(app: RunningApp, db: Any) -> None:
    body, headers = site(b'{"id": "x", "pad": "' + b"x" * (3 * MAX_BODY) + b'"}')

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    response = await app.client.post("/hooks/site", content=chunks(), headers=headers)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert response.status_code == 413
    await assert_nothing_written(db)


async def test_a_small_chunked_body_is_accepted(app: RunningApp, db: Any) -> None:
    body, headers = site(b'{"id": "chunky", "text": "in pieces"}')

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    response = await app.client.post("/hooks/site", content=chunks(), headers=headers)
    assert response.status_code == 202
    assert await db.fetch_val("select body from events") == body.decode()


# --- the order of the checks (404, 413, 401, 400, as the README lists them) ----------------------------------


async def test_unknown_source_wins_over_too_large(app: RunningApp, db: Any) -> None:
    response = await post(app, "nope", (b"x" * (2 * MAX_BODY), {}))
    assert response.status_code == 404


async def test_too_large_wins_over_bad_signature(app: RunningApp, db: Any) -> None:
    response = await post(app, "site", site(b"x" * (2 * MAX_BODY), secret="wrong"))
    assert response.status_code == 413


async def test_bad_signature_wins_over_bad_encoding(app: RunningApp, db: Any) -> None:
    response = await post(app, "site", site(b"\xff\xff", secret="wrong"))
    assert response.status_code == 401


async def test_wrong_method_and_unknown_route_answer_json(app: RunningApp) -> None:
    response = await app.client.get("/hooks/telegram")
    assert response.status_code == 405
    assert response.json() == {"error": "method not allowed"}
    assert "POST" in response.headers["allow"]
    for path in ("/nowhere", "/hooks", "/hooks/", "/hooks/telegram/extra", "//hooks/telegram"):
        response = await app.client.post(path, content=b"{}")
        assert response.status_code == 404, path
        assert response.json() == {"error": "not found"}, path


async def test_a_large_body_is_parsed_off_the_event_loop_and_stored(db: Any) -> None:
    # above the 64 KiB threshold: parse runs in a worker thread; same outcome
    body = json.dumps({"id": "large-1", "text": "é" * 100_000}).encode()
    async with running_app(db) as app:
        response = await post(app, "site", site(body))
    assert response.status_code == 202 and response.json()["jobs"] == 1
    assert (await db.fetch_val("select body from events")).encode() == body
    payload = await db.fetch_val("select payload from jobs")
    assert payload["text"] == "é" * 100_000


async def test_one_log_line_per_delivery_without_body_or_secrets(
    app: RunningApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="autom.intake")
    update = tg_update(4711, text="SENSITIVE-BODY-TEXT")
    response = await post(app, "telegram", telegram(update))
    await post(app, "telegram", telegram(update))
    await post(app, "telegram", telegram(update, secret="wrong-SENSITIVE-TOKEN"))
    records = [r for r in caplog.records if r.name == "autom.intake"]
    assert [getattr(r, "outcome", None) for r in records] == ["accepted", "duplicate", "rejected"]
    assert records[0].event_id == response.json()["id"]  # type: ignore[attr-defined]
    assert records[0].count == 1  # type: ignore[attr-defined]
    assert all(getattr(r, "source", None) == "telegram" for r in records)
    text = caplog.text + " ".join(str(r.__dict__) for r in records)
    for secret in ("SENSITIVE-BODY-TEXT", TELEGRAM_SECRET, "SENSITIVE-TOKEN"):
        assert secret not in text
