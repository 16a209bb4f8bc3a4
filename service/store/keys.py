"""The `api_keys` table: named keys, each belonging to one project. Only a key's SHA-256 is stored
(a key is 32 random bytes, so a plain hash is enough); the comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.schema import DEFAULT_PROJECT, api_keys

KEY_PREFIX = "sk-svc-"
PREFIX_SHOWN = len(KEY_PREFIX) + 6  # what `keys list` shows of a key: enough to recognise it


class KeyProblem(Exception):
    """A key operation the person running it can fix (a duplicate or unknown name)."""


@dataclass(frozen=True)
class KeyInfo:
    name: str
    project: str
    prefix: str
    created_at: float
    last_used_at: float | None
    revoked_at: float | None


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


async def create_key(connection: AsyncConnection, name: str, *, project: str = DEFAULT_PROJECT) -> str:
    """Store a new key and return it (the only time it is ever seen)."""
    if not name or not project:
        raise KeyProblem("a key needs a non-empty name and project")
    existing = await connection.scalar(sa.select(api_keys.c.name).where(api_keys.c.name == name))
    if existing is not None:
        raise KeyProblem(f"a key named {name!r} already exists")
    key = new_key()
    await connection.execute(
        sa.insert(api_keys).values(
            name=name, project=project, prefix=key[:PREFIX_SHOWN], key_hash=key_hash(key), created_at=time.time()
        )
    )
    return key


async def list_keys(connection: AsyncConnection) -> list[KeyInfo]:
    rows = await connection.execute(
        sa.select(
            api_keys.c.name,
            api_keys.c.project,
            api_keys.c.prefix,
            api_keys.c.created_at,
            api_keys.c.last_used_at,
            api_keys.c.revoked_at,
        ).order_by(api_keys.c.created_at, api_keys.c.name)
    )
    return [KeyInfo(*row) for row in rows]


async def revoke_key(connection: AsyncConnection, name: str) -> None:
    result = await connection.execute(
        sa.update(api_keys)
        .where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=time.time())
    )
    if result.rowcount != 1:
        raise KeyProblem(f"no active key named {name!r}")


async def any_key(connection: AsyncConnection) -> bool:
    """Whether keys are in use: once one has been created, revoked ones included, the server requires
    a key (revoking the last key must not open the server to everyone)."""
    found = await connection.scalar(sa.select(api_keys.c.name).limit(1))
    return found is not None


@dataclass(frozen=True)
class KeyOwner:
    name: str
    project: str


async def find_key(connection: AsyncConnection, presented: bytes) -> KeyOwner | None:
    """The active key whose hash matches `presented`; the lookup is by hash, so what the database
    compares is never the secret itself, and the match is confirmed in constant time."""
    digest = key_hash(presented)
    row = (
        await connection.execute(
            sa.select(api_keys.c.name, api_keys.c.project, api_keys.c.key_hash).where(
                api_keys.c.key_hash == digest, api_keys.c.revoked_at.is_(None)
            )
        )
    ).first()
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        return None
    return KeyOwner(row.name, row.project)


async def touch(connection: AsyncConnection, name: str, *, at: float) -> None:
    await connection.execute(sa.update(api_keys).where(api_keys.c.name == name).values(last_used_at=at))
