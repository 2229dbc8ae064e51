"""The tests' throwaway databases are dropped in the background, several at a time.

Every test still gets a database of its own, fresh from the migrated template
(tests/conftest.py); only the ``drop database`` at its end moves off the test's path.
PostgreSQL 15 takes an immediate checkpoint in every ``drop database`` and waits for
it (its log says "checkpoint starting: immediate force wait" once per test), so each
test paid a checkpoint at its teardown, and every page the next test wrote first was
logged whole again after it. ``Dropper`` hands the names to a thread that drops them
in batches from parallel connections: PostgreSQL serves checkpoint requests that
arrive together with one checkpoint, so a batch costs about one, and the tests run
meanwhile. The session's end waits for the last drops; a drop that fails is raised
there.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.support.pg import PgServer


class Dropper:
    """Drops databases by name in the background: ``drop_later(name)``, then ``close()``."""

    def __init__(self, server: PgServer, *, batch: int = 8, idle_seconds: float = 2.0) -> None:
        self._server = server
        self._batch = batch
        #: a batch that has not filled up is dropped after this long without a new name
        self._idle_seconds = idle_seconds
        self._pending: list[str] = []
        self._closing = False
        self._errors: list[str] = []
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=batch, thread_name_prefix="drop-test-db")
        self._thread = threading.Thread(target=self._run, name="drop-test-dbs", daemon=True)
        self._thread.start()

    def drop_later(self, name: str) -> None:
        """Drop database ``name`` soon (disconnecting whoever is still connected to it)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the dropper is closed")
            self._pending.append(name)
            self._cond.notify_all()
            # never more than a few batches of databases left over (disk, the server's catalog)
            while len(self._pending) >= 4 * self._batch:
                self._cond.wait()

    def close(self) -> None:
        """Drop what is left and wait for it; ``RuntimeError`` naming any drop that failed."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True)
        if self._errors:
            raise RuntimeError("could not drop test databases:\n" + "\n".join(self._errors))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and len(self._pending) < self._batch:
                    before = len(self._pending)
                    self._cond.wait(timeout=self._idle_seconds)
                    if self._pending and len(self._pending) == before:
                        break  # no new name for a while: drop what there is
                if not self._pending:
                    if self._closing:
                        return
                    continue
                names, self._pending = self._pending[:self._batch], self._pending[self._batch:]
            # all at once, each on its own connection: their checkpoints are one
            for name, future in [(name, self._pool.submit(self._server.drop_database, name)) for name in names]:
                error = future.exception()
                if error is not None:
                    self._errors.append(f"{name}: {error!r}")
            with self._cond:
                self._cond.notify_all()  # room for drop_later's waiters
