"""Retention: delete responses and conversations older than the horizon (`SERVICE_RETENTION_DAYS`).

A response expires `retention_days` after it was created, once its run has ended; a conversation
expires `retention_days` after its last event; a compaction's stored state (`compactions`) expires
`retention_days` after it was created, after which its `compaction` items are refused with a 400.
Each is deleted whole (its log, facts, run row and projections) in small batches: candidates are
chosen on a read snapshot, then deleted in one short write transaction per batch, so writers wait
at most one batch's deletes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import compaction_state, event_log, recorder
from service.store import conversations as conversation_store
from service.store.faults import is_transient
from service.store.schema import conversations, responses, runs
from service.store.token_chunks import merge_finished_runs

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Swept:
    responses: int
    conversations: int
    compactions: int = 0


async def sweep(db: AsyncEngine, *, retention_days: float, batch_size: int = 100, now: float | None = None) -> Swept:
    """Delete everything past the horizon, batch by batch; returns how much went."""
    if retention_days <= 0:
        return Swept(0, 0, 0)
    cutoff = (time.time() if now is None else now) - retention_days * SECONDS_PER_DAY
    gone_responses = gone_conversations = 0
    while True:
        # Choose on a read snapshot (no write lock held while scanning), delete in a short write.
        async with db.connect() as connection:
            # Only finished runs (or responses without a run row): a live run is never cut short.
            query = (
                sa.select(responses.c.id)
                .outerjoin(runs, runs.c.response_id == responses.c.id)
                .where(responses.c.created_at < cutoff, sa.or_(runs.c.done.is_(True), runs.c.response_id.is_(None)))
                .order_by(responses.c.created_at)
                .limit(batch_size)
            )
            ids = list((await connection.scalars(query)).all())
        async with db.begin() as connection:
            await event_log.lock_for_append(connection)
            for response_id in ids:
                await recorder.delete_in(connection, response_id)
        gone_responses += len(ids)
        if len(ids) < batch_size:
            break
    while True:
        async with db.connect() as connection:
            query = (
                sa.select(conversations.c.id)
                .where(conversations.c.updated_at < cutoff)
                .order_by(conversations.c.updated_at)
                .limit(batch_size)
            )
            ids = list((await connection.scalars(query)).all())
        async with db.begin() as connection:
            await event_log.lock_for_append(connection)
            for conversation_id in ids:
                # Re-checked under the lock: a conversation changed since the snapshot is kept.
                if await connection.scalar(
                    sa.select(conversations.c.id).where(
                        conversations.c.id == conversation_id, conversations.c.updated_at < cutoff
                    )
                ):
                    await conversation_store.delete(connection, conversation_id)
        gone_conversations += len(ids)
        if len(ids) < batch_size:
            break
    gone_compactions = 0
    while True:
        # Compaction state expires `retention_days` after it was created, like a response.
        async with db.begin() as connection:
            gone = await compaction_state.purge_before(connection, cutoff, limit=batch_size)
        gone_compactions += gone
        if gone < batch_size:
            break
    return Swept(gone_responses, gone_conversations, gone_compactions)


async def run_sweeper(
    db: AsyncEngine,
    *,
    retention_days: float,
    interval_seconds: float,
    batch_size: int,
    compaction_grace: float,
    archive_streams: Callable[[int], Awaitable[int]] | None = None,
    sweep_containers: Callable[[int], Awaitable[int]] | None = None,
) -> None:
    """Every `interval_seconds` until cancelled: delete what expired, merge the token chunks of finished
    runs (token_chunks.py), then archive the streams past the replay window (`archive_streams(batch)`,
    service/stream_archive.py). Store errors are logged and retried next time. `sweep_containers(batch)`
    (service/containers.py) deletes expired code-interpreter containers and those of deleted responses,
    then their files, and any container directory left without a row; it runs whatever the horizon."""
    while True:
        try:
            if sweep_containers is not None and (gone := await sweep_containers(batch_size)):
                log.info("retention: deleted %d containers", gone)
            swept = await sweep(db, retention_days=retention_days, batch_size=batch_size)
            if swept.responses or swept.conversations or swept.compactions:
                log.info(
                    "retention: deleted %d responses, %d conversations, %d compactions",
                    swept.responses,
                    swept.conversations,
                    swept.compactions,
                )
            while await merge_finished_runs(db, batch_size=batch_size, grace_seconds=compaction_grace) == batch_size:
                pass
            while archive_streams is not None and await archive_streams(batch_size) == batch_size:
                pass
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive a store outage
            if not is_transient(exc):
                log.exception("retention sweep failed")
        await asyncio.sleep(interval_seconds)
