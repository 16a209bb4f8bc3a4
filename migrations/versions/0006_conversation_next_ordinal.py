"""Conversations keep their items' high-water mark: `conversations.next_ordinal`.

One past the highest item ordinal the conversation ever used, deleted items included (ordinals are never
reused), kept by every append in its transaction, so an append reads one row instead of folding the
conversation's whole log. Existing rows are backfilled from their logs: the highest ordinal any
`conversation.created`/`conversation.items.added` event holds (a plain max over live entries would be
wrong when the last item was deleted).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

ADDING_EVENTS = ("conversation.created", "conversation.items.added")


def upgrade() -> None:
    op.add_column("conversations", sa.Column("next_ordinal", sa.Integer, nullable=False, server_default="0"))
    bind = op.get_bind()
    events = sa.table("events", sa.column("response_id"), sa.column("type"), sa.column("data"))
    conversations = sa.table("conversations", sa.column("id"), sa.column("next_ordinal"))
    high_water: dict[str, int] = {}
    # Conversation events are stored as sent (event_codec compacts only token deltas): plain JSON.
    rows = bind.execute(
        sa.select(events.c.response_id, events.c.data).where(
            events.c.response_id.like("conv\\_%", escape="\\"), events.c.type.in_(ADDING_EVENTS)
        )
    )
    for conversation_id, data in rows:
        ordinals = [entry["ordinal"] for entry in json.loads(data).get("entries", [])]
        if ordinals:
            high_water[conversation_id] = max(high_water.get(conversation_id, 0), max(ordinals) + 1)
    for conversation_id, next_ordinal in high_water.items():
        bind.execute(
            sa.update(conversations).where(conversations.c.id == conversation_id).values(next_ordinal=next_ordinal)
        )


def downgrade() -> None:
    # In place (SQLite 3.35+ and PostgreSQL): a batch copy of the table would trip over the
    # `conversation_messages` view that reads it.
    op.execute("ALTER TABLE conversations DROP COLUMN next_ordinal")
