"""Fixtures shared by every test: a real PostgreSQL, a clean database per test.

Session-scoped setup is synchronous (pytest-trio allows trio fixtures only per
function); see tests/support/pg.py for where the server comes from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from tests.support.fixtures_telegram import telegram_stub  # noqa: F401  (a fixture for every test)
from tests.support.pg import PgServer, start_pg_server, temporary_database, unique_db_name


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The PostgreSQL server of this test session."""
    server = start_pg_server()
    yield server
    server.close()


@pytest.fixture(scope="session")
def template_db(pg_server: PgServer) -> Iterator[str]:
    """Name of a database with every migration applied, copied for each test."""
    from autom.db.migrate import apply_migrations_sync

    name = unique_db_name("tmpl")
    dsn = pg_server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        apply_migrations_sync(conn)
    yield name
    pg_server.drop_database(name)


@pytest.fixture
def dsn(pg_server: PgServer, template_db: str) -> Iterator[str]:
    """A clean, migrated database for this test only."""
    with temporary_database(pg_server, template=template_db) as dsn:
        yield dsn


@pytest.fixture
def empty_dsn(pg_server: PgServer) -> Iterator[str]:
    """A clean database with no migrations applied."""
    with temporary_database(pg_server, prefix="e") as dsn:
        yield dsn


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[object]:
    """The trio bridge opened on this test's database."""
    from autom.db import open_database

    async with open_database(dsn, min_size=2, max_size=8) as database:
        yield database
