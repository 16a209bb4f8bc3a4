"""Conversations: their projections, and `conversation_messages` covering them as well as chains.

Conversations belong to a project (existing rows: the default project), and the view exposes it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

DEFAULT_PROJECT = "default"


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("last_position", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "conversation_entries",
        sa.Column("conversation_id", sa.String(64), primary_key=True),
        sa.Column("ordinal", sa.Integer, primary_key=True),
        sa.Column("item_id", sa.String(64), nullable=False),
        sa.Column("response_id", sa.String(64), nullable=True),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("text", sa.Text, nullable=True),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_index("ix_conversation_entries_item", "conversation_entries", ["conversation_id", "item_id"])
    from service.store.schema import CONVERSATION_MESSAGES_VIEW

    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.execute(CONVERSATION_MESSAGES_VIEW)


def downgrade() -> None:
    from service.store.schema import CONVERSATION_MESSAGES_VIEW_0002

    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.execute(CONVERSATION_MESSAGES_VIEW_0002)
    op.drop_table("conversation_entries")
    op.drop_table("conversations")
