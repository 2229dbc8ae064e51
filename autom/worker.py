"""The worker pool: claim (fair, batched) → handler → complete (batched) or fail.

Inside the service nursery::

    WorkerPool.run
    ├── completer      batches completions into one statement (group-commit style)
    ├── renewer        extends the leases of running jobs every lease/3
    └── handler scope  (hard deadline at shutdown)
        ├── fetcher    claims as many jobs as there are idle slots, waits on the doorbell
        └── one task per running job

Shutdown is two-phase: ``deps.shutdown`` stops the fetcher (soft); running
handlers get until ``stop_at(deadline)`` (hard), then they are cancelled and
their jobs put back to pending at once, the interrupted attempt not counted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import psycopg
import trio
import trio_util

from autom.deps import Deps, Doorbell
from autom.errors import AutomError, PermanentError
from autom.handlers import Handler, HandlerContext
from autom.jobs.models import Job
from autom.jobs.retry import describe

log = logging.getLogger("autom.worker")

#: how long shielded clean-up (release, last flush) may take at shutdown
CLEANUP_SECONDS = 5.0


@dataclass
class _Running:
    job: Job
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: float = field(default_factory=trio.current_time)


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
            held = await self._deps.store.complete_many(batch)
            for job in batch:
                self._pending.pop(job.id, None)
                if job.id not in held:
                    log.warning("job finished but its lease was lost; another claim owns it now",
                                extra={"job_id": job.id, "kind": job.kind, "attempt": job.attempts})
        self.flushes += 1
        # a completion frees the recipient: the fetcher may find its next job now
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
    """``workers`` concurrent handlers fed by one fetcher; see the module docstring."""

    def __init__(
        self,
        deps: Deps,
        handlers: Mapping[str, Handler],
        *,
        workers: int | None = None,
        batch: int = 50,
        poll_seconds: float = 1.0,
    ) -> None:
        self.deps = deps
        self.handlers = dict(handlers)
        self.workers = workers or deps.settings.workers
        self.batch = batch
        self.poll_seconds = poll_seconds
        self.store = deps.store
        self.ctx = HandlerContext(settings=deps.settings, db=deps.db, telegram=deps.telegram)
        self.running: dict[int, _Running] = {}
        self.in_flight = trio_util.AsyncValue(0)
        self._slots = Doorbell()
        self._handler_scope = trio.CancelScope()
        self._next_local_due = math.inf  # earliest retry this process scheduled (trio clock)
        self._rows_lock = trio.Lock()
        self._completer = Completer(deps, deps.doorbell, self._rows_lock)
        self.lease_seconds = deps.store.lease_seconds

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
            with self._handler_scope:
                async with trio.open_nursery() as runners:
                    task_status.started()
                    await self._fetch_loop(runners)
                    if self.running:
                        log.info(f"draining: waiting for {len(self.running)} running jobs")
            await self._completer.drain()
            aux.cancel_scope.cancel()
        log.info("worker pool stopped")

    # -- fetching ------------------------------------------------------------------

    async def _fetch_loop(self, runners: trio.Nursery) -> None:
        backoff = 0.5
        shutdown = self.deps.shutdown
        while not shutdown.value:
            free = self.workers - len(self.running)
            if free <= 0:
                await self._wait(self._slots, self._slots.count, math.inf)
                continue
            want = min(free, self.batch)
            seen = self.deps.doorbell.count
            try:
                jobs = await self.store.claim(want)
            except Exception as exc:  # database down or a statement error: back off, never die
                log.warning(f"claim failed, retrying in {backoff:.1f}s: {describe(exc)}")
                await self._wait(None, 0, backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            for job in jobs:
                self.running[job.id] = _Running(job)
                runners.start_soon(self._run_job, job)
            self.in_flight.value = len(self.running)
            if len(jobs) < want:
                # nothing more is due now: sleep until rung, polled, or a local retry is due
                timeout = min(self.poll_seconds, max(0.0, self._next_local_due - trio.current_time()))
                if self._next_local_due <= trio.current_time() + timeout:
                    self._next_local_due = math.inf
                await self._wait(self.deps.doorbell, seen, timeout)

    async def _wait(self, bell: Doorbell | None, seen: int, seconds: float) -> None:
        """Wait for ``bell`` (rung after ``seen``), shutdown, or ``seconds``."""
        waits = [partial(self.deps.shutdown.wait_value, True)]
        if bell is not None:
            waits.append(partial(bell.wait_after, seen))
        with trio.move_on_after(seconds):
            await trio_util.wait_any(*waits)

    # -- running ---------------------------------------------------------------------

    async def _run_job(self, job: Job) -> None:
        running = self.running[job.id]
        metrics = self.deps.metrics
        metrics.workers_busy.inc()
        context = {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}
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
                log.warning("lease lost while the handler ran; stopped it", extra=context)
                metrics.job_attempts.labels(job.kind, "lease_lost").inc()
                return
            duration = trio.current_time() - running.started
            metrics.job_seconds.labels(job.kind).observe(duration)
            metrics.job_attempts.labels(job.kind, "done").inc()
            self._completer.add(job)
            log.info("job done", extra={**context, "duration_ms": round(duration * 1000, 1)})
        except trio.Cancelled:
            # hard shutdown: give the job back now instead of waiting for its lease
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
                try:
                    released = await self.store.release([job], reason="interrupted by shutdown")
                    if released:
                        metrics.job_attempts.labels(job.kind, "released").inc()
                        log.warning("job interrupted by shutdown; put back to pending", extra=context)
                except (AutomError, psycopg.Error) as exc:
                    log.error(f"could not put the job back; it runs again after its lease: {describe(exc)}",
                              extra=context)
            raise
        finally:
            self.running.pop(job.id, None)
            self.in_flight.value = len(self.running)
            metrics.workers_busy.dec()
            self._slots.set()

    async def _fail(self, job: Job, exc: Exception, running: _Running) -> None:
        """Record a failed attempt; alert once when the job failed for good."""
        context = {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}
        metrics = self.deps.metrics
        duration = trio.current_time() - running.started
        metrics.job_seconds.labels(job.kind).observe(duration)
        # shielded: a failure being recorded (and its alert) must not be cut off by the
        # shutdown deadline; both are bounded by their own timeouts
        with trio.CancelScope(shield=True):
            await self._record_failure(job, exc, context)

    async def _record_failure(self, job: Job, exc: Exception, context: dict[str, object]) -> None:
        metrics = self.deps.metrics
        try:
            with trio.fail_after(CLEANUP_SECONDS):
                outcome = await self.store.fail(job, exc)
        except (AutomError, psycopg.Error, trio.TooSlowError) as db_exc:
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
            self.deps.telegram.alert_bell.ring(job.id)
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
            jobs = [r.job for r in self.running.values()] + self._completer.pending
            if not jobs:
                continue
            try:
                async with self._rows_lock:
                    held = await self.store.renew(jobs)
            except Exception as exc:  # the next round tries again, well before the leases run out
                log.warning(f"could not renew {len(jobs)} leases: {describe(exc)}")
                continue
            for job in jobs:
                running = self.running.get(job.id)
                if job.id not in held and running is not None:
                    # another claim owns the job now: stop our run, it must not finish twice
                    running.scope.cancel()
