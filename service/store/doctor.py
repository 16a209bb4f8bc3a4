"""`python -m service doctor`: check the log's invariants over a whole database.

Per response: sequence numbers 0..N with no gap (a compacted log: 0 and its terminal N), at most
one terminal event and it is the last, the run marked done exactly when a terminal event is logged,
and the stored projection equal to a fresh fold of the log. Per conversation stream (`conv_…`):
sequence numbers 0..N and its `conversations`/`conversation_entries` rows equal to a fresh fold.
Across tables: no facts, runs, projections or items whose response (or conversation) has no
events (orphans). `compactions` rows and `server_keys` are not derived from the log: their shape is
checked. Reads everything in one snapshot; meant for operators and tests, not for a hot path.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from service.projection import project
from service.protocol import TERMINAL_EVENT_TYPES, TERMINAL_STATUSES
from service.store import event_log
from service.store.compaction_state import check_row
from service.store.conversation_fold import fold
from service.store.conversations import is_conversation_stream
from service.store.db import create_engine
from service.store.event_log import encode
from service.store.schema import (
    compactions,
    conversation_entries,
    conversation_items,
    conversations,
    responses,
    run_facts,
    runs,
    server_keys,
)
from service.store.token_facts import RECORD_KIND


@dataclass(frozen=True)
class Problem:
    response_id: str
    what: str


@dataclass(frozen=True)
class Report:
    responses: int
    events: int
    problems: list[Problem]
    conversations: int = 0


async def check_database(database_url: str) -> Report:
    db = create_engine(database_url)
    try:
        async with db.connect() as connection:
            grouped: dict[str, list[event_log.StoredEvent]] = defaultdict(list)
            after, total = 0, 0
            while batch := await event_log.read_all_events(connection, after_position=after, limit=5000):
                for stored in batch:
                    grouped[stored.response_id].append(stored)
                after, total = batch[-1].position, total + len(batch)
            fact_ids = set((await connection.scalars(sa.select(run_facts.c.response_id).distinct())).all())
            recorded = set(
                (
                    await connection.scalars(
                        sa.select(run_facts.c.response_id).where(run_facts.c.kind == RECORD_KIND).distinct()
                    )
                ).all()
            )
            done = {
                rid: bool(flag) for rid, flag in await connection.execute(sa.select(runs.c.response_id, runs.c.done))
            }
            stored_rows = {
                row.id: (json.loads(row.response), row.last_position)
                for row in await connection.execute(
                    sa.select(responses.c.id, responses.c.response, responses.c.last_position)
                )
            }
            item_ids = set((await connection.scalars(sa.select(conversation_items.c.response_id).distinct())).all())
            stored_conversations = {
                row.id: (
                    row.created_at,
                    json.loads(row.metadata),
                    row.updated_at,
                    row.last_position,
                    row.project,
                    row.next_ordinal,
                )
                for row in await connection.execute(
                    sa.select(
                        conversations.c.id,
                        conversations.c.created_at,
                        conversations.c.metadata,
                        conversations.c.updated_at,
                        conversations.c.last_position,
                        conversations.c.project,
                        conversations.c.next_ordinal,
                    )
                )
            }
            stored_entries: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
            for row in await connection.execute(
                sa.select(conversation_entries).order_by(
                    conversation_entries.c.conversation_id, conversation_entries.c.ordinal
                )
            ):
                stored_entries[row.conversation_id].append(tuple(row))
            stored_compactions = list(await connection.execute(sa.select(compactions.c.id, compactions.c.data)))
            keys = list(await connection.execute(sa.select(server_keys.c.name, server_keys.c.key)))
    finally:
        await db.dispose()

    problems: list[Problem] = []
    conversation_streams = {rid for rid in grouped if is_conversation_stream(rid)}
    for rid, stored_events in grouped.items():
        stored_events.sort(key=lambda e: e.sequence_number)
        if rid in conversation_streams:
            problems += _check_conversation(rid, stored_events, stored_conversations.get(rid), stored_entries[rid])
        else:
            problems += _check_response(
                rid, stored_events, done.get(rid), stored_rows.get(rid), compacted=rid in recorded
            )
    for table, ids in (
        ("conversations", set(stored_conversations)),
        ("conversation_entries", {cid for cid, rows in stored_entries.items() if rows}),
    ):
        problems += [
            Problem(cid, f"orphan rows in {table}: the conversation has no events")
            for cid in ids - conversation_streams
        ]
    for table, ids in (
        ("run_facts", fact_ids),
        ("runs", set(done)),
        ("responses", set(stored_rows)),
        ("items", item_ids),
    ):
        problems += [
            Problem(rid, f"orphan rows in {table}: the response has no events") for rid in ids - grouped.keys()
        ]
    # Compaction state and server keys are not derived from the log (no orphans possible): check their shape.
    for row in stored_compactions:
        if (wrong := check_row(row.id, row.data)) is not None:
            problems.append(Problem(row.id, wrong))
    for row in keys:
        if len(row.key) != 64 or any(c not in "0123456789abcdef" for c in row.key):
            problems.append(Problem(row.name, "server key is not 32 bytes of hex"))
    return Report(len(grouped) - len(conversation_streams), total, problems, len(conversation_streams))


def _check_conversation(
    cid: str,
    stored_events: list[event_log.StoredEvent],
    stored_row: tuple[float, dict[str, Any], float, int, str, int] | None,
    stored_entries: list[tuple[Any, ...]],
) -> list[Problem]:
    """A conversation's stream: 0..N without gaps, and projection rows equal to a fresh fold."""
    problems: list[Problem] = []
    numbers = [e.sequence_number for e in stored_events]
    if numbers != list(range(len(numbers))):
        problems.append(Problem(cid, f"sequence numbers are not 0..{len(numbers) - 1} without gaps"))
    try:
        state = fold(e.payload() for e in stored_events)
    except Exception as exc:  # noqa: BLE001 - a broken log is what the doctor reports
        return [*problems, Problem(cid, f"the log does not fold into a conversation ({type(exc).__name__}: {exc})")]
    if stored_row is None:
        return [*problems, Problem(cid, "no row in conversations")]
    created_at, metadata, updated_at, last_position, project, next_ordinal = stored_row
    conversation = state.conversation
    fold_position = stored_events[-1].position
    expected = (
        conversation["created_at"],
        conversation["metadata"],
        state.updated_at,
        fold_position,
        state.project,
        state.next_ordinal,
    )
    if (int(created_at), metadata, updated_at, last_position, project, next_ordinal) != expected:
        problems.append(Problem(cid, "the conversations row differs from a fresh fold of the log"))
    fresh = [
        (entry["ordinal"], entry["item"]["id"], entry["response_id"], entry["source"], encode(entry["item"]))
        for entry in (state.entries[o] for o in sorted(state.entries))
    ]
    stored = [(row[1], row[2], row[3], row[4], row[8]) for row in stored_entries]
    if stored != fresh:
        problems.append(Problem(cid, "the conversation's items differ from a fresh fold of the log"))
    return problems


def _check_response(
    rid: str,
    stored_events: list[event_log.StoredEvent],
    run_done: bool | None,
    stored_row: tuple[dict[str, Any], int] | None,
    *,
    compacted: bool = False,
) -> list[Problem]:
    problems: list[Problem] = []
    numbers = [e.sequence_number for e in stored_events]
    if compacted:
        # An archived stream (service/stream_archive.py) keeps `response.created` and the terminal event;
        # the events between are regenerated from the token record.
        if len(numbers) != 2 or numbers[0] != 0 or stored_events[-1].type not in TERMINAL_EVENT_TYPES:
            problems.append(Problem(rid, "a compacted log is not its response.created and terminal event"))
    elif numbers != list(range(len(numbers))):
        problems.append(Problem(rid, f"sequence numbers are not 0..{len(numbers) - 1} without gaps"))
    terminal_at = [i for i, e in enumerate(stored_events) if e.type in TERMINAL_EVENT_TYPES]
    if len(terminal_at) > 1:
        problems.append(Problem(rid, f"{len(terminal_at)} terminal events"))
    elif terminal_at and terminal_at[0] != len(stored_events) - 1:
        problems.append(Problem(rid, "events after the terminal event"))
    if run_done is None:
        problems.append(Problem(rid, "no row in runs"))
    elif run_done != bool(terminal_at):
        state = "done" if run_done else "not done"
        problems.append(Problem(rid, f"the run is {state} but the log has {len(terminal_at)} terminal event(s)"))
    if stored_row is None:
        problems.append(Problem(rid, "no row in responses"))
        return problems
    stored, last_position = stored_row
    try:
        fresh = project(e.payload() for e in stored_events)
        if stored.get("status") not in TERMINAL_STATUSES:
            tail = [e.payload() for e in stored_events if e.position > last_position]
            stored = project(tail, base=stored) if tail else stored
    except Exception as exc:  # noqa: BLE001 - a broken log is what the doctor reports
        problems.append(Problem(rid, f"the log does not fold into a Response ({type(exc).__name__}: {exc})"))
        return problems
    if stored != fresh:
        problems.append(Problem(rid, "the stored projection differs from a fresh fold of the log"))
    return problems
