"""The ``site`` source: our own web site's forms, signed with a shared secret.

The site sends ``X-Signature: sha256=<hex HMAC-SHA256 of the raw body>`` keyed
with SITE_WEBHOOK_SECRET. The scheme has no timestamp, so a captured delivery can
be replayed; giving each submission an ``id`` makes replays (and retries) count
once, because the id is inside the signed body. The body is a JSON object, or
an HTML form (``Content-Type: application/x-www-form-urlencoded``), read as an
object of strings.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from autom.errors import ParseError
from autom.jobs.models import NewJob
from autom.sources.base import (
    Headers,
    Parsed,
    id_field,
    load_object,
    object_or_none,
    recipient_of,
    verify_sha256_header,
)

SIGNATURE_HEADER = "x-signature"
FORM_TYPE = "application/x-www-form-urlencoded"


def is_form(headers: Headers) -> bool:
    """Whether the delivery says it is an HTML form (``application/x-www-form-urlencoded``, any parameters)."""
    return headers.get("content-type", "").partition(";")[0].strip().lower() == FORM_TYPE


def load_form(text: str) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as an object of strings, else ``ParseError``.

    ``+`` and percent escapes are decoded as UTF-8 (invalid bytes become U+FFFD); a field
    without ``=`` has the value ``""``; a field given twice keeps its last value. A NUL
    character (which PostgreSQL cannot store) is a ``ParseError``.
    """
    form = dict(parse_qsl(text.removeprefix("\ufeff"), keep_blank_values=True))
    if any("\x00" in key or "\x00" in value for key, value in form.items()):
        raise ParseError("form field holds a NUL character")
    return form


class SiteSource:
    """Verifies ``X-Signature``, dedups by the body's ``id``, makes one ``site.form`` job."""

    name = "site"
    secret_headers = frozenset({SIGNATURE_HEADER})

    def __init__(self, secret: str) -> None:
        """``secret`` is SITE_WEBHOOK_SECRET (used as its UTF-8 bytes)."""
        self._secret = secret.encode("utf-8")

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff some ``sha256=<hex>`` entry of ``X-Signature`` is the HMAC of the raw body."""
        verify_sha256_header(headers, body, self._secret, SIGNATURE_HEADER, "site")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """The body's ``id`` (a string or an integer, as text), or ``None`` without one."""
        form: dict[str, Any] | None
        if is_form(headers):
            try:
                form = load_form(body.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError and ParseError are ValueErrors
                return None
        else:
            form = object_or_none(body)
        return None if form is None else id_field(form)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``site.form`` job whose payload is the body object; key ``site:<id>`` if it has an id.

        The body is JSON, or a form (``load_form``) when the Content-Type says so. ``id``
        values that are neither strings nor integers (floats, booleans, objects) are not ids:
        the job gets no key and the event no dedup key. Recipient ``site:<email>``
        (lower-cased) when the form has an ``email``: one sender's forms are handled one
        at a time, in order.
        """
        form: dict[str, Any] = load_form(text) if is_form(headers) else load_object(text)
        dedup = id_field(form)
        job = NewJob(kind="site.form", payload=form, key=None if dedup is None else f"site:{dedup}",
                     recipient=recipient_of("site", form.get("email")))
        return Parsed(dedup, [job])
