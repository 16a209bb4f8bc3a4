"""Projection tables (`responses`, `conversation_items`) and the queries behind HTTP reads.

Rows are written in the same transaction as the events they fold. Between lifecycle
events a run's row may lag its log by a few deltas; readers fold that tail on the fly
(`get_response`), so a GET is always as fresh as the log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.projection import finished_output
from service.projection import project as project_events
from service.protocol import item_role, item_text
from service.protocol.items import sql_text
from service.store.event_log import encode, read_events
from service.store.schema import DEFAULT_PROJECT, conversation_items, responses


def owned(table: sa.FromClause, project: str | None) -> sa.ColumnElement[bool]:
    """The ownership check, put inside the WHERE of every query a client's request runs: rows of
    another project are simply not found (the same 404 as an unknown id). `None` is the operator
    (CLI, rebuild, the run supervisor), who sees every project. A new owned table (conversations)
    gets a `project` column and `.where(owned(table, project))` in each of its queries."""
    return sa.true() if project is None else table.c.project == project


async def insert_response(
    connection: AsyncConnection, response: dict[str, Any], *, position: int, project: str = DEFAULT_PROJECT
) -> None:
    await connection.execute(
        sa.insert(responses).values(**_response_columns(response), last_position=position, project=project)
    )


async def update_response(connection: AsyncConnection, response: dict[str, Any], *, position: int) -> None:
    await connection.execute(
        sa.update(responses)
        .where(responses.c.id == response["id"])
        .values(**_response_columns(response), last_position=position)
    )


def _response_columns(response: dict[str, Any]) -> dict[str, Any]:
    usage = response.get("usage") or {}
    return {
        "id": response["id"],
        "status": response["status"],
        "model": response["model"],
        "created_at": response["created_at"],
        "completed_at": response.get("completed_at"),
        "previous_response_id": response.get("previous_response_id"),
        "background": bool(response.get("background")),
        "store": bool(response.get("store", True)),
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "response": encode(response),
    }


async def insert_items(
    connection: AsyncConnection, response_id: str, items: Sequence[dict[str, Any]], *, source: str, first_ordinal: int
) -> None:
    if items:
        await connection.execute(
            sa.insert(conversation_items),
            [
                {
                    "response_id": response_id,
                    "ordinal": first_ordinal + offset,
                    "source": source,
                    "item_id": item["id"],
                    "type": item["type"],
                    "role": item_role(item),
                    "text": sql_text(item_text(item)),
                    "data": encode(item),
                }
                for offset, item in enumerate(items)
            ],
        )


async def insert_output_items(
    connection: AsyncConnection, response_id: str, events: Sequence[dict[str, Any]], *, input_item_count: int
) -> None:
    """The output items these events finish; output item i is ordinal input_item_count + i."""
    for index, item in finished_output(events):
        await insert_items(connection, response_id, [item], source="output", first_ordinal=input_item_count + index)


async def get_response(connection: AsyncConnection, response_id: str, *, project: str | None) -> dict[str, Any] | None:
    row = (
        await connection.execute(
            sa.select(responses.c.response, responses.c.last_position, responses.c.status).where(
                responses.c.id == response_id, owned(responses, project)
            )
        )
    ).first()
    if row is None:
        return None
    stored: dict[str, Any] = json.loads(row.response)
    if stored["status"] in ("completed", "incomplete", "failed", "cancelled"):
        return stored
    tail = [e.payload() for e in await read_events(connection, response_id, after_position=row.last_position)]
    return project_events(tail, base=stored) if tail else stored


async def exists(connection: AsyncConnection, response_id: str, *, project: str | None = None) -> bool:
    query = sa.select(responses.c.id).where(responses.c.id == response_id, owned(responses, project))
    return (await connection.scalar(query)) is not None


async def list_items(
    connection: AsyncConnection, response_id: str, *, project: str | None, source: str | None = None
) -> list[dict[str, Any]]:
    query = (
        sa.select(conversation_items.c.data)
        .join(responses, responses.c.id == conversation_items.c.response_id)
        .where(conversation_items.c.response_id == response_id, owned(responses, project))
    )
    if source is not None:
        query = query.where(conversation_items.c.source == source)
    return [json.loads(data) for (data,) in await connection.execute(query.order_by(conversation_items.c.ordinal))]


async def conversation_history(
    connection: AsyncConnection, response_id: str, *, project: str | None
) -> list[dict[str, Any]]:
    """Every item of the chain ending at `response_id` (inputs and outputs), oldest first: one query, the chain
    walked by a recursive CTE (a statement per link made turn n's request pay 2n round trips)."""
    start = sa.select(responses.c.id, responses.c.previous_response_id, sa.literal(0).label("depth")).where(
        responses.c.id == response_id, owned(responses, project)
    )
    chain = start.cte("chain", recursive=True)
    earlier = responses.alias("earlier")
    chain = chain.union_all(
        sa.select(earlier.c.id, earlier.c.previous_response_id, chain.c.depth + 1).where(
            earlier.c.id == chain.c.previous_response_id,
            owned(earlier, project),
            chain.c.depth < _MAX_CHAIN,  # ids are random, so a cycle cannot be made; the bound is cheap anyway
        )
    )
    query = (
        sa.select(conversation_items.c.data)
        .join(chain, chain.c.id == conversation_items.c.response_id)
        .order_by(chain.c.depth.desc(), conversation_items.c.ordinal)
    )
    return [json.loads(data) for (data,) in await connection.execute(query)]


# Links of a previous_response_id chain that conversation_history follows.
_MAX_CHAIN = 100_000


async def delete_projections(connection: AsyncConnection, response_id: str) -> None:
    await connection.execute(sa.delete(conversation_items).where(conversation_items.c.response_id == response_id))
    await connection.execute(sa.delete(responses).where(responses.c.id == response_id))


async def clear_all(connection: AsyncConnection) -> None:
    await connection.execute(sa.delete(conversation_items))
    await connection.execute(sa.delete(responses))


async def finished_unstored(connection: AsyncConnection) -> list[str]:
    query = sa.select(responses.c.id).where(
        responses.c.store.is_(False), responses.c.status.in_(["completed", "incomplete", "failed", "cancelled"])
    )
    return [row[0] for row in await connection.execute(query)]
