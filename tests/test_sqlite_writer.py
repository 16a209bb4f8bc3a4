"""The SQLite writer (service/store/sqlite_writer.py): `run_to_end` and the writer thread of a file's engine.
What `write_transaction` promises on every backend (commit, rollback, the one hop on a SQLite file) is the store
contract's (tests/store_contract.py, WriteTransactionContract)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

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
