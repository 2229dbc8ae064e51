"""Fuzzing the live service over real HTTP: properties driven by its own ``/openapi.json``, and a walk.

Two properties, each bounded (100 examples; about 5 and 10 seconds), and a walk:

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
3. **Every ``/ui/`` and ``/admin`` route** the app has (its URL map, so a new route is
   walked too), logged in and with the right token, with hostile values (``HOSTILE``:
   unpaired surrogates, bidi and control characters, numbers past bigint, dates past
   the calendar) in every path segment, every query parameter it takes (an unknown
   one once; a route that checks no query gets each value under every name at once),
   every form field and JSON field, over stored data as hostile. Never a 5xx (about
   5,600 requests).

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
        # a recipient may hold "/" (site:/contact): its parameter takes the rest of the path,
        # line breaks included (DOTALL), as the router's converters do
        any_text = re.escape(template).replace(r"\{recipient\}", ".+")
        pattern = re.compile(re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", any_text), re.DOTALL)
        table.append((pattern, {m.upper(): {int(code) for code in op["responses"]} for m, op in operations.items()}))
    return table


def expected_statuses(table: list[Any], method: str, path: str) -> set[int]:
    """What the service may answer to ``method path`` (the decoded path the router sees).

    As the router does: of the routes whose path matches (``/admin/recipients/a/pause`` is
    both recipient "a"'s pause and recipient "a/pause"'s page), the one that takes the method;
    405 when none does."""
    matching = [operations for pattern, operations in table if pattern.fullmatch(path)]
    if not matching:
        return {404}
    if method == "OPTIONS":  # answered by Quart, behind the admin auth wall (and its lockout)
        return {200, 401, 429} if path.startswith("/admin/") else {200}
    for operations in matching:
        if method == "HEAD" and "GET" in operations:
            return operations["GET"]
        if method in operations:
            return operations[method]
    return {405}


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


# --- 3. every /ui/ and /admin route with hostile values -----------------------------------------

#: values that have broken the console and the admin API before, or could: unpaired surrogates,
#: bidi and control characters, numbers past bigint and float, dates past the calendar, odd digits
HOSTILE = [
    "\ud800", "a\udfffb", "\u202eevil", "\u2066x\u2069", "\x00", "\x1b[2J", "\u0663", " 1", "1_0",
    "99999999999999999999999999", "9223372036854775808", "-1", "0", "1e309", "NaN",
    "999999d", "999999s", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "+275760-09-13", "2026-02-30",
    "%", "../..", "//evil.example/", "<script>alert(1)</script>", "x" * 3000,
]
#: the query names the routes take, and one none takes
NAMES = ["status", "kind", "recipient", "event_id", "source", "since", "until", "before", "limit", "refresh",
         "notice", "seal", "created", "next", "token", "colour"]
#: the fields of the console's forms, and of the admin API's JSON bodies
FORM_NAMES = ["kind", "recipient", "since", "token", "next", "csrf"]
JSON_NAMES = ["kind", "recipient", "since"]


def _encoded(value: str) -> str:
    """``value`` percent-encoded as UTF-8, an unpaired surrogate as the bytes a careless client sends."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def _batches(names: list[str], value: str, limit: int = 8000) -> list[list[str]]:
    """``names`` in groups whose ``name=value`` pairs, ``value`` encoded, fit in ``limit`` bytes of a query."""
    size = max(1, limit // (len(_encoded(value)) + 12))
    return [names[i:i + size] for i in range(0, len(names), size)]


def _form(fields: dict[str, str]) -> bytes:
    return "&".join(f"{_encoded(k)}={_encoded(v)}" for k, v in fields.items()).encode()


async def test_every_console_and_admin_route_with_hostile_values_answers_without_a_5xx(db: Any) -> None:
    from tests.integration.test_console import csrf_of, login
    from tests.support.http_app import running_app

    async with running_app(db) as app:
        # stored text as hostile as what is sent: a body with an escaped lone surrogate, bidi everywhere
        event = await db.fetch_val(
            "insert into events (source, headers, body, dedup_key) values ('site', %s, %s, %s) returning id",
            [json.dumps({"x-rlo": "\u202e"}), '{"text": "\\ud800\u202e", "n": 1e308}', "k\u202e"])
        job = await db.fetch_val(
            "insert into jobs (kind, status, recipient, key, event_id, last_error, finished_at, payload) values "
            "('site.\u202eform', 'failed', 'r\u202e', 'k\u202e', %s, 'boom \x1b[2J\u202e', now(), %s) returning id",
            [event, json.dumps({"t": "\u2066"})])
        rules = sorted((rule.rule, sorted(rule.methods - {"HEAD", "OPTIONS"}))
                       for rule in app.app.url_map.iter_rules() if rule.rule.startswith(("/ui", "/admin")))
        assert len(rules) >= 25, rules
        answers: Counter[tuple[str, str, int]] = Counter()
        failures: list[str] = []
        auth = {"Authorization": RIGHT_AUTH}

        async with httpx.AsyncClient(base_url=app.url, timeout=30) as client:
            assert (await login(client)).status_code == 303
            csrf = csrf_of((await client.get("/ui/")).text)

            async def send(method: str, rule: str, url: str, body: bytes | None = None,
                           content_type: str = "application/x-www-form-urlencoded") -> httpx.Response:
                headers = dict(auth) if rule.startswith("/admin") else {}
                if body is not None:
                    headers["Content-Type"] = content_type
                response = await client.request(method, url, content=body, headers=headers)
                answers[(method, rule, response.status_code)] += 1
                if response.status_code >= 500:
                    failures.append(f"{method} {url[:200]} {body!r:.200} -> {response.status_code} "
                                    f"{response.text[:200]!r}")
                return response

            def path_of(rule: str, segment: str | None = None) -> str:
                def fill(match: re.Match[str]) -> str:
                    if segment is not None:
                        return _encoded(segment)
                    return {"job_id": str(job), "event_id": str(event)}.get(match[1], "site.form")
                return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", fill, rule)

            # logout last: it ends the session the rest of the walk uses
            for rule, methods in sorted(rules, key=lambda r: r[0] == "/ui/logout"):
                for method in methods:
                    form = {"csrf": csrf} if rule.startswith("/ui") and method == "POST" else None
                    plain = None if form is None else _form(form)
                    # hostile path segments
                    if "<" in rule:
                        for value in HOSTILE:
                            await send(method, rule, path_of(rule, value), plain)
                    base = path_of(rule)
                    # each name with each value, where the route takes the name (an unknown one is a 400
                    # whatever its value: once is enough). A route that takes "colour", which no route
                    # reads, checks no query (the actions; the login page picks its "next"): there each
                    # value goes under every name at once, in as few requests as a URL holds
                    takes = [name for name in NAMES if "unknown query parameter" not in
                             (await send(method, rule, f"{base}?{name}=x", plain)).text]
                    for value in HOSTILE:
                        for names in _batches(NAMES, value) if "colour" in takes else [[n] for n in takes]:
                            query = "&".join(f"{name}={_encoded(value)}" for name in names)
                            await send(method, rule, f"{base}?{query}", plain)
                    # POST: each form field (console) or JSON field (admin) with each value
                    if method == "POST" and form is not None:
                        for name in FORM_NAMES:
                            for value in HOSTILE:
                                await send(method, rule, base, _form({**form, name: value}))
                    elif method == "POST":
                        for name in JSON_NAMES:
                            for value in HOSTILE:
                                await send(method, rule, base, json.dumps({name: value}).encode(), "application/json")
                        for raw in (b"[]", b"null", b"1e999", b'{"kind": {"a": 1}}', b"\xff\xfe", b'"\\ud800"'):
                            await send(method, rule, base, raw, "application/json")
    assert failures == [], f"{len(failures)} answers were 5xx, the first: " + "\n".join(failures[:20])
    # the walk reached both sides: pages and lists that answered, and refusals naming the value
    statuses = {status for _, _, status in answers}
    assert {200, 400, 404} <= statuses, answers
    assert answers.total() > 1500, answers.total()
