"""The worker: claims jobs, runs their handlers, records how each run ended.

``WorkerPool`` (pool.py) composes the roles: ``Fetcher`` (fetcher.py) claims a little
ahead of the runners; ``Executor`` (executor.py) runs each claim, a ``Run`` (run.py);
``Claims``, ``DeadlineWatch`` and ``Confirmer`` (leases.py) keep every run inside its
lease; ``Completer`` (completer.py) is the one writer of outcomes (``Outcome``, from
autom.jobs.outcome) and renewals. ``WorkerPool(context=...)`` builds what a handler
gets from its ``Run``; such a context may end its transaction with ``run.complete_in(tx)``.
Design notes: docs/design/worker.md.
"""

from autom.jobs.outcome import Outcome
from autom.worker.completer import Completer
from autom.worker.pool import WorkerPool
from autom.worker.run import QueueStore, Run, lease_margin

__all__ = ["Completer", "Outcome", "QueueStore", "Run", "WorkerPool", "lease_margin"]
