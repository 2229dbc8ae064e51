"""Why a job failed and who did what: a handler's traceback and ctx.log lines with its attempt
(log line, admin API, CLI, console), attempt numbers across manual retries, a done job's
last_error, and the audit trail of operator actions."""

from __future__ import annotations

import inspect
import json
import logging
import re
from typing import Any

import httpx
import pytest
import trio

from autom.errors import PermanentError
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from autom.logs import JsonFormatter
from autom.ops import Operations
from tests.integration.test_admin import AUTH
from tests.support.http_app import RunningApp, running_app
from tests.support.proc import clean_env, run_autom
from tests.support.queue import claim_one, complete_many, fail
from tests.support.service import ADMIN_TOKEN, SITE_SECRET, TG_SECRET, running_service, service_settings, wait_until


@pytest.fixture
async def app(db: Any) -> Any:
    """The HTTP app on a free port, no workers."""
    async with running_app(db) as running:
        yield running


async def test_a_manual_retry_makes_attempt_two_and_an_audit_entry(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {"n": 1}, max_attempts=1))
    claimed = await claim_one(store)
    assert claimed is not None and claimed.id == job_id
    await fail(store, claimed, "KeyError: 'titel'")
    assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "failed"
    response = await app.client.post(f"/admin/jobs/{job_id}/retry", headers=AUTH)
    assert response.status_code == 200, response.text
    again = await claim_one(store)
    assert again is not None and again.id == job_id
    assert await complete_many(store, [again]) == {job_id}

    job = (await app.client.get(f"/admin/jobs/{job_id}", headers=AUTH)).json()
    assert job["status"] == "done" and job["last_error"] is None
    assert [(a["attempt"], a["outcome"]) for a in job["attempt_log"]] == [(1, "failed"), (2, "done")]
    assert job["attempt_log"][0]["error"] == "KeyError: 'titel'"
    assert [(a["via"], a["action"], a["target"]) for a in job["actions"]] == [("api", "retry", f"job:{job_id}")]

    audit = (await app.client.get("/admin/audit?limit=5", headers=AUTH)).json()["actions"]
    assert [(a["via"], a["action"], a["target"]) for a in audit] == [("api", "retry", f"job:{job_id}")]
    assert (await app.client.get("/admin/audit?limit=x", headers=AUTH)).status_code == 400


async def test_record_action_newest_first(db: Any) -> None:
    ops = Operations(db)
    await ops.record_action("cli", "pause", "kind:site.form")
    await ops.record_action("console", "login", None)
    audit = await ops.audit(10)
    assert [(a["via"], a["action"], a["target"]) for a in audit] == [
        ("console", "login", None), ("cli", "pause", "kind:site.form")]


async def typo_handler(ctx: Any, job: Any) -> None:
    """A new user's handler: logs two lines, then misspells a key."""
    issue = {"title": "it broke"}
    ctx.log.info("looking at issue %s", job.payload["n"])
    ctx.log.warning("about to read the title")
    ctx.log.info("title: %s", issue["titel"])  # the typo


async def chatty_handler(ctx: Any, job: Any) -> None:
    """Logs a line and ends done."""
    ctx.log.info("all fine for %s", job.payload["n"])


async def test_a_handlers_key_error_shows_its_file_and_line_everywhere(dsn: str, db: Any, telegram_stub: Any,
                                                                      tmp_path: Any) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(level=logging.INFO)
    logging.getLogger("autom.worker").addHandler(keep)
    line = inspect.getsourcelines(typo_handler)[1] + 5  # the line with the typo
    where = f"test_failures.py:{line} in typo_handler"
    settings = service_settings(dsn, telegram_stub.url)
    try:
        async with (
            running_service(settings, handlers={"typo": typo_handler, "chatty": chatty_handler}) as svc,
            httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
        ):
            store = JobStore(db)
            job_id = await store.enqueue(NewJob("typo", {"n": 7}, max_attempts=1))
            fine_id = await store.enqueue(NewJob("chatty", {"n": 8}))

            async def ended() -> bool:
                jobs = [(await client.get(f"/admin/jobs/{i}")).json()["status"] for i in (job_id, fine_id)]
                return jobs == ["failed", "done"]

            await wait_until(ended)
            job = (await client.get(f"/admin/jobs/{job_id}")).json()
            (attempt,) = job["attempt_log"]
            assert attempt["outcome"] == "failed" and "KeyError: 'titel'" in attempt["error"]
            assert where in attempt["error"] and where in job["last_error"]
            assert f'test_failures.py", line {line}, in typo_handler' in attempt["traceback"]
            assert 'issue["titel"]' in attempt["traceback"]
            assert attempt["log"] == ["info looking at issue 7", "warning about to read the title"]
            fine = (await client.get(f"/admin/jobs/{fine_id}")).json()
            assert fine["last_error"] is None
            assert [(a["outcome"], a["log"]) for a in fine["attempt_log"]] == [("done", ["info all fine for 8"])]

            # the console's job page
            async with httpx.AsyncClient(base_url=svc.urls[0]) as browser:
                assert (await browser.post("/ui/login", data={"token": ADMIN_TOKEN})).status_code == 303
                page = (await browser.get(f"/ui/jobs/{job_id}")).text
            assert f"line {line}, in typo_handler" in page and "looking at issue 7" in page
    finally:
        logging.getLogger("autom.worker").removeHandler(keep)

    # the failure's log line: the traceback is a field of the JSON line
    (failure,) = [r for r in records if r.getMessage().startswith("job failed for good")]
    assert where in failure.getMessage()
    line_json = json.loads(JsonFormatter().format(failure))
    assert f'test_failures.py", line {line}, in typo_handler' in line_json["traceback"]

    env = clean_env(DATABASE_URL=dsn, TELEGRAM_WEBHOOK_SECRET=TG_SECRET, SITE_WEBHOOK_SECRET=SITE_SECRET)
    shown = await trio.to_thread.run_sync(lambda: run_autom("job", str(job_id), env=env, cwd=tmp_path))
    assert f'line {line}, in typo_handler' in shown.stdout and "looking at issue 7" in shown.stdout
    as_json = await trio.to_thread.run_sync(lambda: run_autom("job", str(job_id), "--json", env=env, cwd=tmp_path))
    assert json.loads(as_json.stdout)["attempt_log"][0]["log"][0] == "info looking at issue 7"
    failed = await trio.to_thread.run_sync(lambda: run_autom("failed", env=env, cwd=tmp_path))
    assert where in failed.stdout
    # the Telegram alert's text (autom/alerts.py) is made of the stored error
    assert where in await db.fetch_val("select error from alerts where job_id = %s", [job_id])


async def test_an_expected_error_keeps_its_one_line(db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {"n": 1}, max_attempts=1))
    claimed = await claim_one(store)
    assert claimed is not None
    await fail(store, claimed, PermanentError("telegram sendMessage: HTTP 400 Bad Request: chat not found"))
    (attempt,) = (await Operations(db).get_job(job_id))["attempt_log"]
    assert attempt["traceback"] is None and attempt["log"] is None


async def test_console_login_retry_and_logout_are_on_the_audit_page(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {"n": 1}, max_attempts=1))
    claimed = await claim_one(store)
    assert claimed is not None
    await fail(store, claimed, "RuntimeError: no")
    async with httpx.AsyncClient(base_url=app.url, timeout=10.0) as browser:
        assert (await browser.post("/ui/login", data={"token": ADMIN_TOKEN})).status_code == 303
        page = (await browser.get(f"/ui/jobs/{job_id}")).text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        retried = await browser.post(f"/ui/jobs/{job_id}/retry", data={"csrf": csrf.group(1)})
        assert retried.status_code == 303, retried.text
        audit = (await browser.get("/ui/audit")).text
        assert f'href="/ui/jobs/{job_id}">job:{job_id}</a>' in audit and "login" in audit
        assert (await browser.post("/ui/logout", data={"csrf": csrf.group(1)})).status_code == 303
    actions = [(a["via"], a["action"], a["target"]) for a in await Operations(db).audit(10)]
    assert actions == [("console", "logout", None), ("console", "retry", f"job:{job_id}"),
                       ("console", "login", None)]
