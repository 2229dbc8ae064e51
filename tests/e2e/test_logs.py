"""Log lines of the real process: one JSON object per line, the context fields, no secrets."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

import httpx
import trio

from autom.logs import JsonFormatter, TextFormatter
from tests.support.processes import autom_processes
from tests.support.service import ADMIN_TOKEN, SITE_SECRET, TG_SECRET, post_telegram, telegram_update, wait_until
from tests.support.telegram_stub import Reply

BOT_TOKEN = "123456:TEST-token"


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("autom.worker", logging.INFO, __file__, 1, msg, (), None)
    rec.__dict__.update(extra)
    return rec


def test_json_lines_carry_the_context_fields():
    line = JsonFormatter().format(record("job done", job_id=5, kind="k", attempt=2, duration_ms=1.5, other="x"))
    data = json.loads(line)
    assert "\n" not in line
    assert {k: data[k] for k in ("level", "logger", "msg", "job_id", "kind", "attempt", "duration_ms")} == {
        "level": "info", "logger": "autom.worker", "msg": "job done", "job_id": 5, "kind": "k", "attempt": 2,
        "duration_ms": 1.5,
    }
    assert "other" not in data  # only the known context fields


def test_text_lines_are_readable():
    line = TextFormatter().format(record("job done", job_id=5, kind="k"))
    assert line.split(" ", 1)[1].startswith("info    autom.worker: job done")
    assert line.endswith("job_id=5 kind=k")


async def test_the_process_logs_json_with_ids_and_never_a_secret(dsn, db, telegram_stub, tmp_path):
    telegram_stub.plan("sendMessage", [Reply(502)], chat_id=61)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url)
        async with httpx.AsyncClient(base_url=proc.url) as client:
            assert (await post_telegram(client, telegram_update(9001, 61, "/ping"))).status_code == 202
            body = b'{"id": "form-1", "email": "ada@example.com"}'
            signature = hmac.new(SITE_SECRET.encode(), body, hashlib.sha256).hexdigest()
            assert (await client.post("/hooks/site", content=body,
                                      headers={"X-Signature": f"sha256={signature}"})).status_code == 202
            assert (await client.post("/hooks/site", content=body,
                                      headers={"X-Signature": "sha256=00"})).status_code == 401
            assert (await client.get("/admin/stats",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})).status_code == 200
        await wait_until(lambda: db.fetch_val(
            "select count(*) = 2 from jobs where status = 'done' and kind in ('telegram.message', 'site.form')"))
        proc.terminate()
        assert await proc.wait(timeout=15) == 0
        text = proc.log_text()
    records = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    done = [r for r in records if r["msg"] == "job done"]
    assert {r["kind"] for r in done} >= {"telegram.message", "site.form"}
    assert all(isinstance(r["job_id"], int) and r["attempt"] >= 1 and "duration_ms" in r for r in done)
    assert any(r["msg"].startswith("job failed, retrying") and r["job_id"] for r in records)
    for secret in (BOT_TOKEN, "TEST-token", TG_SECRET, SITE_SECRET, ADMIN_TOKEN, signature):
        assert secret not in text
    assert "ada@example.com" not in text  # no bodies in logs
    await trio.lowlevel.checkpoint()
