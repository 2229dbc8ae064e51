"""One mapping from autom's error tree to HTTP answers, for the admin API (JSON) and the console (HTML).

Routes raise (``BadRequest``, ``NotFound``, ``Conflict``, ``DatabaseUnavailable``,
``QueryError``); they never build an error answer themselves. ``STATUS`` says which
status each answers, ``message`` the one line an operator reads (a refused query:
``autom.ops.query_error_message``, one text per SQLSTATE, never SQL or row data).
``register(bp, page, ...)`` installs the handlers on a blueprint (``json_page`` for
the API, the console's own page for ``/ui/``). A database
error is logged once, at warning, and sets the ``db_up`` gauge to 0.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from quart import Blueprint, Response

from autom.errors import AutomError, BadRequest, Conflict, DatabaseUnavailable, NotFound, QueryError
from autom.metrics import Metrics
from autom.ops import query_error_message
from autom.web.responses import error_response

#: the status each error of the tree answers (the most specific class listed wins)
STATUS: dict[type[AutomError], int] = {
    BadRequest: 400,
    NotFound: 404,
    Conflict: 409,
    DatabaseUnavailable: 503,
    QueryError: 503,
}
#: extra headers by class: a refused query (a lock or statement timeout) may well work a second later
HEADERS: dict[type[AutomError], dict[str, str]] = {QueryError: {"Retry-After": "1"}}

#: how a blueprint answers an error: ``page(status, message, headers)``
Page = Callable[[int, str, dict[str, str]], Awaitable[Response]]


def status_of(exc: AutomError) -> int:
    """The HTTP status ``exc`` answers (``STATUS``, by its class's nearest listed base)."""
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


#: what a person reads when the database does not answer at all (the console); a script reads ``UNAVAILABLE``
UNAVAILABLE = "database unavailable"
UNAVAILABLE_FOR_PEOPLE = "The database is unavailable; try again in a moment."


def message(exc: AutomError, *, for_people: bool = False) -> str:
    """The one line an operator reads about ``exc``: a database error says what kind, never SQL or data.

    ``for_people``: the console's wording where it differs (a sentence, not a script's token).
    """
    if isinstance(exc, DatabaseUnavailable):
        return UNAVAILABLE_FOR_PEOPLE if for_people else UNAVAILABLE
    if isinstance(exc, QueryError):
        return query_error_message(exc)
    return str(exc)


def headers_of(exc: AutomError) -> dict[str, str]:
    """The extra headers of ``exc``'s answer (``HEADERS``)."""
    return next((HEADERS[cls] for cls in type(exc).__mro__ if cls in HEADERS), {})


async def json_page(status: int, text: str, headers: dict[str, str]) -> Response:
    """The admin API's error answer: ``{"error": text}`` (one line) with ``status`` and ``headers``."""
    return error_response(status, text, headers)


def register(bp: Blueprint, page: Page, metrics: Metrics, log: logging.Logger, *, for_people: bool = False) -> None:
    """Answer every error of ``STATUS`` raised by ``bp``'s routes (and its before-request hooks)
    with ``page(status, message, headers)`` (``message(..., for_people=for_people)``)."""

    async def answer(exc: AutomError) -> Response:
        if isinstance(exc, DatabaseUnavailable):
            metrics.db_up.set(0)
            log.warning("%s request failed: database unavailable: %s", bp.name, exc)
        elif isinstance(exc, QueryError):  # the database answered, with an error: lock/statement timeout, ...
            log.warning("%s request failed: SQLSTATE %s %s", bp.name, exc.sqlstate, type(exc.__cause__).__name__)
        return await page(status_of(exc), message(exc, for_people=for_people), headers_of(exc))

    for cls in STATUS:
        bp.register_error_handler(cls, answer)
