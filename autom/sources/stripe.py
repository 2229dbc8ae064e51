"""The ``stripe`` source: Stripe events, verified as Stripe documents and stripe-python does.

``Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...][,v0=...]``. The signed payload
is ``"<t>.<raw body>"``, the key the endpoint secret ``whsec_...`` used as is (its
UTF-8 bytes, not base64-decoded), the MAC HMAC-SHA256. Any ``v1`` may match (Stripe
sends several while a secret is being rolled); ``v0`` and other schemes are ignored.

Deviation from stripe-python: it rejects only timestamps too far in the *past*;
this source also rejects ones more than the tolerance in the *future*, so a
signature cannot be made to live longer than 2 × tolerance by a skewed clock.
"""

from __future__ import annotations

from typing import Any

from autom.errors import VerificationError
from autom.jobs.models import NewJob
from autom.sources.base import (
    DEFAULT_TOLERANCE,
    MAX_SIGNATURES,
    Headers,
    Parsed,
    ParseError,
    any_digest_matches,
    hmac_sha256,
    id_field,
    load_object,
    object_or_none,
    parse_timestamp,
    recipient_of,
    required_header,
    within_tolerance,
)

SIGNATURE_HEADER = "stripe-signature"

#: Distinct ``t=`` values considered; each costs one HMAC over the body. Stripe sends one;
#: a repeated header (joined by ", ") could carry a second.
_MAX_TIMESTAMPS = 4


class StripeSource:
    """Verifies ``Stripe-Signature``, dedups by the event ``id``, makes one ``stripe.event`` job."""

    name = "stripe"
    secret_headers = frozenset({SIGNATURE_HEADER})
    #: the sender retries refused deliveries for days (honouring Retry-After): shed first
    sender_retries = True

    def __init__(self, secret: str, tolerance: float = DEFAULT_TOLERANCE) -> None:
        """``secret`` is STRIPE_WEBHOOK_SECRET (``whsec_...``, used as is); ``tolerance`` in seconds."""
        self._secret = secret.encode("utf-8")
        self._tolerance = tolerance

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Accept iff some ``t`` is within tolerance of ``now`` and some ``v1`` is the HMAC of ``t.body``.

        Items are read in any order. Should the header carry several ``t`` values (a
        repeated header joined by ", "), each is tried with every ``v1``: a ``v1`` binds
        the ``t`` it was made with, so pairing them up loosely accepts nothing extra.
        """
        value = required_header(headers, SIGNATURE_HEADER)
        items = value.split(",")
        if len(items) > MAX_SIGNATURES + _MAX_TIMESTAMPS:
            raise VerificationError("too many items in stripe-signature header")
        timestamps: set[int] = set()
        signatures: list[bytes] = []
        for item in items:
            key, sep, item_value = item.strip().partition("=")
            if not sep:
                continue  # stripe-python ignores items it does not know; so do we
            key, item_value = key.strip(), item_value.strip()
            if key == "t":
                timestamps.add(parse_timestamp(item_value, SIGNATURE_HEADER))
            elif key == "v1":
                signature = _hex_digest(item_value)
                if signature is not None:
                    signatures.append(signature)
        if not timestamps:
            raise VerificationError("stripe-signature header has no t= timestamp")
        if len(timestamps) > _MAX_TIMESTAMPS:
            raise VerificationError("too many timestamps in stripe-signature header")
        if not signatures:
            raise VerificationError("stripe-signature header has no v1 signature")
        fresh = sorted(t for t in timestamps if within_tolerance(t, now, self._tolerance))
        if not fresh:
            raise VerificationError("stripe-signature timestamp is outside the tolerance")
        matched = False
        for t in fresh:
            expected = hmac_sha256(self._secret, f"{t}.".encode("ascii"), body)
            matched |= any_digest_matches(expected, signatures)
        if not matched:
            raise VerificationError("stripe signature does not match")

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """The event's ``id`` (``evt_...``), or ``None`` if the body has no string id."""
        event = object_or_none(body)
        if event is None or not isinstance(event.get("id"), str):
            return None
        return id_field(event)

    def parse(self, headers: Headers, text: str) -> Parsed:
        """One ``stripe.event`` job whose payload is the event, key ``stripe:<id>``.

        Every Stripe event has a string ``id``; a body without one is not Stripe's
        (``ParseError``). Recipient ``stripe:<customer id>``: ``data.object.customer``, or
        the object's own id when it is a customer; a customer's events in order.
        """
        event = load_object(text)
        dedup = id_field(event) if isinstance(event.get("id"), str) else None
        if dedup is None:
            raise ParseError("stripe event has no string id")
        return Parsed(dedup, [NewJob(kind="stripe.event", payload=event, key=f"stripe:{dedup}",
                                     recipient=_customer(event))])


def _customer(event: dict[str, Any]) -> str | None:
    """The customer an event is about, as a recipient (``None`` for events of no customer)."""
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        return None
    customer = obj.get("id") if obj.get("object") == "customer" else obj.get("customer")
    if isinstance(customer, dict):  # an expanded customer object
        customer = customer.get("id")
    return recipient_of("stripe", customer)


def _hex_digest(value: str) -> bytes | None:
    # Stripe sends lowercase hex; comparing the decoded bytes also accepts uppercase
    if len(value) != 64:
        return None
    try:
        return bytes.fromhex(value)  # 64 chars with no spaces: fromhex is strict enough
    except ValueError:
        return None
