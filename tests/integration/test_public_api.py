"""The public API end to end on a real PostgreSQL: App, HandlerContext, atomic publication,
ctx.once, timeouts, bad input. Jobs run through the worker's real claim and completion
path (``autom.testing``)."""

from __future__ import annotations

import hmac
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import trio

from autom import App, HandlerContext, Job, NewJob, Parsed, Router, VerificationError
from autom.app import AppError
from autom.sources.base import load_object
from autom.testing import Reply, hmac_signature, open_testbed


def count(dsn: str, sql: str, *params: Any) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return int(row[0])


def notes_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create table notes (job_id bigint, text text)")


async def test_enqueued_jobs_and_written_rows_commit_with_the_job(dsn: str) -> None:
    notes_table(dsn)
    app = App(builtins=False)

    @app.handler("order")
    async def order(ctx: HandlerContext, job: Job) -> None:
        async with ctx.transaction() as tx:
            await tx.execute("insert into notes values (%s, %s)", [job.id, "seen"])
        await ctx.enqueue("notify", {"order": job.payload["id"]}, recipient=42)

    @app.handler("notify", max_attempts=3)
    async def notify(ctx: HandlerContext, job: Job) -> None:
        pass

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("order", {"id": 7})
    assert run.status == "done", run.error
    follow = run.assert_enqueued("notify", order=7)
    assert (follow.recipient, follow.max_attempts) == ("42", 3)  # the kind's max_attempts
    assert count(dsn, "select count(*) from notes where job_id = %s", run.id) == 1


async def test_a_handler_that_raises_after_enqueueing_commits_nothing(dsn: str) -> None:
    notes_table(dsn)
    app = App(builtins=False)

    @app.handler("order", max_attempts=2)
    async def order(ctx: HandlerContext, job: Job) -> None:
        async with ctx.transaction() as tx:
            await tx.execute("insert into notes values (%s, %s)", [job.id, "half"])
        await ctx.enqueue("notify", {"order": 1})
        raise RuntimeError("the CRM is down")

    @app.handler("notify")
    async def notify(ctx: HandlerContext, job: Job) -> None:
        pass

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("order", {"id": 1})
    assert run.status == "pending" and run.error is not None
    assert run.error.startswith("RuntimeError: the CRM is down (at test_public_api.py:")
    assert run.enqueued == []
    assert count(dsn, "select count(*) from jobs where kind = 'notify'") == 0
    assert count(dsn, "select count(*) from notes") == 0


async def test_a_block_that_raises_undoes_only_its_own_writes(dsn: str) -> None:
    notes_table(dsn)
    app = App(builtins=False)

    @app.handler("order")
    async def order(ctx: HandlerContext, job: Job) -> None:
        async with ctx.transaction() as tx:
            await tx.execute("insert into notes values (%s, 'kept')", [job.id])
        with pytest.raises(ValueError):
            async with ctx.transaction() as tx:
                await tx.execute("insert into notes values (%s, 'undone')", [job.id])
                raise ValueError("changed my mind")

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("order")
    assert run.status == "done", run.error
    assert count(dsn, "select count(*) from notes where text = 'kept'") == 1
    assert count(dsn, "select count(*) from notes where text = 'undone'") == 0


async def test_a_run_that_lost_its_lease_commits_nothing(dsn: str) -> None:
    notes_table(dsn)
    app = App(builtins=False)

    @app.handler("order")
    async def order(ctx: HandlerContext, job: Job) -> None:
        async with ctx.transaction() as tx:
            await tx.execute("insert into notes values (%s, 'stale')", [job.id])
        await ctx.enqueue("notify", {})
        # another claim takes the job meanwhile (as after an expired lease): a new generation
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("update jobs set lease = lease + 1 where id = %s", [job.id])

    @app.handler("notify")
    async def notify(ctx: HandlerContext, job: Job) -> None:
        pass

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("order")
    assert run.status == "running" and run.enqueued == []
    assert count(dsn, "select count(*) from notes") == 0


async def test_once_runs_its_effect_once_across_a_crash_and_retry(dsn: str) -> None:
    effects: list[int] = []
    app = App(builtins=False)

    @app.handler("charge")
    async def charge(ctx: HandlerContext, job: Job) -> None:
        async with ctx.once(f"charge:{job.payload['id']}") as todo:
            if todo:
                effects.append(job.attempts)
        if job.attempts == 1:
            raise RuntimeError("crashed after the effect")

    async with open_testbed(app, database_url=dsn, settings={"retry_base_seconds": 0.01,
                                                             "retry_max_seconds": 0.01}) as bed:
        first = await bed.run_job("charge", {"id": 5})
        assert first.status == "pending" and first.once_keys == ["charge:5"]
        with trio.fail_after(10):
            while count(dsn, "select count(*) from jobs where id = %s and run_at <= now()", first.id) == 0:
                await trio.sleep(0.01)
        second = await bed.run(first.id)
    assert second.status == "done", second.error
    assert effects == [1]


async def test_a_once_block_that_raises_records_nothing(dsn: str) -> None:
    app = App(builtins=False)

    @app.handler("charge", max_attempts=1)
    async def charge(ctx: HandlerContext, job: Job) -> None:
        async with ctx.once("charge:9") as todo:
            assert todo
            raise RuntimeError("the card was declined")

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("charge")
    assert run.status == "failed" and run.once_keys == []
    assert count(dsn, "select count(*) from autom_once") == 0


async def test_a_kind_timeout_cancels_the_run_and_retries_it(dsn: str) -> None:
    app = App(builtins=False)

    @app.handler("slow", timeout=0.2)
    async def slow(ctx: HandlerContext, job: Job) -> None:
        assert ctx.deadline <= trio.current_time() + 0.2
        await trio.sleep(30)

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("slow")
    assert run.status == "pending" and run.attempts == 1
    assert run.error is not None and run.error.startswith("HandlerTimeout: timeout:")


@pytest.mark.parametrize(("body", "error"), [
    ("return 5", "returned a int; a handler must return None"),
    ("await ctx.enqueue('nobody', {})", "no handler is registered for kind 'nobody'"),
    ("await ctx.enqueue('ok', {'when': object()})", "payload is not JSON-serialisable"),
    ("await ctx.enqueue('ok', [1])", "payload must be a JSON object"),
])
async def test_mistakes_fail_the_job_with_a_clear_message(dsn: str, body: str, error: str) -> None:
    app = App(builtins=False)
    namespace: dict[str, Any] = {}
    exec(f"async def bad(ctx, job):\n    {body}\n", namespace)  # noqa: S102 (the handler under test)
    app.handler("bad")(namespace["bad"])

    @app.handler("ok")
    async def ok(ctx: HandlerContext, job: Job) -> None:
        pass

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("bad")
    assert run.status == "failed" and run.attempts == 1
    assert run.error is not None and error in run.error


async def test_once_with_an_empty_key_is_refused_at_the_call(dsn: str) -> None:
    app = App(builtins=False)

    @app.handler("bad", max_attempts=1)
    async def bad(ctx: HandlerContext, job: Job) -> None:
        async with ctx.once(" "):
            pass

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("bad")
    assert run.error is not None  # the message, then the frame of the handler that raised
    assert run.error.startswith("ValueError: ctx.once needs a non-empty key (at test_public_api.py:")


def test_registration_mistakes_fail_at_registration_or_start() -> None:
    app = App()

    async def handler(ctx: HandlerContext, job: Job) -> None:
        pass

    app.handler("site.form")(handler)  # replacing a built-in kind is allowed
    with pytest.raises(AppError, match=r"'site\.form' is registered twice"):
        app.handler("site.form")(handler)
    router = Router()
    router.handler("shop.order")(handler)
    app.include(router)
    with pytest.raises(AppError, match="registered twice"):
        app.include(router)
    with pytest.raises(AppError, match=r"name must be \[a-z0-9_-\]\+"):
        app.source(type("Bad", (), {"name": "Shop Orders", "secret_headers": frozenset()})())
    with pytest.raises(AppError, match="must be an async def"):
        app.handler("sync")(lambda ctx, job: None)
    app.schedule("shop.digest", daily_at="09:00")
    with pytest.raises(AppError, match=r"schedule without a handler: 'shop\.digest'"):
        app.validate()
    with pytest.raises(AppError, match="daily_at"):
        app.schedule("shop.digest", daily_at="9 am")
    app.schedule("shop.digest", cron="*/5 * * * *")
    with pytest.raises(AppError, match=r"\(cron \*/5 \* \* \* \*\) is registered twice"):
        app.schedule("shop.digest", cron="*/5 * * * *")
    with pytest.raises(AppError, match="five fields"):
        app.schedule("shop.digest", cron="*/5 * * *")


def http_app(url: str) -> App:
    app = App(builtins=False)

    @app.handler("call")
    async def call(ctx: HandlerContext, job: Job) -> None:
        ctx.check(await ctx.http.post(f"{url}/bot1:x/sendMessage", json={"chat_id": 1, "text": "x"}))

    return app


async def test_every_http_request_has_a_total_deadline(dsn: str, telegram_stub) -> None:
    # headers at once, then the body one byte every 0.2 s: httpx's per-read timeout never fires
    telegram_stub.plan("sendMessage", [Reply(status=200, trickle=0.2)])
    async with open_testbed(http_app(telegram_stub.url), database_url=dsn,
                            settings={"http_timeout_seconds": 0.5}) as bed:
        run = await bed.run_job("call")
    assert run.status == "pending"
    assert run.error is not None  # the message, then the frame of the handler that raised
    assert run.error.startswith("TimeoutException: POST 127.0.0.1: no complete answer within 0.5 s "
                                "(HTTP_TIMEOUT_SECONDS) (at test_public_api.py:")


@pytest.mark.parametrize(("reply", "status", "error"), [
    (Reply(status=429, headers={"Retry-After": "30"}), "pending", "Retry: HTTP POST 127.0.0.1: HTTP 429"),
    (Reply(status=422, description="email is invalid"), "failed", "PermanentError: HTTP POST 127.0.0.1: HTTP 422"),
    (Reply(status=502), "pending", "TransientError: HTTP POST 127.0.0.1: HTTP 502"),
])
async def test_check_turns_answers_into_what_the_queue_does(dsn: str, telegram_stub, reply: Reply, status: str,
                                                            error: str) -> None:
    telegram_stub.plan("sendMessage", [reply])
    async with open_testbed(http_app(telegram_stub.url), database_url=dsn) as bed:
        run = await bed.run_job("call")
        row = await bed.deps.store.get(run.id)
    assert run.status == status and run.error is not None and run.error.startswith(error)
    if reply.status == 429:  # not before the Retry-After (the testbed's own backoff is under a second)
        assert row is not None and (row["run_at"] - row["updated_at"]).total_seconds() >= 29


class PreCheckedSource:
    """A user source that pre-checks a header before the body is read and signs the body in ``verify``."""

    name = "shop"
    secret_headers = frozenset({"x-shop-signature"})

    def __init__(self) -> None:
        self.verified = 0

    def verify_headers(self, headers: Any) -> None:
        if not headers.get("x-shop-signature", "").startswith("sha256="):
            raise VerificationError("no x-shop-signature")

    def verify(self, headers: Any, body: bytes, now: float) -> None:
        self.verified += 1
        if not hmac.compare_digest(headers.get("x-shop-signature", ""), hmac_signature("shop-secret", body)):
            raise VerificationError("x-shop-signature does not match the body")

    def dedup_key(self, headers: Any, body: bytes) -> str | None:
        return None

    def parse(self, headers: Any, text: str) -> Parsed:
        return Parsed(None, [NewJob("shop.order", load_object(text))])


async def test_a_source_whose_header_check_passes_is_still_verified_in_full(dsn: str) -> None:
    app = App(builtins=False)
    source = app.source(PreCheckedSource())

    @app.handler("shop.order")
    async def order(ctx: HandlerContext, job: Job) -> None:
        pass

    body = b'{"id": 7}'
    async with open_testbed(app, database_url=dsn) as bed:
        # the header check passes, the body is not the one signed: refused, nothing stored
        forged = await bed.post("shop", body, {"X-Shop-Signature": hmac_signature("shop-secret", b'{"id": 8}')})
        assert (forged.status, forged.body) == (401, {"error": "verification failed"})
        assert source.verified == 1
        assert count(dsn, "select count(*) from events") == 0
        assert count(dsn, "select count(*) from jobs") == 0
        # the header check fails: refused at the door, before the body (verify never runs)
        early = await bed.post("shop", body)
        assert early.status == 401 and source.verified == 1
        signed = await bed.post("shop", body, {"X-Shop-Signature": hmac_signature("shop-secret", body)})
        assert signed.status == 202 and [job.kind for job in signed.jobs] == ["shop.order"]
    assert count(dsn, "select count(*) from events") == 1


async def test_cancel_ends_a_pending_job_when_the_canceller_completes_and_not_if_it_raises(dsn: str) -> None:
    app = App(builtins=False)
    said: list[object] = []

    @app.handler("lead")
    async def lead(ctx: HandlerContext, job: Job) -> None:
        said.append(await ctx.enqueue("remind", {}, key=f"remind:{job.payload['id']}",
                                      run_at=timedelta(hours=1)))

    @app.handler("take", max_attempts=1)
    async def take(ctx: HandlerContext, job: Job) -> None:
        said.append(await ctx.cancel("remind", f"remind:{job.payload['id']}"))
        if job.payload.get("fail"):
            raise RuntimeError("the take failed after cancelling")

    @app.handler("remind")
    async def remind(ctx: HandlerContext, job: Job) -> None:
        pass

    async with open_testbed(app, database_url=dsn) as bed:
        assert (await bed.run_job("lead", {"id": 1})).status == "done"
        assert (await bed.run_job("lead", {"id": 1})).status == "done"  # its key exists: None
        reminder = said[0]
        assert isinstance(reminder, int) and said[1] is None
        failed = await bed.run_job("take", {"id": 1, "fail": True})
        assert failed.status == "failed"
        assert count(dsn, "select count(*) from jobs where id = %s and status = 'pending'", reminder) == 1
        taken = await bed.run_job("take", {"id": 1})
        assert taken.status == "done", taken.error
        assert count(dsn, "select count(*) from jobs where id = %s and status = 'cancelled'", reminder) == 1
        again = await bed.run_job("take", {"id": 1})  # nothing pending any more
        assert again.status == "done"
    assert said[2:] == [True, True, False]


async def test_cancel_refuses_an_empty_key(dsn: str) -> None:
    app = App(builtins=False)

    @app.handler("bad", max_attempts=1)
    async def bad(ctx: HandlerContext, job: Job) -> None:
        await ctx.cancel("bad", "")

    async with open_testbed(app, database_url=dsn) as bed:
        run = await bed.run_job("bad")
    assert run.error is not None  # the message, then the frame of the handler that raised
    assert run.error.startswith("ValueError: ctx.cancel needs a non-empty key (at test_public_api.py:")
