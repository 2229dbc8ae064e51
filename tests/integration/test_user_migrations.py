"""App(migrations=DIR): the user's numbered SQL files, applied after autom's under the same
advisory lock, recorded apart (user_migrations) and checksummed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
import trio

from autom import App
from autom.app import AppError
from autom.db.bridge import open_database
from autom.db.migrate import apply_migrations, available_migrations
from autom.testing import open_testbed

WAITING = "select count(*) from pg_locks where locktype = 'advisory' and not granted"
ORDERS = "create table orders (id integer primary key);\ninsert into orders values (1);\n"


def project(tmp_path: Path) -> ModuleType:
    """A user's module ``shop`` with ``App(migrations="sql")`` and one migration, imported."""
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "0001_orders.sql").write_text(ORDERS)
    (tmp_path / "shop.py").write_text('from autom import App\n\napp = App(builtins=False, migrations="sql")\n')
    spec = importlib.util.spec_from_file_location("shop", tmp_path / "shop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def migrate(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autom", "migrate"], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


async def test_two_replicas_starting_together_apply_it_once_after_automs(empty_dsn: str, tmp_path: Path) -> None:
    app = project(tmp_path).app
    assert app.migrations == tmp_path / "sql"  # relative to the module that made the App
    user = app.user_migrations()
    results: list[list[str]] = []

    async def replica() -> None:
        async with open_database(empty_dsn, min_size=1, max_size=1) as db:
            results.append([m.label for m in await apply_migrations(db, user)])

    # hold the migrations' lock until both replicas wait for it, so they really start together
    with psycopg.connect(empty_dsn) as holder:
        holder.execute("select pg_advisory_xact_lock(hashtext('autom.migrations'))")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(replica)
            nursery.start_soon(replica)
            while rows(empty_dsn, WAITING)[0][0] < 2:
                await trio.sleep(0.02)
            holder.commit()
    automs = [m.label for m in available_migrations()]
    assert sorted(results, key=len) == [[], [*automs, "your 0001_orders"]]  # autom's first, then yours
    assert rows(empty_dsn, "select id from orders") == [(1,)]
    assert rows(empty_dsn, "select version, name from user_migrations") == [(1, "orders")]
    # recorded apart: autom's own table has no row of the user's
    assert [r[0] for r in rows(empty_dsn, "select version from schema_migrations order by version")] == [
        m.version for m in available_migrations()]


async def test_the_testbed_applies_them_and_a_changed_file_is_refused_in_one_line(dsn: str, tmp_path: Path) -> None:
    app = project(tmp_path).app
    async with open_testbed(app, database_url=dsn):
        pass
    assert rows(dsn, "select id from orders") == [(1,)]
    (tmp_path / "sql" / "0001_orders.sql").write_text(ORDERS + "insert into orders values (2);\n")
    env = {**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(tmp_path), "AUTOM_APP": "shop:app"}
    env.pop("TZ", None)
    done = await trio.to_thread.run_sync(migrate, env, tmp_path)
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"autom: migration your 0001_orders ({tmp_path / 'sql' / '0001_orders.sql'}) was changed after it was "
        "applied to this database; restore the applied text and put the change in a new migration"]
    assert rows(dsn, "select id from orders") == [(1,)]
    # a new number is the way to change it
    (tmp_path / "sql" / "0001_orders.sql").write_text(ORDERS)
    (tmp_path / "sql" / "0002_more.sql").write_text("insert into orders values (2);\n")
    done = await trio.to_thread.run_sync(migrate, env, tmp_path)
    assert (done.returncode, done.stdout) == (0, "applied your 0002_more\n"), done


def test_a_misnamed_file_or_a_missing_directory_stops_the_start(tmp_path: Path) -> None:
    app = project(tmp_path).app
    (tmp_path / "sql" / "2_extra.sql").write_text("select 1;\n")
    with pytest.raises(AppError, match=r"2_extra\.sql is not named NNNN_name\.sql"):
        app.validate()
    with pytest.raises(AppError, match="does not exist"):
        App(migrations=tmp_path / "nowhere").validate()
