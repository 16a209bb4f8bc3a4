"""The conversation operations behind HTTP: validate, run one transaction, shape the answer."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from service.conversations.protocol import (
    AddItemsRequest,
    CreateConversationRequest,
    UpdateConversationRequest,
    is_conversation_id,
    new_conversation_id,
)
from service.errors import InvalidRequest, NotFound
from service.item_references import resolve_references_in
from service.protocol.normalize import normalize_items
from service.store import conversations as conversation_store
from service.store import event_log


def _not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation_id")


class Conversations:
    def __init__(self, db: AsyncEngine) -> None:
        self.db = db

    async def create(self, request: CreateConversationRequest, *, project: str) -> dict[str, Any]:
        conversation_id = new_conversation_id()
        items = normalize_items(list(request.items or []), conversation_id, key="item", first_index=0)
        async with self.db.begin() as connection:
            await event_log.lock_for_append(connection)
            # An item_reference stands for the stored item it names (kept as a reference, it would be listed
            # as an item no schema describes); an unknown id is a 404 naming its index in `items`.
            items = await resolve_references_in(connection, items, project=project, param="items")
            return await conversation_store.create(
                connection, conversation_id, request.metadata or {}, items, project=project
            )

    async def get(self, conversation_id: str, *, project: str) -> dict[str, Any]:
        if not is_conversation_id(conversation_id):
            raise _not_found(conversation_id)
        async with self.db.connect() as connection:
            conversation = await conversation_store.get(connection, conversation_id, project=project)
        if conversation is None:
            raise _not_found(conversation_id)
        return conversation

    async def update(self, conversation_id: str, request: UpdateConversationRequest, *, project: str) -> dict[str, Any]:
        async with self.db.begin() as connection:
            await event_log.lock_for_append(connection)
            await self._require(connection, conversation_id, project=project)
            await conversation_store.update_metadata(connection, conversation_id, request.metadata)
            conversation = await conversation_store.get(connection, conversation_id, project=project)
        assert conversation is not None
        return conversation

    async def delete(self, conversation_id: str, *, project: str) -> dict[str, Any]:
        async with self.db.begin() as connection:
            await event_log.lock_for_append(connection)
            await self._require(connection, conversation_id, project=project)
            await conversation_store.delete(connection, conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_items(self, conversation_id: str, request: AddItemsRequest, *, project: str) -> dict[str, Any]:
        async with self.db.begin() as connection:
            await event_log.lock_for_append(connection)
            await self._require(connection, conversation_id, project=project)
            first = await conversation_store.next_ordinal(connection, conversation_id)
            items = normalize_items(list(request.items), conversation_id, key="item", first_index=first)
            items = await resolve_references_in(connection, items, project=project, param="items")
            entries = await conversation_store.add_items(connection, conversation_id, items, first_ordinal=first)
        data = [entry["item"] for entry in entries]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
            "has_more": False,
        }

    async def list_items(
        self, conversation_id: str, *, after: str | None, limit: int, order: Literal["asc", "desc"], project: str
    ) -> dict[str, Any]:
        """One page, chosen in SQL: `after` is found on the item-id index and the page read on the
        primary key with one row more than `limit` (which says `has_more`)."""
        async with self.db.connect() as connection:
            await self._require(connection, conversation_id, project=project)
            after_ordinal = None
            if after is not None:
                # A repeated id: the page follows its first occurrence in `order`.
                after_ordinal = await conversation_store.ordinal_of(
                    connection, conversation_id, after, last=order == "desc"
                )
                if after_ordinal is None:
                    raise InvalidRequest(f"No item with id '{after}' in this conversation.", param="after")
            rows = await conversation_store.page_entries(
                connection, conversation_id, after_ordinal=after_ordinal, limit=limit + 1, order=order
            )
        page = [item for _, item in rows[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(rows) > limit,
        }

    async def get_item(self, conversation_id: str, item_id: str, *, project: str) -> dict[str, Any]:
        async with self.db.connect() as connection:
            await self._require(connection, conversation_id, project=project)
            found = await conversation_store.find_item(connection, conversation_id, item_id)
        if found is None:
            raise NotFound(f"Item with id '{item_id}' not found in conversation '{conversation_id}'.", param="item_id")
        return found[1]

    async def delete_item(self, conversation_id: str, item_id: str, *, project: str) -> dict[str, Any]:
        async with self.db.begin() as connection:
            await event_log.lock_for_append(connection)
            await self._require(connection, conversation_id, project=project)
            found = await conversation_store.find_item(connection, conversation_id, item_id)
            if found is None:
                raise NotFound(
                    f"Item with id '{item_id}' not found in conversation '{conversation_id}'.", param="item_id"
                )
            await conversation_store.delete_item(connection, conversation_id, found[0])
            conversation = await conversation_store.get(connection, conversation_id, project=project)
        assert conversation is not None
        return conversation

    async def history(self, conversation_id: str, *, project: str) -> list[dict[str, Any]]:
        """The items a response on this conversation sees, oldest first (404 when it does not exist)."""
        async with self.db.connect() as connection:
            if not is_conversation_id(conversation_id):
                raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
            if await conversation_store.get(connection, conversation_id, project=project) is None:
                raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
            return [item for _, item in await conversation_store.list_entries(connection, conversation_id)]

    async def _require(self, connection: Any, conversation_id: str, *, project: str) -> None:
        if not is_conversation_id(conversation_id) or not await conversation_store.get(
            connection, conversation_id, project=project
        ):
            raise _not_found(conversation_id)
