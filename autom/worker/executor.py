"""The executor: ``workers`` runners, each running one claimed job at a time.

A run's handler gets a ``HandlerContext`` (or what ``WorkerPool(context=...)`` builds)
and runs in its runner's cancel scope, which the deadline watch, a lost claim or a hard
shutdown cancels. How it ended becomes one ``Outcome`` reported to the writer; a run
whose handler wrote its "done" in its own transaction (``Run.complete_in``) reports none.
An at-most-once run starts only once its claim and its start are on disk.
Public names: ``Executor``, ``HandlerTimeout``. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from autom import tracing
from autom.errors import JobError, PermanentError, TransientError
from autom.jobs.outcome import Outcome
from autom.worker.completer import CLEANUP_SECONDS
from autom.worker.leases import job_fields
from autom.worker.tracebacks import traceback_text, user_frame

if TYPE_CHECKING:
    from autom.context import RunState
    from autom.deps import Deps
    from autom.handlers.spec import HandlerSpec
    from autom.jobs.models import Job
    from autom.worker.completer import Completer
    from autom.worker.fetcher import Fetcher
    from autom.worker.leases import Claims, Confirmer
    from autom.worker.run import QueueStore, Run

log = logging.getLogger("autom.worker")

#: the error of an at-most-once job whose run was lost (README, Reliability)
LOST_AT_MOST_ONCE = "lost with its worker (at-most-once)"
#: the error of an at-most-once job whose run a shutdown cut short
INTERRUPTED_AT_MOST_ONCE = "interrupted by shutdown (at-most-once)"


class HandlerTimeout(TransientError):
    """A run took longer than its kind's ``timeout``: cancelled, counted, retried with backoff."""


class Executor:
    """Runs the claims ``Claims`` queues; reports each run's outcome to the ``Completer``."""

    def __init__(self, deps: Deps, handlers: Mapping[str, HandlerSpec], store: QueueStore, claims: Claims,
                 fetcher: Fetcher, confirmer: Confirmer, completer: Completer,
                 make_context: Callable[[Run], Any]) -> None:
        # the other roles it works with, as WorkerPool wires them (a constructor's
        # assignments, like every other one: what duplicates pairs it with)
        self.deps = deps
        self.handlers = handlers
        self.store = store
        self.claims = claims
        self.fetcher = fetcher
        self.confirmer = confirmer
        self.completer = completer
        self.make_context = make_context
        #: where handlers run: a hard shutdown sets its deadline (or cancels it)
        self.scope = trio.CancelScope()
        self._started = 0  # the highest start ticket whose run started
        self._by_kind: dict[str, tuple[Any, Any]] = {}  # kind → (duration histogram, "done" counter)

    async def runner(self) -> None:
        """Run queued claims one at a time until the queue is closed (shutdown)."""
        claims = self.claims
        while True:
            # one scope for every run of this runner until it stops one of them (a scope per
            # run cost ~5 µs a job: docs/design/worker.md)
            with trio.CancelScope() as scope:
                async for run in claims.receive:
                    if claims.queued.pop(run.key, None) is None:
                        continue  # given back at shutdown, or its claim was lost while it waited
                    if run.expired():
                        # its local deadline passed while it waited (renewals failed): not ours to start
                        claims.drop(run, "lease could not be renewed before the job started; dropped it")
                        continue
                    run.scope = scope
                    await self.run_job(run)
                return  # the channel is closed: shutdown
            # the scope was cancelled to stop one of its runs (``run_job`` dropped it): a new one

    async def run_job(self, run: Run) -> None:
        """Run ``run``'s handler in ``run.scope`` and report how it ended (every job's path)."""
        job = run.job
        run.state = "running"
        claims = self.claims
        claims.running[run.key] = run
        run.started = trio.current_time()
        claimant = self.fetcher.claimant
        if run.ticket > self._started and claimant is not None:
            # its run starts: the writer records it (the claim's attempt then stays counted
            # if the lease is lost)
            self._started = run.ticket
            self.completer.started(claimant, run.ticket)
        outcome: Outcome | None = None
        spec = self.handlers.get(job.kind)
        called = False  # the handler was called (an at-most-once run cut short fails)
        try:
            if spec is None:
                # counted: the alert says "failed after 1 attempt", as for any run that failed at once
                outcome = Outcome.failed(job, f"no handler for kind {job.kind!r}")
            elif spec.at_most_once and job.attempts > 1:
                # an earlier run of it started and never ended (the claim's comment, queries.sql)
                outcome = Outcome.failed(job, LOST_AT_MOST_ONCE, unrun=True)
            elif job.attempts > job.max_attempts:
                # claimed again after its lease expired on the last attempt: the worker died
                outcome = Outcome.failed(job, f"attempts exhausted: attempt {job.max_attempts} was lost with "
                                              "its worker", unrun=True)
            else:
                ctx = self.make_context(run)
                # a context of another kind (``WorkerPool(context=...)``) writes its own outcome
                state: RunState | None = getattr(ctx, "_state", None)
                fn: Callable[..., Awaitable[object]] = spec.fn
                if spec.at_most_once:
                    # its claim and its start must be on disk before it runs: a run whose claim
                    # or start was lost would run again
                    await self._at_most_once_ready(run)
                # in the runner's scope (run.scope): the deadline watch or a lost claim cancels it
                try:
                    traced = tracing.job_started(job)  # its span, current while the handler runs
                    called = True
                    # inline, not a helper coroutine: this is every job's path
                    result = await (fn(ctx, job) if spec.timeout is None else self._timed(spec, ctx, job))
                    if result is not None:
                        raise PermanentError(f"the handler of {job.kind!r} returned a "
                                             f"{type(result).__name__}; a handler must return None")
                    if state is not None and state.needs_transaction:
                        # what it enqueued and wrote commits with its "done", last and fenced
                        # (LeaseLost: nothing committed, the claim is gone)
                        await state.commit()
                except Exception as exc:
                    outcome = self.store.decide(job, exc, retry=spec.retry)
                    if not isinstance(exc, JobError) or run.log is not None:
                        outcome = _with_details(outcome, exc, run)
                    if spec.at_most_once and outcome.status == "retry":
                        outcome = dataclasses.replace(outcome, status="failed", delay=0.0)  # never run twice
                finally:
                    tracing.job_ended(traced, outcome)
                    if state is not None and state.tx is not None and state.tx.opened:
                        # it raised, timed out or was cancelled: nothing it wrote may commit
                        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_SECONDS):
                            await state.tx.abandon()
                duration = trio.current_time() - run.started
                self.fetcher.measured(job.kind, duration)
                if outcome is None:
                    seconds, done = self._kind_metrics(job.kind)
                    seconds.observe(duration)
                    done.inc()
                    if log.isEnabledFor(logging.INFO):
                        log.info("job done", extra={**job_fields(run), "duration_ms": round(duration * 1000, 1)})
                    if run.state == "written":
                        # the handler's own transaction wrote its "done" (Run.complete_in)
                        claims.forget(run)
                        self.deps.doorbell.set()  # its follow-ups, or its recipient's next job, may be due
                        return
                    outcome = Outcome.done(job, None if run.log is None else run.log.lines)
                else:
                    self.deps.metrics.job_seconds.labels(job.kind).observe(duration)
        except trio.Cancelled:
            if run.scope is not None and run.scope.cancel_called and not self.scope.cancel_called:
                # a renewal or the confirmation found the claim gone (lost), or the local deadline
                # passed (renewals failed); the runner's scope takes the Cancelled
                claims.drop(run, "claim lost (another claim holds the job, or this one was never stored); "
                                 "stopped the handler" if run.lost else
                                 "lease could not be renewed; stopped the handler before its lease ran out")
            elif run.state != "written" and called and spec is not None and spec.at_most_once:
                # hard shutdown cut an at-most-once run short: whatever it did may have
                # happened, so it is not run again; failed, with its alert
                outcome = Outcome.failed(job, INTERRUPTED_AT_MOST_ONCE)
            elif run.state != "written":
                # hard shutdown: give the job back now instead of waiting for its lease
                outcome = Outcome.released(job, "interrupted by shutdown")
            raise
        finally:
            del claims.running[run.key]
            if outcome is not None:
                claims.finish(run)
                self.completer.report(run, outcome)
            self.fetcher.room_freed()

    def _kind_metrics(self, kind: str) -> tuple[Any, Any]:
        found = self._by_kind.get(kind)
        if found is None:
            metrics = self.deps.metrics
            found = self._by_kind[kind] = (metrics.job_seconds.labels(kind),
                                           metrics.job_attempts.labels(kind, "done"))
        return found

    async def _at_most_once_ready(self, run: Run) -> None:
        """Wait until ``run``'s asynchronous claim is confirmed (a claim the confirmation does
        not find cancels it here) and its start, if it was claimed ahead, is recorded."""
        await self.confirmer.wait(run)
        if run.ticket > self.completer.starts_written:
            await self.completer.wait_started(run.ticket)
        # a claim the confirmation did not find cancelled this run's scope meanwhile
        await trio.lowlevel.checkpoint_if_cancelled()

    async def _timed(self, spec: HandlerSpec, ctx: Any, job: Job) -> object:
        """Run ``spec``'s handler within its kind's timeout; past it, ``HandlerTimeout`` (counted, retried)."""
        assert spec.timeout is not None
        fn: Callable[..., Awaitable[object]] = spec.fn
        with trio.move_on_after(spec.timeout):
            return await fn(ctx, job)
        # only the timer's own cancellation gets here (an outer one propagates)
        self.deps.metrics.job_attempts.labels(job.kind, "timeout").inc()
        raise HandlerTimeout(f"timeout: the handler ran longer than {spec.timeout:g} s "
                             f"(the timeout of kind {job.kind!r})")


def _with_details(outcome: Outcome, exc: Exception, run: Run) -> Outcome:
    """``outcome`` with the run's ``ctx.log`` lines and, for an unexpected exception (not a
    ``JobError``: ``PermanentError``, ``Retry``, an HTTP status through ``ctx.check``), its
    traceback, and the innermost frame of the user's code after the error's first line (``file.py:LINE in f``)."""
    lines = run.log.lines if run.log is not None else None
    if isinstance(exc, JobError):
        return dataclasses.replace(outcome, log=lines)
    frame = user_frame(exc)
    error = outcome.error
    if frame is not None and error is not None:
        # after the first line: where lists show one line, it names the frame too
        first, newline, rest = error.partition("\n")
        error = f"{first} (at {frame}){newline}{rest}"
    return dataclasses.replace(outcome, error=error, traceback=traceback_text(exc), log=lines)
