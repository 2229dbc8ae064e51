"""The ``github`` source: repository and organisation webhooks.

GitHub signs the raw body: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256>`` keyed
with the webhook secret (GITHUB_WEBHOOK_SECRET). ``X-GitHub-Delivery`` (a UUID, the
same on a redelivery) is the dedup key and ``X-GitHub-Event`` names the event.
Neither header is signed and GitHub signs no timestamp: a captured delivery sent
again under a new delivery id would count as a new event. That is GitHub's scheme;
handlers of ``github.event`` should be idempotent on what they do.

Both content types GitHub offers are understood: ``application/json`` and
``application/x-www-form-urlencoded`` (the JSON then sits in the ``payload`` field).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from autom.jobs.models import NewJob
from autom.sources.base import (
    Headers,
    Parsed,
    ParseError,
    key_text,
    load_object,
    recipient_of,
    single_token,
    verify_sha256_header,
)

SIGNATURE_HEADER = "x-hub-signature-256"
LEGACY_SIGNATURE_HEADER = "x-hub-signature"  # HMAC-SHA1: never trusted, but never stored either
DELIVERY_HEADER = "x-github-delivery"
EVENT_HEADER = "x-github-event"

_FORM = "application/x-www-form-urlencoded"


class GitHubSource:
    """Verifies ``X-Hub-Signature-256``, dedups by ``X-GitHub-Delivery``, makes one ``github.event``."""

    name = "github"
    secret_headers = frozenset({SIGNATURE_HEADER, LEGACY_SIGNATURE_HEADER})

    def __init__(self, secret: str) -> None:
        """``secret`` is GITHUB_WEBHOOK_SECRET (used as its UTF-8 bytes, as GitHub does)."""
        self._secret = secret.encode("utf-8")

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff some ``sha256=<hex>`` entry of ``X-Hub-Signature-256`` is the HMAC of the raw body."""
        verify_sha256_header(headers, body, self._secret, SIGNATURE_HEADER, "github")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """``X-GitHub-Delivery``, or ``None`` when it is missing or unusable."""
        delivery = single_token(headers, DELIVERY_HEADER)
        return None if delivery is None else key_text(delivery)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``github.event`` job: ``{"event", "delivery", "body"}``, key ``github:<delivery>``.

        ``event`` and ``delivery`` are ``None`` when their header is missing (then the
        job has no key). Recipient ``github:<owner/repo>`` (the body's
        ``repository.full_name``) when there is one: a repository's events in order.
        """
        event = load_object(_json_text(headers, text))
        delivery = single_token(headers, DELIVERY_HEADER)
        dedup = self.dedup_key(headers, b"")
        payload: dict[str, Any] = {
            "event": single_token(headers, EVENT_HEADER),
            "delivery": delivery,
            "body": event,
        }
        repository = event.get("repository")
        job = NewJob(kind="github.event", payload=payload, key=None if dedup is None else f"github:{dedup}",
                     recipient=recipient_of("github", repository.get("full_name"))
                     if isinstance(repository, dict) else None)
        return Parsed(dedup, [job])


def _json_text(headers: Headers, text: str) -> str:
    """The JSON document of the body: the body itself, or its ``payload`` form field."""
    content_type = headers.get("content-type")
    if not isinstance(content_type, str) or content_type.split(";")[0].strip().lower() != _FORM:
        return text
    try:
        # a GitHub form body has exactly one field; the bound stops "a&a&a&..." from costing much
        fields = parse_qsl(text, keep_blank_values=True, max_num_fields=16)
    except ValueError:
        raise ParseError("github form body has too many fields") from None
    for name, value in fields:
        if name == "payload":
            return value
    raise ParseError("github form body has no payload field")
