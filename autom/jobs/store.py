"""``JobStore``: the queue's statements: enqueue, claim, confirm, write outcomes, renew.

Each method is one statement of ``queries.sql`` (``write``: one per group of outcomes),
guarded by state and lease: a claim gives its job a new lease value, and every later
write matches ``(id, lease, status='running')``, so a claim that lost its job changes
nothing. "done" outcomes and the idle path's claim commit asynchronously (a server
crash may lose them, never the fence: the job runs again); the rest commits durably.
Also ``Ahead`` (a pool's start order), ``insert_jobs`` (jobs in a caller's
transaction), ``MAX_DEFER_SECONDS``. Design notes: docs/design/worker.md.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from autom.db.queries import Q
from autom.errors import CancelJob, Defer
from autom.jobs.models import Job, NewJob
from autom.jobs.outcome import DONE, Outcome, Written
from autom.jobs.retry import RetryPolicy, describe, error_text, is_final

if TYPE_CHECKING:
    from autom.db.bridge import Database, Tx

#: Default of MAX_DEFER_SECONDS: how long a job's refused deferrals (Telegram's 429s)
#: may last in a row before it fails for good (``Defer.refused``).
MAX_DEFER_SECONDS = 3600.0

log = logging.getLogger("autom.enqueue")


def _json_safe(value: Any) -> Any:
    """Replace NUL characters, which PostgreSQL's jsonb cannot store, with U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def jobs_json(jobs: Sequence[NewJob]) -> str:
    """``jobs`` as the JSON array ``autom_enqueue`` takes (one text parameter: psycopg
    adapts it much faster than one typed array per column)."""
    return json.dumps(
        [
            {
                "kind": j.kind,
                "payload": _json_safe(j.payload),
                "key": j.key,
                "recipient": j.recipient,
                "run_at": None if j.run_at is None else j.run_at.isoformat(),
                "max_attempts": j.max_attempts,
                "event_id": j.event_id,
                "trace": j.trace,
            }
            for j in jobs
        ],
        ensure_ascii=False,
    )


def created_or_none(jobs: Sequence[NewJob], rows: Iterable[tuple[int | None, int | None]]) -> list[int | None]:
    """Per job of ``jobs``, its new id or None, from ``enqueue_each``'s ``(id, existing)`` rows
    (in the jobs' order); each job not created gets one info line naming the job that has its key."""
    ids: list[int | None] = []
    for job, (job_id, existing) in zip(jobs, rows, strict=True):
        if job_id is None:
            log.info("job not enqueued: kind %s key %r exists as job %s", job.kind, job.key, existing,
                     extra={"job_id": existing, "kind": job.kind})
        ids.append(job_id)
    return ids


async def insert_jobs(tx: Tx, jobs: Sequence[NewJob]) -> list[int | None]:
    """Insert ``jobs`` in ``tx`` (they commit or roll back with it); per job, in order, its new id or None.

    None: a job of its kind with its key exists, so nothing was created (one info line
    names that job, ``created_or_none``). Two jobs of one kind and key in ``jobs``: the
    first is created.
    """
    if not jobs:
        return []
    rows = await tx.fetch_all(Q.enqueue_each, {"jobs": jobs_json(jobs)})
    return created_or_none(jobs, [(row["id"], row["existing"]) for row in rows])


_JOB_FIELDS = frozenset(f.name for f in fields(Job))
_new_job = object.__new__
_set = object.__setattr__


def _jobs(rows: list[dict[str, Any]], tickets: list[int] | None = None) -> list[Job]:
    """The claim's rows as ``Job`` objects (``Job.from_row``'s fast road): each row dict (exactly Job's
    fields, by name, checked on the first row) becomes the object's ``__dict__`` (cheaper than ``Job(**row)``).
    Each row's ``start_ticket`` is taken out of it first (appended to ``tickets``)."""
    for row in rows:
        ticket = row.pop("start_ticket", 0)
        if tickets is not None:
            tickets.append(ticket)
    if rows and rows[0].keys() != _JOB_FIELDS:
        raise TypeError(f"the claim returned {sorted(rows[0])}, not Job's fields {sorted(_JOB_FIELDS)}")
    jobs = []
    for row in rows:
        job = _new_job(Job)
        _set(job, "__dict__", row)
        jobs.append(job)
    return jobs


@dataclass(slots=True)
class Ahead:
    """How a worker pool's claim is counted (``JobStore.claim``): ``claimant`` is the pool's
    ``worker_starts`` row, ``ticket`` the last number of its start order handed out, and
    the claim's first ``now_n`` jobs start at once (their runners are idle). The claim
    fills ``tickets``: each returned job's place in the start order (0: started at once)."""

    claimant: int | None
    ticket: int
    now_n: int
    tickets: list[int] = field(default_factory=list)


class JobStore:
    """The queue over one database; lease length and retry policy come from settings."""

    def __init__(
        self,
        db: Database,
        *,
        lease_seconds: float = 60.0,
        retry: RetryPolicy | None = None,
        rand: Callable[[], float] = random.random,
        max_defer_seconds: float = MAX_DEFER_SECONDS,
    ) -> None:
        self.db = db
        self.lease_seconds = float(lease_seconds)
        self.retry = retry or RetryPolicy()
        #: how long a job's refused deferrals may last in a row before it fails (MAX_DEFER_SECONDS)
        self.max_defer_seconds = float(max_defer_seconds)
        self._rand = rand
        # the claims of one and of two jobs whose jobs all start at once (``_few``): the
        # batch claim with every value written in, the claimant's too. With no parameter
        # left, PostgreSQL plans the prepared statement once, generic from its first run;
        # a parameter in it made the first five runs on each connection plan anew, ~1 ms
        # each (bench/RESULTS.md, "Where idle enqueue → start goes")
        self._claim_few: dict[tuple[int, bool, int | None], str] = {}

    async def enqueue(self, job: NewJob, tx: Tx | None = None) -> int | None:
        """Create ``job``; returns its id, or None when a job of its kind with its key exists
        (logged at info, naming that job).

        Inside ``tx`` when given (commits or rolls back with the caller's transaction).
        """
        [job_id] = await self.enqueue_each([job], tx)
        return job_id

    async def enqueue_each(self, jobs: Sequence[NewJob], tx: Tx | None = None) -> list[int | None]:
        """Create several jobs in one statement; per job, in order, its new id or None (its
        kind and key exist: logged at info, naming that job). Inside ``tx`` when given."""
        jobs = list(jobs)
        if tx is not None:
            return await insert_jobs(tx, jobs)
        if not jobs:
            return []
        rows = await self.db.fetch_all(Q.enqueue_each, {"jobs": jobs_json(jobs)}, prepare=True)
        return created_or_none(jobs, [(row["id"], row["existing"]) for row in rows])

    async def enqueue_many(self, jobs: Sequence[NewJob], tx: Tx | None = None) -> list[int]:
        """Create several jobs in one statement; returns the ids created, ascending. A job whose
        kind and key exist is skipped without a word (the ticker's slots: every replica
        enqueues each one); ``enqueue_each`` says which."""
        if tx is not None:
            return [i for i in await insert_jobs(tx, list(jobs)) if i is not None]
        if not jobs:
            return []
        # one autocommit statement (atomic on its own): no BEGIN/COMMIT round trips
        rows = await self.db.fetch_all(Q.enqueue_many, {"jobs": jobs_json(jobs)}, prepare=True)
        return [row["id"] for row in rows]

    async def register_kinds(self, max_attempts: Mapping[str, int]) -> None:
        """Record each kind's ``max_attempts`` (its handler's) in the database, for the jobs
        enqueued without one from outside the service (the ``kinds`` table)."""
        kinds = sorted(max_attempts)
        await self.db.execute(Q.kinds_register, {"kinds": kinds, "max_attempts": [max_attempts[k] for k in kinds]})

    async def claim(self, n: int = 1, *, durable: bool = True, ahead: Ahead | None = None) -> list[Job]:
        """Claim up to ``n`` due jobs (fair across recipients, one per recipient at a time).

        ``durable`` False: the claim commits asynchronously (the worker's idle path), and
        may be lost in a server crash; the caller confirms it (``confirm``) and stops the
        runs it does not find confirmed (see the module docstring).

        ``ahead``: how the claim's attempts are counted (a worker pool's claim, made ahead
        of its runs); None: every job counts as started with the claim.

        One or two jobs that all start at once (the worker's claim when it had nothing in
        hand and was woken) is the same statement with every value written in, prepared; a
        batch is planned each time (a cached plan was slower on a large backlog:
        docs/design/worker.md).
        """
        claimant, ticket, now_n = (None, 0, n) if ahead is None else (ahead.claimant, ahead.ticket, ahead.now_n)
        few = self._few(n, durable, claimant) if now_n >= n else None
        if few is not None:
            rows = await self.db.fetch_all(few, prepare=True)
        else:
            rows = await self.db.fetch_all(Q.claim, {"n": n, "lease_seconds": self.lease_seconds, "durable": durable,
                                                     "claimant": claimant, "ticket": ticket, "now_n": now_n})
        return _jobs(rows, None if ahead is None else ahead.tickets)

    def _few(self, n: int, durable: bool, claimant: int | None) -> str | None:
        """The claim of ``n`` (1 or 2) jobs that all start at once (their tickets 0) for
        ``claimant``, every value written in (None: not such a claim)."""
        if n not in (1, 2):
            return None
        key = (n, durable, claimant)
        text = self._claim_few.get(key)
        if text is None:
            values = {"n": str(n), "lease_seconds": repr(self.lease_seconds), "durable": str(durable).lower(),
                      "claimant": "null" if claimant is None else str(int(claimant)), "ticket": "0", "now_n": str(n)}
            text = Q.claim
            for name, value in values.items():
                text = text.replace(f"%({name})s", value)
            self._claim_few[key] = text
        return text

    async def register_claimant(self) -> int:
        """A new row of a worker pool's start order (``worker_starts``); returns its id."""
        row = await self.db.fetch_one(Q.claimant_register)
        assert row is not None
        return int(row["id"])

    async def record_starts(self, claimant: int, upto: int) -> None:
        """Record that the pool ``claimant`` has started every run up to ticket ``upto``."""
        await self.db.execute(Q.starts_record, {"claimant": claimant, "upto": upto}, prepare=True)

    async def confirm(self, jobs: Iterable[Job]) -> set[int]:
        """Which of these claims are held, now on disk: ids (``confirm_claims``: one durable
        commit after them). A claim missing was lost in a crash, or its job has ended."""
        jobs = list(jobs)
        if not jobs:
            return set()
        return {row["id"] for row in await self.db.fetch_all(Q.confirm_claims, _claims(jobs), prepare=True)}

    async def retire_idle(self, n: int = 100) -> int:
        """Retire up to ``n`` recipients at the front of the fair order whose line has nothing
        due now (see ``retire_idle`` in queries.sql); returns how many."""
        return await self.db.execute(Q.retire_idle, {"n": n}, prepare=True)

    def decide(self, job: Job, error: BaseException | str, *, retry: RetryPolicy | None = None) -> Outcome:
        """What a run that ended with ``error`` does to its job (pure but for the jitter).

        ``Defer(after=s)``: back after ``s`` seconds (capped like a 429's wait), the
        attempt given back, no error recorded (a refused one, ``Defer.refused``, fails
        for good in ``write`` once the job's refusals have lasted
        ``max_defer_seconds``). A ``CancelJob`` (a chat that blocked the bot):
        ``cancelled``, whatever the attempt. A ``PermanentError`` or the last attempt:
        ``failed``. Anything else: a retry after ``RetryPolicy.delay_for`` (at least a
        429's ``retry_after``; ``retry``: the job's kind's own policy, else the store's).
        """
        if isinstance(error, Defer):
            ceiling = max(self.retry.cap, self.retry.after_ceiling)
            return Outcome.deferred(job, error_text(error), min(error.after, ceiling), refused=error.refused,
                                    quiet=error.quiet)
        text = error_text(error)
        if isinstance(error, CancelJob):
            return Outcome.cancelled(job, text)
        exc: BaseException = error if isinstance(error, BaseException) else Exception(error)
        if is_final(exc, job.attempts, job.max_attempts):
            return Outcome.failed(job, text)
        return Outcome.retry(job, text, (retry or self.retry).delay_for(exc, job.attempts, self._rand))

    async def write(self, outcomes: Sequence[Outcome], *, tx: Tx | None = None,
                    starts: tuple[int, int] | None = None) -> tuple[dict[int, Written], bool]:
        """Record ``outcomes``, each only if its claim still holds the job (the fence: id, lease,
        status running); a claim no longer held changes nothing.

        Returns what the job of each held claim became, by id (a claim not held is missing),
        and whether a recipient these outcomes freed may have its next job due now (a claim
        may then find work). ``tx``: inside the caller's transaction, which commits or rolls
        back the outcomes with its own writes (a handler's "done"). Without it, the "done"
        outcomes are one statement committed asynchronously (the module docstring) and the
        others one statement committed durably, each on its own. ``starts``: (claimant,
        ticket) of a pool's start order, recorded with them (``record_starts``).
        Raises what the statements raise (``QueryError``, ``DatabaseUnavailable``).
        """
        done = [o for o in outcomes if o.status == "done"]
        others = [o for o in outcomes if o.status != "done"] if len(done) < len(outcomes) else []
        written: dict[int, Written] = {}
        more = False
        if done:
            more = await self._write_done(done, tx, starts, written)
        elif starts is not None:
            await self.record_starts(*starts)
        if others:
            await self._write_others(others, tx, written)
            # a failed or waiting job frees its recipient too (its next job may be due)
            more = more or any(o.job.recipient is not None for o in others)
        return written, more

    async def _write_done(self, done: list[Outcome], tx: Tx | None, starts: tuple[int, int] | None,
                          written: dict[int, Written]) -> bool:
        """The "done" outcomes (``complete_many``), then the run logs of those that have one."""
        first, again = _distinct_ids(done)
        claimant, upto = starts if starts is not None else (None, 0)
        params = {**_claims([o.job for o in first]), "durable": tx is not None, "claimant": claimant, "upto": upto}
        if tx is None:
            rows = await self.db.fetch_all(Q.complete_many, params, prepare=True)
        else:
            rows = await tx.fetch_all(Q.complete_many, params)
        more = False
        for row in rows:
            written[row["id"]] = DONE
            more = more or row["more"]
        if tx is None:
            # in a caller's transaction (which may stay open a while, and the intake upserts
            # that row) a line left with nothing due waits for retire_idle's sweep instead
            idle = sorted({row["idle"] for row in rows if row["idle"] is not None})
            if idle:
                await self._retire(idle)
        logged = [o for o in first if o.log is not None and o.job.id in written]
        if logged:  # only runs whose handler used ctx.log: the usual "done" writes nothing more
            logs = {**_claims([o.job for o in logged]), "logs": [json.dumps(o.log) for o in logged]}
            await (self.db.execute(Q.save_run_logs, logs) if tx is None else tx.execute(Q.save_run_logs, logs))
        if again:
            # two claims of one id (the older one's lease ran out while its outcome waited):
            # the statement matches each id with one lease, so the second goes on its own
            more |= await self._write_done(again, tx, None, written)
        return more

    async def _retire(self, recipients: list[str]) -> None:
        """Retire these recipients, whose lines the completion left with nothing due (``retire_lines``:
        its own statement, so that the completion never holds a recipient's row; it skips a
        row someone holds). Best effort: the completion is committed whatever happens here,
        and what is not retired costs the claim's walk a probe until ``retire_idle``."""
        try:
            await self.db.execute(Q.retire_lines, {"recipients": recipients}, prepare=True)
        except Exception as exc:  # the database went away after the completion: say so, go on
            log.debug("could not retire %d recipients after their completions: %s", len(recipients), describe(exc))

    async def _write_others(self, others: list[Outcome], tx: Tx | None, written: dict[int, Written]) -> None:
        """Every outcome but "done" (``settle_many``, one statement)."""
        params = {
            "ids": [o.job.id for o in others],
            "leases": [o.job.lease for o in others],
            "outcomes": [o.status for o in others],
            "errors": [o.error for o in others],
            "delays": [o.delay for o in others],
            "refused": [o.refused for o in others],
            "unrun": [o.unrun for o in others],
            "tracebacks": [o.traceback for o in others],
            "logs": [None if o.log is None else json.dumps(o.log) for o in others],
            "max_defer": self.max_defer_seconds,
        }
        if tx is None:
            rows = await self.db.fetch_all(Q.settle_many, params, prepare=True)
        else:
            rows = await tx.fetch_all(Q.settle_many, params)
        for row in rows:
            written[row["id"]] = Written(row["status"], row["run_at"], row["last_error"])

    async def renew(self, jobs: Iterable[Job]) -> dict[int, datetime]:
        """Extend the leases of these claims; returns {id: new locked_until} for those still held."""
        jobs = list(jobs)
        if not jobs:
            return {}
        params = {**_claims(jobs), "lease_seconds": self.lease_seconds}
        rows = await self.db.fetch_all(Q.renew_many, params, prepare=True)
        return {row["id"]: row["locked_until"] for row in rows}

    async def get(self, job_id: int) -> dict[str, Any] | None:
        """One job row as a dict, or None."""
        return await self.db.fetch_one(Q.get_job, {"id": job_id})


def _distinct_ids(outcomes: list[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    """``outcomes`` split into the first claim of each id and the rest (nearly always empty)."""
    if len({o.job.id for o in outcomes}) == len(outcomes):
        return outcomes, []
    seen: set[int] = set()
    first: list[Outcome] = []
    again: list[Outcome] = []
    for outcome in outcomes:
        (again if outcome.job.id in seen else first).append(outcome)
        seen.add(outcome.job.id)
    return first, again


def _int_array(values: Iterable[int]) -> str:
    """An array literal (``'{1,2,3}'``) for a ``%(x)s::bigint[]`` parameter (cheaper than
    psycopg's list dumper)."""
    return "{" + ",".join(map(str, values)) + "}"


def _claims(jobs: Sequence[Job]) -> dict[str, str]:
    return {"ids": _int_array([j.id for j in jobs]), "leases": _int_array([j.lease for j in jobs])}
