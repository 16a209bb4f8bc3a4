"""The event log, run facts, run leases, and the response/conversation projections.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

CONVERSATION_MESSAGES_VIEW_0001 = """
CREATE VIEW conversation_messages AS
SELECT c.response_id AS conversation_id,
       (SELECT MAX(c2.depth) FROM response_chain c2 WHERE c2.response_id = c.response_id) - c.depth AS turn,
       i.response_id, i.ordinal, i.source, i.type, i.role, i.text, i.item_id
FROM response_chain c JOIN conversation_items i ON i.response_id = c.ancestor_id
"""


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", Position, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.String(64), nullable=False),
        sa.Column("sequence_number", sa.Integer, nullable=False),
        sa.Column("type", sa.String(80), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("response_id", "sequence_number", name="uq_events_response_sequence"),
    )
    op.create_table(
        "run_facts",
        sa.Column("position", Position, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_run_facts_response_id", "run_facts", ["response_id"])
    op.create_table(
        "runs",
        sa.Column("response_id", sa.String(64), primary_key=True),
        sa.Column("background", sa.Boolean, nullable=False),
        sa.Column("done", sa.Boolean, nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.Float, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("claims", sa.Integer, nullable=False),
        sa.Column("enqueued_at", sa.Float, nullable=False),
    )
    op.create_index("ix_runs_claimable", "runs", ["done", "enqueued_at"])
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("completed_at", sa.Float, nullable=True),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("background", sa.Boolean, nullable=False),
        sa.Column("store", sa.Boolean, nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=True),
        sa.Column("output_tokens", sa.Integer, nullable=True),
        sa.Column("response", sa.Text, nullable=False),
        sa.Column("last_position", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_responses_previous_response_id", "responses", ["previous_response_id"])
    op.create_table(
        "conversation_items",
        sa.Column("response_id", sa.String(64), primary_key=True),
        sa.Column("ordinal", sa.Integer, primary_key=True),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("item_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("text", sa.Text, nullable=True),
        sa.Column("data", sa.Text, nullable=False),
    )
    # Views are part of the SQL interface; their text lives with the schema (later revisions redefine
    # conversation_messages: the version created here is kept with this revision).
    from service.store.schema import RESPONSE_CHAIN_VIEW

    op.execute(RESPONSE_CHAIN_VIEW)
    op.execute(CONVERSATION_MESSAGES_VIEW_0001)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.execute("DROP VIEW IF EXISTS response_chain")
    for table in ("conversation_items", "responses", "runs", "run_facts", "events"):
        op.drop_table(table)
