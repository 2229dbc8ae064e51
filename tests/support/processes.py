"""The real ``autom run`` as a child process, for fault tests (signals, kill -9, replicas).

::

    async with autom_processes(tmp_path) as procs:
        proc = await procs.start(dsn=dsn, telegram_url=stub.url, JOB_LEASE_SECONDS="2")
        await post_update(proc.url, telegram_update(1, 42, "/ping"))
        proc.terminate()                      # SIGTERM: drain
        assert await proc.wait(timeout=10) == 0

Each process gets a full environment (every required setting, ``TELEGRAM_API`` at
the stub, ``HOST=127.0.0.1``, ``PORT=0``, ``LOG_FORMAT=json``, short retry and
grace timings) in an otherwise clean one (``tests.support.proc.clean_env``), runs in
its own working directory (no stray ``.env``), and writes stderr (its JSON log
lines) to a file. ``start`` returns once the process logged the address it bound
("autom serving on http://127.0.0.1:NNNN") and ``/health`` answers 200. Leaving
the block kills whatever is still running (SIGKILL) and reaps it; the log of every
process that is not known to have ended well is printed, for pytest to show with
a failure.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.proc import AUTOM, clean_env
from tests.support.service import service_env

_SERVING = re.compile(r"autom serving on (http://[^\s,]+)")


def process_env(dsn: str, telegram_url: str, **overrides: str) -> dict[str, str]:
    """The environment of an ``autom run`` under test; ``overrides`` are settings by name."""
    settings = service_env(dsn, telegram_url)
    settings.update({"HTTP_TIMEOUT_SECONDS": "10", "SHUTDOWN_GRACE_SECONDS": "10", "LOG_FORMAT": "json",
                     "LOG_LEVEL": "info"})
    settings.update(overrides)
    return clean_env(**settings)


class AutomProcess:
    """One running ``autom run``: its address, its log, signals, exit."""

    def __init__(self, name: str, process: trio.Process, log_path: Path) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        #: the bound base URL ("http://127.0.0.1:NNNN"), set by ``AutomProcesses.start``
        self.url = ""

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        return self.process.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the process (nothing if it has exited)."""
        if self.process.returncode is None:
            self.process.send_signal(signum)

    def terminate(self) -> None:
        """SIGTERM: the first one drains, a second one cancels running jobs."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind."""
        self.send_signal(signal.SIGKILL)

    async def wait(self, timeout: float) -> int:
        """Wait for the exit and return its code; ``trio.TooSlowError`` after ``timeout`` seconds."""
        with trio.fail_after(timeout):
            return await self.process.wait()

    # -- the log -----------------------------------------------------------------

    def log_text(self) -> str:
        """Everything the process wrote to stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (other lines, e.g. a traceback, as ``{"raw": line}``)."""
        records = []
        for line in self.log_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            records.append(record if isinstance(record, dict) else {"raw": line})
        return records

    def logged(self, msg: str, **fields: Any) -> list[dict[str, Any]]:
        """Log records whose message contains ``msg`` and whose fields equal ``fields``."""
        return [
            r for r in self.log_records()
            if msg in str(r.get("msg", r.get("raw", ""))) and all(r.get(k) == v for k, v in fields.items())
        ]

    async def wait_logged(self, msg: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Wait until a matching log record appears; return the first one."""
        with trio.fail_after(timeout):
            while not (found := self.logged(msg, **fields)):
                if self.returncode is not None:
                    raise AssertionError(f"{self.name} exited ({self.returncode}) before logging {msg!r}")
                await trio.sleep(0.02)
        return found[0]


class AutomProcesses:
    """Starts ``autom run`` processes and owns them (see ``autom_processes``)."""

    def __init__(self, folder: Path, *, startup_timeout: float = 30.0) -> None:
        self.folder = folder
        #: how long ``start`` waits for a process to serve and be healthy
        self.startup_timeout = startup_timeout
        self.started: list[AutomProcess] = []
        self._numbers = itertools.count(1)

    async def start(self, *, dsn: str, telegram_url: str, args: Sequence[str] = (), **settings: str) -> AutomProcess:
        """Start ``autom run [args]`` and return once it serves and ``/health`` is 200.

        ``settings`` override ``process_env``'s defaults (``JOB_LEASE_SECONDS="2"``).
        """
        name = f"autom-{next(self._numbers)}"  # taken before any await: starts may run concurrently
        workdir = self.folder / name
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.folder / f"{name}.stderr.log"
        log_file = log_path.open("wb")  # a local file: opening it does not block
        try:
            process = await trio.lowlevel.open_process(
                [AUTOM, "run", *args], env=process_env(dsn, telegram_url, **settings), cwd=str(workdir),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            )
        finally:
            log_file.close()  # the child has its own descriptor
        proc = AutomProcess(name, process, log_path)
        self.started.append(proc)
        with trio.fail_after(self.startup_timeout):
            while not (match := _SERVING.search(proc.log_text())):
                if proc.returncode is not None:
                    raise AssertionError(f"{name} exited ({proc.returncode}) during start-up:\n{proc.log_text()}")
                await trio.sleep(0.02)
            proc.url = match.group(1)
            await wait_healthy(proc.url)
        return proc

    async def stop_all(self) -> None:
        """SIGKILL and reap every process still running; print the logs worth reading."""
        for proc in self.started:
            if proc.returncode is None:
                proc.kill()
                with trio.move_on_after(10):
                    await proc.process.wait()
        for proc in self.started:
            if proc.returncode != 0:
                print(f"----- {proc.name} (pid {proc.pid}, exit {proc.returncode}) stderr -----")
                print(proc.log_text()[-20000:])


@asynccontextmanager
async def autom_processes(folder: Path) -> AsyncIterator[AutomProcesses]:
    """A starter of ``autom run`` processes; every one still running is killed when the block ends."""
    procs = AutomProcesses(folder)
    try:
        yield procs
    finally:
        with trio.CancelScope(shield=True):
            await procs.stop_all()


async def wait_healthy(url: str, timeout: float = 15.0) -> None:
    """Wait until ``GET url/health`` answers 200."""
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
        with trio.fail_after(timeout):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.05)

