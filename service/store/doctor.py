"""`python -m service doctor`: check the log's invariants over a whole database.

Per response: sequence numbers 0..N with no gap, at most one terminal event and it is the last,
the run marked done exactly when a terminal event is logged, and the stored projection equal to
a fresh fold of the log. Across tables: no facts, runs, projections or items whose response has
no events (orphans). Reads everything in one snapshot; meant for operators and tests, not for
a hot path.
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
from service.store.db import create_engine
from service.store.schema import conversation_items, responses, run_facts, runs


@dataclass(frozen=True)
class Problem:
    response_id: str
    what: str


@dataclass(frozen=True)
class Report:
    responses: int
    events: int
    problems: list[Problem]


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
    finally:
        await db.dispose()

    problems: list[Problem] = []
    for rid, stored_events in grouped.items():
        stored_events.sort(key=lambda e: e.sequence_number)
        problems += _check_response(rid, stored_events, done.get(rid), stored_rows.get(rid))
    for table, ids in (
        ("run_facts", fact_ids),
        ("runs", set(done)),
        ("responses", set(stored_rows)),
        ("items", item_ids),
    ):
        problems += [
            Problem(rid, f"orphan rows in {table}: the response has no events") for rid in ids - grouped.keys()
        ]
    return Report(len(grouped), total, problems)


def _check_response(
    rid: str,
    stored_events: list[event_log.StoredEvent],
    run_done: bool | None,
    stored_row: tuple[dict[str, Any], int] | None,
) -> list[Problem]:
    problems: list[Problem] = []
    numbers = [e.sequence_number for e in stored_events]
    if numbers != list(range(len(numbers))):
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
