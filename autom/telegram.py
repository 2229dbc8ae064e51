"""The Telegram Bot API client: messages to chats, alerts to the operators' chat.

``open_telegram(settings)`` owns an ``httpx.AsyncClient`` and yields a
``TelegramClient``. Every call is bounded twice: ``httpx.Timeout`` per socket
operation, and ``trio.fail_after(HTTP_TIMEOUT_SECONDS)`` around the whole
request, because httpx's timeouts are per operation (a body trickled slowly
passes them; measured, research/trio-stack.md §3).

Outcomes map onto autom's error tree through ``autom.checks``: 429 → ``Retry``
(Telegram's ``retry_after``), other 4xx and ``{"ok": false}`` → ``PermanentError``,
5xx / network / timeout → ``TransientError``.

The bot token is part of every request URL, so it must never leave this module
in a message: httpx exceptions (which carry the URL) are translated and not
chained, and a filter on the ``httpx`` logger redacts its "HTTP Request: POST
https://…/bot<token>/…" lines.

Alerts (``alert``, ``alert_job_failed``) never raise, and are throttled
(``AlertThrottle``): past a few a minute the rest are counted and summarised in
one message once the window allows it again (CONTRACT.md).
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from autom.checks import check, classify_exception, one_line
from autom.config import Settings
from autom.errors import ConfigError, JobError, PermanentError, TransientError

logger = logging.getLogger("autom.telegram")

#: Telegram's limit on a message text (after entity parsing), in UTF-16 code units.
MAX_TEXT = 4096

#: What a call returns in log-only mode (``autom dev`` without a token).
LOG_ONLY_RESULT: dict[str, Any] = {"message_id": 0, "log_only": True}

# Parameters that are secrets themselves (setWebhook's secret_token): never logged.
_SECRET_PARAMS = frozenset({"secret_token"})


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
        throttle: AlertThrottle | None = None,
    ) -> None:
        if not log_only and not settings.telegram_bot_token:
            raise ConfigError("missing required setting TELEGRAM_BOT_TOKEN")
        self._log_only = log_only
        self._api = settings.telegram_api.rstrip("/")
        self._token = settings.telegram_bot_token or ""
        self._alert_chat_id = settings.telegram_alert_chat_id
        self._deadline = settings.http_timeout_seconds
        self._owns_http = http is None and not log_only
        self._http = http
        if self._owns_http:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(settings.http_timeout_seconds))
        self.throttle = throttle if throttle is not None else AlertThrottle()
        if self._token:
            _redact_token_in_httpx_logs(self._token)

    def __repr__(self) -> str:
        mode = "log-only" if self._log_only else self._api
        return f"<TelegramClient {mode}>"

    @property
    def log_only(self) -> bool:
        """Whether calls go to the log instead of the network."""
        return self._log_only

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http and self._http is not None:
            await self._http.aclose()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Call Bot API ``method`` with JSON ``params``; return Telegram's whole answer.

        The answer is the decoded envelope ``{"ok": true, "result": ..., ...}`` (``result``
        is not always an object: setWebhook's is ``true``, and its ``description`` is what
        an operator wants to read). Raises ``Retry`` / ``PermanentError`` /
        ``TransientError``; never an httpx exception, never a message with the token.
        """
        if self._log_only:
            self._log_call(method, params)
            return {"ok": True, "result": dict(LOG_ONLY_RESULT), "log_only": True}
        assert self._http is not None
        what = f"telegram {method}"
        url = f"{self._api}/bot{self._token}/{method}"
        error: JobError | None = None
        try:
            with trio.fail_after(self._deadline):
                response = await self._http.post(url, json=params)
        except Exception as exc:  # httpx errors carry the URL: translate all of them
            error = classify_exception(exc, what)
        # raised outside the except block so the httpx exception is not even the __context__
        # of ours: a stored or logged traceback cannot show its URL
        if error is not None:
            raise error
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

    async def send_message(self, chat_id: int | str, text: str, **extra: Any) -> dict[str, Any]:
        """Send ``text`` to ``chat_id``; return the sent Message object.

        Texts over Telegram's 4096 limit are cut to fit, ending in "…", rather than refused:
        a long reply is better than none. ``extra`` goes to the API as is (parse_mode,
        reply_to_message_id, ...).
        """
        body = await self.call("sendMessage", chat_id=chat_id, text=fit_text(text), **extra)
        result = body.get("result")
        return result if isinstance(result, dict) else {"result": result}

    async def alert(self, text: str) -> bool:
        """Send ``text`` to TELEGRAM_ALERT_CHAT_ID; True if it was delivered.

        Never raises (but ``trio.Cancelled`` passes): a failure is logged in one line and
        reported as False. Bounded by the same total deadline as every call. Not throttled:
        see ``alert_throttled``.
        """
        if self._log_only:
            self._log_call("sendMessage", {"chat_id": self._alert_chat_id, "text": text})
            return True
        if not self._alert_chat_id:
            logger.warning("alert not sent: TELEGRAM_ALERT_CHAT_ID is not set: %s", one_line(text))
            return False
        try:
            await self.send_message(self._alert_chat_id, text)
        except Exception as exc:  # an alert must never take its caller down with it
            reason = str(exc) if isinstance(exc, JobError) else str(classify_exception(exc, "telegram alert"))
            logger.warning("alert not delivered (%s): %s", one_line(reason), one_line(text, 120))
            return False
        return True

    async def alert_throttled(self, text: str, *, now: float | None = None) -> bool:
        """``alert`` through the throttle; True if ``text`` itself was delivered.

        ``now`` (``trio.current_time()`` by default) is the throttle's clock. A pending
        summary of suppressed alerts goes out first when the window has room.
        """
        now = trio.current_time() if now is None else now
        await self.flush_summary(now)
        if not self.throttle.admit(now):
            logger.info("alert suppressed by the throttle: %s", one_line(text, 120))
            return False
        return await self.alert(text)

    async def alert_job_failed(self, job_id: int, kind: str, attempts: int, error: object) -> bool:
        """The alert for a job that ended in ``failed`` (CONTRACT.md: id, kind and error); throttled."""
        plural = "" if attempts == 1 else "s"
        text = f"autom: job {job_id} ({kind}) failed after {attempts} attempt{plural}: {one_line(str(error), 500)}"
        return await self.alert_throttled(text)

    async def flush_summary(self, now: float | None = None, *, force: bool = False) -> bool:
        """Send the summary of suppressed alerts if there is one and the window has room.

        Called before every throttled alert, by ``run_alert_summaries``, and with
        ``force=True`` once at shutdown, so the summary also goes out when the storm is
        over or the process stops. Returns whether a summary was delivered.
        """
        now = trio.current_time() if now is None else now
        summary = self.throttle.take_summary(now, force=force)
        return await self.alert(summary) if summary else False

    async def run_alert_summaries(
        self, *, interval: float = 10.0, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Flush the alert summary every ``interval`` seconds; never returns (cancel it)."""
        task_status.started()
        while True:
            await self.flush_summary()
            await trio.sleep(interval)

    def _log_call(self, method: str, params: dict[str, Any]) -> None:
        others = sorted(k for k in params if k not in ("chat_id", "text"))
        logger.info(
            "telegram (log only) %s chat=%s text=%r%s",
            method,
            params.get("chat_id"),
            params.get("text"),
            f" params={others}" if others else "",
        )


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


def fit_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to at most ``limit`` UTF-16 code units, ending in "…" when cut.

    Telegram counts UTF-16 units, so an emoji counts twice; cutting by code points alone
    could still be refused. A surrogate pair is never split.
    """
    if len(text) <= limit // 2 or _utf16_len(text) <= limit:
        return text
    budget = limit - 1  # room for "…" (one unit)
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > budget:
            return text[:index] + "…"
    return text  # unreachable: the text was longer than the limit


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class AlertThrottle:
    """At most ``limit`` alerts per rolling ``window`` seconds; the rest are counted.

    Pure logic, time passed in (``now``, any monotonic clock in seconds). ``admit(now)``
    says whether an alert may go out and counts the ones that may not;
    ``take_summary(now)`` returns the one-line summary of the counted ones once the
    window has room for it (the summary takes a slot itself), else None.
    """

    def __init__(self, limit: int = 5, window: float = 60.0) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("an alert throttle needs limit >= 1 and window > 0")
        self.limit = limit
        self.window = window
        self._sent: deque[float] = deque()
        self.suppressed = 0

    def _has_room(self, now: float) -> bool:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()
        return len(self._sent) < self.limit

    def admit(self, now: float) -> bool:
        """True if an alert may be sent at ``now`` (and count it as sent), else count it as suppressed.

        While a summary is pending, new alerts are suppressed too: the summary goes first,
        so the operators read the count before anything newer.
        """
        if self.suppressed == 0 and self._has_room(now):
            self._sent.append(now)
            return True
        self.suppressed += 1
        return False

    def take_summary(self, now: float, *, force: bool = False) -> str | None:
        """The summary of suppressed alerts if there are any and the window has room, else None.

        ``force`` ignores the window (at shutdown: a held count must not die with the process).
        """
        if self.suppressed == 0 or not (force or self._has_room(now)):
            return None
        count, self.suppressed = self.suppressed, 0
        self._sent.append(now)
        period = "minute" if self.window == 60 else f"{self.window:g} s"
        noun = "alert" if count == 1 else "alerts"
        return f"{count} more {noun} suppressed in the last {period}; see `autom failed`"


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
    "MAX_TEXT",
    "AlertThrottle",
    "TelegramClient",
    "fit_text",
    "open_telegram",
]
