"""Async engine factory and migrations. SQLite runs in WAL mode with a busy timeout;
PostgreSQL goes through asyncpg.

Convention, relied on by SQLite: `engine.begin()` is a write transaction and `engine.connect()`
only reads. On SQLite a write transaction takes the write lock at BEGIN (IMMEDIATE: read-then-write
never deadlocks on the upgrade), while a read is DEFERRED and, in WAL mode, never waits for writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

ROOT = Path(__file__).resolve().parents[2]


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, busy_timeout: float = 30.0) -> AsyncEngine:
    """`busy_timeout`: how long a SQLite statement waits for a lock before it fails with
    "database is locked" (a transient fault its caller may retry)."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": busy_timeout})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            # Switching to WAL needs a lock; asking while another connection writes fails at once,
            # so switch only when the file is not in WAL mode yet (WAL persists in the file).
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":
                _switch_to_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            # A checkpoint truncates the WAL file back to this size (it never shrinks otherwise).
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _sqlite_begin(connection: Any) -> None:
            # Writers take the write lock at BEGIN: read-then-write transactions never deadlock on
            # the upgrade. Readers begin DEFERRED and read their WAL snapshot without any lock.
            write = connection.get_execution_options().get(_WRITE_OPTION, False)
            connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")

        # pysqlite's own transaction handling must be off for the explicit BEGIN above.
        @event.listens_for(engine.sync_engine, "connect", insert=True)
        def _sqlite_autocommit_off(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None

        return _SQLiteEngine(engine.sync_engine)
    # pre-ping: a connection the server (or a network cut) closed is replaced before use;
    # recycle: none lives long enough to meet an idle timeout on the way.
    return create_async_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True, pool_recycle=1800)


_WRITE_OPTION = "service_sqlite_write"
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024


async def checkpoint_when_idle(engine: AsyncEngine) -> None:
    """SQLite: copy the WAL into the database file and truncate it. SQLite's own automatic
    checkpoints (every 1,000 pages) cannot finish while readers hold old snapshots under
    constant load; the supervisor calls this when no run is active. No-op on PostgreSQL."""
    if engine.dialect.name != "sqlite":
        return
    async with engine.connect() as connection:
        # Outside any transaction: an open read transaction would pin the WAL.
        raw = await connection.get_raw_connection()
        driver: Any = raw.driver_connection  # aiosqlite's connection
        await driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class _SQLiteEngine(AsyncEngine):
    """`begin()` marks its connection as a writer (see the module docstring)."""

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        async with self.connect() as connection:
            await connection.execution_options(**{_WRITE_OPTION: True})
            async with connection.begin():
                yield connection


def _switch_to_wal(cursor: Any) -> None:
    # The switch takes an exclusive lock and does not wait on the busy timeout: retry briefly.
    for attempt in range(50):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.05)


def alembic_config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def migrate_sync(url: str) -> None:
    command.upgrade(alembic_config(url), "head")
    database = make_url(url).database
    if is_sqlite(url) and database and database != ":memory:":
        # WAL is a property of the file: set it once here, before any service connection opens.
        with contextlib.closing(sqlite3.connect(database, timeout=30)) as connection:
            _switch_to_wal(connection.cursor())


async def migrate(url: str) -> None:
    # Alembic's env.py runs its own event loop; give it a thread.
    await asyncio.to_thread(migrate_sync, url)
