"""``SendLimiter`` on a real PostgreSQL: per chat, per group, the bot's budget, 429s (migrations/0009)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from autom.errors import Defer
from autom.limits import SendLimiter
from tests.support.telegram_stub import Reply, TelegramStub


async def test_one_chat_waits_its_interval_while_another_chat_sends(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    await limiter.acquire(42)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 0.5 < waited.value.after <= 1.0
    await limiter.acquire(43)  # another chat is not held back


async def test_a_group_chat_sends_at_most_twenty_a_minute(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=10.0, global_rate=30.0)
    await limiter.acquire(-100123)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(-100123)
    assert 2.5 < waited.value.after <= 3.0  # 60 s / 20
    await limiter.acquire(7)
    with pytest.raises(Defer) as private:
        await limiter.acquire(7)
    assert private.value.after <= 0.1


async def test_the_budget_is_shared_and_keeps_a_slot_for_alerts(db: Any) -> None:
    # two limiters stand for two replicas: the budget is the database's, not theirs
    first = SendLimiter(db, chat_rate=1.0, global_rate=3.0)
    second = SendLimiter(db, chat_rate=1.0, global_rate=3.0)
    await first.acquire(1)
    await second.acquire(2)  # burst 3, the last slot kept for alerts
    with pytest.raises(Defer) as waited:
        await first.acquire(3)
    assert 0 < waited.value.after <= 1 / 3 + 0.01
    await second.acquire(4, priority=True)  # an alert takes the kept slot
    await second.acquire(5, priority=True)  # and does not wait for the budget: it charges it
    with pytest.raises(Defer) as later:
        await first.acquire(6)
    assert later.value.after > waited.value.after  # the alerts' slots were paid for


async def test_parts_of_one_message_take_their_slots_together(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=2.0, global_rate=30.0)
    await limiter.acquire(42, parts=3)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 1.0 < waited.value.after <= 1.5  # three half-second slots


async def test_a_429_holds_that_chat_and_a_flood_of_them_pauses_every_send(db: Any) -> None:
    limiter = SendLimiter(db, chat_rate=100.0, global_rate=100.0)
    await limiter.pushed(42, 5.0)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert 4.0 < waited.value.after <= 5.0
    await limiter.acquire(43)  # one 429 holds one chat only
    await limiter.pushed(44, 2.0)
    await limiter.pushed(45, 2.0)  # the third within 10 s: Telegram limits the bot itself
    with pytest.raises(Defer) as paused:
        await limiter.acquire(46)
    assert 1.0 < paused.value.after <= 2.0
    with pytest.raises(Defer):
        await limiter.acquire(47, priority=True)  # alerts too: Telegram would refuse them as well


async def test_a_reservation_commits_asynchronously_for_its_own_transaction_only(db: Any) -> None:
    """telegram_acquire turns synchronous_commit off for the transaction it commits in (a lost
    reservation is harmless: SendLimiter.acquire); the connection's setting is left alone."""
    from autom.db.queries import Q

    params = {"chat": "42", "parts": 1, "chat_interval": 1.0, "global_interval": 1 / 30, "burst": 30.0,
              "priority": False, "job": None, "line": None, "line_kinds": []}
    async with db.transaction() as tx:
        setting = await tx.fetch_val("show synchronous_commit")
        assert setting != "off"
        assert await tx.fetch_val(Q.telegram_acquire, params) == 0  # wait 0: taken
        assert await tx.fetch_val("show synchronous_commit") == "off"
    async with db.transaction() as tx:
        assert await tx.fetch_val("show synchronous_commit") == setting
    assert await db.fetch_val("select count(*) from telegram_chats where chat_id = '42'") == 1
    with pytest.raises(Defer):  # the reservation holds
        await SendLimiter(db, chat_rate=1.0, global_rate=30.0).acquire(42)


@pytest.mark.parametrize("job", [False, True])
async def test_a_send_writes_the_budgets_row_once(db: Any, job: bool) -> None:
    """The take writes the bot's budget (the slot's and the sends made's) in one update
    (migrations/0036; two before, each planned anew at every send), and reads the same
    budget back: the next send of the burst goes at once, the one after it waits."""
    from autom.db.queries import Q

    job_id = await _job(db, "hi") if job else None
    # a 30 s interval: the budget refills nothing while the test runs (with 1 s a slow
    # machine's pause between the sends let the last go at once too)
    params = {"chat": "42", "parts": 1, "chat_interval": 1.0, "global_interval": 30.0, "burst": 3.0,
              "priority": False, "job": job_id, "line": "42" if job else None, "line_kinds": ["telegram.send"]}
    async with db.transaction() as tx:
        assert await tx.fetch_val(Q.telegram_acquire, params) == 0
        updates = await tx.fetch_val("select n_tup_upd from pg_stat_xact_user_tables where relname = 'telegram_budget'")
        assert updates == 1
    budget = await db.fetch_one(
        "select tat > now() as spent, sent_tat > now() as sent, flood_sent from telegram_budget")
    assert budget == {"spent": True, "sent": True, "flood_sent": 1.0}
    assert await db.fetch_val(Q.telegram_acquire, {**params, "chat": "43", "job": None, "line": None}) == 0
    assert await db.fetch_val(Q.telegram_acquire, {**params, "chat": "44", "job": None, "line": None}) > 0


async def _job(db: Any, text: str, *, recipient: str | None = "42", kind: str = "telegram.send") -> int:
    from autom.jobs.models import NewJob
    from autom.jobs.store import JobStore

    job_id = await JobStore(db).enqueue(NewJob(kind, {"chat_id": 42, "text": text}, recipient=recipient))
    assert job_id is not None
    return job_id


async def test_a_blocked_chat_is_refused_without_a_slot_and_alerts_still_pass(db: Any) -> None:
    from autom.errors import ChatBlocked
    from autom.limits import blocked_chat, blocked_chats

    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    running, pending, other_kind = await _job(db, "a"), await _job(db, "b"), await _job(db, "c", kind="site.form")
    other_chat = await _job(db, "d", recipient="43")
    assert await limiter.block(42, "Forbidden: bot was blocked by the user", job_id=running) == 1
    statuses = await db.fetch_all("select id, status from jobs order by id")
    assert statuses == [{"id": running, "status": "pending"}, {"id": pending, "status": "cancelled"},
                        {"id": other_kind, "status": "pending"}, {"id": other_chat, "status": "pending"}]
    with pytest.raises(ChatBlocked) as refused:
        await limiter.acquire(42)
    assert refused.value.chat_id == 42
    assert await db.fetch_val("select count(*) from telegram_chats where chat_id = '42'") == 0  # no slot taken
    await limiter.acquire(42, priority=True)  # an alert chat is never held back by a mark
    mark = await blocked_chat(db, 42)
    assert mark is not None and mark["reason"] == "Forbidden: bot was blocked by the user"
    assert [m["chat_id"] for m in await blocked_chats(db)] == ["42"]
    assert await blocked_chat(db, 43) is None


async def test_a_parts_record_is_fenced_by_the_claims_lease(db: Any) -> None:
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    await _job(db, "x" * 5000, recipient=None)
    (claim,) = await store.claim(1)
    assert await limiter.parts_sent(claim.id, "0:abc") == (0, None)
    assert await limiter.record_parts(claim, "0:abc", 1, 17, within=1.0)
    assert await limiter.parts_sent(claim.id, "0:abc") == (1, 17)
    assert await limiter.parts_sent(claim.id, "0:other") == (0, None)
    await db.execute("update jobs set locked_until = now() - interval '1 second' where id = %(id)s", {"id": claim.id})
    (again,) = await store.claim(1)  # the lease ran out: a new claim holds the job
    assert not await limiter.record_parts(claim, "0:abc", 2, 18, within=1.0)  # the old claim writes nothing
    assert await limiter.parts_sent(claim.id, "0:abc") == (1, 17)
    assert await limiter.record_parts(again, "0:abc", 2, 18, within=1.0)
    assert await limiter.parts_sent(claim.id, "0:abc") == (2, 18)


@pytest.mark.parametrize(("updates", "blocked"), [
    (["kicked"], True),
    (["kicked", "left"], True),
    (["kicked", "member"], False),
    (["kicked", "administrator"], False),
    (["kicked", "message"], False),
    (["member", "kicked"], True),
])
async def test_the_telegram_sources_jobs_set_and_clear_the_mark_as_they_are_stored(
    db: Any, updates: list[str], blocked: bool
) -> None:
    from autom.events import StoreBatcher, store_params
    from autom.jobs.models import NewJob
    from autom.limits import blocked_chat

    events = StoreBatcher(db)
    for n, update in enumerate(updates):
        if update == "message":
            job = NewJob("telegram.message", {"chat_id": 42, "text": "hi"}, key=f"telegram:{n}", recipient="42")
        else:
            job = NewJob("telegram.member", {"chat_id": 42, "status": update}, key=f"telegram:{n}", recipient="42")
        await events.deliver(store_params("telegram", {}, "{}", str(n), [job]))
    assert (await blocked_chat(db, 42) is not None) == blocked


async def test_a_job_that_must_wait_gets_its_slot_reserved_and_takes_it_without_waiting_again(db: Any) -> None:
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=10.0, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n), recipient=None) for n in range(3)]
    claims = {c.id: c for c in await store.claim(3)}
    first, second, third = (claims[i] for i in ids)
    await limiter.acquire(42, job=first)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42, job=second)
    assert 0.05 < waited.value.after <= 0.1 and waited.value.quiet
    with pytest.raises(Defer) as queued:
        await limiter.acquire(42, job=third)  # the slot after the second's: slots stack up
    assert 0.15 < queued.value.after <= 0.2
    with pytest.raises(Defer) as early:
        await limiter.acquire(42, job=third)  # back before its slot: the same slot, nothing new taken
    assert early.value.after <= queued.value.after
    slots = await db.fetch_all("select job_id, slot_at from telegram_reservations order by slot_at")
    assert [r["job_id"] for r in slots] == [second.id, third.id]
    # its slot came (and the interval after the chat's last send made: migrations/0038)
    await db.execute("update telegram_reservations set slot_at = now() where job_id = %(id)s", {"id": second.id})
    await db.execute("update telegram_chats set sent_next_at = now() where chat_id = '42'")
    await limiter.acquire(42, job=second)  # sent without another wait
    assert [r["job_id"] for r in await db.fetch_all("select job_id from telegram_reservations")] == [third.id]
    with pytest.raises(Defer):
        await limiter.acquire(42, job=first)  # a job without a slot waits behind the reserved ones
    await limiter.acquire(43, job=first)  # another chat does not


async def test_a_send_moves_the_next_job_of_its_chats_line_to_the_chats_next_slot(db: Any) -> None:
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=0.5, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n)) for n in range(3)]
    other = await _job(db, "x", kind="site.form", recipient="43")
    (head,) = await store.claim(1)
    assert head.id == ids[0]
    await limiter.acquire(42, job=head)
    rows = await db.fetch_all("select id, extract(epoch from run_at - now()) as due_in, queued_at is not null as kept "
                              "from jobs order by id")
    assert 1.5 < rows[1]["due_in"] <= 2.0 and rows[1]["kept"]  # the chat's next slot, its place kept
    assert rows[2]["due_in"] <= 0 and rows[3]["due_in"] <= 0  # only the next one; other lines untouched
    assert rows[3]["id"] == other


async def test_a_429_moves_the_chats_reserved_slots_and_their_jobs_past_its_retry_after(db: Any) -> None:
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=10.0, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n), recipient=None) for n in range(2)]
    claims = {c.id: c for c in await store.claim(2)}
    await limiter.acquire(42, job=claims[ids[0]])
    with pytest.raises(Defer):
        await limiter.acquire(42, job=claims[ids[1]])
    await store.write([store.decide(claims[ids[1]], Defer("wait", after=0.1))])
    await limiter.pushed(42, 5.0)
    row = await db.fetch_one("select extract(epoch from r.slot_at - now()) as slot_in, "
                             "extract(epoch from j.run_at - now()) as run_in from telegram_reservations r "
                             "join jobs j on j.id = r.job_id")
    assert row is not None and 4.5 < row["slot_in"] <= 5.0 and 4.5 < row["run_in"] <= 5.1


async def test_alerts_of_every_replica_take_turns_in_their_chats_spacing(db: Any) -> None:
    first = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    second = SendLimiter(db, chat_rate=1.0, global_rate=30.0)

    async def turn(limiter: SendLimiter, into: list[float]) -> None:
        into.append(await limiter.space(-1000))

    for _ in range(5):  # both at once, on a chat row that does not exist yet the first time
        await db.execute("delete from telegram_chats")
        waits: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn, first, waits)
            nursery.start_soon(turn, second, waits)
        assert sorted(waits)[0] == 0 and 2.5 < sorted(waits)[1] <= 3.0, waits  # a group: one every 3 s
    assert 2.5 < await first.space(-1000) <= 3.0


def _client(url: str, limiter: SendLimiter) -> Any:
    from autom.config import Settings
    from autom.telegram import TelegramClient

    client = TelegramClient(Settings(telegram_api=url, telegram_bot_token="123456:limits",
                                     telegram_alert_chat_id="-1001", http_timeout_seconds=5.0))
    client.limiter = limiter
    return client


async def test_a_few_429s_among_many_sends_hold_their_chats_only_and_pause_nothing(
    db: Any, telegram_stub: TelegramStub
) -> None:
    """Telegram refusing one send in ten (four chats of forty, within seconds) is about those
    chats: every other send still reaches it, no pause moves anyone (migrations/0030). Before,
    the third 429 within 10 s paused all sends: the sends after it were deferred unsent."""
    refusing = [5, 15, 25, 35]
    for chat in refusing:
        telegram_stub.plan("sendMessage", [Reply(status=429, retry_after=1)], chat_id=chat)
    client = _client(telegram_stub.url, SendLimiter(db, chat_rate=1.0, global_rate=1000.0))
    refused = []
    try:
        for chat in range(40):
            try:
                await client.send_message(chat, "hello")
            except Defer as exc:
                assert exc.refused, exc  # Telegram's 429, not a wait of the limiter
                refused.append(chat)
    finally:
        await client.aclose()
    assert refused == refusing
    assert len(telegram_stub.calls_of("sendMessage")) == 40  # every send reached Telegram
    assert await db.fetch_val("select paused_until = '-infinity' from telegram_budget")


async def test_telegram_refusing_most_sends_pauses_them_all(db: Any, telegram_stub: TelegramStub) -> None:
    for chat in range(5):
        telegram_stub.plan("sendMessage", [Reply(status=429, retry_after=5)], chat_id=chat)
    client = _client(telegram_stub.url, SendLimiter(db, chat_rate=1.0, global_rate=1000.0))
    reasons = []
    try:
        for chat in range(5):
            with pytest.raises(Defer) as deferred:
                await client.send_message(chat, "hello")
            reasons.append("refused" if deferred.value.refused else "waited")
    finally:
        await client.aclose()
    assert reasons == ["refused"] * 3 + ["waited"] * 2  # the third 429 in a row paused every send
    assert len(telegram_stub.calls_of("sendMessage")) == 3


async def test_a_job_back_long_after_its_reserved_slot_sends_on_it_and_takes_no_new_one(
    db: Any, telegram_stub: TelegramStub
) -> None:
    """Workers that lag bring a job back after its slot: it sends on that slot, however late,
    and takes nothing more from the bot's budget (migrations/0030). Before, a slot more than
    10 s old was dropped and a new one taken behind every other (here 30 s of others' slots):
    the job deferred again, unsent, and the budget spent twice."""
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=10.0, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n), recipient=None) for n in range(2)]
    claims = {c.id: c for c in await store.claim(2)}
    first, late = claims[ids[0]], claims[ids[1]]
    await limiter.acquire(42, job=first)
    with pytest.raises(Defer):
        await limiter.acquire(42, job=late)  # its slot is reserved
    # a minute passes: its slot long gone, the budget handed out 30 s ahead to other jobs
    await db.execute("update telegram_reservations set slot_at = slot_at - interval '60 seconds'")
    await db.execute("update telegram_budget set tat = clock_timestamp() + interval '30 seconds'")
    await db.execute("update telegram_chats set next_send_at = next_send_at - interval '60 seconds',"
                     " sent_next_at = sent_next_at - interval '60 seconds'")
    tat = await db.fetch_val("select tat from telegram_budget")
    client = _client(telegram_stub.url, limiter)
    try:
        await client.for_job(late).send_message(42, "late")
    finally:
        await client.aclose()
    assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage")] == ["late"]
    assert await db.fetch_val("select count(*) from telegram_reservations") == 0
    assert await db.fetch_val("select tat from telegram_budget") == tat  # no new slot taken


async def test_late_slots_go_at_the_pace_of_the_sends_made_and_a_catch_up_takes_new_slots(
    db: Any, telegram_stub: TelegramStub
) -> None:
    """Jobs back long after their slots (the workers lagged) send on them while the sends the
    bot actually made leave room (migrations/0033): at the bot's pace, every one goes; all at
    once (the workers catching up), a burst's worth goes and the rest take new slots. Before,
    all went at once, however many."""
    from autom.jobs.store import JobStore

    rate = 10.0
    limiter = SendLimiter(db, chat_rate=1.0, global_rate=rate)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n), recipient=None) for n in range(30)]
    claims = {c.id: c for c in await store.claim(30)}
    await db.execute("update telegram_budget set tat = clock_timestamp() + interval '5 seconds'")
    for n, job_id in enumerate(ids):  # the budget is spent: each reserves its slot
        with pytest.raises(Defer):
            await limiter.acquire(100 + n, job=claims[job_id])
    # the workers lag: every slot passed half a minute ago
    await db.execute("update telegram_reservations set slot_at = slot_at - interval '40 seconds'")
    await db.execute("update telegram_chats set next_send_at = next_send_at - interval '40 seconds'")
    for n, job_id in enumerate(ids[:10]):  # back at the bot's pace (or slower): each sends on its slot
        await limiter.acquire(100 + n, job=claims[job_id])
        await trio.sleep(1 / rate)
    sent, held = 0, []
    started = trio.current_time()
    for n, job_id in enumerate(ids[10:], start=10):  # all at once
        try:
            await limiter.acquire(100 + n, job=claims[job_id])
            sent += 1
        except Defer as exc:
            held.append(str(exc))
    # at most a burst, and what the rate refills while they ask (a few ms; a loaded machine's more)
    allowed = int(rate * (1 + trio.current_time() - started)) + 1
    assert sent <= allowed, (sent, held)
    assert len(held) == 20 - sent, held  # each given the next slot (here behind the budget's end)
    assert await db.fetch_val("select count(*) from telegram_reservations where slot_at > now()") == len(held)


async def test_a_late_slot_keeps_the_chats_interval_from_its_last_send_made(db: Any) -> None:
    """Two jobs of one chat (not the chat's line) reserve its next two slots, one interval
    apart; the first comes back late (its worker lagged) and sends then. The second, on time
    for its own slot, would reach the chat sooner than the interval after the first: it
    waits the rest of that interval, keeping its slot, and a new send to the chat waits too
    (migrations/0038). Before, the second went on its slot: a strict per-chat limit said 429
    (one in ten minutes in bench/sustained.py at 366 deliveries/s)."""
    from autom.jobs.store import JobStore

    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    store = JobStore(db, lease_seconds=30)
    ids = [await _job(db, str(n), recipient=None) for n in range(3)]
    claims = {c.id: c for c in await store.claim(3)}
    first, second, opener = (claims[i] for i in ids)
    await limiter.acquire(42, job=opener)  # the chat's last send: now
    slots = []
    for job in (first, second):  # each reserves the chat's next slot: ~1 s and ~2 s ahead
        with pytest.raises(Defer) as reserved:
            await limiter.acquire(42, job=job)
        slots.append(reserved.value.after)
    assert 0.9 < slots[0] <= 1.0 and 1.9 < slots[1] <= 2.0
    # time passes: the first's slot came a second ago (it was not run then), the second's now
    shift = "interval '2 seconds'"
    await db.execute(f"update telegram_reservations set slot_at = slot_at - {shift}")
    await db.execute(f"update telegram_chats set next_send_at = next_send_at - {shift},"
                     f" sent_next_at = sent_next_at - {shift}")
    await limiter.acquire(42, job=first)  # late, on its slot: it sends now
    with pytest.raises(Defer) as held:
        await limiter.acquire(42, job=second)  # its slot is now, but the chat's last send just went
    assert 0.9 < held.value.after <= 1.0, held.value.after
    assert await db.fetch_val("select count(*) from telegram_reservations where job_id = %s", [second.id]) == 1
    with pytest.raises(Defer) as fresh:  # a send without a reservation also keeps the interval
        await limiter.acquire(42)
    assert fresh.value.after > 0.9
    # a second later the second sends on its kept slot, without taking more of the budget
    await db.execute("update telegram_reservations set slot_at = slot_at - interval '1 second'")
    await db.execute("update telegram_chats set sent_next_at = sent_next_at - interval '1 second'")
    tat = await db.fetch_val("select tat from telegram_budget")
    await limiter.acquire(42, job=second)
    assert await db.fetch_val("select tat from telegram_budget") == tat
    assert await db.fetch_val("select count(*) from telegram_reservations") == 0


async def test_the_chats_interval_counts_from_telegrams_answer_to_a_send(
    db: Any, telegram_stub: TelegramStub
) -> None:
    """A send reaches Telegram some time after its take (a busy process); the chat's next
    message keeps the interval from Telegram's answer (``SendLimiter.sent``), so two sends
    taken an interval apart cannot arrive closer than it."""
    limiter = SendLimiter(db, chat_rate=1.0, global_rate=30.0)
    await limiter.acquire(42)  # taken now; the send goes half a second later
    await trio.sleep(0.5)
    await limiter.sent(42)
    with pytest.raises(Defer) as waited:
        await limiter.acquire(42)
    assert waited.value.after > 0.6, waited.value.after  # from the take alone: at most 0.5
    # the client records it after each message it sent, and after an edit: Telegram answers
    # 0.6 s after the take here, and the chat's next message is a second after the answer
    telegram_stub.plan("sendMessage", [Reply(delay=0.6)], chat_id=7)
    telegram_stub.plan("editMessageText", [Reply(delay=0.6)], chat_id=7)
    gap = "extract(epoch from sent_next_at - clock_timestamp())"
    client = _client(telegram_stub.url, limiter)
    try:
        await client.send_message(7, "hello")
        after_send = await db.fetch_val(f"select {gap} from telegram_chats where chat_id = '7'")
        await db.execute("update telegram_chats set next_send_at = now(), sent_next_at = now() where chat_id = '7'")
        await client.edit_message(7, 1, "edited")
        after_edit = await db.fetch_val(f"select {gap} from telegram_chats where chat_id = '7'")
    finally:
        await client.aclose()
    assert after_send > 0.55 and after_edit > 0.55, (after_send, after_edit)  # from the take: at most 0.4
    await limiter.sent(99)  # a chat without a row: nothing to record, no error
