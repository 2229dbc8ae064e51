"""The intake and the completion do not wait on each other (issue 26).

Under sustained load the intake's batch stores a chat's next update in the instant the
completer marks that chat's last job done. When the completion's statement also
retired the chat's recipient row (its line was empty), the intake's upsert of that row
waited for the completion's transaction to end, and the completion could itself be
waiting for the previous batch's durable commit: the sender's answer had a tail of up
to a second (bench/RESULTS.md, "The sender's tail").

Here a completion of each chat's job is held open on a connection of its own, as the
completer sends it (one statement of its own transaction) and as a handler's
transaction ends (``complete_in``), while new updates from the same chats are posted
for real: every one is answered 202 while the completion's transaction is still open.
The bound is a hang guard only: had the intake waited for the completion, it would have
answered 503 at its deadline (``DELIVERY_SECONDS``) instead. After the completion
commits (and the completer's retire ran), each chat's new job is due and claimed.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from autom.db.queries import Q
from autom.jobs.models import Job
from autom.jobs.store import JobStore, _claims
from tests.support.http_app import TELEGRAM_SECRET, running_app
from tests.support.queue import complete_in
from tests.support.service import post_telegram, telegram_update

CHATS = [101, 102, 103, 104, 105, 106]

#: a hang guard, far above any answer: the intake answers by its deadline (10 s) whatever happens
HANG_SECONDS = 60


async def post_all(client: Any, first_update: int) -> list[int]:
    """Post one update per chat at once (one or more batches of the intake); their statuses."""
    statuses: dict[int, int] = {}

    async def one(i: int, chat: int) -> None:
        response = await post_telegram(client, telegram_update(first_update + i, chat, "hello"), TELEGRAM_SECRET)
        statuses[chat] = response.status_code

    async with trio.open_nursery() as nursery:
        for i, chat in enumerate(CHATS):
            nursery.start_soon(one, i, chat)
    return [statuses[chat] for chat in CHATS]


async def complete_in_tx(store: JobStore, tx: Any, jobs: list[Job], how: str) -> int:
    """Mark ``jobs`` done inside ``tx``: as the completer's statement, or as handlers' transactions end."""
    if how == "completer":
        rows = await tx.fetch_all(Q.complete_many, {**_claims(jobs), "durable": False, "claimant": None, "upto": 0})
        return len(rows)
    return sum([await complete_in(store, tx, job) for job in jobs])


@pytest.mark.parametrize("how", ["completer", "handler_transaction"])
async def test_deliveries_are_answered_while_a_completion_of_their_chats_is_open(db: Any, how: str) -> None:
    async with running_app(db) as app:
        store = app.deps.store
        assert await post_all(app.client, 1000) == [202] * len(CHATS)
        claimed = await store.claim(len(CHATS))
        assert sorted(int(j.recipient or 0) for j in claimed) == CHATS  # one job per chat, each line now empty

        with trio.fail_after(HANG_SECONDS):
            async with db.transaction() as tx:
                assert await complete_in_tx(store, tx, claimed, how) == len(CHATS)
                # the completion is open: each chat's next update is stored and answered all the same
                assert await post_all(app.client, 2000) == [202] * len(CHATS)
                open_still = await tx.fetch_all("select txid_current_if_assigned() is not null as open")
                assert open_still[0]["open"]

        # committed: what the completer does next (retire the lines it left empty) keeps the new jobs due
        await store.db.execute(Q.retire_lines, {"recipients": [str(c) for c in CHATS]})
        again = await store.claim(len(CHATS) * 2)
        assert sorted(int(j.recipient or 0) for j in again) == CHATS
        assert {j.id for j in again}.isdisjoint(j.id for j in claimed)
