"""Conversations at length, on SQLite and PostgreSQL: an append reads the row's high-water mark (never a
fold of the whole log), a deleted last item's ordinal is not reused (rebuilds and the migration's backfill
agree), and a page of items is chosen in SQL. One end-to-end check through the real server."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.conversations.protocol import AddItemsRequest, CreateConversationRequest
from service.conversations.service import Conversations
from service.errors import InvalidRequest
from service.store import conversations as store
from service.store.doctor import check_database
from service.store.rebuild import rebuild_projections
from service.store.schema import conversations
from tests.api_helpers import client_for
from tests.conftest import ServerProcess

PROJECT = "default"


def _messages(first: int, count: int) -> AddItemsRequest:
    items = [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(first, first + count)]
    return AddItemsRequest.model_validate({"items": items})


async def _create(service: Conversations, count: int = 0) -> str:
    items = [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]
    created = await service.create(CreateConversationRequest.model_validate({"items": items}), project=PROJECT)
    return str(created["id"])


async def _row(db: AsyncEngine, conversation_id: str) -> tuple[Any, ...]:
    async with db.connect() as connection:
        row = (await connection.execute(sa.select(conversations).where(conversations.c.id == conversation_id))).one()
    return tuple(row)


async def _next_ordinal(db: AsyncEngine, conversation_id: str) -> int:
    async with db.connect() as connection:
        return await store.next_ordinal(connection, conversation_id)


async def test_a_deleted_last_items_ordinal_is_not_reused_and_rebuilds_keep_the_high_water_mark(
    db: AsyncEngine, database_url: str
) -> None:
    service = Conversations(db)
    conversation_id = await _create(service, 3)
    ids = [
        item["id"]
        for item in (await service.list_items(conversation_id, after=None, limit=100, order="asc", project=PROJECT))[
            "data"
        ]
    ]
    await service.delete_item(conversation_id, ids[-1], project=PROJECT)
    assert await _next_ordinal(db, conversation_id) == 3  # the deleted item keeps its ordinal

    added = await service.add_items(conversation_id, _messages(3, 2), project=PROJECT)
    new_ids = [item["id"] for item in added["data"]]
    assert ids[-1] not in new_ids  # ids derive from ordinals: a reused ordinal would repeat an id
    async with db.connect() as connection:
        ordinals = [ordinal for ordinal, _ in await store.list_entries(connection, conversation_id)]
    assert ordinals == [0, 1, 3, 4] and await _next_ordinal(db, conversation_id) == 5

    # Delete the last again: the mark stays, a rebuild refolds it from the log, the doctor agrees.
    await service.delete_item(conversation_id, new_ids[-1], project=PROJECT)
    empty = await _create(service)
    before = {cid: await _row(db, cid) for cid in (conversation_id, empty)}
    assert before[conversation_id][-1] == 5 and before[empty][-1] == 0
    await rebuild_projections(database_url)
    assert {cid: await _row(db, cid) for cid in (conversation_id, empty)} == before
    report = await check_database(database_url)
    assert not report.problems and report.conversations == 2
    added = await service.add_items(conversation_id, _messages(5, 1), project=PROJECT)
    async with db.connect() as connection:
        assert await store.ordinal_of(connection, conversation_id, added["data"][0]["id"]) == 5


async def test_the_migration_backfills_the_high_water_mark_from_the_log(db: AsyncEngine, database_url: str) -> None:
    """Rows written before revision 0006 get `next_ordinal` from their logs, deleted last items included."""
    from alembic import command

    from service.store.db import alembic_config, migrate_sync

    service = Conversations(db)
    trimmed = await _create(service, 2)
    await service.add_items(trimmed, _messages(2, 3), project=PROJECT)
    last = (await service.list_items(trimmed, after=None, limit=1, order="desc", project=PROJECT))["data"][0]
    await service.delete_item(trimmed, last["id"], project=PROJECT)
    untouched, empty = await _create(service, 4), await _create(service)
    expected = {trimmed: 5, untouched: 4, empty: 0}
    await db.dispose()

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0005")
    await asyncio.to_thread(migrate_sync, database_url)
    assert {cid: await _next_ordinal(db, cid) for cid in expected} == expected
    assert not (await check_database(database_url)).problems


async def _timed_append(service: Conversations, conversation_id: str, first: int) -> float:
    start = time.perf_counter()
    await service.add_items(conversation_id, _messages(first, 20), project=PROJECT)
    return time.perf_counter() - start


async def test_an_append_costs_the_same_at_10000_items_as_at_the_first(db: AsyncEngine) -> None:
    """10,000 items, 20 per append: the median of the last appends is within 2x the first ones' (plus 5 ms
    for a busy machine). Folding the log on each append made the last ones ~40x slower."""
    service = Conversations(db)
    conversation_id = await _create(service)
    appends, sample = 500, 9
    await _timed_append(service, conversation_id, 0)  # warm-up: connections, statement caches
    times = [await _timed_append(service, conversation_id, 20 * n) for n in range(1, appends)]
    first, last = statistics.median(times[:sample]), statistics.median(times[-sample:])
    assert await _next_ordinal(db, conversation_id) == 20 * appends
    assert last <= 2 * first + 0.005, f"append at 100 items: {first * 1000:.1f} ms, at 10,000: {last * 1000:.1f} ms"


@contextmanager
def _item_reads(db: AsyncEngine) -> Iterator[list[str]]:
    """The SQL of every statement that reads items' JSON (`conversation_entries.data`)."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "conversation_entries.data" in statement:
            statements.append(statement)

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)


async def test_listing_pages_in_sql_with_limit_after_and_order(db: AsyncEngine) -> None:
    service = Conversations(db)
    conversation_id = await _create(service, 20)
    await service.add_items(conversation_id, _messages(20, 20), project=PROJECT)
    await service.add_items(conversation_id, _messages(40, 5), project=PROJECT)
    every = [
        item["id"]
        for item in (await service.list_items(conversation_id, after=None, limit=100, order="asc", project=PROJECT))[
            "data"
        ]
    ]
    await service.delete_item(conversation_id, every.pop(7), project=PROJECT)  # a gap in the ordinals
    assert len(every) == 44

    async def walk(order: Any, limit: int) -> list[list[str]]:
        pages, after = [], None
        while True:
            page = await service.list_items(conversation_id, after=after, limit=limit, order=order, project=PROJECT)
            ids = [item["id"] for item in page["data"]]
            assert (page["first_id"], page["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))
            pages.append(ids)
            if not page["has_more"]:
                return pages
            after = page["last_id"]

    with _item_reads(db) as reads:
        ascending = await walk("asc", 10)
        descending = await walk("desc", 7)
    assert ascending == [every[n : n + 10] for n in range(0, 44, 10)]
    reversed_ids = every[::-1]
    assert descending == [reversed_ids[n : n + 7] for n in range(0, 44, 7)]
    assert len(reads) == len(ascending) + len(descending)
    assert all("LIMIT" in statement.upper() for statement in reads), reads

    with _item_reads(db) as reads:
        page = await service.list_items(conversation_id, after=every[40], limit=20, order="asc", project=PROJECT)
        assert [item["id"] for item in page["data"]] == every[41:] and not page["has_more"]
        page = await service.list_items(conversation_id, after=every[0], limit=20, order="desc", project=PROJECT)
        assert page["data"] == [] and not page["has_more"] and page["first_id"] is None
        assert (await service.get_item(conversation_id, every[3], project=PROJECT))["id"] == every[3]
    assert len(reads) == 3 and all("LIMIT" in statement.upper() for statement in reads)
    with pytest.raises(InvalidRequest) as unknown:
        await service.list_items(conversation_id, after="msg_missing", limit=20, order="asc", project=PROJECT)
    assert unknown.value.param == "after"


def test_items_through_the_server_after_deleting_the_last_one(
    database_url: str, server_factory: Callable[..., ServerProcess]
) -> None:
    server = server_factory(database_url).start()
    client = client_for(server.url)
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": "one"}])
    added = client.conversations.items.create(
        conversation.id, items=[{"type": "message", "role": "user", "content": n} for n in ("two", "three")]
    )
    first = [str(item.id) for item in client.conversations.items.list(conversation.id, order="asc").data]
    assert first[1:] == [item.id for item in added.data] and len(first) == 3
    client.conversations.items.delete(first[-1], conversation_id=conversation.id)
    again = client.conversations.items.create(
        conversation.id, items=[{"type": "message", "role": "user", "content": "3"}]
    )
    assert again.data[0].id not in first
    expected = first[:2] + [str(again.data[0].id)]
    assert [item.id for item in client.conversations.items.list(conversation.id, order="asc", limit=1)] == expected
    page = client.conversations.items.list(conversation.id, limit=2)  # default order: desc
    assert [item.id for item in page.data] == expected[::-1][:2] and page.has_more
    rest = client.conversations.items.list(conversation.id, limit=2, after=str(page.data[-1].id))
    assert [item.id for item in rest.data] == expected[:1] and not rest.has_more
    retrieved = client.conversations.items.retrieve(expected[-1], conversation_id=conversation.id)
    assert retrieved.id == expected[-1]
