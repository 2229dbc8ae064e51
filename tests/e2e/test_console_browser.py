"""The console in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``)
driven by Selenium against the whole service (HTTP, workers, a Telegram stub on 127.0.0.1).

What a person does: log in, find the failed job, open it, press Retry and see it done;
replay an event; cancel a pending job, and a running one (its handler stops); filter the
failed list and retry exactly what it shows; read a recipient's timeline after a delivery,
a second job and a retry, and pause it; log in while someone guesses tokens from many
addresses. What must not happen: a payload's ``<script>`` or ``<img onerror>`` running,
a form posted without its CSRF token being obeyed, a page shown without a session (also
with a cookie put back after logout).

``.ci/run`` installs Chromium and its driver when they are missing. Where no browser can
be had these tests skip, saying why. With ``AUTOM_CONSOLE_SCREENSHOTS=<folder>`` the
realistic run (``test_every_page_of_a_realistic_run``: an hour of history, the heartbeat,
live traffic) saves the README's screenshots (overview, a job, the events, an event, the
failed list, the bulk retry's confirm page, a recipient, the audit trail) there.

Selenium is synchronous: its calls run in a worker thread (``Browser``) while the
service runs in the test's trio nursery.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio

from autom.handlers import telegram_send
from autom.jobs.models import NewJob
from autom.jobs.store import JobStore
from autom.schedule import DEFAULT_SCHEDULES, Schedule
from tests.support.http_app import client_at
from tests.support.queue import sleeping_handler
from tests.support.service import (
    ADMIN_TOKEN,
    post_telegram,
    running_service,
    service_settings,
    telegram_update,
    wait_until,
)
from tests.support.telegram_stub import Reply

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import NoAlertPresentException, WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
SHOTS = os.environ.get("AUTOM_CONSOLE_SCREENSHOTS")

EVIL_SCRIPT = "<script>document.title='pwned';window.__pwned=1</script>"
EVIL_IMG = "<img src=x onerror=\"document.title='pwned';window.__pwned=2\">"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """One headless Chromium for the module (a fresh profile; cookies cleared per test)."""
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("NO BROWSER: Chromium or chromedriver is not installed, so the console's browser tests "
                    "did not run (apt-get install chromium chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    try:
        drv = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    except WebDriverException as exc:
        pytest.skip(f"NO BROWSER: Chromium would not start ({exc.msg}); the console's browser tests did not run")
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()


class Browser:
    """The driver, used from trio: each call runs in a worker thread."""

    def __init__(self, drv: Any, base: str) -> None:
        self.drv = drv
        self.base = base

    async def do(self, fn: Callable[[Any], T]) -> T:
        return await trio.to_thread.run_sync(fn, self.drv)

    async def open(self, path: str) -> None:
        await self.do(lambda d: d.get(self.base + path))

    async def path(self) -> str:
        url = await self.do(lambda d: d.current_url)
        return url[len(self.base):] if url.startswith(self.base) else url

    async def text(self) -> str:
        def read(d: Any) -> str:
            try:
                return str(d.find_element(By.TAG_NAME, "main").text)
            except WebDriverException:  # between two pages: nothing to read yet
                return ""
        return await self.do(read)

    async def press(self, label: str) -> None:
        """Click the submit button labelled ``label`` (the contract names them: Retry, Cancel,
        Replay) and wait until the next page has replaced this one."""
        await self.navigate(lambda d: d.find_element(By.XPATH, f"//button[normalize-space()='{label}']").click())

    async def follow(self, text: str, partial: bool = False) -> None:
        """Click the link reading ``text`` (or starting with it: ``partial``) and wait for the page it leads to."""
        how = By.PARTIAL_LINK_TEXT if partial else By.LINK_TEXT
        await self.navigate(lambda d: d.find_element(how, text).click())

    async def type_into(self, name: str, value: str) -> None:
        """Type ``value`` into the (first) field named ``name``."""
        await self.do(lambda d: d.find_element(By.NAME, name).send_keys(value))

    async def cells(self, selector: str) -> list[str]:
        """The text of every element ``selector`` (CSS) finds, in page order."""
        return await self.do(lambda d: [str(e.text) for e in d.find_elements(By.CSS_SELECTOR, selector)])

    async def navigate(self, act: Callable[[Any], None]) -> None:
        """Do ``act`` (a click that loads a page) and wait until the old page is gone and the new one loaded."""
        def run(d: Any) -> None:
            old = d.find_element(By.TAG_NAME, "html")

            def gone(_: Any) -> bool:
                # staleness_of lets Chromium's "node does not belong to the document" (seen while
                # the page is being replaced) escape: any error touching the old page means it left
                try:
                    old.is_enabled()
                except WebDriverException:
                    return True
                return False

            act(d)
            WebDriverWait(d, 15).until(gone)
            WebDriverWait(d, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")
        await self.do(run)

    async def wait_for_text(self, needle: str, reload: bool = False, timeout: float = 15) -> None:
        """Until the page shows ``needle`` (reloading each time when ``reload``)."""
        async def shown() -> bool:
            if reload:
                await self.do(lambda d: d.refresh())
            return needle in await self.text()
        await wait_until(shown, timeout=timeout, interval=0.2)

    async def login(self) -> None:
        await self.open("/ui/")
        assert (await self.path()).startswith("/ui/login")

        await self.do(lambda d: d.find_element(By.NAME, "token").send_keys(ADMIN_TOKEN))
        await self.press("Log in")
        assert (await self.path()) == "/ui/"

    async def shot(self, name: str) -> None:
        if SHOTS:
            folder = Path(SHOTS)

            def save(d: Any) -> None:
                folder.mkdir(parents=True, exist_ok=True)
                d.save_screenshot(str(folder / name))
            await self.do(save)


@asynccontextmanager
async def console(
    drv: Any, dsn: str, telegram_stub: Any, handlers: Mapping[str, Any] | None = None,
    schedules: Sequence[Schedule] = (),
) -> AsyncIterator[tuple[Browser, httpx.AsyncClient, Any]]:
    """The whole service (with ``handlers`` instead of the built-in ones, when given, and
    ``schedules``), a browser without cookies pointed at it, and an HTTP client for set-up."""
    async with (
        running_service(service_settings(dsn, telegram_stub.url), handlers=handlers, schedules=schedules) as svc,
        httpx.AsyncClient(base_url=svc.urls[0], timeout=10.0) as client,
    ):
        browser = Browser(drv, svc.urls[0])
        await browser.open("/ui/login")
        await browser.do(lambda d: d.delete_all_cookies())
        yield browser, client, svc


async def job_of(client: httpx.AsyncClient, event_id: int) -> int:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return int((await client.get(f"/admin/events/{event_id}", headers=headers)).json()["job_ids"][0])


async def test_log_in_find_the_failed_job_retry_it_and_see_it_done(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    # the first answer to chat 9 is a permanent 400: the job fails for good
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found")], chat_id=9)
    async with console(driver, dsn, telegram_stub) as (browser, client, _):
        for update_id, chat in ((1, 5), (2, 6), (3, 9)):
            assert (await post_telegram(client, telegram_update(update_id, chat, "/ping"))).status_code == 202
        failed_event = 3
        await wait_until(lambda: db.fetch_val("select count(*) = 1 from jobs where status = 'failed'"))
        await wait_until(lambda: db.fetch_val("select count(*) = 2 from jobs where status = 'done'"))

        await browser.login()
        await browser.wait_for_text("1 failed", reload=True)
        await browser.follow("Failed")
        assert (await browser.path()) == "/ui/jobs?status=failed"
        listing = await browser.text()
        assert "chat not found" in listing
        job_id = await job_of(client, failed_event)
        await browser.follow(str(job_id))
        assert (await browser.path()) == f"/ui/jobs/{job_id}"
        page = await browser.text()
        assert "failed" in page and "Bad Request: chat not found" in page
        await browser.press("Retry")
        await browser.wait_for_text("Put back in the queue")
        await browser.wait_for_text("done", reload=True)
        page = await browser.text()
        assert f"Job {job_id} done" in page
        assert "Retry" not in [b.text for b in await browser.do(lambda d: d.find_elements(By.TAG_NAME, "button"))]
        await browser.open(f"/ui/jobs/{job_id}")
        assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=9)] == ["pong", "pong"]


async def test_replay_an_event_from_its_page(driver: Any, dsn: str, db: Any, telegram_stub: Any) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, client, _):
        event_id = (await post_telegram(client, telegram_update(7, 11, "/ping"))).json()["id"]
        first = await job_of(client, event_id)
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [first]))
        await browser.login()
        await browser.follow("Events")
        await browser.follow(str(event_id))
        page = await browser.text()
        assert '"update_id": 7' in page and "x-telegram-bot-api-secret-token" not in page
        await browser.press("Replay")
        await browser.wait_for_text("Replayed: created job(s)")
        created = await db.fetch_val("select max(id) from jobs where event_id = %s", [event_id])
        assert created != first
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [created]))
        await browser.do(lambda d: d.refresh())
        assert len(telegram_stub.calls_of("sendMessage", chat_id=11)) == 2


async def test_cancel_a_pending_job(driver: Any, dsn: str, db: Any, telegram_stub: Any) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, _client, _):
        job_id = await db.fetch_val(
            "insert into jobs (kind, payload, run_at) values ('site.form', '{\"n\": 1}', now() + interval '1 day') "
            "returning id")
        await browser.login()
        await browser.open(f"/ui/jobs/{job_id}")
        await browser.press("Cancel")
        await browser.wait_for_text("Cancelled: it will not run.")
        assert f"Job {job_id} cancelled" in await browser.text()
        assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "cancelled"
        assert await db.fetch_val("select count(*) from alerts") == 0


async def test_a_payload_with_script_and_img_onerror_is_text_and_runs_nothing(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, _client, _):
        payload = {"text": EVIL_SCRIPT + EVIL_IMG}
        event_id = await db.fetch_val(
            "insert into events (source, headers, body) values ('site', %s, %s) returning id",
            [json.dumps({"x-note": EVIL_IMG}), json.dumps(payload)])
        job_id = await db.fetch_val(
            "insert into jobs (kind, payload, status, last_error, recipient, event_id, finished_at) "
            "values ('site.form', %s, 'failed', %s, %s, %s, now()) returning id",
            [json.dumps(payload), EVIL_IMG, EVIL_SCRIPT, event_id])
        await browser.login()
        for path in (f"/ui/jobs/{job_id}", f"/ui/events/{event_id}", "/ui/jobs?status=failed"):
            await browser.open(path)
            page = await browser.text()
            assert EVIL_SCRIPT in page or "<script>" in page, path  # shown as text
            assert await browser.do(lambda d: d.title) != "pwned", path
            assert await browser.do(lambda d: d.execute_script("return window.__pwned || null")) is None, path
            assert await browser.do(lambda d: d.find_elements(By.CSS_SELECTOR, "main img, main script")) == [], path
            try:
                await browser.do(lambda d: d.switch_to.alert.text)
                raise AssertionError(f"an alert opened on {path}")
            except NoAlertPresentException:
                pass


async def test_a_post_without_the_csrf_token_is_refused(driver: Any, dsn: str, db: Any, telegram_stub: Any) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, _client, _):
        job_id = await db.fetch_val(
            "insert into jobs (kind, run_at) values ('site.form', now() + interval '1 day') returning id")
        await browser.login()
        await browser.open(f"/ui/jobs/{job_id}")
        # a forged form: the same button, its CSRF field taken out
        await browser.do(lambda d: d.execute_script(
            "document.querySelectorAll('input[name=csrf]').forEach(function (e) { e.remove(); });"))
        await browser.press("Cancel")
        await browser.wait_for_text("Refused")
        assert "security token is missing or wrong" in await browser.text()
        assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "pending"


async def test_every_page_without_a_session_goes_to_the_login(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, client, _):
        event_id = (await post_telegram(client, telegram_update(9, 12, "/ping"))).json()["id"]
        job_id = await job_of(client, event_id)
        for path in ("/ui/", "/ui/jobs", "/ui/jobs?status=failed", f"/ui/jobs/{job_id}", "/ui/events",
                     f"/ui/events/{event_id}", "/ui/retry-failed"):
            await browser.open(path)
            assert (await browser.path()).startswith("/ui/login"), path
            assert await browser.do(lambda d: d.find_elements(By.NAME, "token")), path
        # logging in from there lands where the person wanted to go
        await browser.open(f"/ui/jobs/{job_id}")
        await browser.do(lambda d: d.find_element(By.NAME, "token").send_keys(ADMIN_TOKEN))
        await browser.press("Log in")
        assert (await browser.path()) == f"/ui/jobs/{job_id}"
        # and logging out ends it, on the server: the cookie put back (copied before) is no session
        cookie = await browser.do(lambda d: d.get_cookie("autom_console"))
        assert cookie is not None
        await browser.press("Log out")
        await browser.open("/ui/")
        assert (await browser.path()).startswith("/ui/login")
        await browser.do(lambda d: d.add_cookie({k: v for k, v in cookie.items() if k != "expiry"}))
        await browser.open("/ui/jobs")
        assert (await browser.path()).startswith("/ui/login")


async def test_wrong_logins_from_many_addresses_do_not_stop_the_right_token(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, _client, svc):
        # an attacker on many addresses (127.0.0.2-13: other clients to the server, as other
        # machines would be): 5 wrong tokens from each, and one address past the lockout
        for n in range(2, 14):
            async with client_at(svc.urls[0], f"127.0.0.{n}") as attacker:
                for _ in range(21 if n == 2 else 5):
                    response = await attacker.post("/ui/login", data={"token": "guess"})
                    assert response.status_code == 401
                locked = await attacker.post("/ui/login", data={"token": ADMIN_TOKEN})
                assert locked.status_code == (429 if n == 2 else 303), n
        # the operator's browser (127.0.0.1): a typo is refused, the right token gets in
        await browser.open("/ui/login")
        await browser.type_into("token", "not-" + ADMIN_TOKEN)
        await browser.press("Log in")
        assert "That is not the ADMIN_TOKEN." in await browser.text()
        await browser.login()
        await browser.follow("Failed")
        assert (await browser.path()) == "/ui/jobs?status=failed"


async def test_pause_and_purge_a_recipient_and_reschedule_a_job(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with console(driver, dsn, telegram_stub) as (browser, _client, _):
        job_id = await db.fetch_val(
            "insert into jobs (kind, payload, recipient, run_at) values ('site.form', '{\"n\": 1}', '4242', "
            "now() + interval '1 day') returning id")
        await browser.login()
        await browser.open(f"/ui/jobs/{job_id}")
        await browser.follow("4242")  # the recipient's page, from the job's
        await browser.wait_for_text("Recipient 4242")
        await browser.press("Pause")
        await browser.wait_for_text("Paused: its jobs stay pending")
        await browser.open(f"/ui/jobs/{job_id}")
        await browser.press("Reschedule")  # the field says "now"; the paused recipient keeps it pending
        await browser.wait_for_text("Rescheduled")
        assert await db.fetch_val("select status = 'pending' and run_at <= now() from jobs where id = %s", [job_id])
        await browser.open("/ui/recipients/4242")
        await browser.press("Purge")
        await browser.wait_for_text("Purged: 1 pending job(s) cancelled.")
        assert await db.fetch_val("select status from jobs where id = %s", [job_id]) == "cancelled"


async def failed_job(db: Any, kind: str, recipient: str) -> int:
    """A job that failed for good after 8 attempts (bypassing the queue)."""
    return int(await db.fetch_val(
        "insert into jobs (kind, payload, status, attempts, recipient, last_error, finished_at) values "
        "(%s, '{}', 'failed', 8, %s, 'TransientError: crm.example.com: HTTP 503 Service Unavailable', now()) "
        "returning id", [kind, recipient]))


async def test_bulk_retry_from_a_filtered_failed_list_retries_exactly_those(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    ran: list[int] = []

    async def note(ctx: Any, job: Any) -> None:
        ran.append(job.id)

    handlers = {"crm.sync": note, "mail.send": note}
    async with console(driver, dsn, telegram_stub, handlers=handlers) as (browser, _c, _s):
        hit = [await failed_job(db, "crm.sync", "customer-17") for _ in range(3)]
        # the same kind for another recipient, another kind for the same recipient
        others = [await failed_job(db, "crm.sync", "customer-42"), await failed_job(db, "mail.send", "customer-17"),
                  await failed_job(db, "crm.sync", "customer-42")]
        await browser.login()
        await browser.follow("Failed")
        assert sorted(int(x) for x in await browser.cells("table.jobs tbody td:first-child")) == sorted(hit + others)
        await browser.type_into("kind", "crm.sync")
        await browser.type_into("recipient", "customer-17")
        await browser.press("Filter")
        assert sorted(int(x) for x in await browser.cells("table.jobs tbody td:first-child")) == sorted(hit)
        await browser.follow("Retry the failed jobs this list's filters match", partial=True)
        page = await browser.text()
        assert "3 failed job(s) match (kind crm.sync) (recipient customer-17)" in page, page
        assert await browser.cells("table.by-kind tbody tr") == ["crm.sync 3"]
        await browser.press("Retry")
        await browser.wait_for_text("Retried 3, skipped 0")
        await wait_until(lambda: db.fetch_val("select count(*) = 3 from jobs where status = 'done'"), timeout=15)
        assert sorted(ran) == sorted(hit)
        rows = await db.fetch_all("select id, status, attempts from jobs where id = any(%s) order by id", [others])
        assert [(r["status"], r["attempts"]) for r in rows] == [("failed", 8)] * 3

        # the rest, unfiltered, as Sidekiq's "Retry All": from the Failed list, through the same confirm page
        await browser.follow("Failed")
        await browser.follow("Retry every failed job…")
        assert (await browser.path()) == "/ui/retry-failed"
        page = await browser.text()
        assert "3 failed job(s) match." in page, page
        assert await browser.cells("table.by-kind tbody tr") == ["crm.sync 2", "mail.send 1"]
        await browser.press("Retry")
        await browser.wait_for_text("Retried 3, skipped 0")
        await wait_until(lambda: db.fetch_val("select count(*) = 6 from jobs where status = 'done'"), timeout=15)
        assert sorted(ran) == sorted(hit + others)


async def test_cancel_a_running_job_from_its_page_stops_its_handler(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    started = trio.Event()
    slow, ended = sleeping_handler(started)
    async with console(driver, dsn, telegram_stub, handlers={"slow.kind": slow}) as (browser, _c, _s):
        job_id = await JobStore(db).enqueue(NewJob("slow.kind", {"n": 1}, max_attempts=5))
        with trio.fail_after(15):
            await started.wait()
        await browser.login()
        await browser.open(f"/ui/jobs/{job_id}")
        assert f"Job {job_id} running" in await browser.text()
        await browser.press("Cancel")
        await browser.wait_for_text("Cancelled: it will not run.")
        # the handler is stopped (the cancel's NOTIFY reaches the worker), long before its lease's renewal
        await wait_until(lambda: ended == ["cancelled"], timeout=15)
        await browser.do(lambda d: d.refresh())
        assert f"Job {job_id} cancelled" in await browser.text()
        row = await db.fetch_one("select status, attempts from jobs where id = %s", [job_id])
        assert (row["status"], row["attempts"]) == ("cancelled", 1)
        assert await db.fetch_val("select count(*) from alerts") == 0
        assert "Cancel" not in [b.text for b in await browser.do(lambda d: d.find_elements(By.TAG_NAME, "button"))]


async def test_a_recipients_timeline_after_a_delivery_with_two_jobs_and_a_retry(
    driver: Any, dsn: str, db: Any, telegram_stub: Any
) -> None:
    async def answer(ctx: Any, job: Any) -> None:
        """The message's job thanks the chat through a job of its own (the second job of the delivery)."""
        chat = job.payload["chat_id"]
        await ctx.enqueue("telegram.send", {"chat_id": chat, "text": "thanks"}, recipient=str(chat))

    # the thanks' first send meets a Telegram outage (500): retried, then sent
    telegram_stub.plan("sendMessage", [Reply(500, description="Internal Server Error")], chat_id=31)
    handlers = {"telegram.message": answer, "telegram.send": telegram_send.handle}
    async with console(driver, dsn, telegram_stub, handlers=handlers) as (browser, client, _):
        event_id = (await post_telegram(client, telegram_update(41, 31, "hello"))).json()["id"]
        first = await job_of(client, event_id)
        await wait_until(lambda: db.fetch_val(
            "select count(*) = 2 from jobs where recipient = '31' and status = 'done'"), timeout=15)
        send = int(await db.fetch_val("select id from jobs where kind = 'telegram.send' and recipient = '31'"))
        await browser.login()
        await browser.open(f"/ui/jobs/{first}")
        await browser.follow("31")
        await browser.wait_for_text("Recipient 31")
        await browser.press("Pause")
        await browser.wait_for_text("Paused: its jobs stay pending")
        rows = await browser.do(lambda d: [[str(c.text) for c in r.find_elements(By.TAG_NAME, "td")]
                                           for r in d.find_elements(By.CSS_SELECTOR, "table.timeline tbody tr")])

        def where(job: int | None, what: str | None, detail: str) -> int:
            """The one row of the timeline (when, what, job, kind, detail) of ``job`` saying ``detail``."""
            found = [i for i, (_, w, j, _, d) in enumerate(rows)
                     if j == ("" if job is None else str(job)) and (what is None or w == what) and detail in d]
            assert len(found) == 1, (job, what, detail, rows)
            return found[0]

        # newest first: the operator's pause, the thanks sent after its retry, the message's job, the delivery
        order = [
            where(None, "action", "Paused by an operator (console)"),
            where(send, None, "done after 2 attempt(s)"),
            where(send, "attempt", "attempt 1: retry"),
            where(first, "done", "done after 1 attempt(s)"),
            where(first, "job", f"created by event {event_id}"),
            where(None, "event", f"event {event_id} from telegram"),
        ]
        assert order == sorted(order), rows
        assert "Internal Server Error" in rows[order[2]][4]
        assert order[2] < where(send, "job", "created") < order[4]
        assert [c.params["text"] for c in telegram_stub.calls_of("sendMessage", chat_id=31)] == ["thanks", "thanks"]
        await browser.press("Resume")
        await browser.wait_for_text("Resumed: its jobs run again.")
        await browser.follow("Audit")
        assert "recipient_resume" in await browser.text()


# An hour of a shop's traffic before the test's own: 900 jobs finished over the last 60 minutes (busier
# towards now), 2 % of them failed for good with the errors such a service meets, a few waiting
# for their retry; the recipients are Telegram chats. Bypasses the queue: only history is written.
HISTORY = """
insert into jobs (kind, payload, status, attempts, max_attempts, run_at, last_error, recipient,
                  created_at, updated_at, finished_at, claimed_at)
select k.kind, jsonb_build_object('chat_id', 1000 + g % 40, 'text', 'order #' || (4000 + g)),
       s.status, case s.status when 'failed' then 8 when 'pending' then 2 else 1 end, 8,
       case when s.status = 'pending' then now() + interval '40 seconds' else t.at end,
       case when s.status <> 'done' then k.error end,
       case when k.kind like 'telegram.%' then (1000 + g % 40)::text end,
       t.at, t.at + interval '2 seconds',
       case when s.status <> 'pending' then t.at + interval '2 seconds' end, t.at + interval '1 second'
from generate_series(1, 900) g
cross join lateral (select now() - make_interval(secs => 3600.0 * power(random(), 1.3) + 5 + g * 0) as at) t
cross join lateral (select case when g % 47 = 7 then 'failed' when g % 151 = 11 then 'pending'
                                else 'done' end as status) s
cross join lateral (select (array['telegram.message', 'telegram.message', 'telegram.send', 'site.form',
                                  'github.event'])[1 + g % 5] as kind) k0
cross join lateral (select k0.kind, case k0.kind
    when 'telegram.send' then 'PermanentError: telegram sendMessage: HTTP 403 Forbidden: bot was blocked by the user'
    when 'site.form' then 'TransientError: crm.example.com: HTTP 503 Service Unavailable'
    when 'github.event' then 'KeyError: ''titel'' (at shop_automations.py:41 in on_issue)'
    else 'TransientError: telegram sendMessage: HTTP 502 Bad Gateway' end as error) k
"""
SITE_FORM = {"form": "contact", "name": "Ana Souza", "email": "ana@example.com",
             "message": "Do you ship to Porto? I'd like two of the blue ones."}


async def test_every_page_of_a_realistic_run(driver: Any, dsn: str, db: Any, telegram_stub: Any) -> None:
    """The README's screenshots (``AUTOM_CONSOLE_SCREENSHOTS``): an hour of history, the heartbeat running,
    live Telegram traffic with a chat that does not exist and an outage met by a retry, a site form."""
    await db.execute(HISTORY)
    await db.execute("insert into events (source, headers, body, received_at) values "
                     "('site', '{\"content-type\": \"application/json\"}', %s, now() - interval '3 minutes')",
                     [json.dumps(SITE_FORM)])
    await db.execute("analyze jobs")  # as autovacuum would have after such an hour
    telegram_stub.plan("sendMessage", [Reply(400, description="Bad Request: chat not found")], chat_id=9)
    telegram_stub.plan("sendMessage", [Reply(500, description="Internal Server Error")], chat_id=31)
    async with console(driver, dsn, telegram_stub, schedules=DEFAULT_SCHEDULES) as (browser, client, _):
        events = {}
        for update_id, chat in ((101, 5), (102, 6), (103, 31), (104, 9), (105, 7)):
            posted = await post_telegram(client, telegram_update(update_id, chat, "/ping"))
            assert posted.status_code == 202
            events[chat] = posted.json()["id"]
        failed = await job_of(client, events[9])
        retried = await job_of(client, events[31])
        await wait_until(lambda: db.fetch_val("select status = 'failed' from jobs where id = %s", [failed]), timeout=15)
        await wait_until(lambda: db.fetch_val("select status = 'done' from jobs where id = %s", [retried]), timeout=15)
        await wait_until(lambda: db.fetch_val("select count(*) = 1 from service_state where name = 'heartbeat'"),
                         timeout=15)

        await browser.login()
        overview = await browser.text()
        assert "Last heartbeat\nnever" not in overview and " ago" in overview, overview
        assert "github.event" in overview and "Retry every failed job…" in overview
        await browser.shot("console-overview.png")

        await browser.follow("Failed")
        assert "chat not found" in await browser.text()
        await browser.shot("console-failed.png")
        await browser.type_into("kind", "telegram.send")
        await browser.press("Filter")
        await browser.follow("Retry the failed jobs this list's filters match", partial=True)
        assert "failed job(s) match (kind telegram.send)" in await browser.text()
        await browser.follow("Failed")
        await browser.follow("Retry every failed job…")
        assert len(await browser.cells("table.by-kind tbody tr")) == 4  # the history's kinds
        await browser.shot("console-retry-failed.png")

        await browser.open(f"/ui/jobs/{failed}")
        await browser.press("Retry")
        await browser.wait_for_text(f"Job {failed} done", reload=True)
        await browser.open(f"/ui/jobs/{failed}")
        await browser.shot("console-job.png")

        await browser.follow("Events")
        assert "site" in await browser.text()
        await browser.shot("console-events.png")
        await browser.open(f"/ui/events/{events[31]}")
        await browser.press("Replay")
        await browser.wait_for_text("Replayed: created job(s)")
        await wait_until(lambda: db.fetch_val(
            "select count(*) = 2 from jobs where recipient = '31' and status = 'done'"), timeout=15)
        await browser.do(lambda d: d.refresh())
        await browser.shot("console-event.png")

        await browser.open("/ui/recipients/31")
        await browser.press("Pause")
        await browser.wait_for_text("Paused: its jobs stay pending")
        timeline = await browser.text()
        assert "attempt 1: retry" in timeline and "Internal Server Error" in timeline, timeline
        await browser.shot("console-recipient.png")
        await browser.press("Resume")
        await browser.wait_for_text("Resumed: its jobs run again.")

        await browser.follow("Audit")
        assert "recipient_resume" in await browser.text()
        await browser.shot("console-audit.png")
