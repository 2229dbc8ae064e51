"""``WorkerPool``: claims jobs, runs their handlers, records how each run ended.

It composes the roles, each in its module: the ``Fetcher`` claims (a little ahead of
the runners), the ``Executor``'s runners run, ``Claims`` holds every claim with the
``DeadlineWatch`` and the ``Confirmer`` (leases.py), and the ``Completer`` is the one
writer of outcomes and renewals, whose hooks this class implements. Shutdown is two-
phase: ``deps.shutdown`` stops claiming (the queued claims go back at once), then
``stop_at`` bounds the running handlers. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from autom.app import Registry
from autom.context import Services, new_context
from autom.handlers.spec import Handler, HandlerSpec, handler_specs
from autom.jobs.outcome import Outcome
from autom.worker.completer import Completer
from autom.worker.executor import Executor
from autom.worker.fetcher import Fetcher, claim_batch
from autom.worker.leases import Claims, Confirmer, DeadlineWatch, job_fields
from autom.worker.run import QueueStore, Run, lease_margin

if TYPE_CHECKING:
    from datetime import datetime

    from autom.deps import Deps
    from autom.jobs.models import Job
    from autom.jobs.outcome import Written

log = logging.getLogger("autom.worker")


class WorkerPool:
    """``workers`` concurrent handlers fed by one fetcher (see the module docstring).

    ``batch``, ``prefetch``, ``poll_seconds``: the fetcher's (``Fetcher``; ``batch`` None:
    ``claim_batch(workers)``, 10 a worker within 100..200). ``store``: the
    queue (default ``deps.store``; any ``QueueStore``, so the scheduling is tested without
    PostgreSQL). ``context``: builds what a run's handler gets from its ``Run`` (default:
    a ``HandlerContext``).
    """

    def __init__(
        self,
        deps: Deps,
        handlers: Mapping[str, HandlerSpec | Handler],
        *,
        workers: int | None = None,
        batch: int | None = None,
        prefetch: int | None = None,
        poll_seconds: float = 1.0,
        store: QueueStore | None = None,
        context: Callable[[Run], Any] | None = None,
    ) -> None:
        self.deps = deps
        self.handlers = handler_specs(handlers)
        self.workers = max(1, workers or deps.settings.workers)
        self.store: QueueStore = store if store is not None else deps.store
        self.lease_seconds = self.store.lease_seconds
        self._margin = lease_margin(self.lease_seconds)
        # ctx.enqueue accepts the kinds this pool serves
        self.services = Services(settings=deps.settings, db=deps.db, telegram=deps.telegram, http=deps.http,
                                 registry=Registry(handlers=self.handlers, sources=deps.sources))
        self._watch = DeadlineWatch()
        self.claims = Claims(deps.metrics, self._watch)
        self.confirmer = Confirmer(self.store, self.claims.held, self.claims.lost)
        self.fetcher = Fetcher(deps, self.store, self.claims, self.confirmer, workers=self.workers,
                               batch=claim_batch(self.workers) if batch is None else batch,
                               prefetch=prefetch, poll_seconds=poll_seconds, lease_margin=self._margin)
        self.completer = Completer(self.store, self, renew_every=self.lease_seconds / 3)
        self.executor = Executor(deps, self.handlers, self.store, self.claims, self.fetcher, self.confirmer,
                                 self.completer, context or (lambda run: new_context(run, self.services)))
        self._accepting = False  # the fetcher runs: claims (and the intake's hand-offs) are taken
        # read when /metrics is scraped instead of moved twice per job
        deps.metrics.workers_busy.set_function(lambda: len(self.claims.running))

    @property
    def prefetch(self) -> int:
        """The most claimed jobs that may wait for a runner."""
        return self.fetcher.prefetch

    @property
    def capacity(self) -> int:
        """The most jobs this process holds claimed and unfinished now: ``workers`` + the current prefetch."""
        return self.fetcher.capacity

    @property
    def queued(self) -> dict[tuple[int, int], Run]:
        """The claims waiting for a runner."""
        return self.claims.queued

    @property
    def running(self) -> dict[tuple[int, int], Run]:
        """The claims whose handlers run."""
        return self.claims.running

    @property
    def in_flight(self) -> int:
        """Jobs this process holds claimed and not finished: running plus queued."""
        return len(self.claims.running) + len(self.claims.queued)

    def stop_at(self, deadline: float) -> None:
        """Hard deadline (trio clock) for running handlers; what runs then is cancelled and released."""
        self.executor.scope.deadline = min(self.executor.scope.deadline, deadline)

    def cancel_now(self) -> None:
        """Cancel running handlers at once (second signal); their jobs go back to pending."""
        self.executor.scope.cancel()

    def renew_soon(self) -> None:
        """Renew the held leases now: an operator cancelled a running job (the NOTIFY 'cancel'), and the
        renewal that no longer finds its claim stops its handler."""
        self.completer.renew_soon()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Work until ``deps.shutdown`` is set and running handlers have finished (or were cancelled)."""
        self.deps.metrics.workers.set(self.workers)
        async with trio.open_nursery() as aux:
            await aux.start(self.completer.run)
            aux.start_soon(self._watch_shutdown)
            aux.start_soon(self._watch.run, self.claims)
            aux.start_soon(self.confirmer.run)
            with self.executor.scope:
                async with trio.open_nursery() as runners:
                    for _ in range(self.workers):
                        runners.start_soon(self.executor.runner)
                    task_status.started()
                    self._accepting = True
                    try:
                        await self.fetcher.run()
                    finally:
                        self._accepting = False
                        self._give_back_queued()
                    if self.claims.running:
                        log.info("draining: waiting for %d running jobs", len(self.claims.running))
            await self.completer.drain()
            aux.cancel_scope.cancel()
        log.info("worker pool stopped")

    async def _watch_shutdown(self) -> None:
        await self.deps.shutdown.wait_value(True)
        self.fetcher.stop()

    def _give_back_queued(self) -> None:
        """Shutdown: the claimed jobs no runner has started go back to pending (the writer
        records it at once; the pool waits for it before it returns)."""
        runs = self.claims.close()
        for run in runs:
            self.claims.finish(run)
            self.completer.report(run, Outcome.released(run.job))
        if runs:
            log.info("giving back %d claimed jobs not started before shutdown", len(runs))

    async def run_claimed(self, job: Job, claimed_at: float) -> None:
        """Run one job this process claimed (the claim sent at ``claimed_at``, trio clock) outside
        ``run()``, and record its outcome (autom.testing): the same path as a runner's."""
        run = Run(job, claimed_at + self.lease_seconds - self._margin, self.store)
        self.claims.track(run)
        # no deadline watch here (and no renewals): the run's own scope ends at its deadline
        with trio.CancelScope(deadline=run.deadline) as run.scope:
            await self.executor.run_job(run)
        await self.completer.drain()

    # -- the intake's hand-off (autom.events.HandOff) ------------------------------------

    def ready(self) -> bool:
        """Whether the intake of this process may store a job claimed for this pool: the pool
        runs and is not stopping, a runner is free and no claimed job waits for one."""
        return (self._accepting and not self.deps.shutdown.value and not self.claims.queued
                and len(self.claims.running) < self.workers)

    def take(self, job: Job, sent_at: float) -> bool:
        """Hold ``job``, which the intake stored claimed by this process in a statement sent at
        ``sent_at`` (trio clock): a ``Run`` like a claim's, queued for a runner. False once the
        pool no longer takes claims (shutdown): the intake then gives it back."""
        if not self._accepting or self.deps.shutdown.value:
            return False
        # committed durably with its delivery: nothing for the confirmer to do
        self.claims.hold(Run(job, sent_at + self.lease_seconds - self._margin, self.store, confirmed=True))
        return True

    async def give_back(self, job: Job) -> None:
        """Put a claimed job no runner started back to pending at once, the attempt not counted
        (as at shutdown): reported to the writer, which writes it with its next flush, or now
        when the pool is not running."""
        run = Run(job, trio.current_time() + self.lease_seconds - self._margin, self.store)
        run.state = "finishing"
        await self.completer.hand_in(run, Outcome.released(job))

    def due_in(self, delay: float) -> None:
        """A job becomes due in ``delay`` seconds (the send limiter moved a chat's next job to the
        chat's next slot): the fetcher looks for work then, not at its next poll."""
        self.fetcher.due_in(delay)

    # -- the writer's hooks (completer.Hooks) ------------------------------------------

    def held_runs(self) -> list[Run]:
        """Every claim held now: queued, running, finished and not yet written."""
        return self.claims.held()

    def renewed(self, run: Run, started: float) -> None:
        """A renewal sent at ``started`` extended ``run``'s lease: move its local deadline."""
        run.extend(started + self.lease_seconds - self._margin)

    def lost(self, run: Run) -> None:
        """``run``'s claim is gone (``Claims.lost``)."""
        self.claims.lost(run)

    def written(self, run: Run, outcome: Outcome, result: Written | None) -> None:
        """Log and count ``run``'s outcome, now recorded (``result`` None: the claim was lost)."""
        status = outcome.status
        self.claims.forget(run)
        run.state = "written"
        if status == "done" and result is not None:
            return  # the common case: nothing more to say
        context = job_fields(run)
        if status == "done":
            log.warning("job finished but its lease was lost; another claim owns it now", extra=context)
            return
        error = outcome.error
        if result is None:
            log.warning("job %s but its lease was lost: %s", status, error, extra=context)
            return
        if result.status == "failed" and status == "deferred":
            # refused (Telegram's 429) for longer than MAX_DEFER_SECONDS: failed for good
            status, error = "failed", result.error
        self.deps.metrics.job_attempts.labels(run.job.kind, status).inc()
        if outcome.traceback is not None:
            context["traceback"] = outcome.traceback  # a field of the JSON line
        if status == "failed":
            log.error("job failed for good: %s", error, extra=context)
            # the failure recorded its alert (the outbox, autom/alerts.py): wake the sender
            self.deps.alert_bell.ring(run.job.id)
        elif status == "cancelled":
            log.info("job cancelled: %s", error, extra=context)  # no alert: nobody is to be told
        elif status == "released":
            log.warning("job interrupted by shutdown; put back to pending", extra=context)
        else:
            delay = wall_delay(result.run_at)
            self.fetcher.note_due(delay)
            # a send limiter's wait is counted and logged by the limiter (Defer.quiet)
            level = logging.WARNING if status == "retry" else logging.DEBUG if outcome.quiet else logging.INFO
            log.log(level, "job failed, retrying in %.1fs: %s" if status == "retry" else "job deferred for %.1fs: %s",
                    delay, error, extra={**context, "delay_s": round(delay, 3)})

    def dropped(self, run: Run, outcome: Outcome) -> None:
        """The writer gave up on ``run``'s ``outcome`` (the database refuses it): forget the run;
        its lease runs out and the job is claimed again."""
        run.state = "lost"
        run.lost = True
        self.claims.forget(run)

    def flushed(self, freed: bool) -> None:
        """A flush freed a recipient whose next job may be due: the fetcher may claim it now."""
        if freed:
            self.deps.doorbell.set()


def wall_delay(run_at: datetime | None) -> float:
    """Seconds from now until ``run_at`` (0 when it is due or unknown)."""
    return max(0.0, run_at.timestamp() - time.time()) if run_at is not None else 0.0
