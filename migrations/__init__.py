"""Alembic migrations; shipped in the package as `service.migrations` (see setup.py)."""
