"""``HandlerContext``: everything a handler may use, one per run of a job (README, Handlers).

What ``enqueue`` inserts, ``cancel`` changes and ``transaction()`` blocks write
commit in one transaction with the fenced update that marks the job done; nothing
of it if the handler raises, times out or lost its lease (``autom.jobs.handler_tx``).
``once(key)`` holds its key while its block runs and records it at the block's clean
exit with what the block wrote and enqueued, retried through database outages until
it commits or the lease is known lost (docs/design/once.md). The context is made on
the worker's hot path: a few fields, no I/O until a method is used.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import trio

from autom import tracing
from autom.checks import check as _check
from autom.db.queries import Q
from autom.errors import DatabaseUnavailable, LeaseLost, PermanentError, QueryError, TransientError
from autom.jobs.handler_tx import HandlerTransaction
from autom.jobs.models import Job
from autom.origin import STREAMED, OriginTransport, environment_has_proxy
from autom.producer import new_job
from autom.sources.base import key_text

if TYPE_CHECKING:
    from autom.app import Registry
    from autom.config import Settings
    from autom.db.bridge import Database, Tx
    from autom.telegram import TelegramClient
    from autom.worker.run import Run

#: how long one try at recording a ``once`` key (or releasing it) may take before it is tried again
ONCE_TRY_SECONDS = 5.0
#: how long a run waits between looks at a key another live run holds (doubling up to ONCE_WAIT_MAX_SECONDS)
ONCE_WAIT_SECONDS = 0.02
ONCE_WAIT_MAX_SECONDS = 0.5

log = logging.getLogger("autom.once")

#: the ``once`` block the current task is in (its transaction takes the block's writes and follow-ups)
_IN_ONCE: ContextVar[HandlerTransaction | None] = ContextVar("autom_once_block", default=None)


class BoundedHTTP(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose every request has a total deadline (HTTP_TIMEOUT_SECONDS).

    httpx's own timeouts bound each socket operation, not the request: a server that
    trickles its answer passes them (ARCHITECTURE.md). ``send`` (which ``get``,
    ``post``... all go through) is wrapped in ``trio.fail_after``; past the deadline the
    request raises ``httpx.TimeoutException`` (a transient failure for the queue). For
    ``stream=True`` requests the deadline covers the answer's headers only.

    The exchanges go through ``autom.origin.OriginTransport`` (less CPU a request:
    docs/design/http.md); httpx's own transport stays for what that one leaves to it
    (streamed requests, upgrades, a request's own ``timeout=``: see the class), when the
    environment names a proxy, and when the caller gives ``transport``, ``verify``,
    ``cert``, ``http2``, ``limits``, ``proxy``, ``mounts`` or ``trust_env``.
    """

    def __init__(self, *, deadline: float, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", httpx.Timeout(deadline))
        own = {"transport", "verify", "cert", "http2", "limits", "proxy", "mounts", "trust_env"}
        if not own & kwargs.keys() and not environment_has_proxy():
            kwargs["transport"] = OriginTransport(httpx.AsyncHTTPTransport(), timeout=deadline)
        super().__init__(**kwargs)
        self.deadline = deadline
        tracing.instrument_http(self)  # client spans, traceparent sent on (when tracing is on)

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        """Send ``request`` within ``deadline`` seconds in total."""
        if kwargs.get("stream"):
            request.extensions[STREAMED] = True  # read as it comes: httpx's own transport
        try:
            with trio.fail_after(self.deadline):
                return await super().send(request, **kwargs)
        except trio.TooSlowError:
            pass
        # raised outside the except block: the message has no URL (it may carry a token)
        raise httpx.TimeoutException(
            f"{request.method} {request.url.host}: no complete answer within {self.deadline:g} s "
            "(HTTP_TIMEOUT_SECONDS)", request=request)


class _JobLog(logging.LoggerAdapter[logging.Logger]):
    """A logger that adds the job's id, kind and attempt to every line (and keeps the caller's extra);
    with a run, each line at info or above (debug: when enabled) is kept with its attempt too
    (``Run.log``), also when LOG_LEVEL leaves it out of the process's log."""

    def __init__(self, logger: logging.Logger, extra: Mapping[str, object], run: Run | None) -> None:
        super().__init__(logger, extra)
        self._run = run

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Log as ``LoggerAdapter.log`` does, and keep the line with the run's attempt."""
        run = self._run
        if run is not None and (level >= logging.INFO or self.isEnabledFor(level)):
            from autom.worker.tracebacks import RunLog

            if run.log is None:
                run.log = RunLog()
            try:
                text = str(msg) % args if args else str(msg)
            except Exception:  # a bad format: logging reports it; keep the raw message
                text = str(msg)
            run.log.add(logging.getLevelName(level).lower(), text)
        super().log(level, msg, *args, **kwargs)


class Services:
    """What every run of one worker pool shares: built once by the service."""

    __slots__ = ("db", "http", "registry", "settings", "telegram")

    def __init__(self, *, settings: Settings, db: Database, telegram: TelegramClient,
                 http: httpx.AsyncClient | None, registry: Registry) -> None:
        self.settings = settings
        self.db = db
        self.telegram = telegram
        self.http = http
        self.registry = registry


class RunState:
    """The mutable part of one run: its transaction (what it wrote and enqueued) and its claim."""

    __slots__ = ("complete", "db", "run", "telegram", "tx")

    def __init__(self, db: Database, complete: Callable[[Tx], Awaitable[None]], run: Run | None = None) -> None:
        self.db = db
        #: the claim's fenced "done" inside a transaction (``Run.complete_in``)
        self.complete = complete
        #: the claim (its local deadline bounds ``HandlerContext.deadline``)
        self.run = run
        self.tx: HandlerTransaction | None = None
        #: the Telegram client bound to this run's claim (``TelegramClient.for_job``), once used
        self.telegram: TelegramClient | None = None

    @property
    def needs_transaction(self) -> bool:
        """Whether the run's outcome must be written in its own transaction (not the batched "done")."""
        return self.tx is not None and self.tx.opened

    def current_tx(self) -> HandlerTransaction:
        """The transaction the handler's writes go to: its ``once`` block's, else the run's."""
        block = _IN_ONCE.get()
        if block is not None:
            return block
        if self.tx is None:
            self.tx = HandlerTransaction(self.db)
        return self.tx

    async def commit(self) -> None:
        """Commit what the handler enqueued and wrote with its job's "done" (``LeaseLost``: none of it)."""
        if self.tx is None:
            self.tx = HandlerTransaction(self.db)
        await self.tx.commit(self.complete)


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler may use while it runs one job (see the module docstring)."""

    job: Job
    _services: Services
    _state: RunState

    # -- the job and its services -------------------------------------------------------

    @property
    def telegram(self) -> TelegramClient:
        """The Bot API client: ``send_message(chat_id, text, buttons=...)``, ``edit_message(chat_id,
        message_id, text, buttons=...)``, ``answer_callback(callback_id, text)`` (Retry / PermanentError /
        TransientError on failure, within HTTP_TIMEOUT_SECONDS and Telegram's rate limits; ``ChatBlocked``
        ends the job cancelled). Bound to this run's claim: a split text resumes where a
        previous run of the job left it."""
        state = self._state
        bound = state.telegram
        if bound is None:
            bound = state.telegram = self._services.telegram.for_job(self.job)
        return bound

    @property
    def http(self) -> httpx.AsyncClient:
        """A shared ``httpx.AsyncClient``; each request is bounded by HTTP_TIMEOUT_SECONDS in total."""
        http = self._services.http
        if http is None:
            raise RuntimeError("this service was built without an HTTP client (Deps.http)")
        return http

    @property
    def settings(self) -> Settings:
        """The service's settings."""
        return self._services.settings

    @property
    def db(self) -> Database:
        """The service's database, outside the job's transaction (built-in maintenance handlers use it;
        a handler's own writes belong in ``transaction()``, which commits with the job)."""
        return self._services.db

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger (``autom.handlers.<kind>``) whose lines carry the job's id, kind and attempt; the
        first lines it logs are kept with the attempt (``attempt_log[].log``: GET /admin/jobs/{id})."""
        job = self.job
        return _JobLog(logging.getLogger(f"autom.handlers.{job.kind}"),
                       {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}, self._state.run)

    @property
    def deadline(self) -> float:
        """When this run must be over, on trio's clock (compare with ``trio.current_time()``).

        The earliest of the kind's ``timeout``, the lease (moved on by each renewal) and
        the shutdown grace: the effective deadline of the handler's task; ``inf`` when
        nothing bounds it. Read it where the handler runs.
        """
        deadline = trio.current_effective_deadline()
        run = self._state.run
        # the lease's local deadline is the run's, not a cancel scope's (autom/worker/run.py)
        return deadline if run is None else min(deadline, run.deadline)

    # -- outcomes of external calls -------------------------------------------------------

    def check(self, response: httpx.Response) -> None:
        """Return if ``response`` is a 2xx; else raise what the queue should do.

        429 → ``Retry`` (after its Retry-After); another 4xx → ``PermanentError`` (the job
        fails for good); 5xx and anything else → ``TransientError`` (retried with backoff).
        The message names the method and host, never the URL.
        """
        request = response.request
        _check(response, f"HTTP {request.method} {request.url.host}")

    def idempotency_key(self, name: str) -> str:
        """A key for an external API's idempotency header, stable for this job across its retries.

        ``autom-<job id>-<name>``: a retry (or a rerun after a crash) sends the same key, so
        the other side recognises the repeat; another job gets another key.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError("ctx.idempotency_key needs a non-empty name")
        return f"autom-{self.job.id}-{name.strip()}"

    # -- follow-up jobs -----------------------------------------------------------------

    async def enqueue(
        self,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        recipient: str | int | None = None,
        run_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
    ) -> int | None:
        """Enqueue a job of ``kind``, committed when this job completes (or with its ``once`` block).

        Returns the new job's id, or None when a job of ``kind`` with ``key`` exists (then
        nothing is created). Nothing is written if this run raises, times out or loses its
        lease. ``key``: created once per kind and key. ``recipient``: the FIFO group (a chat id: one at a time,
        in order). ``run_at``: an aware datetime, or a delay. ``max_attempts``: default
        the kind's. Raises ``PermanentError`` at the call for a kind no handler serves, a
        payload that is not a JSON object of JSON values, a naive ``run_at`` or a
        ``max_attempts`` that is not a whole number ≥ 1 (``autom.producer.new_job``).
        """
        spec = self._services.registry.handlers.get(kind)
        if spec is None:
            raise PermanentError(f"ctx.enqueue: no handler is registered for kind {kind!r}")
        if isinstance(run_at, timedelta):
            run_at = datetime.now().astimezone() + run_at
        try:
            job = new_job(kind, payload, key=key, recipient=recipient, run_at=run_at, max_attempts=max_attempts)
        except (TypeError, ValueError) as exc:
            raise PermanentError(f"ctx.enqueue({kind!r}): {exc}") from None
        return await self._state.current_tx().enqueue(dataclasses.replace(
            job, max_attempts=spec.max_attempts if max_attempts is None else max_attempts, trace=tracing.traceparent(),
        ))

    async def cancel(self, kind: str, key: str) -> bool:
        """Cancel the pending job of ``kind`` with ``key`` when this job completes (or with its ``once`` block).

        Returns whether one was pending (also one waiting for its retry). Committed with
        this job's "done", fenced by its lease: nothing changes if this run raises, times
        out or lost its lease. The cancelled job never runs and raises no alert; until
        this job completes no worker can claim it. Running, done or failed jobs are left alone.
        """
        if not isinstance(kind, str) or not kind:
            raise ValueError("ctx.cancel needs a kind")
        if not isinstance(key, str) or not key.strip():
            raise ValueError("ctx.cancel needs a non-empty key")
        cancelled = await self._state.current_tx().fetch_val(Q.ctx_cancel, {"kind": kind, "key": key_text(key)})
        return bool(cancelled)

    # -- writes committed with the job ----------------------------------------------------

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """A block of writes that commits with this job's completion, or inside a ``once``
        block with that block's key (a savepoint in the transaction).

        ``async with ctx.transaction() as tx: await tx.execute(sql, params)``; ``tx`` has
        ``execute``, ``fetch_all``, ``fetch_one`` and ``fetch_val``. A block that raises
        undoes its own writes; a handler that raises (or loses its lease) commits none. The
        transaction holds a database connection from its first block until the job is completed.
        """
        async with self._state.current_tx().block() as tx:
            yield tx

    # -- side effects done once -----------------------------------------------------------

    @asynccontextmanager
    async def once(self, key: str) -> AsyncIterator[bool]:
        """``async with ctx.once(key) as todo``: ``todo`` is True until a block that got True exits cleanly.

        Exclusive: while a run is inside a block for ``key`` (and its claim is live),
        another run entering ``key`` waits, then gets False if the first exited cleanly.
        At a clean exit the key is recorded at once, in one transaction with what the
        block wrote through ``transaction()`` and enqueued, fenced by this run's lease;
        every later run of any job gets False. Recording is retried through database
        outages until it commits or the lease is known lost (``LeaseLost``). A block
        that raises records nothing and frees the key. Blocks do not nest. Keys longer
        than 200 characters are stored as their SHA-256.
        """
        if not isinstance(key, str) or not key.strip():
            raise ValueError("ctx.once needs a non-empty key")
        if _IN_ONCE.get() is not None:
            raise RuntimeError(f"ctx.once({key!r}): once blocks do not nest")
        stored = key_text(key)
        assert stored is not None
        job = self.job
        db = self._services.db
        params = {"key": stored, "job_id": job.id, "lease": job.lease}
        if not await _enter_once(db, params):
            yield False
            return
        block = HandlerTransaction(db, patience=self.settings.job_lease_seconds)
        token = _IN_ONCE.set(block)
        clean = False
        try:
            yield True
            clean = True
        finally:
            _IN_ONCE.reset(token)
            if not clean:
                # it raised or was cancelled: nothing it wrote commits, and the key is free again
                with trio.CancelScope(shield=True):
                    await _release_once(block, db, params)
        await _record_once(block, db, params, self.settings.job_lease_seconds)


async def _enter_once(db: Database, params: dict[str, Any]) -> bool:
    """Enter the key's block (True), or see it done (False); wait while another live claim holds it."""
    pause = ONCE_WAIT_SECONDS
    while True:
        row = await db.fetch_one(Q.once_enter, params)
        assert row is not None
        if not row["held"]:
            raise LeaseLost(f"ctx.once({params['key']!r}): this run's claim is no longer held; the effect was "
                            "not started")
        if row["entered"]:
            return True
        if row["state"] == "done":
            return False
        # held by a live claim (or changed under the statement's snapshot): look again soon
        await trio.sleep(pause)
        pause = min(ONCE_WAIT_MAX_SECONDS, pause * 2)


async def _release_once(block: HandlerTransaction, db: Database, params: dict[str, Any]) -> None:
    """Abandon the block's transaction and free its key (bounded; a key left held is taken over
    by the next run once this claim is no longer live)."""
    with trio.move_on_after(ONCE_TRY_SECONDS):
        await block.abandon()
    with trio.move_on_after(ONCE_TRY_SECONDS):
        try:
            await db.execute(Q.once_release, params)
        except (DatabaseUnavailable, QueryError) as exc:
            log.warning("ctx.once(%s): could not free the key (%s); the next run takes it over",
                        params["key"], exc)


def _retryable(exc: Exception) -> bool:
    return isinstance(exc, DatabaseUnavailable) or (isinstance(exc, QueryError) and exc.transient)


async def _record_once(block: HandlerTransaction, db: Database, params: dict[str, Any],
                       lease_seconds: float) -> None:
    """Record the key done with the block's writes and follow-ups; durable and fenced.

    Shielded: the effect happened, so its record must not be lost to a timeout or a
    shutdown. Tried again (each try bounded) until it commits, the key is found taken
    over (``LeaseLost``), or ``lease_seconds`` have passed: an outage shorter than the
    lease never repeats the effect. A transaction lost before its commit cannot be
    tried again (its writes are gone): the key is freed and the run fails.
    """
    with trio.CancelScope(shield=True):
        give_up = trio.current_time() + max(lease_seconds, ONCE_TRY_SECONDS)
        pause = 0.05
        wrote = block.opened
        while True:
            row: dict[str, Any] | None = None
            try:
                with trio.fail_after(ONCE_TRY_SECONDS):
                    if block.opened:
                        async def done_in(tx: Tx) -> None:
                            nonlocal row
                            row = await tx.fetch_one(Q.once_done, params)
                            if not row or not row["recorded"]:
                                raise LeaseLost("taken over")
                        await block.commit(done_in)
                    elif wrote:
                        # its transaction was lost at commit: committed or not? (it cannot be redone)
                        row = await db.fetch_one(Q.once_state, params)
                    else:
                        row = await db.fetch_one(Q.once_done, params)
            except LeaseLost:
                await _release_once(block, db, params)
                raise LeaseLost(f"ctx.once({params['key']!r}): the effect ran but this run's claim was lost "
                                "before it was recorded") from None
            except Exception as exc:
                if not (isinstance(exc, trio.TooSlowError) or _retryable(exc)):
                    await _release_once(block, db, params)
                    raise
                with trio.move_on_after(ONCE_TRY_SECONDS):
                    await block.abandon()
                if trio.current_time() >= give_up:
                    raise TransientError(f"ctx.once({params['key']!r}): the effect ran but its record could not "
                                         f"be written within {lease_seconds:g} s ({exc})") from None
                log.warning("ctx.once(%s): recording the key failed (%s); trying again", params["key"], exc)
                await trio.sleep(pause)
                pause = min(1.0, pause * 2)
                continue
            if row and (row.get("recorded") or row.get("state") == "done"):
                return
            if wrote:
                # its transaction was lost before it committed: its writes are gone, so the key is not
                # recorded without them (both or neither); the key is freed and the run fails
                await _release_once(block, db, params)
                raise TransientError(f"ctx.once({params['key']!r}): the block's writes were lost with its database "
                                     "connection before they committed; nothing of the block is recorded")
            raise LeaseLost(f"ctx.once({params['key']!r}): the effect ran but this run's claim was lost "
                            "before it was recorded")


def new_context(run: Run, services: Services) -> HandlerContext:
    """The context of one run (the worker's hot path: no I/O)."""
    return HandlerContext(run.job, services, RunState(services.db, run.complete_in, run))
