"""Compaction state and the stored server key.

`compactions`: what a `POST /v1/responses/compact` (or `context_management`) kept, per project;
a `compaction` item's `encrypted_content` is an HMAC'd reference to one row. `server_keys`: random
keys created once, here, so every replica and every restart shares them when SERVICE_SECRET_KEY is
unset (the service creates the row itself if it is missing).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import secrets
import time

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compactions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_index("ix_compactions_created_at", "compactions", ["created_at"])
    keys = op.create_table(
        "server_keys",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.bulk_insert(keys, [{"name": "compaction", "key": secrets.token_hex(32), "created_at": time.time()}])


def downgrade() -> None:
    op.drop_table("server_keys")
    op.drop_index("ix_compactions_created_at", table_name="compactions")
    op.drop_table("compactions")
