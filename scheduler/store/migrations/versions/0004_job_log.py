"""job_log: each job's log as one append-only stream of lines, readable from any API process

The state changes recorded so far become each job's first lines, so an upgraded server shows
the same history.

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
    op.create_table("job_log",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("attempt_id", sa.Integer(), nullable=True),
    sa.Column("line", sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"], name=op.f("fk_job_log_attempt_id_attempt")),
    sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_job_log_job_id_job")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_job_log")),
    sa.UniqueConstraint("job_id", "seq", name="uq_job_log_job_id_seq")
    )
    with op.batch_alter_table("job_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_log_attempt_id"), ["attempt_id"], unique=False)
    _backfill_events()


def _backfill_events() -> None:
    from scheduler.store.logbook import event_line
    from scheduler.store.models import UTCDateTime

    bind = op.get_bind()
    event = sa.table("event", sa.column("id", sa.Integer()), sa.column("job_id", sa.String()),
                     sa.column("from_state", sa.String()), sa.column("to_state", sa.String()),
                     sa.column("at", UTCDateTime()), sa.column("reason", sa.String()))
    job_log = sa.table("job_log", sa.column("job_id", sa.String()), sa.column("seq", sa.Integer()),
                       sa.column("line", sa.Text()))
    rows = bind.execute(sa.select(event.c.job_id, event.c.from_state, event.c.to_state, event.c.at, event.c.reason)
                        .order_by(event.c.job_id, event.c.id)).all()
    batch: list[dict[str, object]] = []
    seq: dict[str, int] = {}
    for job_id, from_state, to_state, at, reason in rows:
        n = seq.get(job_id, 0)
        seq[job_id] = n + 1
        batch.append({"job_id": job_id, "seq": n, "line": event_line(at, from_state, to_state, reason)})
        if len(batch) >= 5000:
            bind.execute(sa.insert(job_log), batch)
            batch = []
    if batch:
        bind.execute(sa.insert(job_log), batch)


def downgrade() -> None:
    with op.batch_alter_table("job_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_log_attempt_id"))
    op.drop_table("job_log")
