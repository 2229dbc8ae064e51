"""The operator's no-dead-end actions over ``/admin`` (issue 13): cancel, bulk retry, pause and
resume, the attempt log, the events list and the recipient / time filters.

The attempt log is written by a trigger (migrations/0008), so it is tested through the
queue's own statements (claim, fail, retry_later, release, an expired lease) and once
end to end through the running service with a Telegram stub that answers 502 first.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from autom.errors import PermanentError
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.integration.test_admin import AUTH, insert_job, ping, post_update
from tests.support.http_app import RunningApp, running_app
from tests.support.queue import claim_one, complete, fail, release, sleeping_handler
from tests.support.service import post_telegram, running_service, service_settings, telegram_update, wait_until
from tests.support.telegram_stub import Reply


@pytest.fixture
async def app(db: Any) -> Any:
    """The HTTP app on a free port, no workers."""
    async with running_app(db) as running:
        yield running


async def test_cancel_a_pending_job_it_never_runs_and_raises_no_alert(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob("site.form", {"n": 1}))
    response = await app.client.post(f"/admin/jobs/{job_id}/cancel", headers=AUTH)
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["id"]) == ("cancelled", job_id)
    assert await store.claim(5) == []
    assert await db.fetch_val("select count(*) from alerts") == 0
    again = await app.client.post(f"/admin/jobs/{job_id}/cancel", headers=AUTH)
    assert again.status_code == 409 and "is cancelled" in again.json()["error"]
    # a job waiting for its retry is pending too: it can be cancelled
    waiting = await store.enqueue(NewJob("site.form", {"n": 2}))
    claimed = await claim_one(store)
    assert claimed is not None and claimed.id == waiting
    await fail(store, claimed, "TransientError: try later")
    assert await db.fetch_val("select status from jobs where id = %s", [waiting]) == "pending"
    assert (await app.client.post(f"/admin/jobs/{waiting}/cancel", headers=AUTH)).status_code == 200
    for status in ("done", "failed", "cancelled"):  # a running job is cancelled too (a test below)
        other = await insert_job(db, status=status, attempts=1)
        refused = await app.client.post(f"/admin/jobs/{other}/cancel", headers=AUTH)
        assert refused.status_code == 409 and f"is {status}" in refused.json()["error"], status
    assert (await app.client.post("/admin/jobs/98765/cancel", headers=AUTH)).status_code == 404


async def test_a_cancelled_head_frees_its_recipients_later_jobs(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    first = await store.enqueue(NewJob("site.form", {"n": 1}, recipient="chat-1"))
    second = await store.enqueue(NewJob("site.form", {"n": 2}, recipient="chat-1"))
    assert (await app.client.post(f"/admin/jobs/{first}/cancel", headers=AUTH)).status_code == 200
    claimed = await store.claim(5)
    assert [j.id for j in claimed] == [second]


async def test_bulk_retry_of_failed_jobs_counts_and_filters(app: RunningApp, db: Any) -> None:
    a = [await insert_job(db, kind="a", status="failed", attempts=8, last_error="boom") for _ in range(3)]
    b = await insert_job(db, kind="b", status="failed", attempts=8)
    old = await insert_job(db, kind="a", status="failed", attempts=8, finished_at="2020-01-01T00:00:00Z")
    done = await insert_job(db, kind="a", status="done", attempts=1)
    response = await app.client.post("/admin/retry-failed?kind=a&since=1h", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["retried"], body["skipped"], body["more"], sorted(body["ids"])) == (3, 0, False, a)
    statuses = {r["id"]: r["status"] for r in await db.fetch_all("select id, status from jobs")}
    assert statuses == {**dict.fromkeys(a, "pending"), b: "failed", old: "failed", done: "done"}
    everything = (await app.client.post("/admin/retry-failed", headers=AUTH)).json()
    assert (everything["retried"], sorted(everything["ids"])) == (2, sorted([b, old]))
    for query in ("status=failed", "kind=", "since=soon", "limit=5"):
        bad = await app.client.post(f"/admin/retry-failed?{query}", headers=AUTH)
        assert bad.status_code == (200 if query == "kind=" else 400), (query, bad.text)


async def test_bulk_retry_honours_its_json_body_and_refuses_unknown_fields(app: RunningApp, db: Any) -> None:
    a1 = await insert_job(db, kind="a", status="failed", attempts=8, recipient="r1")
    a2 = await insert_job(db, kind="a", status="failed", attempts=8, recipient="r2")
    b1 = await insert_job(db, kind="b", status="failed", attempts=8, recipient="r1")
    old = await insert_job(db, kind="a", status="failed", attempts=8, recipient="r1",
                           finished_at="2020-01-01T00:00:00Z")

    async def failed() -> set[int]:
        return {r["id"] for r in await db.fetch_all("select id from jobs where status = 'failed'")}

    # a kind nothing has: nothing is retried (the body used to be ignored: every failed job was)
    nope = await app.client.post("/admin/retry-failed", json={"kind": "nope"}, headers=AUTH)
    assert (nope.status_code, nope.json()["retried"]) == (200, 0), nope.text
    assert await failed() == {a1, a2, b1, old}
    for body in ({"colour": "red"}, {"kind": "a", "status": "failed"}, {"kind": 5}, {"since": "999999d"},
                 {"recipient": "\ud800"}, ["kind", "a"], "kind=a", {"since": "whenever"}):
        bad = await app.client.post("/admin/retry-failed", content=json.dumps(body).encode(), headers=AUTH)
        assert bad.status_code == 400 and "\n" not in bad.json()["error"], (body, bad.text)
    unknown = await app.client.post("/admin/retry-failed", json={"colour": "red"}, headers=AUTH)
    assert "unknown field 'colour'" in unknown.json()["error"]
    garbage = await app.client.post("/admin/retry-failed", content=b"{not json", headers=AUTH)
    assert garbage.status_code == 400 and "JSON object" in garbage.json()["error"]
    both = await app.client.post("/admin/retry-failed?kind=a", json={"kind": "a"}, headers=AUTH)
    assert both.status_code == 400
    assert await failed() == {a1, a2, b1, old}  # nothing was retried by a refused request
    # kind and recipient and since, each narrowing
    response = await app.client.post("/admin/retry-failed", json={"kind": "a", "recipient": "r1", "since": "1h"},
                                     headers=AUTH)
    assert response.status_code == 200 and response.json()["ids"] == [a1], response.text
    response = await app.client.post("/admin/retry-failed", json={"recipient": "r1", "kind": None}, headers=AUTH)
    assert sorted(response.json()["ids"]) == sorted([b1, old])
    assert await failed() == {a2}


async def test_a_post_that_takes_no_field_refuses_a_body_with_one(app: RunningApp, db: Any) -> None:
    job = await insert_job(db, kind="a", status="failed", attempts=8)
    await JobStore(db).register_kinds({"a": 8})
    for path in (f"/admin/jobs/{job}/retry", f"/admin/jobs/{job}/cancel", "/admin/kinds/a/pause"):
        for body in (b'{"run_at": "now"}', b"[1]", b"not json"):
            refused = await app.client.post(path, content=body, headers=AUTH)
            assert refused.status_code == 400, (path, body, refused.text)
    assert await db.fetch_val("select status from jobs where id = %s", [job]) == "failed"
    assert await db.fetch_val("select count(*) from paused_kinds") == 0
    assert (await app.client.post(f"/admin/jobs/{job}/retry", json={}, headers=AUTH)).status_code == 200
    assert (await app.client.post("/admin/kinds/a/pause", headers=AUTH)).status_code == 200


async def test_bulk_retry_works_in_capped_batches(db: Any) -> None:
    from autom.ops import Operations

    ids = [await insert_job(db, kind="a", status="failed", attempts=8) for _ in range(7)]
    ops = Operations(db)
    assert (await ops.count_failed(cap=5)).total.capped
    assert str((await ops.count_failed(cap=50)).total) == "7"
    assert [(kind, str(n)) for kind, n in (await ops.count_failed(cap=50)).by_kind] == [("a", "7")]
    first = await ops.retry_failed(cap=5, batch=2)
    assert (first.retried, first.skipped, first.more) == (ids[:5], 0, True)
    rest = await ops.retry_failed(cap=5, batch=2)
    assert (rest.retried, rest.skipped, rest.more) == (ids[5:], 0, False)


async def test_pause_holds_a_kind_on_every_lane_and_resume_releases_it(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    await store.register_kinds({"slow.kind": 8, "other.kind": 8})  # as a replica's App does at start
    free = await store.enqueue(NewJob("slow.kind", {}))
    chat_head = await store.enqueue(NewJob("slow.kind", {}, recipient="c1"))
    chat_next = await store.enqueue(NewJob("other.kind", {}, recipient="c1"))
    other = await store.enqueue(NewJob("other.kind", {}))
    paused = await app.client.post("/admin/kinds/slow.kind/pause", headers=AUTH)
    assert (paused.status_code, paused.json()) == (200, {"kind": "slow.kind", "paused": True, "changed": True})
    assert (await app.client.post("/admin/kinds/slow.kind/pause", headers=AUTH)).json()["changed"] is False
    listed = (await app.client.get("/admin/kinds/paused", headers=AUTH)).json()["paused"]
    assert [p["kind"] for p in listed] == ["slow.kind"]
    assert (await app.client.get("/admin/stats", headers=AUTH)).json()["paused_kinds"] == ["slow.kind"]
    # the paused head of chat c1 holds the chat back: its order stays
    assert [j.id for j in await store.claim(10)] == [other]
    resumed = await app.client.post("/admin/kinds/slow.kind/resume", headers=AUTH)
    assert resumed.json() == {"kind": "slow.kind", "paused": False, "changed": True}
    assert sorted(j.id for j in await store.claim(10)) == sorted([free, chat_head])
    assert chat_next not in [j.id for j in await store.claim(10)]  # c1 busy with its head
    bad = await app.client.post("/admin/kinds/a%00b/pause", headers=AUTH)
    assert bad.status_code == 400


async def test_a_recipient_with_a_line_break_is_refused_by_its_route_not_missed(app: RunningApp) -> None:
    # the route takes any character (a "." stops at a line break: these were undocumented 404s)
    for method, path in (("GET", "/admin/recipients/a%0Ab"), ("POST", "/admin/recipients/%0A%0Bg/purge"),
                         ("POST", "/admin/recipients/a%0D%0Ab/pause"), ("POST", "/admin/recipients/a%0Ab/resume")):
        answer = await app.client.request(method, path, headers=AUTH)
        assert (answer.status_code, answer.json()) == (
            400, {"error": "recipient must be printable text of at most 200 characters"}), path


async def test_recipient_event_and_time_filters_and_keyset_pages(app: RunningApp, db: Any) -> None:
    old = await insert_job(db, kind="k", recipient="42", created_at="2020-01-01T00:00:00Z")
    mine = [await insert_job(db, kind="k", recipient="42") for _ in range(3)]
    theirs = await insert_job(db, kind="k", recipient="7")
    event = (await post_update(app.client, ping(3, 99))).json()["id"]

    async def ids(query: str) -> list[int]:
        response = await app.client.get(f"/admin/jobs?{query}", headers=AUTH)
        assert response.status_code == 200, response.text
        return [j["id"] for j in response.json()["jobs"]]

    assert await ids("recipient=42") == [*mine[::-1], old]
    assert await ids("recipient=42&since=2021-01-01") == mine[::-1]
    assert await ids("recipient=42&until=2021-01-01T00:00:00%2B00:00") == [old]
    assert await ids("recipient=7") == [theirs]
    assert len(await ids(f"event_id={event}")) == 1
    assert await ids("recipient=42&limit=2") == mine[:0:-1]
    assert await ids(f"recipient=42&limit=2&before={mine[1]}") == [mine[0], old]


async def test_a_recipients_finished_and_unfinished_jobs_page_together_newest_first(
    app: RunningApp, db: Any
) -> None:
    # finished and unfinished jobs interleaved: the pages merge the two walks (migrations/0034)
    statuses = ["done", "pending", "failed", "pending", "cancelled", "done", "pending", "failed", "done"]
    jobs = [await insert_job(db, kind="k", status=s, recipient="55") for s in statuses]
    jobs.append(await insert_job(db, kind="k", status="running", recipient="55", locked_until="2030-01-01T00:00:00Z"))
    statuses.append("running")
    await insert_job(db, kind="k", status="done", recipient="56")
    newest_first = jobs[::-1]

    async def pages(path: str, key: str, cursor: str) -> list[int]:
        seen: list[int] = []
        before: int | None = None
        while True:
            query = "limit=3" + (f"&before={before}" if before else "")
            response = await app.client.get(f"{path}{'&' if '?' in path else '?'}{query}", headers=AUTH)
            assert response.status_code == 200, response.text
            page = [e["job_id"] if key == "timeline" else e["id"]
                    for e in response.json()[key] if key == "jobs" or e["type"] == "job"]
            seen += page
            before = response.json()[cursor] if key == "timeline" else (page[-1] if len(page) == 3 else None)
            if before is None:
                return seen

    assert await pages("/admin/recipients/55", "timeline", "next_before") == newest_first
    assert await pages("/admin/jobs?recipient=55", "jobs", "") == newest_first
    assert await pages("/admin/jobs?recipient=55&status=pending", "jobs", "") == [
        j for j, s in zip(newest_first, statuses[::-1], strict=True) if s == "pending"]


async def test_events_list_newest_first_with_filters(app: RunningApp, db: Any) -> None:
    first = (await post_update(app.client, ping(1, 5))).json()["id"]
    second = (await post_update(app.client, b"not json")).json()["id"]
    response = await app.client.get("/admin/events", headers=AUTH)
    assert response.status_code == 200
    events = response.json()["events"]
    assert [e["id"] for e in events] == [second, first]
    assert (events[0]["jobs"], events[0]["body_bytes"], events[1]["jobs"]) == (0, 8, 1)
    assert "body" not in events[0]
    assert [e["id"] for e in (await app.client.get(f"/admin/events?before={second}", headers=AUTH)).json()[
        "events"]] == [first]
    assert (await app.client.get("/admin/events?source=github", headers=AUTH)).json()["events"] == []
    assert (await app.client.get("/admin/events?sauce=x", headers=AUTH)).status_code == 400


async def test_attempt_log_records_every_way_an_attempt_ends(db: Any, app: RunningApp) -> None:
    store = JobStore(db, lease_seconds=60)
    job_id = await store.enqueue(NewJob("k", {}, max_attempts=5))
    job = await claim_one(store)
    assert job is not None
    await fail(store, job, "TransientError: HTTP 502")  # a retry
    await db.execute("update jobs set run_at = now() where id = %s", [job_id])
    job = await claim_one(store)
    assert job is not None
    # the worker vanished: its lease runs out and another claim takes the job
    await db.execute("update jobs set locked_until = now() - interval '1 second' where id = %s", [job_id])
    job = await claim_one(store)
    assert job is not None and job.attempts == 3
    await release(store, [job], "shutdown")  # given back: not an attempt, no row
    job = await claim_one(store)
    assert job is not None and job.attempts == 3
    running = (await app.client.get(f"/admin/jobs/{job_id}", headers=AUTH)).json()["attempt_log"]
    assert [(a["attempt"], a["outcome"]) for a in running] == [(1, "retry"), (2, "lease_expired"), (3, "running")]
    assert running[-1]["ended"] is None and running[-1]["started"] is not None
    assert running[0]["error"] == "TransientError: HTTP 502"
    assert all(a["started"] and a["started"] <= (a["ended"] or "9") for a in running)
    # CONTRACT's names; the old ones stay as deprecated aliases of the same times
    assert all((a["started_at"], a["ended_at"]) == (a["started"], a["ended"]) for a in running)
    await fail(store, job, PermanentError("HTTP 400 nope"))
    log = (await app.client.get(f"/admin/jobs/{job_id}", headers=AUTH)).json()["attempt_log"]
    assert [(a["attempt"], a["outcome"], a["error"]) for a in log][-1] == (3, "failed", "PermanentError: HTTP 400 nope")
    # pruned with the job
    await db.execute("delete from jobs where id = %s", [job_id])
    assert await db.fetch_val("select count(*) from job_attempts") == 0


async def test_attempt_log_of_a_job_that_failed_once_then_ran(dsn: str, db: Any, telegram_stub: Any) -> None:
    telegram_stub.plan("sendMessage", [Reply(502, description="Bad Gateway")], chat_id=21)
    async with (
        running_service(service_settings(dsn, telegram_stub.url)) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
    ):
        event_id = (await post_telegram(client, telegram_update(8, 21, "/ping"))).json()["id"]
        job_id = (await client.get(f"/admin/events/{event_id}")).json()["job_ids"][0]

        async def done() -> bool:
            return bool((await client.get(f"/admin/jobs/{job_id}")).json()["status"] == "done")

        await wait_until(done)
        log = (await client.get(f"/admin/jobs/{job_id}")).json()["attempt_log"]
        assert [(a["attempt"], a["outcome"]) for a in log] == [(1, "retry"), (2, "done")]
        assert "502" in log[0]["error"]
        assert log[1]["ended"] is not None and log[1]["error"] is None


async def test_pausing_a_kind_no_handler_serves_is_404_naming_it(app: RunningApp, db: Any) -> None:
    typo = await app.client.post("/admin/kinds/telegram.mesage/pause", headers=AUTH)
    assert typo.status_code == 404 and "telegram.mesage" in typo.json()["error"]
    assert "site.form" in typo.json()["error"]  # the kinds that exist are named
    assert (await app.client.post("/admin/kinds/telegram.mesage/resume", headers=AUTH)).status_code == 404
    assert await db.fetch_val("select count(*) from paused_kinds") == 0
    # a kind paused while it was served can always be resumed, served or not
    await db.execute("insert into paused_kinds (kind) values ('gone.kind')")
    resumed = await app.client.post("/admin/kinds/gone.kind/resume", headers=AUTH)
    assert resumed.status_code == 200 and resumed.json()["changed"] is True


async def test_failed_jobs_list_newest_failure_first_with_failed_since(app: RunningApp, db: Any) -> None:
    early = await insert_job(db, kind="k", status="failed", finished_at="2026-01-01T10:00:00Z")
    late = await insert_job(db, kind="k", status="failed", finished_at="2026-01-01T12:00:00Z")
    listed = (await app.client.get("/admin/jobs?status=failed", headers=AUTH)).json()["jobs"]
    assert [j["id"] for j in listed] == [late, early]
    page = (await app.client.get(f"/admin/jobs?status=failed&before={late}", headers=AUTH)).json()["jobs"]
    assert [j["id"] for j in page] == [early]
    since = await app.client.get("/admin/jobs?status=failed&failed_since=2026-01-01T11:00:00Z", headers=AUTH)
    assert [j["id"] for j in since.json()["jobs"]] == [late]


async def test_reschedule_a_pending_job_clears_its_retry_delay(app: RunningApp, db: Any) -> None:
    store = JobStore(db)
    waiting = await insert_job(db, kind="k", status="pending", attempts=2, recipient="c9",
                               run_at="2999-01-01T00:00:00Z", queued_at="now()", last_error="boom")
    later = await store.enqueue(NewJob("k", {}, recipient="c9"))
    assert [j.id for j in await store.claim(10)] == []  # the waiting head holds its recipient back
    moved = await app.client.post(f"/admin/jobs/{waiting}/reschedule", json={"run_at": "now"}, headers=AUTH)
    assert moved.status_code == 200 and moved.json()["status"] == "pending"
    assert [j.id for j in await store.claim(10)] == [waiting]  # its delay is gone, its place kept
    assert later is not None
    at = await app.client.post(f"/admin/jobs/{later}/reschedule", json={"run_at": "2031-05-01T09:30:00Z"},
                               headers=AUTH)
    assert at.status_code == 200 and at.json()["run_at"].startswith("2031-05-01T09:30:00")
    refused = await app.client.post(f"/admin/jobs/{waiting}/reschedule", json={"run_at": "now"}, headers=AUTH)
    assert refused.status_code == 409 and "running" in refused.json()["error"]
    for body in ({}, {"run_at": "6h"}, {"run_at": "soon"}, {"when": "now"}):
        bad = await app.client.post(f"/admin/jobs/{later}/reschedule", json=body, headers=AUTH)
        assert bad.status_code == 400, body
    assert (await app.client.post("/admin/jobs/999999/reschedule", json={"run_at": "now"},
                                  headers=AUTH)).status_code == 404


async def test_cancel_a_running_job_stops_its_handler_no_retry_no_alert(
    dsn: str, db: Any, telegram_stub: Any
) -> None:
    started = trio.Event()
    slow, ended = sleeping_handler(started)
    # the default lease (60 s: renewed every 20 s); the cancel's NOTIFY asks for a renewal at once
    settings = service_settings(dsn, telegram_stub.url)
    assert settings.job_lease_seconds == 60
    async def quick(ctx: Any, job: Any) -> None:
        pass

    async with (
        running_service(settings, handlers={"slow.kind": slow, "after.kind": quick}) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], headers=AUTH) as client,
    ):
        store = JobStore(db)
        job = await store.enqueue(NewJob("slow.kind", {}, recipient="c1", max_attempts=5))
        after = await store.enqueue(NewJob("after.kind", {}, recipient="c1"))
        with trio.fail_after(10):
            await started.wait()
        response = await client.post(f"/admin/jobs/{job}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
        t0 = trio.current_time()
        await wait_until(lambda: ended == ["cancelled"], timeout=15)  # well before the 20 s renewal
        print(f"handler cancelled {trio.current_time() - t0:.2f} s after the cancel")
        # the recipient's next job runs; the cancelled one stays cancelled, never retried
        await wait_until(lambda: _status(db, after, "done"))
        row = await db.fetch_one("select status, attempts from jobs where id = %s", [job])
        assert (row["status"], row["attempts"]) == ("cancelled", 1)
        assert await db.fetch_val("select count(*) from alerts") == 0
        again = await client.post(f"/admin/jobs/{job}/cancel")
        assert again.status_code == 409


async def _status(db: Any, job: int | None, status: str) -> bool:
    return bool(await db.fetch_val("select status = %s from jobs where id = %s", [status, job]))


async def test_a_recipients_timeline_pause_resume_and_purge(app: RunningApp, db: Any) -> None:
    from autom.jobs.retry import RetryPolicy

    store = JobStore(db)
    # a delivery for chat 77 made one job; a second job follows; the first failed once, then ran
    event = (await post_update(app.client, ping(7, 77))).json()["id"]
    first = int(await db.fetch_val("select id from jobs where event_id = %s", [event]))
    second = await store.enqueue(NewJob("site.form", {}, recipient="77"))
    claimed = await claim_one(store)
    assert claimed is not None and claimed.id == first
    await fail(store, claimed, RuntimeError("flaky\nsecond line"), retry=RetryPolicy(base=0.0, cap=0.0))
    again = await claim_one(store)
    assert again is not None and again.id == first
    assert await complete(store, again)
    story = (await app.client.get("/admin/recipients/77", headers=AUTH)).json()
    assert (story["recipient"], story["paused"], story["blocked"]) == ("77", False, False)
    kinds = [(e["type"], e.get("job_id") or e.get("event_id")) for e in story["timeline"]]
    assert ("event", event) in kinds and ("job", first) in kinds and ("job", second) in kinds
    assert ("attempt", first) in kinds and ("done", first) in kinds
    attempt = next(e for e in story["timeline"] if e["type"] == "attempt")
    assert "flaky" in attempt["error"]
    ats = [e["at"] for e in story["timeline"]]
    assert ats == sorted(ats, reverse=True)  # newest first
    assert kinds.index(("event", event)) > kinds.index(("job", first))

    # pause: its jobs stay pending, claims take another recipient's; resume: claimed again
    other = await store.enqueue(NewJob("site.form", {}, recipient="78"))
    paused = await app.client.post("/admin/recipients/77/pause", headers=AUTH)
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert [j.id for j in await store.claim(10)] == [other]
    assert await db.fetch_val("select status from jobs where id = %s", [second]) == "pending"
    resumed = await app.client.post("/admin/recipients/77/resume", headers=AUTH)
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert [j.id for j in await store.claim(10)] == [second]

    # purge: every pending job of it ends cancelled
    later = [await store.enqueue(NewJob("site.form", {"n": n}, recipient="79")) for n in range(3)]
    purged = await app.client.post("/admin/recipients/79/purge", headers=AUTH)
    assert purged.json() == {"cancelled": 3}
    actions = await db.fetch_all("select via, action, target from audit_log order by id")
    assert [(a["via"], a["action"], a["target"]) for a in actions][-3:] == [
        ("api", "recipient_pause", "recipient:77"), ("api", "recipient_resume", "recipient:77"),
        ("api", "recipient_purge", "recipient:79")]
    statuses = [await db.fetch_val("select status from jobs where id = %s", [j]) for j in later]
    assert statuses == ["cancelled"] * 3
    assert (await app.client.get("/admin/recipients/79?limit=0", headers=AUTH)).status_code == 400
    odd = await app.client.get("/admin/recipients/a%3Fb%23c", headers=AUTH)
    assert odd.status_code == 200 and odd.json()["recipient"] == "a?b#c"


async def test_a_paused_recipient_survives_the_prune_of_idle_recipients(db: Any) -> None:
    from autom.db.queries import Q
    from autom.ops import Operations

    ops = Operations(db)
    await ops.pause_recipient("idle")
    await db.execute(Q.prune_recipients, {"batch": 100})
    assert (await ops.recipient("idle"))["paused"] is True
