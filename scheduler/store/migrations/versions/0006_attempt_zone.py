"""attempt.zone: the zone an attempt was placed in (the spot policy's zone, else the plan's)

The loop needs it to tell which zone a preemption happened in (the zone feed) and to move a running
attempt to another zone (a changeover). Attempts started before this revision have none (NULL).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("zone", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("zone")
