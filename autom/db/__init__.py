"""Database access for autom: one road to PostgreSQL on trio, the named queries and the migrations.

Import it from here: ``from autom.db import open_database, Database, Tx, Row``.
"""

from autom.db.bridge import Database, Row, Tx, open_database

__all__ = ["Database", "Row", "Tx", "open_database"]
