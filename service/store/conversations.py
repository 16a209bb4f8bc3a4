"""Conversation transactions and reads: the store side of service/conversations/. Each write appends the
conversation's next event and updates its projection rows (`conversations`, `conversation_entries`) in the
same transaction, under the log's append lock, so writes to one conversation are serialised in commit order.
Beside the responses' tables (read_models.py): the recorder appends a response's items to its conversation
in the terminal transaction, and rebuild, doctor and retention fold or delete conversations with the rest."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.protocol import item_role, item_text
from service.protocol.items import sql_text
from service.store import event_log
from service.store.conversation_fold import ConversationState, Entry, entries_for
from service.store.event_log import encode
from service.store.read_models import list_items, owned
from service.store.schema import conversation_entries, conversations, run_facts

CONVERSATION_PREFIX = "conv_"


def is_conversation_stream(stream_id: str) -> bool:
    return stream_id.startswith(CONVERSATION_PREFIX)


async def _append(
    connection: AsyncConnection, conversation_id: str, event: dict[str, Any], *, next_ordinal: int | None = None
) -> int:
    """Append the conversation's next event and stamp its row's updated_at and last_position (and its
    next_ordinal, when the event adds items). Every read here is one index lookup: an append costs the
    same at the 10,000th item as at the first."""
    sequence = await event_log.last_sequence_number(connection, conversation_id) + 1
    at = event.get("at", time.time())
    position = await event_log.append_events(
        connection, conversation_id, [{**event, "at": at, "sequence_number": sequence}]
    )
    values: dict[str, Any] = {"last_position": position, "updated_at": at}
    if next_ordinal is not None:
        values["next_ordinal"] = next_ordinal
    await connection.execute(sa.update(conversations).where(conversations.c.id == conversation_id).values(**values))
    return position


async def create(
    connection: AsyncConnection,
    conversation_id: str,
    metadata: dict[str, str],
    items: list[dict[str, Any]],
    *,
    project: str,
) -> dict[str, Any]:
    conversation = {
        "id": conversation_id,
        "object": "conversation",
        "created_at": int(time.time()),
        "metadata": metadata,
    }
    entries = entries_for(items, first_ordinal=0, source="client", response_id=None)
    at = time.time()
    event = {
        "type": "conversation.created",
        "at": at,
        "conversation": conversation,
        "entries": entries,
        "project": project,  # the owner, in the log, so that a rebuild keeps it
    }
    position = await _append(connection, conversation_id, event)
    await insert_projection(
        connection, conversation, position=position, updated_at=at, project=project, next_ordinal=len(entries)
    )
    await insert_entries(connection, conversation_id, entries)
    return conversation


async def update_metadata(connection: AsyncConnection, conversation_id: str, metadata: dict[str, str]) -> None:
    await _append(connection, conversation_id, {"type": "conversation.updated", "metadata": metadata})
    await connection.execute(
        sa.update(conversations).where(conversations.c.id == conversation_id).values(metadata=encode(metadata))
    )


async def add_items(
    connection: AsyncConnection,
    conversation_id: str,
    items: list[dict[str, Any]],
    *,
    source: str = "client",
    response_id: str | None = None,
    first_ordinal: int | None = None,
) -> list[Entry]:
    """Append items after the conversation's last one, as one event (so a batch never interleaves).
    `first_ordinal`: the caller's `next_ordinal`, read in this transaction (the items' ids derive from it)."""
    first = await next_ordinal(connection, conversation_id) if first_ordinal is None else first_ordinal
    entries = entries_for(items, first_ordinal=first, source=source, response_id=response_id)
    await _add_entries(connection, conversation_id, entries)
    return entries


async def _add_entries(connection: AsyncConnection, conversation_id: str, entries: list[Entry]) -> None:
    if entries:
        event = {"type": "conversation.items.added", "entries": entries}
        high_water = max(entry["ordinal"] for entry in entries) + 1
        await _append(connection, conversation_id, event, next_ordinal=high_water)
        await insert_entries(connection, conversation_id, entries)


async def delete_item(connection: AsyncConnection, conversation_id: str, ordinal: int) -> None:
    await _append(connection, conversation_id, {"type": "conversation.item.deleted", "ordinal": ordinal})
    await connection.execute(
        sa.delete(conversation_entries).where(
            conversation_entries.c.conversation_id == conversation_id, conversation_entries.c.ordinal == ordinal
        )
    )


async def delete(connection: AsyncConnection, conversation_id: str) -> None:
    """The conversation's log and projections, in the caller's transaction."""
    await event_log.delete_log(connection, conversation_id)
    await delete_projections(connection, conversation_id)


async def delete_projections(connection: AsyncConnection, conversation_id: str) -> None:
    await connection.execute(
        sa.delete(conversation_entries).where(conversation_entries.c.conversation_id == conversation_id)
    )
    await connection.execute(sa.delete(conversations).where(conversations.c.id == conversation_id))


async def insert_projection(
    connection: AsyncConnection,
    conversation: dict[str, Any],
    *,
    position: int,
    updated_at: float,
    project: str,
    next_ordinal: int,
) -> None:
    await connection.execute(
        sa.insert(conversations).values(
            id=conversation["id"],
            created_at=conversation["created_at"],
            metadata=encode(conversation["metadata"]),
            project=project,
            updated_at=updated_at,
            last_position=position,
            next_ordinal=next_ordinal,
        )
    )


async def insert_entries(connection: AsyncConnection, conversation_id: str, entries: list[Entry]) -> None:
    if entries:
        await connection.execute(
            sa.insert(conversation_entries),
            [
                {
                    "conversation_id": conversation_id,
                    "ordinal": entry["ordinal"],
                    "item_id": entry["item"]["id"],
                    "response_id": entry["response_id"],
                    "source": entry["source"],
                    "type": entry["item"]["type"],
                    "role": item_role(entry["item"]),
                    "text": sql_text(item_text(entry["item"])),
                    "data": encode(entry["item"]),
                }
                for entry in entries
            ],
        )


async def store_state(connection: AsyncConnection, state: ConversationState, *, position: int) -> None:
    """Write a folded state as projection rows (rebuilds)."""
    await insert_projection(
        connection,
        state.conversation,
        position=position,
        updated_at=state.updated_at,
        project=state.project,
        next_ordinal=state.next_ordinal,
    )
    await insert_entries(connection, state.conversation["id"], [state.entries[o] for o in sorted(state.entries)])


async def get(connection: AsyncConnection, conversation_id: str, *, project: str | None) -> dict[str, Any] | None:
    """The conversation, when it exists and belongs to `project` (None: the operator, any project)."""
    row = (
        await connection.execute(
            sa.select(conversations.c.created_at, conversations.c.metadata).where(
                conversations.c.id == conversation_id, owned(conversations, project)
            )
        )
    ).first()
    if row is None:
        return None
    return {
        "id": conversation_id,
        "object": "conversation",
        "created_at": int(row.created_at),
        "metadata": json.loads(row.metadata),
    }


async def next_ordinal(connection: AsyncConnection, conversation_id: str) -> int:
    """One past the highest ordinal ever used: a deleted last item keeps its ordinal. The row's high-water
    mark (kept by every append, refolded by rebuilds), so this is one primary-key read, not a fold of the log."""
    value = await connection.scalar(
        sa.select(conversations.c.next_ordinal).where(conversations.c.id == conversation_id)
    )
    return 0 if value is None else int(value)


async def list_entries(connection: AsyncConnection, conversation_id: str) -> list[tuple[int, dict[str, Any]]]:
    """(ordinal, item) of every item, oldest first (a response's history: it needs them all)."""
    query = (
        sa.select(conversation_entries.c.ordinal, conversation_entries.c.data)
        .where(conversation_entries.c.conversation_id == conversation_id)
        .order_by(conversation_entries.c.ordinal)
    )
    return [(int(ordinal), json.loads(data)) for ordinal, data in await connection.execute(query)]


async def page_entries(
    connection: AsyncConnection,
    conversation_id: str,
    *,
    after_ordinal: int | None,
    limit: int,
    order: Literal["asc", "desc"],
) -> list[tuple[int, dict[str, Any]]]:
    """Up to `limit` (ordinal, item) in `order` after `after_ordinal`: the page is chosen in SQL, on the
    (conversation_id, ordinal) primary key, so a page costs the same whatever the conversation's length."""
    query = sa.select(conversation_entries.c.ordinal, conversation_entries.c.data).where(
        conversation_entries.c.conversation_id == conversation_id
    )
    if order == "asc":
        if after_ordinal is not None:
            query = query.where(conversation_entries.c.ordinal > after_ordinal)
        query = query.order_by(conversation_entries.c.ordinal)
    else:
        if after_ordinal is not None:
            query = query.where(conversation_entries.c.ordinal < after_ordinal)
        query = query.order_by(conversation_entries.c.ordinal.desc())
    return [(int(ordinal), json.loads(data)) for ordinal, data in await connection.execute(query.limit(limit))]


async def ordinal_of(
    connection: AsyncConnection, conversation_id: str, item_id: str, *, last: bool = False
) -> int | None:
    """The ordinal of the item `item_id` (the first such, or with `last` the last: ids a client chose may
    repeat), on the (conversation_id, item_id) index."""
    column = sa.func.max if last else sa.func.min
    value = await connection.scalar(
        sa.select(column(conversation_entries.c.ordinal)).where(
            conversation_entries.c.conversation_id == conversation_id, conversation_entries.c.item_id == item_id
        )
    )
    return None if value is None else int(value)


async def find_item(
    connection: AsyncConnection, conversation_id: str, item_id: str
) -> tuple[int, dict[str, Any]] | None:
    row = (
        await connection.execute(
            sa.select(conversation_entries.c.ordinal, conversation_entries.c.data)
            .where(conversation_entries.c.conversation_id == conversation_id, conversation_entries.c.item_id == item_id)
            .order_by(conversation_entries.c.ordinal)
            .limit(1)
        )
    ).first()
    return None if row is None else (int(row.ordinal), json.loads(row.data))


async def append_response_items(connection: AsyncConnection, response_id: str) -> None:
    """A response that names a conversation has ended: its input and output items join the conversation,
    in this (the terminal) transaction. Skipped when the conversation was deleted meanwhile."""
    data = await connection.scalar(
        sa.select(run_facts.c.data)
        .where(run_facts.c.response_id == response_id, run_facts.c.kind == "request")
        .order_by(run_facts.c.position)
        .limit(1)
    )
    if data is None:
        return
    conversation_id = json.loads(data).get("conversation_id")
    if conversation_id is None or await get(connection, conversation_id, project=None) is None:
        return
    inputs = await list_items(connection, response_id, source="input", project=None)
    outputs = await list_items(connection, response_id, source="output", project=None)
    first = await next_ordinal(connection, conversation_id)
    entries = entries_for(inputs, first_ordinal=first, source="input", response_id=response_id) + entries_for(
        outputs, first_ordinal=first + len(inputs), source="output", response_id=response_id
    )
    await _add_entries(connection, conversation_id, entries)
