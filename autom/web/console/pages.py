"""How a console answer is made: templates, security headers, redirects, and the links and notices of a page.

Invariants: everything a template prints is escaped (autoescape) and shown visibly
first (``visible``: a bidi override or control character prints as ``\\u202e``); every
answer carries ``SECURITY_HEADERS`` (no script, no framing, no caching); a notice is
one of the fixed texts here, never free text from a link. The links are pure functions
of the request's values. Public: ``render``, ``html``, ``error_page``, the ``*_NOTICES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup
from quart import Response, request

from autom.ops import error_headline, visible
from autom.web import params as p
from autom.web.console import present

#: no script at all, styles only from our own stylesheet, forms only to ourselves
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

#: a bulk retry's filters: the Failed list's own (since = failed since; created_since/_until = its created range)
RETRY_FILTER = {"kind": p.text, "recipient": p.text, "since": p.when, "event_id": p.ident,
                "created_since": p.when, "created_until": p.when}
#: what a redirect after an action may tell the page it lands on (never free text)
NOTICES = {
    "retried": "Put back in the queue: it runs as soon as a worker is free.",
    "cancelled": "Cancelled: it will not run. A running handler is stopped within about a second.",
    "rescheduled": "Rescheduled: it runs not before its new run time.",
}
#: ... on a recipient's page after its actions ("purged:N")
RECIPIENT_NOTICES = {
    "paused": "Paused: its jobs stay pending (every replica) until resumed.{}",
    "resumed": "Resumed: its jobs run again.{}",
    "not-paused": "It was not paused.{}",
    "purged": "Purged: {} pending job(s) cancelled.",
}
#: an operator action in a recipient's timeline (audit_log's action → what the page says)
ACTION_WORDS = {
    "retry": "Retried", "cancel": "Cancelled", "reschedule": "Rescheduled",
    "recipient_pause": "Paused", "recipient_resume": "Resumed", "recipient_purge": "Purged",
    "bulk_retry": "Its failed jobs retried",
}
#: ... after a pause or resume, naming the kind (the sealed notice is "paused:KIND")
KIND_NOTICES = {
    "paused": "Paused {}: its jobs stay pending until resumed.",
    "resumed": "Resumed {}: its jobs run again.",
    "already-paused": "{} was paused already.",
    "not-paused": "{} was not paused.",
}


def _shown(value: Any) -> Any:
    """What a template prints of ``value``: stored text with what would act on the screen escaped.

    A bidi override (U+202E) would turn the rest of its cell around, autom's own text
    included; an unpaired surrogate (from a JSON escape in an event body) cannot be
    sent as UTF-8 at all. Both, and control characters, show as ``\\u202e`` etc.
    """
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


#: The console's own template environment (not the app's): the error pages render under
#: ROLE=worker too, where the console's blueprint is not registered. Everything is escaped
#: (autoescape) and shown visibly (``_shown``) before it is escaped.
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("autom.web.console", "templates"), autoescape=True, finalize=_shown,
)
#: a value as one path segment of a link (``/ui/recipients/{{ r|pathpart }}``): every ``/``, ``?``, ``#`` escaped
TEMPLATES.filters["pathpart"] = lambda value: quote(str(value), safe="")


def render(template: str, **context: Any) -> str:
    """``template`` of the console rendered with ``context``."""
    return TEMPLATES.get_template(template).render(when=present.when, headline_of=error_headline, **context)


def html(body: str, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """An HTML answer."""
    return Response(body, status=status, content_type="text/html; charset=utf-8", headers=dict(headers or {}))


async def error_page(status: int, message: str) -> Response:
    """An HTML error answer for a ``/ui/`` path no console route serves (404, 405), with the security headers."""
    return html(render("message.html", csrf="", logged_in=False, code=status, message=message), status,
                SECURITY_HEADERS)


def redirect(location: str, status: int) -> Response:
    """A redirect to one of our own paths (302 after a GET, 303 after a POST)."""
    return Response("", status=status, headers={"Location": location})


def https() -> bool:
    """Whether the client talks https to us, or to the proxy in front of us (which says so)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.scheme == "https" or forwarded == "https"


def safe_next(target: str) -> bool:
    """Whether ``target`` is a console path to go back to after login (never another site)."""
    return (target.startswith("/ui/") and not target.startswith("/ui/login") and "//" not in target
            and "\\" not in target and len(target) < 2000 and target.isprintable())


def echo(args: Mapping[str, str]) -> dict[str, str]:
    """The filter values to put back in the form (escaped by the template like everything else)."""
    return {k: str(v)[:300] for k, v in args.items()}


def query_string(args: Any, **changes: str | None) -> str:
    """This page's query with ``changes`` (None removes a parameter)."""
    values = {k: v for k, v in args.items() if k not in changes and v != ""}
    values.update({k: v for k, v in changes.items() if v is not None})
    return urlencode(values)


def kind_notice(told: str | None) -> str | None:
    """The overview's notice after a pause or resume (``paused:KIND``), naming the kind."""
    name, _, kind = (told or "").partition(":")
    return KIND_NOTICES[name].format(kind) if name in KIND_NOTICES and kind else None


def recipient_notice(told: str | None) -> str | None:
    """A recipient page's notice after one of its actions (``purged:N``)."""
    name, _, detail = (told or "").partition(":")
    return RECIPIENT_NOTICES.get(name, "").format(detail) or None


#: a Failed list's filter → the bulk retry's field of the same meaning
_RETRY_KEEPS = {"kind": "kind", "recipient": "recipient", "event_id": "event_id", "failed_since": "since",
                "since": "created_since", "until": "created_until"}


#: the bulk retry of every failed job (its confirm page), linked from the Failed list, the overview
RETRY_EVERY = "/ui/retry-failed"


def retry_all_link(args: Mapping[str, str], q: Mapping[str, Any]) -> str | None:
    """The bulk-retry confirm page for exactly this list's filters, when it lists failed jobs
    (``RETRY_EVERY`` when it is not filtered)."""
    if q["status"] != "failed":
        return None
    kept = {field: args[name] for name, field in _RETRY_KEEPS.items() if q[name] is not None and args.get(name)}
    return RETRY_EVERY + (f"?{urlencode(kept)}" if kept else "")


def retry_echo(args: Mapping[str, str]) -> dict[str, str]:
    """The bulk retry's filters as given (to show and to send again), every field present."""
    return {name: str(args.get(name, ""))[:300] for name in RETRY_FILTER}
