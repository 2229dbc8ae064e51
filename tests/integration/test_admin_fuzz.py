"""Property-based fuzzing of the live service over real HTTP, driven by its own ``/openapi.json``.

Two properties, each bounded (100 examples; about 5 and 10 seconds):

1. **Schemathesis** reads the description the service serves and generates
   requests for every operation, valid ones and ones that break the schema
   (ids that are strings, negative or beyond bigint; limits out of range; odd
   headers and bodies). Each answer must not be a 5xx, and must conform: a
   documented status code, the documented content type, a body matching the
   documented schema, the documented headers (``WWW-Authenticate`` on 401).
   Half of the admin requests carry the right token, so the answers behind the
   auth wall are checked too; path ids are often ones that exist.
2. **Raw requests** of our own: one example (a path segment, a query string,
   headers, a body) is sent to every documented path, with its documented method
   and an odd one (PUT, DELETE, OPTIONS, ...). No 5xx, every error
   is a JSON ``{"error": ...}``, and where the path is a documented one the status
   is a documented one (405 for a method it does not take, 404 for no route).

The service (``running_service``) runs in the test's trio nursery; the fuzzing is
synchronous (Hypothesis, requests/httpx) and runs in a worker thread meanwhile.
The database stays up: 503 is documented but not expected here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import schemathesis
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.service import (
    ADMIN_TOKEN,
    TG_SECRET,
    post_telegram,
    running_service,
    service_settings,
    telegram_update,
)

EXAMPLES = 100
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no replay of old failures across runs: each run is its own bounded sample
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
RIGHT_AUTH = f"Bearer {ADMIN_TOKEN}"


async def seed(client: httpx.AsyncClient) -> tuple[list[int], list[int]]:
    """Events and jobs for the fuzzer to hit: three parsed events and an unparsable one."""
    event_ids = []
    for update_id in (1, 2, 3):
        response = await post_telegram(client, telegram_update(update_id, 40 + update_id, "/ping"))
        assert response.status_code == 202
        event_ids.append(response.json()["id"])
    response = await client.post("/hooks/telegram", content=b"{not json",
                                 headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})
    assert response.status_code == 202
    event_ids.append(response.json()["id"])
    jobs = (await client.get("/admin/jobs", headers={"Authorization": RIGHT_AUTH})).json()["jobs"]
    return [j["id"] for j in jobs], event_ids


# --- 1. schemathesis against /openapi.json ------------------------------------------------------


def fuzz_with_schemathesis(
    document: dict[str, Any], base_url: str, job_ids: list[int], event_ids: list[int]
) -> Counter[tuple[str, int]]:
    """Run the schemathesis property (in a worker thread); returns the answers by (operation, status)."""
    schema = schemathesis.openapi.from_dict(document)
    cases = st.one_of(
        schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
        schema.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )
    existing = {"job_id": job_ids, "event_id": event_ids}
    seen: Counter[tuple[str, int]] = Counter()

    clients = iter(range(1, 2**24))

    @FUZZ_SETTINGS
    @given(case=cases, right_token=st.booleans(), data=st.data())
    def property_(case: Any, right_token: bool, data: st.DataObject) -> None:
        # each example is another client (the service trusts 127.0.0.1 as a proxy): the lockout of a
        # client sending wrong tokens (tests/integration/test_admin.py) does not hide what lies behind it
        case.headers = {**(case.headers or {}), "X-Forwarded-For": _address(next(clients))}
        if case.path.startswith("/admin/") and right_token:
            case.headers = {**case.headers, "Authorization": RIGHT_AUTH}
        for name in case.path_parameters or {}:
            if name in existing and data.draw(st.booleans(), label="existing id"):
                case.path_parameters[name] = data.draw(st.sampled_from(existing[name]), label=name)
        response = case.call(base_url=base_url, timeout=10)
        seen[(case.operation.label, response.status_code)] += 1
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code}"
        case.validate_response(response, checks=CHECKS)

    property_()
    return seen


def _address(n: int) -> str:
    """The ``n``-th client address of the fuzzers (10.0.0.0/8)."""
    return f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


async def test_schemathesis_finds_no_5xx_and_every_answer_is_documented(
    dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with (
        running_service(service_settings(dsn, telegram_stub.url, trusted_proxies="127.0.0.1")) as svc,
        httpx.AsyncClient(base_url=svc.urls[0]) as client,
    ):
        job_ids, event_ids = await seed(client)
        response = await client.get("/openapi.json")
        assert response.status_code == 200
        document = response.json()
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(fuzz_with_schemathesis, document, svc.urls[0], job_ids, event_ids)
    assert seen.total() >= EXAMPLES // 2
    # both sides of the auth wall were reached
    admin = [(label, status) for label, status in seen if " /admin/" in label]
    assert any(status == 401 for _, status in admin) and any(status < 300 for _, status in admin), seen


# --- 2. raw requests of our own -----------------------------------------------------------------

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
#: the query parameter names of the description (those of GET /admin/jobs)
QUERY_NAMES = ["status", "kind", "limit"]

# Header names and values h11 will send (a token; visible ASCII with inner spaces).
_header_name = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}", fullmatch=True).filter(
    lambda n: n.lower() not in {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade"}
)
_header_value = st.from_regex(r"([!-~]([ !-~]{0,40}[!-~])?)?", fullmatch=True)
_segment = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["1", "2", "3", "0", "abc", "1e3", "-1", "9223372036854775807", "9223372036854775808",
                     "telegram", "site", "github", "%", "%00", " "]),
    st.text(max_size=12),
).filter(lambda s: s not in ("", ".", ".."))
_auth = st.one_of(
    st.none(),
    st.builds(lambda v: f"Bearer {v}", _header_value.filter(bool)),
    _header_value,
)
#: query values that have broken services before: NUL, non-ASCII digits, numbers that are not ints
_NASTY = ["", "0", "-1", "1e3", "1.5", "1001", "50", "\u0661", "\x00", "a\x00b", "pending", "failed", "%", " 1"]
_query_value = st.one_of(st.sampled_from(_NASTY), st.text(max_size=8))
_query = st.one_of(
    # one documented parameter with an odd value: the commonest mistake of a caller
    st.tuples(st.sampled_from(QUERY_NAMES), _query_value).map(lambda pair: [pair]),
    st.lists(st.tuples(st.sampled_from(QUERY_NAMES) | st.text(max_size=5), _query_value), max_size=4),
)


@dataclass(frozen=True)
class RawInput:
    """One example: what is sent, the same way, to every documented path."""

    segment: str
    query: list[tuple[str, str]]
    headers: list[tuple[str, str]]
    odd_method: str
    body: bytes


@st.composite
def raw_inputs(draw: Any) -> RawInput:
    """A path segment, a query, headers (the right token half the time), an extra method, a body."""
    headers = [(k, v) for k, v in draw(st.dictionaries(_header_name, _header_value, max_size=3)).items()
               if k.lower() != "authorization"]
    auth = RIGHT_AUTH if draw(st.booleans(), label="right token") else draw(_auth, label="authorization")
    if auth is not None:
        headers.append(("Authorization", auth))
    return RawInput(
        segment=draw(_segment, label="segment"),
        query=draw(_query, label="query"),
        headers=headers,
        odd_method=draw(st.sampled_from(METHODS), label="odd method"),
        body=draw(st.binary(max_size=200), label="body"),
    )


def route_table(document: dict[str, Any]) -> list[tuple[re.Pattern[str], dict[str, set[int]]]]:
    """(path regex, {METHOD: documented statuses}) for every path of the description."""
    table = []
    for template, operations in document["paths"].items():
        pattern = re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template)))
        table.append((pattern, {m.upper(): {int(code) for code in op["responses"]} for m, op in operations.items()}))
    return table


def expected_statuses(table: list[Any], method: str, path: str) -> set[int]:
    """What the service may answer to ``method path`` (the decoded path the router sees)."""
    for pattern, operations in table:
        if pattern.fullmatch(path):
            if method == "HEAD" and "GET" in operations:
                return operations["GET"]
            if method == "OPTIONS":  # answered by Quart, behind the admin auth wall (and its lockout)
                return {200, 401, 429} if path.startswith("/admin/") else {200}
            return operations.get(method, {405})
    return {404}


def fuzz_raw(document: dict[str, Any], base_url: str) -> Counter[tuple[str, str, int]]:
    """Run the raw-request property (in a worker thread); returns the answers by (method, path, status).

    Each example goes to every documented path, with its documented method(s) and
    one odd method: a malformed value then reaches every route that could mishandle it.
    """
    table = route_table(document)
    seen: Counter[tuple[str, str, int]] = Counter()
    clients = iter(range(1, 2**24))

    @FUZZ_SETTINGS
    @given(raw=raw_inputs())
    def property_(client: httpx.Client, raw: RawInput) -> None:
        # each example is another client, as in the schemathesis property
        raw_headers = [*raw.headers, ("X-Forwarded-For", _address(next(clients)))]
        # a function, not a string, as replacement: re.sub would read backslashes in it as escapes
        path_quoted = quote(raw.segment, safe="")
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in raw.query)
        for template, operations in document["paths"].items():
            url = re.sub(r"\{[a-z_]+\}", lambda _: path_quoted, template) + (f"?{query}" if query else "")
            decoded_path = re.sub(r"\{[a-z_]+\}", lambda _: raw.segment, template)
            for method in {*(m.upper() for m in operations), raw.odd_method}:
                body = raw.body if method not in ("GET", "HEAD") else None
                # A body the route answers without reading (405, OPTIONS, 404, admin POSTs) can make
                # hypercorn close the connection after the answer, without "Connection: close":
                # the next request on it then finds it gone. Such requests use a connection of
                # their own, so that hypercorn behaviour does not mask what the app answers.
                headers = [*raw_headers, ("Connection", "close")] if body else raw_headers
                try:
                    response = client.request(method, httpx.URL(base_url + url), headers=headers, content=body)
                except httpx.TransportError as exc:  # a dropped connection is a failure of the service too
                    raise AssertionError(f"{method} {url} {headers!r}: no answer: {exc!r}") from exc
                seen[(method, template, response.status_code)] += 1
                where = f"{method} {url} -> {response.status_code} {response.text[:200]!r}"
                assert response.status_code < 500, where
                assert response.status_code in expected_statuses(table, method, decoded_path), where
                if response.status_code >= 400 and method != "HEAD":
                    assert response.headers["content-type"] == "application/json", where
                    answer = json.loads(response.content)
                    assert set(answer) == {"error"} and "\n" not in answer["error"], where

    with httpx.Client(timeout=10) as client:
        property_(client)
    return seen


async def test_raw_requests_never_get_a_5xx_and_documented_paths_answer_documented_codes(
    dsn: str, db: Any, telegram_stub: Any
) -> None:
    async with (
        running_service(service_settings(dsn, telegram_stub.url, trusted_proxies="127.0.0.1")) as svc,
        httpx.AsyncClient(base_url=svc.urls[0]) as client,
    ):
        await seed(client)
        document = (await client.get("/openapi.json")).json()
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(fuzz_raw, document, svc.urls[0])
    assert seen.total() >= EXAMPLES // 2 * len(document["paths"])
    assert {200, 401, 405} <= {status for _, _, status in seen}, seen
