"""OpenTelemetry tracing of real ``autom run`` processes, with the SDK's console exporter:
a delivery, its job, the job's follow-up (run by another process) and the follow-up's
Telegram and ``ctx.http`` calls are one trace; an incoming traceparent is continued;
without OTEL_* nothing of opentelemetry is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import trio

from autom.testing import HttpStub, Reply, running_http_stub
from tests.support.processes import AutomProcess, autom_processes
from tests.support.service import ADMIN_TOKEN, SITE_SECRET

USER_MODULE = '''
from datetime import timedelta

from autom import App, HandlerContext, Job, Router

router = Router()


@router.handler("site.form")
async def form(ctx: HandlerContext, job: Job) -> None:
    # due in an hour: the test reschedules it once this process has stopped
    await ctx.enqueue("traced.follow", {"text": job.payload.get("text", "")}, run_at=timedelta(hours=1))


@router.handler("traced.follow")
async def follow(ctx: HandlerContext, job: Job) -> None:
    await ctx.http.get(ctx.settings.telegram_api + "/ping")
    await ctx.telegram.send_message(42, job.payload["text"])


app = App()
app.include(router)
'''

TRACING = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "autom-test",
           "AUTOM_APP": "traced_app:app"}
SENT = json.dumps({"ok": True, "result": {"message_id": 1, "date": 1700000000, "chat": {"id": 42, "type": "private"},
                                          "text": "hi"}})


def spans(proc: AutomProcess) -> list[dict[str, Any]]:
    """The console exporter's spans in ``proc``'s output (indented JSON objects between its log lines)."""
    text, found, decoder = proc.log_text(), [], json.JSONDecoder()
    at = 0
    while (at := text.find("{\n", at)) != -1:
        try:
            obj, end = decoder.raw_decode(text, at)
        except ValueError:
            at += 2
            continue
        if isinstance(obj, dict) and "context" in obj:
            found.append(obj)
        at = end
    return found


async def wait_span(proc: AutomProcess, name: str) -> dict[str, Any]:
    """The first span called ``name`` that ``proc`` exports."""
    with trio.fail_after(20):
        while not (named := [s for s in spans(proc) if s["name"] == name]):
            await trio.sleep(0.05)
    return named[0]


def site_post(url: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Request:
    """A signed delivery to the site source."""
    import hashlib
    import hmac

    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SITE_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return httpx.Request("POST", url + "/hooks/site", content=body,
                         headers={"X-Signature": signature, "Content-Type": "application/json", **(headers or {})})


def plan_telegram(stub: HttpStub) -> None:
    """The stub answers sendMessage like Telegram (the /ping gets one too: it reads no body)."""
    stub.answers.extend(Reply(body=SENT) for _ in range(10))


async def test_delivery_job_follow_up_and_telegram_call_are_one_trace_across_processes(dsn, db, tmp_path: Path) -> None:
    async with running_http_stub() as stub, autom_processes(tmp_path) as procs:
        plan_telegram(stub)
        for name in ("autom-1", "autom-2"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "traced_app.py").write_text(USER_MODULE)
        first = await procs.start(dsn=dsn, telegram_url=stub.url, **TRACING)
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.send(site_post(first.url, {"text": "hi"}))
        assert answer.status_code == 202
        server = await wait_span(first, "POST /hooks/{source}")
        job = await wait_span(first, "job site.form")
        first.terminate()
        assert await first.wait(timeout=20) == 0

        follow_id = (await db.fetch_one("select id from jobs where kind = 'traced.follow'", {}))["id"]
        second = await procs.start(dsn=dsn, telegram_url=stub.url, **TRACING)
        async with httpx.AsyncClient(base_url=second.url, timeout=10,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
            moved = await admin.post(f"/admin/jobs/{follow_id}/reschedule", json={"run_at": "now"})
        assert moved.status_code == 200, moved.text
        follow = await wait_span(second, "job traced.follow")
        telegram = await wait_span(second, "telegram sendMessage")
        ping = await wait_span(second, "GET")
        with trio.fail_after(10):
            requests = await stub.wait_for_requests(2)

    trace_id = server["context"]["trace_id"]
    assert server["kind"] == "SpanKind.SERVER" and server["parent_id"] is None
    assert server["attributes"]["http.response.status_code"] == 202
    assert job["parent_id"] == server["context"]["span_id"]
    assert follow["parent_id"] == job["context"]["span_id"]
    assert telegram["parent_id"] == ping["parent_id"] == follow["context"]["span_id"]
    assert {s["context"]["trace_id"] for s in (server, job, follow, telegram, ping)} == {trace_id}
    assert all("TEST-token" not in json.dumps(s) for s in spans(second))
    assert server["resource"]["attributes"]["service.name"] == "autom-test"
    # traceparent went out with both calls: version-trace id-the client span-flags
    sent = {r["path"].rsplit("/", 1)[-1]: r["headers"].get("traceparent", "") for r in requests}
    assert sent["ping"].split("-")[1:3] == [trace_id[2:], ping["context"]["span_id"][2:]]
    assert sent["sendMessage"].split("-")[1:3] == [trace_id[2:], telegram["context"]["span_id"][2:]]


async def test_an_incoming_traceparent_is_continued(dsn, tmp_path: Path) -> None:
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with running_http_stub() as stub, autom_processes(tmp_path) as procs:
        (tmp_path / "autom-1").mkdir()
        (tmp_path / "autom-1" / "traced_app.py").write_text(USER_MODULE)
        proc = await procs.start(dsn=dsn, telegram_url=stub.url, **TRACING)
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.send(site_post(proc.url, {"text": "hi"}, {"traceparent": incoming}))
        assert answer.status_code == 202
        server = await wait_span(proc, "POST /hooks/{source}")
        job = await wait_span(proc, "job site.form")
    assert server["context"]["trace_id"] == job["context"]["trace_id"] == "0x0af7651916cd43dd8448eb211c80319c"
    assert server["parent_id"] == "0xb7ad6b7169203331"
    assert job["parent_id"] == server["context"]["span_id"]


NOTHING_IMPORTED = '''
import sys, trio
from tests.support.service import running_service, service_settings, telegram_update, TG_SECRET
import httpx

BLOCK = {block!r}
if BLOCK:  # the otel extra "not installed": every import of opentelemetry fails
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError("No module named " + repr(name))
            return None
    sys.meta_path.insert(0, Blocker())

async def main():
    settings = service_settings({dsn!r}, "http://127.0.0.1:9")
    async with running_service(settings) as service:
        async with httpx.AsyncClient(base_url=service.urls[0], timeout=10) as client:
            answer = await client.post("/hooks/telegram", json=telegram_update(1, 42, "/ping"),
                                       headers={{"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}})
            assert answer.status_code == 202, answer.text
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

trio.run(main)
'''


def run_script(dsn: str, env_extra: dict[str, str], block: bool) -> subprocess.CompletedProcess[str]:
    """NOTHING_IMPORTED in a fresh interpreter, OTEL_* only as ``env_extra`` gives them."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    env.update(env_extra)
    code = textwrap.dedent(NOTHING_IMPORTED.format(dsn=dsn, block=block))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parents[2]), stdin=subprocess.DEVNULL)


def test_without_otel_environment_nothing_of_opentelemetry_is_imported(dsn) -> None:
    done = run_script(dsn, {}, block=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_without_the_extra_the_service_runs_untraced_and_says_so(dsn) -> None:
    done = run_script(dsn, {"OTEL_TRACES_EXPORTER": "console"}, block=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "the otel extra is not installed" in done.stderr

