"""The outbox: one `webhook_deliveries` row per (terminal event, endpoint), written by the recorder inside the
transaction that commits the terminal event, so a notification exists exactly when its response has ended.

Payloads are the SDK's `types/webhooks/response_*_webhook_event.py` shapes:
`{"id": "evt_…", "object": "event", "created_at": …, "type": "response.completed", "data": {"id": "resp_…"}}`.
Inside a recorder transaction (on SQLite one hop to the writer thread), so only execute/scalar are awaited.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.schema import runs
from service.store.webhook_tables import PENDING, webhook_attempts, webhook_deliveries, webhook_endpoints

_TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
# A cancelled run ends with `response.incomplete` carrying status "cancelled" (stream_builder).
_BY_STATUS = {
    "completed": "response.completed",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
    "incomplete": "response.incomplete",
}


def webhook_type(events: Sequence[dict[str, Any]]) -> str | None:
    """The webhook event type of a write's terminal event (None: the write has none)."""
    for event in reversed(events):
        if event.get("type") in _TERMINAL_EVENTS:
            status = (event.get("response") or {}).get("status")
            return _BY_STATUS.get(str(status), str(event["type"]))
    return None


def payload(event_id: str, event_type: str, response_id: str, created_at: int) -> str:
    return json.dumps(
        {"id": event_id, "object": "event", "created_at": created_at, "type": event_type, "data": {"id": response_id}},
        separators=(",", ":"),
    )


async def enqueue_terminal(connection: AsyncConnection, response_id: str, events: Sequence[dict[str, Any]]) -> int:
    """Write the rows for a response whose terminal event is in `events` (same transaction); returns how many."""
    event_type = webhook_type(events)
    if event_type is None:
        return 0
    # One round trip (this runs inside the group commit): the run's endpoints, none when its project has none.
    query = (
        sa.select(
            webhook_endpoints.c.id,
            webhook_endpoints.c.event_types,
            webhook_endpoints.c.all_responses,
            runs.c.background,
            runs.c.project,
        )
        .join(webhook_endpoints, webhook_endpoints.c.project == runs.c.project)
        .where(runs.c.response_id == response_id)
    )
    rows = list(await connection.execute(query))
    targets = [
        str(endpoint_id)
        for endpoint_id, types, all_responses, background, _project in rows
        if (background or all_responses) and event_type in json.loads(str(types))
    ]
    if not targets:
        return 0
    project = str(rows[0][4])
    now = time.time()
    event_id = "evt_" + secrets.token_hex(16)
    body = payload(event_id, event_type, response_id, int(now))
    await connection.execute(
        webhook_deliveries.insert(),
        [
            {
                "id": "msg_" + secrets.token_hex(16),
                "event_id": event_id,
                "endpoint_id": endpoint_id,
                "project": project,
                "response_id": response_id,
                "event_type": event_type,
                "payload": body,
                "status": PENDING,
                "attempts": 0,
                "created_at": now,
                "next_attempt_at": now,
                "owner": None,
                "lease_expires_at": None,
                "finished_at": None,
                "last_error": None,
            }
            for endpoint_id in targets
        ],
    )
    return len(targets)


async def delete_undelivered(connection: AsyncConnection, response_id: str) -> None:
    """A deleted response's pending rows (and their attempts) go with it; delivered/failed rows stay as history."""
    pending = sa.select(webhook_deliveries.c.id).where(
        webhook_deliveries.c.response_id == response_id, webhook_deliveries.c.status == PENDING
    )
    await connection.execute(sa.delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(pending)))
    await connection.execute(
        sa.delete(webhook_deliveries).where(
            webhook_deliveries.c.response_id == response_id, webhook_deliveries.c.status == PENDING
        )
    )
