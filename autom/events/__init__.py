"""The event store: webhook deliveries stored with group commit, fetched and replayed.

``StoreBatcher`` (batcher.py) stores each delivery by its deadline, batched with those
that arrive meanwhile, and may hand a lone delivery's job to this process's workers
(``HandOff``, handoff.py); a hop cut off is settled by its commit record (commits.py).
``store_params`` / ``encode_delivery`` (encode.py) build a delivery; ``fetch_event`` and
``replay_event`` (replay.py) serve the operator. How and why: docs/design/intake.md.
"""

from autom.events.batcher import (
    BATCH_HOP_SECONDS,
    CANCEL_SECONDS,
    FATE_SECONDS,
    GATHER_SECONDS,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MIN_HOP_SECONDS,
    Gone,
    Left,
    SenderGone,
    StoreBatcher,
    Stored,
)
from autom.events.encode import ENCODE_IN_THREAD_CHARS, batch_item, batch_items, encode_delivery, store_params
from autom.events.handoff import HandOff
from autom.events.replay import JobDefaults, fetch_event, replay_event

__all__ = [
    "BATCH_HOP_SECONDS",
    "CANCEL_SECONDS",
    "ENCODE_IN_THREAD_CHARS",
    "FATE_SECONDS",
    "GATHER_SECONDS",
    "MAX_BATCH",
    "MAX_BATCH_BYTES",
    "MIN_HOP_SECONDS",
    "Gone",
    "HandOff",
    "JobDefaults",
    "Left",
    "SenderGone",
    "StoreBatcher",
    "Stored",
    "batch_item",
    "batch_items",
    "encode_delivery",
    "fetch_event",
    "replay_event",
    "store_params",
]
