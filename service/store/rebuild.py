"""Rebuilding the projections from the logs, and reading one response's whole record."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from service.projection import project
from service.store import conversations as conversation_store
from service.store import event_log, read_models
from service.store.conversation_fold import fold
from service.store.db import create_engine, migrate
from service.store.schema import DEFAULT_PROJECT, conversation_entries, conversations
from service.store.token_facts import RECORD_KIND


async def rebuild_projections(database_url: str) -> int:
    """Drop and refold `responses`, `conversation_items` and the conversations' tables from `events` and
    `run_facts`, in one transaction. Returns how many streams (responses and conversations) it folded."""
    await migrate(database_url)
    db = create_engine(database_url)
    try:
        async with db.begin() as connection:
            await event_log.lock_for_append(connection)
            grouped: dict[str, list[event_log.StoredEvent]] = defaultdict(list)
            after = 0
            while batch := await event_log.read_all_events(connection, after_position=after, limit=5000):
                for stored in batch:
                    grouped[stored.response_id].append(stored)
                after = batch[-1].position
            await read_models.clear_all(connection)
            await connection.execute(sa.delete(conversation_entries))
            await connection.execute(sa.delete(conversations))
            for response_id, stored_events in grouped.items():
                stored_events.sort(key=lambda e: e.sequence_number)
                if conversation_store.is_conversation_stream(response_id):
                    state = fold(e.payload() for e in stored_events)
                    position = max(e.position for e in stored_events)
                    await conversation_store.store_state(connection, state, position=position)
                    continue
                payloads = [e.payload() for e in stored_events]
                facts = await event_log.read_facts(connection, response_id)
                request = next(f.data for f in facts if f.kind == "request")
                response = project(payloads)
                position = max(e.position for e in stored_events)
                owner = request.get("project", DEFAULT_PROJECT)
                await read_models.insert_response(connection, response, position=position, project=owner)
                prompt_items = request["prompt_items"]
                tail = prompt_items[len(prompt_items) - request["input_item_count"] :]
                input_items = request.get("input_items", tail)
                await read_models.insert_items(connection, response_id, input_items, source="input", first_ordinal=0)
                if any(f.kind == RECORD_KIND for f in facts):
                    # A compacted log keeps its terminal event, whose output lists every finished item.
                    payloads = [
                        {"type": "response.output_item.done", "output_index": index, "item": item}
                        for index, item in enumerate(response.get("output") or [])
                    ]
                await read_models.insert_output_items(
                    connection, response_id, payloads, input_item_count=request["input_item_count"]
                )
        return len(grouped)
    finally:
        await db.dispose()


async def inspect_response(database_url: str, response_id: str) -> dict[str, Any]:
    db = create_engine(database_url)
    try:
        async with db.connect() as connection:
            return {
                "response": await read_models.get_response(connection, response_id, project=None),
                "facts": [
                    {"kind": f.kind, "data": f.data} for f in await event_log.read_facts(connection, response_id)
                ],
                "events": [e.payload() for e in await event_log.read_events(connection, response_id)],
            }
    finally:
        await db.dispose()
