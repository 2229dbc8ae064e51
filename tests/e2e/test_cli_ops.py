"""``autom failed / retry / replay / telegram set-webhook`` through the real command."""

from __future__ import annotations

import json

import trio

from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.support.pg import with_lock_timeout
from tests.support.proc import clean_env, run_autom
from tests.support.service import SITE_SECRET, TG_SECRET


def env_for(dsn: str, **extra: str) -> dict[str, str]:
    return clean_env(DATABASE_URL=dsn, TELEGRAM_WEBHOOK_SECRET=TG_SECRET, SITE_WEBHOOK_SECRET=SITE_SECRET, **extra)


async def autom(*args: str, env: dict[str, str], cwd) -> object:
    return await trio.to_thread.run_sync(lambda: run_autom(*args, env=env, cwd=cwd))


async def make_failed_job(db, kind="site.form", error="RuntimeError: the CRM said no\nsecond line") -> int:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob(kind, {"n": 1}, max_attempts=1))
    job = await store.claim_one()
    await store.fail(job, error)
    return job_id


async def test_failed_lists_failed_jobs_readably_and_as_json(dsn, db, tmp_path):
    first = await make_failed_job(db)
    second = await make_failed_job(db, kind="telegram.message", error="x" * 500)
    result = await autom("failed", env=env_for(dsn, COLUMNS="100"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "KIND", "ATTEMPTS"]
    assert lines[1].split()[0] == str(second)  # latest failure first
    assert lines[2].split()[0] == str(first)
    assert "RuntimeError: the CRM said no second" in lines[2]
    assert all(len(line) <= 100 for line in lines[:3])
    assert "autom retry JOB_ID" in result.stdout

    as_json = await autom("failed", "--json", "--limit", "1", env=env_for(dsn), cwd=tmp_path)
    jobs = json.loads(as_json.stdout)
    assert [j["id"] for j in jobs] == [second]
    assert jobs[0]["status"] == "failed" and jobs[0]["attempts"] == 1


async def test_failed_with_none_says_so(dsn, tmp_path):
    result = await autom("failed", env=env_for(dsn), cwd=tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "no failed jobs")


async def test_retry_resets_a_failed_job_and_refuses_running_done_and_unknown(dsn, db, tmp_path):
    job_id = await make_failed_job(db)
    result = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"job {job_id} (site.form) is pending again" in result.stdout
    row = await db.fetch_one("select status, attempts, run_at <= now() as due from jobs where id = %s", [job_id])
    assert dict(row) == {"status": "pending", "attempts": 0, "due": True}
    # the retried job runs again (claimable now)
    job = await JobStore(db).claim_one()
    assert job.id == job_id and job.attempts == 1

    running = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert running.returncode == 1
    assert f"job {job_id} is running" in running.stderr and "replay" in running.stderr
    await JobStore(db).complete(job)
    done = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert done.returncode == 1 and "is done" in done.stderr

    unknown = await autom("retry", "999999", env=env_for(dsn), cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "autom: no job with id 999999"
    bad = await autom("retry", "abc", env=env_for(dsn), cwd=tmp_path)
    assert bad.returncode == 2


async def test_replay_creates_missing_jobs_and_skips_existing_keys(dsn, db, tmp_path):
    body = json.dumps({"update_id": 77, "message": {"message_id": 1, "text": "/ping", "chat": {"id": 5}}})
    event_id = await db.fetch_val(
        "insert into events (source, headers, body, dedup_key) values ('telegram', '{}', %s, '77') returning id",
        [body],
    )
    result = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = await db.fetch_one("select id, kind, recipient, event_id, key from jobs")
    assert dict(job) == {"id": job["id"], "kind": "telegram.message", "recipient": "5", "event_id": event_id,
                         "key": "telegram:77"}
    assert f"created job(s) {job['id']}" in result.stdout

    again = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert again.returncode == 0 and "no new jobs" in again.stdout
    assert await db.fetch_val("select count(*) from jobs") == 1

    unknown = await autom("replay", "424242", env=env_for(dsn), cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "autom: no event with id 424242"


async def test_replay_of_a_body_that_still_does_not_parse_is_refused(dsn, db, tmp_path):
    event_id = await db.fetch_val(
        "insert into events (source, headers, body) values ('site', '{}', 'not json') returning id")
    result = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 1 and "does not parse" in result.stderr


async def test_replay_needs_no_source_secret_in_the_shell(dsn, db, tmp_path):
    # an operator's shell has DATABASE_URL, not the webhook secrets: parsing a stored
    # (already verified) event needs none of them, for any known source
    env = clean_env(DATABASE_URL=dsn)
    telegram = json.dumps({"update_id": 78, "message": {"message_id": 1, "text": "/ping", "chat": {"id": 6}}})
    stripe = json.dumps({"id": "evt_1", "type": "invoice.paid", "data": {"object": {}}})
    ids = {}
    for source, body in (("telegram", telegram), ("stripe", stripe)):
        ids[source] = await db.fetch_val(
            "insert into events (source, headers, body) values (%s, '{}', %s) returning id", [source, body])
    for source, event_id in ids.items():
        result = await autom("replay", str(event_id), env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"event {event_id} ({source}): created job(s)" in result.stdout
    kinds = await db.fetch_all("select kind, event_id from jobs order by id")
    assert [(r["kind"], r["event_id"]) for r in kinds] == [("telegram.message", ids["telegram"]),
                                                           ("stripe.event", ids["stripe"])]


async def test_replay_refuses_an_event_of_an_unknown_source(dsn, db, tmp_path):
    event_id = await db.fetch_val(
        "insert into events (source, headers, body) values ('gitlab', '{}', '{}') returning id")
    result = await autom("replay", str(event_id), env=clean_env(DATABASE_URL=dsn), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"autom: event {event_id} came from source 'gitlab', "
                                            "which autom does not know (known: github, site, standard")
    assert len(result.stderr.strip().splitlines()) == 1
    assert await db.fetch_val("select count(*) from jobs") == 0


async def test_a_lock_held_elsewhere_is_one_line_and_exit_1_not_a_traceback(dsn, db, tmp_path):
    # an operator's psql (or a migration) holds the job's row, then the whole table; the
    # CLI's sessions give up after lock_timeout (set in DATABASE_URL as an operator would)
    job_id = await make_failed_job(db)
    event_id = await db.fetch_val(
        "insert into events (source, headers, body) values ('site', '{}', '{\"id\": \"f1\"}') returning id")
    env = env_for(with_lock_timeout(dsn))
    async with db.transaction() as tx:
        await tx.execute("select 1 from jobs where id = %s for update", [job_id])
        await tx.execute("select 1 from events where id = %s for update", [event_id])
        retry = await autom("retry", str(job_id), env=env, cwd=tmp_path)
        replay = await autom("replay", str(event_id), env=env, cwd=tmp_path)
        await tx.execute("lock table jobs in access exclusive mode")
        failed = await autom("failed", env=env, cwd=tmp_path)
    for result in (retry, replay, failed):
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr.strip() == ("autom: database busy: a row or table it needs is locked by another "
                                         "transaction (lock timeout); try again in a moment"), result.stderr
    # nothing changed, and once the lock is gone the same commands work
    assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "failed"
    assert (await autom("retry", str(job_id), env=env, cwd=tmp_path)).returncode == 0
    assert (await autom("replay", str(event_id), env=env, cwd=tmp_path)).returncode == 0


async def test_set_webhook_registers_url_and_secret(telegram_stub, tmp_path):
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_WEBHOOK_SECRET=TG_SECRET, TELEGRAM_API=telegram_stub.url)
    result = await autom("telegram", "set-webhook", "https://hooks.example.com", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "https://hooks.example.com/hooks/telegram" in result.stdout
    call = telegram_stub.calls_of("setWebhook")[0]
    assert call.params["url"] == "https://hooks.example.com/hooks/telegram"
    assert call.params["secret_token"] == TG_SECRET
    assert "42:ABC" not in result.stdout + result.stderr


async def test_set_webhook_validates_secret_and_url(tmp_path):
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_WEBHOOK_SECRET="has spaces!")
    bad_secret = await autom("telegram", "set-webhook", "https://h.example.com/hooks/telegram", env=env, cwd=tmp_path)
    assert bad_secret.returncode == 1 and "A-Z a-z 0-9 _ -" in bad_secret.stderr
    assert "has spaces" not in bad_secret.stderr
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_WEBHOOK_SECRET="ok_secret")
    plain = await autom("telegram", "set-webhook", "http://h.example.com/", env=env, cwd=tmp_path)
    assert plain.returncode == 1 and "https://" in plain.stderr
    missing = await autom("telegram", "set-webhook", env=env, cwd=tmp_path)
    assert missing.returncode == 2
