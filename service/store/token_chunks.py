"""Merging a finished run's token chunks into one `tokens` fact (what the sweeper's "log compaction",
`SERVICE_LOG_COMPACTION_GRACE_SECONDS`, does).

A live run's sampled ids are logged in chunk facts (token_facts.py: each step extends the run's last
`tokens` fact until it passes `CHUNK_CHARS`). A finished run is never resumed again, but replay
(`runs.state.replay_run`), doctor and rebuild still read its tokens: they read the ids of all its
`tokens` facts in log order, so one fact holding the concatenation (ids, groups, and logprobs when
logged) replays identically. The merge waits `grace_seconds` after the response was created and until
the run is done, so no writer still counting its facts (`recorder.landed`) sees the count change.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import event_log
from service.store.schema import responses, run_facts, runs
from service.store.token_facts import merge_token_facts


async def merge_finished_runs(
    db: AsyncEngine, *, batch_size: int = 50, grace_seconds: float = 60.0, now: float | None = None
) -> int:
    """Fold the token facts of up to `batch_size` finished runs, one short transaction; returns how many."""
    tool_kinds = event_log.TOOL_FACT_KINDS
    cutoff = (time.time() if now is None else now) - grace_seconds
    async with db.connect() as connection:  # choose on a read snapshot: no write lock while scanning
        many = (
            sa.select(run_facts.c.response_id)
            .where(run_facts.c.kind == "tokens")
            .group_by(run_facts.c.response_id)
            .having(sa.func.count() > 1)
            .subquery()
        )
        query = (
            sa.select(runs.c.response_id)
            .join(responses, responses.c.id == runs.c.response_id)
            .join(many, many.c.response_id == runs.c.response_id)
            .where(runs.c.done.is_(True), responses.c.created_at < cutoff)
            # A run with tool calls keeps its token chunks apart: replay feeds each tool result back
            # between the tokens it came between, which one merged chunk would lose.
            .where(~sa.exists().where(run_facts.c.response_id == runs.c.response_id, run_facts.c.kind.in_(tool_kinds)))
            .limit(batch_size)
        )
        ids = list((await connection.scalars(query)).all())
    async with db.begin() as connection:
        await event_log.lock_for_append(connection)
        for response_id in ids:
            rows = (
                await connection.execute(
                    sa.select(run_facts.c.data)
                    .where(run_facts.c.response_id == response_id, run_facts.c.kind == "tokens")
                    .order_by(run_facts.c.position)
                )
            ).all()
            if len(rows) < 2:
                continue  # deleted, or compacted by another replica, since the snapshot
            merged = merge_token_facts([json.loads(data) for (data,) in rows])
            await connection.execute(
                sa.delete(run_facts).where(run_facts.c.response_id == response_id, run_facts.c.kind == "tokens")
            )
            await connection.execute(
                sa.insert(run_facts).values(
                    response_id=response_id, kind="tokens", data=event_log.encode(merged), created_at=datetime.now(UTC)
                )
            )
    return len(ids)
