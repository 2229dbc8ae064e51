"""Fixtures shared by every test: a real PostgreSQL, a clean database per test.

Session-scoped setup is synchronous (pytest-trio allows trio fixtures only per
function); see tests/support/pg.py for where the server comes from. A test's
database is created at its start and dropped in the background after its end
(tests/support/dropper.py says why).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from tests.support.dropper import Dropper
from tests.support.fixtures_telegram import telegram_stub  # noqa: F401  (a fixture for every test)
from tests.support.pg import PgServer, start_pg_server, unique_db_name
from tests.support.tls import share_default_tls_context

share_default_tls_context()  # every httpx client here speaks plain HTTP: tests/support/tls.py


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``-n 2``): each file's tests in one process, the files in their order.

    A module fixture then starts once (the soak, the browser), and the e2e files, which wait
    the most, start first (xdist would otherwise send the files with the most tests first).
    """
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The PostgreSQL server of this test session."""
    server = start_pg_server()
    yield server
    server.close()


@pytest.fixture(scope="session")
def dropper(pg_server: PgServer) -> Iterator[Dropper]:
    """Drops the tests' databases after them, in batches (the session's end waits for the last)."""
    dropper = Dropper(pg_server)
    yield dropper
    dropper.close()


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
def dsn(pg_server: PgServer, template_db: str, dropper: Dropper) -> Iterator[str]:
    """A clean, migrated database for this test only."""
    name = unique_db_name("t")
    yield pg_server.create_database(name, template=template_db)
    dropper.drop_later(name)


@pytest.fixture
def empty_dsn(pg_server: PgServer, dropper: Dropper) -> Iterator[str]:
    """A clean database with no migrations applied."""
    name = unique_db_name("e")
    yield pg_server.create_database(name)
    dropper.drop_later(name)


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[object]:
    """The trio bridge opened on this test's database."""
    from autom.db import open_database

    async with open_database(dsn, min_size=2, max_size=8) as database:
        yield database
