"""Numbered, forward-only SQL migrations; shipped in the wheel as ``autom.migrations``."""
