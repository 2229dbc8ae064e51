"""Query parameters of ``/admin`` and ``/ui``: every one checked, none silently ignored.

A route declares the parameters it takes, each with a parser; an unknown
parameter, a repeated one or a malformed value is ``BadParameter`` naming it (the
admin API answers 400 with that line, the console shows it above the form). An
empty value (``?status=``, what an HTML form sends for an untouched field) counts
as not given. Numbers are clamped to their documented range by refusing what
lies outside it, never by trusting it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from werkzeug.routing import BaseConverter

from autom.errors import BadRequest
from autom.ops import JOB_STATUSES, MAX_NAME, JobFilter, parse_run_at

#: Largest id PostgreSQL's ``bigint`` holds; larger ones cannot exist (and would not bind).
MAX_ID = 2**63 - 1

_DIGITS = re.compile(r"[0-9]{1,19}")
_RELATIVE = re.compile(r"([0-9]{1,6})([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class NameConverter(BaseConverter):
    """``<name:r>`` in a route: a recipient (or kind) that may hold ``/`` (``site:/contact``, linked as
    ``site%3A%2Fcontact``: the server decodes ``%2F`` before routing). It takes the rest of the path up to
    the rule's own suffix (``/ui/recipients/<name:r>/pause``), leading, doubled and trailing slashes
    included, line breaks too; never empty."""

    regex = "(?s:.+?)"  # "." alone stops at a line break: the route was then a 404
    part_isolating = False


class BadParameter(BadRequest):
    """A query parameter is unknown, repeated or malformed; the message names it (the 400 answer)."""


Parser = Callable[[str, str], Any]
"""``parser(name, raw) -> value``, raising ``BadParameter`` naming ``name``."""


def parse_query(items: Iterable[tuple[str, str]], spec: Mapping[str, Parser]) -> dict[str, Any]:
    """The parameters of ``spec`` from ``items`` (name, raw value pairs), absent ones ``None``.

    Raises ``BadParameter`` for a name ``spec`` does not have, a name given twice,
    or a value its parser refuses.
    """
    values: dict[str, Any] = dict.fromkeys(spec)
    seen: set[str] = set()
    for name, raw in items:
        if name not in spec:
            shown = name if len(name) <= 40 and name.isprintable() else repr(name[:40])
            raise BadParameter(f"unknown query parameter {shown!r} (known: {', '.join(sorted(spec))})")
        if name in seen:
            raise BadParameter(f"query parameter {name!r} given more than once")
        seen.add(name)
        if raw != "":
            values[name] = spec[name](name, raw)
    return values


def status(name: str, raw: str) -> str:
    """A job status."""
    if raw not in JOB_STATUSES:
        raise BadParameter(f"{name} must be one of {', '.join(JOB_STATUSES)}")
    return raw


def text(name: str, raw: str) -> str:
    """A kind, recipient or source: printable, at most ``MAX_NAME`` characters."""
    if len(raw) > MAX_NAME or not raw.isprintable():
        raise BadParameter(f"{name} must be printable text of at most {MAX_NAME} characters")
    return raw


def ident(name: str, raw: str) -> int:
    """An id: ASCII digits, 1 ≤ id ≤ 2^63-1 (``int()`` would also take "١٢", " 7" or "1_0")."""
    if _DIGITS.fullmatch(raw) is None or not 1 <= (value := int(raw)) <= MAX_ID:
        raise BadParameter(f"{name} must be a positive integer (at most {MAX_ID})")
    return value


def limit(maximum: int) -> Parser:
    """A page size from 1 to ``maximum``."""

    def parse(name: str, raw: str) -> int:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= maximum:
            raise BadParameter(f"{name} must be an integer from 1 to {maximum}")
        return int(raw)

    return parse


def parse_time(raw: str, now: datetime) -> datetime:
    """An ISO 8601 time (no zone = UTC) or an age before ``now``: ``90s``, ``30m``, ``6h``, ``7d``; in UTC.

    Raises ``ValueError`` with a one-line reason, also for a time outside the years
    1 to 9999 (``999999d`` ago).
    """
    raw = raw.strip()
    relative = _RELATIVE.fullmatch(raw)
    try:
        if relative:
            return now - timedelta(seconds=int(relative[1]) * _UNITS[relative[2]])
        when = datetime.fromisoformat(raw)
        # in UTC, so that every value a query gets lies within the years 1 to 9999
        return when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
    except OverflowError:  # 999999d ago, or 0001-01-01T00:00+14:00: before the year 1 (or after 9999)
        raise ValueError("is out of range (years 1 to 9999)") from None
    except ValueError:
        raise ValueError("must be an ISO 8601 time (2026-12-01T09:30:00Z) or an age such as 30m, 6h, 7d") from None


def when(name: str, raw: str) -> datetime:
    """A time bound (``parse_time`` against the current time)."""
    try:
        return parse_time(raw, datetime.now(UTC))
    except ValueError as exc:
        raise BadParameter(f"{name} {exc}") from None


def run_at(name: str, raw: str) -> datetime:
    """When a rescheduled job may run: ``now`` or an ISO 8601 time (``autom.ops.parse_run_at``)."""
    try:
        return parse_run_at(raw, datetime.now(UTC))
    except ValueError as exc:
        raise BadParameter(f"{name} {exc}") from None


#: the filters of a job list, ``GET /admin/jobs`` and ``/ui/jobs`` alike (``JobFilter``'s fields)
JOB_FILTERS: dict[str, Parser] = {
    "status": status, "kind": text, "recipient": text, "event_id": ident,
    "since": when, "until": when, "failed_since": when,
}
#: the filters of an event list, ``GET /admin/events`` and ``/ui/events`` alike
EVENT_FILTERS: dict[str, Parser] = {"source": text, "since": when, "until": when}


def job_filter(values: Mapping[str, Any]) -> JobFilter:
    """The ``JobFilter`` of parsed ``values`` (a ``parse_query`` result over ``JOB_FILTERS`` and more)."""
    return JobFilter(**{name: values[name] for name in JOB_FILTERS})
