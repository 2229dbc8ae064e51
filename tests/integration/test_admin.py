"""``/admin/...`` over real HTTP against a real PostgreSQL (README, Admin API).

Reads, filters, validation and the auth wall run against the HTTP app alone
(``running_app``: no workers, so rows stay as the test made them). Retry and
replay run end to end in the whole service (``running_service``): the job the
API put back is claimed and run by the service's own workers, the Telegram stub
seeing the messages.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from autom.db import open_database
from autom.handlers import default_handlers
from autom.jobs.models import NewJob
from tests.support.http_app import TELEGRAM_SECRET, RunningApp, app_settings, client_at, running_app
from tests.support.pg import with_lock_timeout
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.service import (
    ADMIN_TOKEN,
    ALERT_CHAT,
    post_telegram,
    running_service,
    service_settings,
    telegram_update,
    wait_until,
)
from tests.support.telegram_stub import Reply

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MAX_BIGINT = 2**63 - 1

#: every admin route, with ``{job}``/``{event}`` placeholders, and its answer to a good request
ROUTES = [
    ("GET", "/admin/jobs", 200),
    ("GET", "/admin/jobs/{job}", 200),
    ("POST", "/admin/jobs/{job}/retry", 200),
    ("POST", "/admin/jobs/{job}/cancel", 200),  # after retry: each round retries, then cancels
    ("POST", "/admin/jobs/{job}/reschedule", 400),  # the token is accepted; without a body run_at is missing
    ("POST", "/admin/retry-failed", 200),
    ("GET", "/admin/events", 200),
    ("GET", "/admin/events/{event}", 200),
    ("POST", "/admin/events/{event}/replay", 202),
    ("GET", "/admin/kinds/paused", 200),
    ("POST", "/admin/kinds/{kind}/pause", 200),
    ("POST", "/admin/kinds/{kind}/resume", 200),
    ("GET", "/admin/stats", 200),
    ("GET", "/admin/recipients/{recipient}", 200),
    ("POST", "/admin/recipients/{recipient}/pause", 200),
    ("POST", "/admin/recipients/{recipient}/resume", 200),
    ("POST", "/admin/recipients/{recipient}/purge", 200),
]

#: Authorization values that must all be refused (None = no header at all)
BAD_AUTH: list[str | bytes | None] = [
    None,
    "",
    "Basic " + base64.b64encode(f"admin:{ADMIN_TOKEN}".encode()).decode(),
    f"Token {ADMIN_TOKEN}",
    ADMIN_TOKEN,
    "Bearer",
    "Bearer wrong-token",
    f"Bearer {ADMIN_TOKEN[:-1]}",
    f"Bearer {ADMIN_TOKEN}X",
    f"Bearer {ADMIN_TOKEN} extra",
    f"Bearer {ADMIN_TOKEN.upper()}",
    f"Bearer {ADMIN_TOKEN}".encode() + "é".encode(),  # raw UTF-8 bytes after the token
    b"Bearer " + ("ä" + ADMIN_TOKEN[1:]).encode("latin-1"),
]

CONTRACT_JOB_KEYS = {
    "id", "kind", "status", "attempts", "max_attempts", "run_at", "last_error", "key", "event_id", "recipient",
}


# --- helpers ------------------------------------------------------------------------------


async def insert_job(db: Any, kind: str = "test.kind", status: str = "pending", **columns: Any) -> int:
    """A job row as the test wants it (status, attempts, ...), bypassing the queue."""
    values = {"kind": kind, "status": status, **columns}
    if status in ("done", "failed"):
        values.setdefault("finished_at", "now()")
    names = ", ".join(values)
    placeholders = ", ".join("now()" if v == "now()" else f"%({k})s" for k, v in values.items())
    params = {k: (json.dumps(v) if k == "payload" else v) for k, v in values.items() if v != "now()"}
    return int(await db.fetch_val(f"insert into jobs ({names}) values ({placeholders}) returning id", params))


async def post_update(client: httpx.AsyncClient, update: dict[str, Any] | bytes) -> httpx.Response:
    """Deliver a Telegram update (or raw body) to the intake with the running_app secret."""
    body = update if isinstance(update, bytes) else json.dumps(update).encode()
    return await client.post("/hooks/telegram", content=body,
                             headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})


def route_path(path: str, job: int | str, event: int | str) -> str:
    return path.format(job=job, event=event, kind="telegram.message", recipient="42")


def ping(update_id: int, chat_id: int, text: str = "/ping") -> dict[str, Any]:
    return telegram_update(update_id, chat_id, text)


@pytest.fixture
async def app(db: Any) -> Any:
    """The HTTP app (intake, admin, metrics) on a free port, no workers."""
    async with running_app(db) as running:
        yield running


# --- authentication ----------------------------------------------------------------------


async def test_every_admin_route_refuses_missing_malformed_and_wrong_tokens(app: RunningApp, db: Any) -> None:
    event_id = (await post_update(app.client, ping(1, 42))).json()["id"]
    job_id = await db.fetch_val("select id from jobs where event_id = %s", [event_id])
    refused = []
    sent = 0
    # existing ids, unknown ids and malformed ids alike: 401 comes before 400 and 404
    for job, event in ((job_id, event_id), (987654, 987654), ("abc", "-1")):
        for method, path, _ in ROUTES:
            url = route_path(path, job, event)
            for value in BAD_AUTH:
                headers = {} if value is None else {"Authorization": value}
                # 20 from each client address: the 21st refusal within 10 s would lock its client out
                async with client_at(app.url, f"127.0.1.{sent // 20 + 1}") as client:
                    response = await client.request(method, url, headers=headers)
                sent += 1
                if (
                    response.status_code != 401
                    or response.headers.get("www-authenticate") != "Bearer"
                    or set(response.json()) != {"error"}
                ):
                    refused.append((method, url, value, response.status_code, response.text))
    assert refused == []
    # nothing was retried, cancelled, replayed or paused by the refused requests
    assert await db.fetch_val("select count(*) from jobs") == 1
    assert await db.fetch_val("select attempts from jobs") == 0
    assert await db.fetch_val("select status from jobs") == "pending"
    assert await db.fetch_val("select count(*) from paused_kinds") == 0


async def test_every_admin_route_accepts_the_right_token(app: RunningApp, db: Any) -> None:
    event_id = (await post_update(app.client, ping(1, 42))).json()["id"]
    job_id = await db.fetch_val("select id from jobs where event_id = %s", [event_id])
    for value in (f"Bearer {ADMIN_TOKEN}", f"bearer {ADMIN_TOKEN}", f"BEARER   {ADMIN_TOKEN}"):
        for method, path, status in ROUTES:
            response = await app.client.request(method, route_path(path, job_id, event_id),
                                                headers={"Authorization": value})
            assert response.status_code == status, (method, path, value, response.text)
            assert response.headers["content-type"] == "application/json"


async def test_a_client_sending_wrong_tokens_is_locked_out_and_logged_sparingly(
    app: RunningApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="autom.admin")
    wrong = {"Authorization": "Bearer wrong-token"}
    async with client_at(app.url, "127.0.0.2") as guesser:
        started = time.monotonic()
        for _ in range(21):  # more than 20 within 10 s
            assert (await guesser.get("/admin/stats", headers=wrong)).status_code == 401
        elapsed = time.monotonic() - started
        for headers in (wrong, AUTH):  # locked out for now, whatever it sends
            locked = await guesser.get("/admin/stats", headers=headers)
            assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
            assert set(locked.json()) == {"error"}
    # every other client, the right token works
    assert (await app.client.get("/admin/stats", headers=AUTH)).status_code == 200
    async with client_at(app.url, "127.0.0.3") as other:
        assert (await other.get("/admin/stats", headers=AUTH)).status_code == 200
    lines = [r for r in caplog.records if r.name == "autom.admin" and "127.0.0.2" in r.getMessage()]
    assert lines and "admin: refused (401) GET /admin/stats: invalid token" in lines[0].getMessage()
    # at most one line a second for the client (21 refusals and 2 lockouts came in ``elapsed`` s and a bit)
    assert len(lines) <= elapsed + 3, [r.getMessage() for r in lines]


async def test_a_repeated_authorization_header_is_refused(app: RunningApp) -> None:
    headers = httpx.Headers([("Authorization", AUTH["Authorization"]), ("Authorization", AUTH["Authorization"])])
    response = await app.client.get("/admin/stats", headers=headers)
    assert response.status_code == 401


async def test_without_an_admin_token_setting_everyone_is_refused(db: Any) -> None:
    async with running_app(db, app_settings(admin_token=None)) as app:
        for value in ("Bearer", "Bearer None", f"Bearer {ADMIN_TOKEN}"):
            response = await app.client.get("/admin/stats", headers={"Authorization": value})
            assert response.status_code == 401
            assert "ADMIN_TOKEN" in response.json()["error"]


# --- GET /admin/jobs ---------------------------------------------------------------------


async def test_list_is_newest_first_with_contract_fields_and_default_limit_50(app: RunningApp, db: Any) -> None:
    ids = [await insert_job(db, kind=f"k{i % 3}") for i in range(60)]
    response = await app.client.get("/admin/jobs", headers=AUTH)
    assert response.status_code == 200
    jobs = response.json()["jobs"]
    assert [j["id"] for j in jobs] == sorted(ids, reverse=True)[:50]
    assert set(jobs[0]) >= CONTRACT_JOB_KEYS


async def test_list_filters_by_status_and_kind(app: RunningApp, db: Any) -> None:
    a_pending = await insert_job(db, kind="a")
    a_failed = await insert_job(db, kind="a", status="failed", attempts=8, last_error="boom")
    b_failed = await insert_job(db, kind="b", status="failed", attempts=1, last_error="bang")
    b_done = await insert_job(db, kind="b", status="done", attempts=1)
    a_running = await insert_job(db, kind="a", status="running", attempts=1)

    async def ids(query: str) -> list[int]:
        response = await app.client.get(f"/admin/jobs{query}", headers=AUTH)
        assert response.status_code == 200, response.text
        return [j["id"] for j in response.json()["jobs"]]

    assert await ids("") == [a_running, b_done, b_failed, a_failed, a_pending]
    assert await ids("?status=failed") == [b_failed, a_failed]
    assert await ids("?status=pending") == [a_pending]
    assert await ids("?status=running") == [a_running]
    assert await ids("?status=done") == [b_done]
    assert await ids("?kind=a") == [a_running, a_failed, a_pending]
    assert await ids("?kind=a&status=failed") == [a_failed]
    assert await ids("?kind=nope") == []
    assert await ids("?limit=2") == [a_running, b_done]
    assert await ids("?status=failed&limit=1") == [b_failed]
    # empty values mean "not given"
    assert await ids("?status=&kind=&limit=") == [a_running, b_done, b_failed, a_failed, a_pending]
    assert await ids("?limit=1000") == [a_running, b_done, b_failed, a_failed, a_pending]
    failed = (await app.client.get(f"/admin/jobs/{a_failed}", headers=AUTH)).json()
    assert (failed["status"], failed["attempts"], failed["last_error"]) == ("failed", 8, "boom")


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus", "status=FAILED", "status=failed%20", "status=pending,failed",
        "limit=0", "limit=1001", "limit=-1", "limit=abc", "limit=1.5", "limit=1e3", "limit=%2B5", "limit=%205",
        "limit=99999999999999999999999", "limit=%D9%A1",  # Arabic-Indic digit one: int() would take it
        "kind=a%00b", "colour=blue", "status=failed&page=3", "status=failed&status=done", "recipient=a%0Ab",
        "event_id=0", "event_id=x", "before=-1", "since=yesterday", "until=2026-13-01", "kind=" + "k" * 201,
    ],
)
async def test_list_rejects_malformed_parameters_with_one_line_400(app: RunningApp, query: str) -> None:
    response = await app.client.get(f"/admin/jobs?{query}", headers=AUTH)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error and "\n" not in error


@pytest.mark.parametrize("value", ["999999d", "0001-01-01T00:00:00%2B14:00", "9999-12-31T23:59:59-14:00"])
async def test_a_time_out_of_range_is_400_naming_it_everywhere(app: RunningApp, value: str) -> None:
    for method, path in (("GET", "/admin/jobs"), ("GET", "/admin/events"), ("POST", "/admin/retry-failed")):
        for name in ("since", "until") if method == "GET" else ("since",):
            response = await app.client.request(method, f"{path}?{name}={value}", headers=AUTH)
            assert response.status_code == 400, (path, name, value, response.text)
            assert response.json()["error"].startswith(f"{name} "), response.text


async def test_every_admin_answer_is_no_store_and_nosniff(app: RunningApp) -> None:
    for method, path, headers in (("GET", "/admin/stats", AUTH), ("GET", "/admin/stats", {}),
                                  ("GET", "/admin/jobs?colour=red", AUTH), ("GET", "/admin/jobs/424242", AUTH),
                                  ("GET", "/admin/nope", AUTH), ("PUT", "/admin/stats", AUTH),
                                  ("POST", "/admin/retry-failed", AUTH)):
        response = await app.client.request(method, path, headers=headers)
        assert response.headers.get("cache-control") == "no-store", (method, path, response.status_code)
        assert response.headers.get("x-content-type-options") == "nosniff", (method, path)


# --- GET /admin/jobs/{id}, /admin/events/{id} -------------------------------------------------


async def test_get_job_and_its_event(app: RunningApp, db: Any) -> None:
    body = json.dumps(ping(77, 42, "/ping  héllo")).encode()
    answer = (await post_update(app.client, body)).json()
    event = (await app.client.get(f"/admin/events/{answer['id']}", headers=AUTH)).json()
    assert {"id", "source", "received_at", "dedup_key", "body", "headers", "job_ids"} <= set(event)
    assert (event["id"], event["source"], event["dedup_key"]) == (answer["id"], "telegram", "77")
    assert event["body"].encode() == body  # byte for byte
    assert "x-telegram-bot-api-secret-token" not in event["headers"]  # never stored
    assert len(event["job_ids"]) == 1

    response = await app.client.get(f"/admin/jobs/{event['job_ids'][0]}", headers=AUTH)
    assert response.status_code == 200
    job = response.json()
    assert job["id"] == event["job_ids"][0]
    assert (job["kind"], job["status"], job["attempts"], job["max_attempts"]) == ("telegram.message", "pending", 0, 8)
    assert (job["key"], job["event_id"], job["recipient"]) == ("telegram:77", answer["id"], "42")
    assert job["payload"]["text"] == "/ping  héllo"
    assert job["run_at"].endswith("+00:00") or "T" in job["run_at"]  # ISO 8601


async def test_event_without_jobs_lists_none(app: RunningApp) -> None:
    answer = (await post_update(app.client, b"not json at all")).json()
    assert answer["jobs"] == 0
    event = (await app.client.get(f"/admin/events/{answer['id']}", headers=AUTH)).json()
    assert (event["job_ids"], event["body"], event["dedup_key"]) == ([], "not json at all", None)


@pytest.mark.parametrize("path", ["/admin/jobs/{}", "/admin/jobs/{}/retry", "/admin/events/{}",
                                  "/admin/events/{}/replay"])
async def test_unknown_ids_are_404_and_malformed_ids_400(app: RunningApp, path: str) -> None:
    method = "POST" if path.endswith(("retry", "replay")) else "GET"
    for ident in ("987654", str(MAX_BIGINT)):
        response = await app.client.request(method, path.format(ident), headers=AUTH)
        assert response.status_code == 404, (ident, response.text)
        assert "no " in response.json()["error"]
    for ident in ("abc", "-1", "0", "00", "1e3", "1.0", "+1", "%201", "1%20", "0x10", "1_0", "%D9%A1",
                  str(MAX_BIGINT + 1), "9" * 40, "%00", "%E2%80%8B1"):
        response = await app.client.request(method, path.format(ident), headers=AUTH)
        assert response.status_code == 400, (ident, response.text)
        assert "positive integer" in response.json()["error"]


# --- GET /admin/stats --------------------------------------------------------------------------


async def test_stats_counts_by_status_and_kind(app: RunningApp, db: Any) -> None:
    empty = (await app.client.get("/admin/stats", headers=AUTH)).json()
    assert empty == {"jobs": {"pending": 0, "running": 0, "done": 0, "failed": 0, "cancelled": 0}, "by_kind": {},
                     "queue_lag_seconds": 0.0, "failed_last_hour": 0, "paused_kinds": []}
    await insert_job(db, kind="a", run_at="2000-01-01T00:00:00Z")  # due for a long time: lag
    await insert_job(db, kind="a", status="failed")
    await insert_job(db, kind="b", status="failed")
    await insert_job(db, kind="b", status="done")
    stats = (await app.client.get("/admin/stats", headers=AUTH)).json()
    assert stats["jobs"] == {"pending": 1, "running": 0, "done": 1, "failed": 2, "cancelled": 0}
    assert stats["by_kind"] == {"a": {"pending": 1, "failed": 1}, "b": {"failed": 1, "done": 1}}
    assert stats["queue_lag_seconds"] > 20 * 365 * 86400
    assert stats["failed_last_hour"] == 2


# --- retry and replay in the running service ---------------------------------------------------


async def test_retry_a_failed_job_and_the_service_runs_it_to_done(dsn: str, db: Any, telegram_stub: Any) -> None:
    # the first answer to chat 9 is a permanent 400: the job fails for good after one attempt
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found")], chat_id=9)
    async with (
        running_service(service_settings(dsn, telegram_stub.url)) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
    ):
        event_id = (await post_telegram(client, telegram_update(5, 9, "/ping"))).json()["id"]
        job_id = (await client.get(f"/admin/events/{event_id}")).json()["job_ids"][0]

        async def status() -> str:
            return str((await client.get(f"/admin/jobs/{job_id}")).json()["status"])

        await wait_until(lambda: _equals(status(), "failed"))
        failed = (await client.get("/admin/jobs?status=failed")).json()["jobs"]
        assert [j["id"] for j in failed] == [job_id]
        assert "chat not found" in failed[0]["last_error"]
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)

        response = await client.post(f"/admin/jobs/{job_id}/retry")
        assert response.status_code == 200
        job = response.json()
        # the answer is the job as the retry left it, even when a worker claims it at once
        assert (job["id"], job["status"], job["attempts"], job["finished_at"]) == (job_id, "pending", 0, None)

        await wait_until(lambda: _equals(status(), "done"))
        assert (await client.get(f"/admin/jobs/{job_id}")).json()["attempts"] == 1
        assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=9)] == ["pong", "pong"]

        # a done job cannot be retried: replay its event instead
        response = await client.post(f"/admin/jobs/{job_id}/retry")
        assert response.status_code == 409
        assert "replay" in response.json()["error"]
        assert len(telegram_stub.calls_of("sendMessage", chat_id=9)) == 2


async def test_retry_of_a_running_job_is_409(dsn: str, db: Any, telegram_stub: Any) -> None:
    release = trio.Event()

    async def blocking(ctx: Any, job: Any) -> None:
        await release.wait()

    handlers = {**default_handlers(), "test.block": blocking}
    async with (
        running_service(service_settings(dsn, telegram_stub.url), handlers=handlers) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
    ):
        job_id = await svc.deps.store.enqueue(NewJob("test.block"))
        svc.deps.doorbell.set()
        await wait_until(lambda: db.fetch_val("select status = 'running' from jobs where id = %s", [job_id]))
        response = await client.post(f"/admin/jobs/{job_id}/retry")
        assert response.status_code == 409
        assert "running" in response.json()["error"]
        release.set()
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [job_id]))
        assert (await client.get(f"/admin/jobs/{job_id}")).json()["attempts"] == 1


async def test_retry_of_a_pending_job_makes_it_due_now(app: RunningApp, db: Any) -> None:
    job_id = await insert_job(db, attempts=3, run_at="2999-01-01T00:00:00Z", last_error="earlier")
    response = await app.client.post(f"/admin/jobs/{job_id}/retry", headers=AUTH)
    assert response.status_code == 200
    job = response.json()
    assert (job["status"], job["attempts"]) == ("pending", 0)
    assert job["run_at"] < "2999"
    assert app.deps.doorbell.count >= 1


async def test_replay_creates_the_jobs_anew_also_when_they_exist_and_are_done(
    dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with (
        running_service(service_settings(dsn, telegram_stub.url)) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
    ):
        event_id = (await post_telegram(client, telegram_update(6, 11, "/ping"))).json()["id"]
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=11)
        first_job = (await client.get(f"/admin/events/{event_id}")).json()["job_ids"][0]
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [first_job]))

        # the job is done, its key exists: a replay still runs it again, as a new job with a distinct key
        response = await client.post(f"/admin/events/{event_id}/replay")
        assert response.status_code == 202
        created = response.json()["jobs"]
        assert len(created) == 1 and created[0] != first_job
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(2, method="sendMessage", chat_id=11)
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [created[0]]))
        job = (await client.get(f"/admin/jobs/{created[0]}")).json()
        assert (job["event_id"], job["kind"]) == (event_id, "telegram.message")
        assert job["key"].startswith("telegram:6:replay:")

        # and again: every replay is new work, linked to the same event
        again = (await client.post(f"/admin/events/{event_id}/replay")).json()["jobs"]
        assert len(again) == 1 and again[0] not in (first_job, created[0])
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(3, method="sendMessage", chat_id=11)
        event = (await client.get(f"/admin/events/{event_id}")).json()
        assert event["job_ids"] == [first_job, created[0], again[0]]


async def test_replay_of_an_unparsable_or_unknown_source_event_is_409(app: RunningApp, db: Any) -> None:
    unparsable = (await post_update(app.client, b'{"no": "update id"}')).json()
    response = await app.client.post(f"/admin/events/{unparsable['id']}/replay", headers=AUTH)
    assert response.status_code == 409
    assert "does not parse" in response.json()["error"]

    unknown = await db.fetch_val(
        "insert into events (source, body, headers) values ('retired', '{}', '{}') returning id"
    )
    response = await app.client.post(f"/admin/events/{unknown}/replay", headers=AUTH)
    assert response.status_code == 409
    assert "source 'retired', which autom does not know" in response.json()["error"]
    assert await db.fetch_val("select count(*) from jobs") == 0


async def test_a_query_the_database_refuses_to_finish_is_503_in_one_line(dsn: str, db: Any, telegram_stub: Any) -> None:
    # real contention: another session holds the rows; the service's sessions give up
    # waiting after lock_timeout (DATABASE_URL options, as an operator would set it)
    job_id = await insert_job(db, status="failed", attempts=8, last_error="boom")
    event_id = await db.fetch_val(
        "insert into events (source, headers, body) values ('site', '{}', '{\"id\": \"f1\"}') returning id")
    settings = service_settings(with_lock_timeout(dsn), telegram_stub.url)
    async with running_service(settings) as svc, httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client:
        async with db.transaction() as tx:
            await tx.execute("select 1 from jobs where id = %s for update", [job_id])
            await tx.execute("select 1 from events where id = %s for update", [event_id])
            answers = [await client.post(f"/admin/jobs/{job_id}/retry"),
                       await client.post(f"/admin/events/{event_id}/replay")]
        for response in answers:
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json() == {"error": "database busy: a row or table it needs is locked by another "
                                                "transaction (lock timeout); try again in a moment"}
        # the service is fine: once the lock is gone the same requests succeed
        assert (await client.post(f"/admin/jobs/{job_id}/retry")).status_code == 200
        assert (await client.post(f"/admin/events/{event_id}/replay")).status_code == 202
        health = await client.get("/health")
        assert health.status_code == 200


async def test_admin_answers_are_json_even_for_bodies_and_odd_methods(app: RunningApp) -> None:
    # a body on a POST that takes no field is a 400 unless it is empty or {}; odd methods get a JSON 405
    response = await app.client.post("/admin/jobs/1/retry", headers=AUTH, content=b"\xff\x00 garbage")
    assert (response.status_code, response.headers["content-type"]) == (400, "application/json")
    response = await app.client.post("/admin/jobs/1/retry", headers=AUTH, content=b"{}")
    assert (response.status_code, response.headers["content-type"]) == (404, "application/json")
    response = await app.client.delete("/admin/jobs/1", headers=AUTH)
    assert response.status_code == 405 and "error" in response.json()
    response = await app.client.get("/admin/nothing-here", headers=AUTH)
    assert response.status_code == 404 and "error" in response.json()


# --- the database is down ---------------------------------------------------------------------


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


async def test_database_down_is_503_after_auth_and_recovers(pg: RestartablePg) -> None:
    async with (
        open_database(pg.dsn, min_size=1, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db,
        running_app(db) as app,
    ):
        event_id = (await post_update(app.client, ping(1, 5))).json()["id"]
        await trio.to_thread.run_sync(pg.stop)
        for method, path, status in ROUTES:
            url = route_path(path, 1, event_id)
            response = await app.client.request(method, url)
            assert response.status_code == 401, url  # auth needs no database
            response = await app.client.request(method, url, headers=AUTH)
            if status == 400:  # a request ROUTES makes malformed on purpose: refused before the database
                assert response.status_code == 400, url
                continue
            assert (response.status_code, response.json()) == (503, {"error": "database unavailable"}), url
        # malformed input is still 400, database or not
        assert (await app.client.get("/admin/jobs?limit=0", headers=AUTH)).status_code == 400
        assert (await app.client.get("/admin/jobs/abc", headers=AUTH)).status_code == 400

        await trio.to_thread.run_sync(pg.start)
        with trio.fail_after(10):
            while (await app.client.get("/admin/stats", headers=AUTH)).status_code == 503:
                await trio.sleep(0.1)
        stats = (await app.client.get("/admin/stats", headers=AUTH)).json()
        assert stats["jobs"]["pending"] == 1


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


# --- GET /openapi.json ----------------------------------------------------------------------------


async def test_openapi_describes_every_route_without_auth(app: RunningApp) -> None:
    response = await app.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    operations = {(method.upper(), path): op for path, ops in document["paths"].items() for method, op in ops.items()}
    # ROUTES in the description's spelling: /admin/jobs/{job_id}, ...
    admin = {(method, re.sub(r"\{(job|event)\}", r"{\1_id}", path)): status for method, path, status in ROUTES}
    others = {("POST", "/hooks/{source}"), ("GET", "/health"), ("GET", "/metrics"), ("GET", "/openapi.json")}
    assert set(operations) == set(admin) | others
    for key, status in admin.items():
        op, codes = operations[key], set(operations[key]["responses"])
        assert op["security"] == [{"adminToken": []}]
        assert {str(status), "401", "429", "503"} <= codes
        if "_id}" in key[1]:
            assert {"400", "404"} <= codes
    for key in others:
        assert "security" not in operations[key]
    assert set(operations[("POST", "/hooks/{source}")]["responses"]) >= {"202", "400", "401", "404", "413", "503"}
    assert document["components"]["securitySchemes"]["adminToken"]["scheme"] == "bearer"
