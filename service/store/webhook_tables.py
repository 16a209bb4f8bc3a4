"""The webhook tables (migration 0007). Names are a user interface, documented in docs/operations.md."""

from __future__ import annotations

import sqlalchemy as sa

from service.store.schema import Position, metadata

webhook_endpoints = sa.Table(
    "webhook_endpoints",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # we_…
    sa.Column("project", sa.String(128), nullable=False, index=True),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("event_types", sa.Text, nullable=False),  # JSON list
    sa.Column("all_responses", sa.Boolean, nullable=False),  # false: background responses only
    sa.Column("secret_sealed", sa.Text, nullable=False),
    sa.Column("secret_hint", sa.String(32), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # the webhook-id header, the same on every attempt
    sa.Column("event_id", sa.String(64), nullable=False),  # evt_…, the body's id
    sa.Column("endpoint_id", sa.String(64), nullable=False),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("response_id", sa.String(64), nullable=False, index=True),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),  # the exact body signed and sent
    sa.Column("status", sa.String(16), nullable=False),  # pending | delivered | failed
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("next_attempt_at", sa.Float, nullable=False),
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("lease_expires_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", Position, primary_key=True, autoincrement=True),
    sa.Column("delivery_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(128), nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("latency_seconds", sa.Float, nullable=False),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Index("ix_webhook_attempts_delivery", "delivery_id", "attempt"),
)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
