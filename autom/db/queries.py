"""Named SQL queries, loaded once from ``queries.sql`` (the one place runtime SQL lives).

A query starts at a line ``-- name: <name>`` and runs to the next one. Its first
comment line is kept (what ``pg_stat_activity`` shows names the statement); its other
comment lines are not sent (they are for the reader: a claim's text was three times
its code, parsed by psycopg and PostgreSQL at every claim). Use ``Q.claim`` or ``Q["claim"]``.
``queries.sql`` holds the queue; ``queries_<room>.sql`` beside it hold the other
rooms' queries (intake, admin, ...); names are unique across the files.
"""

from __future__ import annotations

import re
from importlib import resources


class Queries:
    """Attribute and item access to the queries of one SQL file."""

    def __init__(self, text: str) -> None:
        self._queries: dict[str, str] = {}
        parts = re.split(r"^--\s*name:\s*([a-z0-9_]+)\s*$", text, flags=re.MULTILINE)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in self._queries:
                raise ValueError(f"query {name!r} is defined twice")
            self._queries[name] = _code(body)

    def __getattr__(self, name: str) -> str:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"no query named {name!r}") from None

    def __getitem__(self, name: str) -> str:
        return self._queries[name]

    def names(self) -> list[str]:
        """Every query name, in file order."""
        return list(self._queries)


def _code(body: str) -> str:
    """A query's text as sent: its lines without the comment lines but the first (a comment
    after code on the same line stays: ``--`` may sit in a string literal there)."""
    kept: list[str] = []
    named = False
    for line in body.strip().splitlines():
        if line.lstrip().startswith("--"):
            if named:
                continue
            named = True
        elif not line.strip():
            continue
        kept.append(line)
    return "\n".join(kept)


def load(package: str = "autom.db") -> Queries:
    """Load ``queries.sql`` and every ``queries_*.sql`` shipped in ``package``."""
    folder = resources.files(package)
    names = sorted(e.name for e in folder.iterdir() if e.name.startswith("queries") and e.name.endswith(".sql"))
    return Queries("\n".join(folder.joinpath(n).read_text(encoding="utf-8") for n in names))


Q = load()
