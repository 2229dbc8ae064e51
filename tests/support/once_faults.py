"""Fault scenarios for ``ctx.once`` with real ``autom run`` processes, counted at the effect's edge.

Each scenario runs a user module whose handler does one side effect per key inside
``ctx.once`` (a POST to a local stub that records it) and, inside the same block, enqueues
a follow-up job (which POSTs again when it runs); then it counts, per key, how often the
effect and the follow-up happened and how the jobs ended. The tests
(tests/e2e/test_once_faults.py) run each once and require every count to be 1;
``bench/faults.py`` runs them for many rounds and prints the counts.

- ``follow_up``: the handler raises after its block on its first attempt (a retry).
- ``outage``: every block is inside its effect when PostgreSQL is restarted (``restart``) or
  frozen with SIGSTOP (``freeze``) for ``seconds``; the effects answer during the outage.
- ``shared_keys``: two jobs share each key, on two replicas at once.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio

from autom.testing.telegram_stub import running_stub, serving
from tests.support.processes import AutomProcess, AutomProcesses, autom_processes
from tests.support.restartable_pg import RestartablePg
from tests.support.telegram_stub import _lifespan, _read_body, _send_bytes

EFFECT_MODULE = '''
import os
from autom import App, HandlerContext, Job

app = App(builtins=False)


@app.handler("effect", max_attempts=20)
async def effect(ctx: HandlerContext, job: Job) -> None:
    key = job.payload["key"]
    async with ctx.once(key) as todo:
        if todo:
            ctx.check(await ctx.http.post(os.environ["EFFECT_URL"] + "/effect", json={"key": key, "job": job.id}))
            await ctx.enqueue("follow", {"key": key})
    if job.payload.get("fail_first") and job.attempts == 1:
        raise RuntimeError("failed after the effect")


@app.handler("follow", max_attempts=20)
async def follow(ctx: HandlerContext, job: Job) -> None:
    ctx.check(await ctx.http.post(os.environ["EFFECT_URL"] + "/follow", json={"key": job.payload["key"]}))
'''


class EffectStub:
    """Records each POST (path, key); answers 200, or waits while its gate is closed."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[tuple[str, str]] = []
        #: how long each answer takes (after the gate)
        self.delay = 0.0
        self.in_flight: Counter[str] = Counter()
        #: the most effects of one key in flight at once
        self.overlap = 0
        self.gate_open = trio.Event()
        self.gate_open.set()
        self._stopped = trio.Event()

    def close_gate(self) -> None:
        """Hold every answer from now until ``open_gate``."""
        if self.gate_open.is_set():
            self.gate_open = trio.Event()

    def open_gate(self) -> None:
        self.gate_open.set()

    def count(self, path: str) -> Counter[str]:
        return Counter(key for p, key in self.seen if p == path)

    def release(self) -> None:
        self.gate_open.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        body = await _read_body(receive)
        key = json.loads(body)["key"]
        self.seen.append((scope["path"], key))
        self.in_flight[key] += 1
        self.overlap = max(self.overlap, self.in_flight[key])
        try:
            await self.gate_open.wait()
            await trio.sleep(self.delay)
        finally:
            self.in_flight[key] -= 1
        await _send_bytes(send, 200, b"ok", [(b"content-type", b"text/plain")])


@dataclass
class Counts:
    """What one round did, per key."""

    keys: list[str]
    effects: Counter[str]
    follow_runs: Counter[str]
    follow_rows: Counter[str]
    statuses: Counter[str]
    attempts: int
    notes: list[str] = field(default_factory=list)

    @property
    def repeated_effects(self) -> int:
        return sum(max(0, self.effects[k] - 1) for k in self.keys)

    @property
    def missing(self) -> int:
        """Keys whose effect or follow-up never happened, or happened more than once."""
        return sum(1 for k in self.keys if (self.effects[k], self.follow_rows[k], self.follow_runs[k]) != (1, 1, 1))

    def ok(self) -> bool:
        return self.missing == 0 and set(self.statuses) == {"done"}

    def summary(self) -> str:
        per_key = Counter((self.effects[k], self.follow_rows[k], self.follow_runs[k]) for k in self.keys)
        return (f"keys {len(self.keys)}; (effects, follow-up rows, follow-up runs) per key: {dict(per_key)}; "
                f"jobs {dict(self.statuses)}; attempts {self.attempts}" + "".join(f"; {n}" for n in self.notes))


@asynccontextmanager
async def effect_world(folder: Path) -> AsyncIterator[tuple[EffectStub, Any, AutomProcesses]]:
    """The effect stub, a Telegram stub and a process starter whose processes load the module."""
    stub = EffectStub()
    async with serving(stub, host="127.0.0.1", port=0, logger="tests.once_faults.stub") as url, \
            running_stub() as telegram, autom_processes(folder) as procs:
        stub.url = url
        yield stub, telegram, procs


async def start(procs: AutomProcesses, dsn: str, telegram_url: str, effect_url: str, **settings: str) -> AutomProcess:
    """An ``autom run`` of the effect module (written in the working folder of each process to come)."""
    for number in range(1, len(procs.started) + 3):  # starts may run concurrently
        folder = procs.folder / f"autom-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "effect_automations.py").write_text(EFFECT_MODULE)
    env = {"AUTOM_APP": "effect_automations:app", "EFFECT_URL": effect_url, "RETRY_BASE_SECONDS": "0.2",
           "RETRY_MAX_SECONDS": "0.5", **settings}
    return await procs.start(dsn=dsn, telegram_url=telegram_url, **env)


def enqueue(dsn: str, payloads: list[dict[str, Any]]) -> None:
    jobs = [{"kind": "effect", "payload": payload, "max_attempts": 20} for payload in payloads]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select autom_enqueue(%s::jsonb)", [json.dumps(jobs)])


async def settle(dsn: str, stub: EffectStub, keys: list[str], timeout: float) -> Counts:
    """Wait until every job is finished and every follow-up ran (or ``timeout``); count."""
    deadline = trio.current_time() + timeout
    while True:
        counts = read_counts(dsn, stub, keys)
        finished = not (set(counts.statuses) - {"done", "failed", "cancelled"})
        if (finished and sum(counts.follow_rows.values()) <= sum(counts.follow_runs.values())) \
                or trio.current_time() > deadline:
            return counts
        await trio.sleep(0.1)


def read_counts(dsn: str, stub: EffectStub, keys: list[str]) -> Counts:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("select kind, status, attempts, payload->>'key' from jobs").fetchall()
        errors = [e for (e,) in conn.execute("select distinct last_error from jobs where last_error is not null")]
    return Counts(notes=[f"errors: {errors}"] if errors else [],
        keys=keys, effects=stub.count("/effect"), follow_runs=stub.count("/follow"),
        follow_rows=Counter(key for kind, _, _, key in rows if kind == "follow"),
        statuses=Counter(status for _, status, _, _ in rows),
        attempts=sum(a for kind, _, a, _ in rows if kind == "effect"),
    )


async def follow_up(folder: Path, dsn: str, jobs: int = 10) -> Counts:
    """A block enqueues a follow-up; the handler raises after the block on its first attempt."""
    keys = [f"k{i}" for i in range(jobs)]
    async with effect_world(folder) as (stub, telegram, procs):
        await start(procs, dsn, telegram.url, stub.url, WORKERS=str(jobs))
        enqueue(dsn, [{"key": k, "fail_first": True} for k in keys])
        return await settle(dsn, stub, keys, timeout=30)


async def outage(folder: Path, pg: RestartablePg, how: str, seconds: float, jobs: int = 10) -> Counts:
    """Every block is inside its effect when the database goes away (``restart``: stopped,
    ``freeze``: SIGSTOP) for ``seconds``; the effects answer while it is away."""
    keys = [f"k{i}" for i in range(jobs)]
    async with effect_world(folder) as (stub, telegram, procs):
        await start(procs, pg.dsn, telegram.url, stub.url, WORKERS=str(jobs))
        stub.close_gate()
        enqueue(pg.dsn, [{"key": k} for k in keys])
        with trio.fail_after(30):
            while len(stub.count("/effect")) < jobs:
                await trio.sleep(0.02)
        (pg.stop if how == "restart" else pg.freeze)()
        began = time.monotonic()
        stub.open_gate()  # the effects happen now, while the database is away
        await trio.sleep(seconds)
        (pg.start if how == "restart" else pg.thaw)()
        counts = await settle(pg.dsn, stub, keys, timeout=60 + seconds)
        counts.notes.append(f"{how} {time.monotonic() - began:.1f} s")
        return counts


async def shared_keys(folder: Path, dsn: str, pairs: int = 10) -> Counts:
    """Two jobs share each key and run at the same time on two replicas; each effect takes 1 s."""
    keys = [f"k{i}" for i in range(pairs)]
    async with effect_world(folder) as (stub, telegram, procs):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(lambda: start(procs, dsn, telegram.url, stub.url, WORKERS=str(pairs)))
        stub.delay = 1.0
        enqueue(dsn, [{"key": k} for k in keys for _ in range(2)])
        counts = await settle(dsn, stub, keys, timeout=60)
        counts.notes.insert(0, f"most effects of one key in flight at once: {stub.overlap}")
        return counts


