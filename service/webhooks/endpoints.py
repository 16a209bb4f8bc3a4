"""Webhook endpoints: created from the CLI, refused when their URL breaks the MCP URL policy, their signing
secret sealed with AES-GCM under a key derived (HKDF, its own purpose label) from SERVICE_SECRET_KEY or, when
unset, the database's stored random key (`server_keys`, as compaction and reasoning sealing use)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.store.compaction_state import stored_key
from service.store.webhook_tables import PENDING, webhook_attempts, webhook_deliveries, webhook_endpoints
from service.tools.mcp_policy import McpUrlRefused, check_server_url
from service.webhooks import signing

EVENT_TYPES = ("response.completed", "response.failed", "response.cancelled", "response.incomplete")
PURPOSE = b"responses-service webhook signing secret v1"


class EndpointProblem(ValueError):
    """A URL, event type or endpoint id the CLI refuses; printed as one `error:` line."""


@dataclass(frozen=True)
class Endpoint:
    id: str
    project: str
    url: str
    event_types: tuple[str, ...]
    all_responses: bool
    secret_hint: str
    created_at: float


class SecretBox:
    """Seals and opens signing secrets (bound to their endpoint id)."""

    def __init__(self, material: bytes) -> None:
        self._aead = AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(material))

    @classmethod
    async def load(cls, db: AsyncEngine, secret_key: str | None) -> SecretBox:
        return cls(secret_key.encode() if secret_key else await stored_key(db))

    def seal(self, endpoint_id: str, secret: str) -> str:
        nonce = os.urandom(12)
        return base64.b64encode(nonce + self._aead.encrypt(nonce, secret.encode(), endpoint_id.encode())).decode()

    def open(self, endpoint_id: str, sealed: str) -> str:
        raw = base64.b64decode(sealed)
        try:
            return self._aead.decrypt(raw[:12], raw[12:], endpoint_id.encode()).decode()
        except InvalidTag as exc:
            raise EndpointProblem(f"the signing secret of {endpoint_id} cannot be opened (key changed?)") from exc


def check_url(url: str, allowed_hosts: Sequence[str]) -> None:
    """The MCP URL policy with private targets always refused: only hosts named in
    SERVICE_WEBHOOK_ALLOWED_HOSTS may be loopback or private."""
    try:
        check_server_url(url, allowed_hosts, private_refused=True)
    except McpUrlRefused as exc:
        message = str(exc).replace("server_url", "webhook URL").replace("MCP tools", "webhooks")
        raise EndpointProblem(message.replace("allowed MCP hosts", "SERVICE_WEBHOOK_ALLOWED_HOSTS")) from exc


def parse_event_types(raw: Sequence[str] | None) -> tuple[str, ...]:
    names = [name.strip() for one in raw or [] for name in one.split(",") if name.strip()]
    unknown = [name for name in names if name not in EVENT_TYPES]
    if unknown:
        raise EndpointProblem(f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(EVENT_TYPES)}")
    return tuple(dict.fromkeys(names)) or EVENT_TYPES


async def create(
    connection: AsyncConnection,
    box: SecretBox,
    *,
    url: str,
    project: str,
    event_types: Sequence[str],
    all_responses: bool,
) -> tuple[Endpoint, str]:
    """A new endpoint and its signing secret (shown once; only its sealed form is stored)."""
    endpoint_id = "we_" + secrets.token_hex(12)
    secret = signing.new_secret()
    endpoint = Endpoint(
        endpoint_id, project, url, tuple(event_types), all_responses, signing.secret_hint(secret), time.time()
    )
    await connection.execute(
        webhook_endpoints.insert().values(
            id=endpoint.id,
            project=project,
            url=url,
            event_types=json.dumps(list(endpoint.event_types)),
            all_responses=all_responses,
            secret_sealed=box.seal(endpoint_id, secret),
            secret_hint=endpoint.secret_hint,
            created_at=endpoint.created_at,
        )
    )
    return endpoint, secret


def _endpoint(row: sa.Row[tuple[object, ...]]) -> Endpoint:
    m = row._mapping
    return Endpoint(
        str(m["id"]),
        str(m["project"]),
        str(m["url"]),
        tuple(json.loads(str(m["event_types"]))),
        bool(m["all_responses"]),
        str(m["secret_hint"]),
        float(m["created_at"]),
    )


async def list_all(connection: AsyncConnection) -> list[Endpoint]:
    rows = await connection.execute(sa.select(webhook_endpoints).order_by(webhook_endpoints.c.created_at))
    return [_endpoint(row) for row in rows]


async def get(connection: AsyncConnection, endpoint_id: str) -> tuple[Endpoint, str]:
    """The endpoint and its sealed secret; EndpointProblem when there is none."""
    row = (await connection.execute(sa.select(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id))).first()
    if row is None:
        raise EndpointProblem(f"no webhook endpoint {endpoint_id}")
    return _endpoint(row), str(row._mapping["secret_sealed"])


async def remove(connection: AsyncConnection, endpoint_id: str) -> int:
    """Delete the endpoint and its undelivered rows (delivered and failed ones stay as history);
    returns how many undelivered rows went."""
    await get(connection, endpoint_id)
    pending = sa.select(webhook_deliveries.c.id).where(
        webhook_deliveries.c.endpoint_id == endpoint_id, webhook_deliveries.c.status == PENDING
    )
    await connection.execute(sa.delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(pending)))
    gone = await connection.execute(
        sa.delete(webhook_deliveries).where(
            webhook_deliveries.c.endpoint_id == endpoint_id, webhook_deliveries.c.status == PENDING
        )
    )
    await connection.execute(sa.delete(webhook_endpoints).where(webhook_endpoints.c.id == endpoint_id))
    return int(gone.rowcount or 0)


async def delivery_counts(connection: AsyncConnection) -> dict[tuple[str, str], int]:
    """{(endpoint_id, status): rows}."""
    rows = await connection.execute(
        sa.select(webhook_deliveries.c.endpoint_id, webhook_deliveries.c.status, sa.func.count()).group_by(
            webhook_deliveries.c.endpoint_id, webhook_deliveries.c.status
        )
    )
    return {(str(e), str(s)): int(n) for e, s, n in rows}
