"""The soak, short: ``bench/soak.py --seconds 35`` (two replicas, kills, a PostgreSQL restart, a faulty Telegram).

The soak runs once per module as a child process (about a minute on a 2-core
machine: start-up, 35 s of chaos, the drain, the checks); each of its checks is
one test here, so a failure names the invariant that broke, and its problems and
the whole printed report are in the failure message. bench/soak.py's docstring
says what each check proves; bench/soak.md why it is built that way.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.proc import clean_env
from tests.support.processes import autom_processes
from tests.support.service import ALERT_CHAT, post_telegram, telegram_update
from tests.support.telegram_stub import Reply, TelegramStub

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "bench" / "soak.py"
CHECKS = ("intake", "redeliveries", "answers", "outcomes", "alerts", "fencing", "reruns", "limits", "processes")
#: the soak's tests are ``slow``: not in ``python -m pytest -n 2`` (its chaos needs the machine to
#: itself: replicas must restart within seconds), run alone after it (``python -m pytest -m slow``)
#: the soak's own bound (run + drain + quiesce) is well under this; this only stops a hang
TIMEOUT = 150


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the short soak once; its JSON report plus the printed output."""
    out = tmp_path_factory.mktemp("soak") / "report.json"
    completed = subprocess.run(
        [sys.executable, str(SOAK), "--seconds", "35", "--seed", "1", "--json", str(out)],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )
    if not out.exists():
        pytest.fail(f"the soak ended ({completed.returncode}) without a report:\n{completed.stdout[-8000:]}\n"
                    f"{completed.stderr[-8000:]}")
    report: dict[str, Any] = json.loads(out.read_text())
    report["output"] = completed.stdout
    report["returncode"] = completed.returncode
    return report


@pytest.mark.slow
@pytest.mark.parametrize("name", CHECKS)
def test_soak_check(soak: dict[str, Any], name: str) -> None:
    found = [c for c in soak["checks"] if c["name"] == name]
    assert len(found) == 1, f"the soak reported no check {name!r}"
    check = found[0]
    assert check["ok"], f"{name}: {check['detail']}\n" + "\n".join(check["problems"]) + "\n\n" + soak["output"]


@pytest.mark.slow
def test_soak_exit_code_matches_its_checks(soak: dict[str, Any]) -> None:
    assert {c["name"] for c in soak["checks"]} == set(CHECKS)
    assert soak["returncode"] == (0 if all(c["ok"] for c in soak["checks"]) else 1), soak["output"]


@pytest.mark.slow
def test_soak_really_was_disturbed(soak: dict[str, Any]) -> None:
    """The chaos happened: a run without kills or a database restart proves little."""
    figures = soak["figures"]
    assert figures["pg_restarts"] == 1, figures
    assert figures["restarts"] >= 2, figures
    assert figures["retries"] > 0 and figures["updates"] > 100, figures


# -- what a soak with an alert storm found (bench/soak.py --fail-rate 0.3), reduced to one process --


async def test_sigterm_still_reports_the_alerts_the_throttle_held(
    dsn: str, tmp_path: Path, telegram_stub: TelegramStub
) -> None:
    chats = [880_000 + n for n in range(8)]
    for chat in chats:
        telegram_stub.plan("sendMessage", [Reply(status=400, description="Bad Request: chat not found")], chat_id=chat)
    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=telegram_stub.url)
        async with httpx.AsyncClient(base_url=proc.url, timeout=10) as client:
            for number, chat in enumerate(chats, start=1):
                assert (await post_telegram(client, telegram_update(number, chat, "/ping"))).status_code == 202
        with trio.fail_after(20):
            while len(proc.logged("alert suppressed by the throttle")) < 3:
                await trio.sleep(0.05)
        proc.terminate()
        assert await proc.wait(timeout=20) == 0
    texts = [str(m["text"]) for m in telegram_stub.messages(ALERT_CHAT)]
    named = [t for t in texts if re.match(r"autom: job \d+ ", t)]
    summaries = [int(m.group(1)) for t in texts if (m := re.match(r"autom: (\d+) jobs failed for good, too many", t))]
    # the alert chat (a group) takes one message every 3 s: the first failure goes alone, the
    # rest are held, and the held alerts must reach the operators before the process is gone
    assert len(summaries) == 1 and summaries[0] >= 3 and len(named) + summaries[0] == len(chats), texts
