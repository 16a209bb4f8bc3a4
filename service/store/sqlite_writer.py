"""One thread hop per SQLite write transaction.

Through aiosqlite every statement is several hops between the event loop and the connection's
thread (cursor, execute, fetch, close), each a future, a queue and a wake-up: most of a group
commit's cost on the event loop, which it takes from the engine's step on a small machine. The
writer here runs a whole transaction in its own thread instead, on a plain (pysqlite) connection to
the same file, configured as the async engine's connections are (db.configure_sqlite).

The transaction's body is the same async store code every other caller awaits: it is handed a
connection whose `execute` and `scalar` return at once, so the coroutine runs to its end without
ever suspending, and `run_to_end` drives it in the writer's thread. A body that awaited anything
else would fail loudly there instead of blocking the thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")


class SQLiteWriter:
    """Runs write transactions in one thread, one at a time (SQLite has one writer anyway)."""

    def __init__(self, engine: Engine, write_options: dict[str, Any]) -> None:
        self._engine = engine
        self._write_options = write_options  # marks the connection a writer (BEGIN IMMEDIATE)
        self._thread: ThreadPoolExecutor | None = None

    async def run(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`body(connection)` in one write transaction: committed if it returns, rolled back if it raises."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._transaction, body)

    def _transaction(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        with self._engine.connect() as connection:
            connection = connection.execution_options(**self._write_options)
            with connection.begin():
                # _Immediate has the part of AsyncConnection that store code awaits.
                immediate = cast(AsyncConnection, _Immediate(connection))
                return run_to_end(cast(Coroutine[Any, Any, T], body(immediate)))

    def close(self) -> None:
        """Close the connection (in the thread that opened it, as pysqlite wants) and end the thread."""
        if self._thread is not None:
            self._thread.submit(self._engine.dispose).result()
            self._thread.shutdown(wait=True)
            self._thread = None


def run_to_end(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (see the module docstring)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("a SQLite write transaction awaited something other than its connection")


class _Immediate:
    """The part of AsyncConnection that store code awaits, over a sync connection in this thread."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.dialect = connection.dialect

    async def execute(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        return self._connection.execute(statement, parameters, **options)

    async def scalar(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        return self._connection.scalar(statement, parameters, **options)

    async def scalars(self, statement: Any, parameters: Any = None, **options: Any) -> Any:
        return self._connection.scalars(statement, parameters, **options)
