"""Migrations: idempotent, and safe when two runners start at once."""

from __future__ import annotations

import threading

import psycopg
import trio

from autom.db.bridge import open_database
from autom.db.migrate import Migration, apply_migrations, apply_migrations_sync, apply_pending, available_migrations


def applied_versions(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("select version from schema_migrations order by version")]


async def test_twice_in_a_row_applies_once(empty_dsn):
    async with open_database(empty_dsn, min_size=1, max_size=2) as db:
        first = await apply_migrations(db)
        second = await apply_migrations(db)
    assert [m.version for m in first] == [m.version for m in available_migrations()]
    assert second == []
    assert applied_versions(empty_dsn) == [m.version for m in available_migrations()]


def test_two_runners_at_once_end_with_one_applied_set(empty_dsn):
    results: list[object] = []
    barrier = threading.Barrier(4)

    def runner() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            barrier.wait()
            try:
                results.append(len(apply_migrations_sync(conn)))
            except Exception as exc:
                results.append(exc)

    threads = [threading.Thread(target=runner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results, key=str) == [0, 0, 0, len(available_migrations())]
    assert applied_versions(empty_dsn) == [m.version for m in available_migrations()]


async def test_migrated_schema_has_the_queue_tables(dsn):
    async with open_database(dsn, min_size=1, max_size=1) as db:
        tables = {r["table_name"] for r in await db.fetch_all(
            "select table_name from information_schema.tables where table_schema = 'public'")}
    assert {"events", "jobs", "recipients", "schema_migrations", "service_state"} <= tables
    await trio.lowlevel.checkpoint()


def test_a_gap_in_the_numbers_is_fine_and_a_late_number_is_applied_when_it_ships(empty_dsn):
    shipped = available_migrations()
    versions = [m.version for m in shipped]
    assert versions == sorted(set(versions)) and 4 in versions  # 0004_alert_outbox; no 0003 ships (the gap)
    without_3 = [m for m in shipped if m.version != 3]
    late = Migration(3, "late_arrival", "create table late_arrival (x int);")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            assert [m.version for m in apply_pending(conn, without_3)] == [m.version for m in without_3]
        # a release that ships 0003 after databases already have 0004
        with conn.transaction():
            assert apply_pending(conn, [*without_3, late]) == [late]
        with conn.transaction():
            assert apply_pending(conn, [*without_3, late]) == []
        assert conn.execute("select count(*) from late_arrival").fetchone() == (0,)
    assert applied_versions(empty_dsn) == sorted({*versions, 3})
