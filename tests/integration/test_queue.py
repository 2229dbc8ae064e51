"""The queue core against a real PostgreSQL: the article's five, fencing, transactions, fairness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import trio

from autom.db import open_database
from autom.db.queries import Q
from autom.errors import PermanentError, Retry
from autom.jobs.models import NewJob
from autom.jobs.outcome import Outcome
from autom.jobs.retry import RetryPolicy
from autom.jobs.store import Ahead, JobStore
from tests.support.queue import (
    claim_one,
    complete,
    complete_batch,
    complete_in,
    complete_many,
    fail,
    release,
    settle_many,
)


def make_store(db, *, lease=30.0, base=0.05, cap=1.0) -> JobStore:
    return JobStore(db, lease_seconds=lease, retry=RetryPolicy(base=base, cap=cap))


async def wait_for_claim(store: JobStore, timeout: float = 5.0):
    """Poll until a job can be claimed (the condition, not a fixed sleep)."""
    with trio.fail_after(timeout):
        while True:
            job = await claim_one(store)
            if job is not None:
                return job
            await trio.sleep(0.02)


async def test_same_key_is_created_once(db):
    store = make_store(db)
    first = await store.enqueue(NewJob("k", key="order:1"))
    second = await store.enqueue(NewJob("k", key="order:1"))
    assert first is not None and second is None
    assert await db.fetch_val("select count(*) from jobs where key = 'order:1'") == 1
    # jobs without a key are never deduplicated
    assert None not in [await store.enqueue(NewJob("k")) for _ in range(3)]
    assert await db.fetch_val("select count(*) from jobs where key is null") == 3


async def test_thirty_parallel_claims_take_twenty_jobs_each_exactly_once(db):
    store = make_store(db)
    await store.enqueue_many([NewJob("k", payload={"n": i}) for i in range(20)])
    results: list = []

    async def claimer():
        results.append(await claim_one(store))

    async with trio.open_nursery() as nursery:
        for _ in range(30):
            nursery.start_soon(claimer)
    claimed = [job.id for job in results if job is not None]
    assert len(claimed) == 20
    assert len(set(claimed)) == 20
    assert results.count(None) == 10
    rows = await db.fetch_all("select status, attempts, autom_lease_generation(lease) as lease from jobs")
    assert all(r["status"] == "running" and r["attempts"] == 1 and r["lease"] == 1 for r in rows)


async def test_failed_attempts_wait_out_their_delay_then_fail_for_good(db):
    store = make_store(db, base=0.2, cap=0.2)
    job_id = await store.enqueue(NewJob("flaky", max_attempts=3))
    job = await wait_for_claim(store)
    for attempt in (1, 2, 3):
        assert job.id == job_id and job.attempts == attempt
        started = trio.current_time()
        outcome = await fail(store, job, RuntimeError(f"boom {attempt}"))
        if attempt < 3:
            assert outcome.status == "pending"
            assert await claim_one(store) is None  # not before its delay (0.2 s ± 20 %)
            job = await wait_for_claim(store)
            assert trio.current_time() - started >= 0.15
        else:
            assert outcome.status == "failed" and outcome.final
    row = await store.get(job_id)
    assert row["status"] == "failed"
    assert row["attempts"] == 3
    assert row["last_error"] == "RuntimeError: boom 3"
    assert row["finished_at"] is not None
    assert await claim_one(store) is None


async def test_permanent_error_fails_after_one_attempt(db):
    store = make_store(db)
    await store.enqueue(NewJob("send"))
    job = await claim_one(store)
    outcome = await fail(store, job, PermanentError("telegram: HTTP 400 chat not found"))
    assert outcome.final
    row = await store.get(job.id)
    assert (row["status"], row["attempts"]) == ("failed", 1)


async def test_retry_after_is_honoured(db):
    store = make_store(db, base=0.01, cap=0.01)
    await store.enqueue(NewJob("send"))
    job = await claim_one(store)
    await fail(store, job, Retry("telegram: HTTP 429", after=30))
    waited = await db.fetch_val("select extract(epoch from run_at - now()) from jobs where id = %s", [job.id])
    assert 29 <= waited <= 31


async def test_job_stuck_in_running_comes_back_when_its_lease_expires(db):
    store = make_store(db, lease=0.3)
    job_id = await store.enqueue(NewJob("slow"))
    first = await claim_one(store)
    assert first.id == job_id
    assert await claim_one(store) is None  # held by the lease
    second = await wait_for_claim(store)
    assert second.id == job_id
    assert (second.attempts, second.generation) == (2, 2)


async def test_stale_claim_changes_nothing_after_another_claim_took_the_job(db):
    store = make_store(db, lease=0.2)
    await store.enqueue(NewJob("slow", recipient="chat-1"))
    stale = await claim_one(store)
    fresh = await wait_for_claim(store)
    assert fresh.id == stale.id and fresh.generation == stale.generation + 1 and fresh.lease != stale.lease

    assert await complete(store, stale) is False
    assert (await fail(store, stale, RuntimeError("late"))).status == "stale"
    assert (await fail(store, stale, PermanentError("late"))).status == "stale"
    assert await store.renew([stale]) == {}
    assert await release(store, [stale]) == set()
    row = await store.get(fresh.id)
    assert (row["status"], row["lease"], row["last_error"]) == ("running", fresh.lease, None)

    renewed = await store.renew([fresh])
    assert set(renewed) == {fresh.id}
    assert await complete(store, fresh) is True
    assert (await store.get(fresh.id))["status"] == "done"


async def test_one_batch_with_a_stale_and_a_fresh_claim_of_one_job_completes_the_fresh_one(db):
    """The completer may hold two claims of one id (the older one's lease ran out while its
    outcome waited): in one batch, in either order, only the fresh claim counts."""
    store = make_store(db, lease=0.2)
    for n, order in enumerate(("stale first", "fresh first")):
        await store.enqueue(NewJob("slow", recipient=f"chat-{n}"))
        stale = await claim_one(store)
        fresh = await wait_for_claim(store)
        assert fresh.id == stale.id and fresh.lease != stale.lease
        await store.enqueue(NewJob("quick"))
        mate = await claim_one(store)
        batch = [stale, mate, fresh] if order == "stale first" else [fresh, mate, stale]
        assert await complete_batch(store, batch) == ({fresh.id, mate.id}, False), order
        assert (await store.get(fresh.id))["status"] == "done"


async def test_renew_keeps_a_long_job_from_being_claimed_again(db):
    store = make_store(db, lease=0.4)
    await store.enqueue(NewJob("long"))
    job = await claim_one(store)
    for _ in range(4):  # 0.8 s: twice the lease
        await trio.sleep(0.2)
        assert set(await store.renew([job])) == {job.id}
        assert await claim_one(store) is None
    assert await complete(store, job)


async def test_enqueue_in_a_rolled_back_transaction_leaves_no_job(db):
    store = make_store(db)

    class Boom(Exception):
        pass

    try:
        async with db.transaction() as tx:
            event_id = await tx.fetch_val(
                "insert into events (source, body) values ('site', '{}') returning id"
            )
            await store.enqueue(NewJob("site.form", event_id=event_id), tx)
            raise Boom
    except Boom:
        pass
    assert await db.fetch_val("select count(*) from jobs") == 0
    assert await db.fetch_val("select count(*) from events") == 0


async def test_enqueue_in_a_committed_transaction_keeps_event_and_job(db):
    store = make_store(db)
    async with db.transaction() as tx:
        event_id = await tx.fetch_val("insert into events (source, body) values ('site', '{}') returning id")
        job_id = await store.enqueue(NewJob("site.form", event_id=event_id), tx)
    row = await store.get(job_id)
    assert row["event_id"] == event_id
    assert await db.fetch_val("select count(*) from events where id = %s", [event_id]) == 1


async def test_release_puts_the_job_back_without_counting_the_attempt(db):
    store = make_store(db)
    await store.enqueue(NewJob("k", recipient="chat-9"))
    job = await claim_one(store)
    assert await release(store, [job], reason="shutdown") == {job.id}
    again = await claim_one(store)
    assert again.id == job.id and again.attempts == 1 and again.generation == 2


async def test_a_recipient_with_a_backlog_does_not_hold_back_another(db):
    store = make_store(db)
    await store.enqueue_many([NewJob("telegram.message", recipient="big") for _ in range(300)])
    lone = await store.enqueue(NewJob("telegram.message", recipient="small"))
    order = []
    for _ in range(5):
        job = await claim_one(store)
        order.append(job.id)
        await complete(store, job)
    assert lone in order[:2]


async def test_one_recipient_runs_one_job_at_a_time_in_run_at_order(db):
    store = make_store(db)
    ids = await store.enqueue_many([NewJob("m", recipient="chat") for _ in range(3)])
    first = await store.claim(10)
    assert [j.id for j in first] == [ids[0]]  # only the head; the others wait
    assert await store.claim(10) == []
    await complete(store, first[0])
    second = await store.claim(10)
    assert [j.id for j in second] == [ids[1]]


async def test_concurrent_claimers_never_run_two_jobs_of_one_recipient(db):
    """16 claimers, batches, 20 recipients, back-dated jobs arriving meanwhile; a unique
    index turns any violation into an error."""
    await db.execute(
        "create unique index one_running_per_recipient on jobs (recipient) where status = 'running'"
    )
    store = make_store(db)
    jobs = [NewJob("m", recipient=f"r{i % 20}") for i in range(400)]
    jobs += [NewJob("free") for _ in range(100)]
    await store.enqueue_many(jobs)
    done: list[int] = []
    backdated = trio.Event()

    async def claimer():
        idle = 0
        # three empty claims in a row end a claimer, once every job is queued (on a loaded
        # machine all 16 could find nothing three times while the backdater still enqueues)
        while idle < 3 or not backdated.is_set():
            batch = await store.claim(5)
            if not batch:
                idle += 1
                await trio.sleep(0.01)
                continue
            idle = 0
            await trio.sleep(0.001)
            done.extend(await complete_many(store, batch))

    async def backdater():
        # jobs queued before the running head's place (a back-dated run_at): the head of
        # the line changes under a running job, so only the recipient's row (busy_job,
        # migrations/0011) keeps a second job of the recipient from starting
        for i in range(60):
            await store.enqueue(NewJob("m", recipient=f"r{i % 20}", run_at=datetime.now(UTC) - timedelta(hours=1)))
            await trio.sleep(0.002)
        backdated.set()

    async with trio.open_nursery() as nursery:
        for _ in range(16):
            nursery.start_soon(claimer)
        nursery.start_soon(backdater)
    assert len(done) == 560 and len(set(done)) == 560
    assert await db.fetch_val("select count(*) from jobs where status <> 'done'") == 0


async def test_a_renewal_does_not_revive_a_lease_that_ran_out(db):
    """Expired but not yet claimed again: the renewal must not extend it (the job is
    anybody's now); the worker already stopped the run at its local deadline."""
    store = make_store(db, lease=0.3)
    job_id = await store.enqueue(NewJob("slow"))
    job = await claim_one(store)
    with trio.fail_after(5):
        while not await db.fetch_val("select locked_until < now() from jobs where id = %s", [job_id]):
            await trio.sleep(0.05)
    assert await store.renew([job]) == {}
    again = await claim_one(store)
    assert (again.id, again.generation) == (job_id, 2)


async def test_a_deferred_job_waits_without_counting_the_attempt_or_an_error(db):
    from autom.errors import Defer

    store = make_store(db)
    job_id = await store.enqueue(NewJob("send", recipient="chat"))
    job = await claim_one(store)
    await fail(store, job, RuntimeError("502"))  # a real failure first: its error stays
    await db.execute("update jobs set run_at = now() where id = %s", [job_id])
    job = await wait_for_claim(store)
    assert job.attempts == 2
    settle = store.decide(job, Defer("chat limit", after=30))
    assert (settle.status, settle.delay) == ("deferred", 30.0)
    assert set(await settle_many(store, [settle])) == {job_id}
    row = await db.fetch_one(
        "select status, attempts, last_error, run_at - now() as wait from jobs where id = %s", [job_id])
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 1, "RuntimeError: 502")
    assert 29 <= row["wait"].total_seconds() <= 30
    assert await db.fetch_val("select count(*) from alerts") == 0


def refused(after: float) -> Any:
    """A deferral after Telegram's 429, as the Telegram client raises it."""
    from autom.errors import Defer

    defer = Defer("telegram sendMessage: HTTP 429", after=after)
    defer.refused = True
    return defer


async def test_refused_deferrals_fail_the_job_for_good_once_they_have_lasted_max_defer_seconds(db):
    """The clock starts at the first refusal; a limiter's wait in between neither starts nor
    stops it; once a refusal would leave the job deferred past the bound, it fails for good
    (its attempt counted, its alert recorded) instead of deferring again."""
    from autom.errors import Defer

    store = JobStore(db, retry=RetryPolicy(base=0.05, cap=1.0), max_defer_seconds=2.0)
    job_id = await store.enqueue(NewJob("send", recipient="chat"))

    async def settle(error: Exception) -> dict[str, Any]:
        job = await wait_for_claim(store)
        await settle_many(store, [store.decide(job, error)])
        return await db.fetch_one(
            "select status, attempts, last_error, deferred_since, extract(epoch from now() - deferred_since) as age"
            " from jobs where id = %s", [job_id])

    waited = await settle(Defer("chat limit", after=0))  # the limiter's wait: no clock
    assert (waited["status"], waited["deferred_since"]) == ("pending", None)
    first = await settle(refused(0))
    assert first["status"] == "pending" and first["deferred_since"] is not None
    await trio.sleep(0.5)
    assert (await settle(Defer("chat limit", after=0)))["deferred_since"] == first["deferred_since"]
    again = await settle(refused(0.1))
    assert again["status"] == "pending", again  # well within 2 s of the first refusal
    await trio.sleep(max(0.0, 2.2 - float(again["age"])))
    failed = await settle(refused(0))  # over 2 s after the first refusal
    assert (failed["status"], failed["attempts"]) == ("failed", 1)
    assert failed["last_error"] == (
        "deferred for more than 2 s (MAX_DEFER_SECONDS): Defer: telegram sendMessage: HTTP 429")
    assert await db.fetch_val("select count(*) from alerts where job_id = %s", [job_id]) == 1


async def test_a_refusal_that_would_wait_past_the_bound_fails_at_once_and_a_retry_restarts_the_clock(db):
    store = JobStore(db, retry=RetryPolicy(base=0.05, cap=1.0), max_defer_seconds=5.0)
    job_id = await store.enqueue(NewJob("send"))
    job = await wait_for_claim(store)
    await settle_many(store, [store.decide(job, refused(1))])
    job = await wait_for_claim(store)
    await fail(store, job, RuntimeError("502"))  # ran into something else: a new run of refusals later
    assert await db.fetch_val("select deferred_since from jobs where id = %s", [job_id]) is None
    await db.execute("update jobs set run_at = now() where id = %s", [job_id])
    job = await wait_for_claim(store)
    settled = await settle_many(store, [store.decide(job, refused(10))])  # 10 s > 5 s: no point waiting
    assert settled[job_id].status == "failed"
    assert settled[job_id].error is not None and settled[job_id].error.startswith("deferred for more than 5 s")


async def test_a_job_waiting_for_its_retry_holds_back_the_later_jobs_of_its_recipient(db):
    """A recipient's jobs run in creation order (README, Reliability); a job waiting for its retry
    holds back the later ones until it is done or failed (a FIFO group). Other
    recipients and jobs without a recipient are not held back."""
    store = make_store(db, base=0.3, cap=0.3)
    first, second, third = await store.enqueue_many([NewJob("m", {"n": i}, recipient="chat") for i in range(3)])
    other = await store.enqueue(NewJob("m", recipient="other"))
    free = await store.enqueue(NewJob("m"))
    claimed = await store.claim(10)
    assert sorted(j.id for j in claimed) == sorted([first, other, free])
    head = next(j for j in claimed if j.id == first)
    assert (await fail(store, head, RuntimeError("502"))).status == "pending"
    assert await complete_many(store, [j for j in claimed if j.id != first]) == {other, free}
    # the retry is not due yet: nothing of "chat" may run, though its second job is due
    assert await store.claim(10) == []
    again = await wait_for_claim(store)
    assert (again.id, again.attempts) == (first, 2)
    assert await store.claim(10) == []  # still one at a time
    await complete(store, again)
    [nxt] = await store.claim(10)
    assert nxt.id == second
    # a job that failed for good, like a done one, lets the line move on
    assert (await fail(store, nxt, PermanentError("400"))).final
    assert [j.id for j in await store.claim(10)] == [third]


async def test_a_deferred_job_keeps_its_place_in_its_recipients_line(db):
    from autom.errors import Defer

    store = make_store(db)
    first, second = await store.enqueue_many([NewJob("m", recipient="chat") for _ in range(2)])
    [job] = await store.claim(10)
    assert job.id == first
    await settle_many(store, [store.decide(job, Defer("chat limit", after=0.3))])
    assert await store.claim(10) == []  # the second waits behind the deferred first
    again = await wait_for_claim(store)
    assert (again.id, again.attempts) == (first, 1)
    await complete(store, again)
    assert [j.id for j in await store.claim(10)] == [second]


async def test_cancelling_a_head_waiting_for_its_retry_lets_its_recipients_line_move_on(db):
    """A cancelled job counts as finished for the order (README, Reliability): the next job of its
    recipient runs at once, not when the cancelled one's retry would have been due."""
    from autom.ops import Operations

    store = make_store(db, base=60, cap=60)
    first, second = await store.enqueue_many([NewJob("m", recipient="chat") for _ in range(2)])
    [head] = await store.claim(10)
    assert (await fail(store, head, RuntimeError("502"))).status == "pending"
    assert await store.claim(10) == []  # the line waits for the retry (a minute away) ...
    assert await store.claim(10) == []  # ... also once the claim has retired the recipient
    await Operations(db).cancel_job(first)
    assert [j.id for j in await store.claim(10)] == [second]


async def recipient_row(db, recipient):
    return await db.fetch_one(
        "select next_due_at, next_due_at <= now() as due, busy_until, busy_job from recipients where recipient = %s",
        [recipient])


async def test_a_completion_retires_its_recipient_until_its_next_job_is_due(db):
    """The claim walks only recipients due now; the completion that leaves a recipient
    nothing due (its next job later, or none) says when it is due next, instead of every
    claim walking over it."""
    store = make_store(db)
    later = datetime.now(UTC) + timedelta(seconds=0.5)
    first, second = await store.enqueue_many([NewJob("m", recipient="chat"), NewJob("m", recipient="chat",
                                                                                      run_at=later)])
    [job] = await store.claim(10)
    assert job.id == first
    assert await complete_batch(store, [job]) == ({first}, False)  # nothing more due now
    row = await recipient_row(db, "chat")
    assert row["next_due_at"] == later and row["busy_job"] == first
    assert await store.claim(10) == []
    again = await wait_for_claim(store)
    assert again.id == second
    await complete(store, again)
    assert (await recipient_row(db, "chat"))["next_due_at"] is None  # nothing left: retired for good
    third = await store.enqueue(NewJob("m", recipient="chat"))
    assert [j.id for j in await store.claim(10)] == [third]


async def test_a_completed_job_frees_its_recipient_without_a_write_to_its_row(db):
    """The recipient's row names the claim that made it busy (busy_job); once that job is
    done the next one can be claimed, though the row still says busy until the lease end."""
    store = make_store(db)
    first, second = await store.enqueue_many([NewJob("m", recipient="chat") for _ in range(2)])
    [job] = await store.claim(10)
    before = await recipient_row(db, "chat")
    assert await complete_batch(store, [job]) == ({first}, True)  # the next job is due now
    assert await recipient_row(db, "chat") == before
    assert [j.id for j in await store.claim(10)] == [second]


async def test_an_enqueue_during_a_completion_keeps_its_recipient_due(db):
    """The completion sees an empty line and would retire the recipient, but a job enqueued
    meanwhile (its transaction still open, holding the row) must still run: the retire
    skips the held row instead of waiting for it (the intake's enqueue never waits for a
    completion, nor a completion for the intake's durable commit: issue 26)."""
    store = make_store(db)
    first = await store.enqueue(NewJob("m", recipient="chat"))
    [job] = await store.claim(10)
    async with db.transaction() as tx:
        new = await store.enqueue(NewJob("m", recipient="chat"), tx)  # holds the row's lock
        with trio.fail_after(30):  # a hang guard: the completion and its retire do not wait for the row
            assert await complete_many(store, [job]) == {first}
    # committed: the row was left due, and the new job runs
    assert (await recipient_row(db, "chat"))["due"] is True
    assert [j.id for j in await store.claim(10)] == [new]


async def test_a_retire_sees_a_job_enqueued_after_the_completion(db):
    """An enqueue that commits between the completion and its retire (two statements) is
    seen by the retire, which then leaves the recipient due."""
    store = make_store(db)
    first = await store.enqueue(NewJob("m", recipient="chat"))
    [job] = await store.claim(10)
    rows = await db.fetch_all(Q.complete_many, {"ids": [job.id], "leases": [job.lease], "durable": False,
                                                "claimant": None, "upto": 0})
    assert [(r["id"], r["idle"]) for r in rows] == [(first, "chat")]  # the line is empty: to retire
    new = await store.enqueue(NewJob("m", recipient="chat"))
    assert await db.execute(Q.retire_lines, {"recipients": ["chat"]}) == 0
    assert (await recipient_row(db, "chat"))["due"] is True
    assert [j.id for j in await store.claim(10)] == [new]


async def test_the_sweep_retires_what_a_completion_could_not(db):
    """A cancelled head leaves its recipient due though its next job is not (ops_cancel_job
    cannot tell); retire_idle, the fetcher's sweep when it goes idle, retires it."""
    from autom.ops import Operations

    store = make_store(db, base=60, cap=60)
    later = datetime.now(UTC) + timedelta(hours=1)
    first, _ = await store.enqueue_many([NewJob("m", recipient="chat"),
                                         NewJob("m", recipient="chat", run_at=later)])
    [head] = await store.claim(10)
    assert (await fail(store, head, RuntimeError("502"))).status == "pending"
    await Operations(db).cancel_job(first)
    assert (await recipient_row(db, "chat"))["due"] is True  # stale: nothing is due
    assert await store.claim(10) == []
    assert await store.retire_idle() == 1
    assert (await recipient_row(db, "chat"))["next_due_at"] == later
    assert await store.retire_idle() == 0


async def test_claims_of_one_and_two_keep_the_lines_and_skip_paused_kinds(db):
    """The prepared small claims (the worker's claim when woken with nothing in hand) are
    the batch claim with its limit written in: same lanes, same lines, same pauses."""
    store = make_store(db)
    await db.execute("insert into paused_kinds (kind) values ('slow')")
    await store.enqueue(NewJob("slow"))
    chat_head = await store.enqueue(NewJob("slow", recipient="c1"))
    chat_next = await store.enqueue(NewJob("other", recipient="c1"))
    free = await store.enqueue_many([NewJob("other") for _ in range(2)])
    lone = await store.enqueue(NewJob("other", recipient="c2"))
    lone_next = await store.enqueue(NewJob("other", recipient="c2"))
    first = await store.claim(2)
    second = await store.claim(1)
    third = await store.claim(2)
    taken = [j.id for j in first + second + third]
    assert len(first) == 2 and len(second) == 1
    assert sorted(taken) == sorted([*free, lone])  # c1 held by its paused head, c2 busy
    assert chat_head not in taken and chat_next not in taken and lone_next not in taken
    await complete(store, next(j for j in first + second + third if j.id == lone))
    assert [j.id for j in await store.claim(1)] == [lone_next]


async def test_a_completion_in_a_handlers_transaction_keeps_its_commit_durable(db):
    """complete_many commits asynchronously for the completer; inside a caller's transaction
    (JobStore.complete_in) it must not: that commit holds the handler's own writes."""
    store = make_store(db)
    await store.enqueue(NewJob("m", recipient="chat"))
    [job] = await store.claim(10)
    async with db.transaction() as tx:
        setting = await tx.fetch_val("show synchronous_commit")
        assert await complete_in(store, tx, job)
        assert await tx.fetch_val("show synchronous_commit") == setting
        assert not await complete_in(store, tx, job)  # no longer held
    assert (await store.get(job.id))["status"] == "done"


@pytest.mark.parametrize("older", ["recipient", "free"])
async def test_a_mixed_backlog_is_claimed_from_both_lanes_each_in_its_order(db, older):
    """Jobs with a recipient and jobs without one due together, either kind queued first:
    while both lanes have work every claim takes from both (at least half of it each, for
    the batch claim and the prepared claim of two), the recipient-less jobs come in due order
    with none left behind, each recipient's in its line's order, each job once. The table
    is analyzed while empty first: under those statistics the recipient-less lane once read
    and sorted every due job of its lane in each claim (bench/RESULTS.md, Speed round four)."""
    store = make_store(db)
    await db.execute("analyze jobs")
    now = datetime.now(UTC)
    rc_start, nc_start = (now - timedelta(hours=2), now - timedelta(hours=1)) if older == "recipient" \
        else (now - timedelta(hours=1), now - timedelta(hours=2))
    rc_ids = await store.enqueue_many([NewJob("m", recipient=f"r{i % 10}", run_at=rc_start + timedelta(seconds=i))
                                       for i in range(200)])
    nc_ids = await store.enqueue_many([NewJob("free", run_at=nc_start + timedelta(seconds=i)) for i in range(200)])
    taken_nc: list[int] = []
    taken_rc: dict[str, list[int]] = {}
    sizes = [8, 2, 1]
    for turn in range(1000):
        n = sizes[turn % len(sizes)]
        batch = await store.claim(n)
        if not batch:
            break
        nc = [j.id for j in batch if j.recipient is None]
        rc = [j for j in batch if j.recipient is not None]
        if len(taken_nc) + len(nc) < len(nc_ids) and sum(map(len, taken_rc.values())) + len(rc) < len(rc_ids):
            assert len(nc) >= n // 2 and len(rc) >= n // 2, (n, len(nc), len(rc))
        assert len({j.recipient for j in rc}) == len(rc)  # one job per recipient at a time
        taken_nc += nc
        for j in rc:
            taken_rc.setdefault(j.recipient, []).append(j.id)
        assert len(await complete_many(store, batch)) == len(batch)
    assert taken_nc == nc_ids  # due order (run_at grows with the id here), none skipped
    assert taken_rc == {f"r{k}": rc_ids[k::10] for k in range(10)}  # each line in its order
    assert await db.fetch_val("select count(*) from jobs where status <> 'done'") == 0


def _scans(plan: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """Every scan of a plan (EXPLAIN's JSON): (node type, relation, index)."""
    found = []
    if "Relation Name" in plan or "Index Name" in plan:
        found.append((plan["Node Type"], plan.get("Relation Name"), plan.get("Index Name")))
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _updates(plan: dict[str, Any], relation: str) -> list[dict[str, Any]]:
    """The plan's updates of ``relation`` (a ModifyTable with Operation Update)."""
    found = [plan] if plan.get("Operation") == "Update" and plan.get("Relation Name") == relation else []
    for child in plan.get("Plans", []):
        found += _updates(child, relation)
    return found


async def test_the_claim_updates_its_jobs_by_id_under_a_long_running_services_statistics(db):
    """Nearly every job finished (due_at NULL) and analyzed, as a service's table is most
    of its life, then a backlog: the statistics say "due_at <= now()" is about one row.
    The claim's update must still find its jobs by primary key, for the batch claim and
    the prepared claims of one and two; with the due guard as an index condition it walked
    jobs_due_all, every due job, in every claim (bench/RESULTS.md, Speed round four)."""
    store = make_store(db)
    await store.enqueue_many([NewJob("old") for _ in range(20000)])
    await db.execute("update jobs set status = 'done', finished_at = now()")
    await db.execute("analyze jobs")
    await store.enqueue_many([NewJob("m", recipient=f"r{i % 50}") for i in range(1000)])
    await store.enqueue_many([NewJob("free") for _ in range(1000)])
    counted = {"claimant": None, "ticket": 0, "now_n": 1}
    statements: list[tuple[str, Any]] = [(store._few(n, durable, None), None) for n in (1, 2)
                                         for durable in (False, True)]
    statements.append((Q.claim, {"n": 63, "lease_seconds": 30.0, "durable": True, **counted}))
    for sql, params in statements:
        (plan,) = await db.fetch_val("explain (format json) " + sql, params)
        (update,) = _updates(plan["Plan"], "jobs")
        # the scan that finds the rows to update (not the InitPlan that reads pick's ids)
        scans = [scan for child in update["Plans"] if child.get("Parent Relationship") == "Outer"
                 for scan in _scans(child) if scan[1] == "jobs"]
        assert scans and all(index == "jobs_pkey" for _, _, index in scans), scans
    # and it claims, both lanes
    jobs = await store.claim(63)
    assert len(jobs) == 63 and {j.recipient is None for j in jobs} == {True, False}


async def test_the_idle_claim_is_planned_generic_from_its_first_run(dsn):
    """The worker's claim of one or two jobs that all start at once has every value written
    in: PostgreSQL plans it once per connection. With parameters its first five runs on
    each connection were planned anew (custom plans, ~1 ms each: the idle p99)."""
    async with open_database(dsn, min_size=1, max_size=1) as one:
        store = make_store(one)
        claimant = await store.register_claimant()
        for _ in range(3):
            await store.enqueue_many([NewJob("k"), NewJob("k")])
            for n, durable in ((1, False), (2, False), (2, True)):
                ahead = Ahead(claimant, ticket=0, now_n=n)
                jobs = await store.claim(n, durable=durable, ahead=ahead)
                assert ahead.tickets == [0] * len(jobs)
                await complete_many(store, jobs)
        plans = await one.fetch_all("select generic_plans, custom_plans from pg_prepared_statements"
                                    " where statement like '%%recipients_serve_seq%%'")
    assert len(plans) == 3 and all(p["custom_plans"] == 0 and p["generic_plans"] >= 1 for p in plans), plans


async def test_a_claim_with_runs_ahead_keeps_its_tickets(db):
    """A claim of two with one idle runner (now_n 1) is not the written-in statement: the
    second job waits for a runner with the pool's next ticket."""
    store = make_store(db)
    await store.enqueue_many([NewJob("k"), NewJob("k")])
    claimant = await store.register_claimant()
    ahead = Ahead(claimant, ticket=7, now_n=1)
    await store.claim(2, durable=False, ahead=ahead)
    assert ahead.tickets == [0, 8]


async def test_a_lease_lost_before_its_run_started_gives_the_attempt_back(db):
    """Claimed ahead (a ticket beyond what its pool recorded as started) and its lease lost:
    the next claim keeps attempts; once the pool recorded the start, the lost run counts."""
    store = make_store(db)
    ids = await store.enqueue_many([NewJob("k"), NewJob("k")])
    claimant = await store.register_claimant()
    ahead = Ahead(claimant, ticket=0, now_n=0)  # both wait for a runner: tickets 1 and 2
    jobs = await store.claim(2, ahead=ahead)
    assert sorted(ahead.tickets) == [1, 2] and [j.attempts for j in jobs] == [1, 1]
    started = jobs[ahead.tickets.index(1)]
    await store.record_starts(claimant, 1)  # the first one's run started
    await db.execute("update jobs set locked_until = now() - interval '1 second'")  # the worker died
    again = {j.id: j.attempts for j in await store.claim(2)}
    assert again == {started.id: 2, next(i for i in ids if i != started.id): 1}
    # the attempt log has the started run only
    assert await db.fetch_val("select array_agg(job_id) from job_attempts") == [started.id]


async def test_a_claim_failed_without_running_gives_its_attempt_back(db):
    store = make_store(db)
    await store.enqueue(NewJob("k"))
    (job,) = await store.claim(1)
    await settle_many(store, [Outcome.failed(job, "attempts exhausted", unrun=True)])
    row = await store.get(job.id)
    assert (row["status"], row["attempts"]) == ("failed", 0)
    assert await db.fetch_val("select count(*) from alerts where job_id = %s", [job.id]) == 1
