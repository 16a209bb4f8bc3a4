"""A task cancelled inside `engine.begin()` on SQLite (a client gone, a run supervisor stopping its heartbeat) must
not leave its connection holding the database's write lock: every later writer, in this process or another, would
wait out the busy timeout and fail ("database is locked") for as long as the process lives."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.db import create_engine, migrate


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "service.db"


@pytest.fixture
async def engine(path: Path) -> AsyncIterator[AsyncEngine]:
    """The service's engine on a migrated SQLite file at `path`."""
    url = f"sqlite+aiosqlite:///{path}"
    await migrate(url)
    engine = create_engine(url, busy_timeout=10)
    yield engine
    await engine.dispose()


def _take_write_lock(path: Path, timeout: float) -> None:
    """Raises sqlite3.OperationalError where another connection holds the write lock past `timeout`."""
    connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
    finally:
        connection.close()


async def _write_again(engine: AsyncEngine) -> None:
    async with engine.begin() as connection:
        await connection.execute(sa.text("SELECT 1"))


async def test_a_task_cancelled_while_its_begin_waits_for_the_lock_leaves_no_lock_behind(
    engine: AsyncEngine, path: Path
) -> None:
    blocker = sqlite3.connect(path, isolation_level=None)  # another writer, holding the lock
    blocker.execute("BEGIN IMMEDIATE")
    task = asyncio.create_task(_write_again(engine))
    await asyncio.sleep(0.3)  # its BEGIN IMMEDIATE waits on the lock in aiosqlite's thread
    task.cancel()
    blocker.execute("ROLLBACK")  # the BEGIN then takes the lock, for a task that is gone
    blocker.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    _take_write_lock(path, timeout=2)  # another process writes
    await _write_again(engine)  # and so does the pool's next writer


async def test_a_task_cancelled_while_its_statement_runs_leaves_no_lock_behind(engine: AsyncEngine, path: Path) -> None:
    """The statement runs on to its end in aiosqlite's thread; SQLAlchemy used to drop the connection without closing
    its cursor, and the cursor's statement kept the closed connection alive, holding the write lock."""
    slow = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000000) SELECT count(*) FROM n"

    async def write() -> None:
        async with engine.begin() as connection:  # BEGIN IMMEDIATE: the write lock
            await connection.execute(sa.text(slow))

    task = asyncio.create_task(write())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    _take_write_lock(path, timeout=2)  # `task` (its exception, its frames) still referenced here
    await _write_again(engine)


async def test_tasks_cancelled_at_any_point_of_a_write_leave_no_lock_behind(engine: AsyncEngine, path: Path) -> None:
    async def write() -> None:
        async with engine.begin() as connection:
            await connection.execute(sa.text("SELECT 1"))
            await asyncio.sleep(0.001)

    cancelled = 0
    for i in range(60):  # cancelled at points spread over connect, BEGIN, the statement and COMMIT (or after)
        task = asyncio.create_task(write())
        await asyncio.sleep(0.0001 * i)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        _take_write_lock(path, timeout=2)
    assert cancelled > 0
