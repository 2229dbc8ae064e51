"""Soak: two replicas under kills, a database restart and a faulty Telegram; then prove nothing went wrong.

    python bench/soak.py --minutes 5            the full run (bench/RESULTS.md, Soak)
    python bench/soak.py --seconds 35           the short run of tests/soak/test_soak_short.py
    options: [--seed 1] [--rate 10] [--json FILE] [--keep]

What one run does (bench/soak.md has the reasoning behind each choice):

1. starts a throwaway embedded PostgreSQL that can be stopped and started
   (``tests/support/restartable_pg.py``) and adds an *audit trigger* to its
   ``jobs`` table: every insert and every change of ``status`` or ``lease`` is
   copied to ``soak_audit`` (the lease as its generation, ``autom_lease_generation``:
   migrations/0014) with the clock time and the name of the process
   incarnation that made it (each incarnation connects with
   ``options=-c soak.incarnation=r0-3`` in its DATABASE_URL);
2. serves a Telegram Bot API stub in this process whose ``sendMessage`` answers a
   seeded random mix: 200, slow 200, 502, 429 with ``retry_after`` 1 s, "hangs"
   (an answer after HTTP_TIMEOUT_SECONDS + 3 s, so the worker times out) and a
   rare 400. The alert chat gets 502 now and then (``ALERT_FAULTS``): alerts
   wait in the outbox (the ``alerts`` table) and are sent again. Each incarnation has its
   own bot token, so every recorded call names the process that made it;
3. starts two ``autom run`` replicas (tests/support/processes.py) with a 3 s
   lease, a 2 s HTTP timeout and a 1 s shutdown grace;
4. a sender posts signed ``/ping`` updates at a steady rate to both replicas, each
   from its own chat (so a chat's sendMessage calls are exactly its one job's
   handler runs), and redelivers ~10 % of them (half at the same moment to the
   other replica, half up to 3 s later). A delivery that gets no 202 (a refused
   connection, a 503) is retried every 0.5 s, as Telegram would;
5. a chaos loop, at seeded random moments, SIGKILLs or SIGTERMs one replica and
   starts a new incarnation in its place, once restarts PostgreSQL, and once
   *stalls* it for longer than the lease (SIGSTOP of the server and all its
   backends, then SIGCONT: connections stay open, every statement hangs, so the
   replicas' renewals fail while handlers run past their leases; issue 11);
6. quiesces: chaos and sender stop, the backlog drains, the alert outbox empties,
   leases and stale handler calls run out, both replicas get SIGTERM;
7. checks the invariants (below) against the database, the audit, the stub's
   calls, the sender's answers and the processes' JSON logs, prints the checks
   and the figures, and exits 1 if any check failed.

The checks:

* intake: every update answered 202 has exactly one event (by its update_id),
  every event exactly one job, and every update sent was accepted in the end;
* redeliveries: no extra events or jobs (one per distinct update);
* answers: only 202, or 503 while the database was down (plus a few seconds for
  the pools to reconnect); refused or cut connections only from a replica that
  had been signalled;
* outcomes: every job ``done`` or ``failed``, none ``pending``/``running``;
* alerts: every failed job has one row in the alert outbox, sent: named in an
  alert the alert chat accepted (twice at most, and only when a replica was
  killed between Telegram's answer and the mark), or counted in a summary sent
  after the failure; no alert for a job that did not fail;
* fencing: every transition out of ``running`` (done, failed, retry, release)
  was made by the incarnation holding the job's current lease generation,
  ``jobs.lease`` equals the claims seen (a job the intake stored claimed, its
  hand-off, counts as its first claim, by the replica that stored it), each job
  finished exactly once;
* reruns: a job's handler ran more than once only after a retryable answer
  (502, 429, timeout), a SIGTERM that cancelled it, the death of its process, or
  the database restart or stall (the lease lapsed: the run was stopped at its
  local deadline; a send that found no database before its call is deferred, its
  attempt given back, like a wait for the send limits); each
  cause is counted, and the causes add up to the calls that did not finish a job;
* limits: the stub's sendMessage calls (alerts too) within any 1, 10 and 30 s keep to
  TELEGRAM_GLOBAL_RATE with bursts of that many (a second of slack for the stub's
  own hiccups), catch-ups after the outages included;
* processes: every SIGTERM ended in exit 0, no process died unasked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import AutomProcess, AutomProcesses, autom_processes
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.service import ALERT_CHAT, TG_SECRET, telegram_update
from tests.support.telegram_stub import Reply, TelegramStub, stub_config

#: chat id of update N is CHAT_BASE + N: one job per chat, so a chat's calls are its job's runs
CHAT_BASE = 7_000_000_000
LEASE_SECONDS = 3.0
HTTP_TIMEOUT = 2.0
GRACE_SECONDS = 1.0
#: how long after PostgreSQL is back a 503 is still "while the database was down" (pool reconnect)
RECONNECT_SLACK = 5.0

#: Telegram's limits the replicas keep to (autom's defaults, set explicitly): the drain allowance
CHAT_RATE = 1.0
GLOBAL_RATE = 30.0
PROCESS_SETTINGS = {
    "TELEGRAM_CHAT_RATE": f"{CHAT_RATE:g}",
    "TELEGRAM_GLOBAL_RATE": f"{GLOBAL_RATE:g}",
    "WORKERS": "4",
    "JOB_LEASE_SECONDS": f"{LEASE_SECONDS:g}",
    "HTTP_TIMEOUT_SECONDS": f"{HTTP_TIMEOUT:g}",
    "RETRY_BASE_SECONDS": "0.2",
    "RETRY_MAX_SECONDS": "2",
    "SHUTDOWN_GRACE_SECONDS": f"{GRACE_SECONDS:g}",
    "LOG_LEVEL": "info",
}

#: the limits check: windows (seconds) in which the stub's sendMessage calls are counted, and
#: how much closer than the limiter let them go they may arrive (this process, the stub's,
#: starved a moment records a bunch at once)
LIMIT_WINDOWS = (1.0, 10.0, 30.0)
LIMIT_SLACK = 1.0

#: the sendMessage mix (weights; the alert chat has its own)
MIX = {"ok": 0.70, "slow": 0.10, "502": 0.08, "429": 0.06, "hang": 0.055, "400": 0.005}
#: the alert chat's mix: a flaky Telegram must not lose an alert (the outbox sends it again)
ALERT_FAULTS = {"ok": 0.9, "502": 0.1}
#: how long the quiesce waits for the alert outbox to empty (a summary goes at most once a minute)
ALERT_FLUSH_SECONDS = 90.0

CHECKS = ("intake", "redeliveries", "answers", "outcomes", "alerts", "fencing", "reruns", "processes")

AUDIT_SQL = """
create table soak_audit (
    seq              bigserial primary key,
    job_id           bigint not null,
    op               text not null,
    old_status       text,
    new_status       text,
    old_lease        bigint,
    new_lease        bigint,
    old_attempts     int,
    new_attempts     int,
    old_run_at       timestamptz,
    old_locked_until timestamptz,
    last_error       text,
    by_inc           text,
    at               timestamptz not null default clock_timestamp()
);
create function soak_audit_jobs() returns trigger language plpgsql as $$
begin
    if tg_op = 'INSERT' then
        insert into soak_audit (job_id, op, new_status, new_lease, new_attempts, old_run_at, by_inc)
        values (new.id, 'insert', new.status, autom_lease_generation(new.lease), new.attempts, new.run_at,
                current_setting('soak.incarnation', true));
    else
        insert into soak_audit (job_id, op, old_status, new_status, old_lease, new_lease, old_attempts,
                                new_attempts, old_run_at, old_locked_until, last_error, by_inc)
        values (new.id, 'update', old.status, new.status, autom_lease_generation(old.lease),
                autom_lease_generation(new.lease), old.attempts, new.attempts,
                old.run_at, old.locked_until, new.last_error, current_setting('soak.incarnation', true));
    end if;
    return null;
end $$;
create trigger soak_audit_insert after insert on jobs for each row execute function soak_audit_jobs();
create trigger soak_audit_update after update on jobs for each row
    when (old.status is distinct from new.status or old.lease is distinct from new.lease)
    execute function soak_audit_jobs();
"""


@dataclass(frozen=True)
class Profile:
    """How long and how hard: derived from the run length."""

    run_seconds: float
    rate: float  # new updates per second
    chaos_every: tuple[float, float]  # seconds between chaos actions (uniform)
    pg_restart_at: float  # fraction of the run
    pg_down_seconds: float
    pg_stall_at: float  # fraction of the run
    pg_stall_seconds: float  # longer than the lease
    drain_margin: float  # over the least time Telegram's limits allow the backlog (drain_allowance)
    progress_every: float

    @classmethod
    def for_run(cls, seconds: float, rate: float | None) -> Profile:
        short = seconds < 120
        return cls(
            run_seconds=seconds,
            rate=rate or (6.0 if short else 10.0),
            chaos_every=(4.0, 7.0) if short else (7.0, 16.0),
            pg_restart_at=0.4,
            pg_down_seconds=2.0 if short else 3.0,
            pg_stall_at=0.7,
            pg_stall_seconds=LEASE_SECONDS + 2.0,
            drain_margin=30.0 if short else 60.0,
            progress_every=10.0 if short else 30.0,
        )


def drain_allowance(open_by_chat: dict[str, int], margin: float, *, chat_rate: float = CHAT_RATE,
                    global_rate: float = GLOBAL_RATE) -> float:
    """Seconds the backlog may take to drain once the sender stops: the least Telegram's limits
    allow (every open job's message at the bot's global rate, and the busiest chat's at its chat
    rate), a quarter more for the stub's refusals (429, 502, hangs and their retries), plus
    ``margin`` (leases of killed replicas running out, the last retries)."""
    least = max(sum(open_by_chat.values()) / global_rate, max(open_by_chat.values(), default=0) / chat_rate)
    return 1.25 * least + margin


# -- the faulty Telegram ----------------------------------------------------------------


class FaultyStub(TelegramStub):
    """The test stub with a seeded random sendMessage mix; ``kinds[i]`` is how call ``i`` was answered."""

    def __init__(self, rng: random.Random, mix: dict[str, float]) -> None:
        super().__init__()
        self.rng = rng
        self.kinds: list[str] = []
        self._names = list(mix)
        self._weights = list(mix.values())

    def _next_reply(self, method: str, params: dict[str, Any]) -> Reply:
        # called right after the call was recorded (no await between): kinds stays aligned with calls
        kind = "ok"
        if method.lower() == "sendmessage":
            if str(params.get("chat_id")) != ALERT_CHAT:
                kind = self.rng.choices(self._names, self._weights)[0]
            else:
                kind = self.rng.choices(list(ALERT_FAULTS), list(ALERT_FAULTS.values()))[0]
        self.kinds.append(kind)
        return {
            "ok": Reply(),
            "slow": Reply(delay=self.rng.uniform(0.2, 1.0)),
            "502": Reply(status=502),
            "429": Reply(status=429, retry_after=1),
            "hang": Reply(delay=HTTP_TIMEOUT + 3.0),
            "400": Reply(status=400, description="Bad Request: chat not found"),
        }[kind]


async def serve_stub(
    stub: TelegramStub, *, task_status: trio.TaskStatus[trio.Event] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``stub`` on 127.0.0.1 (as ``running_stub`` does) until the returned event is set."""
    from hypercorn.trio import serve

    config = stub_config("127.0.0.1:0", "soak.stub.hypercorn")
    stopping = trio.Event()
    async with trio.open_nursery() as nursery:
        app: Any = stub  # an ASGI app (hypercorn's types name its own protocol)
        binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stopping.wait, mode="asgi"))
        stub.url = binds[0]
        task_status.started(stopping)
        await stopping.wait()
        stub.release()
        nursery.cancel_scope.deadline = trio.current_time() + 5


# -- replicas -----------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One ``autom run`` process in one slot; its name is in its bot token and its DB session."""

    name: str
    slot: int
    proc: AutomProcess
    client: httpx.AsyncClient
    started_at: float
    signalled: str | None = None  # "KILL" / "TERM"
    signalled_at: float | None = None
    exited_at: float | None = None
    returncode: int | None = None
    final: bool = False  # terminated by the quiesce, not by chaos


@dataclass
class Delivery:
    """One POST of an update (a first delivery, a redelivery or a retry of either)."""

    update_id: int
    inc: str
    started: float
    latency: float
    status: int | None
    error: str | None
    body: dict[str, Any] | None


class Soak:
    """The whole run: processes, stub, sender, chaos, and what they recorded."""

    def __init__(self, pg: RestartablePg, procs: AutomProcesses, stub: FaultyStub, profile: Profile,
                 seed: int) -> None:
        self.pg = pg
        self.procs = procs
        self.stub = stub
        self.profile = profile
        self.rng = random.Random(seed)
        self.slots: list[Incarnation | None] = [None, None]
        self.incarnations: list[Incarnation] = []
        self._generation = Counter[int]()
        self.deliveries: list[Delivery] = []
        self.sent_updates: set[int] = set()
        self.redeliveries = 0
        self.pg_windows: list[tuple[float, float]] = []  # (stop called, start returned), stalls too
        self.pg_stalls = 0
        self.chaos_log: list[tuple[float, str]] = []
        self.start_failures: list[str] = []
        self.give_up_at = math.inf
        self.stop_sending = trio.Event()
        self.stop_chaos = trio.Event()
        self.t0 = time.time()
        self.quiesce: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {text}", flush=True)

    # -- processes ----------------------------------------------------------------------

    async def start_slot(self, slot: int) -> Incarnation:
        self._generation[slot] += 1
        name = f"r{slot}-{self._generation[slot]}"
        dsn = make_conninfo(self.pg.dsn, options=f"-c soak.incarnation={name}")
        for attempt in range(3):
            try:
                proc = await self.procs.start(
                    dsn=dsn, telegram_url=self.stub.url, TELEGRAM_BOT_TOKEN=f"123456:soak-{name}", **PROCESS_SETTINGS
                )
                break
            except (AssertionError, trio.TooSlowError) as exc:
                self.start_failures.append(f"{name} attempt {attempt + 1}: {str(exc)[:300]}")
                await trio.sleep(1.0)
        else:
            raise RuntimeError(f"could not start {name}: {self.start_failures[-1]}")
        client = httpx.AsyncClient(
            base_url=proc.url, timeout=10.0, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16)
        )
        inc = Incarnation(name=name, slot=slot, proc=proc, client=client, started_at=time.time())
        self.incarnations.append(inc)
        self.slots[slot] = inc
        return inc

    async def stop_incarnation(self, inc: Incarnation, how: str) -> None:
        """Signal ``inc`` (KILL or TERM), wait for its exit, reap it."""
        if self.slots[inc.slot] is inc:
            self.slots[inc.slot] = None  # the sender stops choosing it now
        inc.signalled, inc.signalled_at = how, time.time()
        if how == "KILL":
            inc.proc.kill()
        else:
            inc.proc.terminate()
        try:
            inc.returncode = await inc.proc.wait(timeout=10 if how == "KILL" else GRACE_SECONDS + 20)
        except trio.TooSlowError:
            inc.proc.kill()
            inc.returncode = await inc.proc.wait(timeout=10)
            inc.signalled = f"{how} (hung; killed)"
        inc.exited_at = time.time()
        # reaped and judged here: AutomProcesses would print every non-zero exit's log at the end
        if inc.proc in self.procs.started:
            self.procs.started.remove(inc.proc)

    async def chaos(self) -> None:
        """Kill or terminate one replica at random moments and restart it; restart PostgreSQL
        once and stall it once."""
        profile = self.profile
        pg_at = self.t0 + profile.run_seconds * profile.pg_restart_at
        stall_at = self.t0 + profile.run_seconds * profile.pg_stall_at
        pg_done = stall_done = False
        while not self.stop_chaos.is_set():
            with trio.move_on_after(self.rng.uniform(*profile.chaos_every)):
                await self.stop_chaos.wait()
            if self.stop_chaos.is_set():
                break
            if not pg_done and time.time() >= pg_at:
                pg_done = True
                await self.restart_pg()
                continue
            if not stall_done and time.time() >= stall_at:
                stall_done = True
                await self.stall_pg()
                continue
            slot = self.rng.randrange(2)
            inc = self.slots[slot]
            if inc is None:
                continue
            how = self.rng.choice(["KILL", "TERM"])
            self.say(f"chaos: SIG{how} {inc.name}")
            await self.stop_incarnation(inc, how)
            self.chaos_log.append((time.time(), f"SIG{how} {inc.name} -> exit {inc.returncode}"))
            await trio.sleep(self.rng.uniform(0.2, 1.5))
            new = await self.start_slot(slot)
            self.chaos_log.append((time.time(), f"started {new.name}"))

    async def restart_pg(self) -> None:
        self.say("chaos: PostgreSQL stop")
        stopped = time.time()
        await trio.to_thread.run_sync(self.pg.stop)
        await trio.sleep(self.profile.pg_down_seconds)
        await trio.to_thread.run_sync(self.pg.start)
        self.pg_windows.append((stopped, time.time()))
        self.chaos_log.append((time.time(), f"PostgreSQL restarted (down {time.time() - stopped:.1f}s)"))
        self.say("chaos: PostgreSQL started again")

    async def stall_pg(self) -> None:
        """Freeze the server and its backends (SIGSTOP) for longer than the lease, then SIGCONT."""
        pids = postgres_pids(self.pg)
        self.say(f"chaos: PostgreSQL stalled ({len(pids)} processes) for {self.profile.pg_stall_seconds:g}s")
        stalled = time.time()
        try:
            signal_all(pids, signal.SIGSTOP)
            await trio.sleep(self.profile.pg_stall_seconds)
        finally:
            signal_all(pids, signal.SIGCONT)
        self.pg_windows.append((stalled, time.time()))
        self.pg_stalls += 1
        took = time.time() - stalled
        self.chaos_log.append((time.time(), f"PostgreSQL stalled {took:.1f}s (lease {LEASE_SECONDS:g}s)"))

    # -- the sender -----------------------------------------------------------------------

    def _target(self, slot: int) -> Incarnation | None:
        inc = self.slots[slot]
        return inc if inc is not None else self.slots[1 - slot]

    async def deliver(self, update_id: int, slot: int, limit: trio.CapacityLimiter, delay: float = 0.0) -> None:
        """POST the update until it gets a 202 (refused, cut or 503 → again in 0.5 s, as Telegram does)."""
        if delay:
            await trio.sleep(delay)
        body = json.dumps(telegram_update(update_id, CHAT_BASE + update_id, "/ping")).encode()
        headers = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}
        while time.time() < self.give_up_at:
            inc = self._target(slot)
            if inc is None:
                await trio.sleep(0.1)
                continue
            async with limit:
                started, clock = time.time(), time.perf_counter()
                status = error = payload = None
                try:
                    response = await inc.client.post("/hooks/telegram", content=body, headers=headers)
                    status = response.status_code
                    try:
                        payload = response.json()
                    except ValueError:
                        payload = {"raw": response.text[:200]}
                except httpx.HTTPError as exc:
                    error = type(exc).__name__
                latency = time.perf_counter() - clock
            self.deliveries.append(Delivery(update_id, inc.name, started, latency, status, error, payload))
            if status == 202:
                return
            slot = 1 - slot
            await trio.sleep(0.5)

    async def send(self) -> None:
        """New updates at a steady rate until told to stop; then waits for every delivery to finish."""
        limit = trio.CapacityLimiter(48)
        interval = 1.0 / self.profile.rate
        update_id = 1000
        async with trio.open_nursery() as nursery:
            next_at = trio.current_time()
            while not self.stop_sending.is_set():
                update_id += 1
                self.sent_updates.add(update_id)
                slot = update_id % 2
                nursery.start_soon(self.deliver, update_id, slot, limit)
                roll = self.rng.random()
                if roll < 0.05:  # the same update at the same moment to the other replica
                    self.redeliveries += 1
                    nursery.start_soon(self.deliver, update_id, 1 - slot, limit)
                elif roll < 0.10:  # a late redelivery
                    self.redeliveries += 1
                    nursery.start_soon(partial(self.deliver, update_id, 1 - slot, limit,
                                               delay=self.rng.uniform(0.2, 3.0)))
                next_at += interval
                with trio.move_on_at(next_at):
                    await self.stop_sending.wait()

    # -- watching -------------------------------------------------------------------------

    async def progress(self) -> None:
        while True:
            await trio.sleep(self.profile.progress_every)
            counts: dict[str, Any]
            try:
                counts = await trio.to_thread.run_sync(job_counts, self.pg.dsn)
            except psycopg.Error:
                counts = {"db": "down"}
            accepted = sum(1 for d in self.deliveries if d.status == 202)
            self.say(f"deliveries {len(self.deliveries)} (202: {accepted}), jobs {counts}, "
                     f"sendMessage calls {len(self.stub.calls)}")

    async def watch_crashes(self) -> None:
        """Note a replica that exits without being asked (a crash); it is restarted so the run goes on."""
        while True:
            await trio.sleep(0.5)
            for slot, inc in enumerate(self.slots):
                if inc is not None and inc.proc.returncode is not None and inc.signalled is None:
                    inc.signalled, inc.returncode, inc.exited_at = "none (crashed)", inc.proc.returncode, time.time()
                    self.slots[slot] = None
                    self.say(f"{inc.name} exited by itself with {inc.returncode}")
                    if inc.proc in self.procs.started:
                        self.procs.started.remove(inc.proc)
                    await self.start_slot(slot)

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        profile = self.profile
        self.say(f"starting 2 replicas (stub at {self.stub.url})")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.start_slot, 0)
            nursery.start_soon(self.start_slot, 1)
        self.t0 = time.time()
        self.say(f"running {profile.run_seconds:g}s at {profile.rate:g} updates/s")
        async with trio.open_nursery() as watchers:
            watchers.start_soon(self.progress)
            watchers.start_soon(self.watch_crashes)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.send)
                nursery.start_soon(self.chaos)
                await trio.sleep(profile.run_seconds)
                self.say("quiesce: stopping chaos and sender")
                self.stop_chaos.set()
                self.stop_sending.set()
                self.give_up_at = time.time() + 30
            self.quiesce["sender_stopped"] = time.time()
            for slot in (0, 1):
                if self.slots[slot] is None:
                    await self.start_slot(slot)
            backlog = await trio.to_thread.run_sync(open_by_chat, self.pg.dsn)
            allowance = drain_allowance(backlog, profile.drain_margin)
            self.quiesce["drain_allowance"] = allowance
            self.say(f"quiesce: waiting for the backlog to drain ({sum(backlog.values())} open jobs in "
                     f"{len(backlog)} chats: {allowance:.0f}s allowed)")
            with trio.move_on_after(allowance) as drain:
                while True:
                    if not (await trio.to_thread.run_sync(job_counts, self.pg.dsn)).get("open", 0):
                        break
                    await trio.sleep(0.25)
            self.quiesce["drained"] = time.time()
            self.quiesce["drain_timed_out"] = float(drain.cancelled_caught)
            self.say("quiesce: waiting for the alert outbox to empty")
            with trio.move_on_after(ALERT_FLUSH_SECONDS):
                while True:
                    if not await trio.to_thread.run_sync(unsent_alerts, self.pg.dsn):
                        break
                    await trio.sleep(0.25)
            self.quiesce["alerts_flushed"] = time.time()
            watchers.cancel_scope.cancel()
        # stale handler calls (a claim that lost its lease) end within the HTTP timeout; leases run out
        await trio.sleep(LEASE_SECONDS + HTTP_TIMEOUT + 1)
        self.say("quiesce: SIGTERM to both replicas")
        async with trio.open_nursery() as nursery:
            for inc in list(self.slots):
                if inc is not None:
                    inc.final = True
                    nursery.start_soon(self.stop_incarnation, inc, "TERM")
        self.quiesce["stopped"] = time.time()


def postgres_pids(pg: RestartablePg) -> list[int]:
    """The server's postmaster (postmaster.pid) and every process it started (its backends)."""
    postmaster = int((pg._server.pgdata / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:  # field 4 of /proc/PID/stat: the parent
                children.append(int(entry.name))
    return [postmaster, *children]


def signal_all(pids: list[int], signum: int) -> None:
    """Send ``signum`` to each of ``pids`` that still runs."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def job_counts(dsn: str) -> dict[str, int]:
    """Jobs by status, plus ``open`` = pending or running (due now or not)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        rows = conn.execute("select status, count(*) from jobs group by status").fetchall()
    counts = {status: int(n) for status, n in rows}
    counts["open"] = counts.get("pending", 0) + counts.get("running", 0)
    return counts


def open_by_chat(dsn: str) -> dict[str, int]:
    """Open (pending or running) jobs by recipient chat (a job without one counts as a chat of its own)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        rows = conn.execute("select coalesce(recipient, 'job ' || id), count(*) from jobs"
                            " where status in ('pending', 'running') group by 1").fetchall()
    return {str(chat): int(n) for chat, n in rows}


def unsent_alerts(dsn: str) -> int:
    """Rows of the alert outbox that no alert chat message has carried yet."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute("select count(*) from alerts where sent_at is null").fetchone()
    return int(row[0]) if row else 0


def install_audit(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)


def fetch_tables(dsn: str) -> dict[str, list[dict[str, Any]]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return {
            "events": list(conn.execute("select id, source, dedup_key from events")),
            "jobs": list(conn.execute(
                "select id, kind, status, attempts, max_attempts, autom_lease_generation(lease) as lease, key,"
                " recipient, event_id, last_error,"
                " extract(epoch from run_at)::float8 as run_at from jobs")),
            "audit": list(conn.execute(
                "select seq, job_id, op, old_status, new_status, old_lease, new_lease, old_attempts, new_attempts,"
                " extract(epoch from old_run_at)::float8 as old_run_at,"
                " extract(epoch from old_locked_until)::float8 as old_locked_until,"
                " last_error, by_inc, extract(epoch from at)::float8 as at from soak_audit order by seq")),
            "alerts": list(conn.execute(
                "select id, job_id, tries, sent_as, extract(epoch from created_at)::float8 as created_at,"
                " extract(epoch from sent_at)::float8 as sent_at from alerts order by id")),
        }


# -- the checks ---------------------------------------------------------------------------


@dataclass
class Report:
    checks: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str, problems: list[str] | None = None) -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail, "problems": (problems or [])[:20]})

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def most_in_window(times: list[float], seconds: float) -> int:
    """The most of ``times`` (sorted) within any ``seconds`` of each other."""
    most, first = 0, 0
    for last, t in enumerate(times):
        while t - times[first] > seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


_ALERT_JOB = re.compile(r"^autom: job (\d+) \(")
_SUMMARY = re.compile(r"^autom: (\d+) jobs? failed for good, too many at once")


def analyse(soak: Soak, tables: dict[str, list[dict[str, Any]]]) -> Report:
    report = Report()
    incs = {inc.name: inc for inc in soak.incarnations}
    logs = {inc.name: inc.proc.log_records() for inc in soak.incarnations}
    pg_windows = soak.pg_windows

    def in_outage(t0: float, t1: float | None = None, slack: float = RECONNECT_SLACK) -> bool:
        t1 = t0 if t1 is None else t1
        return any(t1 >= down - 0.5 and t0 <= up + slack for down, up in pg_windows)

    events = [e for e in tables["events"] if e["source"] == "telegram"]
    jobs = tables["jobs"]
    tg_jobs = [j for j in jobs if j["kind"] == "telegram.message"]
    audit = tables["audit"]

    # ---- intake: every 202 → exactly one event, every event → exactly one job -------------
    by_update: dict[int, list[Delivery]] = defaultdict(list)
    for d in soak.deliveries:
        by_update[d.update_id].append(d)
    events_by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        events_by_key[str(e["dedup_key"])].append(e)
    jobs_by_event: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for j in jobs:
        if j["event_id"] is not None:
            jobs_by_event[j["event_id"]].append(j)
    problems = []
    accepted = {u for u, ds in by_update.items() if any(d.status == 202 for d in ds)}
    for update_id in sorted(accepted):
        found = events_by_key.get(str(update_id), [])
        if len(found) != 1:
            problems.append(f"update {update_id}: answered 202 but {len(found)} events")
            continue
        for d in by_update[update_id]:
            if d.status == 202 and d.body and "id" in d.body and d.body["id"] != found[0]["id"]:
                problems.append(f"update {update_id}: 202 named event {d.body['id']}, stored as {found[0]['id']}")
    for e in events:
        own = jobs_by_event.get(e["id"], [])
        if len(own) != 1 or own[0]["key"] != f"telegram:{e['dedup_key']}":
            problems.append(f"event {e['id']} (update {e['dedup_key']}): jobs {[j['id'] for j in own]}")
    never = sorted(soak.sent_updates - accepted)
    if never:
        problems.append(f"{len(never)} updates never accepted, e.g. {never[:5]}")
    report.check("intake", not problems,
                 f"{len(accepted)} updates answered 202 → {len(events)} events → "
                 f"{sum(len(v) for v in jobs_by_event.values())} jobs", problems)

    # ---- redeliveries: no extra events or jobs ---------------------------------------------
    dup_answers = sum(1 for d in soak.deliveries if d.status == 202 and d.body and d.body.get("duplicate"))
    delivered_twice = sum(1 for ds in by_update.values() if len(ds) > 1)
    problems = []
    if len(events) != len(soak.sent_updates):
        problems.append(f"{len(events)} events for {len(soak.sent_updates)} distinct updates")
    if len(tg_jobs) != len(soak.sent_updates):
        problems.append(f"{len(tg_jobs)} telegram.message jobs for {len(soak.sent_updates)} distinct updates")
    # an update whose "new event" answer was lost (the connection broke after the commit) is
    # answered "duplicate" on its next delivery; anything else must get exactly one new-event answer
    answers_lost = 0
    for update_id, ds in by_update.items():
        news = [d for d in ds if d.status == 202 and d.body and "id" in d.body]
        if len(news) > 1:
            problems.append(f"update {update_id}: {len(news)} answers with a new event id")
        elif not news and any(d.status == 202 for d in ds):
            first_ok = min(d.started + d.latency for d in ds if d.status == 202)
            if any(d.status != 202 and d.started < first_ok for d in ds):
                answers_lost += 1
            else:
                problems.append(f"update {update_id}: answered duplicate with no earlier delivery stored")
    stray = {str(e["dedup_key"]) for e in events} - {str(u) for u in soak.sent_updates}
    if stray:
        problems.append(f"events for updates never sent: {sorted(stray)[:5]}")
    report.check("redeliveries", not problems,
                 f"{delivered_twice} updates posted more than once ({soak.redeliveries} deliberate), "
                 f"{dup_answers} answered duplicate ({answers_lost} after a lost answer); {len(events)} events and "
                 f"{len(tg_jobs)} jobs for {len(soak.sent_updates)} updates", problems)

    # ---- answers: 202, or 503 while the database was down; connection errors only from stopping replicas
    statuses = Counter(d.status if d.status is not None else d.error for d in soak.deliveries)
    problems = []
    late_503 = []
    for d in soak.deliveries:
        if d.status == 202:
            continue
        if d.status == 503:
            if not in_outage(d.started, d.started + d.latency, slack=0.0):
                late_503.append(d.started)
            if not in_outage(d.started, d.started + d.latency):
                problems.append(f"503 for update {d.update_id} from {d.inc} at +{d.started - soak.t0:.1f}s, "
                                f"outside the database outage")
            continue
        if d.status is not None:
            problems.append(f"HTTP {d.status} for update {d.update_id} from {d.inc}: {d.body}")
            continue
        inc = incs[d.inc]
        if inc.signalled_at is None or inc.signalled_at > d.started + d.latency + 0.05:
            problems.append(f"{d.error} for update {d.update_id} from {d.inc}, which was not being stopped")
    after_up = [t - up for t in late_503 for _, up in pg_windows if t >= up]
    report.check("answers", not problems,
                 "answers: " + ", ".join(f"{k}: {v}" for k, v in statuses.most_common())
                 + (f"; last 503 {max(after_up):.2f}s after PostgreSQL was back" if after_up else ""), problems)

    # ---- outcomes --------------------------------------------------------------------------
    by_status = Counter(j["status"] for j in jobs)
    open_jobs = [j for j in jobs if j["status"] not in ("done", "failed")]
    report.check("outcomes", not open_jobs and not soak.quiesce.get("drain_timed_out"),
                 "jobs: " + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items()))
                 + f" (drained {soak.quiesce.get('drained', 0) - soak.quiesce.get('sender_stopped', 0):.1f}s "
                   f"after the sender stopped, {soak.quiesce.get('drain_allowance', 0):.0f}s allowed by the limits)",
                 [f"job {j['id']} ({j['kind']}) is {j['status']} after {j['attempts']} attempts" for j in open_jobs])

    # ---- the audit: claims and endings per job -----------------------------------------------
    claims: dict[int, list[dict[str, Any]]] = defaultdict(list)
    endings: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    terminal: Counter[int] = Counter()
    problems_fence = []
    for row in audit:
        jid = row["job_id"]
        if row["op"] != "update":
            if row["new_status"] == "running":
                # the intake's hand-off: the job stored claimed by the replica that took the
                # webhook (generation 1, migrations/0012), a claim like the claim statement's
                claims[jid].append(row)
            continue
        if row["new_lease"] == row["old_lease"] + 1:
            if row["new_status"] != "running":
                problems_fence.append(f"job {jid}: lease {row['new_lease']} taken into {row['new_status']}")
            claims[jid].append(row)
        elif row["new_lease"] != row["old_lease"]:
            problems_fence.append(f"job {jid}: lease went {row['old_lease']} → {row['new_lease']}")
        elif row["old_status"] == "running":
            if row["old_lease"] in endings[jid]:
                problems_fence.append(f"job {jid}: claim {row['old_lease']} ended twice")
            endings[jid][row["old_lease"]] = row
        else:
            problems_fence.append(f"job {jid}: {row['old_status']} → {row['new_status']} without a claim")
        if row["new_status"] in ("done", "failed"):
            terminal[jid] += 1
        if row["old_status"] in ("done", "failed"):
            problems_fence.append(f"job {jid}: left {row['old_status']} for {row['new_status']}")

    # ---- alerts ---------------------------------------------------------------------------------
    # a message reached the alert chat when the stub answered it 200; a 502 leaves it in the outbox
    alert_calls = [(c, k) for c, k in zip(soak.stub.calls, soak.stub.kinds, strict=True)
                   if c.method.lower() == "sendmessage" and str(c.params.get("chat_id")) == ALERT_CHAT]
    delivered = [c for c, k in alert_calls if k == "ok"]
    alerted: Counter[int] = Counter()
    summary_times: list[float] = []
    other_alerts = []
    for call in delivered:
        text = str(call.params.get("text", ""))
        if m := _ALERT_JOB.match(text):
            alerted[int(m.group(1))] += 1
        elif _SUMMARY.match(text):
            summary_times.append(call.time)
        else:
            other_alerts.append(text[:120])
    outbox: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in tables["alerts"]:
        outbox[row["job_id"]].append(row)
    kills = [inc.signalled_at for inc in incs.values() if inc.signalled == "KILL" and inc.signalled_at is not None]
    failed = {j["id"]: j for j in jobs if j["status"] == "failed"}
    problems = []
    singles = summarised = repeated = 0
    for jid, job in sorted(failed.items()):
        rows = outbox.get(jid, [])
        if len(rows) != 1:
            problems.append(f"job {jid} ({job['last_error']}): {len(rows)} rows in the alert outbox, not 1")
            continue
        (row,) = rows
        if row["sent_at"] is None:
            problems.append(f"job {jid}: its alert was never sent ({row['tries']} failed tries)")
        elif row["sent_as"] == "summary":
            if any(t >= row["created_at"] - 0.5 for t in summary_times):
                summarised += 1
            else:
                problems.append(f"job {jid}: marked sent in a summary, but no summary reached the chat after it")
        elif alerted[jid] == 0:
            problems.append(f"job {jid}: marked sent, but no alert naming it reached the chat")
        elif alerted[jid] == 1:
            singles += 1
        elif alerted[jid] == 2 and kills:
            # at-least-once: a replica killed between Telegram's 200 and the mark sends it again
            repeated += 1
            report.notes.append(f"job {jid}: named in 2 alerts (a replica was killed: sent, not marked)")
        else:
            problems.append(f"job {jid}: named in {alerted[jid]} alerts")
    status_of = {j["id"]: j["status"] for j in jobs}
    for jid in alerted:
        if jid not in failed:
            problems.append(f"an alert names job {jid}, which is {status_of.get(jid, 'unknown')}")
    if other_alerts:
        report.notes.append(f"other alerts: {other_alerts[:5]}")
    report.check("alerts", not problems,
                 f"{len(failed)} failed jobs: {singles} named in one alert, {summarised} in a summary, "
                 f"{repeated} named twice after a kill; {len(delivered)} alert messages delivered "
                 f"({len(summary_times)} summaries), {len(alert_calls) - len(delivered)} refused by the stub "
                 "and sent again",
                 problems)

    # ---- fencing ------------------------------------------------------------------------------
    lease_lost_lines: Counter[str] = Counter()
    lost_logged: set[tuple[str, int]] = set()
    for name, recs in logs.items():
        for r in recs:
            msg = str(r.get("msg", ""))
            # autom/worker/executor.py: a run stopped at its local deadline or dropped before it
            # started, and an outcome that found its claim gone
            for marker in ("job finished but its lease was lost", "lease could not be renewed",
                           "lease lost before the job started", "but its lease was lost"):
                if marker in msg:
                    lease_lost_lines[marker] += 1
                    lost_logged.add((name, int(r.get("job_id", 0))))
    for job in jobs:
        jid = job["id"]
        own = sorted(claims[jid], key=lambda r: r["new_lease"])
        if [r["new_lease"] for r in own] != list(range(1, job["lease"] + 1)):
            problems_fence.append(f"job {jid}: lease {job['lease']} but claims {[r['new_lease'] for r in own]}")
        if job["status"] in ("done", "failed") and terminal[jid] != 1:
            problems_fence.append(f"job {jid}: {terminal[jid]} transitions into done/failed")
        holder = {r["new_lease"]: r["by_inc"] for r in own}
        for lease, end in endings[jid].items():
            if end["by_inc"] != holder.get(lease):
                problems_fence.append(f"job {jid}: claim {lease} of {holder.get(lease)} ended ({end['new_status']}) "
                                      f"by {end['by_inc']}")
            if lease != job["lease"] and end["new_status"] in ("done", "failed"):
                problems_fence.append(f"job {jid}: finished by claim {lease}, but claim {job['lease']} exists")
    untagged = sum(1 for r in audit if r["op"] == "update" and not r["by_inc"])
    if untagged:
        problems_fence.append(f"{untagged} audited changes made by no known incarnation")
    n_claims = sum(len(v) for v in claims.values())
    report.check("fencing", not problems_fence,
                 f"{n_claims} claims = Σ jobs.lease {sum(j['lease'] for j in jobs)}; every done/failed/retry/release "
                 f"by the holder of the current lease; stale claims fenced off (log lines: "
                 + ", ".join(f"'{k}' {v}" for k, v in lease_lost_lines.items()) + ")"
                 if lease_lost_lines else
                 f"{n_claims} claims = Σ jobs.lease {sum(j['lease'] for j in jobs)}; every done/failed/retry/release "
                 "by the holder of the current lease; no stale claim seen in the logs", problems_fence)

    # ---- reruns: every handler run beyond the one that counted has a cause -----------------------
    calls_by_chat: dict[str, list[tuple[Any, str]]] = defaultdict(list)
    for call, kind in zip(soak.stub.calls, soak.stub.kinds, strict=True):
        if call.method.lower() == "sendmessage" and str(call.params.get("chat_id")) != ALERT_CHAT:
            calls_by_chat[str(call.params.get("chat_id"))].append((call, kind))
    causes: Counter[str] = Counter()
    retry_causes: Counter[str] = Counter()
    problems = []
    extra_runs = 0
    unfinished_runs = 0  # calls not made by the claim that finished their job
    jobs_run_more = 0
    deferred_unsent: Counter[str] = Counter()  # claims given back before any call (the send limits)
    for job in tg_jobs:
        jid = job["id"]
        own = sorted(claims[jid], key=lambda r: r["new_lease"])
        runs = calls_by_chat.get(str(job["recipient"]), [])
        # each call belongs to the latest claim its incarnation made before it
        per_claim: dict[int, list[tuple[Any, str]]] = defaultdict(list)
        for call, kind in runs:
            inc = call.token.split("soak-", 1)[-1]
            mine = [r for r in own if r["by_inc"] == inc and r["at"] <= call.time + 0.05]
            if not mine:
                problems.append(f"job {jid}: a sendMessage from {inc} without a claim of {inc}")
                continue
            per_claim[mine[-1]["new_lease"]].append((call, kind))
        if len(runs) > 1:
            jobs_run_more += 1
            extra_runs += len(runs) - 1
        for lease, calls in per_claim.items():
            if len(calls) > 1:
                problems.append(f"job {jid}: claim {lease} called sendMessage {len(calls)} times")
        unfinished_runs += sum(len(calls) for calls in per_claim.values())
        for claim in own:
            lease = claim["new_lease"]
            calls = per_claim.get(lease, [])
            ending = endings[jid].get(lease)
            if ending is not None and ending["new_status"] in ("done", "failed"):
                unfinished_runs -= min(1, len(calls))  # its call (if any) is the one that finished the job
                if ending["new_status"] == "done" and (len(calls) != 1 or calls[0][1] not in ("ok", "slow")):
                    problems.append(f"job {jid}: done by claim {lease} whose calls were {[k for _, k in calls]}")
                continue
            cause = why_claim_ended(claim, ending, own, incs, in_outage, calls, lost_logged)
            if calls:
                causes[cause] += 1
            elif not cause.startswith("UNEXPLAINED"):
                deferred_unsent[cause] += 1
            if cause.startswith("retry"):
                retry_causes[cause] += 1
            if cause.startswith("UNEXPLAINED"):
                problems.append(f"job {jid} claim {lease} by {claim['by_inc']}: {cause}")
    # every call is the one that finished its job, or belongs to a claim whose end is explained
    # (counted in causes); a job still open, or finished by a claim that made no call (failed
    # after MAX_DEFER_SECONDS, or for good after a database error), has no finishing call
    if sum(causes.values()) != unfinished_runs:
        problems.append(f"{unfinished_runs} calls by claims that did not finish their job, but "
                        f"{sum(causes.values())} such claims explained")
    report.check("reruns", not problems,
                 f"{jobs_run_more} jobs ran more than once, {extra_runs} extra runs, each after: "
                 + (", ".join(f"{k} {v}" for k, v in causes.most_common()) or "-"), problems)

    # ---- limits: the bot's sends keep to TELEGRAM_GLOBAL_RATE (bursts of at most that many) --------
    send_times = sorted(c.time for c in soak.stub.calls if c.method.lower() == "sendmessage")
    most = {w: most_in_window(send_times, w) for w in LIMIT_WINDOWS}
    allowed = {w: GLOBAL_RATE + GLOBAL_RATE * (w + LIMIT_SLACK) for w in LIMIT_WINDOWS}
    report.check("limits", all(most[w] <= allowed[w] for w in LIMIT_WINDOWS),
                 "sendMessage calls (alerts too) at most " + ", ".join(
                     f"{most[w]} within {w:g} s (allowed {allowed[w]:.0f})" for w in LIMIT_WINDOWS),
                 [f"{most[w]} sendMessage calls within {w:g} s: more than {allowed[w]:.0f}" for w in LIMIT_WINDOWS
                  if most[w] > allowed[w]])

    # ---- processes ------------------------------------------------------------------------------
    problems = []
    for inc in soak.incarnations:
        if inc.signalled is None:
            problems.append(f"{inc.name} was never stopped")
        elif inc.signalled == "TERM" and inc.returncode != 0:
            problems.append(f"{inc.name}: SIGTERM ended in exit {inc.returncode}")
        elif inc.signalled == "KILL" and inc.returncode != -signal.SIGKILL:
            problems.append(f"{inc.name}: SIGKILL ended in exit {inc.returncode}")
        elif inc.signalled not in ("TERM", "KILL"):
            problems.append(f"{inc.name}: {inc.signalled}, exit {inc.returncode}")
    problems += soak.start_failures
    errors: Counter[str] = Counter()
    tracebacks = 0
    for recs in logs.values():
        for r in recs:
            if r.get("level") in ("error", "critical"):
                errors[re.sub(r"\d+", "N", str(r.get("msg", "")))[:90]] += 1
            if "exc" in r or "Traceback" in str(r.get("raw", "")):
                tracebacks += 1
    report.check("processes", not problems,
                 f"{len(soak.incarnations)} incarnations; "
                 f"{sum(1 for i in soak.incarnations if i.signalled == 'KILL')} SIGKILLed, "
                 f"{sum(1 for i in soak.incarnations if i.signalled == 'TERM')} SIGTERMed, all as expected",
                 problems)
    if errors:
        report.notes.append("error log lines: " + "; ".join(f"{v}× {k}" for k, v in errors.most_common(6)))
    if tracebacks:
        report.notes.append(f"log lines with a traceback: {tracebacks}")

    # ---- figures ----------------------------------------------------------------------------------
    ok_latency = [d.latency * 1000 for d in soak.deliveries if d.status == 202]
    disturbances = [t for t, _ in soak.chaos_log] + [i.signalled_at for i in soak.incarnations if i.signalled_at]
    calm_latency = [d.latency * 1000 for d in soak.deliveries if d.status == 202
                    and not in_outage(d.started, d.started + d.latency)
                    and all(abs(d.started - t) > 3.0 for t in disturbances)]
    waits = []
    worst: tuple[float, dict[str, Any] | None] = (0.0, None)
    for row in audit:
        if row["op"] == "update" and row["new_lease"] == row["old_lease"] + 1:
            due = row["old_run_at"] if row["old_status"] == "pending" else row["old_locked_until"]
            wait = max(0.0, row["at"] - due)
            waits.append(wait)
            if wait > worst[0]:
                worst = (wait, row)
    worst_row = worst[1]
    retries = sum(1 for r in audit if r["op"] == "update" and r["old_status"] == "running"
                  and r["new_status"] == "pending" and r["new_attempts"] == r["old_attempts"])
    report.figures = {
        "run_seconds": soak.profile.run_seconds,
        "rate_per_s": soak.profile.rate,
        "updates": len(soak.sent_updates),
        "deliveries": len(soak.deliveries),
        "deliberate_redeliveries": soak.redeliveries,
        "answers": dict(statuses.most_common()),
        "jobs": dict(by_status),
        "kills": sum(1 for i in soak.incarnations if i.signalled == "KILL"),
        "terms_chaos": sum(1 for i in soak.incarnations if i.signalled == "TERM" and not i.final),
        "restarts": len(soak.incarnations) - 2,
        "pg_restarts": len(pg_windows) - soak.pg_stalls,
        "pg_stalls": soak.pg_stalls,
        "claims": n_claims,
        "claims_per_job": round(n_claims / max(1, len(jobs)), 2),
        "retries": retries,
        "retries_by_cause": dict(retry_causes.most_common()),
        "extra_runs_by_cause": dict(causes.most_common()),
        "claims_ended_before_a_call": dict(deferred_unsent.most_common()),
        "sendmessage_calls": len(soak.stub.calls) - len(alert_calls),
        "stub_answers": dict(Counter(k for c, k in zip(soak.stub.calls, soak.stub.kinds, strict=True)
                                     if str(c.params.get("chat_id")) != ALERT_CHAT).most_common()),
        "alerts": len(alert_calls),
        "lease_lost_log_lines": dict(lease_lost_lines),
        "intake_p50_ms": round(percentile(ok_latency, 0.50), 1),
        "intake_p99_ms": round(percentile(ok_latency, 0.99), 1),
        "intake_max_ms": round(max(ok_latency, default=math.nan), 1),
        "intake_p99_ms_calm": round(percentile(calm_latency, 0.99), 1),
        "wait_beyond_run_at_p50_s": round(percentile(waits, 0.50), 3),
        "wait_beyond_run_at_p99_s": round(percentile(waits, 0.99), 3),
        "wait_beyond_run_at_max_s": round(worst[0], 3),
        "wait_max_during_outage": bool(worst_row and in_outage(worst_row["at"] - worst[0], worst_row["at"])),
        "drain_seconds": round(soak.quiesce.get("drained", 0) - soak.quiesce.get("sender_stopped", 0), 1),
        "sendmessage_most_within_s": {f"{w:g}": n for w, n in most.items()},
    }
    waits_calm = [w for w, r in zip(waits, [r for r in audit if r["op"] == "update"
                                            and r["new_lease"] == r["old_lease"] + 1], strict=True)
                  if not in_outage(r["at"] - w, r["at"])]
    report.figures["wait_beyond_run_at_max_outside_outage_s"] = round(max(waits_calm, default=0.0), 3)
    report.notes += [f"chaos +{t - soak.t0:.1f}s: {what}" for t, what in soak.chaos_log]
    return report


def why_claim_ended(
    claim: dict[str, Any],
    end: dict[str, Any] | None,
    claims: list[dict[str, Any]],
    incs: dict[str, Incarnation],
    in_outage: Callable[..., bool],
    calls: list[tuple[Any, str]],
    lost_logged: set[tuple[str, int]],
) -> str:
    """Why a claim that did not finish its job ended: the cause of the run after it."""
    owner = incs.get(claim["by_inc"] or "")
    if end is not None and end["new_status"] == "pending":
        if end["new_attempts"] == end["old_attempts"] - 1:  # the attempt given back
            if owner is not None and owner.signalled == "TERM" and owner.signalled_at is not None \
                    and owner.signalled_at <= end["at"] + 0.1:
                return "cancelled by SIGTERM"  # release_many: put back at shutdown
            # Telegram's limits defer a send (autom/limits.py): after a 429, or before any call
            # while the chat's or the bot's budget is spent, or no database answered the limiter
            kinds = {k for _, k in calls}
            if kinds == {"429"}:
                return "deferred after 429"
            if not calls:
                return "deferred by the send limit"
            return f"UNEXPLAINED: attempt given back after {kinds}"
        error = str(end["last_error"] or "")
        kinds = {k for _, k in calls}
        if "no database connection" in error and in_outage(claim["at"], end["at"]):
            # the send limit's statement found no database (the restart, or the stall's exhausted
            # pool): before the call, or recording the 429 it was answered; a retry in versions
            # before the limiter deferred such sends (a deferral since, above: issue 31)
            if not calls:
                return "retry: no database before its send (outage)"
            if kinds == {"429"}:
                return "retry: no database to record a 429 (outage)"
        if "429" in error or error.startswith("Retry"):
            return "retry after 429" if kinds == {"429"} else f"UNEXPLAINED: 429 error {error!r} after {kinds}"
        if re.search(r"\b5\d\d\b", error):
            return "retry after 502" if kinds == {"502"} else f"UNEXPLAINED: 5xx error {error!r} after {kinds}"
        if any(word in error.lower() for word in ("timed out", "timeout", "deadline", "tooslow")):
            if kinds and kinds <= {"hang", "slow"}:
                return "retry after timeout"
            if kinds <= {"ok"} and end["at"] - claim["at"] >= HTTP_TIMEOUT:
                # the stub answered at once (or never saw the request), and the run gave up no
                # sooner than its whole deadline after its claim: the request or its answer was
                # not through in time (processes starved of CPU on a loaded machine); a deadline
                # cut short would end sooner
                return "retry after timeout (not through within the deadline)"
            return f"UNEXPLAINED: timeout {error!r} after {kinds}"
        return f"UNEXPLAINED: retry after {error!r} ({kinds})"
    if end is not None:
        return f"UNEXPLAINED: ended {end['new_status']}"
    # no ending of its own: the lease ran out and a later claim took the job
    later = next((c for c in claims if c["new_lease"] == claim["new_lease"] + 1), None)
    until = later["at"] if later is not None else time.time()
    if owner is not None and owner.signalled_at is not None and owner.signalled_at <= until:
        return "worker killed (SIGKILL)" if owner.signalled == "KILL" else "owner stopped (SIGTERM, not released)"
    if in_outage(claim["at"], until, slack=LEASE_SECONDS):
        return "database restart or stall (lease lapsed)"
    if (claim["by_inc"], claim["job_id"]) in lost_logged:
        # the process was starved past its lease; the renewer or the completer noticed and logged it
        return "lease lost by a live process (fenced, logged)"
    return "UNEXPLAINED: lease lost while its process ran, and it logged nothing"


# -- printing -----------------------------------------------------------------------------------


def print_report(report: Report) -> None:
    print("\n=== soak checks ===")
    for c in report.checks:
        print(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['name']:<13} {c['detail']}")
        for p in c["problems"]:
            print(f"          - {p}")
    print("\n=== figures ===")
    for k, v in report.figures.items():
        print(f"  {k:<40} {v}")
    if report.notes:
        print("\n=== notes ===")
        for n in report.notes:
            print(f"  {n}")
    print(f"\nsoak {'PASSED' if report.ok else 'FAILED'}", flush=True)


async def soak_main(args: argparse.Namespace) -> Report:
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    profile = Profile.for_run(seconds, args.rate)
    folder = Path(tempfile.mkdtemp(prefix="autom-soak-"))
    keep = args.keep
    report = Report()
    try:
        print(f"soak: {seconds:g}s, seed {args.seed}, logs in {folder}", flush=True)
        with restartable_pg() as pg:
            await trio.to_thread.run_sync(install_audit, pg.dsn)
            mix = dict(MIX)
            if args.fail_rate is not None:
                mix["400"] = args.fail_rate
            stub = FaultyStub(random.Random(args.seed * 7919), mix)
            async with trio.open_nursery() as stub_nursery:
                stop_stub: trio.Event = await stub_nursery.start(serve_stub, stub)
                try:
                    async with autom_processes(folder) as procs:
                        soak = Soak(pg, procs, stub, profile, args.seed)
                        # the drain's allowance when nothing at all had been sent
                        worst = drain_allowance({"all": int(profile.rate * profile.run_seconds)},
                                                profile.drain_margin, chat_rate=GLOBAL_RATE)
                        budget = profile.run_seconds + worst + ALERT_FLUSH_SECONDS + 120
                        try:
                            with trio.fail_after(budget):
                                await soak.run()
                        finally:
                            for inc in soak.incarnations:
                                with trio.CancelScope(shield=True):
                                    await inc.client.aclose()
                finally:
                    stop_stub.set()
            tables = await trio.to_thread.run_sync(fetch_tables, pg.dsn)
        report = analyse(soak, tables)
        keep = keep or not report.ok
        return report
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"logs kept in {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the chaos phase (default 5)")
    parser.add_argument("--seconds", type=float, default=None, help="length in seconds (overrides --minutes)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=None, help="new updates per second (default 10; short: 6)")
    parser.add_argument("--fail-rate", type=float, default=None,
                        help=f"weight of 400 answers (default {MIX['400']}); e.g. 0.05 for an alert storm")
    parser.add_argument("--json", type=Path, default=None, help="write the checks and figures here")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs even when all is well")
    args = parser.parse_args(argv)
    started = time.time()
    report = trio.run(soak_main, args)
    report.figures["wall_seconds"] = round(time.time() - started, 1)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps({"ok": report.ok, "checks": report.checks, "figures": report.figures,
                                         "notes": report.notes}, indent=2, default=str))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
