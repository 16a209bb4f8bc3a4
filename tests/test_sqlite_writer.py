"""write_transaction: one write transaction, committed or rolled back as `engine.begin()` would; on a
SQLite file the whole of it runs in the writer's thread (service/store/sqlite_writer.py)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import event_log
from service.store.db import create_engine, migrate, write_transaction
from service.store.schema import run_facts
from service.store.sqlite_writer import run_to_end


def test_run_to_end_returns_what_a_coroutine_that_never_suspends_returns() -> None:
    async def body() -> int:
        return 42

    assert run_to_end(body()) == 42


def test_run_to_end_refuses_a_coroutine_that_suspends() -> None:
    finished = []

    async def body() -> None:
        try:
            await asyncio.sleep(0)
        finally:
            finished.append(True)  # closed, not left suspended

    with pytest.raises(RuntimeError, match="awaited something other than its connection"):
        run_to_end(body())
    assert finished == [True]


async def _facts(db: AsyncEngine, response_id: str) -> list[tuple[str, dict[str, Any]]]:
    async with db.connect() as connection:
        return [(f.kind, f.data) for f in await event_log.read_facts(connection, response_id)]


async def test_a_transaction_commits_what_it_wrote_and_returns_its_result(db: AsyncEngine) -> None:
    threads: list[str] = []

    async def body(connection: Any) -> int:
        threads.append(threading.current_thread().name)
        await event_log.lock_for_append(connection)
        await event_log.append_fact(connection, "resp_a", "request", {"n": 1})
        await event_log.append_facts(connection, [("resp_a", "tokens", {"ids": [1, 2]})])
        return int(await connection.scalar(sa.select(sa.func.count()).select_from(run_facts)))

    assert await write_transaction(db, body) == 2
    assert await _facts(db, "resp_a") == [("request", {"n": 1}), ("tokens", {"ids": [1, 2]})]
    if db.dialect.name == "sqlite":
        assert threads[0].startswith("sqlite-writer")  # one hop: the whole body ran there
    else:
        assert not threads[0].startswith("sqlite-writer")


async def test_a_transaction_that_raises_leaves_nothing(db: AsyncEngine) -> None:
    async def body(connection: Any) -> None:
        await event_log.append_fact(connection, "resp_b", "request", {"n": 1})
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await write_transaction(db, body)
    assert await _facts(db, "resp_b") == []


async def test_a_body_that_awaits_anything_else_fails_and_writes_nothing_on_sqlite(db: AsyncEngine) -> None:
    async def body(connection: Any) -> None:
        await event_log.append_fact(connection, "resp_c", "request", {"n": 1})
        await asyncio.sleep(0)

    if db.dialect.name != "sqlite":
        await write_transaction(db, body)  # an ordinary transaction: it may await anything
        assert await _facts(db, "resp_c") == [("request", {"n": 1})]
        return
    with pytest.raises(RuntimeError):
        await write_transaction(db, body)
    assert await _facts(db, "resp_c") == []


async def test_the_writer_and_the_async_engine_take_turns_at_the_write_lock(db: AsyncEngine) -> None:
    """Writes from both paths at once (a group commit beside a POST's create) all land, in some order."""

    async def through_writer(i: int) -> None:
        async def body(connection: Any) -> None:
            await event_log.append_fact(connection, f"resp_w{i}", "request", {"i": i})

        await write_transaction(db, body)

    async def through_begin(i: int) -> None:
        async with db.begin() as connection:
            await event_log.append_fact(connection, f"resp_b{i}", "request", {"i": i})

    await asyncio.gather(*(f(i) for i in range(10) for f in (through_writer, through_begin)))
    async with db.connect() as connection:
        count = await connection.scalar(sa.select(sa.func.count()).select_from(run_facts))
    assert count == 20


async def test_an_in_memory_sqlite_database_writes_through_its_own_connection() -> None:
    """`sqlite+aiosqlite://` is one database per connection: no writer (it would see another one)."""
    engine = create_engine("sqlite+aiosqlite://")
    try:
        assert getattr(engine, "writer", None) is None
    finally:
        await engine.dispose()


async def test_dispose_ends_the_writer_thread(tmp_path: Any) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'w.db'}"
    await migrate(url)
    engine = create_engine(url)

    async def body(connection: Any) -> None:
        await connection.execute(
            sa.insert(run_facts).values(response_id="resp_d", kind="request", data="{}", created_at=datetime.now(UTC))
        )

    before = set(threading.enumerate())
    await write_transaction(engine, body)
    started = [t for t in threading.enumerate() if t not in before and t.name.startswith("sqlite-writer")]
    assert len(started) == 1
    await engine.dispose()
    assert not started[0].is_alive()
