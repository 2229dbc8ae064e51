"""The ``site`` source: our own web site's forms, signed with a shared secret.

The site sends ``X-Signature: sha256=<hex HMAC-SHA256 of the raw body>`` keyed
with SITE_WEBHOOK_SECRET. The scheme has no timestamp, so a captured delivery can
be replayed; giving each submission an ``id`` makes replays (and retries) count
once, because the id is inside the signed body.
"""

from __future__ import annotations

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
        form = object_or_none(body)
        return None if form is None else id_field(form)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``site.form`` job whose payload is the body object; key ``site:<id>`` if it has an id.

        ``id`` values that are neither strings nor integers (floats, booleans, objects)
        are not ids: the job gets no key and the event no dedup key. Recipient
        ``site:<email>`` (lower-cased) when the form has an ``email``: one sender's forms
        are handled one at a time, in order.
        """
        form = load_object(text)
        dedup = id_field(form)
        job = NewJob(kind="site.form", payload=form, key=None if dedup is None else f"site:{dedup}",
                     recipient=recipient_of("site", form.get("email")))
        return Parsed(dedup, [job])
