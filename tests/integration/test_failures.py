"""Why a job failed and who did what: attempt numbers across manual retries, a done job's
last_error, and the audit trail of operator actions (admin API, CLI)."""

from __future__ import annotations

from typing import Any

import pytest

from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from autom.ops import Operations
from tests.integration.test_admin import AUTH
from tests.support.http_app import RunningApp, running_app
from tests.support.queue import claim_one


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
    await store.fail(claimed, "KeyError: 'titel'")
    assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "failed"
    response = await app.client.post(f"/admin/jobs/{job_id}/retry", headers=AUTH)
    assert response.status_code == 200, response.text
    again = await claim_one(store)
    assert again is not None and again.id == job_id
    assert await store.complete_many([again]) == {job_id}

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
