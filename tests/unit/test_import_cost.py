"""What starting autom imports: nothing of pytest's (a service's start, and every autom process
the tests start, would pay for it: about 0.1 s)."""

from __future__ import annotations

import subprocess
import sys

import trio
import trio.testing

from autom.events import batcher


def test_the_batchers_idle_wait_is_trio_testings_own() -> None:
    # taken from trio._core, where trio.testing has it from (trio.testing imports pytest)
    assert batcher.wait_all_tasks_blocked is trio.testing.wait_all_tasks_blocked
    assert trio.__version__.startswith("0."), "trio 1.0: is wait_all_tasks_blocked still in trio._core?"


def test_starting_the_service_imports_no_pytest() -> None:
    code = ("import sys, autom.service, autom.cli\n"
            "print(sorted(m for m in ('pytest', 'trio.testing') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
