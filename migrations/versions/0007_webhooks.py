"""Webhooks: endpoints, the outbox of deliveries, and every delivery attempt.

`webhook_endpoints`: one row per endpoint (`we_…`), its project, URL, event types, whether it hears every
response or only background ones, and its signing secret sealed (AES-GCM, never stored in the clear).
`webhook_deliveries`: the outbox, one row per (terminal event, endpoint), written in the terminal event's
transaction; `id` is the `webhook-id` every attempt sends; a delivery worker leases rows like runs.
`webhook_attempts`: one row per POST (status code, latency, error) for SQL inspection.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event_types", sa.Text, nullable=False),
        sa.Column("all_responses", sa.Boolean, nullable=False),
        sa.Column("secret_sealed", sa.Text, nullable=False),
        sa.Column("secret_hint", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_webhook_endpoints_project", "webhook_endpoints", ["project"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("endpoint_id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("response_id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_response_id", "webhook_deliveries", ["response_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(128), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("latency_seconds", sa.Float, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    op.create_index("ix_webhook_attempts_delivery", "webhook_attempts", ["delivery_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_webhook_attempts_delivery", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_response_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_endpoints_project", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
