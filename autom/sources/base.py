"""What every webhook source is, and the careful parsing they share.

A source turns one HTTP delivery into an authenticity verdict (``verify``), a
redelivery key (``dedup_key``) and jobs (``parse``). Everything here is pure:
no database, no HTTP framework, no clock (``verify`` gets ``now``).

Header values come from the outside world, so the helpers below assume nothing:
missing, empty, huge, non-ASCII, duplicated (servers join repeated headers with
``", "``) values all end in a ``VerificationError`` with a message that is safe to
log (it names the header, never its value), or in ``None`` where a key is optional.
Bodies are bounded upstream (MAX_BODY_BYTES), header values here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from autom.errors import ParseError, VerificationError
from autom.jobs.models import NewJob

Headers = Mapping[str, str]
"""Request headers with lower-cased names; repeated headers arrive joined by ``", "``."""

#: Longest header value a source looks at. Real signature headers are a few hundred
#: characters; anything far beyond is garbage or an attempt to make us work.
MAX_HEADER_CHARS = 8192
#: Most signatures one header may carry (secret rotation needs two or three).
MAX_SIGNATURES = 32
#: Longest id taken from a header (GitHub delivery UUIDs, Standard Webhooks msg ids).
MAX_ID_CHARS = 256
#: Longest dedup/job key stored as is. Longer keys are replaced by their SHA-256 because
#: PostgreSQL refuses btree index entries over ~2.7 kB (events and jobs index their keys).
MAX_KEY_CHARS = 200
#: Deepest JSON nesting accepted in a payload. Real events nest a dozen levels; the bound
#: keeps later (recursive) serialisation of the payload from hitting Python's recursion limit.
MAX_JSON_DEPTH = 128
#: Default timestamp tolerance (seconds) of the sources that sign a timestamp.
DEFAULT_TOLERANCE = 300

_DIGITS = re.compile(r"[0-9]{1,12}")  # ASCII digits only: int() would also take "١٢", "1_0", " 1"
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")  # fullmatch; bytes.fromhex() alone allows spaces
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
# PostgreSQL text and jsonb cannot hold NUL, and UTF-8 cannot encode unpaired surrogates
# (which JSON "\ud800" escapes produce): such a string would fail the insert, not parse.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")



@dataclass(frozen=True)
class Parsed:
    """What a verified delivery means: its redelivery key and the jobs to enqueue."""

    dedup_key: str | None
    jobs: list[NewJob] = field(default_factory=list)


class Source(Protocol):
    """A webhook sender autom accepts at ``POST /hooks/{name}``.

    ``dedup_key`` and ``parse`` read only headers outside ``secret_headers``, so an
    event stored without its secret headers can be parsed again (``autom replay``).

    Two optional attributes steer admission (autom/admission.py): ``sender_retries =
    True`` says the sender retries refused deliveries (then a full backlog answers it
    503 instead of storing); a method ``verify_headers(headers)`` checks what the
    headers alone can prove (Telegram's secret): the door runs it before the body is
    read, refuses a delivery it fails (401) and does not rate limit by address one it
    passes. ``verify`` still runs on every delivery once the body is read, so a source
    may pre-check a header in ``verify_headers`` and sign the body in ``verify``.
    Register one with ``App.source``.
    """

    name: str
    secret_headers: frozenset[str]

    def verify(self, headers: Headers, body: bytes, now: float) -> None:
        """Raise ``VerificationError`` unless the delivery is authentic; never anything else."""
        ...

    def dedup_key(self, headers: Headers, body: bytes) -> str | None:
        """The sender's event id for redelivery detection, or ``None``; never raises."""
        ...

    def parse(self, headers: Headers, text: str) -> Parsed:
        """The jobs of a verified body; ``ParseError`` if the body is not what the sender sends."""
        ...


# --- headers -----------------------------------------------------------------------


def required_header(headers: Headers, name: str) -> str:
    """The stripped value of a header a signature check needs.

    Raises ``VerificationError`` when it is missing, empty, longer than
    ``MAX_HEADER_CHARS`` or not ASCII (signatures, tokens and timestamps are ASCII;
    anything else cannot be authentic and must not reach ``.encode("ascii")``).
    """
    value = headers.get(name)
    if not isinstance(value, str):
        raise VerificationError(f"missing {name} header")
    if len(value) > MAX_HEADER_CHARS:  # before strip(): bound the work on huge values
        raise VerificationError(f"{name} header is too long")
    value = value.strip()
    if not value:
        raise VerificationError(f"empty {name} header")
    if not value.isascii():
        raise VerificationError(f"{name} header is not ASCII")
    return value


def single_token(headers: Headers, name: str, max_chars: int = MAX_ID_CHARS) -> str | None:
    """A one-token header (an id, an event name), or ``None`` if absent or unusable.

    A repeated header arrives as ``"a, a"``: equal copies collapse to ``"a"``;
    differing copies are ambiguous and give ``None``. The token must be visible
    ASCII (no spaces, no controls) of at most ``max_chars`` characters. Never raises.
    """
    value = headers.get(name)
    if not isinstance(value, str) or len(value) > MAX_HEADER_CHARS:
        return None
    # ids never contain commas in practice (UUIDs, msg_..., digits), so a comma means joined copies
    parts = {part.strip() for part in value.split(",")}
    if len(parts) != 1:
        return None
    token = parts.pop()
    if len(token) > max_chars or not _VISIBLE_ASCII.fullmatch(token):
        return None
    return token


def parse_timestamp(value: str, header: str) -> int:
    """A unix timestamp in seconds: 1 to 12 ASCII digits, else ``VerificationError``."""
    if not _DIGITS.fullmatch(value):
        raise VerificationError(f"{header} timestamp is not a unix time in seconds")
    return int(value)


def within_tolerance(timestamp: int, now: float, tolerance: float) -> bool:
    """Whether a signed timestamp is at most ``tolerance`` seconds away from ``now``, either way."""
    return abs(now - timestamp) <= tolerance


def prefixed_hex_digests(value: str, prefix: str, header: str) -> list[bytes]:
    """The SHA-256 digests in a ``sha256=<hex>`` header (GitHub, site).

    Repeated headers arrive joined by ``", "``, so the value is a comma-separated
    list; entries with another prefix or malformed hex are skipped (they cannot
    match). More than ``MAX_SIGNATURES`` entries → ``VerificationError``.
    """
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) > MAX_SIGNATURES:
        raise VerificationError(f"too many signatures in {header} header")
    digests: list[bytes] = []
    for entry in entries:
        scheme, sep, hexdigest = entry.partition("=")
        if sep and scheme.strip().lower() == prefix and _HEX_SHA256.fullmatch(hexdigest.strip()):
            digests.append(bytes.fromhex(hexdigest.strip()))
    return digests


def any_digest_matches(expected: bytes, candidates: Iterable[bytes]) -> bool:
    """Constant-time check that any candidate equals ``expected``.

    Every candidate is compared (no early exit), so timing does not tell which one matched.
    """
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected, candidate)
    return matched


def hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the concatenated parts (fed piecewise: no copy of a large body)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


# --- bodies ------------------------------------------------------------------------


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e400" parses as inf, which jsonb refuses
        raise ParseError("body has a number out of range")
    return value


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; Python accepts them by default, jsonb does not
    raise ParseError(f"body has the non-JSON constant {name}")


def _check_storable(value: Any) -> None:
    """ParseError unless every string is storable and nesting is bounded (iterative walk)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                raise ParseError("body has a NUL character or an unpaired surrogate")
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ParseError(f"body nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)


def load_object(text: str) -> dict[str, Any]:
    """The body as a JSON object that can become a job payload, else ``ParseError``.

    Strict where the database would be: no NaN/Infinity, no out-of-range floats,
    no NUL characters or unpaired surrogates, nesting at most ``MAX_JSON_DEPTH``.
    A leading byte-order mark is ignored (some senders write one).
    """
    try:
        value = json.loads(text.removeprefix("\ufeff"), parse_float=_finite_float, parse_constant=_reject_constant)
    except ParseError:
        raise
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." deeper than the C stack allows
        raise ParseError("body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ParseError(f"body is JSON but not an object (a {type(value).__name__})")
    if _may_be_unstorable(text):
        _check_storable(value)
    return value


def _may_be_unstorable(text: str) -> bool:
    """Whether the values parsed from ``text`` need ``_check_storable``'s walk.

    A parsed string can hold a NUL or an unpaired surrogate only from a ``\\u`` escape
    or from the text itself (json.loads refuses raw control characters in strings),
    and nesting deeper than ``MAX_JSON_DEPTH`` takes more opening brackets than that.
    Three scans in C (~2 µs for a Telegram update) instead of the walk (~9 µs).
    """
    return ("\\u" in text or text.count("[") + text.count("{") > MAX_JSON_DEPTH
            or _UNSTORABLE.search(text) is not None)


def object_or_none(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` if it is not one (for ``dedup_key``); never raises."""
    try:
        value = json.loads(body.decode("utf-8").removeprefix("\ufeff"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return value if isinstance(value, dict) else None


def key_text(value: str) -> str | None:
    """A dedup/job key storable in an indexed text column; ``None`` for an empty id.

    Ids longer than ``MAX_KEY_CHARS`` or holding characters PostgreSQL cannot store
    become ``"sha256:<hex>"`` of the id: still one key per id, so redeliveries still
    collide.
    """
    if not value:
        return None
    if len(value) <= MAX_KEY_CHARS and not _UNSTORABLE.search(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def id_field(obj: Mapping[str, Any], name: str = "id") -> str | None:
    """``obj[name]`` as a key if it is a string or an integer (``True`` is not an id), else ``None``."""
    value = obj.get(name)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return key_text(str(value))
    if isinstance(value, str):
        return key_text(value)
    return None


def recipient_of(prefix: str, value: object) -> str | None:
    """A recipient ``"<prefix>:<value>"`` for a string or integer id (an email is lower-cased), else None.

    Recipients make a sender's jobs about one subject (a repository, a customer, a form's
    sender) run one at a time and in order, and share the workers fairly with others.
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value).strip()
    if "@" in text:
        text = text.lower()
    key = key_text(text)
    return None if key is None else f"{prefix}:{key}"


def _sha256_problem(value: str, header: str) -> str:
    """What is wrong with a ``sha256=<hex>`` header none of whose entries is well-formed (for the 401 log)."""
    for entry in value.split(","):
        scheme, sep, hexdigest = entry.strip().partition("=")
        if sep and scheme.strip().lower() == "sha256":
            digits = hexdigest.strip()
            if not re.fullmatch(r"[0-9a-fA-F]*", digits):
                return f"{header} header's sha256 signature is not hex"
            return f"{header} header's sha256 signature has {len(digits)} hex digits, not 64"
    return f"{header} header has no sha256=<hex> signature"


def verify_sha256_header(headers: Headers, body: bytes, secret: bytes, header: str, sender: str) -> None:
    """The ``<header>: sha256=<hex HMAC-SHA256 of the raw body>`` scheme (site, GitHub).

    Accept iff some ``sha256=<hex>`` entry of ``header`` is the HMAC of ``body`` with ``secret``.
    """
    value = required_header(headers, header)
    digests = prefixed_hex_digests(value, "sha256", header)
    if not digests:
        raise VerificationError(_sha256_problem(value, header))
    if not any_digest_matches(hmac_sha256(secret, body), digests):
        raise VerificationError(f"{sender} signature does not match")
