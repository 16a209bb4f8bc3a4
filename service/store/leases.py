"""The `runs` table: who owns a run and until when. Operational state, not a projection.

Every write a worker makes for a run goes through `fence` in the same transaction,
which renews the lease only where the worker still owns the run; a stale owner
learns it lost the run before it can append anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.schema import DEFAULT_PROJECT, runs


@dataclass(frozen=True)
class ClaimedRun:
    response_id: str
    background: bool
    cancel_requested: bool
    claims: int  # how many times the run has been claimed, this claim included


async def enqueue(
    connection: AsyncConnection,
    response_id: str,
    *,
    background: bool,
    owner: str | None,
    lease_seconds: float,
    project: str = DEFAULT_PROJECT,
) -> None:
    now = time.time()
    await connection.execute(
        sa.insert(runs).values(
            response_id=response_id,
            background=background,
            done=False,
            owner=owner,
            lease_expires_at=(now + lease_seconds) if owner else None,
            cancel_requested=False,
            claims=1 if owner else 0,
            enqueued_at=now,
            project=project,
        )
    )


async def claim(
    connection: AsyncConnection, owner: str, *, lease_seconds: float, limit: int, cancelled_only: bool = False
) -> list[ClaimedRun]:
    """Take up to `limit` unowned or expired runs, oldest first. Safe across replicas on PostgreSQL."""
    now = time.time()
    query = (
        sa.select(runs.c.response_id, runs.c.background, runs.c.cancel_requested, runs.c.claims)
        .where(runs.c.done.is_(False), sa.or_(runs.c.owner.is_(None), runs.c.lease_expires_at < now))
        .order_by(runs.c.enqueued_at, runs.c.response_id)
        .limit(limit)
    )
    if cancelled_only:
        query = query.where(runs.c.cancel_requested.is_(True))
    if connection.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    order = [row[0] for row in await connection.execute(query)]
    if not order:
        return []
    # One guarded UPDATE for all of them (a burst's claim was one statement per run); a run another claimer
    # took meanwhile (SQLite: none can, the writer holds the lock) fails the guard and is not returned.
    taken = await connection.execute(
        sa.update(runs)
        .where(
            runs.c.response_id.in_(order),
            runs.c.done.is_(False),
            sa.or_(runs.c.owner.is_(None), runs.c.lease_expires_at < now),
        )
        .values(owner=owner, lease_expires_at=now + lease_seconds, claims=runs.c.claims + 1)
        .returning(runs.c.response_id, runs.c.background, runs.c.cancel_requested, runs.c.claims)
    )
    by_id = {
        rid: ClaimedRun(rid, bool(background), bool(cancel), int(claims)) for rid, background, cancel, claims in taken
    }
    return [by_id[rid] for rid in order if rid in by_id]  # oldest first, as selected


async def fence(
    connection: AsyncConnection, owner: str, response_ids: Sequence[str], *, lease_seconds: float
) -> dict[str, bool]:
    """Renew the lease of each run `owner` still holds; returns {response_id: cancel_requested} for those."""
    if not response_ids:
        return {}
    params = {"fence_owner": owner, "fence_ids": list(response_ids), "fence_expires": time.time() + lease_seconds}
    return {response_id: bool(cancel) for response_id, cancel in await connection.execute(_FENCE, params)}


# Built once: every group commit fences, and building the statement cost as much as running it.
_FENCE = (
    sa.update(runs)
    .where(
        runs.c.owner == sa.bindparam("fence_owner"),
        runs.c.response_id.in_(sa.bindparam("fence_ids", expanding=True)),
        runs.c.done.is_(False),
    )
    .values(lease_expires_at=sa.bindparam("fence_expires"))
    .returning(runs.c.response_id, runs.c.cancel_requested)
)


async def mark_done(connection: AsyncConnection, response_id: str) -> None:
    await connection.execute(
        sa.update(runs).where(runs.c.response_id == response_id).values(done=True, owner=None, lease_expires_at=None)
    )


async def release(connection: AsyncConnection, owner: str, response_ids: Sequence[str]) -> None:
    """Hand runs back (graceful shutdown): another worker may claim them at once."""
    if response_ids:
        await connection.execute(
            sa.update(runs)
            .where(runs.c.owner == owner, runs.c.response_id.in_(list(response_ids)))
            .values(owner=None, lease_expires_at=None)
        )


async def request_cancel(connection: AsyncConnection, response_id: str) -> None:
    await connection.execute(sa.update(runs).where(runs.c.response_id == response_id).values(cancel_requested=True))


async def get_run(connection: AsyncConnection, response_id: str, *, project: str | None = None) -> Any:
    """`project`: only a run of that project is found (None: any)."""
    ownership = sa.true() if project is None else runs.c.project == project
    row = (
        await connection.execute(
            sa.select(runs.c.response_id, runs.c.background, runs.c.done, runs.c.owner).where(
                runs.c.response_id == response_id, ownership
            )
        )
    ).first()
    return row


async def unfinished_runs(connection: AsyncConnection) -> int:
    """Runs queued or generating, of every project. Counted in the database, so the figure holds across
    replicas."""
    query = sa.select(sa.func.count()).select_from(runs).where(runs.c.done.is_(False))
    return int(await connection.scalar(query) or 0)


async def unfinished_runs_of(connection: AsyncConnection, project: str) -> tuple[int, int]:
    """(the project's, every project's) runs queued or generating, in one statement (a request's
    admission check: one round trip, not two)."""
    query = sa.select(
        sa.func.count(), sa.func.coalesce(sa.func.sum(sa.case((runs.c.project == project, 1), else_=0)), 0)
    ).where(runs.c.done.is_(False))
    row = (await connection.execute(query)).one()
    return int(row[1]), int(row[0])


async def delete_run(connection: AsyncConnection, response_id: str) -> None:
    await connection.execute(sa.delete(runs).where(runs.c.response_id == response_id))
