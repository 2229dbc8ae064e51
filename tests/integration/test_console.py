"""The console (``/ui/``) over real HTTP against a real PostgreSQL: its security rules and its pages.

The browser tests (tests/e2e/test_console_browser.py) drive the same pages in Chromium;
these check what a browser hides: status codes, headers, cookies, the HTML as sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from autom.errors import PermanentError
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from autom.web.console.auth import COOKIE, Sessions, cross_site
from tests.integration.test_admin import insert_job, ping, post_update
from tests.support.http_app import RunningApp, app_settings, client_at, running_app
from tests.support.queue import claim_one, fail
from tests.support.service import ADMIN_TOKEN

TOKEN = ADMIN_TOKEN

#: every console page (GET) and action (POST); {job}/{event} filled in per test
PAGES = ["/ui/", "/ui/jobs", "/ui/jobs/{job}", "/ui/events", "/ui/events/{event}", "/ui/retry-failed", "/ui/audit"]
ACTIONS = ["/ui/jobs/{job}/retry", "/ui/jobs/{job}/cancel", "/ui/events/{event}/replay", "/ui/retry-failed",
           "/ui/kinds/pause", "/ui/kinds/resume", "/ui/logout"]


@pytest.fixture
async def app(db: Any) -> Any:
    async with running_app(db) as running:
        yield running


async def login(client: httpx.AsyncClient, token: str = TOKEN, **headers: str) -> httpx.Response:
    return await client.post("/ui/login", data={"token": token}, headers=headers)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF field in the page"
    return match.group(1)


@asynccontextmanager
async def logged_in(app: RunningApp) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client with a session, and the session's CSRF token."""
    async with httpx.AsyncClient(base_url=app.url, timeout=10.0) as client:
        response = await login(client)
        assert response.status_code == 303, response.text
        page = await client.get("/ui/")
        assert page.status_code == 200, page.text
        yield client, csrf_of(page.text)


async def seeded(app: RunningApp, db: Any) -> tuple[int, int]:
    event = (await post_update(app.client, ping(1, 42))).json()["id"]
    job = int(await db.fetch_val("select id from jobs where event_id = %s", [event]))
    return job, event


async def test_every_page_and_action_without_a_session_redirects_to_login(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)
    for path in PAGES:
        url = path.format(job=job, event=event)
        response = await app.client.get(url)
        assert response.status_code == 302, (url, response.status_code)
        assert response.headers["location"].startswith("/ui/login"), url
    for path in ACTIONS:
        response = await app.client.post(path.format(job=job, event=event), data={"csrf": "x", "kind": "k"})
        assert (response.status_code, response.headers["location"]) == (303, "/ui/login"), path
    # a forged or expired cookie is no session either
    for cookie in ("v1.1.abc.def", "garbage", "v1.99999999999.n." + "0" * 64):
        async with httpx.AsyncClient(base_url=app.url, cookies={COOKIE: cookie}) as client:
            assert (await client.get("/ui/")).status_code == 302
    assert await db.fetch_val("select status from jobs where id = %s", [job]) == "pending"


async def test_login_sets_a_strict_httponly_cookie_and_goes_back_where_it_came_from(app: RunningApp) -> None:
    redirect = await app.client.get("/ui/jobs?status=failed")
    assert redirect.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%3Fstatus%3Dfailed"
    form = await app.client.get(redirect.headers["location"])
    assert form.status_code == 200 and 'name="token"' in form.text and 'type="password"' in form.text
    async with httpx.AsyncClient(base_url=app.url) as client:
        response = await client.post("/ui/login", data={"token": TOKEN, "next": "/ui/jobs?status=failed"})
        assert (response.status_code, response.headers["location"]) == (303, "/ui/jobs?status=failed")
        cookie = response.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui/" in cookie
        assert "Secure" not in cookie  # plain http here; see the proxy case below
        assert TOKEN not in cookie
        assert (await client.get("/ui/jobs?status=failed")).status_code == 200
        # never to another site after login
        for target in ("https://evil.example/", "//evil.example/ui/", "/ui/..//evil", "/hooks/x"):
            response = await client.post("/ui/login", data={"token": TOKEN, "next": target})
            assert response.headers["location"] == "/ui/", target
    async with httpx.AsyncClient(base_url=app.url) as client:
        response = await login(client, **{"X-Forwarded-Proto": "https"})
        assert "Secure" in response.headers["set-cookie"]


async def test_a_wrong_token_is_refused_and_a_client_that_keeps_failing_is_locked_out(app: RunningApp) -> None:
    async with client_at(app.url, "127.0.0.2") as client:
        for _ in range(21):  # more than 20 within 10 s, as for /hooks
            response = await login(client, token="wrong")
            assert response.status_code == 401 and "not the ADMIN_TOKEN" in response.text
            assert "set-cookie" not in response.headers
        limited = await login(client)  # this client waits now, even with the right token
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert "set-cookie" not in limited.headers and "wait" in limited.text
    # ... but only this client
    assert (await login(app.client)).status_code == 303


async def test_wrong_logins_from_many_clients_never_lock_out_the_right_token(app: RunningApp) -> None:
    # the issue's attack: 55 wrong tokens from 11 addresses (a global cap of 50 a minute locked everyone out)
    for n in range(2, 13):
        async with client_at(app.url, f"127.0.0.{n}") as client:
            for _ in range(5):
                assert (await login(client, token="wrong")).status_code == 401
    async with client_at(app.url, "127.0.0.13") as client:
        response = await login(client)
        assert response.status_code == 303 and COOKIE in response.headers["set-cookie"]
    # and a client that failed, but not too often, still gets in with the right token
    async with client_at(app.url, "127.0.0.2") as client:
        assert (await login(client)).status_code == 303


async def test_behind_a_trusted_proxy_failed_logins_count_per_forwarded_client(db: Any) -> None:
    async with running_app(db, app_settings(trusted_proxies="127.0.0.1")) as app:
        for _ in range(21):
            response = await login(app.client, token="wrong", **{"X-Forwarded-For": "203.0.113.7"})
            assert response.status_code == 401
        assert (await login(app.client, **{"X-Forwarded-For": "203.0.113.7"})).status_code == 429
        # another client behind the same proxy is not locked out by the guesser
        assert (await login(app.client, **{"X-Forwarded-For": "198.51.100.2"})).status_code == 303


async def test_logout_ends_the_session_on_the_server_a_replayed_cookie_is_no_session(
    app: RunningApp, db: Any
) -> None:
    await db.execute("insert into service_state (name, value) values ('console session ended old', "
                     "'{\"until\": \"2020-01-01T00:00:00Z\"}')")
    async with logged_in(app) as (client, csrf):
        cookie = client.cookies[COOKIE]
        response = await client.post("/ui/logout", data={"csrf": csrf})
        # one row per logged-out session, until its cookie would have expired: older ones go
        names = [r["name"] for r in await db.fetch_all("select name from service_state where name like 'console%'")]
        assert names == [f"console session ended {cookie.split('.')[2]}"]
        assert (response.status_code, response.headers["location"]) == (303, "/ui/login")
        assert 'Max-Age=0' in response.headers["set-cookie"] or "expires" in response.headers["set-cookie"].lower()
        assert (await client.get("/ui/")).status_code == 302
    # the same cookie, replayed (copied before the logout): no session, on this replica or any other
    async with httpx.AsyncClient(base_url=app.url, cookies={COOKIE: cookie}) as replay:
        page = await replay.get("/ui/jobs")
        assert (page.status_code, page.headers["location"]) == (302, "/ui/login?next=%2Fui%2Fjobs")
        action = await replay.post("/ui/kinds/pause", data={"csrf": csrf, "kind": "site.form"})
        assert (action.status_code, action.headers["location"]) == (303, "/ui/login")
        form = await replay.get("/ui/login")  # the form, not a redirect back to /ui/ (a loop)
        assert form.status_code == 200 and 'name="token"' in form.text
    # another session is untouched, and logging in again works
    async with logged_in(app) as (client, _):
        assert (await client.get("/ui/jobs")).status_code == 200


async def test_a_post_without_the_csrf_token_or_from_another_site_is_403(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)
    async with logged_in(app) as (client, csrf):
        for path in ACTIONS:
            url = path.format(job=job, event=event)
            for data in ({"kind": "k"}, {"csrf": "", "kind": "k"}, {"csrf": "0" * 64, "kind": "k"},
                         {"csrf": "é" * 64, "kind": "k"}, {"csrf": "\u202e", "kind": "k"}):  # compare_digest: str
                response = await client.post(url, data=data)
                assert response.status_code == 403, (url, data, response.status_code)
                assert "text/html" in response.headers["content-type"]
            for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                            {"Origin": "https://evil.example"}, {"Origin": "null"}):
                response = await client.post(url, data={"csrf": csrf, "kind": "k"}, headers=headers)
                assert response.status_code == 403, (url, headers)
        # nothing happened
        assert await db.fetch_val("select status from jobs where id = %s", [job]) == "pending"
        assert await db.fetch_val("select count(*) from jobs") == 1
        assert await db.fetch_val("select count(*) from paused_kinds") == 0
        # the same origin passes (the browser's own headers)
        same = await client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf},
                                 headers={"Sec-Fetch-Site": "same-origin", "Origin": app.url})
        assert same.status_code == 303 and same.headers["location"].startswith(f"/ui/jobs/{job}?notice=cancelled&seal=")


async def test_every_answer_carries_a_csp_without_scripts(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)
    async with logged_in(app) as (client, _):
        for path in [*PAGES, "/ui/login", "/ui/jobs/999999", "/ui/jobs?status=bogus"]:
            response = await client.get(path.format(job=job, event=event))
            csp = response.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src" not in csp and "unsafe-inline" not in csp, path
            assert response.headers["x-frame-options"] == "DENY"
            assert "<script" not in response.text and " style=" not in response.text, path
            for ref in re.findall(r'(?:href|src|action)="([^"]+)"', response.text):
                assert ref.startswith(("/ui/", "?")) or ref == "/ui", (path, ref)  # nothing from elsewhere
        css = await client.get("/ui/static/console.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


async def test_sender_values_are_escaped_everywhere(app: RunningApp, db: Any) -> None:
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    store = JobStore(db)
    event_id = await db.fetch_val(
        "insert into events (source, headers, body, dedup_key) values ('site', %s, %s, %s) returning id",
        [json.dumps({"x-evil": evil}), json.dumps({"text": evil}), evil])
    job = await store.enqueue(NewJob(evil[:60], {"text": evil}, recipient=evil, key=evil, event_id=event_id))
    await db.execute("update jobs set status = 'failed', last_error = %s, finished_at = now() where id = %s",
                     [evil, job])
    async with logged_in(app) as (client, _):
        for path in (f"/ui/jobs/{job}", f"/ui/events/{event_id}", "/ui/jobs", "/ui/jobs?status=failed",
                     "/ui/events", "/ui/", f"/ui/jobs?kind={evil}", f"/ui/jobs?recipient={evil}"):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
            assert "<script>" not in response.text and "<img" not in response.text, path
        page = (await client.get(f"/ui/jobs/{job}")).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_a_lone_surrogate_in_a_stored_body_is_shown_escaped_not_a_500(app: RunningApp, db: Any) -> None:
    # a JSON escape of an unpaired surrogate is valid JSON text (PostgreSQL stores the escape)
    # but its decoded string cannot be sent as UTF-8
    body = '{"text": "\\ud800 alone", "more": ["\\udfff"]}'
    event_id = await db.fetch_val("insert into events (source, headers, body, dedup_key) "
                                  "values ('site', '{}', %s, 'k1') returning id", [body])
    async with logged_in(app) as (client, _):
        page = await client.get(f"/ui/events/{event_id}")
        assert page.status_code == 200, page.text[:300]
        json_part = page.text.split("Body as JSON", 1)[1].split("Body as sent", 1)[0]
        assert "\\ud800 alone" in json_part and "\\udfff" in json_part
        assert (await client.get("/ui/events")).status_code == 200


async def test_bidi_and_control_characters_in_stored_text_are_shown_escaped(app: RunningApp, db: Any) -> None:
    rlo = "\u202e"
    event_id = await db.fetch_val(
        "insert into events (source, headers, body, dedup_key) values ('site', %s, %s, %s) returning id",
        [json.dumps({"x-name": f"a{rlo}b"}), json.dumps({"text": f"c{rlo}d\x1b[2J"}), f"key{rlo}1"])
    job = await JobStore(db).enqueue(NewJob(f"site.{rlo}form", {"t": f"e{rlo}f"}, recipient=f"r{rlo}1",
                                            key=f"k{rlo}2", event_id=event_id))
    await db.execute("update jobs set status = 'failed', last_error = %s, finished_at = now() where id = %s",
                     [f"RuntimeError: {rlo}gnorts\u2066x\u2069 \x1b[31mred", job])
    async with logged_in(app) as (client, _):
        for path in (f"/ui/jobs/{job}", f"/ui/events/{event_id}", "/ui/jobs", "/ui/jobs?status=failed",
                     "/ui/events", "/ui/"):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
            for hidden in (rlo, "\u2066", "\u2069", "\x1b"):
                assert hidden not in response.text, (path, hidden)
        page = (await client.get(f"/ui/jobs/{job}")).text
        assert "RuntimeError: \\u202egnorts\\u2066x\\u2069 \\x1b[31mred" in page
        assert "k\\u202e2" in page and "r\\u202e1" in page and "site.\\u202eform" in page
        event = (await client.get(f"/ui/events/{event_id}")).text
        assert "a\\u202eb" in event and "key\\u202e1" in event and "c\\u202ed" in event


async def test_a_worker_replica_answers_every_console_path_404(db: Any) -> None:
    async with running_app(db, app_settings(role="worker")) as app:
        for method, path in (("GET", "/ui/"), ("GET", "/ui/login"), ("GET", "/ui/jobs?status=failed"),
                             ("GET", "/ui/jobs/1"), ("POST", "/ui/login"), ("GET", "/ui/static/console.css")):
            response = await app.client.request(method, path)
            assert response.status_code == 404, (method, path, response.status_code, response.text[:200])
            assert "no such console page" in response.text
        assert (await app.client.get("/admin/stats")).status_code == 404


async def test_job_page_shows_payload_attempts_and_acts(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {"name": "Ada", "n": 1}, max_attempts=3))
    claimed = await claim_one(store)
    assert claimed is not None
    await fail(store, claimed, PermanentError("crm: HTTP 400 Bad Request: no such list"))
    async with logged_in(app) as (client, csrf):
        page = (await client.get(f"/ui/jobs/{job_id}")).text
        assert '"name": "Ada"' in page.replace("&#34;", '"')
        assert "Bad Request: no such list (PermanentError: crm: HTTP 400)" in page
        assert ">Retry</button>" in page and ">Cancel</button>" not in page
        assert "failed" in page and "1 of 3" in page
        response = await client.post(f"/ui/jobs/{job_id}/retry", data={"csrf": csrf})
        assert response.status_code == 303
        page = (await client.get(response.headers["location"])).text
        assert "Put back in the queue" in page and ">Cancel</button>" in page
        assert (await client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})).status_code == 303
        assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "cancelled"
        again = await client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
        assert again.status_code == 409 and "only a pending or running job" in again.text
        assert (await client.get("/ui/jobs/424242")).status_code == 404
        assert (await client.get("/ui/jobs/abc")).status_code == 400


async def test_jobs_list_filters_pages_and_clamps(app: RunningApp, db: Any) -> None:
    ids = [await insert_job(db, kind="k.a" if i % 2 else "k.b", recipient=str(i % 3)) for i in range(7)]
    async with logged_in(app) as (client, _):
        page = (await client.get("/ui/jobs?kind=k.a&limit=2")).text
        shown = [int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">', page)]
        assert shown == [ids[5], ids[3]]
        older = re.search(r'href="/ui/jobs\?([^"]+)">Older', page)
        assert older and f"before={ids[3]}" in older.group(1).replace("&amp;", "&")
        page2 = (await client.get("/ui/jobs?" + older.group(1).replace("&amp;", "&"))).text
        assert [int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">', page2)] == [ids[1]]
        assert "Newest" in page2
        assert [int(x) for x in re.findall(r'<a href="/ui/jobs/(\d+)">', (
            await client.get("/ui/jobs?recipient=0")).text)] == [ids[6], ids[3], ids[0]]
        for bad in ("limit=201", "limit=0", "status=nope", "colour=red", "since=whenever", "event_id=-3"):
            response = await client.get(f"/ui/jobs?{bad}")
            assert response.status_code == 400, bad
            assert 'class="error"' in response.text


async def test_a_time_out_of_range_is_400_naming_it_on_every_page(app: RunningApp) -> None:
    async with logged_in(app) as (client, csrf):
        for path in ("/ui/jobs?since=999999d", "/ui/jobs?until=999999d", "/ui/events?since=999999d",
                     "/ui/retry-failed?since=999999d", "/ui/jobs?since=0001-01-01T00:00:00%2B14:00"):
            response = await client.get(path)
            assert response.status_code == 400, (path, response.status_code)
            assert ">since is out of range" in response.text or ">until is out of range" in response.text, path
        response = await client.post("/ui/retry-failed", data={"csrf": csrf, "since": "999999d"})
        assert response.status_code == 400 and "since is out of range" in response.text


async def test_event_page_replay_and_events_list(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)
    async with logged_in(app) as (client, csrf):
        page = (await client.get(f"/ui/events/{event}")).text
        assert f'href="/ui/jobs/{job}"' in page and ">Replay</button>" in page
        assert "update_id" in page  # the body, as JSON and raw
        response = await client.post(f"/ui/events/{event}/replay", data={"csrf": csrf})
        assert response.status_code == 303
        page = (await client.get(response.headers["location"])).text
        new = await db.fetch_val("select max(id) from jobs where event_id = %s", [event])
        assert new != job and f"created job(s) <a href=\"/ui/jobs/{new}\">{new}</a>" in page
        listing = (await client.get("/ui/events")).text
        assert f'href="/ui/events/{event}"' in listing


async def test_a_crafted_link_shows_no_notice_of_an_action_that_did_not_happen(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)
    async with logged_in(app) as (client, csrf):
        # links anyone could send: nothing was replayed, retried or paused
        for path, claim in ((f"/ui/events/{event}?created={job}", "Replayed"),
                            (f"/ui/events/{event}?created=none", "Replayed"),
                            (f"/ui/events/{event}?created={job}&seal=" + "0" * 32, "Replayed"),
                            (f"/ui/jobs/{job}?notice=retried", "Put back in the queue"),
                            ("/ui/?notice=paused:k.a", "Paused k.a: its jobs stay pending")):
            page = await client.get(path)
            assert page.status_code == 200 and claim not in page.text, path
        # the real thing says so, once, on this session's page
        replayed = await client.post(f"/ui/events/{event}/replay", data={"csrf": csrf})
        location = replayed.headers["location"]
        assert "Replayed: created job(s)" in (await client.get(location)).text
        # ... and a link sealed for one session shows nothing in another
        async with logged_in(app) as (other, _):
            assert "Replayed" not in (await other.get(location)).text
            # nor for another page
            elsewhere = location.replace(f"/ui/events/{event}?", f"/ui/events/{event + 1}?")
            assert "Replayed" not in (await client.get(elsewhere)).text


async def test_a_locked_table_is_said_as_such_not_narrow_the_filter(app: RunningApp, db: Any) -> None:
    from autom.web.console import views

    async with logged_in(app) as (client, _):
        original = views.QUERY_SECONDS
        views.QUERY_SECONDS = 2.0  # the lock wait gives up at 1.8 s, well before the statement timeout
        try:
            async with db.transaction() as tx:  # as a migration or VACUUM FULL holds it
                await tx.execute("lock table jobs in access exclusive mode")
                response = await client.get("/ui/jobs?status=failed")
        finally:
            views.QUERY_SECONDS = original
        assert response.status_code == 503
        assert "locked by another transaction" in response.text and "narrow the filter" not in response.text
        assert (await client.get("/ui/jobs?status=failed")).status_code == 200


async def test_bulk_retry_confirms_with_a_count_then_says_what_it_did(app: RunningApp, db: Any) -> None:
    failed = [await insert_job(db, kind="k.a", status="failed", attempts=8) for _ in range(3)]
    await insert_job(db, kind="k.b", status="failed", attempts=8)
    async with logged_in(app) as (client, csrf):
        listing = (await client.get("/ui/jobs?status=failed&kind=k.a")).text
        assert 'href="/ui/retry-failed?kind=k.a"' in listing
        confirm = (await client.get("/ui/retry-failed?kind=k.a")).text
        assert "3 failed job(s) match" in confirm and ">Retry</button>" in confirm
        assert '<tr><td>k.a</td><td class="num">3</td></tr>' in confirm
        done = await client.post("/ui/retry-failed", data={"csrf": csrf, "kind": "k.a", "since": ""})
        assert done.status_code == 200 and "Retried 3, skipped 0" in done.text
        statuses = {r["id"]: r["status"] for r in await db.fetch_all("select id, status from jobs")}
        assert [statuses[i] for i in failed] == ["pending"] * 3
        assert sorted(statuses.values()).count("failed") == 1


async def test_bulk_retry_from_a_list_filtered_by_recipient_retries_only_that_recipient(
    app: RunningApp, db: Any
) -> None:
    mine = [await insert_job(db, kind="k.a", status="failed", recipient="chat-1") for _ in range(2)]
    other = await insert_job(db, kind="k.a", status="failed", recipient="chat-2")
    async with logged_in(app) as (client, csrf):
        listing = (await client.get("/ui/jobs?status=failed&recipient=chat-1")).text
        assert 'href="/ui/retry-failed?recipient=chat-1"' in listing
        confirm = (await client.get("/ui/retry-failed?recipient=chat-1")).text
        assert "2 failed job(s) match (recipient chat-1)" in confirm
        assert '<input type="hidden" name="recipient" value="chat-1">' in confirm
        done = await client.post("/ui/retry-failed", data={"csrf": csrf, "kind": "", "recipient": "chat-1",
                                                           "since": ""})
        assert done.status_code == 200 and "Retried 2, skipped 0" in done.text
    statuses = {r["id"]: r["status"] for r in await db.fetch_all("select id, status from jobs")}
    assert statuses == {**dict.fromkeys(mine, "pending"), other: "failed"}


async def test_pause_and_resume_from_the_overview(app: RunningApp, db: Any) -> None:
    await insert_job(db, kind="k.a", status="failed")
    await JobStore(db).register_kinds({"k.a": 8})  # as a replica's App does at start
    async with logged_in(app) as (client, csrf):
        overview = (await client.get("/ui/")).text
        # the paused kinds come before the numbers, and only registered kinds are offered
        assert overview.index("Paused kinds") < overview.index("Done and failed per minute")
        assert '<option value="k.a">k.a</option>' in overview
        assert '<option value="telegram.message">' in overview
        response = await client.post("/ui/kinds/pause", data={"csrf": csrf, "kind": "k.a"})
        assert response.status_code == 303
        assert response.headers["location"].startswith("/ui/?notice=paused%3Ak.a&seal=")
        page = (await client.get(response.headers["location"])).text
        assert "Paused k.a: its jobs stay pending" in page and ">Resume</button>" in page
        assert 'class="badge">paused' in page
        # a misspelt kind is refused, named
        typo = await client.post("/ui/kinds/pause", data={"csrf": csrf, "kind": "telegram.mesage"})
        assert typo.status_code == 400 and "telegram.mesage" in typo.text
        assert await db.fetch_val("select count(*) from paused_kinds where kind = 'telegram.mesage'") == 0
        assert (await client.post("/ui/kinds/resume", data={"csrf": csrf, "kind": "k.a"})).status_code == 303
        assert await db.fetch_val("select count(*) from paused_kinds") == 0
        empty = await client.post("/ui/kinds/pause", data={"csrf": csrf, "kind": " "})
        assert empty.status_code == 400


async def test_overview_shows_capped_counts_and_the_chart(app: RunningApp, db: Any) -> None:
    await db.execute("insert into jobs (kind, status, finished_at) select 'bulk.kind', 'done', now() "
                     "from generate_series(1, 1005)")
    await insert_job(db, kind="bulk.kind", status="failed")
    async with logged_in(app) as (client, _):
        page = (await client.get("/ui/")).text
        assert "1,000+" in page
        assert '<rect class="done"' in page and '<rect class="failed"' in page
        assert "1005 done" in page and "1 failed" in page
        failing = page.split("Failed in the last hour, by kind", 1)[1].split("</table>", 1)[0]
        assert 'href="/ui/jobs?status=failed&amp;kind=bulk.kind">bulk.kind</a>' in failing
        assert '<td class="num">1</td>' in failing
        refresh = (await client.get("/ui/?refresh=10")).text
        assert '<meta http-equiv="refresh" content="10">' in refresh
        assert "http-equiv" not in (await client.get("/ui/?refresh=1")).text  # only the offered periods


async def test_a_console_query_past_its_timeout_says_narrow_the_filter(app: RunningApp, db: Any) -> None:
    from autom.web.console import views

    async with logged_in(app) as (client, _):
        original = views.QUERY_SECONDS
        views.QUERY_SECONDS = 0.001
        try:
            await db.execute("insert into jobs (kind) select 'k' from generate_series(1, 200000)")
            response = await client.get("/ui/jobs?until=2000-01-01T00:00:00Z")  # no index: a scan of all
        finally:
            views.QUERY_SECONDS = original
        assert response.status_code == 503 and "narrow the filter" in response.text


def test_sessions_expire_and_cannot_be_forged() -> None:
    sessions = Sessions("token-1", lifetime_seconds=3600)
    cookie = sessions.issue(now=1_000_000)
    session = sessions.check(cookie, now=1_000_100)
    assert session is not None
    assert sessions.check(cookie, now=1_000_000 + 3600) is None  # expired
    assert Sessions("token-2", 3600).check(cookie, now=1_000_100) is None  # a new ADMIN_TOKEN ends it
    issued, nonce, mac = cookie.split(".")[1:]
    assert sessions.check(f"v1.{int(issued) + 9999}.{nonce}.{mac}", now=1_000_100) is None
    assert sessions.csrf_ok(session, sessions.csrf_token(session))
    assert not sessions.csrf_ok(session, None) and not sessions.csrf_ok(session, "")
    other = sessions.check(sessions.issue(now=1_000_000), now=1_000_100)
    assert other is not None and sessions.csrf_token(other) != sessions.csrf_token(session)


def test_cross_site_rules() -> None:
    assert not cross_site("same-origin", None, "a:1")
    assert not cross_site("none", None, "a:1")
    assert cross_site("cross-site", "http://a:1", "a:1")
    assert cross_site("same-site", None, "a:1")
    assert not cross_site(None, "http://a:1", "a:1")
    assert not cross_site(None, "https://a:1", "a:1")  # TLS ended at a proxy
    assert cross_site(None, "http://b:1", "a:1")
    assert cross_site(None, "null", "a:1")
    assert not cross_site(None, None, "a:1")


async def test_console_disabled_without_an_admin_token(db: Any) -> None:
    async with running_app(db, app_settings(admin_token=None)) as app:
        response = await app.client.post("/ui/login", data={"token": ""})
        assert response.status_code == 403 and "ADMIN_TOKEN is not set" in response.text
        assert (await app.client.get("/ui/")).status_code == 302


async def test_ui_without_the_slash_and_unknown_console_paths(app: RunningApp) -> None:
    response = await app.client.get("/ui")
    assert response.status_code in (301, 302, 307, 308) and response.headers["location"].endswith("/ui/")
    missing = await app.client.get("/ui/nope")
    assert missing.status_code == 404 and "no such console page" in missing.text
    assert "text/html" in missing.headers["content-type"] and "default-src 'none'" in missing.headers[
        "content-security-policy"]
    assert (await app.client.put("/ui/jobs")).status_code == 405


async def test_failed_list_is_newest_failure_first_with_failed_since_and_pages(app: RunningApp, db: Any) -> None:
    # created in one order, failed in the reverse: the list follows the failures
    early = await insert_job(db, kind="k.a", status="failed", finished_at="2026-01-01T10:00:00Z")
    late = await insert_job(db, kind="k.a", status="failed", finished_at="2026-01-01T12:00:00Z")
    middle = await insert_job(db, kind="k.b", status="failed", finished_at="2026-01-01T11:00:00Z")
    async with logged_in(app) as (client, _):
        page = (await client.get("/ui/jobs?status=failed")).text
        shown = [int(x) for x in re.findall(r'<td><a href="/ui/jobs/(\d+)">', page)]
        assert shown == [late, middle, early]
        first = (await client.get("/ui/jobs?status=failed&limit=2")).text
        assert [int(x) for x in re.findall(r'<td><a href="/ui/jobs/(\d+)">', first)] == [late, middle]
        older = re.search(r'href="/ui/jobs\?([^"]+)">Older', first)
        assert older is not None
        rest = (await client.get("/ui/jobs?" + older.group(1).replace("&amp;", "&"))).text
        assert [int(x) for x in re.findall(r'<td><a href="/ui/jobs/(\d+)">', rest)] == [early]
        since = (await client.get("/ui/jobs?status=failed&failed_since=2026-01-01T10:30:00Z")).text
        assert [int(x) for x in re.findall(r'<td><a href="/ui/jobs/(\d+)">', since)] == [late, middle]


async def test_bulk_retry_keeps_every_filter_of_the_list_and_counts_per_kind(app: RunningApp, db: Any) -> None:
    hit = [await insert_job(db, kind=kind, status="failed", recipient="chat-1", finished_at="2026-01-01T12:00:00Z")
           for kind in ("k.a", "k.a", "k.b")]
    stale = await insert_job(db, kind="k.a", status="failed", recipient="chat-1", finished_at="2026-01-01T08:00:00Z")
    other = await insert_job(db, kind="k.a", status="failed", recipient="chat-2", finished_at="2026-01-01T12:00:00Z")
    async with logged_in(app) as (client, _):
        listing = (await client.get("/ui/jobs?status=failed&recipient=chat-1&failed_since=2026-01-01T11:00:00Z")).text
        link = re.search(r'href="(/ui/retry-failed\?[^"]+)"', listing)
        assert link is not None
        confirm = (await client.get(link.group(1).replace("&amp;", "&"))).text
        assert "3 failed job(s) match" in confirm
        assert '<tr><td>k.a</td><td class="num">2</td></tr>' in confirm
        assert '<tr><td>k.b</td><td class="num">1</td></tr>' in confirm
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', confirm))
        assert fields["recipient"] == "chat-1" and fields["since"] == "2026-01-01T11:00:00Z"
        done = await client.post("/ui/retry-failed", data=fields)
        assert done.status_code == 200 and "Retried 3, skipped 0" in done.text
    statuses = {r["id"]: r["status"] for r in await db.fetch_all("select id, status from jobs")}
    assert statuses == {**dict.fromkeys(hit, "pending"), stale: "failed", other: "failed"}


async def test_reschedule_from_the_job_page(app: RunningApp, db: Any) -> None:
    job = await insert_job(db, kind="k.a", status="pending", attempts=1, run_at="2999-01-01T00:00:00Z")
    async with logged_in(app) as (client, csrf):
        page = (await client.get(f"/ui/jobs/{job}")).text
        assert ">Reschedule</button>" in page
        bad = await client.post(f"/ui/jobs/{job}/reschedule", data={"csrf": csrf, "run_at": "tomorrow"})
        assert bad.status_code == 400 and "run at" in bad.text
        done = await client.post(f"/ui/jobs/{job}/reschedule", data={"csrf": csrf, "run_at": "2030-01-02T03:04:05Z"})
        assert done.status_code == 303
        assert "Rescheduled" in (await client.get(done.headers["location"])).text
        assert str(await db.fetch_val("select run_at from jobs where id = %s", [job])).startswith("2030-01-02 03:04:05")
        await db.execute("update jobs set status = 'done' where id = %s", [job])
        assert ">Reschedule</button>" not in (await client.get(f"/ui/jobs/{job}")).text
        refused = await client.post(f"/ui/jobs/{job}/reschedule", data={"csrf": csrf, "run_at": "now"})
        assert refused.status_code == 409


async def test_a_running_job_has_cancel_and_ends_cancelled(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {}))
    assert await claim_one(store) is not None
    async with logged_in(app) as (client, csrf):
        assert ">Cancel</button>" in (await client.get(f"/ui/jobs/{job_id}")).text
        response = await client.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": csrf})
        assert response.status_code == 303
        page = (await client.get(response.headers["location"])).text
        assert "Cancelled" in page and ">Cancel</button>" not in page
    assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "cancelled"


async def test_a_recipients_page_links_timeline_pause_and_purge(app: RunningApp, db: Any) -> None:
    job, event = await seeded(app, db)  # a /ping from chat 42
    pending = await insert_job(db, kind="site.form", status="pending", recipient="42")
    async with logged_in(app) as (client, csrf):
        listing = (await client.get("/ui/jobs?recipient=42")).text
        assert 'href="/ui/recipients/42"' in listing
        assert 'href="/ui/recipients/42"' in (await client.get(f"/ui/jobs/{job}")).text
        page = (await client.get("/ui/recipients/42")).text
        assert f'href="/ui/jobs/{job}"' in page and f'href="/ui/events/{event}"' in page
        assert ">Pause</button>" in page and ">Purge</button>" in page
        paused = await client.post("/ui/recipients/42/pause", data={"csrf": csrf})
        assert paused.status_code == 303
        page = (await client.get(paused.headers["location"])).text
        assert "Paused: its jobs stay pending" in page and ">Resume</button>" in page
        purged = await client.post("/ui/recipients/42/purge", data={"csrf": csrf})
        assert "Purged: 2 pending job(s) cancelled" in (await client.get(purged.headers["location"])).text
        assert await db.fetch_val("select status from jobs where id = %s", [pending]) == "cancelled"
        odd = (await client.get("/ui/recipients/a%3Fb%23c")).text
        assert "Recipient a?b#c" in odd and 'action="/ui/recipients/a%3Fb%23c/pause"' in odd


async def test_the_unsent_alerts_card_says_why_and_links_the_alerts_job(app: RunningApp, db: Any) -> None:
    job = await insert_job(db, kind="k.a", status="failed")
    await db.execute("insert into alerts (job_id, kind, attempts, error, tries) values (%s, 'k.a', 8, 'boom', 3)",
                     [job])
    async with logged_in(app) as (client, _):
        page = (await client.get("/ui/")).text
        card = page.split("<h2>Unsent alerts</h2>", 1)[1].split("</div>", 1)[0]
        assert f'href="/ui/jobs/{job}"' in card and "failed 3 time(s)" in card


async def test_a_recipient_whose_id_holds_slashes_has_its_page_actions_and_api(app: RunningApp, db: Any) -> None:
    from urllib.parse import quote

    from tests.integration.test_admin import AUTH

    # a site form's recipient is its page; "x/pause" ends like the pause action's path
    for name in ("site:/contact", "/contact", "a//b/", "x/pause"):
        job = await insert_job(db, kind="site.form", status="pending", recipient=name)
        path = f"/ui/recipients/{quote(name, safe='')}"
        async with logged_in(app) as (client, csrf):
            assert f'href="{path}"' in (await client.get(f"/ui/jobs/{job}")).text, name
            page = await client.get(path)
            assert page.status_code == 200 and f"Recipient {name}" in page.text, name
            assert f'href="/ui/jobs/{job}"' in page.text and f'action="{path}/pause"' in page.text, name
            paused = await client.post(f"{path}/pause", data={"csrf": csrf})
            assert paused.status_code == 303 and paused.headers["location"].startswith(f"{path}?"), name
            assert "Paused: its jobs stay pending" in (await client.get(paused.headers["location"])).text
            assert await db.fetch_val("select paused_at is not null from recipients where recipient = %s", [name])
            # the admin API takes the same id, encoded the same way
            story = await app.client.get(f"/admin/recipients/{quote(name, safe='')}", headers=AUTH)
            assert story.status_code == 200 and (story.json()["recipient"], story.json()["paused"]) == (name, True)
            resumed = await app.client.post(f"/admin/recipients/{quote(name, safe='')}/resume", headers=AUTH)
            assert resumed.status_code == 200, name
            purged = await app.client.post(f"/admin/recipients/{quote(name, safe='')}/purge", headers=AUTH)
            assert purged.json() == {"cancelled": 1}, name
            audit = (await client.get("/ui/audit")).text
            assert f'href="{path}"' in audit, name
    assert await db.fetch_val("select count(*) from recipients where recipient = 'x'") == 0


async def test_a_recipients_timeline_shows_the_operator_actions_on_it_and_its_jobs(
    app: RunningApp, db: Any
) -> None:
    first = await insert_job(db, kind="site.form", status="failed", recipient="77", attempts=8)
    async with logged_in(app) as (client, csrf):
        assert (await client.post("/ui/recipients/77/pause", data={"csrf": csrf})).status_code == 303
        assert (await client.post(f"/ui/jobs/{first}/retry", data={"csrf": csrf})).status_code == 303
        page = (await client.get("/ui/recipients/77")).text
        timeline = page.split("<h2>Timeline", 1)[1]
        assert "Paused by an operator (console)" in timeline
        assert "Retried by an operator (console)" in timeline and f'href="/ui/jobs/{first}"' in timeline
        # newest first: the retry, then the pause
        assert timeline.index("Retried by an operator") < timeline.index("Paused by an operator")
    story = (await app.client.get("/admin/recipients/77", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    actions = [(e["action"], e["via"], e.get("job_id")) for e in story["timeline"] if e["type"] == "action"]
    assert actions == [("retry", "console", first), ("recipient_pause", "console", None)]


async def test_a_recipients_actions_are_shown_once_across_its_pages(app: RunningApp, db: Any) -> None:
    # jobs created an hour apart, an action on the recipient between the older two
    ids = [await insert_job(db, kind="site.form", status="done", recipient="88",
                            created_at=f"2026-01-01T0{h}:00:00Z") for h in (1, 2, 3)]
    await db.execute("insert into audit_log (at, via, action, target) values "
                     "('2026-01-01T01:30:00Z', 'cli', 'recipient_pause', 'recipient:88'), "
                     "('2026-01-01T00:30:00Z', 'cli', 'recipient_resume', 'recipient:88')")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seen = []
    before = None
    while True:
        query = "limit=1" + (f"&before={before}" if before else "")
        story = (await app.client.get(f"/admin/recipients/88?{query}", headers=headers)).json()
        seen.append([e["action"] for e in story["timeline"] if e["type"] == "action"])
        before = story["next_before"]
        if before is None:
            break
    # page 1: job 3 (nothing after 03:00), page 2: job 2 (02:00-03:00), page 3: job 1 (01:00-02:00: the pause),
    # then the last page (the resume at 00:30, older than every job)
    assert len(ids) == 3 and seen == [[], [], ["recipient_pause"], ["recipient_resume"]]


async def test_a_multi_line_error_is_kept_whole_on_the_job_page_and_one_line_in_lists(
    app: RunningApp, db: Any
) -> None:
    from autom.jobs.retry import RetryPolicy

    store = JobStore(db)
    job = await store.enqueue(NewJob("site.form", {}, recipient="m1", max_attempts=2))
    report = "the form is invalid:\n  name: missing\n  email: not an address"
    for _ in range(2):  # a retry, then the last attempt fails for good
        claimed = await claim_one(store)
        assert claimed is not None and claimed.id == job
        await fail(store, claimed, RuntimeError(report), retry=RetryPolicy(base=0.0, cap=0.0))
    stored = await db.fetch_one("select status, last_error from jobs where id = %s", [job])
    assert stored["status"] == "failed" and stored["last_error"] == f"RuntimeError: {report}"
    async with logged_in(app) as (client, _):
        page = (await client.get(f"/ui/jobs/{job}")).text
        # the last error and each attempt's, whole, in a block that keeps the lines
        shown = "RuntimeError: the form is invalid:\n  name: missing\n  email: not an address</pre>"
        assert page.count(shown) == 3, page
        listing = (await client.get("/ui/jobs?status=failed")).text
        row = listing.split(f'href="/ui/jobs/{job}"', 1)[1].split("</tr>", 1)[0]
        assert "RuntimeError: the form is invalid: name: missing email: not an address" in row
        assert "\n  name" not in row
        story = (await client.get("/ui/recipients/m1")).text
        assert "the form is invalid: name: missing" in story and "\n  name" not in story


async def test_counts_past_the_cap_say_about_n_from_the_planners_estimate(app: RunningApp, db: Any) -> None:
    await db.execute("insert into jobs (kind, status, finished_at) "
                     "select 'k.big', 'failed', now() from generate_series(1, 1500)")
    few = [await insert_job(db, kind="k.small", status="failed") for _ in range(3)]
    await db.execute("analyze jobs")  # what autovacuum does after such a change
    async with logged_in(app) as (client, _):
        overview = (await client.get("/ui/")).text
        row = overview.split('href="/ui/jobs?kind=k.big"', 1)[1].split("</tr>", 1)[0]
        assert re.search(r">about 1,[45]\d\d<", row), row
        assert ">1,000+<" not in overview
        listing = (await client.get("/ui/jobs?status=failed&kind=k.big")).text
        assert re.search(r"about 1,[45]\d\d job\(s\) match \(PostgreSQL's estimate: counted exactly up to "
                         r"1,000\)", listing), listing
        exact = (await client.get("/ui/jobs?status=failed&kind=k.small")).text
        assert "3 job(s) match. Newest failure first." in exact and len(few) == 3


async def test_the_bulk_retry_confirm_page_says_about_n_per_kind_past_the_cap_and_keeps_the_filters(
    app: RunningApp, db: Any
) -> None:
    for kind, recipient, n in (("k.big", "r1", 1500), ("k.small", "r1", 3), ("k.big", "r2", 5)):
        await db.execute("insert into jobs (kind, status, recipient, finished_at) "
                         "select %s, 'failed', %s, now() from generate_series(1, %s)", [kind, recipient, n])
    await db.execute("analyze jobs")  # what autovacuum does after such a change
    async with logged_in(app) as (client, _):
        confirm = (await client.get("/ui/retry-failed?recipient=r1&since=1h")).text
        assert re.search(r"about 1,[45]\d\d failed job\(s\) match \(recipient r1\) \(since 1h\)", confirm), confirm
        assert "10,000+" not in confirm and "1,000+" not in confirm
        assert re.search(r'<tr><td>k.big</td><td class="num">about 1,[45]\d\d</td></tr>', confirm), confirm
        assert '<tr><td>k.small</td><td class="num">3</td></tr>' in confirm
        assert "PostgreSQL's estimate" in confirm
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', confirm))
        assert (fields["recipient"], fields["since"], fields["kind"]) == ("r1", "1h", "")
        # under the cap: exact, and no word of estimates
        exact = (await client.get("/ui/retry-failed?recipient=r2")).text
        assert "5 failed job(s) match (recipient r2)" in exact and "estimate" not in exact
        assert '<tr><td>k.big</td><td class="num">5</td></tr>' in exact


async def test_an_unfiltered_bulk_retry_is_linked_from_the_failed_list_the_overview_and_a_recipient(
    app: RunningApp, db: Any
) -> None:
    await insert_job(db, kind="k.a", status="failed", recipient="chat/1", finished_at="now()")
    await insert_job(db, kind="k.b", status="failed", recipient="chat-2", finished_at="now()")
    async with logged_in(app) as (client, _):
        for path in ("/ui/jobs?status=failed", "/ui/jobs?status=failed&kind=k.a", "/ui/"):
            page = (await client.get(path)).text
            assert '<a class="action" href="/ui/retry-failed">Retry every failed job…</a>' in page, path
        filtered = (await client.get("/ui/jobs?status=failed&kind=k.a")).text
        assert 'href="/ui/retry-failed?kind=k.a">Retry the failed jobs this list' in filtered
        unfiltered = (await client.get("/ui/jobs?status=failed")).text
        assert "Retry the failed jobs this list" not in unfiltered  # the same page: one link
        overview = (await client.get("/ui/")).text
        assert 'href="/ui/retry-failed?kind=k.b">retry its failed jobs…</a>' in overview
        story = (await client.get("/ui/recipients/chat%2F1")).text
        link = re.search(r'href="(/ui/retry-failed\?[^"]+)">Retry its failed jobs…</a>', story)
        assert link is not None and link.group(1) == "/ui/retry-failed?recipient=chat%2F1", story
        confirm = (await client.get(link.group(1))).text
        assert "1 failed job(s) match (recipient chat/1)" in confirm
        every = (await client.get("/ui/retry-failed")).text
        assert "2 failed job(s) match." in every and ">Retry</button>" in every
        assert '<tr><td>k.a</td><td class="num">1</td></tr>' in every


async def test_overview_counts_without_statistics_say_1000_plus_never_a_guess(app: RunningApp, db: Any) -> None:
    await db.execute("insert into jobs (kind, status, finished_at) "
                     "select 'k.big', 'failed', now() from generate_series(1, 1200)")
    assert await db.fetch_val("select count(*) from pg_stats_ext where tablename = 'jobs' "
                              "and most_common_vals is not null") == 0  # not analyzed since
    async with logged_in(app) as (client, _):
        overview = (await client.get("/ui/")).text
        row = overview.split('href="/ui/jobs?kind=k.big"', 1)[1].split("</tr>", 1)[0]
        assert ">1,000+<" in row and "about" not in row, row


async def test_with_the_database_down_every_page_is_a_clear_503_page_and_comes_back() -> None:
    import trio

    from autom.db import open_database
    from tests.support.restartable_pg import restartable_pg

    with restartable_pg() as pg:
        async with (
            open_database(pg.dsn, min_size=1, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db,
            running_app(db) as app,
        ):
            job, event = await seeded(app, db)
            async with logged_in(app) as (client, csrf):
                await trio.to_thread.run_sync(pg.stop)
                pages = [path.format(job=job, event=event) for path in PAGES] + ["/ui/recipients/42"]
                for path in pages:
                    response = await client.get(path)
                    assert response.status_code == 503, path
                    page = response.text
                    # the console's own page: its layout and stylesheet, a heading, one line that says what
                    # is wrong and what helps, a way back; no traceback, no server's bare error
                    assert page.startswith("<!doctype html>") and "/ui/static/console.css" in page, path
                    assert "<h1>Not available</h1>" in page, path
                    assert "The database is unavailable; try again in a moment." in page, path
                    assert "Traceback" not in page and "psycopg" not in page, path
                    assert response.headers["Content-Security-Policy"].startswith("default-src 'none'"), path
                refused = await client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf})
                assert refused.status_code == 503 and "<h1>Not available</h1>" in refused.text
                # the login form still shows (logging in says what is wrong)
                async with httpx.AsyncClient(base_url=app.url, timeout=10.0) as fresh:
                    assert (await fresh.get("/ui/login")).status_code == 200
                await trio.to_thread.run_sync(pg.start)
                with trio.fail_after(15):
                    while (await client.get("/ui/")).status_code == 503:
                        await trio.sleep(0.2)
                assert (await client.get(f"/ui/jobs/{job}")).status_code == 200
