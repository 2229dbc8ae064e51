"""The worker: claims jobs, runs their handlers, records how each run ended.

::

    pool.py       WorkerPool: the fetcher (fair batches, claimed a little ahead) and
                  WORKERS runners; each claim is a Run
    run.py        Run: one claim (job, lease generation), its cancel scope and its local
                  deadline (the lease end less a margin, moved only by a renewal)
    completer.py  Completer: the ONE outcome writer (done / retry / failed / released /
                  deferred, batched) that also renews every held lease between flushes

The executor/completer split follows River (``internal/jobcompleter``): runners
only report an ``Outcome``; the writer is the only task that writes the rows of
the jobs this process holds, so its statements can never deadlock each other.

Seams for handler contexts. ``WorkerPool(context=...)`` builds the object a
handler receives from its ``Run``. A context that gives handlers a transaction
(their own writes, enqueues) can make "done" commit in that same transaction:
``await run.complete_in(tx)`` as its last statement, fenced by the run's lease
generation (``LeaseLost`` when the claim is gone, so the transaction rolls back).
The runner then writes nothing more for that run; every other run's "done" goes
through the batched writer. ``run.scope`` is the cancel scope the handler runs
in (its runner's; cancelling it stops the run); ``run.deadline`` is the local lease
end on the trio clock (the pool stops the run there), for a context that wants to
show a handler how long it has.

``autom.errors.Defer(after=s)`` from a handler: the job runs again after ``s``
seconds, the attempt not counted, no error recorded, no alert.
"""

from autom.jobs.outcome import Outcome
from autom.worker.completer import Completer, QueueStore
from autom.worker.pool import WorkerPool
from autom.worker.run import Run, lease_margin

__all__ = ["Completer", "Outcome", "QueueStore", "Run", "WorkerPool", "lease_margin"]
