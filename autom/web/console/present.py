"""What the console's templates show, computed in Python (pure; time passed in).

Templates only place values: the chart's bars, capped totals and pretty JSON are
made here, so they are tested without a browser. Nothing here escapes HTML: the
templates do, always (Jinja autoescape), and nothing is marked safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from autom.ops import JOB_STATUSES, Capped, about

#: the longest text a page shows in one block (a payload, a body); the rest is cut, and the page says so
MAX_SHOWN = 200_000


@dataclass(frozen=True)
class Bar:
    """One bar of the throughput chart (SVG user units)."""

    x: float
    y: float
    width: float
    height: float
    status: str  # done | failed: the CSS class
    title: str


@dataclass(frozen=True)
class Chart:
    """Done and failed jobs per minute over the last hour, as SVG bars."""

    bars: list[Bar]
    peak: int
    width: int
    height: int
    done: int
    failed: int


def throughput_chart(rows: Iterable[Mapping[str, Any]], now: datetime, minutes: int = 60,
                     width: int = 600, height: int = 120) -> Chart:
    """Bars for ``rows`` (minute, status, n) over the ``minutes`` minutes up to ``now``.

    Each minute has a slot; done and failed stand side by side in it, scaled to the
    busiest minute, with at least one unit of height so a lone failure is visible.
    """
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    counts: dict[tuple[int, str], int] = {}
    for row in rows:
        slot = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= slot < minutes and row["status"] in ("done", "failed"):
            counts[(slot, row["status"])] = counts.get((slot, row["status"]), 0) + int(row["n"])
    peak = max(counts.values(), default=0)
    slot_width = width / minutes
    bars = []
    for (slot, status), n in sorted(counts.items()):
        h = max(1.0, height * n / peak) if peak else 0.0
        offset = 0.0 if status == "done" else slot_width / 2
        minute = start + timedelta(minutes=slot)
        bars.append(Bar(x=round(slot * slot_width + offset, 2), y=round(height - h, 2),
                        width=round(slot_width / 2 - 0.5, 2), height=round(h, 2), status=status,
                        title=f"{minute:%H:%M} UTC: {n} {status}"))
    done = sum(n for (_, s), n in counts.items() if s == "done")
    return Chart(bars=bars, peak=peak, width=width, height=height, done=done, failed=sum(counts.values()) - done)


@dataclass(frozen=True)
class CountTable:
    """Jobs by kind and status with capped counts, and a total per status."""

    kinds: list[tuple[str, list[str]]]  # kind, its counts in JOB_STATUSES order (shown text)
    totals: list[str]


def count_table(counts: Mapping[str, Mapping[str, Capped]]) -> CountTable:
    """The overview's table: a count past its cap shows the planner's estimate ("about 45,000"), or
    "1,000+" without one; a total holding an estimate says "about", one holding a "1,000+" says "+"."""
    kinds = []
    sums = dict.fromkeys(JOB_STATUSES, 0)
    plus = dict.fromkeys(JOB_STATUSES, False)
    estimated = dict.fromkeys(JOB_STATUSES, False)
    for kind in sorted(counts):
        row = []
        for status in JOB_STATUSES:
            cell = counts[kind].get(status)
            row.append(str(cell) if cell is not None else "0")
            if cell is not None:
                sums[status] += cell.value
                plus[status] |= cell.capped and not cell.estimated
                estimated[status] |= cell.estimated
        kinds.append((kind, row))
    totals = [f"{sums[s]:,}+" if plus[s] else f"about {about(sums[s]):,}" if estimated[s] else f"{sums[s]:,}"
              for s in JOB_STATUSES]
    return CountTable(kinds=kinds, totals=totals)


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON, cut at ``MAX_SHOWN`` characters."""
    return cut(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str))


def body_as_json(body: str) -> str | None:
    """An event body re-indented when it is JSON; None when it is not."""
    try:
        return pretty_json(json.loads(body))
    except ValueError:
        return None


def cut(text: str) -> str:
    """``text``, or its first ``MAX_SHOWN`` characters and a note of how much is left out."""
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:MAX_SHOWN]}\n… ({len(text) - MAX_SHOWN:,} more characters not shown)"


def age(seconds: float) -> str:
    """A duration for people: 42 s, 3 min, 5 h 10 min, 2 d 3 h."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def when(value: str | datetime | None) -> str:
    """An ISO time as ``2026-12-01 09:30:05`` in UTC, or a dash."""
    if value is None or value == "":
        return "—"
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")
