"""``GET /metrics`` over real HTTP: Prometheus text whose numbers follow what the service does.

The text is read back with ``prometheus_client``'s own parser, so the route is held
to the format a Prometheus server reads, not to the strings this test expects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from autom.db import open_database
from autom.web import metrics_route
from autom.web.metrics_route import DatabaseGauges
from tests.support.http_app import TELEGRAM_SECRET, app_settings, make_deps, running_app
from tests.support.restartable_pg import RestartablePg, restartable_pg
from tests.support.service import (
    ALERT_CHAT,
    post_telegram,
    running_service,
    service_settings,
    telegram_update,
    wait_until,
)
from tests.support.telegram_stub import Reply

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series is not there (a counter never touched)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


async def insert_job(db: Any, kind: str, status: str = "pending", run_at: str | None = None) -> int:
    return int(await db.fetch_val(
        "insert into jobs (kind, status, run_at) values (%s, %s, coalesce(%s::timestamptz, now())) returning id",
        [kind, status, run_at],
    ))


@pytest.fixture
def no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Database gauges refreshed on every scrape (for apps created after this fixture)."""
    monkeypatch.setattr(metrics_route, "REFRESH_SECONDS", 0.0)


async def test_metrics_is_prometheus_text_and_needs_no_auth(db: Any) -> None:
    async with running_app(db) as app:
        response = await app.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        for name in ("autom_events", "autom_intake_seconds", "autom_job_duration_seconds", "autom_job_attempts",
                     "autom_alerts", "autom_workers_busy", "autom_jobs", "autom_queue_lag_seconds",
                     "autom_database_up"):
            assert name in families, name
        assert families["autom_job_duration_seconds"].type == "histogram"
        assert families["autom_events"].type == "counter"
        assert value(parse(response.text), "autom_database_up") == 1


async def test_jobs_by_status_and_kind_and_queue_lag(db: Any, no_cache: None) -> None:
    async with running_app(db) as app:
        samples = await scrape(app.client)
        assert value(samples, "autom_queue_lag_seconds") == 0
        assert not [k for k in samples if k[0] == "autom_jobs"]

        await insert_job(db, "a", run_at="2000-01-01T00:00:00Z")
        await insert_job(db, "a", "failed")
        await insert_job(db, "a", "failed")
        await insert_job(db, "b", "done")
        samples = await scrape(app.client)
        assert value(samples, "autom_jobs", status="pending", kind="a") == 1
        assert value(samples, "autom_jobs", status="failed", kind="a") == 2
        assert value(samples, "autom_jobs", status="done", kind="b") == 1
        # every status of a kind present is a series, zeros included
        assert ("autom_jobs", (("kind", "b"), ("status", "failed"))) in samples
        assert value(samples, "autom_jobs", status="failed", kind="b") == 0
        assert value(samples, "autom_queue_lag_seconds") > 20 * 365 * 86400

        await db.execute("delete from jobs where kind = 'a'")
        samples = await scrape(app.client)
        # a kind that is gone drops to zero rather than keeping its last count
        assert value(samples, "autom_jobs", status="failed", kind="a") == 0
        assert value(samples, "autom_jobs", status="pending", kind="a") == 0
        assert value(samples, "autom_jobs", status="done", kind="b") == 1
        assert value(samples, "autom_queue_lag_seconds") == 0


async def test_frequent_scrapes_do_not_query_the_database_each_time(db: Any) -> None:
    async with running_app(db) as app:
        await insert_job(db, "a")
        assert value(await scrape(app.client), "autom_jobs", status="pending", kind="a") == 1
        await insert_job(db, "a")
        # within REFRESH_SECONDS: the cached numbers
        assert value(await scrape(app.client), "autom_jobs", status="pending", kind="a") == 1


class CountingDb:
    """The real database, counting the statements sent through it."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.calls = 0

    async def fetch_all(self, *args: Any) -> Any:
        self.calls += 1
        await trio.sleep(0.01)  # let concurrent refreshes pile up on the lock
        return await self.db.fetch_all(*args)

    async def fetch_val(self, *args: Any) -> Any:
        self.calls += 1
        return await self.db.fetch_val(*args)

    async def fetch_one(self, *args: Any) -> Any:
        self.calls += 1
        return await self.db.fetch_one(*args)


async def test_refresh_is_three_queries_at_most_once_per_max_age(db: Any) -> None:
    counting = CountingDb(db)
    deps = make_deps(app_settings(), counting)
    now = [100.0]
    gauges = DatabaseGauges(deps, max_age=5.0, clock=lambda: now[0])
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(gauges.refresh)
    assert counting.calls == 3  # job counts, queue lag, alerts
    now[0] += 4.9
    await gauges.refresh()
    assert counting.calls == 3
    now[0] += 0.2
    await gauges.refresh()
    assert counting.calls == 6
    assert deps.metrics.db_up._value.get() == 1


async def test_numbers_move_when_events_arrive_and_jobs_run(
    dsn: str, db: Any, telegram_stub: Any, no_cache: None
) -> None:
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found")], chat_id=9)
    async with (
        running_service(service_settings(dsn, telegram_stub.url)) as svc,
        httpx.AsyncClient(base_url=svc.urls[0]) as client,
    ):
        before = await scrape(client)
        assert value(before, "autom_workers") == 4
        assert value(before, "autom_database_up") == 1

        assert (await post_telegram(client, telegram_update(1, 42, "/ping"))).status_code == 202
        assert (await post_telegram(client, telegram_update(2, 9, "/ping"))).status_code == 202
        assert (await post_telegram(client, telegram_update(1, 42, "/ping"))).status_code == 202  # duplicate
        assert (await post_telegram(client, telegram_update(3, 42, "/ping"), secret="nope")).status_code == 401
        await wait_until(lambda: db.fetch_val(
            "select count(*) = 2 from jobs where status in ('done', 'failed')"))
        with trio.fail_after(10):
            await telegram_stub.wait_for_calls(1, method="sendMessage", chat_id=ALERT_CHAT)

        async def alert_counted() -> Samples | None:
            samples = await scrape(client)
            return samples if value(samples, "autom_alerts_total", outcome="sent") >= 1 else None

        after = await wait_until(alert_counted)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("autom_events_total", source="telegram", outcome="accepted") == 2
    assert moved("autom_events_total", source="telegram", outcome="duplicate") == 1
    assert moved("autom_events_total", source="telegram", outcome="rejected") == 1
    assert moved("autom_intake_seconds_count", source="telegram") == 3
    assert moved("autom_job_attempts_total", kind="telegram.message", outcome="done") == 1
    assert moved("autom_job_attempts_total", kind="telegram.message", outcome="failed") == 1
    assert moved("autom_job_duration_seconds_count", kind="telegram.message") == 2
    assert moved("autom_alerts_total", outcome="sent") == 1
    assert value(after, "autom_jobs", status="done", kind="telegram.message") == 1
    assert value(after, "autom_jobs", status="failed", kind="telegram.message") == 1
    assert value(after, "autom_jobs", status="pending", kind="telegram.message") == 0
    assert value(after, "autom_workers_busy") == 0


@pytest.fixture
def pg() -> Iterator[RestartablePg]:
    """A migrated PostgreSQL of this test's own, which it may stop and start."""
    with restartable_pg() as server:
        yield server


async def test_database_down_still_answers_200_with_database_up_0(pg: RestartablePg, no_cache: None) -> None:
    async with (
        open_database(pg.dsn, min_size=1, max_size=4, pool_timeout=1.0, connect_timeout=2.0) as db,
        running_app(db) as app,
    ):
        update = {"update_id": 1, "message": {"message_id": 1, "chat": {"id": 3, "type": "private"}, "text": "hi"}}
        response = await app.client.post("/hooks/telegram", content=json.dumps(update).encode(),
                                         headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET})
        assert response.status_code == 202
        samples = await scrape(app.client)
        assert value(samples, "autom_database_up") == 1
        assert value(samples, "autom_jobs", status="pending", kind="telegram.message") == 1

        await trio.to_thread.run_sync(pg.stop)
        started = trio.current_time()
        samples = await scrape(app.client)
        assert trio.current_time() - started < 2.5
        assert value(samples, "autom_database_up") == 0
        # the process's own numbers are still there, and the last known database gauges
        assert value(samples, "autom_events_total", source="telegram", outcome="accepted") == 1
        assert value(samples, "autom_jobs", status="pending", kind="telegram.message") == 1

        await trio.to_thread.run_sync(pg.start)

        async def up_again() -> bool:
            return value(await scrape(app.client), "autom_database_up") == 1

        await wait_until(up_again, timeout=15, interval=0.2)
