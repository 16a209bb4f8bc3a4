"""The `containers` table: code-interpreter containers owned by a project (SQL only, no files).

A container is usable while `last_active_at + expires_after_minutes` is in the future; each code run
moves `last_active_at` (OpenAI's `expires_after.anchor = "last_active_at"`). Rows are not derived from
the event log: `rebuild-projections` leaves them alone; retention deletes expired ones and those whose
response is gone (service/containers.py removes their files after the commit).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.schema import containers, responses, runs

RUNNING = "running"
DEFAULT_EXPIRY_MINUTES = 20  # OpenAI's default


def new_container_id() -> str:
    return "cntr_" + secrets.token_hex(24)


@dataclass(frozen=True)
class Container:
    id: str
    project: str
    name: str
    created_at: float
    last_active_at: float
    expires_after_minutes: int
    response_id: str | None
    status: str

    def expires_at(self) -> float:
        return self.last_active_at + self.expires_after_minutes * 60.0

    def expired(self, now: float) -> bool:
        return now >= self.expires_at()

    def as_object(self, now: float) -> dict[str, Any]:
        """The Container object of OpenAI's API."""
        return {
            "id": self.id,
            "object": "container",
            "name": self.name,
            "created_at": int(self.created_at),
            "last_active_at": int(self.last_active_at),
            "status": "expired" if self.expired(now) else self.status,
            "expires_after": {"anchor": "last_active_at", "minutes": self.expires_after_minutes},
            "memory_limit": "1g",
        }


def _container(row: Any) -> Container:
    return Container(
        id=row.id,
        project=row.project,
        name=row.name,
        created_at=float(row.created_at),
        last_active_at=float(row.last_active_at),
        expires_after_minutes=int(row.expires_after_minutes),
        response_id=row.response_id,
        status=row.status,
    )


async def insert(
    connection: AsyncConnection,
    *,
    container_id: str,
    project: str,
    name: str,
    expires_after_minutes: int,
    now: float,
    response_id: str | None = None,
) -> Container:
    values = {
        "id": container_id,
        "project": project,
        "name": name,
        "created_at": now,
        "last_active_at": now,
        "expires_after_minutes": expires_after_minutes,
        "response_id": response_id,
        "status": RUNNING,
    }
    await connection.execute(containers.insert().values(**values))
    return Container(**values)  # type: ignore[arg-type]


async def get(connection: AsyncConnection, container_id: str, *, project: str) -> Container | None:
    """The project's container, expired or not; None when it does not exist or is another project's."""
    row = (
        await connection.execute(
            sa.select(containers).where(containers.c.id == container_id, containers.c.project == project)
        )
    ).first()
    return None if row is None else _container(row)


async def touch(connection: AsyncConnection, container_id: str, now: float) -> None:
    await connection.execute(sa.update(containers).where(containers.c.id == container_id).values(last_active_at=now))


async def page(
    connection: AsyncConnection,
    *,
    project: str,
    after: str | None,
    limit: int,
    order: Literal["asc", "desc"],
    name: str | None = None,
) -> tuple[list[Container], bool] | None:
    """Up to `limit` of the project's containers by creation (then id) after the `after` cursor, and whether
    more follow; None when `after` is not one of the project's containers."""
    query = sa.select(containers).where(containers.c.project == project)
    if name is not None:
        query = query.where(containers.c.name == name)
    key = sa.tuple_(containers.c.created_at, containers.c.id)
    if after is not None:
        cursor = await get(connection, after, project=project)
        if cursor is None:
            return None
        position = sa.tuple_(sa.literal(cursor.created_at), sa.literal(cursor.id))
        query = query.where(key > position if order == "asc" else key < position)
    if order == "asc":
        query = query.order_by(containers.c.created_at, containers.c.id)
    else:
        query = query.order_by(containers.c.created_at.desc(), containers.c.id.desc())
    rows = [_container(row) for row in (await connection.execute(query.limit(limit + 1))).all()]
    return rows[:limit], len(rows) > limit


async def delete(connection: AsyncConnection, container_ids: list[str]) -> None:
    if container_ids:
        await connection.execute(containers.delete().where(containers.c.id.in_(container_ids)))


async def of_response(connection: AsyncConnection, response_id: str) -> list[str]:
    """The `auto` container(s) a response made."""
    return list(await connection.scalars(sa.select(containers.c.id).where(containers.c.response_id == response_id)))


async def sweepable(connection: AsyncConnection, now: float, *, limit: int) -> list[str]:
    """Containers to delete: expired ones (an `auto` one not while its run goes on), and `auto` ones whose
    response is gone (deleted, purged by retention, or a store=false response its client has read)."""
    expired = (containers.c.last_active_at + containers.c.expires_after_minutes * 60.0) <= now
    run_goes_on = sa.exists().where(runs.c.response_id == containers.c.response_id, runs.c.done.is_(False))
    response_gone = sa.and_(
        containers.c.response_id.is_not(None),
        ~sa.exists().where(responses.c.id == containers.c.response_id),
    )
    query = sa.select(containers.c.id).where(sa.or_(sa.and_(expired, ~run_goes_on), response_gone)).limit(limit)
    return list(await connection.scalars(query))


async def existing(connection: AsyncConnection, container_ids: list[str]) -> set[str]:
    """Which of these ids have a row."""
    if not container_ids:
        return set()
    return set(await connection.scalars(sa.select(containers.c.id).where(containers.c.id.in_(container_ids))))
