"""The append-only logs: client-visible `events` and internal `run_facts`.

Appends take a connection so that callers group a whole engine step (all runs'
events, facts, projection updates and lease checks) into one transaction.
On PostgreSQL an advisory transaction lock serialises appenders, so positions are
assigned in commit order and a reader tailing by position never skips an id that
commits later (the same trick as eventsourcing's table lock).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store import event_codec, token_facts
from service.store.schema import events, run_facts

APPEND_LOCK_ID = 7_243_002


class SequenceConflict(Exception):
    """Another writer already appended one of these sequence numbers: we are not the run's owner."""


@dataclass(frozen=True)
class StoredEvent:
    position: int
    response_id: str
    sequence_number: int
    type: str
    data: str  # the event JSON exactly as sent to clients

    def payload(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed


@dataclass(frozen=True)
class StoredFact:
    position: int
    response_id: str
    kind: str
    data: dict[str, Any]


def encode(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


async def lock_for_append(connection: AsyncConnection) -> None:
    if connection.dialect.name == "postgresql":
        await connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": APPEND_LOCK_ID})


async def append_events(connection: AsyncConnection, response_id: str, stream_events: Sequence[dict[str, Any]]) -> int:
    """Append one response's client events; returns the position of the last one (0 if none).

    The caller has called lock_for_append in this transaction. A duplicate
    (response_id, sequence_number) raises SequenceConflict and the transaction must roll back.
    """
    return (await append_events_of_runs(connection, [(response_id, stream_events)])).get(response_id, 0)


async def append_events_of_runs(
    connection: AsyncConnection, runs: Sequence[tuple[str, Sequence[dict[str, Any]]]]
) -> dict[str, int]:
    """append_events for several responses in one statement (a group commit); response id -> the
    position of its last event (responses with no events are absent)."""
    positions = await append_encoded(
        connection, [event_codec.encode_event(response_id, event) for response_id, evs in runs for event in evs]
    )
    last: dict[str, int] = {}
    for (response_id, _), position in positions.items():
        last[response_id] = max(position, last.get(response_id, 0))
    return last


# (response id, sequence number) -> the log position an appended event got.
Positions = dict[tuple[str, int], int]


async def append_encoded(connection: AsyncConnection, encoded: Sequence[event_codec.EncodedEvent]) -> Positions:
    """append_events_of_runs for events already serialized (the writer serializes each event once, for
    the log and for its live readers); the position of each."""
    if not encoded:
        return {}
    now = datetime.now(UTC)
    rows = [
        {
            "response_id": event.response_id,
            "sequence_number": event.sequence_number,
            "type": event.type,
            "data": event.stored,  # compact for token deltas
            "created_at": now,
        }
        for event in encoded
    ]
    try:
        result = await connection.execute(
            sa.insert(events).returning(events.c.response_id, events.c.sequence_number, events.c.position), rows
        )
    except IntegrityError as exc:
        ids = ", ".join(sorted({event.response_id for event in encoded}))
        raise SequenceConflict(f"sequence numbers of {ids} already taken") from exc
    return {(response_id, sequence_number): position for response_id, sequence_number, position in result}


def live(event: event_codec.EncodedEvent) -> StoredEvent:
    """A just-committed event as readers of the log see it (position is not needed to stream it)."""
    return StoredEvent(0, event.response_id, event.sequence_number, event.type, event.sent)


async def append_fact(connection: AsyncConnection, response_id: str, kind: str, data: dict[str, Any]) -> None:
    await connection.execute(
        sa.insert(run_facts).values(response_id=response_id, kind=kind, data=encode(data), created_at=datetime.now(UTC))
    )


async def append_facts(
    connection: AsyncConnection,
    rows: Sequence[tuple[str, str, dict[str, Any]]],
    chunks: token_facts.TokenChunks | None = None,
) -> None:
    """Append facts in the order given; each run's `tokens` facts go into its token chunks (see
    token_facts; `chunks`: the writer's memory of them). A run's consecutive `tokens` facts are logged
    together, and any other fact of that run first flushes them, so the run's facts keep their order."""
    if not rows:
        return
    now = datetime.now(UTC)
    tokens: dict[str, list[dict[str, Any]]] = {}
    for rid, kind, data in rows:
        if kind == "tokens":
            tokens.setdefault(rid, []).append(data)
            continue
        if rid in tokens:
            await token_facts.append_tokens(connection, rid, tokens.pop(rid), now, chunks)
        await connection.execute(
            sa.insert(run_facts).values(response_id=rid, kind=kind, data=encode(data), created_at=now)
        )
        if chunks is not None:
            chunks.forget([rid])  # its last chunk is no longer its last fact
    await token_facts.append_token_groups(connection, tokens, now, chunks)


# The columns readers select: a row of each is what _stored / _fact turn into what readers see.
_EVENT_ROW = (events.c.position, events.c.response_id, events.c.sequence_number, events.c.type, events.c.data)
_FACT_ROW = (run_facts.c.position, run_facts.c.response_id, run_facts.c.kind, run_facts.c.data)


async def read_events(
    connection: AsyncConnection, response_id: str, *, after: int = -1, after_position: int = 0, limit: int | None = None
) -> list[StoredEvent]:
    """Events of one response with sequence_number > after (and log position > after_position), in order."""
    query = (
        sa.select(*_EVENT_ROW)
        .where(
            events.c.response_id == response_id,
            events.c.sequence_number > after,
            events.c.position > after_position,
        )
        .order_by(events.c.sequence_number)
    )
    if limit is not None:
        query = query.limit(limit)
    return [_stored(*row) for row in await connection.execute(query)]


def _stored(position: int, response_id: str, sequence_number: int, event_type: str, data: str) -> StoredEvent:
    """A row as readers see it: `data` is the event JSON as sent, whatever its stored form."""
    return StoredEvent(
        position,
        response_id,
        sequence_number,
        event_type,
        event_codec.decode(response_id, event_type, sequence_number, data),
    )


async def read_all_events(
    connection: AsyncConnection, *, after_position: int = 0, limit: int = 1000
) -> list[StoredEvent]:
    """The whole log in position order (catch-up runners, rebuilds)."""
    query = sa.select(*_EVENT_ROW).where(events.c.position > after_position).order_by(events.c.position).limit(limit)
    return [_stored(*row) for row in await connection.execute(query)]


async def read_facts(connection: AsyncConnection, response_id: str) -> list[StoredFact]:
    query = sa.select(*_FACT_ROW).where(run_facts.c.response_id == response_id).order_by(run_facts.c.position)
    return [_fact(*row) for row in await connection.execute(query)]


def _fact(position: int, response_id: str, kind: str, data: str) -> StoredFact:
    return StoredFact(position, response_id, kind, json.loads(data))


async def read_logs(
    connection: AsyncConnection, response_ids: Sequence[str]
) -> dict[str, tuple[list[StoredFact], list[StoredEvent]]]:
    """read_facts and read_events of several responses, in two statements (runs claimed together)."""
    logs: dict[str, tuple[list[StoredFact], list[StoredEvent]]] = {rid: ([], []) for rid in response_ids}
    if not logs:
        return logs
    ids = list(logs)
    fact_rows = await connection.execute(
        sa.select(*_FACT_ROW).where(run_facts.c.response_id.in_(ids)).order_by(run_facts.c.position)
    )
    for fact_row in fact_rows:
        logs[fact_row[1]][0].append(_fact(*fact_row))
    event_rows = await connection.execute(
        sa.select(*_EVENT_ROW)
        .where(events.c.response_id.in_(ids))
        .order_by(events.c.response_id, events.c.sequence_number)
    )
    for row in event_rows:
        logs[row[1]][1].append(_stored(*row))
    return logs


async def last_sequence_number(connection: AsyncConnection, response_id: str) -> int:
    """-1 when the response has no events."""
    value = await connection.scalar(
        sa.select(sa.func.max(events.c.sequence_number)).where(events.c.response_id == response_id)
    )
    return -1 if value is None else int(value)


async def last_event(connection: AsyncConnection, response_id: str) -> StoredEvent | None:
    query = (
        sa.select(*_EVENT_ROW)
        .where(events.c.response_id == response_id)
        .order_by(events.c.sequence_number.desc())
        .limit(1)
    )
    row = (await connection.execute(query)).first()
    return None if row is None else _stored(*row)


async def delete_log(connection: AsyncConnection, response_id: str) -> None:
    await connection.execute(sa.delete(events).where(events.c.response_id == response_id))
    await connection.execute(sa.delete(run_facts).where(run_facts.c.response_id == response_id))


async def count_tokens(connection: AsyncConnection, response_ids: Sequence[str]) -> dict[str, int]:
    """How many token ids each run has logged."""
    return await token_facts.count_tokens(connection, response_ids)


# The agent loop's tool facts (service/agent/calls.py): each (kind, index) is logged at most once per run.
TOOL_FACT_KINDS = ("tool_call_started", "tool_call_result")


async def logged_tool_facts(
    connection: AsyncConnection, response_ids: Sequence[str]
) -> dict[str, set[tuple[str, int]]]:
    """(kind, index) of each run's tool facts in the log (how a writer learns whether a tool fact whose
    commit outcome it never heard landed: a tool fact moves no token count and may carry no events)."""
    found: dict[str, set[tuple[str, int]]] = {rid: set() for rid in response_ids}
    if not response_ids:
        return found
    rows = await connection.execute(
        sa.select(run_facts.c.response_id, run_facts.c.kind, run_facts.c.data).where(
            run_facts.c.response_id.in_(list(response_ids)), run_facts.c.kind.in_(TOOL_FACT_KINDS)
        )
    )
    for rid, kind, data in rows:
        found[rid].add((kind, int(json.loads(data)["index"])))
    return found


async def last_sequence_numbers(connection: AsyncConnection, response_ids: Sequence[str]) -> dict[str, int]:
    """The last sequence number of each response (-1 when it has none)."""
    if not response_ids:
        return {}
    rows = await connection.execute(
        sa.select(events.c.response_id, sa.func.max(events.c.sequence_number))
        .where(events.c.response_id.in_(list(response_ids)))
        .group_by(events.c.response_id)
    )
    found = {rid: -1 for rid in response_ids}
    found.update({rid: int(n) for rid, n in rows if n is not None})
    return found
