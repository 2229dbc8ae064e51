"""The worker pool: fetcher (claims fair batches, ahead of the handlers) → runners → the one writer.

Inside the service nursery::

    WorkerPool.run
    ├── completer      the one writer: outcomes batched, leases renewed between flushes
    ├── stop watcher   wakes the fetcher when shutdown is set
    ├── confirmer      makes the idle path's asynchronous claims durable, or stops their runs
    └── handler scope  (hard deadline at shutdown)
        ├── fetcher    keeps up to WORKERS + prefetch jobs claimed; waits on the doorbell when nothing is due
        └── WORKERS runners, each running one claimed job at a time, fed by a memory channel

Every claim becomes a ``Run`` (autom/worker/run.py): its job, its lease generation,
and its *local* deadline, the lease end less a safety margin, moved forward only
by a successful renewal. A handler never outlives its lease: when the database
cannot be reached to renew it, the handler is cancelled at that deadline and the
claim dropped (the job is someone else's now), before another claim could run it.
Each runner runs its jobs in one cancel scope of its own, kept until it stops one
of them; the deadline watch (``_watch_deadlines``) cancels a runner's scope when its
run's deadline passes, a renewal that finds the claim gone cancels it at once. In-process state is keyed by
claim ``(id, lease)``: a new claim of an id this process still holds (its lease
ran out while it waited) replaces the old one, which is dropped.

Claims run ahead of the handlers. While WORKERS handlers run, more claimed jobs
wait in the pool's queue, so the next claim's round trip overlaps the jobs in hand
instead of leaving the workers idle (bench/RESULTS.md, Worker). How many may wait
follows the pace of the kinds just claimed (each kind's runs measured on their own):
about what the workers start during two claim round trips, never more than
``prefetch`` (at most one claim batch); a slow kind, or one not measured yet, waits
one deep, so replicas share slow work. With jobs still queued, the fetcher claims
again only once half a batch of room is free, so claims stay batches. A claimed job
waiting for a runner has a ticket in the pool's start order; the writer records the
highest one started, so a claim lost before its run started gives its attempt back.

Shutdown is two-phase: ``deps.shutdown`` stops the fetcher (soft), and the claimed
jobs that no worker has started go back to pending at once; running handlers get
until ``stop_at(deadline)`` (hard), then they are cancelled and their jobs put back
to pending at once, the interrupted attempt not counted. The writer records all
of it before the pool returns (bounded).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from autom import tracing
from autom.app import Registry
from autom.bells import Doorbell
from autom.context import RunState, Services, new_context
from autom.deps import Deps
from autom.errors import JobError, PermanentError, TransientError
from autom.handlers.spec import Handler, HandlerSpec, handler_specs
from autom.jobs.models import Job
from autom.jobs.outcome import Outcome, Written
from autom.jobs.retry import describe
from autom.jobs.store import Ahead
from autom.worker.completer import CLEANUP_SECONDS, Completer, QueueStore, wall_delay
from autom.worker.run import Run, lease_margin
from autom.worker.tracebacks import traceback_text, user_frame

log = logging.getLogger("autom.worker")


#: how long the confirmation of an asynchronous claim may take before its runs are stopped
CONFIRM_SECONDS = 5.0

#: the error of an at-most-once job whose run was lost (README, Reliability)
LOST_AT_MOST_ONCE = "lost with its worker (at-most-once)"
#: the error of an at-most-once job whose run a shutdown cut short
INTERRUPTED_AT_MOST_ONCE = "interrupted by shutdown (at-most-once)"


class HandlerTimeout(TransientError):
    """A run took longer than its kind's ``timeout``: cancelled, counted, retried with backoff."""


def _average(mean: float, value: float) -> float:
    """A moving average (the first value starts it)."""
    return value if mean <= 0.0 else mean + (value - mean) * 0.05


def _context(job: Job) -> dict[str, object]:
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}


class WorkerPool:
    """``workers`` concurrent handlers fed by one fetcher; see the module docstring.

    ``batch``: most jobs per claim statement. ``prefetch``: most claimed jobs that may
    wait for a worker beyond the ``workers`` running (default: ``workers``, or more to
    fill one batch; never more than ``batch``). How many do wait adapts to the pace of
    the kinds claimed (``_adapt``): about what the workers start during two claim round
    trips, so fast kinds get whole batches and slow ones hold one job in reserve. A kind
    not measured yet counts as slow: until one of its runs has finished, one may wait.

    ``store``: the queue (default ``deps.store``; any ``QueueStore``, so the scheduling
    is tested without PostgreSQL). ``context``: builds the ``HandlerContext`` a run's
    handler gets (default: one shared context); it receives the ``Run``.
    """

    def __init__(
        self,
        deps: Deps,
        handlers: Mapping[str, HandlerSpec | Handler],
        *,
        workers: int | None = None,
        batch: int = 100,
        prefetch: int | None = None,
        poll_seconds: float = 1.0,
        store: QueueStore | None = None,
        context: Callable[[Run], Any] | None = None,
    ) -> None:
        self.deps = deps
        self.handlers = handler_specs(handlers)
        self.workers = max(1, workers or deps.settings.workers)
        self.batch = max(1, batch)
        wanted = max(self.workers, self.batch - self.workers) if prefetch is None else prefetch
        self.prefetch = max(0, min(wanted, self.batch))
        # claimed jobs that may wait now: adapts (see _adapt); until a kind's pace is known,
        # one (a slow kind's jobs are not held away from other replicas)
        self._ahead = min(self.prefetch, 1)
        self._kind_s: dict[str, float] = {}  # kind → moving average of its runs' time
        self._claim_s = 0.0  # moving average of a claim's round trip
        # the start order (migrations/0021): this pool's worker_starts row, the last ticket
        # handed out, the highest ticket started
        self._claimant: int | None = None
        self._ticket = 0
        self._started = 0
        self.poll_seconds = poll_seconds
        self.store: QueueStore = store if store is not None else deps.store
        self.lease_seconds = self.store.lease_seconds
        self._margin = lease_margin(self.lease_seconds)
        # the public HandlerContext (autom/context.py), one per run; ctx.enqueue accepts
        # the kinds this pool serves
        self.services = Services(settings=deps.settings, db=deps.db, telegram=deps.telegram, http=deps.http,
                                 registry=Registry(handlers=self.handlers, sources=deps.sources))
        self._make_context: Callable[[Run], Any] = context or (lambda run: new_context(run, self.services))
        # every claim held, by claim: queued (waiting for a runner), running, or finished
        # and waiting for the writer
        self.queued: dict[tuple[int, int], Run] = {}
        self.running: dict[tuple[int, int], Run] = {}
        self._finishing: dict[tuple[int, int], Run] = {}
        self._by_id: dict[int, Run] = {}  # the newest claim of each id held
        self._send, self._receive = trio.open_memory_channel[Run](math.inf)
        self._slots = Doorbell()  # rung when the fetcher waits for room and there is enough
        self._wants_room = False
        self._stopping = Doorbell()  # rung once shutdown is set
        self._handler_scope = trio.CancelScope()
        self._accepting = False  # the fetcher runs: claims (and the intake's hand-offs) are taken
        # the deadline watch wakes at _watch_at, no later than the earliest local deadline
        # of a run held; a new claim with an earlier one rings it
        self._watch_at = math.inf
        self._watch_bell = Doorbell()
        self._next_local_due = math.inf  # earliest retry this process scheduled (trio clock)
        self._completer = Completer(self.store, self, renew_every=self.lease_seconds / 3)
        self._confirm_bell = Doorbell()  # rung after an asynchronous (idle-path) claim
        self._confirmed_bell = Doorbell()  # rung after each round of confirmations
        self.confirmations = 0
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

    @property
    def completer(self) -> Completer:
        """The pool's one outcome writer."""
        return self._completer

    def stop_at(self, deadline: float) -> None:
        """Hard deadline (trio clock) for running handlers; what runs then is cancelled and released."""
        self._handler_scope.deadline = min(self._handler_scope.deadline, deadline)

    def cancel_now(self) -> None:
        """Cancel running handlers at once (second signal); their jobs go back to pending."""
        self._handler_scope.cancel()

    def renew_soon(self) -> None:
        """Renew the held leases now: an operator cancelled a running job (the NOTIFY 'cancel'), and the
        renewal that no longer finds its claim stops its handler."""
        self._completer.renew_soon()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Work until ``deps.shutdown`` is set and running handlers have finished (or were cancelled)."""
        self.deps.metrics.workers.set(self.workers)
        async with trio.open_nursery() as aux:
            await aux.start(self._completer.run)
            aux.start_soon(self._watch_shutdown)
            aux.start_soon(self._watch_deadlines)
            aux.start_soon(self._confirm_loop)
            with self._handler_scope:
                async with trio.open_nursery() as runners:
                    for _ in range(self.workers):
                        runners.start_soon(self._runner)
                    task_status.started()
                    self._accepting = True
                    try:
                        await self._fetch_loop()
                    finally:
                        self._accepting = False
                        self._give_back_queued()
                    if self.running:
                        log.info("draining: waiting for %d running jobs", len(self.running))
            await self._completer.drain()
            aux.cancel_scope.cancel()
        log.info("worker pool stopped")

    async def _watch_shutdown(self) -> None:
        await self.deps.shutdown.wait_value(True)
        # wake the fetcher wherever it waits
        self._stopping.set()
        self._slots.set()
        self.deps.doorbell.set()

    async def _watch_deadlines(self) -> None:
        """Cancel each running run at its local deadline (its runner's scope; ``_run_job`` drops
        the claim). Asleep until the earliest deadline of a run held, or until a claim with
        an earlier one rings it: with runs held it wakes about once a lease, not once a job."""
        bell = self._watch_bell
        while True:
            seen = bell.count
            now = trio.current_time()
            earliest = math.inf
            for run in self.running.values():
                scope = run.scope
                if scope is None or scope.cancel_called:
                    continue
                if run.deadline <= now:
                    scope.cancel()
                elif run.deadline < earliest:
                    earliest = run.deadline
            for run in self.queued.values():
                # one past its deadline is dropped when a runner takes it
                if now < run.deadline < earliest:
                    earliest = run.deadline
            self._watch_at = earliest
            with trio.move_on_at(earliest):
                await bell.wait_after(seen)

    # -- fetching ------------------------------------------------------------------

    def _room(self) -> int:
        return self.capacity - len(self.running) - len(self.queued)

    def _may_claim(self) -> bool:
        """Whether there is room for a claim: with claimed jobs still waiting for a worker,
        only once half a batch is free, so claims stay batches."""
        room = self._room()
        return room > 0 and (not self.queued or room >= max(1, min(self.batch, self.capacity) // 2))

    async def _fetch_loop(self) -> None:
        backoff = 0.5
        shutdown = self.deps.shutdown
        doorbell = self.deps.doorbell
        idle = False  # the last claim came back short: nothing more was due then
        sweep_at = -math.inf  # when the fetcher may next sweep (store.retire_idle)
        while not shutdown.value:
            if not self._may_claim():
                seen = self._slots.count
                self._wants_room = True
                try:
                    await self._slots.wait_after(seen)
                finally:
                    self._wants_room = False
                continue
            # Woken with nothing in hand (a NOTIFY, the poll, a retry due): most often one
            # job is due, and a claim of two is prepared (JobStore.claim): one job comes
            # back, and the fetcher sleeps again; two, and the next round claims a batch.
            # That claim commits asynchronously, and is confirmed while its handlers start
            # (_confirm_loop); a batch claim commits durably
            fast = idle and not self.queued
            want = min(self._room(), 2 if fast else self.batch)
            seen = doorbell.count
            started = trio.current_time()
            # the first jobs of the claim go to idle runners at once; the rest wait, ahead
            ahead = Ahead(self._claimant, self._ticket,
                          max(0, self.workers - len(self.running) - len(self.queued)))
            try:
                if self._claimant is None:
                    self._claimant = ahead.claimant = await self.store.register_claimant()
                jobs = await self.store.claim(want, durable=not fast, ahead=ahead)
            except Exception as exc:  # database down or a statement error: back off, never die
                log.warning("claim failed, retrying in %.1fs: %s", backoff, describe(exc))
                with trio.move_on_after(backoff):
                    await self._stopping.wait_after(self._stopping.count)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            self._claim_s = _average(self._claim_s, trio.current_time() - started)
            self._adapt(jobs)
            # the database set each lease at (or after) the moment the claim was sent
            deadline = started + self.lease_seconds - self._margin
            tickets = ahead.tickets if len(ahead.tickets) == len(jobs) else [0] * len(jobs)
            for job, ticket in zip(jobs, tickets, strict=True):
                self._hold(Run(job, deadline, self.store, confirmed=not fast, ticket=ticket))
            if tickets and tickets[-1] > self._ticket:
                self._ticket = tickets[-1]
            if fast and jobs:
                self._confirm_bell.set()
            idle = len(jobs) < want
            if idle:
                if trio.current_time() >= sweep_at:
                    # the recipients with nothing due that their last completion could not
                    # retire (rare): off the claim's path, at most once per poll
                    sweep_at = trio.current_time() + self.poll_seconds
                    await self._sweep()
                # nothing more is due now: sleep until rung, polled, or a local retry is due
                timeout = min(self.poll_seconds, max(0.0, self._next_local_due - trio.current_time()))
                with trio.move_on_after(timeout):
                    await doorbell.wait_after(seen)
                # forgotten only once it came: a ring before it (due_in's own) must not lose it
                if self._next_local_due <= trio.current_time():
                    self._next_local_due = math.inf

    async def _confirm_loop(self) -> None:
        """Confirm the asynchronous claims (``store.confirm``), one statement at a time for
        all of them; stop the runs of those it does not find, or cannot confirm.

        A claim committed asynchronously is lost if the server crashes before its WAL is
        flushed, and the job is then claimed again after the restart. Its run here must
        have stopped by then: a claim the confirmation does not find is dropped (as any
        lost claim), and when the confirmation fails (the server went away, or did not
        answer within ``CONFIRM_SECONDS``) its runs are stopped at once, since whether
        their claims reached the disk is unknown; their jobs run again when their leases
        run out. Sent while the handlers start: their start does not wait for the flush.
        """
        seen = self._confirm_bell.count
        while True:
            await self._confirm_bell.wait_after(seen)
            seen = self._confirm_bell.count
            # the runners first: the claim's handlers start before this statement is sent
            await trio.lowlevel.cancel_shielded_checkpoint()
            runs = []
            for run in self.held_runs():
                if not run.confirmed:
                    # a run that has ended already needs none: its outcome is fenced, and
                    # nothing of it can go on beside a later claim's run
                    run.confirmed = run.state not in ("queued", "running")
                    if not run.confirmed:
                        runs.append(run)
            if not runs:
                continue
            try:
                with trio.fail_after(CONFIRM_SECONDS):
                    held = await self.store.confirm([r.job for r in runs])
            except Exception as exc:  # trio.TooSlowError included
                log.warning("could not confirm %d claims; stopped their runs (the claims may have been "
                            "lost with the database, the jobs run again when their leases run out): %s",
                            len(runs), describe(exc))
                held = set()
            self.confirmations += 1
            self._confirmed_bell.set()
            for run in runs:
                run.confirmed = True  # confirmed, or stopped below: either way, done with
                if run.job.id not in held:
                    self.lost(run)

    async def _sweep(self) -> None:
        try:
            await self.store.retire_idle(self.batch)
        except Exception as exc:  # the next sweep tries again; claims do not depend on it
            log.warning("retiring idle recipients failed: %s", describe(exc))

    def _hold(self, run: Run) -> None:
        """Take a new claim into the pool; an older claim of the same id is dropped."""
        older = self._by_id.get(run.job.id)
        if older is not None:
            # its lease ran out (this process missed it) and the job was claimed again,
            # by us: the old claim must neither run on nor be written
            self.lost(older)
        self._by_id[run.job.id] = run
        self.queued[run.key] = run
        self._send.send_nowait(run)
        if run.deadline < self._watch_at:
            self._watch_at = run.deadline
            self._watch_bell.set()

    def _adapt(self, jobs: list[Job]) -> None:
        """Set how many claimed jobs may wait: what the workers start during two claim round
        trips (at least 1, at most ``prefetch``), at the pace of the kinds of ``jobs`` (the
        claim just made: what is due now), each kind at its own recent pace; a kind not
        measured yet adds nothing (slow until one of its runs finished)."""
        if not jobs or not self.prefetch:
            return
        kind_s = self._kind_s
        rate = 0.0  # runs a second of one worker, averaged over the jobs
        for job in jobs:
            seconds = kind_s.get(job.kind)
            if seconds is not None:
                rate += 1.0 / max(seconds, 1e-6)
        pace = self.workers * rate / len(jobs)  # jobs/s the workers can start
        self._ahead = max(1, min(self.prefetch, math.ceil(pace * self._claim_s * 2)))

    def _give_back_queued(self) -> None:
        """Shutdown: the claimed jobs no runner has started go back to pending (the writer
        records it at once; the pool waits for it before it returns)."""
        self._send.close()  # the runners finish what they run, then find the channel closed
        runs = list(self.queued.values())
        self.queued.clear()  # a runner skips a run that is no longer queued
        for run in runs:
            run.state = "finishing"
            self._finishing[run.key] = run
            self._completer.report(run, Outcome.released(run.job))
        if runs:
            log.info("giving back %d claimed jobs not started before shutdown", len(runs))

    # -- the intake's hand-off (autom.events.HandOff) ------------------------------------

    def ready(self) -> bool:
        """Whether the intake of this process may store a job claimed for this pool: the pool
        runs and is not stopping, a runner is free and no claimed job waits for one."""
        return (self._accepting and not self.deps.shutdown.value and not self.queued
                and len(self.running) < self.workers)

    def take(self, job: Job, sent_at: float) -> bool:
        """Hold ``job``, which the intake stored claimed by this process in a statement sent at
        ``sent_at`` (trio clock): a ``Run`` like a claim's, queued for a runner. False once the
        pool no longer takes claims (shutdown): the intake then gives it back."""
        if not self._accepting or self.deps.shutdown.value:
            return False
        # committed durably with its delivery: nothing for the confirmer to do
        self._hold(Run(job, sent_at + self.lease_seconds - self._margin, self.store, confirmed=True))
        return True

    async def give_back(self, job: Job) -> None:
        """Put a claimed job no runner started back to pending at once, the attempt not counted
        (as ``_give_back_queued`` does at shutdown): reported to the writer, which writes it
        with its next flush, or now when the pool is not running."""
        run = Run(job, trio.current_time() + self.lease_seconds - self._margin, self.store)
        run.state = "finishing"
        await self._completer.hand_in(run, Outcome.released(job))

    # -- running ---------------------------------------------------------------------

    async def _runner(self) -> None:
        receive = self._receive
        while True:
            # one scope for every run of this runner until it stops one of them (a scope per
            # run cost ~5 µs a job: autom/worker/run.py)
            with trio.CancelScope() as scope:
                async for run in receive:
                    if self.queued.pop(run.key, None) is None:
                        continue  # given back at shutdown, or its claim was lost while it waited
                    if run.expired():
                        # its local deadline passed while it waited (renewals failed): not ours to start
                        self._drop(run, "lease could not be renewed before the job started; dropped it")
                        continue
                    run.scope = scope
                    await self._run_job(run)
                return  # the channel is closed: shutdown
            # the scope was cancelled to stop one of its runs (``_run_job`` dropped it): a new one

    def _kind_metrics(self, kind: str) -> tuple[Any, Any]:
        found = self._by_kind.get(kind)
        if found is None:
            metrics = self.deps.metrics
            found = self._by_kind[kind] = (metrics.job_seconds.labels(kind),
                                           metrics.job_attempts.labels(kind, "done"))
        return found

    async def _run_job(self, run: Run) -> None:
        job = run.job
        run.state = "running"
        self.running[run.key] = run
        run.started = trio.current_time()
        if run.ticket > self._started and self._claimant is not None:
            # its run starts: the writer records it (the claim's attempt then stays counted
            # if the lease is lost)
            self._started = run.ticket
            self._completer.started(self._claimant, run.ticket)
        outcome: Outcome | None = None
        spec = self.handlers.get(job.kind)
        called = False  # the handler was called (an at-most-once run cut short fails)
        try:
            if spec is None:
                # counted: the alert says "failed after 1 attempt", as for any run that failed at once
                outcome = self._failed(run, f"no handler for kind {job.kind!r}")
            elif spec.at_most_once and job.attempts > 1:
                # an earlier run of it started and never ended (the claim's comment, queries.sql)
                outcome = self._failed(run, LOST_AT_MOST_ONCE, unrun=True)
            elif job.attempts > job.max_attempts:
                # claimed again after its lease expired on the last attempt: the worker died
                outcome = self._failed(run, f"attempts exhausted: attempt {job.max_attempts} was lost with "
                                            "its worker", unrun=True)
            else:
                ctx = self._make_context(run)
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
                self._kind_s[job.kind] = _average(self._kind_s.get(job.kind, 0.0), duration)
                if outcome is None:
                    seconds, done = self._kind_metrics(job.kind)
                    seconds.observe(duration)
                    done.inc()
                    if log.isEnabledFor(logging.INFO):
                        log.info("job done", extra={**_context(job), "duration_ms": round(duration * 1000, 1)})
                    if run.state == "written":
                        # the handler's own transaction marked it done (Run.complete_in)
                        self._forget(run)
                        self.deps.doorbell.set()  # its follow-ups, or its recipient's next job, may be due
                        return
                    outcome = Outcome.done(job, None if run.log is None else run.log.lines)
                else:
                    self.deps.metrics.job_seconds.labels(job.kind).observe(duration)
        except trio.Cancelled:
            if run.scope is not None and run.scope.cancel_called and not self._handler_scope.cancel_called:
                # a renewal or the confirmation found the claim gone (lost), or the local deadline
                # passed (renewals failed); the runner's scope takes the Cancelled
                self._drop(run, "claim lost (another claim holds the job, or this one was never stored); "
                                "stopped the handler" if run.lost else
                                "lease could not be renewed; stopped the handler before its lease ran out")
            elif run.state != "written" and called and spec is not None and spec.at_most_once:
                # hard shutdown cut an at-most-once run short: whatever it did may have
                # happened, so it is not run again; failed, with its alert
                outcome = self._failed(run, INTERRUPTED_AT_MOST_ONCE)
            elif run.state != "written":
                # hard shutdown: give the job back now instead of waiting for its lease
                outcome = Outcome.released(job, "interrupted by shutdown")
            raise
        finally:
            del self.running[run.key]
            if outcome is not None:
                run.state = "finishing"
                self._finishing[run.key] = run
                self._completer.report(run, outcome)
            if self._wants_room and self._may_claim():
                self._slots.set()

    async def _at_most_once_ready(self, run: Run) -> None:
        """Wait until ``run``'s asynchronous claim is confirmed (a claim the confirmation does
        not find cancels it here) and its start, if it was claimed ahead, is recorded."""
        while True:
            seen = self._confirmed_bell.count
            if run.confirmed:
                break
            await self._confirmed_bell.wait_after(seen)
        if run.ticket > self._completer.starts_written:
            await self._completer.wait_started(run.ticket)
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

    async def run_claimed(self, job: Job, claimed_at: float) -> None:
        """Run one job this process claimed (the claim sent at ``claimed_at``, trio clock) outside
        ``run()``, and record its outcome (autom.testing): the same path as a runner's."""
        run = Run(job, claimed_at + self.lease_seconds - self._margin, self.store)
        self._by_id[job.id] = run
        # no deadline watch here (and no renewals): the run's own scope ends at its deadline
        with trio.CancelScope(deadline=run.deadline) as run.scope:
            await self._run_job(run)
        await self._completer.drain()

    def _failed(self, run: Run, error: str, *, unrun: bool = False) -> Outcome:
        return Outcome.failed(run.job, error, unrun=unrun)

    # -- the writer's hooks (completer.Hooks) ------------------------------------------

    def held_runs(self) -> list[Run]:
        """Every claim held now: queued, running, finished and not yet written."""
        return [*self.queued.values(), *self.running.values(), *self._finishing.values()]

    def renewed(self, run: Run, started: float) -> None:
        """A renewal sent at ``started`` extended ``run``'s lease: move its local deadline."""
        run.extend(started + self.lease_seconds - self._margin)

    def lost(self, run: Run) -> None:
        """``run``'s claim is gone: a queued run is dropped, a running one cancelled."""
        if run.state == "queued" and self.queued.pop(run.key, None) is not None:
            self._drop(run, "lease lost before the job started; dropped it")
        elif run.state == "running" and run.scope is not None:
            run.lost = True
            run.scope.cancel()  # _run_job drops it
        elif run.state == "finishing":
            run.lost = True  # its write is fenced and will match nothing

    def _drop(self, run: Run, why: str) -> None:
        log.warning(why, extra=_context(run.job))
        self.deps.metrics.job_attempts.labels(run.job.kind, "lease_lost").inc()
        run.state = "lost"
        run.lost = True
        self._forget(run)

    def _forget(self, run: Run) -> None:
        self._finishing.pop(run.key, None)
        if self._by_id.get(run.job.id) is run:
            del self._by_id[run.job.id]

    def written(self, run: Run, outcome: Outcome, result: Written | None) -> None:
        """Log and count ``run``'s outcome, now recorded (``result`` None: the claim was lost)."""
        status = outcome.status
        self._forget(run)
        run.state = "written"
        if status == "done" and result is not None:
            return  # the common case: nothing more to say
        job = run.job
        context = _context(job)
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
        self.deps.metrics.job_attempts.labels(job.kind, status).inc()
        if outcome.traceback is not None:
            context["traceback"] = outcome.traceback  # a field of the JSON line
        if status == "failed":
            log.error("job failed for good: %s", error, extra=context)
            # the failure recorded its alert (the outbox, autom/alerts.py): wake the sender
            self.deps.alert_bell.ring(job.id)
        elif status == "cancelled":
            log.info("job cancelled: %s", error, extra=context)  # no alert: nobody is to be told
        elif status == "released":
            log.warning("job interrupted by shutdown; put back to pending", extra=context)
        else:
            delay = wall_delay(result.run_at)
            self._next_local_due = min(self._next_local_due, trio.current_time() + delay)
            if status == "retry":
                log.warning("job failed, retrying in %.1fs: %s", delay, error,
                            extra={**context, "delay_s": round(delay, 3)})
            else:  # a send limiter's wait is counted and logged by the limiter (Defer.quiet)
                log.log(logging.DEBUG if outcome.quiet else logging.INFO, "job deferred for %.1fs: %s", delay, error,
                        extra={**context, "delay_s": round(delay, 3)})

    def due_in(self, delay: float) -> None:
        """A job becomes due in ``delay`` seconds (the send limiter moved a chat's next job to the
        chat's next slot): the fetcher looks for work then, not at its next poll."""
        due = trio.current_time() + max(0.0, delay)
        if due < self._next_local_due:
            self._next_local_due = due
            self.deps.doorbell.set()  # the fetcher, asleep until its poll, recomputes its sleep

    def dropped(self, run: Run, outcome: Outcome) -> None:
        """The writer gave up on ``run``'s ``outcome`` (the database refuses it): forget the run;
        its lease runs out and the job is claimed again."""
        run.state = "lost"
        run.lost = True
        self._forget(run)

    def flushed(self, freed: bool) -> None:
        """A flush freed a recipient whose next job may be due: the fetcher may claim it now."""
        if freed:
            self.deps.doorbell.set()


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
