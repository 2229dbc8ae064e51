"""Test support: the PostgreSQL server for tests, stubs at the network edge, factories."""
