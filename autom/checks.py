"""Classifying the outcome of an outgoing HTTP call into autom's error tree, and one-line texts.

``check(response, what)``: 2xx passes; 429 (and a 503/529 with ``Retry-After``) raises
``Retry``, another 4xx ``PermanentError``, the rest ``TransientError``.
``classify_exception(exc, what)``: a call that produced no response is a ``TransientError``.
``one_line`` (every one-line message autom writes: errors, logs, answers) and ``redact``.
Invariant: a message is ``"{what}: HTTP {status} {description}"`` and never contains
a URL or anything shaped like a bot token: these texts end up in ``jobs.last_error``,
logs and Telegram alerts.
"""

from __future__ import annotations

import http
import json
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import trio

from autom.errors import JobError, PermanentError, Retry, TransientError

#: Longest description kept from a response or an exception (the rest is cut with "…").
MAX_DESCRIPTION = 200

#: Seconds to wait after a 429 that says nothing about how long.
DEFAULT_RETRY_AFTER = 1.0

# A Telegram bot token is "<bot id>:<35 url-safe characters>"; in URLs it follows "/bot".
# The bare-token pattern is deliberately loose (≥ 20 characters after the colon) so a
# token that shows up outside a URL (an echoed parameter, say) is caught too.
_TOKEN_IN_PATH = re.compile(r"/bot[^/\s]+")
_BARE_TOKEN = re.compile(r"\b\d{3,}:[A-Za-z0-9_-]{20,}")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_SPACE = re.compile(r"\s+")


def redact(text: str) -> str:
    """``text`` with URLs and anything shaped like a bot token replaced by placeholders."""
    text = _URL.sub("<url>", text)
    text = _TOKEN_IN_PATH.sub("/bot<token>", text)
    return _BARE_TOKEN.sub("<token>", text)


def one_line(text: str, limit: int = MAX_DESCRIPTION) -> str:
    """``text`` redacted, its whitespace collapsed to single spaces, cut to ``limit`` characters."""
    text = _SPACE.sub(" ", redact(text)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


#: an overloaded server's answers (503 Service Unavailable; 529, some model APIs' "overloaded")
OVERLOADED = (503, 529)


def check(response: httpx.Response, what: str) -> None:
    """Return if ``response`` is a 2xx; otherwise raise the ``JobError`` the queue should act on.

    ``what`` names the call for the message (``"telegram sendMessage"``). A 429 raises
    ``Retry`` whose ``after`` comes from the ``Retry-After`` header (seconds or an HTTP
    date), else from Telegram's JSON ``parameters.retry_after``, else 1 s; a 503 or 529
    with a ``Retry-After`` header raises ``Retry`` after it (without one: ``TransientError``).
    """
    status = response.status_code
    if 200 <= status < 300:
        return
    body = _json_body(response)
    message = f"{what}: HTTP {status} {_description(response, body)}"
    if status == 429:
        raise Retry(message, after=retry_after_seconds(response, body=body))
    if status in OVERLOADED and response.headers.get("retry-after") is not None:
        after = _parse_retry_after(response.headers["retry-after"].strip(), datetime.now(UTC))
        if after is not None:
            raise Retry(message, after=after)
    if 400 <= status < 500:
        raise PermanentError(message)
    raise TransientError(message)


def retry_after_seconds(response: httpx.Response, *, body: object = None, now: datetime | None = None) -> float:
    """How long a 429 asks us to wait, in seconds (never negative; 1 s when it does not say).

    ``body`` is the decoded JSON body if the caller has it; ``now`` is injectable for tests
    of the HTTP-date form.
    """
    header = response.headers.get("retry-after")
    if header is not None:
        seconds = _parse_retry_after(header.strip(), now or datetime.now(UTC))
        if seconds is not None:
            return seconds
    if body is None:
        body = _json_body(response)
    if isinstance(body, dict):
        parameters = body.get("parameters")
        if isinstance(parameters, dict):
            value = parameters.get("retry_after")
            # bool is an int subclass; `true` is not a number of seconds
            if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
                try:
                    return max(0.0, float(value))
                except OverflowError:  # an int too big for a float: "very long" (RetryPolicy caps it)
                    return float("inf") if value > 0 else 0.0
    return DEFAULT_RETRY_AFTER


def classify_exception(exc: Exception, what: str) -> JobError:
    """The ``JobError`` for a call that failed without a usable response.

    Timeouts (httpx's per-operation ones and ``trio.TooSlowError`` from the total
    deadline) and transport errors are transient. A malformed URL is permanent (retrying
    cannot fix configuration). A ``JobError`` is returned unchanged. The message is one
    line and never contains the URL; raise the result ``from None`` (or outside the
    ``except`` block) so the original exception, which may, is not chained.
    """
    if isinstance(exc, JobError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, trio.TooSlowError):
        return TransientError(f"{what}: no complete answer within the deadline")
    if isinstance(exc, httpx.TimeoutException):
        return TransientError(f"{what}: timed out ({name})")
    detail = one_line(str(exc))
    suffix = f": {detail}" if detail else ""
    if isinstance(exc, httpx.InvalidURL):
        return PermanentError(f"{what}: invalid URL ({name})")
    if isinstance(exc, httpx.TransportError):
        return TransientError(f"{what}: {name}{suffix}")
    # anything else (a decoding error, a bug in a library): transient, as a handler's
    # exception that is not a JobError is (README, Handlers), but with the same care about what the message holds
    return TransientError(f"{what}: {name}{suffix}")


_DELAY_SECONDS = re.compile(r"\d+(?:\.\d+)?")  # RFC 9110: 1*DIGIT (a fraction tolerated)


def _parse_retry_after(value: str, now: datetime) -> float | None:
    # delay-seconds or an HTTP-date; anything else ("-5", "inf", "1_000", "soon") is
    # malformed: None, and the caller falls back. Huge values are capped by RetryPolicy.
    if _DELAY_SECONDS.fullmatch(value):
        return float(value)  # 400 digits give inf, never an error
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def _json_body(response: httpx.Response) -> object:
    try:
        return json.loads(response.content)
    except (httpx.ResponseNotRead, ValueError, UnicodeDecodeError):
        return None


def _description(response: httpx.Response, body: object) -> str:
    if isinstance(body, dict) and body.get("description") not in (None, ""):
        return one_line(str(body["description"]))
    # not Telegram's JSON: the reason phrase only. A proxy's error page could echo the URL,
    # and it is rarely worth a line in last_error anyway.
    phrase = response.reason_phrase
    if not phrase:
        try:
            phrase = http.HTTPStatus(response.status_code).phrase
        except ValueError:
            phrase = ""
    return one_line(phrase) or "(no description)"
