"""spend_day: spend summed per team, UTC day, GPU type and market, filled from the spend rows so far

The spend reports, the dashboard's Spend page (per day or week, by GPU type and market, the
budget burn-down) and a team's figures read whole days from this summary instead of summing every
spend row; the ledger adds each new Spend row to it in the same transaction (scheduler/store/ledger.py).
The GPU type is the job's (the column the Spend page's chart joined the job for). bench/service/ui_pages.py,
docs/lab-notes/2026-12-01-dashboard-pages.md.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("spend_day",
    sa.Column("team_id", sa.Integer(), nullable=False),
    sa.Column("day", sa.Date(), nullable=False),
    sa.Column("gpu", sa.String(length=64), nullable=False),
    sa.Column("market", sa.String(length=16), nullable=False),
    sa.Column("usd", sa.Float(), nullable=False),
    sa.Column("hours", sa.Float(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(["team_id"], ["team.id"], name=op.f("fk_spend_day_team_id_team")),
    sa.PrimaryKeyConstraint("team_id", "day", "gpu", "market", name=op.f("pk_spend_day")),
    )
    with op.batch_alter_table("spend_day", schema=None) as batch_op:
        batch_op.create_index("ix_spend_day_day", ["day"], unique=False)
    _backfill()


def _backfill() -> None:
    """One grouped INSERT ... SELECT over the ledger (the table is new: nothing to merge with). On
    PostgreSQL the migration runs in one transaction under the migration lock (Store.migrate)."""
    bind = op.get_bind()
    # PostgreSQL: the session's time zone must not move a row to another day; SQLite stores naive UTC text
    day = "date(timezone('UTC', spend.recorded_at))" if bind.dialect.name == "postgresql" else "date(spend.recorded_at)"
    bind.execute(sa.text(
        "INSERT INTO spend_day (team_id, day, gpu, market, usd, hours, attempts) "
        f"SELECT spend.team_id, {day}, job.gpu, spend.market, sum(spend.usd), sum(spend.hours), count(*) "
        "FROM spend JOIN job ON job.id = spend.job_id "
        f"GROUP BY spend.team_id, {day}, job.gpu, spend.market"))


def downgrade() -> None:
    with op.batch_alter_table("spend_day", schema=None) as batch_op:
        batch_op.drop_index("ix_spend_day_day")
    op.drop_table("spend_day")
