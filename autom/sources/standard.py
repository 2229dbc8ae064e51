"""The ``standard`` source: any sender following the Standard Webhooks spec (Svix and others).

Headers ``webhook-id``, ``webhook-timestamp`` (unix seconds) and
``webhook-signature`` (space-separated ``v1,<base64 HMAC-SHA256>`` entries; other
versions such as ``v1a`` are ignored, any ``v1`` may match). The signed content is
``"<id>.<timestamp>.<raw body>"``; the key is the base64 part of the
``whsec_<base64>`` secret. The timestamp must be within ±300 s of now. ``webhook-id``
is the dedup key (it is signed, so it cannot be swapped to dodge dedup).
"""

from __future__ import annotations

import base64
import binascii

from autom.errors import ConfigError, VerificationError
from autom.jobs.models import NewJob
from autom.sources.base import (
    DEFAULT_TOLERANCE,
    MAX_SIGNATURES,
    Headers,
    Parsed,
    any_digest_matches,
    hmac_sha256,
    key_text,
    load_object,
    parse_timestamp,
    required_header,
    single_token,
    within_tolerance,
)

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format prefix, not a secret


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (the prefix is optional).

    Missing ``=`` padding is tolerated, as in the reference libraries; anything
    that is not base64 raises ``ConfigError`` naming STANDARD_WEBHOOK_SECRET (never
    its value) instead of silently using a wrong key.
    """
    encoded = secret.strip().removeprefix(SECRET_PREFIX)
    encoded += "=" * (-len(encoded) % 4)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("STANDARD_WEBHOOK_SECRET must be whsec_ followed by base64") from None
    if not key:
        raise ConfigError("STANDARD_WEBHOOK_SECRET is empty")
    return key


class StandardSource:
    """Verifies Standard Webhooks signatures, dedups by ``webhook-id``, makes one ``standard.event``."""

    name = "standard"
    secret_headers = frozenset({SIGNATURE_HEADER})
    #: the sender retries refused deliveries for days (honouring Retry-After): shed first
    sender_retries = True

    def __init__(self, secret: str, tolerance: float = DEFAULT_TOLERANCE) -> None:
        """``secret`` is STANDARD_WEBHOOK_SECRET; a malformed one raises ``ConfigError``."""
        self._key = decode_secret(secret)
        self._tolerance = tolerance

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff the timestamp is within tolerance and some ``v1`` signature matches."""
        required_header(headers, ID_HEADER)  # distinguishes "missing" from "malformed" below
        msg_id = single_token(headers, ID_HEADER)
        if msg_id is None:
            raise VerificationError("webhook-id header is malformed")
        stamp = single_token(headers, TIMESTAMP_HEADER) or required_header(headers, TIMESTAMP_HEADER)
        timestamp = parse_timestamp(stamp, TIMESTAMP_HEADER)
        value = required_header(headers, SIGNATURE_HEADER)
        # Space-separated per the spec; a repeated header joined by ", " leaves a trailing
        # comma on an entry, which base64 never contains, so it is safe to strip.
        entries = [entry.strip(",") for entry in value.split()]
        if len(entries) > MAX_SIGNATURES:
            raise VerificationError("too many signatures in webhook-signature header")
        signatures = [sig for sig in map(_v1_signature, entries) if sig is not None]
        if not signatures:
            raise VerificationError("webhook-signature header has no v1 signature")
        if not within_tolerance(timestamp, now, self._tolerance):
            raise VerificationError("webhook-timestamp is outside the tolerance")
        expected = hmac_sha256(self._key, f"{msg_id}.{timestamp}.".encode("ascii"), body)
        if not any_digest_matches(expected, signatures):
            raise VerificationError("webhook signature does not match")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """``webhook-id``, or ``None`` when it is missing or unusable."""
        msg_id = single_token(headers, ID_HEADER)
        return None if msg_id is None else key_text(msg_id)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``standard.event`` job whose payload is the body object, key ``standard:<webhook-id>``."""
        event = load_object(text)
        dedup = self.dedup_key(headers, b"")
        job = NewJob(kind="standard.event", payload=event, key=None if dedup is None else f"standard:{dedup}")
        return Parsed(dedup, [job])


def _v1_signature(entry: str) -> bytes | None:
    """The 32-byte MAC of a ``v1,<base64>`` entry; ``None`` for other versions or bad base64."""
    version, sep, encoded = entry.partition(",")
    if not sep or version != "v1" or len(encoded) != 44:  # 32 bytes are 44 base64 characters
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
