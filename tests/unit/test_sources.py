"""Webhook sources: published vectors, rejections, dedup keys and parse results.

Vectors: GitHub's docs example ("It's a Secret to Everybody"), and the Standard
Webhooks reference library's test vector (libraries/python/tests/test_webhooks.py:
whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, msg_p5jXN8AQM9LWM0D4loKWxJek, 1614265330 →
v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=). Stripe publishes no fixed vector
(stripe-python's tests sign on the fly), so Stripe signatures are computed here
independently with hmac, following Stripe's documentation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any, ClassVar

import pytest

from autom.config import Settings
from autom.errors import ConfigError, VerificationError
from autom.sources import (
    GitHubSource,
    Parsed,
    ParseError,
    SiteSource,
    StandardSource,
    StripeSource,
    TelegramSource,
    enabled_sources,
    replay_sources,
)
from autom.sources.base import MAX_KEY_CHARS, _check_storable, _may_be_unstorable, load_object
from autom.sources.standard import decode_secret

NOW = 1_700_000_000.0
HUGE = "a" * 10_000_000  # 10 MB: must be refused without being hashed or split


def hex_hmac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def assert_storable(parsed: Parsed) -> None:
    """Every job payload survives strict JSON (what jsonb accepts)."""
    for job in parsed.jobs:
        json.dumps(job.payload, allow_nan=False)


# --- telegram ----------------------------------------------------------------------

TG_SECRET = "tg-secret_123"
TG = TelegramSource(TG_SECRET)
TG_HEADER = "x-telegram-bot-api-secret-token"


def tg_update(**fields: Any) -> str:
    return json.dumps({"update_id": 1001, **fields})


MESSAGE = {
    "message_id": 7,
    "from": {"id": 42, "is_bot": False, "first_name": "Ann", "username": "ann"},
    "chat": {"id": -100123, "type": "group"},
    "date": 1700000000,
    "text": "/ping",
}


class TestTelegramVerify:
    def test_matching_token_is_accepted(self) -> None:
        TG.verify({TG_HEADER: TG_SECRET}, b"{}", NOW)

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {TG_HEADER: ""},
            {TG_HEADER: "   "},
            {TG_HEADER: "tg-secret_124"},
            {TG_HEADER: TG_SECRET + "x"},
            {TG_HEADER: TG_SECRET[:-1]},
            {TG_HEADER: "tg-sécret_123"},  # non-ASCII: rejected, not a UnicodeEncodeError
            {TG_HEADER: "\xff" * 13},  # latin-1 decoded bytes, as some servers hand them over
            {TG_HEADER: HUGE},
            {TG_HEADER: f"{TG_SECRET}, other"},  # repeated header with differing copies
            {"x-telegram-bot-api-secret": TG_SECRET},  # wrong header name
        ],
    )
    def test_anything_else_is_rejected(self, headers: dict[str, str]) -> None:
        with pytest.raises(VerificationError):
            TG.verify(headers, b"{}", NOW)

    def test_repeated_header_with_equal_copies_is_accepted(self) -> None:
        TG.verify({TG_HEADER: f"{TG_SECRET}, {TG_SECRET}"}, b"{}", NOW)

    def test_error_message_does_not_leak_values(self) -> None:
        with pytest.raises(VerificationError) as info:
            TG.verify({TG_HEADER: "guess-123"}, b"{}", NOW)
        assert "guess-123" not in str(info.value) and TG_SECRET not in str(info.value)

    def test_secret_header_is_declared(self) -> None:
        assert TG.secret_headers == frozenset({TG_HEADER})


MEMBER = {
    "chat": {"id": 42, "type": "private"},
    "from": {"id": 42, "is_bot": False, "username": "ann"},
    "date": 1700000000,
    "old_chat_member": {"user": {"id": 1, "is_bot": True}, "status": "member"},
    "new_chat_member": {"user": {"id": 1, "is_bot": True}, "status": "kicked", "until_date": 0},
}


CALLBACK = {
    "id": "4382bfdwdsb323b2d9",
    "from": {"id": 42, "is_bot": False, "first_name": "Ann", "username": "ann", "language_code": "en"},
    "message": {"message_id": 7, "date": 1700000000, "chat": {"id": -100123, "type": "supergroup"}, "text": "card"},
    "chat_instance": "-1234",
    "data": "take:17",
}


class TestTelegramDedupAndParse:
    def test_dedup_key_is_update_id(self) -> None:
        assert TG.dedup_key({}, tg_update(message=MESSAGE).encode()) == "1001"

    @pytest.mark.parametrize(
        "body",
        [
            b"",
            b"not json",
            b"[1,2]",
            b'{"update_id": "1001"}',
            b'{"update_id": true}',
            b'{"update_id": 1.5}',
            b"{}",
            b"\xff\xfe",
            b"[" * 100_000,
        ],
    )
    def test_dedup_key_is_none_without_integer_update_id(self, body: bytes) -> None:
        assert TG.dedup_key({}, body) is None

    def test_message_becomes_one_job(self) -> None:
        parsed = TG.parse({}, tg_update(message=MESSAGE))
        assert parsed.dedup_key == "1001"
        [job] = parsed.jobs
        assert job.kind == "telegram.message"
        assert job.key == "telegram:1001"
        assert job.recipient == "-100123"
        assert job.payload == {
            "update_id": 1001,
            "chat_id": -100123,
            "text": "/ping",
            "message_id": 7,
            "from": {"id": 42, "username": "ann"},
        }
        assert_storable(parsed)

    def test_message_without_text_or_sender(self) -> None:
        message = {k: v for k, v in MESSAGE.items() if k not in ("text", "from")}
        [job] = TG.parse({}, tg_update(message=message)).jobs
        assert job.payload["text"] is None and job.payload["from"] is None

    def test_sender_without_username(self) -> None:
        [job] = TG.parse({}, tg_update(message={**MESSAGE, "from": {"id": 5}})).jobs
        assert job.payload["from"] == {"id": 5}

    def test_edited_message_becomes_an_edited_job_of_the_chat(self) -> None:
        parsed = TG.parse({}, tg_update(edited_message=MESSAGE))
        [job] = parsed.jobs
        assert (job.kind, job.key, job.recipient) == ("telegram.edited", "telegram:1001", "-100123")
        assert job.payload["text"] == "/ping" and job.payload["message_id"] == 7

    def test_callback_query_becomes_a_callback_job_on_the_chats_own_line(self) -> None:
        parsed = TG.parse({}, tg_update(callback_query=CALLBACK))
        [job] = parsed.jobs
        assert (job.kind, job.key, job.recipient) == ("telegram.callback", "telegram:1001", "-100123:cb")
        assert job.payload == {"update_id": 1001, "id": "4382bfdwdsb323b2d9", "data": "take:17",
                               "chat_id": -100123, "message_id": 7, "message_text": "card",
                               "from": CALLBACK["from"]}
        assert_storable(parsed)

    def test_callback_of_an_inline_message_has_no_chat(self) -> None:
        query = {k: v for k, v in CALLBACK.items() if k != "message"} | {"inline_message_id": "AAA", "data": None}
        [job] = TG.parse({}, tg_update(callback_query=query)).jobs
        assert job.recipient is None
        assert (job.payload["chat_id"], job.payload["message_id"], job.payload["data"]) == (None, None, None)

    @pytest.mark.parametrize("query", [
        "take",
        {**CALLBACK, "id": 5},
        {**CALLBACK, "id": ""},
        {**CALLBACK, "data": 5},
        {**CALLBACK, "from": None},
        {**CALLBACK, "message": {"message_id": 7, "chat": {"id": "x"}}},
        {**CALLBACK, "message": {"message_id": "7", "chat": {"id": 1}}},
    ])
    def test_malformed_callback_query_is_a_parse_error(self, query: object) -> None:
        with pytest.raises(ParseError):
            TG.parse({}, tg_update(callback_query=query))

    @pytest.mark.parametrize("kind", ["channel_post", "poll", None])
    def test_other_updates_make_no_jobs(self, kind: str | None) -> None:
        body = tg_update(**({kind: MESSAGE} if kind else {}))
        assert TG.parse({}, body) == Parsed("1001", [])

    def test_my_chat_member_becomes_a_member_job_of_the_chat(self) -> None:
        parsed = TG.parse({}, tg_update(my_chat_member=MEMBER))
        [job] = parsed.jobs
        assert (job.kind, job.key, job.recipient) == ("telegram.member", "telegram:1001", "42")
        assert job.payload == {"update_id": 1001, "chat_id": 42, "status": "kicked", "old_status": "member",
                               "from": {"id": 42, "username": "ann"}}
        assert_storable(parsed)

    @pytest.mark.parametrize("member", [
        "kicked",
        {**MEMBER, "chat": {"id": "42"}},
        {**MEMBER, "new_chat_member": {"status": 5}},
        {k: v for k, v in MEMBER.items() if k != "old_chat_member"},
    ])
    def test_malformed_my_chat_member_is_a_parse_error(self, member: object) -> None:
        with pytest.raises(ParseError):
            TG.parse({}, tg_update(my_chat_member=member))

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "not json",
            "[]",
            '"update"',
            "null",
            "{}",
            '{"update_id": "1001"}',
            '{"update_id": false, "message": {}}',
            tg_update(message="hi"),
            tg_update(message={**MESSAGE, "chat": {"id": "-100123"}}),
            tg_update(message={**MESSAGE, "chat": None}),
            tg_update(message={**MESSAGE, "message_id": "7"}),
            tg_update(message={**MESSAGE, "text": 5}),
            tg_update(message={**MESSAGE, "from": {"username": "ann"}}),
            tg_update(message={**MESSAGE, "chat": {"id": 2**70}}),
        ],
    )
    def test_bodies_telegram_does_not_send_are_parse_errors(self, text: str) -> None:
        with pytest.raises(ParseError):
            TG.parse({}, text)


# --- site --------------------------------------------------------------------------

SITE_SECRET = "site secret ✓"  # non-ASCII on purpose: keys are the UTF-8 bytes
SITE = SiteSource(SITE_SECRET)


def site_sig(body: bytes, secret: str = SITE_SECRET) -> str:
    return "sha256=" + hex_hmac(secret.encode(), body)


class TestSiteVerify:
    BODY = b'{"id": "f-1", "email": "a@example.com"}'

    def test_valid_signature_is_accepted(self) -> None:
        SITE.verify({"x-signature": site_sig(self.BODY)}, self.BODY, NOW)

    def test_uppercase_hex_and_spaces_are_accepted(self) -> None:
        SITE.verify({"x-signature": "  " + site_sig(self.BODY).upper() + " "}, self.BODY, NOW)

    def test_one_valid_among_several_is_accepted(self) -> None:
        wrong = site_sig(self.BODY, "old secret")
        SITE.verify({"x-signature": f"{wrong}, {site_sig(self.BODY)}"}, self.BODY, NOW)

    @pytest.mark.parametrize(
        "signature",
        [
            "",
            "sha256=",
            "sha256",
            "=",
            "sha1=" + "0" * 40,
            "md5=" + "0" * 64,
            hex_hmac(SITE_SECRET.encode(), BODY),  # no sha256= prefix
            "sha256=" + "z" * 64,
            "sha256=" + "0" * 63,
            "sha256=" + "0" * 64,
            "sha256=" + hex_hmac(SITE_SECRET.encode(), BODY)[:-2] + " 0",
            "sha256=" + hex_hmac(b"wrong", BODY),
            "sha256=" + hex_hmac(SITE_SECRET.encode(), BODY) + "é",
            ",".join(["sha256=" + "0" * 64] * 40),  # too many
            HUGE,
        ],
    )
    def test_bad_signatures_are_rejected(self, signature: str) -> None:
        with pytest.raises(VerificationError):
            SITE.verify({"x-signature": signature}, self.BODY, NOW)

    @pytest.mark.parametrize(
        ("signature", "said"),
        [
            ("sha256=" + "0" * 63, "x-signature header's sha256 signature has 63 hex digits, not 64"),
            ("sha256=" + "a" * 128, "x-signature header's sha256 signature has 128 hex digits, not 64"),
            ("sha256=", "x-signature header's sha256 signature has 0 hex digits, not 64"),
            ("sha256=" + "z" * 64, "x-signature header's sha256 signature is not hex"),
            ("sha1=" + "0" * 40, "x-signature header has no sha256=<hex> signature"),
            ("sha256=" + "0" * 64, "site signature does not match"),
        ],
    )
    def test_each_refusal_says_what_was_wrong(self, signature: str, said: str) -> None:
        with pytest.raises(VerificationError) as caught:
            SITE.verify({"x-signature": signature}, self.BODY, NOW)
        assert str(caught.value) == said

    def test_missing_header_is_rejected(self) -> None:
        with pytest.raises(VerificationError):
            SITE.verify({}, self.BODY, NOW)

    def test_tampered_body_is_rejected(self) -> None:
        with pytest.raises(VerificationError):
            SITE.verify({"x-signature": site_sig(self.BODY)}, self.BODY.replace(b"a@", b"b@"), NOW)

    def test_raw_bytes_are_verified_not_reserialised_json(self) -> None:
        body = b'{"id":"f-1",  "email":"a@example.com"}'  # odd spacing: signed as sent
        SITE.verify({"x-signature": site_sig(body)}, body, NOW)
        with pytest.raises(VerificationError):
            SITE.verify({"x-signature": site_sig(body)}, json.dumps(json.loads(body)).encode(), NOW)


class TestSiteDedupAndParse:
    @pytest.mark.parametrize(
        ("body", "key"),
        [
            (b'{"id": "f-1"}', "f-1"),
            (b'{"id": 12}', "12"),
            (b'{"id": 0}', "0"),
            (b'{"id": -3}', "-3"),
            (b'{"id": true}', None),
            (b'{"id": 1.5}', None),
            (b'{"id": ""}', None),
            (b'{"id": null}', None),
            (b'{"id": ["x"]}', None),
            (b'{"name": "x"}', None),
            (b'["id"]', None),
            (b"not json", None),
            (b"\xff", None),
        ],
    )
    def test_dedup_key_is_the_body_id(self, body: bytes, key: str | None) -> None:
        assert SITE.dedup_key({}, body) == key
        if key is not None or body.startswith(b"{"):
            parsed = SITE.parse({}, body.decode())
            assert parsed.dedup_key == key
            assert parsed.jobs[0].key == (None if key is None else f"site:{key}")

    def test_parse_makes_one_form_job_with_the_body_as_payload(self) -> None:
        body = {"id": "f-1", "email": "a@example.com", "fields": {"n": [1, 2.5, None]}}
        parsed = SITE.parse({}, json.dumps(body))
        [job] = parsed.jobs
        assert (job.kind, job.key, job.payload) == ("site.form", "site:f-1", body)
        assert job.recipient == "site:a@example.com"  # one sender's forms one at a time, in order
        assert_storable(parsed)

    FORM: ClassVar[dict[str, str]] = {"content-type": "application/x-www-form-urlencoded; charset=UTF-8"}

    def test_a_form_is_an_object_of_strings(self) -> None:
        body = "id=f-2&email=A%40example.com&name=Ada+L%C3%B6w&empty=&flag&n=1&n=2"
        assert SITE.dedup_key(self.FORM, body.encode()) == "f-2"
        parsed = SITE.parse(self.FORM, body)
        [job] = parsed.jobs
        assert job.payload == {"id": "f-2", "email": "A@example.com", "name": "Ada Löw", "empty": "", "flag": "",
                               "n": "2"}  # a field given twice keeps its last value
        assert (parsed.dedup_key, job.key, job.recipient) == ("f-2", "site:f-2", "site:a@example.com")
        assert_storable(parsed)

    def test_a_form_is_read_as_a_form_only_when_the_content_type_says_so(self) -> None:
        with pytest.raises(ParseError):
            SITE.parse({}, "id=f-2")  # JSON by default, as before
        assert SITE.parse({"content-type": "application/json"}, '{"id": 1}').dedup_key == "1"
        assert SITE.parse(self.FORM, "").jobs[0].payload == {}

    def test_a_form_with_a_nul_is_not_parsed_and_has_no_dedup_key(self) -> None:
        with pytest.raises(ParseError, match="NUL"):
            SITE.parse(self.FORM, "id=1&a=%00")
        assert SITE.dedup_key(self.FORM, b"id=1&a=%00") is None
        assert SITE.dedup_key(self.FORM, b"id=\xff") is None  # not UTF-8

    def test_long_ids_are_hashed_into_a_bounded_key(self) -> None:
        body = json.dumps({"id": "x" * 5000})
        key = SITE.dedup_key({}, body.encode())
        assert key is not None and key.startswith("sha256:") and len(key) <= MAX_KEY_CHARS
        assert SITE.dedup_key({}, body.encode()) == key  # deterministic: redeliveries still collide
        assert SITE.parse({}, body).jobs[0].key == f"site:{key}"

    def test_ids_postgres_cannot_store_are_hashed(self) -> None:
        key = SITE.dedup_key({}, b'{"id": "a\\u0000b"}')
        assert key is not None and key.startswith("sha256:")

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "nope",
            "[]",
            "1",
            '"x"',
            "null",
            '{"a": NaN}',
            '{"a": Infinity}',
            '{"a": 1e400}',
            '{"a": "x\\u0000y"}',  # jsonb refuses NUL
            '{"a\\u0000": 1}',
            '{"a": "\\ud800"}',  # unpaired surrogate
            '{"a": ' + "[" * 200 + "]" * 200 + "}",  # nested too deep
            "[" * 100_000,  # deeper than json can recurse
            '{"a": 1',
        ],
    )
    def test_bodies_that_cannot_become_a_payload_are_parse_errors(self, text: str) -> None:
        with pytest.raises(ParseError):
            SITE.parse({}, text)

    def test_parse_error_is_a_value_error(self) -> None:
        assert issubclass(ParseError, ValueError)

    def test_byte_order_mark_is_ignored(self) -> None:
        assert SITE.parse({}, '\ufeff{"id": 1}').dedup_key == "1"

    def test_paired_surrogate_escapes_are_fine(self) -> None:
        assert load_object('{"a": "\\ud83d\\ude00"}') == {"a": "😀"}

    @pytest.mark.parametrize(
        "text",
        [
            '{"a": "plain", "b": ["é", "😀", {"c": null}]}',  # raw non-ASCII: no walk needed
            '{"a": "\\\\u0000"}',  # an escaped backslash before "u0000": no NUL, walked all the same
            '{"a": "\\u00e9"}',
            '{"a": "x\\u0000y"}',
            '{"a": "\\udc00"}',
            '{"a": "\ud800"}',  # a raw lone surrogate in the text itself (not from UTF-8)
            '{"a": ' + "[" * 126 + "]" * 126 + "}",  # 127 levels with the object: the bound is 128
            '{"a": ' + "[" * 127 + "]" * 127 + "}",  # 128
            '{"a": ' + "[" * 128 + "]" * 128 + "}",  # 129: too deep
            '{"a": "[[[[", "b": ' + "[" * 126 + "]" * 126 + "}",  # brackets in strings count too
        ],
    )
    def test_the_walk_is_skipped_only_where_it_cannot_refuse(self, text: str) -> None:
        """load_object walks the parsed values (NUL, unpaired surrogates, depth) only when
        the text could hold one of them; its verdict is the walk's either way."""
        value = json.loads(text)
        try:
            _check_storable(value)
            walk_refuses = False
        except ParseError:
            walk_refuses = True
        if walk_refuses:
            assert _may_be_unstorable(text)
            with pytest.raises(ParseError):
                load_object(text)
        else:
            assert load_object(text) == value


# --- github ------------------------------------------------------------------------

GH_SECRET = "It's a Secret to Everybody"
GH = GitHubSource(GH_SECRET)
GH_DOCS_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


class TestGitHubVerify:
    def test_docs_example_verifies(self) -> None:
        GH.verify({"x-hub-signature-256": GH_DOCS_SIGNATURE}, b"Hello, World!", NOW)

    @pytest.mark.parametrize(
        ("headers", "body"),
        [
            ({"x-hub-signature-256": GH_DOCS_SIGNATURE}, b"Hello, World?"),
            ({"x-hub-signature-256": GH_DOCS_SIGNATURE}, b"Hello, World!\n"),
            ({"x-hub-signature-256": GH_DOCS_SIGNATURE.replace("sha256=", "sha1=")}, b"Hello, World!"),
            ({"x-hub-signature-256": GH_DOCS_SIGNATURE.removeprefix("sha256=")}, b"Hello, World!"),
            ({"x-hub-signature": "sha1=" + "0" * 40}, b"Hello, World!"),  # SHA-1 alone is not enough
            ({}, b"Hello, World!"),
            ({"x-hub-signature-256": ""}, b"Hello, World!"),
            ({"x-hub-signature-256": HUGE}, b"Hello, World!"),
        ],
    )
    def test_rejections(self, headers: dict[str, str], body: bytes) -> None:
        with pytest.raises(VerificationError):
            GH.verify(headers, body, NOW)

    def test_wrong_secret_is_rejected(self) -> None:
        with pytest.raises(VerificationError):
            GitHubSource("It's a secret to everybody").verify(
                {"x-hub-signature-256": GH_DOCS_SIGNATURE}, b"Hello, World!", NOW
            )

    def test_signature_headers_are_secret(self) -> None:
        assert {"x-hub-signature-256", "x-hub-signature"} <= GH.secret_headers


class TestGitHubDedupAndParse:
    HEADERS: ClassVar[dict[str, str]] = {
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "x-github-event": "push",
        "content-type": "application/json",
    }

    def test_dedup_key_is_the_delivery_header(self) -> None:
        assert GH.dedup_key(self.HEADERS, b"whatever") == "72d3162e-cc78-11e3-81ab-4c9367dc0958"

    @pytest.mark.parametrize(
        ("value", "key"),
        [
            ("abc, abc", "abc"),  # a repeated header with equal copies
            ("abc, abd", None),  # ambiguous
            ("", None),
            ("a b", None),
            ("é", None),
            ("x" * 300, None),
            (HUGE, None),
        ],
    )
    def test_unusual_delivery_headers(self, value: str, key: str | None) -> None:
        assert GH.dedup_key({"x-github-delivery": value}, b"") == key

    def test_missing_delivery_gives_no_key(self) -> None:
        assert GH.dedup_key({}, b"{}") is None
        [job] = GH.parse({}, "{}").jobs
        assert job.key is None and job.payload == {"event": None, "delivery": None, "body": {}}

    def test_parse_makes_one_event_job(self) -> None:
        body = {"ref": "refs/heads/main", "repository": {"full_name": "o/r"}}
        parsed = GH.parse(self.HEADERS, json.dumps(body))
        delivery = self.HEADERS["x-github-delivery"]
        assert parsed.dedup_key == delivery
        [job] = parsed.jobs
        assert job.kind == "github.event" and job.key == f"github:{delivery}"
        assert job.recipient == "github:o/r"  # a repository's events run one at a time, in order
        assert job.payload == {"event": "push", "delivery": delivery, "body": body}
        assert_storable(parsed)

    @pytest.mark.parametrize("body", [{"zen": "ok"}, {"repository": "o/r"}, {"repository": {"full_name": 5.5}}])
    def test_an_event_of_no_repository_has_no_recipient(self, body: dict) -> None:
        [job] = GH.parse(self.HEADERS, json.dumps(body)).jobs
        assert job.recipient is None

    def test_form_encoded_payload_is_understood(self) -> None:
        from urllib.parse import urlencode

        body = {"zen": "Keep it logically awesome.", "hook_id": 1}
        headers = {**self.HEADERS, "content-type": "application/x-www-form-urlencoded; charset=utf-8"}
        [job] = GH.parse(headers, urlencode({"payload": json.dumps(body)})).jobs
        assert job.payload["body"] == body

    @pytest.mark.parametrize("text", ["", "a=1", "&".join(["a=1"] * 100), "payload=%5B%5D"])
    def test_bad_form_bodies_are_parse_errors(self, text: str) -> None:
        headers = {"content-type": "application/x-www-form-urlencoded"}
        with pytest.raises(ParseError):
            GH.parse(headers, text)

    @pytest.mark.parametrize("text", ["", "[]", "x", '"push"'])
    def test_non_object_bodies_are_parse_errors(self, text: str) -> None:
        with pytest.raises(ParseError):
            GH.parse(self.HEADERS, text)


# --- stripe ------------------------------------------------------------------------

STRIPE_SECRET = "whsec_test_secret"
STRIPE = StripeSource(STRIPE_SECRET)
STRIPE_BODY = b'{\n  "id": "evt_test_webhook",\n  "object": "event"\n}'


def stripe_v1(body: bytes, t: int | float, secret: str = STRIPE_SECRET) -> str:
    """Stripe's documented scheme, written out independently of the source."""
    return hex_hmac(secret.encode(), f"{int(t)}.".encode() + body)


def stripe_header(body: bytes = STRIPE_BODY, t: float = NOW, secret: str = STRIPE_SECRET) -> dict[str, str]:
    return {"stripe-signature": f"t={int(t)},v1={stripe_v1(body, t, secret)}"}


class TestStripeVerify:
    def test_valid_signature_is_accepted(self) -> None:
        STRIPE.verify(stripe_header(), STRIPE_BODY, NOW)

    def test_secret_is_used_as_is_not_base64_decoded(self) -> None:
        secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        source = StripeSource(secret)
        source.verify(stripe_header(secret=secret), STRIPE_BODY, NOW)
        decoded_key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        forged = hmac.new(decoded_key, f"{int(NOW)}.".encode() + STRIPE_BODY, hashlib.sha256).hexdigest()
        with pytest.raises(VerificationError):
            source.verify({"stripe-signature": f"t={int(NOW)},v1={forged}"}, STRIPE_BODY, NOW)

    def test_one_valid_v1_among_several_and_v0_are_accepted(self) -> None:
        good = stripe_v1(STRIPE_BODY, NOW)
        bad = stripe_v1(STRIPE_BODY, NOW, "whsec_old")
        header = f"t={int(NOW)},v1={bad},v1={good},v0={'0' * 64},v9=zzz,junk"
        STRIPE.verify({"stripe-signature": header}, STRIPE_BODY, NOW)

    def test_items_in_any_order_with_spaces(self) -> None:
        header = f" v1={stripe_v1(STRIPE_BODY, NOW)} , t={int(NOW)} "
        STRIPE.verify({"stripe-signature": header}, STRIPE_BODY, NOW)

    def test_repeated_header_joined_by_comma_is_accepted(self) -> None:
        old = f"t={int(NOW) - 1000},v1={stripe_v1(STRIPE_BODY, NOW - 1000)}"
        new = f"t={int(NOW)},v1={stripe_v1(STRIPE_BODY, NOW)}"
        STRIPE.verify({"stripe-signature": f"{old}, {new}"}, STRIPE_BODY, NOW)

    def test_a_stale_signature_cannot_borrow_a_fresh_timestamp(self) -> None:
        stale = NOW - 1000
        header = f"t={int(NOW)},t={int(stale)},v1={stripe_v1(STRIPE_BODY, stale)}"
        with pytest.raises(VerificationError):
            STRIPE.verify({"stripe-signature": header}, STRIPE_BODY, NOW)

    @pytest.mark.parametrize("skew", [-300, -299, 0, 299, 300])
    def test_timestamps_within_tolerance_are_accepted(self, skew: int) -> None:
        STRIPE.verify(stripe_header(t=NOW + skew), STRIPE_BODY, NOW)

    @pytest.mark.parametrize("skew", [-301, 301, -86400, 86400])
    def test_stale_and_future_timestamps_are_rejected(self, skew: int) -> None:
        with pytest.raises(VerificationError, match="tolerance"):
            STRIPE.verify(stripe_header(t=NOW + skew), STRIPE_BODY, NOW)

    def test_tampered_body_and_wrong_secret_are_rejected(self) -> None:
        with pytest.raises(VerificationError):
            STRIPE.verify(stripe_header(), STRIPE_BODY + b" ", NOW)
        with pytest.raises(VerificationError):
            STRIPE.verify(stripe_header(secret="whsec_other"), STRIPE_BODY, NOW)

    @pytest.mark.parametrize(
        "header",
        [
            "",
            ",",
            "t=",
            f"t={int(NOW)}",  # no v1
            f"v1={stripe_v1(STRIPE_BODY, NOW)}",  # no t
            f"t=abc,v1={stripe_v1(STRIPE_BODY, NOW)}",
            f"t=1.7e9,v1={stripe_v1(STRIPE_BODY, NOW)}",
            f"t=-5,v1={stripe_v1(STRIPE_BODY, NOW)}",
            f"t=١٢٣,v1={stripe_v1(STRIPE_BODY, NOW)}",  # non-ASCII digits
            f"t={'9' * 40},v1={stripe_v1(STRIPE_BODY, NOW)}",  # huge number
            f"t={int(NOW)},v1=xyz",
            f"t={int(NOW)},v1={'g' * 64}",
            f"t={int(NOW)},v0={stripe_v1(STRIPE_BODY, NOW)}",  # v0 never counts
            f"t={int(NOW)},V1={stripe_v1(STRIPE_BODY, NOW)}",
            f"t={int(NOW)}," + ",".join(["v1=" + "0" * 64] * 40),  # too many
            ",".join(f"t={int(NOW) + i}" for i in range(5)) + f",v1={stripe_v1(STRIPE_BODY, NOW)}",
            f"t={int(NOW)},v1={stripe_v1(STRIPE_BODY, NOW)}é",
            HUGE,
        ],
    )
    def test_garbage_headers_are_rejected(self, header: str) -> None:
        with pytest.raises(VerificationError):
            STRIPE.verify({"stripe-signature": header}, STRIPE_BODY, NOW)

    def test_missing_header_is_rejected(self) -> None:
        with pytest.raises(VerificationError):
            STRIPE.verify({}, STRIPE_BODY, NOW)

    def test_works_with_the_real_clock(self) -> None:
        now = time.time()
        STRIPE.verify(stripe_header(t=now), STRIPE_BODY, now)


class TestStripeDedupAndParse:
    def test_dedup_key_is_the_event_id(self) -> None:
        assert STRIPE.dedup_key({}, STRIPE_BODY) == "evt_test_webhook"

    @pytest.mark.parametrize("body", [b"", b"{}", b'{"id": 5}', b'{"id": ""}', b"[]", b"\xff"])
    def test_no_string_id_no_key(self, body: bytes) -> None:
        assert STRIPE.dedup_key({}, body) is None

    def test_parse_makes_one_event_job(self) -> None:
        event = {"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"amount": 5}}}
        parsed = STRIPE.parse({}, json.dumps(event))
        [job] = parsed.jobs
        assert parsed.dedup_key == "evt_1"
        assert (job.kind, job.key, job.recipient, job.payload) == ("stripe.event", "stripe:evt_1", None, event)
        assert_storable(parsed)

    @pytest.mark.parametrize(("obj", "recipient"), [
        ({"object": "invoice", "customer": "cus_1"}, "stripe:cus_1"),
        ({"object": "invoice", "customer": {"id": "cus_2", "object": "customer"}}, "stripe:cus_2"),
        ({"object": "customer", "id": "cus_3"}, "stripe:cus_3"),
        ({"object": "invoice", "customer": None}, None),
        ({"object": "invoice", "customer": True}, None),
    ])
    def test_a_customers_events_have_the_customer_as_recipient(self, obj: dict, recipient: str | None) -> None:
        event = {"id": "evt_2", "object": "event", "data": {"object": obj}}
        [job] = STRIPE.parse({}, json.dumps(event)).jobs
        assert job.recipient == recipient

    @pytest.mark.parametrize("text", ["{}", '{"id": 5}', '{"id": ""}', "[]", "x", '{"id": null}'])
    def test_events_without_string_id_are_parse_errors(self, text: str) -> None:
        with pytest.raises(ParseError):
            STRIPE.parse({}, text)


# --- standard webhooks -------------------------------------------------------------

# The reference library's vector (standard-webhooks, libraries/python/tests/test_webhooks.py)
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TS = 1614265330
SW_BODY = b'{"test": 2432232314}'
SW_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
SW = StandardSource(SW_SECRET)


def sw_headers(signature: str = SW_SIGNATURE, msg_id: str = SW_ID, ts: int | str = SW_TS) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def sw_sign(body: bytes, msg_id: str, ts: int, key: bytes | None = None) -> str:
    key = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") if key is None else key
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


class TestStandardVerify:
    def test_published_vector_verifies(self) -> None:
        SW.verify(sw_headers(), SW_BODY, SW_TS)

    def test_secret_without_prefix_verifies_too(self) -> None:
        StandardSource("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").verify(sw_headers(), SW_BODY, SW_TS)

    def test_our_signer_agrees_with_the_vector(self) -> None:
        assert sw_sign(SW_BODY, SW_ID, SW_TS) == SW_SIGNATURE

    def test_reference_invalid_signature_is_rejected(self) -> None:
        # the reference suite's "invalid signature": last base64 character changed
        with pytest.raises(VerificationError):
            SW.verify(sw_headers("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="), SW_BODY, SW_TS)

    def test_reference_multi_signature_header_is_accepted(self) -> None:
        sigs = [
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            SW_SIGNATURE,
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
        ]
        SW.verify(sw_headers(" ".join(sigs)), SW_BODY, SW_TS)

    def test_other_versions_are_ignored(self) -> None:
        header = "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg=="
        SW.verify(sw_headers(f"{header} {SW_SIGNATURE}"), SW_BODY, SW_TS)
        with pytest.raises(VerificationError):
            SW.verify(sw_headers(header), SW_BODY, SW_TS)
        with pytest.raises(VerificationError):
            SW.verify(sw_headers(SW_SIGNATURE.replace("v1,", "v2,")), SW_BODY, SW_TS)

    def test_repeated_headers_joined_by_comma(self) -> None:
        headers = sw_headers(f"v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=, {SW_SIGNATURE}")
        headers["webhook-id"] = f"{SW_ID}, {SW_ID}"
        headers["webhook-timestamp"] = f"{SW_TS}, {SW_TS}"
        SW.verify(headers, SW_BODY, SW_TS)

    @pytest.mark.parametrize("skew", [-300, -299, 299, 300])
    def test_within_tolerance_is_accepted(self, skew: int) -> None:
        SW.verify(sw_headers(), SW_BODY, SW_TS + skew)

    @pytest.mark.parametrize("skew", [-301, 301, -(10**6), 10**6])
    def test_stale_and_future_are_rejected(self, skew: int) -> None:
        with pytest.raises(VerificationError, match="tolerance"):
            SW.verify(sw_headers(), SW_BODY, SW_TS + skew)

    def test_tampered_body_id_or_timestamp_are_rejected(self) -> None:
        with pytest.raises(VerificationError):
            SW.verify(sw_headers(), SW_BODY.replace(b"2", b"3"), SW_TS)
        with pytest.raises(VerificationError):
            SW.verify(sw_headers(msg_id="msg_other"), SW_BODY, SW_TS)
        with pytest.raises(VerificationError):
            SW.verify(sw_headers(ts=SW_TS + 1), SW_BODY, SW_TS)

    def test_wrong_secret_is_rejected(self) -> None:
        other = "whsec_" + base64.b64encode(b"another key of 24 bytes!").decode()
        with pytest.raises(VerificationError):
            StandardSource(other).verify(sw_headers(), SW_BODY, SW_TS)

    @pytest.mark.parametrize(
        "changes",
        [
            {"webhook-id": None},
            {"webhook-timestamp": None},
            {"webhook-signature": None},
            {"webhook-id": ""},
            {"webhook-timestamp": ""},
            {"webhook-signature": ""},
            {"webhook-id": "msg a"},
            {"webhook-id": "msg_é"},
            {"webhook-id": f"{SW_ID}, msg_other"},
            {"webhook-id": HUGE},
            {"webhook-timestamp": "hello"},
            {"webhook-timestamp": f"{SW_TS}.0"},
            {"webhook-timestamp": f"-{SW_TS}"},
            {"webhook-timestamp": "9" * 50},
            {"webhook-timestamp": "١٦١٤٢٦٥٣٣٠"},
            {"webhook-timestamp": f"{SW_TS}, {SW_TS + 1}"},
            {"webhook-timestamp": HUGE},
            {"webhook-signature": "v1"},
            {"webhook-signature": "v1,"},
            {"webhook-signature": ",g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
            {"webhook-signature": "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
            {"webhook-signature": "v1,not base64!"},
            {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"},  # no padding
            {"webhook-signature": "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE="},  # url-safe alphabet
            {"webhook-signature": SW_SIGNATURE + "é"},
            {"webhook-signature": " ".join(["v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="] * 40)},
            {"webhook-signature": HUGE},
        ],
    )
    def test_garbage_headers_are_rejected(self, changes: dict[str, str | None]) -> None:
        headers: dict[str, str] = sw_headers()
        for name, value in changes.items():
            if value is None:
                del headers[name]
            else:
                headers[name] = value
        with pytest.raises(VerificationError):
            SW.verify(headers, SW_BODY, SW_TS)

    def test_fresh_signature_with_the_real_clock(self) -> None:
        now = int(time.time())
        SW.verify(sw_headers(sw_sign(SW_BODY, SW_ID, now), ts=now), SW_BODY, time.time())


class TestStandardSecret:
    @pytest.mark.parametrize("secret", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
    def test_prefix_is_optional(self, secret: str) -> None:
        assert decode_secret(secret) == base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")

    def test_missing_padding_is_tolerated(self) -> None:
        assert decode_secret("whsec_" + base64.b64encode(b"12345").decode().rstrip("=")) == b"12345"

    @pytest.mark.parametrize("secret", ["whsec_", "whsec_not base64!", "whsec_ab$d", "whsec_é"])
    def test_malformed_secrets_are_config_errors(self, secret: str) -> None:
        with pytest.raises(ConfigError) as info:
            StandardSource(secret)
        assert "STANDARD_WEBHOOK_SECRET" in str(info.value) and secret not in str(info.value)


class TestStandardDedupAndParse:
    def test_dedup_key_is_the_webhook_id(self) -> None:
        assert SW.dedup_key(sw_headers(), b"not even json") == SW_ID
        assert SW.dedup_key({"webhook-id": f"{SW_ID}, {SW_ID}"}, b"") == SW_ID
        assert SW.dedup_key({}, SW_BODY) is None
        assert SW.dedup_key({"webhook-id": "a, b"}, SW_BODY) is None

    def test_parse_makes_one_event_job(self) -> None:
        parsed = SW.parse(sw_headers(), SW_BODY.decode())
        [job] = parsed.jobs
        assert parsed.dedup_key == SW_ID
        assert job.kind == "standard.event" and job.key == f"standard:{SW_ID}" and job.recipient is None
        assert job.payload == {"test": 2432232314}
        assert_storable(parsed)

    def test_parse_needs_no_secret_header(self) -> None:
        # a replay parses the stored event, whose secret headers were never stored
        headers = {k: v for k, v in sw_headers().items() if k not in SW.secret_headers}
        assert SW.parse(headers, SW_BODY.decode()).jobs[0].key == f"standard:{SW_ID}"

    @pytest.mark.parametrize("text", ["", "[1]", "true", "{", '{"a": NaN}'])
    def test_non_objects_are_parse_errors(self, text: str) -> None:
        with pytest.raises(ParseError):
            SW.parse(sw_headers(), text)


# --- registry ----------------------------------------------------------------------


class TestEnabledSources:
    def test_none_without_secrets(self) -> None:
        assert enabled_sources(Settings()) == {}

    def test_only_sources_with_a_secret(self) -> None:
        settings = Settings(telegram_webhook_secret="t", site_webhook_secret="s", stripe_webhook_secret="")
        assert list(enabled_sources(settings)) == ["telegram", "site"]

    def test_all_five(self) -> None:
        settings = Settings(
            telegram_webhook_secret="t",
            site_webhook_secret="s",
            github_webhook_secret="g",
            stripe_webhook_secret="whsec_x",
            standard_webhook_secret=SW_SECRET,
        )
        sources = enabled_sources(settings)
        assert list(sources) == ["telegram", "site", "github", "stripe", "standard"]
        for name, source in sources.items():
            assert source.name == name
            assert source.secret_headers and all(h == h.lower() for h in source.secret_headers)

    def test_malformed_standard_secret_stops_start_up(self) -> None:
        with pytest.raises(ConfigError, match="STANDARD_WEBHOOK_SECRET"):
            enabled_sources(Settings(standard_webhook_secret="whsec_%%%"))

    def test_from_env(self) -> None:
        settings = Settings.from_env({"GITHUB_WEBHOOK_SECRET": "g"}, env_file=None)
        assert list(enabled_sources(settings)) == ["github"]


# --- replay_sources: every known source, parse-only ------------------------------------


def test_replay_sources_are_every_known_source_and_parse_like_the_enabled_ones():
    everything = Settings.from_env({
        "TELEGRAM_WEBHOOK_SECRET": "t", "SITE_WEBHOOK_SECRET": "s", "GITHUB_WEBHOOK_SECRET": "g",
        "STRIPE_WEBHOOK_SECRET": "whsec_x", "STANDARD_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"k" * 24).decode(),
    }, env_file=None)
    enabled = enabled_sources(everything)
    replay = replay_sources()
    assert list(replay) == list(enabled)  # no source is left out of replays
    body = json.dumps({"update_id": 5, "message": {"message_id": 1, "text": "/ping", "chat": {"id": 9}}})
    assert replay["telegram"].parse({}, body) == enabled["telegram"].parse({}, body)
    assert replay["stripe"].parse({}, STRIPE_BODY.decode()) == enabled["stripe"].parse({}, STRIPE_BODY.decode())


def test_replay_sources_verify_nothing_and_differ_each_time():
    # their secrets are random: a replay source must never be a way in
    body = STRIPE_BODY
    with pytest.raises(VerificationError):
        replay_sources()["stripe"].verify(stripe_header(body), body, NOW)
    with pytest.raises(VerificationError):
        replay_sources()["telegram"].verify({"x-telegram-bot-api-secret-token": ""}, b"{}", NOW)
    first, second = replay_sources()["site"], replay_sources()["site"]
    assert first._secret != second._secret  # type: ignore[attr-defined]


def test_the_telegram_secret_is_compared_through_digests_of_one_length(monkeypatch):
    """Timing must not reveal the secret's length: whatever the header's length, the
    constant-time comparison sees two SHA-256 digests (as for the admin token)."""
    seen: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    source = TelegramSource("the-right-secret_1")
    source.verify({"x-telegram-bot-api-secret-token": "the-right-secret_1"}, b"{}", 0.0)
    for wrong in ("x", "the-right-secret_2", "a" * 200):
        with pytest.raises(VerificationError):
            source.verify({"x-telegram-bot-api-secret-token": wrong}, b"{}", 0.0)
    assert seen and set(seen) == {(32, 32)}
