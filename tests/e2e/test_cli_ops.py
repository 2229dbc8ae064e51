"""``autom failed / retry / replay / telegram set-webhook / telegram info`` through the real command."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime

import trio

from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.support.pg import with_lock_timeout
from tests.support.proc import AUTOM, clean_env, run_autom
from tests.support.queue import claim_one, complete, fail
from tests.support.service import SITE_SECRET, TG_SECRET
from tests.support.telegram_stub import Reply


def env_for(dsn: str, **extra: str) -> dict[str, str]:
    return clean_env(DATABASE_URL=dsn, TELEGRAM_WEBHOOK_SECRET=TG_SECRET, SITE_WEBHOOK_SECRET=SITE_SECRET, **extra)


async def autom(*args: str, env: dict[str, str], cwd) -> object:
    return await trio.to_thread.run_sync(lambda: run_autom(*args, env=env, cwd=cwd))


async def make_failed_job(db, kind="site.form", error="RuntimeError: the CRM said no\nsecond line") -> int:
    store = JobStore(db)
    job_id = await store.enqueue(NewJob(kind, {"n": 1}, max_attempts=1))
    job = await claim_one(store)
    await fail(store, job, error)
    return job_id


TELEGRAM_400 = "PermanentError: telegram sendMessage: HTTP 400 Bad Request: chat not found"


def run_on_a_terminal(*args: str, env: dict[str, str], cwd) -> str:
    """``autom ARGS`` with its stdout on a pseudo-terminal (as an operator types it); the output."""
    leader, follower = os.openpty()
    try:
        proc = subprocess.run([AUTOM, *args], env=env, cwd=cwd, stdout=follower, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=60, check=False)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side is closed and everything was read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, proc.stderr
    return b"".join(chunks).decode().replace("\r\n", "\n")


async def test_failed_shows_control_characters_of_stored_text_escaped(dsn, db, tmp_path):
    # an error text (and a kind) holding a terminal's escape sequences and a bidi override
    job_id = await make_failed_job(db, kind="site.\x1b[31mform", error="boom \x1b[2J\x1b]0;owned\x07 \u202eevil\x9b")
    for shown in (
        (await autom("failed", env=env_for(dsn), cwd=tmp_path)).stdout,
        await trio.to_thread.run_sync(lambda: run_on_a_terminal("failed", env=env_for(dsn, COLUMNS="200"),
                                                                cwd=tmp_path)),
    ):
        assert str(job_id) in shown
        assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown and "\x9b" not in shown
        assert r"boom \x1b[2J\x1b]0;owned\x07 \u202eevil\x9b" in shown
        assert r"site.\x1b[31mform" in shown


async def test_job_shows_a_multi_line_error_as_lines_with_control_characters_escaped(dsn, db, tmp_path):
    error = ("RuntimeError: the CRM said no\r\n  field email: invalid\n  field \x1b[2Jphone\r: \u202emissing\n"
             "\tsee https://crm.example.com/errors/42\n")
    job_id = await make_failed_job(db, error=error)
    # the row as SQL (or an older version) may have left it: a lone carriage return too
    await db.execute("update jobs set last_error = %s where id = %s", [error, job_id])
    for shown in (
        (await autom("job", str(job_id), env=env_for(dsn), cwd=tmp_path)).stdout,
        await trio.to_thread.run_sync(lambda: run_on_a_terminal("job", str(job_id), env=env_for(dsn),
                                                                cwd=tmp_path)),
    ):
        lines = shown.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("last_error:"))
        assert lines[at:at + 4] == [
            "last_error:   RuntimeError: the CRM said no",
            "                field email: invalid",
            r"                field \x1b[2Jphone\x0d: \u202emissing",
            "                  see https://crm.example.com/errors/42",
        ], shown
        # the attempt's error (stored with its line ends made \n): its lines under its own heading
        assert ("  error: RuntimeError: the CRM said no\n           field email: invalid\n"
                "           field \\x1b[2Jphone\n         : \\u202emissing\n") in shown, shown
        assert "\x1b" not in shown and "\u202e" not in shown and "\r" not in shown and r"\x0a" not in shown


async def test_failed_lists_failed_jobs_readably_and_as_json(dsn, db, tmp_path):
    first = await make_failed_job(db)
    second = await make_failed_job(db, kind="telegram.message", error=TELEGRAM_400 + " " + "x" * 300)
    # in a pipe (a script, grep, a file): never cut, the API's own description first
    result = await autom("failed", env=env_for(dsn, COLUMNS="100"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "KIND", "ATTEMPTS"]
    assert lines[1].split()[0] == str(second)  # latest failure first
    assert lines[2].split()[0] == str(first)
    assert "RuntimeError: the CRM said no second line" in lines[2]
    assert "Bad Request: chat not found " + "x" * 300 + " (PermanentError: telegram sendMessage: HTTP 400)" in lines[1]
    assert "autom retry JOB_ID" in result.stdout

    # on a terminal: cut to its width, and what is left still says "chat not found"
    shown = await trio.to_thread.run_sync(
        lambda: run_on_a_terminal("failed", env=env_for(dsn, COLUMNS="100"), cwd=tmp_path))
    rows = shown.splitlines()
    assert all(len(line) <= 100 for line in rows[:3]), rows
    assert "Bad Request: chat not found" in rows[1] and rows[1].endswith("…")

    as_json = await autom("failed", "--json", "--limit", "1", env=env_for(dsn), cwd=tmp_path)
    jobs = json.loads(as_json.stdout)
    assert [j["id"] for j in jobs] == [second]
    assert jobs[0]["status"] == "failed" and jobs[0]["attempts"] == 1
    assert jobs[0]["last_error"].startswith(TELEGRAM_400)  # the stored text itself, unchanged


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
    job = await claim_one(JobStore(db))
    assert job.id == job_id and job.attempts == 1

    running = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert running.returncode == 1
    assert f"job {job_id} is running" in running.stderr and "replay" in running.stderr
    await complete(JobStore(db), job)
    done = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert done.returncode == 1 and "is done" in done.stderr

    unknown = await autom("retry", "999999", env=env_for(dsn), cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "autom: no job with id 999999"
    bad = await autom("retry", "abc", env=env_for(dsn), cwd=tmp_path)
    assert bad.returncode == 2


async def test_replay_creates_the_jobs_and_again_when_they_exist(dsn, db, tmp_path):
    body = json.dumps({"update_id": 77, "message": {"message_id": 1, "text": "/ping", "chat": {"id": 5}}})
    event_id = await db.fetch_val(
        "insert into events (source, headers, body, dedup_key) values ('telegram', '{}', %s, '77') returning id",
        [body],
    )
    result = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = await db.fetch_one("select id, kind, recipient, event_id, key from jobs")
    assert (job["kind"], job["recipient"], job["event_id"]) == ("telegram.message", "5", event_id)
    assert job["key"].startswith("telegram:77:replay:")
    assert f"created job(s) {job['id']}" in result.stdout

    # the job exists (and could be done): a replay makes new work all the same, no dead end
    again = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = await db.fetch_val("select max(id) from jobs")
    assert f"created job(s) {second}" in again.stdout and second != job["id"]
    assert await db.fetch_val("select count(distinct key) from jobs where event_id = %s", [event_id]) == 2

    unknown = await autom("replay", "424242", env=env_for(dsn), cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "autom: no event with id 424242"


async def test_retry_of_a_done_job_points_at_its_event_and_replay_runs_it(dsn, db, tmp_path):
    body = json.dumps({"update_id": 90, "message": {"message_id": 1, "text": "/ping", "chat": {"id": 9}}})
    event_id = await db.fetch_val(
        "insert into events (source, headers, body, dedup_key) values ('telegram', '{}', %s, '90') returning id",
        [body],
    )
    job_id = await db.fetch_val(
        "insert into jobs (kind, status, key, event_id, finished_at) values "
        "('telegram.message', 'done', 'telegram:90', %s, now()) returning id", [event_id])
    done = await autom("retry", str(job_id), env=env_for(dsn), cwd=tmp_path)
    assert done.returncode == 1 and f"replay event {event_id}" in done.stderr
    replay = await autom("replay", str(event_id), env=env_for(dsn), cwd=tmp_path)
    assert replay.returncode == 0 and "created job(s)" in replay.stdout


async def test_cancel_a_pending_job_and_refuse_the_others(dsn, db, tmp_path):
    store = JobStore(db)
    waiting = await store.enqueue(NewJob("site.form", {"n": 1}))
    result = await autom("cancel", str(waiting), env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"job {waiting} (site.form) is cancelled" in result.stdout
    assert await db.fetch_val("select status from jobs where id = %s", [waiting]) == "cancelled"
    assert await claim_one(store) is None  # never runs
    assert await db.fetch_val("select count(*) from alerts") == 0  # and raises no alert

    again = await autom("cancel", str(waiting), env=env_for(dsn), cwd=tmp_path)
    assert again.returncode == 1 and "is cancelled" in again.stderr
    failed = await make_failed_job(db)
    refused = await autom("cancel", str(failed), env=env_for(dsn), cwd=tmp_path)
    assert refused.returncode == 1 and "is failed" in refused.stderr and "only a pending job" in refused.stderr
    unknown = await autom("cancel", "999999", env=env_for(dsn), cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "autom: no job with id 999999"

    # a cancelled job can be retried: it runs after all
    back = await autom("retry", str(waiting), env=env_for(dsn), cwd=tmp_path)
    assert back.returncode == 0, back.stderr
    assert (await claim_one(store)).id == waiting


async def test_retry_failed_in_bulk_with_kind_and_since(dsn, db, tmp_path):
    a = [await make_failed_job(db, kind="a.kind") for _ in range(3)]
    b = await make_failed_job(db, kind="b.kind")
    await db.execute("update jobs set finished_at = now() - interval '3 days' where id = %s", [a[0]])
    result = await autom("retry", "--failed", "--kind", "a.kind", "--since", "1d", env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "retried 2, skipped 0" in result.stdout
    rows = dict((r["id"], r["status"]) for r in await db.fetch_all("select id, status from jobs"))
    assert rows == {a[0]: "failed", a[1]: "pending", a[2]: "pending", b: "failed"}
    everything = await autom("retry", "--failed", env=env_for(dsn), cwd=tmp_path)
    assert "retried 2, skipped 0" in everything.stdout
    none = await autom("retry", "--failed", env=env_for(dsn), cwd=tmp_path)
    assert "retried 0, skipped 0" in none.stdout

    for args in (["retry"], ["retry", "1", "--failed"], ["retry", "1", "--kind", "x"],
                 ["retry", "--failed", "--since", "yesterday"]):
        bad = await autom(*args, env=env_for(dsn), cwd=tmp_path)
        assert bad.returncode == 2, (args, bad.stdout, bad.stderr)
        assert "Traceback" not in bad.stderr


async def test_pause_and_resume_a_kind(dsn, db, tmp_path):
    store = JobStore(db)
    held = await store.enqueue(NewJob("site.form", {"n": 1}))
    other = await store.enqueue(NewJob("github.event", {"n": 2}))
    result = await autom("pause", "site.form", env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0 and "is paused now" in result.stdout
    assert "was paused already" in (await autom("pause", "site.form", env=env_for(dsn), cwd=tmp_path)).stdout
    claimed = await store.claim(10)
    assert [j.id for j in claimed] == [other]  # the paused kind stays pending
    assert await db.fetch_val("select status from jobs where id = %s", [held]) == "pending"
    resumed = await autom("resume", "site.form", env=env_for(dsn), cwd=tmp_path)
    assert resumed.returncode == 0 and "is resumed" in resumed.stdout
    assert [j.id for j in await store.claim(10)] == [held]
    assert "was not paused" in (await autom("resume", "site.form", env=env_for(dsn), cwd=tmp_path)).stdout
    typo = await autom("pause", "site.from", env=env_for(dsn), cwd=tmp_path)
    assert typo.returncode == 1 and "site.from" in typo.stderr and "Traceback" not in typo.stderr
    assert await db.fetch_val("select count(*) from paused_kinds") == 0


async def test_jobs_lists_with_filters_and_json(dsn, db, tmp_path):
    store = JobStore(db)
    ids = [await store.enqueue(NewJob("k.one" if i % 2 else "k.two", {"i": i}, recipient=f"r{i % 3}"))
           for i in range(6)]
    result = await autom("jobs", env=env_for(dsn), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [int(line.split()[0]) for line in result.stdout.splitlines()[1:7]] == ids[::-1]
    one = await autom("jobs", "--kind", "k.one", "--recipient", "r1", "--json", env=env_for(dsn), cwd=tmp_path)
    assert [j["id"] for j in json.loads(one.stdout)] == [ids[1]]  # odd i (k.one) and i % 3 == 1 (r1): i = 1
    paged = await autom("jobs", "--limit", "2", "--before", str(ids[3]), "--json", env=env_for(dsn), cwd=tmp_path)
    assert [j["id"] for j in json.loads(paged.stdout)] == [ids[2], ids[1]]
    none = await autom("jobs", "--status", "failed", env=env_for(dsn), cwd=tmp_path)
    assert none.stdout.strip() == "no jobs match"
    bad = await autom("jobs", "--status", "weird", env=env_for(dsn), cwd=tmp_path)
    assert bad.returncode == 2


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
    assert call.params["allowed_updates"] == ["message", "edited_message", "callback_query", "my_chat_member"]
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


async def test_set_webhook_registers_max_connections(telegram_stub, tmp_path):
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_WEBHOOK_SECRET=TG_SECRET, TELEGRAM_API=telegram_stub.url,
                    TELEGRAM_MAX_CONNECTIONS="7")
    result = await autom("telegram", "set-webhook", "https://hooks.example.com", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert telegram_stub.calls_of("setWebhook")[0].params["max_connections"] == 7
    assert "max_connections 7" in result.stdout
    env["TELEGRAM_MAX_CONNECTIONS"] = "101"
    result = await autom("telegram", "set-webhook", "https://hooks.example.com", env=env, cwd=tmp_path)
    assert result.returncode == 1 and "TELEGRAM_MAX_CONNECTIONS must be between 1 and 100" in result.stderr


async def test_telegram_info_prints_the_bot_and_its_webhook(telegram_stub, tmp_path):
    telegram_stub.plan("getWebhookInfo", [Reply(result={
        "url": "https://hooks.example.com/hooks/telegram", "has_custom_certificate": False,
        "pending_update_count": 17, "max_connections": 40, "allowed_updates": ["message"],
        "last_error_date": int(time.time()) - 300,
        "last_error_message": "Wrong response from the webhook: 500 Internal Server Error",
    })])
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_API=telegram_stub.url)
    result = await autom("telegram", "info", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "@autom_stub_bot (id 1)" in out
    assert "webhook:          https://hooks.example.com/hooks/telegram" in out
    assert "pending updates:  17" in out and "max connections:  40" in out
    assert "(5 minutes ago): Wrong response from the webhook: 500 Internal Server Error" in out
    assert "42:ABC" not in out + result.stderr


async def test_telegram_info_without_a_webhook_and_with_a_wrong_token(telegram_stub, tmp_path):
    env = clean_env(TELEGRAM_BOT_TOKEN="42:ABC", TELEGRAM_API=telegram_stub.url)
    telegram_stub.plan("getWebhookInfo", [Reply(result={"url": "", "pending_update_count": 3})])
    result = await autom("telegram", "info", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "webhook:          not set" in result.stdout and "last error:       none" in result.stdout
    telegram_stub.plan("getMe", [Reply(status=401, description="Unauthorized")])
    result = await autom("telegram", "info", env=env, cwd=tmp_path)
    assert result.returncode == 1 and "Unauthorized" in result.stderr and "Traceback" not in result.stderr
    assert "42:ABC" not in result.stderr
    missing = await autom("telegram", "info", env=clean_env(), cwd=tmp_path)
    assert missing.returncode == 1 and "TELEGRAM_BOT_TOKEN" in missing.stderr


async def test_reschedule_at_a_time_or_now(dsn, db, tmp_path):
    store = JobStore(db)
    job = await store.enqueue(NewJob("site.form", {"n": 1}, run_at=datetime(2999, 1, 1, tzinfo=UTC)))
    at = await autom("reschedule", str(job), "--at", "2031-05-01T09:30:00Z", env=env_for(dsn), cwd=tmp_path)
    assert at.returncode == 0 and "2031-05-01 09:30:00" in at.stdout, at.stderr
    now = await autom("reschedule", str(job), "--now", env=env_for(dsn), cwd=tmp_path)
    assert now.returncode == 0, now.stderr
    assert (await claim_one(store)).id == job
    refused = await autom("reschedule", str(job), "--now", env=env_for(dsn), cwd=tmp_path)
    assert refused.returncode == 1 and "only a pending job" in refused.stderr
    for args in (["reschedule", str(job)], ["reschedule", str(job), "--now", "--at", "2031-01-01"],
                 ["reschedule", str(job), "--at", "6h"]):
        assert (await autom(*args, env=env_for(dsn), cwd=tmp_path)).returncode == 2, args


async def test_recipient_pause_resume_and_purge(dsn, db, tmp_path):
    store = JobStore(db)
    job = await store.enqueue(NewJob("site.form", {"n": 1}, recipient="555"))
    paused = await autom("recipient", "pause", "555", env=env_for(dsn), cwd=tmp_path)
    assert paused.returncode == 0 and "is paused" in paused.stdout, paused.stderr
    assert await store.claim(10) == []
    resumed = await autom("recipient", "resume", "555", env=env_for(dsn), cwd=tmp_path)
    assert resumed.returncode == 0 and "is resumed" in resumed.stdout
    await store.enqueue(NewJob("site.form", {"n": 2}, recipient="555"))
    purged = await autom("recipient", "purge", "555", env=env_for(dsn), cwd=tmp_path)
    assert purged.returncode == 0 and "2 pending job(s) cancelled" in purged.stdout
    assert await db.fetch_val("select status from jobs where id = %s", [job]) == "cancelled"


async def test_a_recipient_with_a_slash_in_its_id_from_the_shell(dsn, db, tmp_path):
    store = JobStore(db)
    job = await store.enqueue(NewJob("site.form", {"n": 1}, recipient="site:/contact"))
    paused = await autom("recipient", "pause", "site:/contact", env=env_for(dsn), cwd=tmp_path)
    assert paused.returncode == 0 and "recipient site:/contact is paused" in paused.stdout, paused.stderr
    listed = await autom("jobs", "--recipient", "site:/contact", "--json", env=env_for(dsn), cwd=tmp_path)
    assert listed.returncode == 0 and [j["id"] for j in json.loads(listed.stdout)] == [job], listed.stdout
    purged = await autom("recipient", "purge", "site:/contact", env=env_for(dsn), cwd=tmp_path)
    assert purged.returncode == 0 and "1 pending job(s) cancelled" in purged.stdout
