"""Forward-only migrations: numbered SQL files in ``migrations/`` (``autom.migrations`` in the wheel).

All pending files are applied in one transaction under a transaction-scoped
advisory lock, so replicas starting together are safe: the second runner waits
for the first to commit, then finds nothing left to do.

Numbers need not be contiguous: "pending" is every shipped number not recorded in
``schema_migrations``, so a gap (0004 shipped before 0003) is fine, and a number
that ships later than a higher one is applied when it arrives. Migrations that may
land in either order must not depend on each other.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

import psycopg

from autom.db.queries import Q

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


def apply_pending(conn: psycopg.Connection, migrations: Sequence[Migration] | None = None) -> list[Migration]:
    """Apply what is not applied yet, on ``conn`` inside its current transaction.

    ``migrations`` defaults to ``available_migrations()``. Returns the migrations
    applied now (empty when the database was up to date).
    """
    conn.execute(Q.migrations_lock)
    conn.execute(Q.migrations_table)
    applied = {row[0] if isinstance(row, tuple) else row["version"]
               for row in conn.execute(Q.migrations_applied).fetchall()}
    done = []
    for mig in available_migrations() if migrations is None else sorted(migrations, key=lambda m: m.version):
        if mig.version in applied:
            continue
        log.info("applying migration %04d_%s", mig.version, mig.name)
        conn.execute(mig.sql.encode())  # bytes: a plain script, no placeholder parsing
        conn.execute(Q.migrations_record, {"version": mig.version, "name": mig.name})
        done.append(mig)
    return done


def apply_migrations_sync(conn: psycopg.Connection) -> list[Migration]:
    """Apply pending migrations with a plain (sync) connection, in one transaction."""
    with conn.transaction():
        return apply_pending(conn)


async def apply_migrations(db: Database) -> list[Migration]:
    """Apply pending migrations through the trio bridge (one transaction, one thread hop)."""
    return await db.run(apply_pending)
