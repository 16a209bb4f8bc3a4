"""Which database errors are worth waiting out.

A *transient* fault (connection cut, server restarting, `database is locked`, serialization
failure, disk full) says nothing about the data: the same write succeeds once the store is
back, so writers retry it. Anything else (a value the database refuses, a constraint, a bug)
fails again on every retry: the write that caused it must be isolated instead.
"""

from __future__ import annotations

import asyncio
import sqlite3

from sqlalchemy import exc as sa_exc

# PostgreSQL SQLSTATE classes that describe the server or the connection, not the statement.
_TRANSIENT_SQLSTATE_CLASSES = {"08", "40", "53", "55", "57", "58", "XX"}
_SQLITE_TRANSIENT_WORDS = ("locked", "busy", "full", "disk i/o", "unable to open", "readonly")


def is_transient(error: BaseException) -> bool:
    """True when retrying the same statement later can succeed."""
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated or isinstance(error, sa_exc.InterfaceError | sa_exc.DisconnectionError):
            return True
        orig = error.orig
        sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate:
            return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES
        if isinstance(orig, sqlite3.OperationalError) or isinstance(error, sa_exc.OperationalError):
            text = str(orig).lower()
            return any(word in text for word in _SQLITE_TRANSIENT_WORDS) or not isinstance(orig, sqlite3.Error)
        return is_transient(orig) if isinstance(orig, BaseException) and orig is not error else False
    if isinstance(error, sa_exc.TimeoutError | sa_exc.DisconnectionError | sa_exc.ResourceClosedError):
        return True
    if isinstance(error, OSError | ConnectionError | TimeoutError | asyncio.TimeoutError):
        return True
    try:
        import asyncpg
    except ImportError:  # pragma: no cover - asyncpg is a dependency
        return False
    if isinstance(error, asyncpg.PostgresConnectionError | asyncpg.InterfaceError):
        return True
    if isinstance(error, asyncpg.PostgresError):
        sqlstate = getattr(error, "sqlstate", "") or ""
        return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES
    return False


def backoff_seconds(attempt: int, *, first: float = 0.05, cap: float = 1.0) -> float:
    """Exponential backoff without jitter: writers of one process retry in order anyway."""
    return float(min(cap, first * (2**attempt)))
