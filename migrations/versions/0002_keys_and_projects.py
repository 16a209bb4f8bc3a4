"""API keys, and the project that owns each response and run.

Existing rows belong to the default project (the project of SERVICE_API_KEY). The view
`conversation_messages` gains the owner's `project` column.

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

DEFAULT_PROJECT = "default"

_MESSAGES_V1 = """
CREATE VIEW conversation_messages AS
SELECT c.response_id AS conversation_id,
       (SELECT MAX(c2.depth) FROM response_chain c2 WHERE c2.response_id = c.response_id) - c.depth AS turn,
       i.response_id, i.ordinal, i.source, i.type, i.role, i.text, i.item_id
FROM response_chain c JOIN conversation_items i ON i.response_id = c.ancestor_id
"""


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_used_at", sa.Float, nullable=True),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.add_column("responses", sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT))
    op.add_column("runs", sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT))
    op.create_index("ix_runs_project_done", "runs", ["project", "done"])
    from service.store.schema import CONVERSATION_MESSAGES_VIEW_0002

    op.execute(CONVERSATION_MESSAGES_VIEW_0002)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS conversation_messages")
    op.execute("DROP VIEW IF EXISTS response_chain")
    op.drop_index("ix_runs_project_done", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("project")
    with op.batch_alter_table("responses") as batch:
        batch.drop_column("project")
    op.drop_table("api_keys")
    from service.store.schema import RESPONSE_CHAIN_VIEW

    op.execute(RESPONSE_CHAIN_VIEW)
    op.execute(_MESSAGES_V1)
