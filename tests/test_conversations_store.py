"""Conversation items through the real server after deleting the last one: its ordinal is not reused, and
listing pages in both orders. The store's side (high-water mark, rebuilds, the migration's backfill, appends at
length, pages chosen in SQL) is the store contract's, on every backend (tests/store_contract.py,
ConversationContract)."""

from __future__ import annotations

from collections.abc import Callable

from tests.api_helpers import client_for
from tests.conftest import ServerProcess


def test_items_through_the_server_after_deleting_the_last_one(
    database_url: str, app_factory: Callable[..., ServerProcess]
) -> None:
    server = app_factory(database_url).start()
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
