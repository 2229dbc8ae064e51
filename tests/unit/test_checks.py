"""autom.checks: HTTP responses and exceptions → PermanentError / TransientError / Retry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest
import trio

from autom.checks import check, classify_exception, redact, retry_after_seconds
from autom.errors import PermanentError, Retry, TransientError

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
URL = f"https://api.telegram.org/bot{TOKEN}/sendMessage"


def response(status: int, body: object = None, headers: dict[str, str] | None = None) -> httpx.Response:
    content = b"" if body is None else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    return httpx.Response(status, content=content, headers=headers, request=httpx.Request("POST", URL))


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_2xx_passes(status: int) -> None:
    check(response(status, {"ok": True}), "telegram sendMessage")


def test_429_with_telegram_retry_after() -> None:
    body = {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 7",
        "parameters": {"retry_after": 7},
    }
    with pytest.raises(Retry) as info:
        check(response(429, body), "telegram sendMessage")
    assert info.value.after == 7
    assert str(info.value) == "telegram sendMessage: HTTP 429 Too Many Requests: retry after 7"


def test_429_retry_after_header_seconds_wins_over_json() -> None:
    with pytest.raises(Retry) as info:
        check(response(429, {"parameters": {"retry_after": 7}}, {"Retry-After": "3"}), "x")
    assert info.value.after == 3


def test_429_retry_after_http_date() -> None:
    now = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)
    r = response(429, None, {"Retry-After": "Sun, 29 Nov 2026 14:00:42 GMT"})
    assert retry_after_seconds(r, now=now) == 42
    # a date in the past means "now", not a negative delay
    r = response(429, None, {"Retry-After": "Sun, 29 Nov 2026 13:00:00 GMT"})
    assert retry_after_seconds(r, now=now) == 0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("999999", 999999.0),  # legal, and huge: RetryPolicy caps it (tests/unit/test_retry.py)
        ("9" * 400, float("inf")),  # more digits than a float holds: "very long", not an error
        ("0", 0.0),
        ("2.5", 2.5),  # not RFC 9110 (1*DIGIT) but unambiguous
        ("-5", 1.0),  # malformed: the default, not "now" or a negative wait
        ("inf", 1.0),
        ("NaN", 1.0),
        ("1_000", 1.0),  # Python's float() would take it; HTTP does not
        ("", 1.0),
    ],
)
def test_malformed_or_huge_retry_after_header(header: str, expected: float) -> None:
    assert retry_after_seconds(response(429, None, {"Retry-After": header})) == expected


def test_malformed_header_falls_back_to_telegrams_retry_after() -> None:
    assert retry_after_seconds(response(429, {"parameters": {"retry_after": 4}}, {"Retry-After": "-1"})) == 4


@pytest.mark.parametrize(
    ("value", "expected"), [(10**400, float("inf")), (-(10**400), 0.0), (-3, 0.0), (1e308, 1e308)]
)
def test_huge_or_negative_json_retry_after(value: int | float, expected: float) -> None:
    with pytest.raises(Retry) as info:
        check(response(429, {"ok": False, "parameters": {"retry_after": value}}), "x")
    assert info.value.after == expected


def test_http_date_forms_of_rfc_9110() -> None:
    now = datetime(1994, 11, 6, 8, 49, 0, tzinfo=UTC)
    for header in ("Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"):
        seconds = retry_after_seconds(response(429, None, {"Retry-After": header}), now=now)
        assert seconds == 37, header


def test_429_http_date_through_check_is_roughly_right() -> None:
    when = datetime.now(UTC).timestamp() + 120
    header = datetime.fromtimestamp(when, UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
    with pytest.raises(Retry) as info:
        check(response(429, None, {"Retry-After": header}), "x")
    assert 115 <= info.value.after <= 121


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (None, None),
        (None, "<html>slow down</html>"),
        ({"Retry-After": "soon"}, {"ok": False}),
        (None, {"parameters": {"retry_after": "x"}}),
        (None, {"parameters": {"retry_after": True}}),
    ],
)
def test_429_without_usable_retry_after_defaults_to_one_second(headers: dict[str, str] | None, body: object) -> None:
    with pytest.raises(Retry) as info:
        check(response(429, body, headers), "x")
    assert info.value.after == 1.0


def test_429_garbage_header_falls_back_to_json() -> None:
    with pytest.raises(Retry) as info:
        check(response(429, {"parameters": {"retry_after": 5}}, {"Retry-After": "later"}), "x")
    assert info.value.after == 5


@pytest.mark.parametrize(
    ("status", "description"),
    [(400, "Bad Request: chat not found"), (403, "Forbidden: bot was blocked by the user"), (404, "Not Found")],
)
def test_other_4xx_is_permanent_with_telegram_description(status: int, description: str) -> None:
    with pytest.raises(PermanentError) as info:
        check(response(status, {"ok": False, "error_code": status, "description": description}), "telegram sendMessage")
    assert str(info.value) == f"telegram sendMessage: HTTP {status} {description}"
    assert not isinstance(info.value, TransientError)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 301, 302, 100])
def test_5xx_and_anything_else_is_transient(status: int) -> None:
    with pytest.raises(TransientError) as info:
        check(response(status, "<html>proxy error for " + URL + "</html>"), "telegram sendMessage")
    assert not isinstance(info.value, Retry)
    message = str(info.value)
    assert message.startswith(f"telegram sendMessage: HTTP {status} ")
    assert TOKEN not in message and "api.telegram.org" not in message


def test_reason_phrase_when_body_is_not_telegram_json() -> None:
    with pytest.raises(TransientError) as info:
        check(response(502, "<html>bad gateway</html>"), "telegram sendMessage")
    assert str(info.value) == "telegram sendMessage: HTTP 502 Bad Gateway"


def test_description_is_one_line_and_cut() -> None:
    body = {"ok": False, "description": "line one\nline two " + "x" * 500}
    with pytest.raises(PermanentError) as info:
        check(response(400, body), "w")
    message = str(info.value)
    assert "\n" not in message
    assert len(message) <= len("w: HTTP 400 ") + 200
    assert message.endswith("…")


def test_description_echoing_the_url_or_token_is_redacted() -> None:
    body = {"ok": False, "description": f"cannot reach {URL}; token {TOKEN}"}
    with pytest.raises(PermanentError) as info:
        check(response(400, body), "w")
    assert TOKEN not in str(info.value)
    assert "api.telegram.org" not in str(info.value)


def test_redact() -> None:
    assert redact(f"GET {URL} failed") == "GET <url> failed"
    assert redact(f"/bot{TOKEN}/getMe") == "/bot<token>/getMe"
    assert redact(f"token={TOKEN}") == "token=<token>"
    assert redact("chat 12345: hello") == "chat 12345: hello"


def test_classify_timeouts_and_transport_errors() -> None:
    request = httpx.Request("POST", URL)
    cases = [
        httpx.ReadTimeout(f"timed out reading {URL}", request=request),
        httpx.ConnectTimeout("timed out", request=request),
        httpx.PoolTimeout("pool", request=request),
        httpx.ConnectError(f"[Errno 111] Connection refused ({URL})", request=request),
        httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request),
        trio.TooSlowError(),
    ]
    for exc in cases:
        error = classify_exception(exc, "telegram sendMessage")
        assert type(error) is TransientError, exc
        message = str(error)
        assert message.startswith("telegram sendMessage: ")
        assert "\n" not in message
        assert TOKEN not in message and "api.telegram.org" not in message, message
        assert error.__cause__ is None and error.__context__ is None


def test_classify_messages() -> None:
    assert str(classify_exception(trio.TooSlowError(), "t")) == "t: no complete answer within the deadline"
    assert str(classify_exception(httpx.ReadTimeout("x"), "t")) == "t: timed out (ReadTimeout)"
    refused = classify_exception(httpx.ConnectError("[Errno 111] Connection refused"), "t")
    assert str(refused) == "t: ConnectError: [Errno 111] Connection refused"


def test_classify_passes_job_errors_through_and_invalid_url_is_permanent() -> None:
    original = PermanentError("already classified")
    assert classify_exception(original, "t") is original
    assert isinstance(classify_exception(httpx.InvalidURL(f"bad {URL}"), "t"), PermanentError)
    other = classify_exception(RuntimeError(f"odd {URL}"), "t")
    assert type(other) is TransientError and TOKEN not in str(other)


@pytest.mark.parametrize(("status", "headers", "error", "after"), [
    (503, {"Retry-After": "7"}, Retry, 7.0),
    (529, {"Retry-After": "2"}, Retry, 2.0),
    (503, {}, TransientError, None),
    (503, {"Retry-After": "soon"}, TransientError, None),
    (502, {"Retry-After": "7"}, TransientError, None),
])
def test_an_overloaded_server_that_says_when_is_retried_then(status: int, headers: dict[str, str],
                                                             error: type[Exception], after: float | None) -> None:
    with pytest.raises(error) as info:
        check(response(status, {"error": {"type": "overloaded_error"}}, headers), "model")
    if after is not None:
        assert info.value.after == after  # type: ignore[attr-defined]
