"""Conversations: their projections, and `conversation_messages` covering them as well as chains.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
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
    from service.store.schema import CONVERSATION_MESSAGES_VIEW_0001

    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.execute(CONVERSATION_MESSAGES_VIEW_0001)
    op.drop_table("conversation_entries")
    op.drop_table("conversations")
