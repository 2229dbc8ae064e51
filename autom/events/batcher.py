"""``StoreBatcher``: group commit of webhook deliveries, each answered by its deadline.

``deliver`` stores one delivery (the event, its jobs, their recipients' rows) in one
statement, batched with the deliveries that arrive meanwhile; with a ``HandOff`` a lone
delivery's job is stored claimed and given to this process's idle workers. Invariant:
a delivery's answer says what was committed (``Stored``, a 202) or that nothing was, or
may be, stored (``DatabaseUnavailable``, a 503). How and why: docs/design/intake.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import trio

# trio.testing's own function, from where it lives: importing trio.testing imports pytest when it
# is installed (0.1 s of every start; tests/unit/test_import_cost.py)
from trio._core import wait_all_tasks_blocked

from autom.db.bridge import Database
from autom.db.native import stop_by
from autom.db.queries import Q
from autom.errors import DatabaseUnavailable
from autom.events.commits import committed
from autom.events.encode import batch_items, delivery_size
from autom.events.handoff import HandOff, hand, handed_job

# the intake's logger: these lines are about deliveries, and operators already filter on it
log = logging.getLogger("autom.intake")

#: Most deliveries stored by one hop (a batch waits for the one in flight, so it holds
#: about as many as arrived meanwhile: up to the number of concurrent senders).
MAX_BATCH = 64
#: Most bytes of encoded deliveries in one hop (at least one delivery, however large): 64
#: bodies of 1 MiB made one parameter of 105 MB that the database had to parse at once.
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Longest a hop's leader waits for the event loop to have nothing else to do before it
#: starts the hop (``StoreBatcher``): the deliveries the loop is working on then join it.
GATHER_SECONDS = 0.002
#: The part of a delivery's deadline kept for learning what its hop did: the hop is cut off
#: (cancelled on the server) this long before its earliest delivery's deadline, and a server
#: that gets to the statement only after the cut-off stores nothing (``StoreBatcher``). The
#: cancel's answer gets ``CANCEL_SECONDS`` of it, the commit record the rest.
FATE_SECONDS = 2.0
#: Longest a cut-off hop waits for its cancelled statement to stop before it closes the connection.
CANCEL_SECONDS = 1.0
#: Least time before its hop's cut-off a delivery must have to be sent at all: one with less
#: (it waited behind a stuck hop) gets its 503 at once, nothing of it sent.
MIN_HOP_SECONDS = 0.5
#: Longest a hop may take when its deliveries have no deadline (``store``'s default).
BATCH_HOP_SECONDS = 10.0


#: Why a delivery got its 503: it waited for a hop until too late to be sent (nothing was sent);
#: the server got to its hop only after the cut-off (nothing stored); no answer by its deadline.
WAITED = "the delivery waited for the database until its deadline"
TOO_LATE = "the database got to the delivery only after its cut-off: nothing stored"
UNANSWERED = ("the database did not answer by the delivery's deadline (stored only if the server had started"
              " it before the cut-off)")

#: What ``StoreBatcher.deliver`` may wait on besides its turn: returns once the sender is gone.
Gone = Callable[[], Awaitable[object]]
#: Or, cheaper, a check without waiting: whether the sender has gone (``StoreBatcher.deliver``).
Left = Callable[[], bool]


class SenderGone(Exception):
    """``StoreBatcher.deliver``: the sender disconnected while its delivery waited.

    ``sent``: the delivery's hop was in flight already, so it is stored all the same
    (nobody hears of it); otherwise it left the queue and nothing of it was stored.
    """

    def __init__(self, sent: bool) -> None:
        super().__init__("the sender disconnected before its answer")
        self.sent = sent


class Stored(NamedTuple):
    """What storing one delivery did: the new event (None for a redelivery), the jobs it made,
    and how many of them were handed off to this process's workers (``HandOff``)."""

    event_id: int | None
    jobs: int
    handed: int = 0


#: how a ``_Delivery.wait`` ended
WOKEN, DEADLINE, GONE = 0, 1, 2


class _Delivery:
    """One delivery waiting in a ``StoreBatcher``: its parameters, then its outcome."""

    __slots__ = ("_event", "_waiting", "alone", "deadline", "departed", "error", "expired", "lead", "left",
                 "outcome", "params", "send_by", "taken", "woken")

    def __init__(self, params: dict[str, Any], deadline: float, left: Left | None = None) -> None:
        self.params = params
        self.deadline = deadline  # trio time by which its sender is to have an answer
        self.send_by = deadline - FATE_SECONDS - MIN_HOP_SECONDS  # the last moment a hop may take it
        self.left = left  # whether its sender has gone (checked when a hop would take it)
        self.woken = False  # its batch is over, or it is to lead the next one, or it departed
        self._waiting: trio.CancelScope | None = None  # its wait on ``gone``, cancelled to wake it
        self._event: trio.Event | None = None  # or its wait on this, set to wake it
        self.lead = False  # it runs the next hop (for everyone queued)
        self.taken = False  # it is in a batch (in flight or done)
        self.departed = False  # its sender had gone when a hop would have taken it: withdrawn
        self.expired = False  # its ``send_by`` had passed when a hop would have taken it: 503, not sent
        self.alone = False  # its batch failed: it is to be stored on its own
        self.outcome: Stored | None = None
        self.error: BaseException | None = None

    def wake(self) -> None:
        """Its batch is over, or it is to lead the next one, or it departed: end its ``wait``."""
        self.woken = True
        if self._event is not None:
            self._event.set()
        elif self._waiting is not None:
            self._waiting.cancel()

    async def wait(self, gone: Gone | None, deadline: float) -> int:
        """Until woken (``WOKEN``), ``deadline`` (``DEADLINE``) or ``gone`` returns: its sender left (``GONE``).

        Without ``gone`` the wait is on an ``Event``. With it, the request's own task
        waits on its sender's channel (``gone``), and waking cancels that wait (no task
        per delivery). A delivery whose sender can be checked without waiting (``left``)
        waits on the Event, the cheaper of the two, and is checked when a hop would take
        it (``StoreBatcher._lead``). The costs: docs/design/intake.md, "What a delivery costs".
        """
        if self.woken:
            await trio.lowlevel.checkpoint()
            return WOKEN
        with trio.CancelScope(deadline=deadline) as scope:
            if gone is None:
                self._event = event = trio.Event()
                try:
                    await event.wait()
                finally:
                    self._event = None
            else:
                self._waiting = scope
                try:
                    await gone()
                finally:
                    self._waiting = None
        if self.woken:
            return WOKEN
        return DEADLINE if scope.cancelled_caught else GONE


class StoreBatcher:
    """Group commit of deliveries: one hop at a time, taking every delivery queued meanwhile.

    One hop at a time: a batch holds its recipients' row locks until it commits, and
    two batches taking them in different orders could deadlock (docs/design/intake.md).

    ``await deliver(params, deadline)`` returns ``Stored`` once the delivery is
    committed (event None for a redelivery), or raises (``DatabaseUnavailable``
    for a 503). No task of its own: the first delivery to find no hop in flight runs
    one for everything queued (the *leader*); when it ends, the first delivery still
    queued is woken to lead the next. A delivery whose sender disconnects while it
    waits (``gone`` returns, or ``left`` says so when a hop would take it:
    ``SenderGone``) or whose request is cancelled leaves the queue (nothing stored)
    unless its batch is already in flight: then it is stored all the same, nobody
    hearing of it.

    The ``deadline`` (trio time) is when the sender is to have its answer. A hop is cut
    off ``FATE_SECONDS`` before the earliest deadline of its deliveries (at most
    ``BATCH_HOP_SECONDS`` after it starts): cancelled on the server, and refused by it
    if it gets to the statement only after the cut-off (the statement compares the
    cut-off, on the server's clock as the last hop's answer showed it, with
    ``clock_timestamp()``; the first hop of a batcher has no cut-off on the server).
    Its commit record then tells whether it committed all the same (``_settle``): its
    deliveries get their outcome if so, ``DatabaseUnavailable`` if not, or if the
    database cannot tell by the deadline (then nothing was stored unless the server had
    started the statement before the cut-off). A delivery that has not been taken by a
    hop ``MIN_HOP_SECONDS`` before the cut-off it would get leaves the queue with
    ``DatabaseUnavailable`` (nothing was sent to the database). So every answer comes
    by the deadline.

    A leader does not start its hop at once: it first waits, at most ``gather``
    seconds (``GATHER_SECONDS``), until the event loop has nothing else to do, so the
    deliveries the loop is still reading, verifying and parsing join this hop instead
    of queueing behind it (without it senders moved in a convoy: docs/design/intake.md).
    A lone delivery on an idle process waits only for one turn of the loop.
    """

    def __init__(self, db: Database, max_batch: int = MAX_BATCH, max_bytes: int = MAX_BATCH_BYTES,
                 gather: float = GATHER_SECONDS, handoff: HandOff | None = None) -> None:
        """Store through ``db``, at most ``max_batch`` deliveries and ``max_bytes`` per hop; a hop's
        leader waits at most ``gather`` seconds for the event loop to go idle (0: it does not wait).
        ``handoff``: the worker pool a lone delivery's job may be handed to (module docstring)."""
        self._db = db
        self._handoff = handoff
        self._max_batch = max_batch
        self._max_bytes = max_bytes
        self._gather = gather
        self._queue: list[_Delivery] = []
        #: the server's clock minus trio's (seconds), from the last hop's answer (``_until``)
        self._clock: float | None = None
        self._busy = False  # a hop is in flight, or a leader has been woken to run one
        #: hops run so far (a batch of many is one hop)
        self.hops_run = 0

    @property
    def queued(self) -> int:
        """Deliveries waiting for a hop (not counting those in a hop in flight)."""
        return len(self._queue)

    async def deliver(self, params: dict[str, Any], deadline: float = math.inf,
                      gone: Gone | None = None, left: Left | None = None) -> Stored:
        """Store one delivery (``store_params``) by about ``deadline`` (trio time); see the class docstring.

        Returns ``Stored``: the new event's id (None for a redelivery), the jobs it made, and
        how many of them were handed off to this process's workers. ``gone``: returns once
        the sender has disconnected; a delivery whose sender leaves while it waits raises
        ``SenderGone``. ``left``, instead: says without waiting whether the sender has gone;
        it is asked when a hop would take the delivery (and at its deadline), and a delivery
        whose sender has gone by then raises ``SenderGone`` (not sent). Raises
        ``DatabaseUnavailable`` when it is not stored by the deadline (nothing was stored
        unless the server had started the statement before its cut-off) and ``QueryError``
        when the database refused it.
        """
        delivery = _Delivery(params, deadline, left)
        self._queue.append(delivery)
        try:
            if self._busy:
                ended = await delivery.wait(None if left is not None else gone, delivery.send_by)
                if ended == GONE or delivery.departed:
                    raise SenderGone(sent=delivery.taken)  # withdrawn below unless taken
                if ended == DEADLINE and delivery.taken:
                    await delivery.wait(None, math.inf)  # taken by a hop just then: its answer comes from the hop
                    ended = WOKEN
            else:
                self._busy = True
                delivery.lead = True
                ended = WOKEN
            if delivery.lead and self._gather > 0:
                # let the deliveries the loop is working on right now join this hop;
                # wait_all_tasks_blocked is not only for tests: it returns once no task
                # can run and no I/O is ready (the run loop's own idle check). One scope
                # for the gathering and the delivery's deadline.
                gathered_by = trio.current_time() + self._gather
                with trio.CancelScope(deadline=min(gathered_by, delivery.send_by)) as gathering:
                    await wait_all_tasks_blocked()
                if gathering.cancelled_caught and delivery.send_by < gathered_by:
                    ended = DEADLINE
        except BaseException:
            self._withdraw(delivery)
            raise
        if delivery.lead and ended != DEADLINE:
            await self._lead()
            if delivery.departed:  # it led the hop for the others only
                raise SenderGone(sent=False)
        if ended == DEADLINE or delivery.expired:
            self._withdraw(delivery)
            if left is not None and left():
                raise SenderGone(sent=False)  # nobody to answer the 503
            raise DatabaseUnavailable(WAITED)
        if delivery.alone:
            return await self._store_alone(delivery)
        if delivery.error is not None:
            raise delivery.error
        assert delivery.outcome is not None
        return delivery.outcome

    async def _lead(self) -> None:
        batch: list[_Delivery] = []
        passed, size = 0, 0  # the queue's head that this hop takes or withdraws
        now = trio.current_time()
        for delivery in self._queue:
            if len(batch) == self._max_batch:
                break
            if delivery.left is not None and delivery.left():
                # its sender has gone (``store``'s ``left``): withdrawn, nothing of it is sent
                delivery.departed = True
                delivery.wake()
                passed += 1
                continue
            if delivery.send_by < now:
                # too little time left for a hop and its fate: 503, nothing of it is sent
                delivery.expired = True
                delivery.wake()
                passed += 1
                continue
            size += delivery_size(delivery.params)
            if batch and size > self._max_bytes:
                break  # the rest goes in the next hop
            batch.append(delivery)
            passed += 1
        del self._queue[:passed]
        if not batch:
            self._hand_over()
            return
        for delivery in batch:
            delivery.taken = True
        self.hops_run += 1
        # a hop of one is intake_store with the delivery's own token, a batch's has one of its own
        token = batch[0].params["token"] if len(batch) == 1 else uuid.uuid4().hex
        sent = trio.current_time()  # a job handed off is leased from before its statement was sent
        cut_off = min(sent + BATCH_HOP_SECONDS, min(d.deadline for d in batch) - FATE_SECONDS)
        answer_by = cut_off + FATE_SECONDS
        stopping = stop_by.set(cut_off + CANCEL_SECONDS)
        try:
            with trio.CancelScope(shield=True, deadline=cut_off) as scope:
                await self._hop(batch, token, cut_off, answer_by)
            if scope.cancelled_caught and all(
                    d.outcome is None and d.error is None and not d.alone for d in batch):
                try:
                    stored = await self._settle(token, sent, answer_by)
                except DatabaseUnavailable as exc:  # not stored, or nobody can tell by now: 503 for each
                    for delivery in batch:
                        delivery.error = exc
                else:
                    for delivery, outcome in zip(batch, stored, strict=True):
                        delivery.outcome = outcome
        finally:
            stop_by.reset(stopping)
            for delivery in batch:
                delivery.wake()
            self._hand_over()

    async def _store_alone(self, delivery: _Delivery) -> Stored:
        """A delivery of a failed batch, stored by itself: bounded and settled as a hop is."""
        now = trio.current_time()
        if delivery.send_by < now:
            raise DatabaseUnavailable(WAITED)
        cut_off = min(now + BATCH_HOP_SECONDS, delivery.deadline - FATE_SECONDS)
        answer_by = cut_off + FATE_SECONDS
        stopping = stop_by.set(cut_off + CANCEL_SECONDS)
        try:
            with trio.CancelScope(shield=True, deadline=cut_off):
                return await self._store_one(delivery.params, self._until(cut_off), answer_by)
            (outcome,) = await self._settle(delivery.params["token"], 0.0, answer_by)
            return outcome
        finally:
            stop_by.reset(stopping)

    async def _settle(self, token: str, sent: float, by: float) -> list[Stored]:
        """After a hop was cut off: the outcomes it committed, else DatabaseUnavailable (by ``by``).

        The hop's statement may have committed before the cancel reached the server;
        its commit record tells (``committed``), so a stored delivery gets its 202 (and a
        job it handed off, its statement sent at ``sent``, goes to the pool all the same).
        """
        with trio.CancelScope(shield=True):  # its leader's sender may have left meanwhile
            stored = await committed(self._db, token, by)
            if stored is None:
                raise DatabaseUnavailable(UNANSWERED)
            outcomes = [await self._recorded(record, sent, by) for record in stored]
        return outcomes

    async def _recorded(self, record: Sequence[Any], sent: float, by: float) -> Stored:
        """The outcome a commit record's element tells: ``[pos, event id, jobs]``, and for a
        hand-off hop the handed-off job's ``id, lease`` (NULLs if none), which is then looked
        up (by ``by``) and handed to the pool: it is claimed by this process, whoever else may wait."""
        _pos, event_id, jobs, *handed = record
        if event_id is None:
            return Stored(None, 0)
        if not handed or handed[0] is None or self._handoff is None:
            return Stored(int(event_id), int(jobs))
        count = 0
        with trio.move_on_at(by):  # not readable by then: its lease runs out, it is claimed again
            job = None
            with contextlib.suppress(DatabaseUnavailable):
                row = await self._db.fetch_one(Q.get_job, {"id": int(handed[0])})
                if row is not None and row["lease"] == handed[1] and row["status"] == "running":
                    job = handed_job(row)
            count = await hand(self._handoff, job, sent)
        return Stored(int(event_id), int(jobs), count)

    async def _hop(self, batch: list[_Delivery], token: str, cut_off: float, by: float) -> None:
        """Store ``batch`` in one hop (``token``: its commit record's) that the server may start
        until ``cut_off``; set each one's outcome, error or ``alone`` (a dropped connection
        is settled by ``by``)."""
        until = self._until(cut_off)
        if len(batch) == 1:
            (delivery,) = batch
            handoff = self._handoff
            try:
                if handoff is not None and handoff.ready():
                    delivery.outcome = await self._store_handing_off(delivery.params, handoff, until, by)
                else:
                    delivery.outcome = await self._store_one(delivery.params, until, by)
            except Exception as exc:
                delivery.error = exc
            return
        try:
            rows = await self._db.fetch_all(Q.intake_store_many, {
                "items": batch_items(d.params for d in batch), "token": token, "until": until}, prepare=True)
        except DatabaseUnavailable as exc:
            stored = await committed(self._db, token, by) if exc.maybe_applied else None
            if stored is None:
                for delivery in batch:  # nothing of the batch was stored: 503 for each
                    delivery.error = DatabaseUnavailable(str(exc))
                return
            rows = [{"event_id": r[1], "jobs_created": r[2]} for r in stored]
        except Exception as exc:
            # Nothing of the batch was stored (one transaction). Whatever it was (a deadlock,
            # one delivery PostgreSQL refuses), each delivery gets the answer it would get alone.
            log.warning("a batch of %d deliveries failed (%s: %s); storing them one by one",
                        len(batch), type(exc).__name__, exc)
            for delivery in batch:
                delivery.alone = True
            return
        else:
            self._learn(rows[0]["at"])
            if not rows[0]["go"]:
                for delivery in batch:
                    delivery.error = DatabaseUnavailable(TOO_LATE)
                return
        for delivery, row in zip(batch, rows, strict=True):
            event_id = row["event_id"]
            delivery.outcome = Stored(None, 0) if event_id is None else Stored(int(event_id), int(row["jobs_created"]))

    async def _store_one(self, params: dict[str, Any], until: float | None, by: float) -> Stored:
        """One delivery by itself (``intake_store``; the server may start it until ``until``),
        settled by its commit record (by ``by``) if the connection drops (``_dropped``)."""
        params["until"] = until
        try:
            row = await self._db.fetch_one(Q.intake_store, params, prepare=True)
        except DatabaseUnavailable as exc:
            return await self._dropped(exc, params["token"], by)
        assert row is not None  # one row always
        self._learn(row["at"])
        if not row["go"]:
            raise DatabaseUnavailable(TOO_LATE)
        return Stored(None, 0) if row["id"] is None else Stored(int(row["id"]), int(row["jobs"]))

    async def _dropped(self, exc: DatabaseUnavailable, token: str, by: float, sent: float = 0.0) -> Stored:
        """A lone delivery's statement failed with ``exc``: if it may have committed, what its
        commit record (``token``) tells by ``by`` (``_recorded``, a job it handed off included), else ``exc``."""
        stored = await committed(self._db, token, by) if exc.maybe_applied else None
        if stored is None:
            raise exc
        return await self._recorded(stored[0], sent, by)

    async def _store_handing_off(self, params: dict[str, Any], handoff: HandOff, until: float | None,
                                 by: float) -> Stored:
        """One delivery by itself, its job stored claimed and handed to ``handoff`` when it can
        be (``intake_store_handoff``; docs/design/intake.md); bounded and settled as ``_store_one``."""
        sent = trio.current_time()  # the lease is counted from before the statement is sent
        try:
            row = await self._db.fetch_one(Q.intake_store_handoff, {
                **params, "lease_seconds": handoff.lease_seconds, "until": until}, prepare=True)
        except DatabaseUnavailable as exc:
            return await self._dropped(exc, params["token"], by, sent)
        assert row is not None  # one row always
        self._learn(row["at"])
        if not row["go"]:
            raise DatabaseUnavailable(TOO_LATE)
        if row["event_id"] is None:
            return Stored(None, 0)
        job = handed_job(row, handoff.lease_seconds) if row["id"] is not None else None
        return Stored(int(row["event_id"]), int(row["jobs_created"]), await hand(handoff, job, sent))

    def _learn(self, at: float) -> None:
        """A hop's answer carried the server's clock ``at`` (epoch seconds): the next cut-offs follow it."""
        self._clock = at - trio.current_time()

    def _until(self, cut_off: float) -> float | None:
        """``cut_off`` (trio time) on the server's clock, or None before a hop has shown it."""
        return None if self._clock is None else cut_off + self._clock

    def _hand_over(self) -> None:
        """After a hop: wake the first queued delivery to lead the next one, or go idle."""
        if self._queue:
            leader = self._queue[0]
            leader.lead = True
            leader.wake()
        else:
            self._busy = False

    def _withdraw(self, delivery: _Delivery) -> None:
        """``delivery``'s request stopped waiting (cancelled, or at its deadline, or its sender gone)."""
        if delivery.taken or delivery.departed or delivery.expired:
            return  # its batch is in flight (stored or not, nobody waits for the answer), or it left the queue
        self._queue.remove(delivery)
        if delivery.lead:
            self._hand_over()  # it was woken to lead, and never will
