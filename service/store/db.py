"""Async engine factory and migrations. SQLite runs in WAL mode with a busy timeout;
PostgreSQL goes through asyncpg.

Convention, relied on by SQLite: `engine.begin()` is a write transaction and `engine.connect()`
only reads. On SQLite a write transaction takes the write lock at BEGIN (IMMEDIATE: read-then-write
never deadlocks on the upgrade), while a read is DEFERRED and, in WAL mode, never waits for writers.

The migration scripts live in the repository's `migrations/` (where `alembic.ini` points) and are
shipped inside the package as `service.migrations` (see setup.py), which is where this module
finds them, so an installed wheel migrates as well as a checkout does."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, event, exc
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import Connection, ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.store.faults import backoff_seconds, is_transient
from service.store.sqlite_writer import SQLiteWriter

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 10


class DatabaseUnavailable(RuntimeError):
    """The database cannot be opened: a bad URL, an unreachable server, a database that does not
    exist, a file that cannot be created. The message is one line meant for the person running it.
    `transient`: the same attempt can succeed later (a server restarting, a connection cut), as
    opposed to a problem that only the person can fix (no such database, a wrong password)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class MigrationResult:
    database: str  # the URL with its password hidden
    before: str | None  # the revision found (None: an empty database)
    after: str | None

    def describe(self) -> str:
        if self.before == self.after:
            return f"{self.database}: already at revision {self.after} (head); nothing to do"
        return f"{self.database}: migrated from revision {self.before or '(empty database)'} to {self.after} (head)"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, busy_timeout: float = 30.0) -> AsyncEngine:
    """`busy_timeout`: how long a SQLite statement waits for a lock before it fails with
    "database is locked" (a transient fault its caller may retry)."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": busy_timeout})
        configure_sqlite(engine.sync_engine, busy_timeout)
        sqlite_engine = _SQLiteEngine(engine.sync_engine)
        parsed = make_url(url)
        if parsed.database and parsed.database != ":memory:":  # a memory database is one per connection
            writer_engine = sa_create_engine(
                parsed.set(drivername="sqlite+pysqlite"), connect_args={"timeout": busy_timeout}
            )
            configure_sqlite(writer_engine, busy_timeout)
            sqlite_engine.writer = SQLiteWriter(writer_engine, {_WRITE_OPTION: True})
        return sqlite_engine
    # pre-ping: a connection the server (or a network cut) closed is replaced before use;
    # recycle: none lives long enough to meet an idle timeout on the way.
    return create_async_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True, pool_recycle=1800)


_WRITE_OPTION = "service_sqlite_write"
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024


def configure_sqlite(engine: Engine, busy_timeout: float) -> None:
    """Pragmas and transaction handling of every SQLite connection the service opens (see the module
    docstring); for the async engine's sync core and for the writer's engine alike."""

    @event.listens_for(engine, "connect")
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

    @event.listens_for(engine, "begin")
    def _sqlite_begin(connection: Any) -> None:
        # Writers take the write lock at BEGIN: read-then-write transactions never deadlock on
        # the upgrade. Readers begin DEFERRED and read their WAL snapshot without any lock.
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")

    @event.listens_for(engine, "handle_error")
    def _sqlite_keep_connection_on_cancel(context: ExceptionContext) -> None:
        # A task cancelled while its statement runs (a client gone, the supervisor stopping its heartbeat) is an exit
        # exception, on which SQLAlchemy drops the connection without closing its cursor. The statement runs on to
        # its end in aiosqlite's thread all the same, and its unfinished cursor keeps the closed connection alive
        # (sqlite3_close_v2) with its transaction, and so the write lock, for as long as anything references the
        # exception: every later writer waits out busy_timeout and fails. Keep the connection instead, so its
        # cursor is closed and the transaction rolled back as after any other error.
        if not isinstance(context.original_exception, Exception):
            context.is_disconnect = False

    # pysqlite's own transaction handling must be off for the explicit BEGIN above.
    @event.listens_for(engine, "connect", insert=True)
    def _sqlite_autocommit_off(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None


async def write_transaction(engine: AsyncEngine, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """`body(connection)` in one write transaction, as `async with engine.begin()` would run it; on a
    SQLite file the whole transaction is one hop to the writer's thread (service/store/sqlite_writer.py),
    so `body` may await only the connection's execute/scalar/scalars."""
    writer = getattr(engine, "writer", None)
    if writer is not None:
        return cast(T, await writer.run(body))
    async with engine.begin() as connection:
        return await body(connection)


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
    """`begin()` marks its connection as a writer (see the module docstring); `writer`, on a file, runs
    write_transaction's bodies in one thread hop each."""

    writer: SQLiteWriter | None = None

    async def dispose(self, close: bool = True) -> None:
        await super().dispose(close)
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close)

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


def describe_url(url: str) -> str:
    """The URL as it is safe to print (password hidden)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except exc.ArgumentError:
        return repr(url)


def migrations_dir() -> Path:
    """The Alembic script directory shipped in the package (the repository's `migrations/`)."""
    path = Path(str(resources.files("service.migrations")))
    if not (path / "env.py").is_file():
        raise RuntimeError(f"the migration scripts are missing from the installed package ({path})")
    return path


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _unavailable(url: str, error: BaseException) -> DatabaseUnavailable:
    reason = error.orig if isinstance(error, exc.DBAPIError) and error.orig is not None else error
    text = " ".join(str(reason).split()) or type(reason).__name__
    hint = ""
    database = make_url(url).database
    if not is_sqlite(url) and f'database "{database}" does not exist' in text:
        hint = f" (create it first: createdb {database})"
    elif is_sqlite(url) and "unable to open" in text:
        hint = " (does the directory exist and is it writable?)"
    # SQLite's "unable to open" is worth a writer's retry mid-run, not a wait at start-up: there it
    # means a missing directory or a read-only file.
    transient = is_transient(error) and not (is_sqlite(url) and ("unable to open" in text or "readonly" in text))
    return DatabaseUnavailable(f"cannot open the database {describe_url(url)}: {text}{hint}", transient=transient)


async def current_revision(url: str) -> str | None:
    """The Alembic revision the database is at (None: not migrated yet); DatabaseUnavailable if unreachable."""
    try:
        parsed = make_url(url)
        args = {"timeout": CONNECT_TIMEOUT_SECONDS} if parsed.get_backend_name() == "postgresql" else {}
        engine = create_async_engine(parsed, connect_args=args)
    except (exc.ArgumentError, exc.InvalidRequestError, ImportError) as error:
        raise DatabaseUnavailable(f"SERVICE_DATABASE_URL={describe_url(url)} is not usable: {error}") from error
    threads_before = set(threading.enumerate())
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_revision_of)
    except (TimeoutError, exc.DBAPIError, OSError) as error:
        await _let_failed_sqlite_workers_exit(threads_before)
        raise _unavailable(url, error) from error
    finally:
        await engine.dispose()


async def _let_failed_sqlite_workers_exit(threads_before: set[threading.Thread]) -> None:
    """aiosqlite (0.22) stops the worker of a connection that failed to open without waiting for it;
    if the caller's loop closes first, the worker dies printing a traceback ("Event loop is closed")
    after our one-line error. Join the workers this attempt started while the loop still runs."""
    workers = [
        thread
        for thread in threading.enumerate()
        if thread not in threads_before and "_connection_worker_thread" in thread.name
    ]
    for worker in workers:
        await asyncio.to_thread(worker.join, 2.0)


def _revision_of(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def revision_of(connection: Connection) -> str | None:
    """The revision a connected database is at (for `connection.run_sync`; readiness checks)."""
    return _revision_of(connection)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def migrate_sync(url: str) -> MigrationResult:
    """Upgrade to the head revision; says where the database was and where it is now."""
    before = asyncio.run(current_revision(url))
    if before != head_revision():
        try:
            command.upgrade(alembic_config(url), "head")  # one transaction: a cut rolls it back
        except (exc.DBAPIError, OSError) as error:
            if not is_transient(error):
                raise
            raise _unavailable(url, error) from error
    after = asyncio.run(current_revision(url))
    database = make_url(url).database
    if is_sqlite(url) and database and database != ":memory:":
        # WAL is a property of the file: set it once here, before any service connection opens.
        with contextlib.closing(sqlite3.connect(database, timeout=30)) as connection:
            _switch_to_wal(connection.cursor())
    return MigrationResult(describe_url(url), before, after)


def migrate_when_reachable(
    url: str, patience_seconds: float, on_wait: Callable[[DatabaseUnavailable, float], None]
) -> MigrationResult:
    """`migrate_sync`, waiting out a database that cannot be reached yet (its server restarting, a
    network cut) for up to `patience_seconds`, as a server starting beside its database must;
    a problem that waiting cannot fix (no such database, a wrong password, a bad URL) fails at once.
    `on_wait(error, delay)` is told before each wait."""
    deadline = time.monotonic() + patience_seconds
    attempt = 0
    while True:
        try:
            return migrate_sync(url)
        except DatabaseUnavailable as error:
            # The last wait is cut to the deadline and one more try made there, so the whole patience is
            # used (giving up when the next full back-off would overshoot ended a 1.5 s wait at 0.85 s).
            remaining = deadline - time.monotonic()
            if not error.transient or remaining <= 0:
                raise
            delay = min(backoff_seconds(attempt, first=0.2, cap=2.0), remaining)
            on_wait(error, delay)
            time.sleep(delay)
            attempt += 1


async def migrate(url: str) -> MigrationResult:
    # Alembic's env.py runs its own event loop; give it a thread.
    return await asyncio.to_thread(migrate_sync, url)
