"""The fetcher: claims due jobs for the pool's runners, a little ahead of them, fairly.

It keeps up to ``capacity`` jobs claimed (the runners' ``workers`` plus the ones that
may wait for a runner, sized by the pace of the kinds just claimed) and sleeps on the
doorbell (a NOTIFY, the poll, a retry this process scheduled) when nothing is due.
Every claim becomes a ``Run`` held in ``Claims``. Public name: ``Fetcher``.
Design notes (claims ahead, the idle path's claim of two): docs/design/worker.md.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING

import trio

from autom.bells import Doorbell
from autom.jobs.retry import describe
from autom.jobs.store import Ahead
from autom.worker.run import QueueStore, Run

if TYPE_CHECKING:
    from autom.deps import Deps
    from autom.jobs.models import Job
    from autom.worker.leases import Claims, Confirmer

log = logging.getLogger("autom.worker")


#: the most moments of jobs due later a fetcher keeps (``note_due``; beyond, the latest go:
#: the poll finds those jobs)
LOCAL_DUES = 256
#: the most jobs one claim takes (and one pool holds), per worker: ``claim_batch``
BATCH_PER_WORKER = 10
#: ``claim_batch``'s bounds: the default's floor, and its cap (what a kill -9 leaves
#: leased until the leases run out stays at most this many jobs a process)
BATCH_MIN, BATCH_MAX = 100, 200


def claim_batch(workers: int) -> int:
    """The default claim batch for ``workers`` runners: 10 a worker, within 100..200.

    A bigger claim costs less CPU a job on both sides (fewer statements); a drain of
    quick jobs over 1,000 recipients with 16 workers ran ~1.2x faster at 160 than at 100
    (bench/RESULTS.md, "Speed round six"). The cap bounds what one process
    holds claimed, and so what a kill leaves leased."""
    return min(BATCH_MAX, max(BATCH_MIN, BATCH_PER_WORKER * workers))


def moving_average(mean: float, value: float) -> float:
    """A moving average (the first value starts it)."""
    return value if mean <= 0.0 else mean + (value - mean) * 0.05


class Fetcher:
    """Claims for ``workers`` runners, up to ``prefetch`` more ahead (see the module docstring).

    ``batch``: most jobs per claim statement. ``prefetch``: most claimed jobs that may wait
    for a runner (default: ``workers``, or more to fill one batch; never more than ``batch``).
    How many do wait adapts to the kinds' pace (``kind_seconds``): about what the runners
    start during two claim round trips; a kind not measured yet counts as slow (one waits).
    """

    def __init__(self, deps: Deps, store: QueueStore, claims: Claims, confirmer: Confirmer, *, workers: int,
                 batch: int, prefetch: int | None, poll_seconds: float, lease_margin: float) -> None:
        self.deps = deps
        self.store = store
        self.claims = claims
        self._confirmer = confirmer
        self.workers = workers
        self.batch = max(1, batch)
        wanted = max(workers, self.batch - workers) if prefetch is None else prefetch
        self.prefetch = max(0, min(wanted, self.batch))
        self.poll_seconds = poll_seconds
        self._lease_left = store.lease_seconds - lease_margin  # a claim's local deadline, from its send
        #: claimed jobs that may wait now (``_adapt``); one until a kind's pace is known
        self.ahead = min(self.prefetch, 1)
        #: kind → moving average of its runs' seconds (the runners report them: ``measured``)
        self.kind_seconds: dict[str, float] = {}
        self._claim_s = 0.0  # moving average of a claim's round trip
        #: this pool's row of the start order (``worker_starts``), once registered
        self.claimant: int | None = None
        self._ticket = 0  # the last start ticket handed out
        self._local_dues: list[float] = []  # a heap: when jobs this process wrote become due (trio clock)
        self._room_bell = Doorbell()  # rung when the fetcher waits for room and there is enough
        self._wants_room = False
        self._stopping = Doorbell()  # rung once shutdown is set

    @property
    def capacity(self) -> int:
        """The most jobs held claimed and unfinished now: ``workers`` + the current ``ahead``."""
        return self.workers + self.ahead

    def room(self) -> int:
        """How many more jobs may be claimed now."""
        return self.capacity - len(self.claims.running) - len(self.claims.queued)

    def may_claim(self) -> bool:
        """Whether there is room for a claim: with claimed jobs still waiting for a runner,
        only once half a batch is free, so claims stay batches."""
        room = self.room()
        return room > 0 and (not self.claims.queued or room >= max(1, min(self.batch, self.capacity) // 2))

    def measured(self, kind: str, seconds: float) -> None:
        """A run of ``kind`` took ``seconds`` (it sets how many of its jobs may wait)."""
        self.kind_seconds[kind] = moving_average(self.kind_seconds.get(kind, 0.0), seconds)

    def room_freed(self) -> None:
        """A run ended: wake the fetcher if it waits for room and there is enough now."""
        if self._wants_room and self.may_claim():
            self._room_bell.set()

    def stop(self) -> None:
        """Shutdown is set: wake the fetcher wherever it waits."""
        self._stopping.set()
        self._room_bell.set()
        self.deps.doorbell.set()

    @property
    def _next_local_due(self) -> float:
        """The earliest moment a job this process wrote becomes due (trio clock), or inf."""
        return self._local_dues[0] if self._local_dues else math.inf

    def note_due(self, delay: float) -> None:
        """A job this process wrote becomes due in ``delay`` seconds: look for work then at the latest.

        Every such moment is kept (up to ``LOCAL_DUES``, the earliest), not only the earliest:
        a job moved later after an earlier moment was noted (a chat's next job, moved again
        when Telegram answered: limits.SendLimiter.sent) is looked for at its own time, not
        at the next poll after the earlier moment found nothing."""
        dues = self._local_dues
        heapq.heappush(dues, trio.current_time() + max(0.0, delay))
        if len(dues) > LOCAL_DUES:
            dues[:] = heapq.nsmallest(LOCAL_DUES // 2, dues)

    def due_in(self, delay: float) -> None:
        """``note_due``, and wake the fetcher now if that is earlier than it meant to look."""
        earliest = self._next_local_due
        self.note_due(delay)
        if self._next_local_due < earliest:
            self.deps.doorbell.set()  # the fetcher, asleep until its poll, recomputes its sleep

    async def run(self) -> None:
        """Claim until shutdown is set."""
        backoff = 0.5
        shutdown = self.deps.shutdown
        doorbell = self.deps.doorbell
        idle = False  # the last claim came back short: nothing more was due then
        sweep_at = -math.inf  # when the fetcher may next sweep (store.retire_idle)
        while not shutdown.value:
            if not self.may_claim():
                await self._wait_for_room()
                continue
            # Woken with nothing in hand, most often one job is due: a claim of two,
            # prepared and committed asynchronously (the confirmer makes it durable); two
            # come back, and the next round claims a batch (committed durably)
            fast = idle and not self.claims.queued
            want = min(self.room(), 2 if fast else self.batch)
            seen = doorbell.count
            try:
                jobs = await self._claim(want, fast)
            except Exception as exc:  # database down or a statement error: back off, never die
                log.warning("claim failed, retrying in %.1fs: %s", backoff, describe(exc))
                with trio.move_on_after(backoff):
                    await self._stopping.wait_after(self._stopping.count)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            idle = len(jobs) < want
            if idle:
                if trio.current_time() >= sweep_at:
                    # the recipients with nothing due that their last completion could not
                    # retire (rare): off the claim's path, at most once per poll
                    sweep_at = trio.current_time() + self.poll_seconds
                    await self._sweep()
                await self._sleep(seen)

    async def _wait_for_room(self) -> None:
        seen = self._room_bell.count
        self._wants_room = True
        try:
            await self._room_bell.wait_after(seen)
        finally:
            self._wants_room = False

    async def _claim(self, want: int, fast: bool) -> list[Job]:
        """Claim up to ``want`` jobs (``fast``: asynchronously, to be confirmed) and hold them."""
        started = trio.current_time()
        claims = self.claims
        # the first jobs of the claim go to idle runners at once; the rest wait, ahead
        ahead = Ahead(self.claimant, self._ticket, max(0, self.workers - len(claims.running) - len(claims.queued)))
        if self.claimant is None:
            self.claimant = ahead.claimant = await self.store.register_claimant()
        jobs = await self.store.claim(want, durable=not fast, ahead=ahead)
        self._claim_s = moving_average(self._claim_s, trio.current_time() - started)
        self._adapt(jobs)
        # the database set each lease at (or after) the moment the claim was sent
        deadline = started + self._lease_left
        tickets = ahead.tickets if len(ahead.tickets) == len(jobs) else [0] * len(jobs)
        for job, ticket in zip(jobs, tickets, strict=True):
            claims.hold(Run(job, deadline, self.store, confirmed=not fast, ticket=ticket))
        if tickets and tickets[-1] > self._ticket:
            self._ticket = tickets[-1]
        if fast and jobs:
            self._confirmer.ring()
        return jobs

    async def _sleep(self, seen: int) -> None:
        """Nothing more is due now: sleep until rung, polled, or a retry of this process is due."""
        timeout = min(self.poll_seconds, max(0.0, self._next_local_due - trio.current_time()))
        with trio.move_on_after(timeout):
            await self.deps.doorbell.wait_after(seen)
        # forgotten only once it came: a ring before it (due_in's own) must not lose it
        now = trio.current_time()
        dues = self._local_dues
        while dues and dues[0] <= now:
            heapq.heappop(dues)

    async def _sweep(self) -> None:
        try:
            await self.store.retire_idle(self.batch)
        except Exception as exc:  # the next sweep tries again; claims do not depend on it
            log.warning("retiring idle recipients failed: %s", describe(exc))

    def _adapt(self, jobs: list[Job]) -> None:
        """Set how many claimed jobs may wait: what the runners start during two claim round
        trips (at least 1, at most ``prefetch``), at the claimed jobs' mean run time (their
        kinds' recent runs), not the mean of the kinds' paces, which a quick kind makes
        (docs/design/worker.md, "Claims ahead"); a kind not measured yet counts as one that
        never ends (slow until one run ended)."""
        if not jobs or not self.prefetch:
            return
        kind_s = self.kind_seconds
        measured = [kind_s[job.kind] for job in jobs if job.kind in kind_s]
        # jobs/s the workers start: workers over the measured jobs' mean run time, times the
        # share of the claim they are (none measured: 0, and one may wait)
        pace = self.workers * len(measured) / max(sum(measured), 1e-6) * len(measured) / len(jobs)
        self.ahead = max(1, min(self.prefetch, math.ceil(pace * self._claim_s * 2)))
