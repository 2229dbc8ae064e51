"""The worker pool's scheduling without PostgreSQL: a queue in memory behind the store interface.

What is tested here is the pool's own logic (how many jobs it claims ahead, what
it does at shutdown, how it treats a claim it no longer holds, how outcomes reach
the one writer); the SQL behind the real store is tested in tests/integration.
The clock is trio's autojump clock: nothing here waits on a thread or a socket.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import trio

from autom.config import Settings
from autom.deps import Deps
from autom.errors import Defer, PermanentError
from autom.handlers.spec import HandlerSpec
from autom.jobs.models import Job
from autom.jobs.outcome import DONE, Outcome, Written
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import Ahead, JobStore
from autom.worker import WorkerPool
from tests.support.queue import sleeping_handler


class MemoryStore:
    """Jobs in a dict; claims, outcomes and renewals noted for the assertions."""

    def __init__(self, *, lease_seconds: float = 30.0, claim_seconds: float = 0.01) -> None:
        self.lease_seconds = lease_seconds
        self.retry = RetryPolicy(base=1.0, cap=60.0)
        self._decider = JobStore(None, lease_seconds=lease_seconds, retry=self.retry, rand=lambda: 0.5)
        self.claim_seconds = claim_seconds
        self.pending: list[Job] = []
        self.claims: list[int] = []  # n asked, per claim
        self.done: list[tuple[int, int]] = []
        self.settled: list[Outcome] = []
        self.renew_fails = False
        self.renew_drops: set[int] = set()  # ids a renewal no longer finds
        self.renewals = 0
        self.next_claims: list[list[Job]] = []  # scripted claim answers, used first
        self.sweeps = 0
        self.durable: list[bool] = []  # per claim: committed durably (else to be confirmed)
        self.confirms: list[list[int]] = []  # ids per confirmation
        self.confirm_fails = False
        self.confirm_drops: set[int] = set()  # ids a confirmation does not find (lost in a crash)
        self.tickets: dict[int, int] = {}  # id → the start ticket of its last claim
        self.starts: list[int] = []  # the start order recorded, in order

    def add(self, n: int, kind: str = "k", **fields: Any) -> list[Job]:
        start = len(self.pending) + len(self.done) + len(self.settled) + 1
        fields = {"payload": {}, **fields}
        jobs = [Job(id=start + i, kind=kind, attempts=0, max_attempts=3, lease=0,
                    locked_until=datetime.now(UTC), **fields) for i in range(n)]
        self.pending.extend(jobs)
        return jobs

    async def claim(self, n: int = 1, *, durable: bool = True, ahead: Ahead | None = None) -> list[Job]:
        await trio.sleep(self.claim_seconds)
        self.claims.append(n)
        self.durable.append(durable)
        if self.next_claims:
            return self.next_claims.pop(0)
        taken, self.pending = self.pending[:n], self.pending[n:]
        if ahead is not None:  # as the claim statement numbers them
            ahead.tickets[:] = [0 if i < ahead.now_n else ahead.ticket + i + 1 - ahead.now_n
                                for i in range(len(taken))]
            self.tickets.update({j.id: t for j, t in zip(taken, ahead.tickets, strict=True)})
        return [replace(j, attempts=j.attempts + 1, lease=j.lease + 1) for j in taken]

    async def register_claimant(self) -> int:
        return 7

    async def record_starts(self, claimant: int, upto: int) -> None:
        await trio.sleep(0.001)
        self.starts.append(upto)

    async def confirm(self, jobs: Sequence[Job]) -> set[int]:
        await trio.sleep(0.001)
        self.confirms.append([j.id for j in jobs])
        if self.confirm_fails:
            raise ConnectionError("server closed the connection unexpectedly")
        return {j.id for j in jobs if j.id not in self.confirm_drops}

    async def retire_idle(self, n: int = 100) -> int:
        self.sweeps += 1
        return 0

    async def write(self, outcomes: Sequence[Outcome], *, tx: Any = None,
                    starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]:
        await trio.sleep(0.001)
        done = [o.job for o in outcomes if o.status == "done"]
        others = [o for o in outcomes if o.status != "done"]
        self.done.extend((j.id, j.lease) for j in done)
        self.settled.extend(others)
        if starts is not None:
            self.starts.append(starts[1])
        written = {j.id: DONE for j in done}
        written.update({o.job.id: Written("failed" if o.status == "failed" else "pending") for o in others})
        return written, any(o.job.recipient is not None for o in others)

    async def renew(self, jobs: Sequence[Job]) -> dict[int, datetime]:
        await trio.sleep(0.001)
        self.renewals += 1
        if self.renew_fails:
            raise ConnectionError("database unreachable")
        return {j.id: datetime.now(UTC) for j in jobs if j.id not in self.renew_drops}

    def decide(self, job: Job, error: BaseException | str, *, retry: RetryPolicy | None = None) -> Outcome:
        return self._decider.decide(job, error, retry=retry)


class NoTelegram:
    """No handler here talks to Telegram; failures ring ``deps.alert_bell``."""


def make_pool(store: MemoryStore, handlers: dict[str, Any], **kwargs: Any) -> WorkerPool:
    workers = kwargs.pop("workers", 4)
    deps = Deps(settings=Settings(workers=workers), db=None, store=store, sources={},  # type: ignore[arg-type]
                telegram=NoTelegram())  # type: ignore[arg-type]
    return WorkerPool(deps, handlers, workers=workers, poll_seconds=0.5, store=store, **kwargs)


async def until(condition: Any, seconds: float = 60.0) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.01)


async def test_what_waits_adapts_to_the_handlers_pace(autojump_clock: Any) -> None:
    """Fast handlers: up to a batch claimed ahead; slow ones: one job in reserve."""
    for handler_s, expected in ((0.001, 46), (1.0, 1)):
        store = MemoryStore(claim_seconds=0.01)
        store.add(400)

        async def work(ctx: Any, job: Job, seconds: float = handler_s) -> None:
            await trio.sleep(seconds)

        pool = make_pool(store, {"k": work}, workers=4, batch=50)
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            await until(lambda s=store: len(s.done) >= 100)  # type: ignore[misc]
            pool.deps.shutdown.value = True
        # what may wait: the workers' pace times two claim round trips (at least 1, at most prefetch)
        assert pool.capacity - pool.workers == expected
        assert max(store.claims) <= 50


async def test_what_waits_follows_the_mean_run_time_of_a_mix_not_its_quickest_kind(autojump_clock: Any) -> None:
    """Seven quick jobs (1 ms) in ten and three slow ones (100 ms, a network call): the
    workers start ~130 a second, so two claim round trips (10 ms each) are ~3 jobs waiting;
    the mean of the two kinds' paces (~700 a second a worker) would let a whole prefetch wait
    behind the slow ones, each holding its recipient's line."""
    store = MemoryStore(claim_seconds=0.01)
    for _ in range(60):
        store.add(7, kind="quick")
        store.add(3, kind="slow")

    async def work(ctx: Any, job: Job) -> None:
        await trio.sleep(0.001 if job.kind == "quick" else 0.1)

    pool = make_pool(store, {"quick": work, "slow": work}, workers=4, batch=50)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.done) >= 300)
        pool.deps.shutdown.value = True
    assert 2 <= pool.capacity - pool.workers <= 5
    fetcher = pool.fetcher
    assert fetcher.kind_seconds["quick"] == pytest.approx(0.001, rel=0.2)
    assert fetcher.kind_seconds["slow"] == pytest.approx(0.1, rel=0.2)


async def test_shutdown_gives_back_queued_claims_and_releases_running_ones_at_the_hard_deadline(
    autojump_clock: Any,
) -> None:
    store = MemoryStore()
    store.add(8)
    started: list[int] = []

    async def hang(ctx: Any, job: Job) -> None:
        started.append(job.id)
        await trio.sleep_forever()

    pool = make_pool(store, {"k": hang}, workers=2, batch=4, prefetch=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(pool.running) == 2 and len(pool.queued) >= 1)
        queued = len(pool.queued)
        pool.deps.shutdown.value = True
        await until(lambda: len(store.settled) == queued)
        assert {s.status for s in store.settled} == {"released"}
        pool.stop_at(trio.current_time() + 1.0)
    assert len(started) == 2  # nothing queued started after shutdown
    released = [s for s in store.settled if s.status == "released"]
    assert len(released) == queued + 2
    assert sorted(s.error or "" for s in released)[-2:] == ["interrupted by shutdown"] * 2
    assert store.done == []


async def test_a_new_claim_of_an_id_still_held_replaces_the_old_claim(autojump_clock: Any) -> None:
    """Job 3 waits in the queue under lease 1; its lease runs out unnoticed and the next
    claim returns it under lease 2: only lease 2 runs, and the pool keeps going."""
    store = MemoryStore()
    a, b, c = store.add(3)
    store.pending.clear()
    gate = trio.Event()
    ran: list[tuple[int, int]] = []

    async def work(ctx: Any, job: Job) -> None:
        ran.append((job.id, job.lease))
        if job.id != c.id:
            await gate.wait()

    store.next_claims = [[replace(j, attempts=1, lease=1) for j in (a, b)],
                         [replace(c, attempts=1, lease=1)],
                         [replace(c, attempts=2, lease=2)]]
    pool = make_pool(store, {"k": work}, workers=2, batch=2, prefetch=2)
    pool.fetcher.kind_seconds["k"] = 0.001  # a fast kind: two may wait
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.claims) >= 3)
        assert list(pool.queued) == [(c.id, 2)]
        gate.set()
        await until(lambda: len(store.done) == 3)
        pool.deps.shutdown.value = True
    assert sorted(ran) == [(a.id, 1), (b.id, 1), (c.id, 2)]
    assert sorted(store.done) == [(a.id, 1), (b.id, 1), (c.id, 2)]


async def test_a_renewal_that_no_longer_finds_the_claim_cancels_the_handler_and_writes_nothing(
    autojump_clock: Any,
) -> None:
    store = MemoryStore(lease_seconds=3.0)
    (job,) = store.add(1)
    long, ended = sleeping_handler()

    store.renew_drops.add(job.id)
    pool = make_pool(store, {"k": long}, workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: ended != [])
        pool.deps.shutdown.value = True
    assert ended == ["cancelled"]
    assert store.done == [] and store.settled == []
    assert trio.current_time() < 3.0  # the first renewal (at lease/3) found it gone


async def test_failing_renewals_cancel_the_handler_at_its_local_deadline(autojump_clock: Any) -> None:
    store = MemoryStore(lease_seconds=2.0)
    store.add(1)
    store.renew_fails = True
    ended: list[float] = []

    async def long(ctx: Any, j: Job) -> None:
        try:
            await trio.sleep(5)
        finally:
            ended.append(trio.current_time())

    pool = make_pool(store, {"k": long}, workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: ended != [])
        pool.deps.shutdown.value = True
    # stopped before the lease (2 s from the claim) could run out, not after 5 s
    assert ended[0] < 2.0
    assert store.renewals >= 2 and store.done == [] and store.settled == []


async def test_a_runner_whose_run_was_stopped_runs_the_next_jobs_and_each_sees_its_own_deadline(
    autojump_clock: Any,
) -> None:
    """A runner keeps one cancel scope for its runs until it stops one (autom/worker/executor.py):
    after a lost claim and a passed local deadline, the same runner runs the next jobs to the
    end, each bounded by its own lease, and ``ctx.deadline`` is the run's local deadline."""
    store = MemoryStore(lease_seconds=3.0)
    (lost,) = store.add(1, kind="long")
    store.renew_drops.add(lost.id)
    ended: list[tuple[int, str]] = []
    seen: list[tuple[float, float]] = []

    async def long(ctx: Any, j: Job) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            ended.append((j.id, "stopped"))
            raise

    async def short(ctx: Any, j: Job) -> None:
        seen.append((trio.current_time(), ctx.deadline))
        await trio.sleep(0.5)
        ended.append((j.id, "done"))

    pool = make_pool(store, {"long": long, "short": short}, workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(ended) == 1)  # the lost claim: stopped at the first renewal
        store.renew_drops.clear()
        (late,) = store.add(1, kind="long")
        store.renew_fails = True  # its renewals fail: stopped at its local deadline
        pool.deps.doorbell.set()
        await until(lambda: len(ended) == 2)
        store.renew_fails = False
        store.add(2, kind="short")
        pool.deps.doorbell.set()
        await until(lambda: len(ended) == 4)
        pool.deps.shutdown.value = True
    assert ended[:2] == [(lost.id, "stopped"), (late.id, "stopped")]
    assert [e[1] for e in ended[2:]] == ["done", "done"]
    assert len(store.done) == 2
    assert store.settled == []
    for started, deadline in seen:
        # the local deadline: the claim (sent before the run started) + the lease - its margin
        assert started < deadline <= started + 3.0 - 0.3 + 1e-9


async def test_every_outcome_goes_to_the_one_writer(autojump_clock: Any) -> None:
    store = MemoryStore()
    store.add(1, kind="ok")
    store.add(1, kind="flaky")
    store.add(1, kind="bad")
    store.add(1, kind="later")
    store.add(1, kind="nobody")

    async def ok(ctx: Any, job: Job) -> None:
        pass

    async def flaky(ctx: Any, job: Job) -> None:
        raise RuntimeError("502")

    async def bad(ctx: Any, job: Job) -> None:
        raise PermanentError("400 chat not found")

    async def later(ctx: Any, job: Job) -> None:
        raise Defer("chat limit", after=2.5)

    pool = make_pool(store, {"ok": ok, "flaky": flaky, "bad": bad, "later": later})
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.done) + len(store.settled) == 5)
        pool.deps.shutdown.value = True
    outcomes = {s.job.kind: (s.status, s.error, s.delay) for s in store.settled}
    assert [j for j, _ in store.done] == [1]
    # an unexpected exception names the innermost frame of the user's code; it keeps its traceback
    assert outcomes["flaky"][0::2] == ("retry", 1.0)
    assert re.fullmatch(r"RuntimeError: 502 \(at test_worker_pool_logic\.py:\d+ in flaky\)", outcomes["flaky"][1])
    assert "Traceback" in next(s.traceback or "" for s in store.settled if s.job.kind == "flaky")
    assert next(s.traceback for s in store.settled if s.job.kind == "bad") is None
    assert outcomes["bad"] == ("failed", "PermanentError: 400 chat not found", 0.0)
    assert outcomes["later"] == ("deferred", "Defer: chat limit", 2.5)
    assert outcomes["nobody"] == ("failed", "no handler for kind 'nobody'", 0.0)
    # the failures for good rang the alert sender, the retry and the deferral did not
    assert sorted(pool.deps.alert_bell.take()) == [3, 5]


async def test_an_outcome_the_database_refuses_does_not_hold_up_the_others(autojump_clock: Any) -> None:
    """One outcome PostgreSQL refuses for good (a QueryError that is not transient) must
    not block every later outcome behind it: the writer falls back to one at a time and
    drops only that one (its job runs again after its lease)."""
    from autom.errors import QueryError

    class Picky(MemoryStore):
        async def write(self, outcomes: Sequence[Outcome], *, tx: Any = None,
                        starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]:
            if any(o.job.kind == "poison" for o in outcomes):
                raise QueryError("DataError (SQLSTATE 22021): invalid byte sequence", sqlstate="22021")
            return await super().write(outcomes, tx=tx, starts=starts)

    store = Picky()
    store.add(1, kind="poison")
    store.add(3, kind="flaky")

    async def fail(ctx: Any, job: Job) -> None:
        raise RuntimeError("502")

    pool = make_pool(store, {"poison": fail, "flaky": fail})
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.settled) == 3)
        pool.deps.shutdown.value = True
    assert sorted(s.job.kind for s in store.settled) == ["flaky"] * 3
    assert pool.completer.pending == 0


async def test_woken_with_nothing_in_hand_the_fetcher_claims_two_and_sweeps_at_most_once_a_poll(
    autojump_clock: Any,
) -> None:
    """The claim of one or two jobs is prepared (JobStore.claim), the batch claim is not: a
    fetcher woken with nothing queued asks for two, and for a batch again only when both
    came back. Going idle, it sweeps (store.retire_idle), at most once per poll."""
    store = MemoryStore()
    done: list[int] = []

    async def work(ctx: Any, job: Job) -> None:
        done.append(job.id)

    pool = make_pool(store, {"k": work}, workers=4, batch=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.claims) == 1)
        assert store.claims == [5]  # the first claim: a batch (4 workers + 1 waiting: pace unknown)
        assert store.sweeps == 1
        store.add(1)
        pool.deps.doorbell.set()
        await until(lambda: len(done) == 1)
        assert store.claims[1:] == [2]  # one came back: asleep again, no second claim
        store.add(5)
        pool.deps.doorbell.set()
        await until(lambda: len(done) == 6)
        # two came back, so more may be due: a batch (the room left) at once
        assert store.claims[2] == 2 and store.claims[3] > 2
        await trio.sleep(0.1)
        assert store.sweeps == 1  # within the first poll
        await trio.sleep(5.0)  # polled ten times since, nothing due
        assert 2 <= store.sweeps <= 12
        pool.deps.shutdown.value = True


async def test_an_idle_claim_commits_asynchronously_and_is_confirmed_while_its_handler_runs(
    autojump_clock: Any,
) -> None:
    """Woken with nothing in hand, the fetcher's claim of two is asynchronous (JobStore.claim,
    durable False) and confirmed once its handler has started; a batch claim is durable and
    needs none; a run that ended before the confirmation needs none either."""
    store = MemoryStore()
    started: list[int] = []
    release = trio.Event()

    async def work(ctx: Any, job: Job) -> None:
        started.append(job.id)
        if job.payload.get("wait"):
            await release.wait()

    pool = make_pool(store, {"k": work}, workers=4, batch=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.claims) == 1)
        assert store.durable == [True]  # the first claim: a batch
        (slow,) = store.add(1, payload={"wait": True})
        pool.deps.doorbell.set()
        await until(lambda: store.confirms != [])
        assert store.durable[1:] == [False] and store.confirms == [[slow.id]] and started == [slow.id]
        release.set()
        await until(lambda: store.done != [])
        (fast,) = store.add(1)
        pool.deps.doorbell.set()
        await until(lambda: len(store.done) == 2)
        await trio.sleep(0.5)
        assert not any(store.durable[1:])  # every claim woken with nothing in hand (and the polls)
        assert store.confirms == [[slow.id]]  # the no-op handler had ended: nothing to confirm
        assert [j for j, _ in store.done] == [slow.id, fast.id]
        pool.deps.shutdown.value = True


async def _lost_idle_claim(store: MemoryStore) -> list[str]:
    long, ended = sleeping_handler()

    pool = make_pool(store, {"k": long}, workers=2, batch=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.claims) == 1)
        store.add(1)
        pool.deps.doorbell.set()
        await until(lambda: ended != [])
        pool.deps.shutdown.value = True
    return ended


async def test_an_idle_claim_the_confirmation_does_not_find_stops_its_handler_at_once(autojump_clock: Any) -> None:
    """The claim was lost in a crash (the confirmation finds its job without it): the run
    is stopped right away, before anyone could claim the job again, and writes nothing."""
    store = MemoryStore(lease_seconds=30.0)
    store.confirm_drops.add(1)
    ended = await _lost_idle_claim(store)
    assert ended == ["cancelled"] and store.confirms == [[1]]
    assert store.done == [] and store.settled == [] and store.renewals == 0
    assert trio.current_time() < 1.0  # not at a renewal (10 s) or the local deadline


async def test_an_idle_claim_that_cannot_be_confirmed_stops_its_handler_at_once(autojump_clock: Any) -> None:
    """The server went away before it answered: whether the claim reached its disk is not
    known, so the run stops at once (its job runs again when the lease runs out)."""
    store = MemoryStore(lease_seconds=30.0)
    store.confirm_fails = True
    ended = await _lost_idle_claim(store)
    assert ended == ["cancelled"] and store.confirms == [[1]]
    assert store.done == [] and store.settled == []
    assert trio.current_time() < 1.0


async def test_a_slow_kind_waits_one_deep_while_a_fast_kind_claims_batches(autojump_clock: Any) -> None:
    """Each kind's runs are timed on their own: after a fast kind drained in batches, a slow
    kind (not measured yet, then measured slow) has at most one job waiting beyond the
    busy workers, so another replica finds the rest."""
    store = MemoryStore(claim_seconds=0.01)
    store.add(200, kind="fast")
    waiting: list[int] = []  # jobs held when a slow one starts

    async def fast(ctx: Any, job: Job) -> None:
        await trio.sleep(0.001)

    async def slow(ctx: Any, job: Job) -> None:
        waiting.append(pool.in_flight)
        await trio.sleep(3.0)

    pool = make_pool(store, {"fast": fast, "slow": slow}, workers=4, batch=50)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.done) == 200)
        assert pool.capacity - pool.workers > 1  # the fast kind: a batch waits
        claims = len(store.claims)
        store.add(20, kind="slow")
        pool.deps.doorbell.set()
        await until(lambda: len(store.done) == 220)
        pool.deps.shutdown.value = True
    assert max(waiting) <= 5, waiting  # held: the 4 workers' jobs and one more
    assert max(store.claims[claims:]) <= 5  # 4 workers + 1
    assert pool.capacity - pool.workers == 1


async def test_a_job_claimed_ahead_gets_a_ticket_and_its_start_is_recorded(autojump_clock: Any) -> None:
    """The first jobs of a claim go to idle runners (ticket 0: counted with the claim); the
    one that waits gets the next ticket, and the writer records it once its run starts."""
    store = MemoryStore()
    first, second = store.add(2)

    async def work(ctx: Any, job: Job) -> None:
        await trio.sleep(1.0)

    pool = make_pool(store, {"k": work}, workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.tickets) == 2)
        assert store.tickets == {first.id: 0, second.id: 1}
        assert store.starts == []  # the second waits: nothing started beyond the claim
        await until(lambda: len(store.done) == 2)
        pool.deps.shutdown.value = True
    assert store.starts == [1]


def _at_most_once(fn: Any) -> dict[str, HandlerSpec]:
    return {"k": HandlerSpec("k", fn, at_most_once=True)}


async def test_an_at_most_once_job_whose_earlier_run_started_fails_without_running(autojump_clock: Any) -> None:
    store = MemoryStore()
    (job,) = store.add(1)
    store.pending.clear()
    store.next_claims = [[replace(job, attempts=2, lease=2)]]  # attempt 1 started, and was lost
    ran: list[int] = []

    async def work(ctx: Any, job: Job) -> None:
        ran.append(job.id)

    pool = make_pool(store, _at_most_once(work), workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.settled) == 1)
        pool.deps.shutdown.value = True
    assert ran == []
    assert [(s.status, s.error) for s in store.settled] == [("failed", "lost with its worker (at-most-once)")]


async def test_an_at_most_once_run_that_raises_fails_instead_of_retrying(autojump_clock: Any) -> None:
    store = MemoryStore()
    store.add(1)

    async def work(ctx: Any, job: Job) -> None:
        raise ConnectionError("the payment API went away")

    pool = make_pool(store, _at_most_once(work), workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(store.settled) == 1)
        pool.deps.shutdown.value = True
    assert [s.status for s in store.settled] == ["failed"]


async def test_a_shutdown_fails_a_started_at_most_once_run_and_gives_back_the_rest(autojump_clock: Any) -> None:
    store = MemoryStore()
    store.add(3)
    started: list[int] = []

    async def hang(ctx: Any, job: Job) -> None:
        started.append(job.id)
        await trio.sleep_forever()

    pool = make_pool(store, _at_most_once(hang), workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(pool.running) == 1 and len(pool.queued) == 1)
        pool.deps.shutdown.value = True
        await until(lambda: len(store.settled) == 1)
        pool.stop_at(trio.current_time() + 1.0)
    outcomes = {s.job.id: (s.status, s.error) for s in store.settled}
    assert outcomes.pop(started[0]) == ("failed", "interrupted by shutdown (at-most-once)")
    assert [o for o, _ in outcomes.values()] == ["released"]  # claimed ahead, never started


async def test_an_at_most_once_run_claimed_ahead_waits_for_its_start_to_be_recorded(autojump_clock: Any) -> None:
    """Its start must be on record before its handler runs: lost unrecorded, it would run again."""
    store = MemoryStore()
    store.add(2)
    ran: list[int] = []
    gate = trio.Event()

    async def work(ctx: Any, job: Job) -> None:
        ran.append(job.id)
        await trio.sleep(0.5)

    recorded = store.record_starts

    async def record_starts(claimant: int, upto: int) -> None:
        await gate.wait()
        await recorded(claimant, upto)

    original_write = store.write

    async def write(outcomes: Sequence[Outcome], *, tx: Any = None,
                    starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]:
        if starts is not None:
            await gate.wait()
        return await original_write(outcomes, tx=tx, starts=starts)

    store.record_starts = record_starts  # type: ignore[method-assign]
    store.write = write  # type: ignore[method-assign]
    pool = make_pool(store, _at_most_once(work), workers=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        await until(lambda: len(ran) == 1 and len(pool.running) == 1 and not pool.queued)
        await trio.sleep(5.0)
        assert len(ran) == 1  # the second run waits for its start's record
        gate.set()
        await until(lambda: len(ran) == 2)
        pool.deps.shutdown.value = True
    assert store.starts == [1]


async def test_an_at_most_once_run_waits_for_its_idle_claim_to_be_confirmed(autojump_clock: Any) -> None:
    """The idle path's claim commits asynchronously: an at-most-once handler starts only once
    the confirmation found the claim on disk, so a claim lost in a crash never ran."""
    for drops in (set(), {1}):
        store = MemoryStore(lease_seconds=30.0)
        store.confirm_drops |= drops
        ran: list[int] = []

        async def work(ctx: Any, job: Job, ran: list[int] = ran, store: MemoryStore = store) -> None:
            ran.append(len(store.confirms))  # confirmations sent when it started

        pool = make_pool(store, _at_most_once(work), workers=2, batch=10)
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.run)
            await until(lambda s=store: len(s.claims) == 1)  # type: ignore[misc]
            store.add(1)
            pool.deps.doorbell.set()
            await until(lambda s=store: len(s.confirms) == 1)  # type: ignore[misc]
            await trio.sleep(1.0)
            pool.deps.shutdown.value = True
        assert store.durable[1] is False
        assert ran == ([] if drops else [1])
