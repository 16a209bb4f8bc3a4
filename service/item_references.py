"""`item_reference` input items: an item already stored in the project, named by id, stands for itself.

OpenAI resolves `{"type": "item_reference", "id": …}` against the items it keeps; here they are the items of
stored responses (inputs and outputs, `conversation_items`) and of conversations (`conversation_entries`), of the
asking project only. The resolved item joins the new response's input as it was stored (same id, same content),
so the prompt, the log and the input-items listing all see the item itself.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.errors import NotFound
from service.store.read_models import owned
from service.store.schema import conversation_entries, conversation_items, conversations, responses


async def resolve_references(
    db: AsyncEngine, items: list[dict[str, Any]], *, project: str, param: str = "input"
) -> list[dict[str, Any]]:
    """`items` with each item_reference replaced by the stored item it names; an unknown id (or one of another
    project, or of a store=false response) is a 404 naming its index in `param`."""
    if not any(item.get("type") == "item_reference" for item in items):
        return items
    async with db.connect() as connection:
        return await resolve_references_in(connection, items, project=project, param=param)


async def resolve_references_in(
    connection: AsyncConnection, items: list[dict[str, Any]], *, project: str, param: str
) -> list[dict[str, Any]]:
    """resolve_references on an open connection (inside the transaction that stores the items)."""
    wanted = {item["id"] for item in items if item.get("type") == "item_reference"}
    if not wanted:
        return items
    found = await _stored_items(connection, wanted, project=project)
    resolved: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if item.get("type") != "item_reference":
            resolved.append(item)
            continue
        stored = found.get(item["id"])
        if stored is None:
            raise NotFound(f"Item with id '{item['id']}' not found.", param=f"{param}[{index}]")
        resolved.append(stored)
    return resolved


async def _stored_items(connection: AsyncConnection, ids: set[str], *, project: str) -> dict[str, dict[str, Any]]:
    of_responses = (
        sa.select(conversation_items.c.item_id, conversation_items.c.data)
        .join(responses, responses.c.id == conversation_items.c.response_id)
        .where(conversation_items.c.item_id.in_(ids), owned(responses, project), responses.c.store == sa.true())
    )
    of_conversations = (
        sa.select(conversation_entries.c.item_id, conversation_entries.c.data)
        .join(conversations, conversations.c.id == conversation_entries.c.conversation_id)
        .where(conversation_entries.c.item_id.in_(ids), owned(conversations, project))
    )
    found: dict[str, dict[str, Any]] = {}
    for query in (of_responses, of_conversations):
        for item_id, data in await connection.execute(query):
            found.setdefault(item_id, json.loads(data))
    return found
