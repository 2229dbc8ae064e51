"""A delivery's parameters for the intake's statements, encoded once (off the trio thread when large).

``store_params`` / ``encode_delivery`` build them; ``batch_items`` joins a batch's for
``intake_store_many``. Costs: docs/design/intake.md, "What a delivery costs".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import trio

from autom.jobs.models import NewJob
from autom.jobs.store import jobs_json

#: Bodies longer than this (characters) are encoded in a worker thread (``encode_delivery``).
ENCODE_IN_THREAD_CHARS = 64 * 1024


def delivery_size(params: Mapping[str, Any]) -> int:
    """About how many bytes ``params`` adds to a batch's parameter."""
    item = params.get("item")
    return len(item) if item is not None else len(params["body"]) + len(params["jobs"]) + len(params["headers"])


_dumps = json.JSONEncoder(ensure_ascii=False).encode


def batch_item(params: Mapping[str, Any]) -> str:
    """One delivery's element of ``intake_store_many``'s array (the headers and jobs are JSON already)."""
    return (f"[{_dumps(params['source'])},{params['headers']},{_dumps(params['body'])},"
            f"{_dumps(params['dedup_key'])},{params['jobs']}]")


def batch_items(batch: Iterable[Mapping[str, Any]]) -> str:
    """The ``%(items)s`` of ``intake_store_many``: the deliveries' ``store_params`` as one JSON array.

    Each element was encoded by ``store_params`` (``item``, off the trio thread for a
    large body); only the joining happens here.
    """
    return "[" + ",".join(p.get("item") or batch_item(p) for p in batch) + "]"


def store_params(
    source: str, headers: Mapping[str, str], body: str, dedup_key: str | None, jobs: Sequence[NewJob]
) -> dict[str, Any]:
    """The parameters of the ``intake_store`` statement (queries_intake.sql).

    Jobs travel as one JSON array (``jobs_json``, the queue's own encoding) rather
    than one typed array per column: psycopg adapts one text parameter much faster
    than six lists (docs/design/intake.md).
    ``event_id`` is the new event's, set by the statement.
    """
    params = {
        "token": uuid.uuid4().hex,  # the commit record's key, should the connection drop (commits.py)
        "source": source,
        "headers": json.dumps(headers, ensure_ascii=False),
        "body": body,
        "dedup_key": dedup_key,
        "jobs": jobs_json(jobs),
        "until": None,  # the hop's cut-off on the server's clock (StoreBatcher sets it)
    }
    params["item"] = batch_item(params)  # its element of a batch (intake_store ignores it)
    return params


async def encode_delivery(
    source: str, headers: Mapping[str, str], body: str, dedup_key: str | None, jobs: Sequence[NewJob]
) -> dict[str, Any]:
    """``store_params``, in a worker thread when the body is large.

    JSON-encoding a 1 MiB body (and jobs that carry it) takes about 18 ms: on the trio
    thread every other request and job would wait for it.
    """
    if len(body) <= ENCODE_IN_THREAD_CHARS:
        return store_params(source, headers, body, dedup_key, jobs)
    return await trio.to_thread.run_sync(store_params, source, headers, body, dedup_key, jobs)
