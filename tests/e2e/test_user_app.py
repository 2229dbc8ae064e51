"""A user's automations in their own module, served by the real ``autom run`` process,
and the one-line failures of a module that cannot be served."""

from __future__ import annotations

import hashlib
import hmac
import json
import textwrap
from pathlib import Path

import httpx
import pytest
import trio

from autom.testing.telegram_stub import TelegramStub
from tests.support.proc import clean_env, run_autom
from tests.support.processes import autom_processes

CRM_SECRET = "crm-secret"

USER_MODULE = '''
"""A user's automations: a signed `crm` webhook whose leads are announced in Telegram."""
import hashlib, hmac
from autom import App, HandlerContext, Job, NewJob, Parsed, Router, VerificationError
from autom.sources.base import load_object

router = Router()


@router.handler("crm.lead", max_attempts=3, timeout=10)
async def lead(ctx: HandlerContext, job: Job) -> None:
    await ctx.enqueue("telegram.send", {"chat_id": 777, "text": f"lead {job.payload['name']}"},
                      recipient="777")


class CrmSource:
    name = "crm"
    secret_headers = frozenset({"x-crm-signature"})

    def verify(self, headers, body, now):
        expected = hmac.new(b"CRM_SECRET", body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("x-crm-signature", ""), expected):
            raise VerificationError("bad x-crm-signature")

    def dedup_key(self, headers, body):
        return None

    def parse(self, headers, text):
        lead = load_object(text)
        return Parsed(None, [NewJob("crm.lead", lead, recipient=lead.get("email"))])


app = App()
app.include(router)
app.source(CrmSource())
'''.replace("CRM_SECRET", CRM_SECRET)


async def test_a_user_source_and_handler_are_served_from_a_user_module(dsn, db, tmp_path: Path,
                                                                       telegram_stub: TelegramStub) -> None:
    workdir = tmp_path / "autom-1"  # the first process's working directory: its modules import
    workdir.mkdir()
    (workdir / "crm_automations.py").write_text(USER_MODULE)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, AUTOM_APP="crm_automations:app")
        body = json.dumps({"name": "Ada", "email": "ada@example.com"}).encode()
        signature = hmac.new(CRM_SECRET.encode(), body, hashlib.sha256).hexdigest()
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            refused = await client.post("/hooks/crm", content=body, headers={"X-CRM-Signature": "0" * 64})
            accepted = await client.post("/hooks/crm", content=body, headers={"X-CRM-Signature": signature})
        assert (refused.status_code, accepted.status_code) == (401, 202)
        assert accepted.json()["jobs"] == 1
        with trio.fail_after(15):
            calls = await telegram_stub.wait_for_calls(1, method="sendMessage")
        assert [(c.params["chat_id"], c.params["text"]) for c in calls] == [(777, "lead Ada")]
        registered = [r["msg"] for r in proc.log_records() if r.get("msg", "").startswith("registered")]
        assert len(registered) == 1 and "crm.lead" in registered[0] and "crm," in registered[0]
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    # the operator replays the user source's event: AUTOM_APP's sources parse it again
    replay = run_autom("replay", str(accepted.json()["id"]), cwd=workdir,
                       env=clean_env(DATABASE_URL=dsn, AUTOM_APP="crm_automations:app"))
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.startswith(f"event {accepted.json()['id']} (crm): created job(s) ")
    # the replayed job carries its kind's max_attempts (3, the user's handler), as the intake's did
    rows = await db.fetch_all("select max_attempts from jobs where kind = 'crm.lead' order by id")
    assert [r["max_attempts"] for r in rows] == [3, 3]


def run_env(dsn: str = "postgresql://postgres@127.0.0.1:1/none", **extra: str) -> dict[str, str]:
    return clean_env(DATABASE_URL=dsn, TELEGRAM_BOT_TOKEN="1:x", TELEGRAM_ALERT_CHAT_ID="1",
                     TELEGRAM_WEBHOOK_SECRET="s", SITE_WEBHOOK_SECRET="s", ADMIN_TOKEN="a" * 24, **extra)


@pytest.mark.parametrize(("module", "spec", "expected"), [
    (None, "nowhere:app", "autom: AUTOM_APP=nowhere:app: cannot import module 'nowhere': "
                          "ModuleNotFoundError: No module named 'nowhere'"),
    ("x = 1\nraise RuntimeError('no CRM_URL set')\n", "broken:app",
     "autom: AUTOM_APP=broken:app: cannot import module 'broken': RuntimeError: no CRM_URL set ({dir}/broken.py, "
     "line 2)"),
    ("def f(:\n", "broken:app", "autom: AUTOM_APP=broken:app: cannot import module 'broken': SyntaxError: "
                                "invalid syntax ({dir}/broken.py, line 1)"),
    ("app = 5\n", "broken:app", "autom: AUTOM_APP=broken:app: broken.app is a int, not an autom.App"),
    ("import autom\n", "broken:app", "autom: AUTOM_APP=broken:app: module 'broken' has no attribute 'app'"),
    ("import autom\napp = autom.App()\napp.schedule('nightly', daily_at='02:00')\n", "broken:app",
     "autom: schedule without a handler: 'nightly' (register one with @app.handler)"),
    (None, "no-colon", "autom: AUTOM_APP='no-colon' must be module:attribute, for example shop_automations:app"),
])
def test_an_app_that_cannot_be_served_is_one_line_exit_1(tmp_path: Path, module: str | None, spec: str,
                                                         expected: str) -> None:
    if module is not None:
        (tmp_path / "broken.py").write_text(textwrap.dedent(module))
    result = run_autom("run", env=run_env(AUTOM_APP=spec), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == expected.format(dir=tmp_path)


def test_app_option_wins_over_the_setting_and_says_so(tmp_path: Path) -> None:
    result = run_autom("run", "--app", "nowhere:app", env=run_env(AUTOM_APP="other:app"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("autom: --app=nowhere:app: cannot import module 'nowhere'")


ONCE_MODULE = '''
import os
import trio
from autom import App, HandlerContext, Job

app = App()


@app.handler("pay")
async def pay(ctx: HandlerContext, job: Job) -> None:
    async with ctx.once("pay:1") as todo:
        if todo:
            ctx.check(await ctx.http.post(os.environ["PAY_URL"], json={"job": job.id}))
    if job.attempts == 1:
        await trio.sleep(3600)  # the process is killed here, after the effect was recorded
'''


async def test_a_once_effect_is_not_repeated_after_the_process_is_killed(dsn, tmp_path: Path,
                                                                        telegram_stub: TelegramStub) -> None:
    from autom.testing import running_http_stub

    for name in ("autom-1", "autom-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pay_automations.py").write_text(ONCE_MODULE)
    async with running_http_stub() as pay, autom_processes(tmp_path) as procs:
        settings = {"AUTOM_APP": "pay_automations:app", "PAY_URL": pay.url, "JOB_LEASE_SECONDS": "2"}
        first = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **settings)
        job_id = autom_enqueue(dsn, "pay")
        with trio.fail_after(15):  # the effect happened and its key committed: then the kill
            while not (pay.requests and once_recorded(dsn, "pay:1")):
                await trio.sleep(0.02)
        first.kill()
        await first.wait(timeout=10)
        second = await procs.start(dsn=dsn, telegram_url=telegram_stub.url, **settings)
        with trio.fail_after(20):
            while job_status(dsn, job_id) != ("done", 2):
                await trio.sleep(0.05)
        assert len(pay.requests) == 1  # the retry found the key and did not pay again
        second.terminate()
        assert await second.wait(timeout=20) == 0


def autom_enqueue(dsn: str, kind: str) -> int:
    import autom

    job_id = autom.enqueue_sync(dsn, kind, {})
    assert job_id is not None
    return job_id


def job_status(dsn: str, job_id: int) -> tuple[str, int]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("select status, attempts from jobs where id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0], row[1]


def once_recorded(dsn: str, key: str) -> bool:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("select exists (select 1 from autom_once where key = %s and state = 'done')", [key])
        return row.fetchone() == (True,)
