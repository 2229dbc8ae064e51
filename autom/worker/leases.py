"""The claims a worker pool holds, and what keeps every run inside its lease.

``Claims``: each claim held, keyed ``(id, lease)``: queued for a runner, running, or
finished and waiting for the writer; a new claim of an id still held replaces the old.
``DeadlineWatch`` cancels a running run at its local deadline (``Run.deadline``), so a
handler never outlives its lease. ``Confirmer`` makes the idle path's asynchronous
claims durable, or stops their runs. Renewals are the writer's (completer.py).
Design notes: docs/design/worker.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from autom.bells import Doorbell
from autom.jobs.retry import describe
from autom.worker.run import Run

if TYPE_CHECKING:
    from autom.worker.run import QueueStore

log = logging.getLogger("autom.worker")

#: how long the confirmation of an asynchronous claim may take before its runs are stopped
CONFIRM_SECONDS = 5.0

Key = tuple[int, int]


def job_fields(run: Run) -> dict[str, object]:
    """The log fields of ``run``'s job."""
    job = run.job
    return {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}


class DeadlineWatch:
    """Cancels each running run at its local deadline: asleep until the earliest deadline of
    a run held, or until a claim with an earlier one arrives (``watch``)."""

    def __init__(self) -> None:
        self._at = math.inf
        self._bell = Doorbell()

    def watch(self, run: Run) -> None:
        """``run`` is held now: wake earlier if its deadline comes first."""
        if run.deadline < self._at:
            self._at = run.deadline
            self._bell.set()

    async def run(self, claims: Claims) -> None:
        """Forever: cancel the scope of each running run whose deadline passed (its runner then
        drops the claim). With runs held it wakes about once a lease, not once a job."""
        bell = self._bell
        while True:
            seen = bell.count
            now = trio.current_time()
            earliest = math.inf
            for run in claims.running.values():
                scope = run.scope
                if scope is None or scope.cancel_called:
                    continue
                if run.deadline <= now:
                    scope.cancel()
                elif run.deadline < earliest:
                    earliest = run.deadline
            for run in claims.queued.values():
                # one past its deadline is dropped when a runner takes it
                if now < run.deadline < earliest:
                    earliest = run.deadline
            self._at = earliest
            with trio.move_on_at(earliest):
                await bell.wait_after(seen)


class Claims:
    """Every claim the pool holds; runners take the queued ones from ``receive`` in order."""

    def __init__(self, metrics: Any, watch: DeadlineWatch) -> None:
        self.queued: dict[Key, Run] = {}
        self.running: dict[Key, Run] = {}
        self.finishing: dict[Key, Run] = {}
        self._by_id: dict[int, Run] = {}  # the newest claim of each id held
        self._send, self.receive = trio.open_memory_channel[Run](math.inf)
        self._metrics = metrics
        self._watch = watch

    def held(self) -> list[Run]:
        """Every claim held now: queued, running, finished and not yet written."""
        return [*self.queued.values(), *self.running.values(), *self.finishing.values()]

    def hold(self, run: Run) -> None:
        """Take a new claim, queued for a runner; an older claim of the same id is lost (its
        lease ran out unnoticed and the job was claimed again: it must neither run nor be written)."""
        self.track(run)
        self.queued[run.key] = run
        self._send.send_nowait(run)
        self._watch.watch(run)

    def track(self, run: Run) -> None:
        """Know ``run`` as the newest claim of its id (``hold`` without the queue)."""
        older = self._by_id.get(run.job.id)
        if older is not None:
            self.lost(older)
        self._by_id[run.job.id] = run

    def finish(self, run: Run) -> None:
        """``run`` ended and its outcome goes to the writer."""
        run.state = "finishing"
        self.finishing[run.key] = run

    def lost(self, run: Run) -> None:
        """``run``'s claim is gone: a queued run is dropped, a running one cancelled (its runner
        drops it), a finishing one marked (its write is fenced and will match nothing)."""
        if run.state == "queued" and self.queued.pop(run.key, None) is not None:
            self.drop(run, "lease lost before the job started; dropped it")
        elif run.state == "running" and run.scope is not None:
            run.lost = True
            run.scope.cancel()
        elif run.state == "finishing":
            run.lost = True

    def drop(self, run: Run, why: str) -> None:
        """Give up ``run``'s claim (logged with ``why``, counted as ``lease_lost``)."""
        log.warning(why, extra=job_fields(run))
        self._metrics.job_attempts.labels(run.job.kind, "lease_lost").inc()
        run.state = "lost"
        run.lost = True
        self.forget(run)

    def forget(self, run: Run) -> None:
        """``run`` holds nothing more (its outcome was written, or it was dropped)."""
        self.finishing.pop(run.key, None)
        if self._by_id.get(run.job.id) is run:
            del self._by_id[run.job.id]

    def close(self) -> list[Run]:
        """Shutdown: no more runs for the runners; the queued ones, taken out of the queue."""
        self._send.close()  # the runners finish what they run, then find the channel closed
        runs = list(self.queued.values())
        self.queued.clear()  # a runner skips a run that is no longer queued
        return runs


class Confirmer:
    """Confirms the asynchronous claims (``store.confirm``), one statement for all of those
    waiting; stops the runs of those it does not find, or cannot confirm.

    A claim committed asynchronously is lost if the server crashes before its WAL is
    flushed, and its job is claimed again after the restart; its run here must have
    stopped by then. When the confirmation fails (the server went away, or did not answer
    within ``CONFIRM_SECONDS``) its runs are stopped at once, since whether their claims
    reached the disk is unknown. Sent while the handlers start: their start does not wait.
    """

    def __init__(self, store: QueueStore, held: Callable[[], list[Run]], lost: Callable[[Run], None]) -> None:
        self._store = store
        self._held = held
        self._lost = lost
        self._bell = Doorbell()  # rung after an asynchronous claim
        self._confirmed = Doorbell()  # rung after each round of confirmations
        #: rounds of confirmation done
        self.confirmations = 0

    def ring(self) -> None:
        """An asynchronous claim was made: confirm it soon."""
        self._bell.set()

    async def wait(self, run: Run) -> None:
        """Wait until ``run``'s claim is confirmed (or found lost, which cancels its scope)."""
        while True:
            seen = self._confirmed.count
            if run.confirmed:
                return
            await self._confirmed.wait_after(seen)

    async def run(self) -> None:
        """Forever: confirm what each ring brought."""
        seen = self._bell.count
        while True:
            await self._bell.wait_after(seen)
            seen = self._bell.count
            # the runners first: the claim's handlers start before this statement is sent
            await trio.lowlevel.cancel_shielded_checkpoint()
            runs = []
            for run in self._held():
                if not run.confirmed:
                    # a run that has ended needs none: its outcome is fenced, and nothing
                    # of it can go on beside a later claim's run
                    run.confirmed = run.state not in ("queued", "running")
                    if not run.confirmed:
                        runs.append(run)
            if runs:
                await self._confirm(runs)

    async def _confirm(self, runs: list[Run]) -> None:
        try:
            with trio.fail_after(CONFIRM_SECONDS):
                held = await self._store.confirm([r.job for r in runs])
        except Exception as exc:  # trio.TooSlowError included
            log.warning("could not confirm %d claims; stopped their runs (the claims may have been "
                        "lost with the database, the jobs run again when their leases run out): %s",
                        len(runs), describe(exc))
            held = set()
        self.confirmations += 1
        self._confirmed.set()
        for run in runs:
            run.confirmed = True  # confirmed, or stopped below: either way, done with
            if run.job.id not in held:
                self._lost(run)
