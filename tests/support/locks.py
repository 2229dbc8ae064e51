"""Seeing a statement wait for a row lock, without timing (lock-order tests)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg


def wait_for_lock_wait(dsn: str, pid: int, thread: threading.Thread, result: dict[str, Any],
                       hang_seconds: float = 60.0) -> None:
    """Return once backend ``pid`` waits for a lock (``pg_stat_activity``); fail if ``thread``
    (the one running its statement) ends first (``result`` says why), or after ``hang_seconds``
    (a hang guard, not a timing). Each poll is its own transaction (autocommit): within one,
    the statistics views are a snapshot taken at their first read."""
    deadline = time.monotonic() + hang_seconds
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while watcher.execute("select wait_event_type from pg_stat_activity where pid = %s",
                              (pid,)).fetchone() != ("Lock",):
            assert thread.is_alive(), result
            assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
            time.sleep(0.01)


def run_until_it_waits(dsn: str, conn: psycopg.Connection[Any], work: Callable[[], Any],
                       hang_seconds: float = 60.0) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``work()`` (statements on ``conn``), then commit ``conn``, in a thread; return once
    it waits for a lock. The result dict gets ``rows`` (what ``work`` returned) or ``error``."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["rows"] = work()
            conn.commit()
        except Exception as exc:  # the caller reports it
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wait_for_lock_wait(dsn, conn.info.backend_pid, thread, result, hang_seconds)
    return thread, result
