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


async def test_the_users_statement_timeout_in_database_url_wins_over_the_default(dsn):
    """open_database sets statement_timeout=30 s as a backstop; options a user put in
    DATABASE_URL come after it, so they win."""
    with_options = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=123")
    async with open_database(with_options, min_size=1, max_size=1) as db:
        assert await db.fetch_val("show statement_timeout") == "123ms"
    async with open_database(dsn, min_size=1, max_size=1) as db:
        assert await db.fetch_val("show statement_timeout") == "30s"


async def test_migrations_run_without_the_statement_timeout_and_a_second_runner_waits_saying_so(
    empty_dsn, caplog,
):
    """A migration may take longer than the bridge's statement_timeout (an index build
    on a big table); a runner that finds another one migrating waits for it, in one log
    line, instead of failing when its statement times out."""
    import logging

    slow = Migration(9001, "slow", "select pg_sleep(1.5);")
    done: list[object] = []
    locked, release = trio.Event(), trio.Event()
    async with open_database(empty_dsn, min_size=1, max_size=2, statement_timeout=1.0) as db:
        await apply_migrations(db)

        async def other_runner() -> None:
            async with db.transaction() as tx:
                await tx.fetch_val("select pg_advisory_xact_lock(hashtext('autom.migrations'))")
                locked.set()
                await release.wait()

        async def second() -> None:
            done.append(await apply_migrations(db, migrations=[slow]))

        caplog.set_level(logging.INFO, logger="autom.migrate")
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(other_runner)
                await locked.wait()
                nursery.start_soon(second)
                while not any("waiting" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.05)
                await trio.sleep(1.2)  # the lock is held past the 1 s statement timeout ...
                assert done == []  # ... and the second runner still waits, it did not fail
                release.set()
    # the other runner's transaction ended: the second went on, and its 1.5 s statement ran
    assert [m.version for m in done[0]] == [9001]  # type: ignore[attr-defined]
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waits) == 1, waits


def test_a_changed_applied_migration_stops_the_runner_naming_it(empty_dsn):
    from autom.errors import MigrationChanged

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        apply_migrations_sync(conn)
        shipped = available_migrations()
        edited = [m if m.version != 4 else Migration(4, m.name, m.sql + "\n-- edited\n") for m in shipped]
        try:
            with conn.transaction():
                apply_pending(conn, edited)
        except MigrationChanged as exc:
            message = str(exc)
        else:
            raise AssertionError("an edited migration that was applied must stop the runner")
    assert "0004_alert_outbox" in message and "\n" not in message
    # the shipped files themselves match what was applied
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert apply_migrations_sync(conn) == []


def test_the_kind_and_status_statistics_are_built_by_the_migration_on_a_table_with_jobs(empty_dsn):
    shipped = available_migrations()
    before = [m for m in shipped if m.version < 32]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            apply_pending(conn, before)
        conn.execute("insert into jobs (kind, status) select 'k' || g % 3, 'done' from generate_series(1, 3000) g")
        stats = "select most_common_vals is not null from pg_stats_ext where statistics_name = 'jobs_kind_status_mcv'"
        assert conn.execute(stats).fetchall() == []  # declared by 0031, not built: no ANALYZE since
        with conn.transaction():
            assert 32 in [m.version for m in apply_pending(conn, shipped)]
        assert conn.execute(stats).fetchall() == [(True,)]
