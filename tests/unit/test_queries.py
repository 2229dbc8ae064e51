"""The named queries as they are sent: the heading comment kept, the reader's comments not."""

from __future__ import annotations

import pytest

from autom.db.queries import Q, Queries

TEXT = """\
-- name: first
-- Say what it does (pg_stat_activity shows this line).
-- Why it is written so: a paragraph for the reader,
--   over several lines.
select 1
  -- a comment between lines of code
  , '--' as dashes  -- a comment after code stays (it may be inside a string)

-- name: second
select 2
"""


def test_the_first_comment_line_is_kept_and_the_others_are_not() -> None:
    q = Queries(TEXT)
    assert q.first == ("-- Say what it does (pg_stat_activity shows this line).\n"
                       "select 1\n"
                       "  , '--' as dashes  -- a comment after code stays (it may be inside a string)")
    assert q["second"] == "select 2"
    assert q.names() == ["first", "second"]


def test_a_name_defined_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        Queries("-- name: a\nselect 1\n-- name: a\nselect 2\n")


def test_the_claim_is_short_enough_for_psycopgs_query_cache() -> None:
    # psycopg converts a query of more than 4096 bytes anew at every execution; the batch claim
    # runs unprepared, so its text is parsed at every claim (by psycopg and by PostgreSQL)
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    assert len(Q.claim.encode()) <= MAX_CACHED_STATEMENT_LENGTH
    assert Q.claim.startswith("-- Claim up to")
