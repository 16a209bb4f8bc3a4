"""Context-compaction state: what each `/v1/responses/compact` (or `context_management`) kept, in the
`compactions` table, and the stored server key (`server_keys`).

A compaction's kept context lives here; clients hold only an HMAC'd reference to it (the compaction
itself and the reference: service/compaction.py). Rows are not derived from the event log:
`rebuild-projections` leaves them alone, retention deletes them by age (`purge_before`), `doctor`
checks their shape (`check_row`).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.store.schema import compactions, server_keys

COMPACTION_KEY = "compaction"


def new_compaction_id() -> str:
    return f"cmp_{secrets.token_hex(24)}"


async def save(db: AsyncEngine, *, project: str, summary: list[dict[str, Any]], dropped: list[dict[str, Any]]) -> str:
    """Store what one compaction kept (the summary) and what it replaced; returns its id."""
    compaction_id = new_compaction_id()
    data = json.dumps({"summary": summary, "dropped": dropped}, separators=(",", ":"))
    async with db.begin() as connection:
        await connection.execute(
            compactions.insert().values(id=compaction_id, project=project, created_at=time.time(), data=data)
        )
    return compaction_id


async def load_summary(db: AsyncEngine, compaction_id: str, *, project: str) -> list[dict[str, Any]] | None:
    """The items a compaction stands for; None when it is not this project's or was purged."""
    async with db.connect() as connection:
        data = await connection.scalar(
            sa.select(compactions.c.data).where(compactions.c.id == compaction_id, compactions.c.project == project)
        )
    return None if data is None else list(json.loads(data)["summary"])


async def purge_before(connection: AsyncConnection, cutoff: float, *, limit: int) -> int:
    """Delete up to `limit` compactions created before `cutoff` (unix seconds); returns how many."""
    ids = (
        await connection.scalars(
            sa.select(compactions.c.id)
            .where(compactions.c.created_at < cutoff)
            .order_by(compactions.c.created_at)
            .limit(limit)
        )
    ).all()
    if ids:
        await connection.execute(compactions.delete().where(compactions.c.id.in_(ids)))
    return len(ids)


def check_row(compaction_id: str, data: str) -> str | None:
    """What is wrong with one stored compaction, or None."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return "compaction state is not JSON"
    if not compaction_id.startswith("cmp_"):
        return "compaction id does not start with cmp_"
    if not isinstance(parsed, dict) or not all(isinstance(parsed.get(k), list) for k in ("summary", "dropped")):
        return "compaction state lacks its summary/dropped lists"
    return None


async def stored_key(db: AsyncEngine, name: str = COMPACTION_KEY) -> bytes:
    """The random key `name`, created once per database (migration 0004 creates it; if the row is
    missing, the first replica to ask inserts it and a racing one reads the winner's)."""
    for _ in range(2):
        async with db.connect() as connection:
            key = await connection.scalar(sa.select(server_keys.c.key).where(server_keys.c.name == name))
        if key is not None:
            return bytes.fromhex(key)
        try:
            async with db.begin() as connection:
                await connection.execute(
                    server_keys.insert().values(name=name, key=secrets.token_hex(32), created_at=time.time())
                )
        except IntegrityError:
            pass  # another replica created it first
    raise RuntimeError(f"server key {name!r} could neither be read nor created")
