"""Database access for autom: the psycopg bridge for trio, the named queries and the migrations.

Import the bridge from here: ``from autom.db import open_database, Database, Tx, Row``.
"""

from autom.db.bridge import Database, Row, Tx, open_database

__all__ = ["Database", "Row", "Tx", "open_database"]
