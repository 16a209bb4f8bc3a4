"""The store's contract (tests/store_contract.py) on a SQLite file, and what only SQLite's writer does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.store_contract import (
    Backend,
    ConversationContract,
    EventLogContract,
    LeaseContract,
    RecorderContract,
    TokenFactsContract,
    WriteTransactionContract,
)


class SQLite(Backend):
    writes_in_one_hop = True  # a file's write transactions run in its writer's thread (store/sqlite_writer.py)
    extend_reports_rows = False  # token chunks are extended by an executemany, which counts its rows

    @contextmanager
    def empty_database(self, tmp_path: Path) -> Iterator[str]:
        yield f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"


class TestEventLog(SQLite, EventLogContract):
    pass


class TestTokenFacts(SQLite, TokenFactsContract):
    pass


class TestLeases(SQLite, LeaseContract):
    pass


class TestRecorder(SQLite, RecorderContract):
    pass


class TestWriteTransaction(SQLite, WriteTransactionContract):
    pass


class TestConversations(SQLite, ConversationContract):
    pass
