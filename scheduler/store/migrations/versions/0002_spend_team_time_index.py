"""spend report index: (team_id, recorded_at), the report's filter

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.create_index("ix_spend_team_id_recorded_at", ["team_id", "recorded_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.drop_index("ix_spend_team_id_recorded_at")
