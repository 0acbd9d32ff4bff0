"""attempt.metrics: each finished attempt's measured values next to its plan's prediction

Peak allocated and reserved memory, tokens/s, checkpoint save time and any OOM back-off, as
JSON. Attempts closed before this revision have none (NULL).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("metrics")
