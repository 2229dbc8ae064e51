"""The PostgreSQL server the tests talk to: ``autom.db.scratch`` (shipped, so users' tests
made with ``autom.testing`` get the same throwaway databases)."""

from autom.db.scratch import (
    PgServer,
    dbname_of,
    start_pg_server,
    temporary_database,
    unique_db_name,
    with_lock_timeout,
)

__all__ = ["PgServer", "dbname_of", "start_pg_server", "temporary_database", "unique_db_name",
           "with_lock_timeout"]
