"""report indexes: spend (team_id, recorded_at, job_id, market, usd, hours); job (team_id, id, gpu)

The spend index replaces (team_id, recorded_at): the same filter first, then every column the spend
report, the dashboard's Spend page and a team's figures sum or group by, so they read the index
alone (PostgreSQL: an index-only scan once the table is vacuumed; SQLite: a covering index)
instead of one table row per spend row. The job index gives spend by GPU type its join without
reading the jobs' wide rows (spec and plan JSON). bench/service/ui_pages.py,
docs/lab-notes/2026-12-01-dashboard-pages.md.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SPEND_COLUMNS = ["team_id", "recorded_at", "job_id", "market", "usd", "hours"]


def upgrade() -> None:
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.create_index("ix_spend_team_time_cover", SPEND_COLUMNS, unique=False)
        batch_op.drop_index("ix_spend_team_id_recorded_at")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index("ix_job_team_id_id_gpu", ["team_id", "id", "gpu"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_team_id_id_gpu")
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.create_index("ix_spend_team_id_recorded_at", ["team_id", "recorded_at"], unique=False)
        batch_op.drop_index("ix_spend_team_time_cover")
