"""Job.received_at: when the job's event arrived, on every road a job reaches a handler by
(the claim, the intake's hand-off); None for a job without an event."""

from __future__ import annotations

from typing import Any

from autom.events import StoreBatcher
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from tests.integration.test_intake_handoff import Taker, delivery
from tests.support.queue import claim_one


async def received_at(db: Any, event_id: int) -> Any:
    return await db.fetch_val("select received_at from events where id = %(e)s", {"e": event_id})


async def test_a_claimed_job_has_its_events_arrival_and_one_without_an_event_none(db: Any) -> None:
    store = JobStore(db)
    stored = await StoreBatcher(db).deliver(delivery(1, NewJob("k", recipient="c1")))
    assert stored.event_id is not None and stored.jobs == 1
    await store.enqueue(NewJob("k", recipient="c2"))
    claimed = [await claim_one(store), await claim_one(store)]
    by_event = {job.event_id: job for job in claimed if job is not None}
    assert set(by_event) == {stored.event_id, None}
    assert by_event[stored.event_id].received_at == await received_at(db, stored.event_id)
    assert by_event[stored.event_id].received_at is not None
    assert by_event[None].received_at is None


async def test_a_handed_off_job_has_its_events_arrival(db: Any) -> None:
    store = JobStore(db)
    taker = Taker(store)
    stored = await StoreBatcher(db, handoff=taker).deliver(delivery(1, NewJob("k", recipient="c1")))
    assert stored.event_id is not None and stored.handed == 1
    [(job, _sent)] = taker.taken
    assert job.received_at == await received_at(db, stored.event_id)
