"""Webhooks while PostgreSQL is frozen: what each sender was answered, what was stored, how long it took.

``await freeze_round(pg, freeze_seconds)`` serves the app in this process on a
PostgreSQL the caller started (``restartable_pg``), keeps ``SENDERS`` Telegram
senders delivering distinct updates (each its own chat, so no recipient cap
interferes), freezes the server and all its processes (SIGSTOP) for
``freeze_seconds``, thaws it (SIGCONT), lets the deliveries in flight end, and
reads the events table before any sender retries. Then every update answered 503
is delivered again until it gets a 202, as Telegram does. The ``Round`` says what
happened; ``problems`` what contradicts the README (Reliability: 202 stored exactly
once, 503 not stored unless its statement had started before the server stopped
and the server stayed stopped past the delivery's deadline, every answer within
the deadline).

``python bench/faults.py --only intake`` repeats a long and a short freeze and
prints each round's counts and the totals (bench/RESULTS.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from autom.db import open_database
from tests.support.http_app import TELEGRAM_SECRET, running_app
from tests.support.restartable_pg import RestartablePg, restartable_pg

#: concurrent senders (each waits for its answer before the next delivery)
SENDERS = 8
#: the documented deadline of a delivery (README, Sources: 10 s of the body's arrival)
DEADLINE = 10.0


@dataclass
class Answered:
    """One delivery: its update id, status, answer body, and when it was sent and answered (trio time)."""

    update: int
    status: int
    body: Any
    sent: float
    answered: float

    @property
    def seconds(self) -> float:
        """How long the answer took."""
        return self.answered - self.sent


@dataclass
class Round:
    """What one freeze did (see the module docstring)."""

    freeze_seconds: float
    deliveries: int = 0
    accepted: int = 0  # 202 with an event id
    refused: int = 0  # 503
    other: int = 0  # any other answer, or none (a transport error)
    #: 503s whose update was stored all the same before any retry: the README's exception
    #: (started before the server stopped, which stayed stopped past the deadline)
    refused_stored: int = 0
    stored: int = 0  # events stored before the retries
    max_seconds: float = 0.0
    retries: int = 0  # deliveries of the 503'd updates until each got its 202
    duplicates_on_retry: int = 0  # retries answered {"duplicate": true}
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        """The counts as one JSON-able dict."""
        return {"freeze_s": self.freeze_seconds, "deliveries": self.deliveries, "202": self.accepted,
                "503": self.refused, "other": self.other, "stored": self.stored,
                "503_stored": self.refused_stored, "retry_duplicates": self.duplicates_on_retry,
                "max_answer_s": round(self.max_seconds, 2), "problems": len(self.problems)}


def update(n: int) -> bytes:
    """A Telegram update with id ``n`` in chat ``n``."""
    return json.dumps({"update_id": n, "message": {"message_id": n, "chat": {"id": n, "type": "private"},
                                                   "text": f"#{n}"}}).encode()


HEADERS = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET, "Content-Type": "application/json"}


async def post(client: httpx.AsyncClient, n: int) -> Answered:
    """Deliver update ``n`` once."""
    sent = trio.current_time()
    try:
        response = await client.post("/hooks/telegram", content=update(n), headers=HEADERS)
    except httpx.HTTPError as exc:
        return Answered(n, 0, repr(exc), sent, trio.current_time())
    return Answered(n, response.status_code, response.json(), sent, trio.current_time())


async def freeze_round(pg: RestartablePg, freeze_seconds: float, *, first_update: int = 1) -> Round:
    """One round (module docstring); the updates are numbered from ``first_update``."""
    result = Round(freeze_seconds)
    answers: list[Answered] = []
    async with (
        # the service's own pool settings (autom/service.py), a connect timeout below the deadline
        open_database(pg.dsn, min_size=2, max_size=8, pool_timeout=1.0, connect_timeout=2.0) as db,
        running_app(db) as app,
        httpx.AsyncClient(base_url=app.url, timeout=60.0) as client,
    ):
        next_update = first_update
        stop = False

        async def sender() -> None:
            nonlocal next_update
            while not stop:
                n, next_update = next_update, next_update + 1
                answers.append(await post(client, n))

        async with trio.open_nursery() as nursery:
            for _ in range(SENDERS):
                nursery.start_soon(sender)
            await trio.sleep(1.0)  # deliveries flowing, the intake has had its first hops
            frozen_at = trio.current_time()
            try:
                pg.freeze()
                # every server process is stopped by now: a transaction that began before this
                # began before its backend stopped (the README's exception)
                stopped_wall = time.time()
                await trio.sleep(freeze_seconds)
            finally:
                pg.thaw()
            await trio.sleep(1.0)
            stop = True  # each sender ends with the answer it is waiting for
        # statements the server took before or during the freeze have run now (or never will)
        await _quiet(pg)
        stored = {int(row["dedup_key"]): row for row in await db.fetch_all(
            "select id, dedup_key, extract(epoch from received_at)::float8 as at from events")}

        result.deliveries = len(answers)
        result.stored = len(stored)
        result.max_seconds = max(a.seconds for a in answers)
        refused = []
        for a in answers:
            if a.status == 202 and isinstance(a.body, dict) and "id" in a.body:
                result.accepted += 1
                row = stored.get(a.update)
                if row is None or row["id"] != a.body["id"]:
                    result.problems.append(f"update {a.update} answered {a.body} but stored as {row}")
            elif a.status == 503:
                result.refused += 1
                refused.append(a)
                row = stored.get(a.update)
                if row is not None:
                    result.refused_stored += 1
                    # the exception: its statement began before the server stopped
                    if not row["at"] < stopped_wall:
                        result.problems.append(
                            f"update {a.update} answered 503 at {a.answered - frozen_at:.2f} s after the freeze "
                            f"but stored, its transaction {row['at'] - stopped_wall:.3f} s after the server stopped")
            else:
                result.other += 1
                result.problems.append(f"update {a.update}: {a.status} {a.body}")
            if a.seconds > DEADLINE + 2.0:
                result.problems.append(f"update {a.update} answered {a.status} after {a.seconds:.2f} s")
        if len(stored) != len({a.update for a in answers if a.update in stored}):
            result.problems.append("an event was stored that no sender delivered")

        # the senders retry what was refused, until 202, as Telegram does
        for a in refused:
            with trio.fail_after(30):
                while True:
                    again = await post(client, a.update)
                    result.retries += 1
                    if again.status == 202:
                        break
                    await trio.sleep(0.2)
            if again.body == {"duplicate": True}:
                result.duplicates_on_retry += 1
        count = await db.fetch_val("select count(*) from events")
        distinct = await db.fetch_val("select count(distinct dedup_key) from events")
        delivered = len({a.update for a in answers})
        if not count == distinct == delivered:
            result.problems.append(f"after the retries: {count} events, {distinct} distinct, {delivered} updates")
        jobs = await db.fetch_val("select count(*) from jobs")
        if jobs != count:
            result.problems.append(f"{jobs} jobs for {count} events")
    return result


async def _quiet(pg: RestartablePg) -> None:
    """Until the server runs no statement but this check's (what was sent to it has run by then)."""
    def active() -> int:
        with pg.connect() as conn:
            row = conn.execute("select count(*) from pg_stat_activity where state = 'active'"
                               " and backend_type = 'client backend' and pid <> pg_backend_pid()").fetchone()
            return int(row[0]) if row else 0

    with trio.fail_after(30):
        while await trio.to_thread.run_sync(active):
            await trio.sleep(0.05)


async def freeze_rounds(freezes: tuple[float, ...] = (DEADLINE + 5.0, 4.0)) -> list[Round]:
    """One round of each freeze (seconds), each on a throwaway server of its own (bench/faults.py)."""
    rounds = []
    for seconds in freezes:
        with restartable_pg() as pg:
            rounds.append(await freeze_round(pg, seconds))
    return rounds
