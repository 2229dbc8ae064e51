"""Forward-only migrations: numbered SQL files in ``migrations/`` (``autom.migrations`` in the wheel).

Every pending number (shipped, not in ``schema_migrations``; gaps allowed) is applied in one
transaction under an advisory lock, without a statement timeout; then the user's own
(``App(migrations=DIR)``, recorded in ``user_migrations``). Each file's SHA-256 is recorded:
an applied file whose text changed stops the runner (``MigrationChanged``).
Why each rule: docs/design/db.md, "Migrations".
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psycopg

from autom.db.queries import Q
from autom.errors import MigrationChanged

if TYPE_CHECKING:
    from autom.db.bridge import Database

log = logging.getLogger("autom.migrate")

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One migration file: its number, name and SQL text."""

    version: int
    name: str
    sql: str = field(repr=False)
    #: the file of a user's migration (App(migrations=...)); None for autom's own
    path: Path | None = None

    @property
    def label(self) -> str:
        """``0004_alert_outbox``: the file name without ``.sql`` (``your 0001_orders`` for the user's)."""
        return f"{'your ' if self.path is not None else ''}{self.version:04d}_{self.name}"

    @property
    def checksum(self) -> str:
        """SHA-256 (hex) of the file's text, recorded when it is applied."""
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def available_migrations() -> list[Migration]:
    """Every migration shipped with this version of autom, in order."""
    found = []
    for entry in resources.files("autom.migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a number: {versions}")
    return found


def read_migrations(directory: str | Path) -> list[Migration]:
    """The user's migrations: every ``NNNN_name.sql`` in ``directory``, in order.

    ``ValueError`` (one line) for a missing directory, a ``.sql`` file named otherwise
    (it would be skipped silently) or two files sharing a number.
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"migrations directory {folder} does not exist")
    found = []
    for entry in sorted(folder.iterdir()):
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8"), path=entry))
        elif entry.suffix == ".sql":
            raise ValueError(f"migration file {entry} is not named NNNN_name.sql (four digits, lower-case name)")
    found.sort(key=lambda mig: mig.version)
    for first, second in itertools.pairwise(found):
        if first.version == second.version:
            raise ValueError(f"migrations {first.path} and {second.path} share the number {first.version:04d}")
    return found


#: One statement of a migration run: the query, its parameters, and whether its rows are wanted.
_Step = tuple[str | bytes, dict[str, Any] | None, bool]


def _steps(migrations: Sequence[Migration] | None,
           user: Sequence[Migration]) -> Generator[_Step, list[Any], list[Migration]]:
    """The statements of a migration run, each sent its rows back; returns the migrations applied.

    One plan, two drivers: ``apply_pending`` (a plain sync connection) and
    ``apply_migrations`` (a ``Database.transaction()``).
    """
    # for this transaction only: the migrations and the wait for another runner's lock
    yield "set local statement_timeout = 0", None, False
    yield "set local lock_timeout = 0", None, False
    locked = yield Q.migrations_try_lock, None, True
    if not _row_value(locked[0] if locked else None):
        log.info("waiting for another process that is applying migrations (advisory lock)")
        yield Q.migrations_lock, None, False
    yield Q.migrations_table, None, False
    shipped = available_migrations() if migrations is None else sorted(migrations, key=lambda m: m.version)
    done = yield from _apply(shipped, Q.migrations_applied, Q.migrations_record)
    if user:
        yield Q.user_migrations_table, None, False
        done += yield from _apply(sorted(user, key=lambda m: m.version), Q.user_migrations_applied,
                                  Q.user_migrations_record)
    return done


def _apply(shipped: Sequence[Migration], applied_query: str,
           record_query: str) -> Generator[_Step, list[Any], list[Migration]]:
    """Check the applied ones' checksums, then apply the rest of ``shipped`` in order."""
    applied = {_row(row)[0]: _row(row)[1] for row in (yield applied_query, None, True)}
    for mig in shipped:
        if mig.version not in applied:
            continue
        recorded = applied[mig.version]
        if recorded is None:  # applied before checksums were kept: trust the file from now on
            yield Q.migrations_checksum, {"version": mig.version, "checksum": mig.checksum}, False
        elif recorded != mig.checksum:
            where = f" ({mig.path})" if mig.path is not None else ""
            raise MigrationChanged(f"migration {mig.label}{where} was changed after it was applied to this "
                                   "database; restore the applied text and put the change in a new migration")
    done = []
    for mig in shipped:
        if mig.version in applied:
            continue
        log.info("applying migration %s", mig.label)
        yield mig.sql.encode(), None, False  # bytes: a plain script, no placeholder parsing
        yield record_query, {"version": mig.version, "name": mig.name, "checksum": mig.checksum}, False
        done.append(mig)
    return done


def apply_pending(conn: psycopg.Connection[Any], migrations: Sequence[Migration] | None = None,
                  user: Sequence[Migration] = ()) -> list[Migration]:
    """Apply what is not applied yet, on ``conn`` (a plain sync connection) inside its current transaction.

    ``migrations`` defaults to ``available_migrations()``; ``user`` (the App's own,
    ``read_migrations``) are applied after them and recorded apart. Returns the
    migrations applied now (empty when the database was up to date). Raises
    ``MigrationChanged`` when an applied migration's file was edited since.
    """
    steps = _steps(migrations, user)
    try:
        query, params, wanted = next(steps)
        while True:
            cursor = conn.execute(query, params)
            query, params, wanted = steps.send(cursor.fetchall() if wanted else [])
    except StopIteration as stop:
        return cast(list[Migration], stop.value)


def _row(row: Any) -> tuple[Any, Any]:
    return (row[0], row[1]) if isinstance(row, tuple) else (row["version"], row["checksum"])


def _row_value(row: Any) -> Any:
    if row is None:
        return None
    return row[0] if isinstance(row, tuple) else next(iter(row.values()))


def apply_migrations_sync(conn: psycopg.Connection[Any], user: Sequence[Migration] = ()) -> list[Migration]:
    """Apply pending migrations (autom's, then ``user``) with a plain (sync) connection, in one transaction."""
    with conn.transaction():
        return apply_pending(conn, user=user)


async def apply_migrations(db: Database, user: Sequence[Migration] = (), *,
                           migrations: Sequence[Migration] | None = None) -> list[Migration]:
    """Apply pending migrations (autom's, or ``migrations``; then ``user``) in one ``db.transaction()``.

    Returns the migrations applied now; raises ``MigrationChanged`` as ``apply_pending``
    does, and the database's errors as ``autom.db`` translates them.
    """
    async with db.transaction() as tx:
        steps = _steps(migrations, user)
        try:
            query, params, wanted = next(steps)
            while True:
                if wanted:
                    rows = await tx.fetch_all(query, params)
                else:
                    await tx.execute(query, params)
                    rows = []
                query, params, wanted = steps.send(rows)
        except StopIteration as stop:
            return cast(list[Migration], stop.value)
