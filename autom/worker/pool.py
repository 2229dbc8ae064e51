"""The worker pool: claim (fair, batched, one claim ahead) → handler → complete (batched) or fail.

Inside the service nursery::

    WorkerPool.run
    ├── completer      batches completions into one statement (group-commit style)
    ├── renewer        extends the leases of held jobs (queued, running, finishing) every lease/3
    ├── stop watcher   wakes the fetcher when shutdown is set
    └── handler scope  (hard deadline at shutdown)
        ├── fetcher    keeps up to WORKERS + prefetch jobs claimed; waits on the doorbell when nothing is due
        └── WORKERS worker tasks, each running one claimed job at a time, fed by a memory channel

Claims run ahead of the handlers. While WORKERS handlers run, more claimed jobs
wait in the pool's queue, so the next claim's round trip overlaps the jobs in hand
instead of leaving the workers idle (bench/RESULTS.md, Worker). How many may wait
follows the handlers' pace: about what the workers start during two claim round
trips, never more than ``prefetch`` (at most one claim batch). Fast handlers get
whole batches; slow ones keep one job in reserve instead of holding leased jobs
that another replica could run. With jobs still queued, the fetcher claims again
only once half a batch of room is free, so claims stay batches.

Shutdown is two-phase: ``deps.shutdown`` stops the fetcher (soft), and the claimed
jobs that no worker has started go back to pending at once; running handlers get
until ``stop_at(deadline)`` (hard), then they are cancelled and their jobs put back
to pending at once, the interrupted attempt not counted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from autom.bells import Doorbell
from autom.deps import Deps
from autom.errors import AutomError, PermanentError
from autom.handlers import Handler, HandlerContext
from autom.jobs.models import Job
from autom.jobs.retry import describe

log = logging.getLogger("autom.worker")

#: how long shielded clean-up (release, last flush) may take at shutdown
CLEANUP_SECONDS = 5.0


@dataclass(slots=True, eq=False)
class _Running:
    """A claimed job from its claim to its end: queued, then running (``started`` set)."""

    job: Job
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: float = 0.0


def _average(mean: float, value: float) -> float:
    """A moving average (the first value starts it)."""
    return value if mean <= 0.0 else mean + (value - mean) * 0.05


def _context(job: Job) -> dict[str, object]:
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}


class Completer:
    """Marks finished jobs done in batches: the first completion flushes at once,
    those that arrive during a flush go together in the next one."""

    def __init__(self, deps: Deps, on_flushed: Doorbell, lock: trio.Lock) -> None:
        self._deps = deps
        # shared with the renewer: both update the same job and recipient rows, and two
        # multi-row statements of one process locking them in different orders deadlocked
        # under load (bench/load.py found it); one at a time, they cannot
        self._lock = lock
        self._pending: dict[int, Job] = {}
        self._bell = Doorbell()
        self._on_flushed = on_flushed
        self.flushes = 0

    def add(self, job: Job) -> None:
        """Queue ``job`` for completion (the worker slot is free right away)."""
        self._pending[job.id] = job
        self._bell.set()

    @property
    def pending(self) -> list[Job]:
        """Jobs finished but not yet recorded as done (their leases still need renewing)."""
        return list(self._pending.values())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush forever (cancel it after ``drain``)."""
        task_status.started()
        backoff = 0.2
        while True:
            seen = self._bell.count
            if not self._pending:
                await self._bell.wait_after(seen)
                continue
            try:
                await self._flush()
                backoff = 0.2
            except Exception as exc:  # any database error: the completions wait, the service lives
                log.warning(f"could not record completions, retrying in {backoff:.1f}s: {describe(exc)}")
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _flush(self) -> None:
        async with self._lock:
            # taken under the lock: the shutdown drain and the flush loop may both be here,
            # and a batch must not be sent twice (the second would match nothing)
            batch = list(self._pending.values())
            if not batch:
                return
            held, more = await self._deps.store.complete_batch(batch)
            for job in batch:
                self._pending.pop(job.id, None)
                if job.id not in held:
                    log.warning("job finished but its lease was lost; another claim owns it now",
                                extra=_context(job))
        self.flushes += 1
        if more:
            # a completion freed a recipient that has its next job due: the fetcher may
            # claim it now (otherwise these completions freed nothing a claim could find)
            self._on_flushed.set()

    async def drain(self) -> None:
        """Record what is still pending (shielded, bounded): called once at shutdown."""
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
            while self._pending:
                try:
                    await self._flush()
                except Exception as exc:
                    log.warning(f"could not record completions at shutdown: {describe(exc)}")
                    await trio.sleep(0.5)
        if self._pending:
            log.error(f"{len(self._pending)} finished jobs not recorded as done; they will run again "
                      "when their leases expire")


class WorkerPool:
    """``workers`` concurrent handlers fed by one fetcher; see the module docstring.

    ``batch``: most jobs per claim statement. ``prefetch``: most claimed jobs that may
    wait for a worker beyond the ``workers`` running (default: ``workers``, or more to
    fill one batch; never more than ``batch``). How many do wait adapts to the
    handlers' pace (``_adapt``): about what the workers start during two claim round
    trips, so fast handlers get whole batches and slow ones hold one job in reserve.
    Until the first handler has finished, ``min(prefetch, workers)`` may wait.
    """

    def __init__(
        self,
        deps: Deps,
        handlers: Mapping[str, Handler],
        *,
        workers: int | None = None,
        batch: int = 100,
        prefetch: int | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        self.deps = deps
        self.handlers = dict(handlers)
        self.workers = max(1, workers or deps.settings.workers)
        self.batch = max(1, batch)
        wanted = max(self.workers, self.batch - self.workers) if prefetch is None else prefetch
        self.prefetch = max(0, min(wanted, self.batch))
        # claimed jobs that may wait now: adapts (see _adapt); until the handlers' pace is
        # known, as many as the workers (a slow start holds no batch away from other replicas)
        self._ahead = min(self.prefetch, self.workers)
        self._handler_s = 0.0  # moving average of a handler's run time (0: not measured yet)
        self._claim_s = 0.0  # moving average of a claim's round trip
        self.poll_seconds = poll_seconds
        self.store = deps.store
        self.ctx = HandlerContext(settings=deps.settings, db=deps.db, telegram=deps.telegram)
        self.running: dict[int, _Running] = {}  # handler started
        self.queued: dict[int, _Running] = {}  # claimed, waiting for a worker (in the channel)
        self._send, self._receive = trio.open_memory_channel[_Running](math.inf)
        self._slots = Doorbell()  # rung when the fetcher waits for room and there is enough
        self._wants_room = False
        self._stopping = Doorbell()  # rung once shutdown is set
        self._handler_scope = trio.CancelScope()
        self._next_local_due = math.inf  # earliest retry this process scheduled (trio clock)
        self._rows_lock = trio.Lock()
        self._completer = Completer(deps, deps.doorbell, self._rows_lock)
        self.lease_seconds = deps.store.lease_seconds
        self._by_kind: dict[str, tuple[Any, Any]] = {}  # kind → (duration histogram, "done" counter)
        # read when /metrics is scraped instead of moved twice per job
        deps.metrics.workers_busy.set_function(lambda: len(self.running))

    @property
    def capacity(self) -> int:
        """The most jobs this process holds claimed and unfinished now: ``workers`` + the current prefetch."""
        return self.workers + self._ahead

    @property
    def in_flight(self) -> int:
        """Jobs this process holds claimed and not finished: running plus queued."""
        return len(self.running) + len(self.queued)

    def stop_at(self, deadline: float) -> None:
        """Hard deadline (trio clock) for running handlers; what runs then is cancelled and released."""
        self._handler_scope.deadline = min(self._handler_scope.deadline, deadline)

    def cancel_now(self) -> None:
        """Cancel running handlers at once (second signal); their jobs go back to pending."""
        self._handler_scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Work until ``deps.shutdown`` is set and running handlers have finished (or were cancelled)."""
        self.deps.metrics.workers.set(self.workers)
        async with trio.open_nursery() as aux:
            await aux.start(self._completer.run)
            aux.start_soon(self._renew_loop)
            aux.start_soon(self._watch_shutdown)
            with self._handler_scope:
                async with trio.open_nursery() as runners:
                    for _ in range(self.workers):
                        runners.start_soon(self._worker)
                    task_status.started()
                    try:
                        await self._fetch_loop()
                    finally:
                        await self._give_back_queued()
                    if self.running:
                        log.info(f"draining: waiting for {len(self.running)} running jobs")
            await self._completer.drain()
            aux.cancel_scope.cancel()
        log.info("worker pool stopped")

    async def _watch_shutdown(self) -> None:
        await self.deps.shutdown.wait_value(True)
        # wake the fetcher wherever it waits
        self._stopping.set()
        self._slots.set()
        self.deps.doorbell.set()

    # -- fetching ------------------------------------------------------------------

    def _may_claim(self) -> bool:
        """Whether there is room for a claim: with claimed jobs still waiting for a worker,
        only once half a batch is free, so claims stay batches."""
        room = self.capacity - len(self.running) - len(self.queued)
        return room > 0 and (not self.queued or room >= max(1, min(self.batch, self.capacity) // 2))

    async def _fetch_loop(self) -> None:
        backoff = 0.5
        shutdown = self.deps.shutdown
        doorbell = self.deps.doorbell
        while not shutdown.value:
            if not self._may_claim():
                seen = self._slots.count
                self._wants_room = True
                try:
                    await self._slots.wait_after(seen)
                finally:
                    self._wants_room = False
                continue
            want = min(self.capacity - len(self.running) - len(self.queued), self.batch)
            seen = doorbell.count
            started = trio.current_time()
            try:
                jobs = await self.store.claim(want)
            except Exception as exc:  # database down or a statement error: back off, never die
                log.warning(f"claim failed, retrying in {backoff:.1f}s: {describe(exc)}")
                await self._wait(self._stopping, self._stopping.count, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            self._claim_s = _average(self._claim_s, trio.current_time() - started)
            self._adapt()
            queued, send = self.queued, self._send.send_nowait
            for job in jobs:
                claim = _Running(job)
                queued[job.id] = claim
                send(claim)
            if len(jobs) < want:
                # nothing more is due now: sleep until rung, polled, or a local retry is due
                timeout = min(self.poll_seconds, max(0.0, self._next_local_due - trio.current_time()))
                if self._next_local_due <= trio.current_time() + timeout:
                    self._next_local_due = math.inf
                await self._wait(doorbell, seen, timeout)

    def _adapt(self) -> None:
        """Set how many claimed jobs may wait: what the workers start, at their recent
        pace, during two claim round trips (at least 1, at most ``prefetch``)."""
        if self._handler_s <= 0.0 or not self.prefetch:
            return
        pace = self.workers / max(self._handler_s, 1e-6)  # jobs/s the workers can start
        self._ahead = max(1, min(self.prefetch, math.ceil(pace * self._claim_s * 2)))

    @staticmethod
    async def _wait(bell: Doorbell, seen: int, seconds: float) -> None:
        """Wait for ``bell`` (rung after ``seen``; shutdown rings every bell the fetcher waits on) or ``seconds``."""
        with trio.move_on_after(seconds):
            await bell.wait_after(seen)

    async def _give_back_queued(self) -> None:
        """Shutdown: put the claimed jobs no worker has started back to pending (shielded, bounded)."""
        self._send.close()  # the workers finish what they run, then find the channel closed
        claims = list(self.queued.values())
        self.queued.clear()  # a worker skips a job that is no longer queued
        if not claims:
            return
        jobs = [c.job for c in claims]
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
            try:
                async with self._rows_lock:
                    released = await self.store.release(jobs)
                log.info(f"gave back {len(released)} claimed jobs not started before shutdown")
                return
            except AutomError as exc:
                log.error(f"could not give back {len(jobs)} claimed jobs not started; they run again after "
                          f"their leases: {describe(exc)}")
                return
        log.error(f"giving back {len(jobs)} claimed jobs not started timed out; they run again after their leases")

    # -- running ---------------------------------------------------------------------

    async def _worker(self) -> None:
        queued = self.queued
        async for claim in self._receive:
            if queued.pop(claim.job.id, None) is None:
                continue  # given back at shutdown, or its lease was lost while it waited
            await self._run_job(claim)

    def _kind_metrics(self, kind: str) -> tuple[Any, Any]:
        found = self._by_kind.get(kind)
        if found is None:
            metrics = self.deps.metrics
            found = self._by_kind[kind] = (metrics.job_seconds.labels(kind),
                                           metrics.job_attempts.labels(kind, "done"))
        return found

    async def _run_job(self, running: _Running) -> None:
        job = running.job
        self.running[job.id] = running
        running.started = trio.current_time()
        metrics = self.deps.metrics
        try:
            handler = self.handlers.get(job.kind)
            if handler is None:
                await self._fail(job, PermanentError(f"no handler for kind {job.kind!r}"), running)
                return
            if job.attempts > job.max_attempts:
                # claimed again after its lease expired on the last attempt: the worker died
                await self._fail(job, PermanentError(
                    f"attempts exhausted: attempt {job.max_attempts} was lost with its worker"), running)
                return
            with running.scope:
                try:
                    await handler(self.ctx, job)
                except Exception as exc:
                    await self._fail(job, exc, running)
                    return
            if running.scope.cancelled_caught:
                log.warning("lease lost while the handler ran; stopped it", extra=_context(job))
                metrics.job_attempts.labels(job.kind, "lease_lost").inc()
                return
            duration = trio.current_time() - running.started
            self._handler_s = _average(self._handler_s, duration)
            seconds, done = self._kind_metrics(job.kind)
            seconds.observe(duration)
            done.inc()
            self._completer.add(job)
            if log.isEnabledFor(logging.INFO):
                log.info("job done", extra={**_context(job), "duration_ms": round(duration * 1000, 1)})
        except trio.Cancelled:
            # hard shutdown: give the job back now instead of waiting for its lease
            context = _context(job)
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
                try:
                    released = await self.store.release([job], reason="interrupted by shutdown")
                    if released:
                        metrics.job_attempts.labels(job.kind, "released").inc()
                        log.warning("job interrupted by shutdown; put back to pending", extra=context)
                except AutomError as exc:
                    log.error(f"could not put the job back; it runs again after its lease: {describe(exc)}",
                              extra=context)
            raise
        finally:
            del self.running[job.id]
            if self._wants_room and self._may_claim():
                self._slots.set()

    async def _fail(self, job: Job, exc: Exception, running: _Running) -> None:
        """Record a failed attempt; alert once when the job failed for good."""
        context = _context(job)
        metrics = self.deps.metrics
        duration = trio.current_time() - running.started
        self._handler_s = _average(self._handler_s, duration)
        metrics.job_seconds.labels(job.kind).observe(duration)
        # shielded: a failure being recorded (and its alert) must not be cut off by the
        # shutdown deadline; both are bounded by their own timeouts
        with trio.CancelScope(shield=True):
            await self._record_failure(job, exc, context)
        if job.recipient is not None:
            # the failure freed the recipient: its next job may be due now
            self.deps.doorbell.set()

    async def _record_failure(self, job: Job, exc: Exception, context: dict[str, object]) -> None:
        metrics = self.deps.metrics
        try:
            with trio.fail_after(CLEANUP_SECONDS):
                outcome = await self.store.fail(job, exc)
        except (AutomError, trio.TooSlowError) as db_exc:
            log.error(f"could not record the failure ({describe(exc)}); the job runs again after its lease: "
                      f"{db_exc}", extra=context)
            return
        if outcome.status == "stale":
            log.warning(f"job failed but its lease was lost: {outcome.error}", extra=context)
            return
        if outcome.final:
            metrics.job_attempts.labels(job.kind, "failed").inc()
            log.error(f"job failed for good: {outcome.error}", extra=context)
            # the failure recorded its alert (the outbox, autom/alerts.py): wake the sender
            self.deps.alert_bell.ring(job.id)
            return
        metrics.job_attempts.labels(job.kind, "retry").inc()
        delay = (outcome.run_at.timestamp() - time.time()) if outcome.run_at else 0.0
        self._next_local_due = min(self._next_local_due, trio.current_time() + max(0.0, delay))
        log.warning(f"job failed, retrying in {max(delay, 0):.1f}s: {outcome.error}",
                    extra={**context, "delay_s": round(max(delay, 0.0), 3)})

    # -- leases ----------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        interval = max(0.05, self.lease_seconds / 3)
        while True:
            await trio.sleep(interval)
            claims = [*self.running.values(), *self.queued.values()]
            jobs = [c.job for c in claims] + self._completer.pending
            if not jobs:
                continue
            try:
                async with self._rows_lock:
                    held = await self.store.renew(jobs)
            except Exception as exc:  # the next round tries again, well before the leases run out
                log.warning(f"could not renew {len(jobs)} leases: {describe(exc)}")
                continue
            for claim in claims:
                job_id = claim.job.id
                if job_id in held:
                    continue
                # another claim owns the job now: it must not run, or finish, twice
                if self.queued.pop(job_id, None) is not None:
                    log.warning("lease lost before the job started; dropped it", extra=_context(claim.job))
                elif self.running.get(job_id) is claim:
                    claim.scope.cancel()
