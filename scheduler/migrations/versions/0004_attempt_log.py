"""attempt_log: executor log lines kept in the database, readable from any API process

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("attempt_log",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("attempt_id", sa.Integer(), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("line", sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"], name=op.f("fk_attempt_log_attempt_id_attempt")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt_log")),
    sa.UniqueConstraint("attempt_id", "seq", name="uq_attempt_log_attempt_id_seq")
    )


def downgrade() -> None:
    op.drop_table("attempt_log")
