"""The Telegram Bot API client: messages to chats, alerts to the operators' chat.

``open_telegram(settings)`` owns its HTTP road to the Bot API (``autom.origin``'s kept-alive
connections; httpx behind a proxy or with traces on) and yields a ``TelegramClient``
(``send_message``, ``edit_message``, ``answer_callback``, ``alert``; ``for_job`` binds it to
one claim, so a split text's parts are recorded as sent and resumed). Outcomes map onto
the error tree through ``autom.checks`` (429 ``Retry``, a blocked chat ``ChatBlocked``,
other 4xx ``PermanentError``, the rest ``TransientError``). Invariants: every call is
bounded in total by HTTP_TIMEOUT_SECONDS; the bot token never leaves this module in a
message or a log line; ``alert`` never raises. Why: docs/design/telegram.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import trio

from autom import tracing
from autom.checks import check, classify_exception, one_line
from autom.config import Settings
from autom.errors import ChatBlocked, ConfigError, Defer, JobError, LeaseLost, PermanentError, Retry, TransientError
from autom.limits import MAX_TEXT, SendLimiter, split_text, units
from autom.origin import OriginClient, environment_proxied

if TYPE_CHECKING:
    from autom.jobs.models import Job

logger = logging.getLogger("autom.telegram")

#: Telegram's limit on a button's callback data, in bytes (UTF-8)
MAX_CALLBACK_DATA = 64
#: how many turns of the alert chat ``alert`` waits for before it gives up
ALERT_TURNS = 3
#: the limiter's key for answers to button presses: the bot's budget, no chat's spacing
CALLBACK_BUDGET = ":callbacks"

#: rows of ``(label, data)`` pairs: an inline keyboard (``send_message(..., buttons=...)``)
Buttons = Sequence[Sequence[tuple[str, str]]]

#: What a call returns in log-only mode (``autom dev`` without a token).
LOG_ONLY_RESULT: dict[str, Any] = {"message_id": 0, "log_only": True}

#: What Telegram's 403 says when the chat will take no message until it comes back: the
#: user blocked the bot or was deleted, or the bot was removed from the group or channel.
BLOCKED_DESCRIPTIONS = ("bot was blocked by the user", "user is deactivated", "bot was kicked from")


class TelegramClient:
    """A Bot API client bound to one token; cheap to share between all tasks of a process.

    ``http`` is borrowed if given (the caller closes it), otherwise created and owned.
    ``log_only`` logs calls instead of making them (no token needed).
    """

    def __init__(
        self,
        settings: Settings,
        http: httpx.AsyncClient | None = None,
        *,
        log_only: bool = False,
    ) -> None:
        if not log_only and not settings.telegram_bot_token:
            raise ConfigError("missing required setting TELEGRAM_BOT_TOKEN")
        self._log_only = log_only
        self._api = settings.telegram_api.rstrip("/")
        self._token = settings.telegram_bot_token or ""
        self._alert_chat_id = settings.telegram_alert_chat_id
        self._deadline = settings.http_timeout_seconds
        self._owns_http = http is None and not log_only
        self._lease_seconds = settings.job_lease_seconds
        #: the claim this client acts for (``for_job``), and its split sends so far
        self._job: Job | None = None
        self._splits = 0
        #: the button presses this client answered (``answered``)
        self._answered: set[str] = set()
        self._http = http
        #: the lean road to the Bot API (autom/origin.py), unless a proxy or tracing asks for httpx
        self._origin: OriginClient | None = None
        if self._owns_http:
            if tracing.active() or environment_proxied(self._api):
                self._http = httpx.AsyncClient(timeout=httpx.Timeout(settings.http_timeout_seconds))
                tracing.instrument_http(self._http, secret=self._token)
            else:
                self._origin = OriginClient(self._api, timeout=settings.http_timeout_seconds)
        #: Telegram's send limits shared by every replica (autom/limits.py); the service sets it
        self.limiter: SendLimiter | None = None
        if self._token:
            _redact_token_in_httpx_logs(self._token)

    def __repr__(self) -> str:
        mode = "log-only" if self._log_only else self._api
        return f"<TelegramClient {mode}>"

    @property
    def log_only(self) -> bool:
        """Whether calls go to the log instead of the network."""
        return self._log_only

    def for_job(self, job: Job) -> TelegramClient:
        """This client acting for one claim of ``job`` (``ctx.telegram``: one per run).

        Its split texts are recorded part by part (with the service's limiter), so a later
        run of the job resumes each at the first part not sent. It shares everything else
        with this client and closes nothing.
        """
        bound = copy.copy(self)
        bound._job = job
        bound._splits = 0
        bound._answered = set()
        bound._owns_http = False
        return bound

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http and self._http is not None:
            await self._http.aclose()
        if self._owns_http and self._origin is not None:
            await self._origin.aclose()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Call Bot API ``method`` with JSON ``params``; return Telegram's whole answer.

        The answer is the decoded envelope ``{"ok": true, "result": ..., ...}`` (``result``
        is not always an object: setWebhook's is ``true``, and its ``description`` is what
        an operator wants to read). Raises ``Retry`` / ``PermanentError`` /
        ``TransientError``; never an httpx exception, never a message with the token.
        """
        if method == "answerCallbackQuery":
            self._answered.add(str(params.get("callback_query_id")))
        if self._log_only:
            self._log_call(method, params)
            return {"ok": True, "result": dict(LOG_ONLY_RESULT), "log_only": True}
        what = f"telegram {method}"
        path = f"/bot{self._token}/{method}"
        error: JobError | None = None
        try:
            with trio.fail_after(self._deadline):
                if self._origin is not None:
                    response = await self._origin.post_json(path, params)
                    logger.debug("telegram %s: HTTP %d", method, response.status_code)
                else:
                    assert self._http is not None
                    response = await self._http.post(self._api + path, json=params)
        except Exception as exc:  # httpx errors carry the URL: translate all of them
            error = classify_exception(exc, what)
        # raised outside the except block so the httpx exception is not even the __context__
        # of ours: a stored or logged traceback cannot show its URL
        if error is not None:
            raise error
        if response.status_code == 403:
            _raise_if_blocked(response, what, params.get("chat_id"))
        check(response, what)
        try:
            body = response.json()
        except ValueError:
            raise TransientError(f"{what}: HTTP {response.status_code} with a body that is not JSON") from None
        if not isinstance(body, dict) or body.get("ok") is not True:
            description = body.get("description") if isinstance(body, dict) else None
            raise PermanentError(
                f"{what}: HTTP {response.status_code} ok=false {one_line(str(description or '(no description)'))}"
            )
        return body

    async def send_message(self, chat_id: int | str, text: str, *, buttons: Buttons | None = None,
                           **extra: Any) -> dict[str, Any]:
        """Send ``text`` to ``chat_id``; return the (last) sent Message object (``message_id``...).

        ``buttons``: rows of ``(label, data)`` pairs, an inline keyboard under the message
        (a press arrives as a ``telegram.callback`` job with ``data``); each ``data`` at most
        64 bytes (UTF-8), else ``PermanentError`` before anything is sent.
        Texts over Telegram's 4096 limit are split into several messages, on line
        boundaries where possible (``autom.limits.split_text``); the keyboard goes under
        the last. ``extra`` goes to the API as is (parse_mode, reply_to_message_id, ...).
        With a ``limiter`` (the
        service sets one) the send waits for Telegram's limits by raising
        ``autom.errors.Defer``, and a 429 holds the chat and defers too. A chat that
        blocked the bot raises ``ChatBlocked`` (the job ends cancelled): Telegram said so
        (the chat is then marked, its pending Telegram jobs cancelled), or it is marked
        already (nothing is sent). Bound to a job (``for_job``), each part of a split text
        is recorded as sent, and the job's next run resumes at the first part not sent;
        a text whose parts were all sent by an earlier run returns ``{"message_id": ...}``
        of its last part without sending.
        """
        if buttons is not None:
            extra = {**extra, "reply_markup": inline_keyboard(buttons)}
        return await self._send(chat_id, text, extra)

    async def edit_message(self, chat_id: int | str, message_id: int, text: str, *,
                           buttons: Buttons | None = None, **extra: Any) -> dict[str, Any]:
        """Replace the text (and the buttons) of a message the bot sent; return the edited Message.

        ``buttons`` as for ``send_message``; None leaves the message without buttons.
        Within the chat's send limits (``Defer`` / ``ChatBlocked`` as ``send_message``). An
        edit to what the message already says (a rerun's) is not an error: Telegram's "message
        is not modified" returns ``{"message_id": message_id}``. A text over 4096 characters
        is a ``PermanentError`` (an edit cannot be split).
        """
        if units(text) > MAX_TEXT:
            raise PermanentError(f"telegram editMessageText: the text has {units(text)} characters (UTF-16 "
                                 f"units), more than Telegram's {MAX_TEXT}; an edit cannot be split")
        params: dict[str, Any] = {"chat_id": chat_id, "message_id": message_id, "text": text, **extra}
        if buttons is not None:
            params["reply_markup"] = inline_keyboard(buttons)
        if self.limiter is not None:
            await self.limiter.acquire(chat_id, job=self._job)
        try:
            body = await self._guarded("editMessageText", chat_id, params)
        except PermanentError as exc:
            if isinstance(exc, ChatBlocked) or "message is not modified" not in str(exc):
                raise
            return {"message_id": message_id}
        if self.limiter is not None:
            await self.limiter.sent(chat_id, job=self._job)
        result = body.get("result")
        return result if isinstance(result, dict) else {"message_id": message_id}

    async def answer_callback(self, callback_id: str, text: str | None = None, **extra: Any) -> bool:
        """Answer a button press (``job.payload["id"]`` of a ``telegram.callback`` job): the user's
        client stops its spinner and shows ``text`` (if any) as a notice.

        ``extra`` goes to answerCallbackQuery as is (``show_alert=True``: a dialog). Within the
        bot's send budget (no chat's spacing: an answer goes to no chat). Returns False, without
        raising, when Telegram says the query is too old or already answered (a rerun's second
        answer): there is nothing left to answer.
        """
        params: dict[str, Any] = {"callback_query_id": callback_id, **extra}
        if text is not None:
            params["text"] = text
        if self.limiter is not None:
            await self.limiter.acquire(CALLBACK_BUDGET, interval=0.0, job=self._job)
        try:
            await self._guarded("answerCallbackQuery", None, params)
        except PermanentError as exc:
            if "query is too old" not in str(exc) and "query id is invalid" not in str(exc).lower():
                raise
            logger.info("telegram callback %s was not answered: %s", callback_id, one_line(str(exc)))
            return False
        return True

    def answered(self, callback_id: str) -> bool:
        """Whether this run answered the button press ``callback_id`` (tried to, at least)."""
        return callback_id in self._answered

    async def _send(self, chat_id: int | str, text: str, extra: dict[str, Any], *, priority: bool = False
                    ) -> dict[str, Any]:
        parts = split_text(text)
        limiter = self.limiter
        job = self._job
        slot: str | None = None
        first = 0
        if len(parts) > 1 and job is not None and limiter is not None and not priority:
            # the n-th split send of this run, of this chat, text and parameters: a rerun that
            # sends the same resumes it; one that sends something else starts afresh
            slot = f"{self._splits}:{_digest(chat_id, text, extra)}"
            self._splits += 1
            first, last_id = await limiter.parts_sent(job.id, slot)
            if first >= len(parts):
                return {"message_id": last_id}
        if limiter is not None:
            if priority:  # an alert: its chat's turn first (shared by every replica's alerts)
                turn = await limiter.space(chat_id)
                if turn:
                    raise Defer(f"telegram: alert chat {chat_id} has its next turn in {turn:.2f}s (its send "
                                "limit)", after=turn)
            await limiter.acquire(chat_id, parts=len(parts) - first, priority=priority,
                                  job=None if priority else job)
        # a keyboard belongs under the last part
        head = {k: v for k, v in extra.items() if k != "reply_markup"}
        result: Any = None
        for index in range(first, len(parts)):
            if index > first and limiter is not None:
                await trio.sleep(limiter.interval(chat_id))  # the parts' slots are taken: keep them spaced
            params = extra if index == len(parts) - 1 else head
            body = await self._guarded("sendMessage", chat_id, {"chat_id": chat_id, "text": parts[index], **params},
                                       priority=priority)
            result = body.get("result")
            if slot is not None and job is not None and limiter is not None:
                message_id = result.get("message_id") if isinstance(result, dict) else None
                await self._record(limiter, job, slot, index + 1, message_id)
        if limiter is not None and not priority:  # alerts keep to their own spacing (``space``)
            # the chat's interval from Telegram's answer, not only from the take
            await limiter.sent(chat_id, job=job)
        return result if isinstance(result, dict) else {"result": result}

    async def _guarded(self, method: str, chat_id: int | str | None, params: dict[str, Any], *,
                       priority: bool = False) -> dict[str, Any]:
        """``call``, with a 429 holding the chat (or, without one, the bot's answers) and deferring the
        job, and a blocked chat marked (through the limiter, when there is one)."""
        limiter = self.limiter
        try:
            return await self.call(method, **params)
        except Retry as exc:
            if limiter is None:
                raise
            held = CALLBACK_BUDGET if chat_id is None else chat_id
            await limiter.pushed(held, exc.after)
            refused = Defer(f"{exc}; chat {held} holds its sends", after=exc.after)
            refused.refused = True  # bounded by MAX_DEFER_SECONDS (jobs/store.py: decide)
            if not priority:  # counted and logged once a minute by the limiter, not per job
                refused.quiet = True
                limiter.waited("refused", str(refused), self._job)
            raise refused from None
        except ChatBlocked as exc:
            if limiter is not None and not priority and chat_id is not None:
                await self._blocked(limiter, chat_id, exc)
            raise

    async def _blocked(self, limiter: SendLimiter, chat_id: int | str, exc: ChatBlocked) -> None:
        """Mark the chat blocked and cancel its other pending jobs; a failure to is only logged
        (the job still ends cancelled; the chat's next send finds out again)."""
        job_id = self._job.id if self._job is not None else None
        try:
            await limiter.block(chat_id, _description_of(str(exc)), job_id=job_id)
        except Exception as error:  # the job's own outcome does not depend on it
            logger.warning("could not mark telegram chat %s blocked: %s", chat_id, one_line(str(error)),
                           extra={"recipient": str(chat_id), "job_id": job_id})

    async def _record(self, limiter: SendLimiter, job: Job, slot: str, sent: int, message_id: Any) -> None:
        """Record ``sent`` parts of ``slot`` as sent, fenced by the job's lease (shielded: the part
        went out, its record must not be lost to a timeout or a shutdown)."""
        with trio.CancelScope(shield=True):
            held = await limiter.record_parts(job, slot, sent, message_id if isinstance(message_id, int) else None,
                                              within=self._lease_seconds)
        if not held:
            raise LeaseLost(f"job {job.id}: part {sent} of a split telegram message was sent, but this run lost "
                            "its claim before recording it")

    async def alert(self, text: str) -> bool:
        """Send ``text`` to TELEGRAM_ALERT_CHAT_ID; True if it was delivered.

        Never raises (but ``trio.Cancelled`` passes): a failure is logged in one line and
        reported as False. Each try is bounded by the same total deadline as every call;
        the alert chat's turn (its send limit, shared with the outbox's alerts) is waited
        for, at most ``ALERT_TURNS`` times. Not throttled (the watchdog's alerts are rare
        by construction; job failures go through the outbox's throttle).
        """
        for _ in range(ALERT_TURNS):
            result = await self.deliver_alert(text)
            if not result.held:
                return result.delivered
            await trio.sleep(min(result.retry_after, self._deadline))  # the alert chat's turn
        return False

    async def deliver_alert(self, text: str) -> AlertResult:
        """``alert``, also telling how long Telegram asked to wait (a 429's ``retry_after``)."""
        if self._log_only:
            self._log_call("sendMessage", {"chat_id": self._alert_chat_id, "text": text})
            return AlertResult(True)
        if not self._alert_chat_id:
            # Only `autom dev` runs without one (`autom run` requires it; dev's banner says
            # so once): the alert goes to the log, and counts as delivered, so it is not
            # tried again and warned about every minute for ever.
            logger.warning("alert (TELEGRAM_ALERT_CHAT_ID is not set, so only logged): %s", one_line(text))
            return AlertResult(True)
        try:
            await self._send(self._alert_chat_id, text, {}, priority=True)  # alerts come first
        except Defer as exc:
            if not exc.refused:  # the chat's turn, or a pause: held, not failed
                logger.debug("alert waits %.2fs for its chat's turn: %s", exc.after, one_line(text, 120))
                return AlertResult(False, exc.after, one_line(str(exc), 200), held=True)
            logger.warning("alert not delivered (%s): %s", one_line(str(exc)), one_line(text, 120))
            return AlertResult(False, exc.after, one_line(str(exc), 200))
        except Exception as exc:  # an alert must never take its caller down with it
            reason = str(exc) if isinstance(exc, JobError) else str(classify_exception(exc, "telegram alert"))
            logger.warning("alert not delivered (%s): %s", one_line(reason), one_line(text, 120))
            return AlertResult(False, exc.after if isinstance(exc, Retry | Defer) else 0.0, one_line(reason, 200))
        return AlertResult(True)

    def _log_call(self, method: str, params: dict[str, Any]) -> None:
        others = sorted(k for k in params if k not in ("chat_id", "text"))
        logger.info(
            "telegram (log only) %s chat=%s text=%r%s",
            method,
            params.get("chat_id"),
            params.get("text"),
            f" params={others}" if others else "",
        )


def inline_keyboard(buttons: Buttons) -> dict[str, Any]:
    """``reply_markup`` for rows of ``(label, data)`` pairs; ``PermanentError`` naming the button
    whose data is empty or longer than Telegram's 64 bytes, or a label that is not text."""
    if isinstance(buttons, str | bytes) or not isinstance(buttons, Sequence):
        raise PermanentError("telegram buttons must be rows (lists) of (label, data) pairs")
    rows: list[list[dict[str, str]]] = []
    for row in buttons:
        if isinstance(row, str | bytes) or not isinstance(row, Sequence):
            raise PermanentError(f"telegram buttons: row {row!r} is not a list of (label, data) pairs")
        keys: list[dict[str, str]] = []
        for pair in row:
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise PermanentError(f"telegram buttons: {pair!r} is not a (label, data) pair")
            label, data = pair
            if not isinstance(label, str) or not label.strip():
                raise PermanentError(f"telegram buttons: label {label!r} must be a non-empty text")
            if not isinstance(data, str) or not data:
                raise PermanentError(f"telegram button {label!r}: data must be a non-empty text, got {data!r}")
            size = len(data.encode("utf-8", "surrogatepass"))
            if size > MAX_CALLBACK_DATA:
                raise PermanentError(f"telegram button {label!r}: data {data[:80]!r} is {size} bytes; Telegram "
                                     f"takes at most {MAX_CALLBACK_DATA} (keep an id in it, not the content)")
            keys.append({"text": label, "callback_data": data})
        rows.append(keys)
    return {"inline_keyboard": rows}


def _raise_if_blocked(response: httpx.Response, what: str, chat_id: Any) -> None:
    """Raise ``ChatBlocked`` if this 403 says the chat blocked the bot (``BLOCKED_DESCRIPTIONS``)."""
    try:
        body = response.json()
    except ValueError:
        return
    description = body.get("description") if isinstance(body, dict) else None
    if isinstance(description, str) and any(d in description.lower() for d in BLOCKED_DESCRIPTIONS):
        raise ChatBlocked(f"{what}: HTTP 403 {one_line(description)}", chat_id=chat_id)


def _description_of(message: str) -> str:
    """Telegram's words in a ``ChatBlocked`` message ("... HTTP 403 Forbidden: bot was blocked ...")."""
    return message.split("HTTP 403 ", 1)[-1]


def _digest(chat_id: int | str, text: str, extra: dict[str, Any]) -> str:
    """A short digest naming one message: its chat, text and parameters."""
    data = json.dumps([str(chat_id), text, extra], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@asynccontextmanager
async def open_telegram(settings: Settings, *, log_only: bool | None = None) -> AsyncIterator[TelegramClient]:
    """A ``TelegramClient`` that owns its HTTP client for the duration of the block.

    ``log_only=None`` means "log only when no token is configured" (``autom dev``).
    """
    if log_only is None:
        log_only = not settings.telegram_bot_token
    client = TelegramClient(settings, log_only=log_only)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):  # closing sockets must not be skipped by a cancel
            await client.aclose()


@dataclass(frozen=True)
class AlertResult:
    """What ``deliver_alert`` did: delivered, or not (and how long a 429 asked to wait)."""

    delivered: bool
    retry_after: float = 0.0
    #: why it was not delivered, one line without secrets (``/health`` shows it)
    reason: str = ""
    #: not sent because the alert chat's limit (or a pause) asks to wait ``retry_after``:
    #: not a failure, the alert waits for its turn
    held: bool = False


class _RedactTokens(logging.Filter):
    """Rewrites records of the logger it sits on so no known token (or token-shaped text) remains."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = message
        for token in self.tokens:
            cleaned = cleaned.replace(token, "<token>")
        cleaned = _TOKEN_PATH.sub("/bot<token>/", cleaned)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


# token-shaped path segments only ("<digits>:<...>"), so other clients' /bottles/ stay readable
_TOKEN_PATH = re.compile(r"/bot\d+:[^/\s]+/")
_HTTPX_FILTER = _RedactTokens()


def _redact_token_in_httpx_logs(token: str) -> None:
    # httpx logs every request at INFO with its full URL, i.e. with our token. The filter
    # sits on the "httpx" logger itself (that is where httpx logs; filters on a logger run
    # before any handler), so it works whatever logging the CLI configures.
    _HTTPX_FILTER.tokens.add(token)
    httpx_logger = logging.getLogger("httpx")
    if _HTTPX_FILTER not in httpx_logger.filters:
        httpx_logger.addFilter(_HTTPX_FILTER)


__all__ = [
    "MAX_CALLBACK_DATA",
    "MAX_TEXT",
    "AlertResult",
    "Buttons",
    "TelegramClient",
    "inline_keyboard",
    "open_telegram",
    "split_text",
]
