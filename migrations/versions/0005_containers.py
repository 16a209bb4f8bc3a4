"""Code-interpreter containers owned by a project.

`containers`: one row per container (`cntr_…`, minted by the server), its owner, name, idle expiry and,
for an `auto` container, the response that made it. Its files live under SERVICE_SANDBOX_DIR.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "containers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_active_at", sa.Float, nullable=False),
        sa.Column("expires_after_minutes", sa.Integer, nullable=False),
        sa.Column("response_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
    )
    op.create_index("ix_containers_response_id", "containers", ["response_id"])
    op.create_index("ix_containers_project_created", "containers", ["project", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_containers_project_created", table_name="containers")
    op.drop_index("ix_containers_response_id", table_name="containers")
    op.drop_table("containers")
