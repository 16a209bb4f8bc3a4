"""The store's contract (tests/store_contract.py) on PostgreSQL: a fresh database per test on the server of
TEST_POSTGRES_ADMIN_DSN (tests/conftest.py); every test skips, saying why, when that server is unreachable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import _PG_SKIP_REASON, create_postgres_database, drop_postgres_database
from tests.store_contract import (
    Backend,
    ConversationContract,
    EventLogContract,
    LeaseContract,
    RecorderContract,
    TokenFactsContract,
    WriteTransactionContract,
)

pytestmark = pytest.mark.postgres


class PostgreSQL(Backend):
    writes_in_one_hop = False  # write transactions are engine.begin(): they may await anything
    extend_reports_rows = True  # one UPDATE … FROM unnest(…) RETURNING extends every remembered chunk

    @contextmanager
    def empty_database(self, tmp_path: Path) -> Iterator[str]:
        if _PG_SKIP_REASON:
            pytest.skip(_PG_SKIP_REASON)
        url, name = create_postgres_database()
        try:
            yield url
        finally:
            drop_postgres_database(name)


class TestEventLog(PostgreSQL, EventLogContract):
    pass


class TestTokenFacts(PostgreSQL, TokenFactsContract):
    pass


class TestLeases(PostgreSQL, LeaseContract):
    pass


class TestRecorder(PostgreSQL, RecorderContract):
    pass


class TestWriteTransaction(PostgreSQL, WriteTransactionContract):
    pass


class TestConversations(PostgreSQL, ConversationContract):
    pass
