"""baseline: teams, API tokens, jobs, attempts, events, spend

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("team",
    sa.Column("budget_usd", sa.Float(), nullable=True),
    sa.Column("gpu_quota", sa.Integer(), nullable=True),
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("name", sa.String(length=64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_team")),
    sa.UniqueConstraint("name", name=op.f("uq_team_name"))
    )
    op.create_table("api_token",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("team_id", sa.Integer(), nullable=False),
    sa.Column("name", sa.String(length=64), nullable=False),
    sa.Column("token_hash", sa.String(length=64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(["team_id"], ["team.id"], name=op.f("fk_api_token_team_id_team")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
    sa.UniqueConstraint("token_hash", name=op.f("uq_api_token_token_hash"))
    )
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_token_team_id"), ["team_id"], unique=False)

    op.create_table("job",
    sa.Column("priority", sa.Integer(), nullable=False),
    sa.Column("idempotency_key", sa.String(length=200), nullable=True),
    sa.Column("id", sa.String(length=32), nullable=False),
    sa.Column("team_id", sa.Integer(), nullable=False),
    sa.Column("name", sa.String(length=128), nullable=False),
    sa.Column("spec", sa.JSON(), nullable=False),
    sa.Column("spec_hash", sa.String(length=64), nullable=False),
    sa.Column("plan", sa.JSON(), nullable=False),
    sa.Column("state", sa.String(length=16), nullable=False),
    sa.Column("estimated_usd", sa.Float(), nullable=False),
    sa.Column("estimated_hours", sa.Float(), nullable=False),
    sa.Column("gpus", sa.Integer(), nullable=False),
    sa.Column("gpu", sa.String(length=64), nullable=False),
    sa.Column("market", sa.String(length=16), nullable=False),
    sa.Column("usd_per_h", sa.Float(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("checkpoint_uri", sa.String(length=1024), nullable=False),
    sa.Column("message", sa.String(length=2000), nullable=False),
    sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(["team_id"], ["team.id"], name=op.f("fk_job_team_id_team")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    sa.UniqueConstraint("team_id", "idempotency_key", name="uq_job_team_idempotency_key")
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_created_at"), ["created_at"], unique=False)
        batch_op.create_index("ix_job_state_next_run_at", ["state", "next_run_at"], unique=False)
        batch_op.create_index("ix_job_team_id_state", ["team_id", "state"], unique=False)

    op.create_table("attempt",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("number", sa.Integer(), nullable=False),
    sa.Column("handle", sa.String(length=256), nullable=True),
    sa.Column("market", sa.String(length=16), nullable=False),
    sa.Column("usd_per_h", sa.Float(), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("outcome", sa.String(length=16), nullable=True),
    sa.Column("message", sa.String(length=2000), nullable=False),
    sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_attempt_job_id_job")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_attempt")),
    sa.UniqueConstraint("job_id", "number", name="uq_attempt_job_id_number")
    )
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempt_ended_at"), ["ended_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_attempt_job_id"), ["job_id"], unique=False)

    op.create_table("event",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("from_state", sa.String(length=16), nullable=True),
    sa.Column("to_state", sa.String(length=16), nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("reason", sa.String(length=2000), nullable=False),
    sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_event_job_id_job")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_event"))
    )
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_event_job_id"), ["job_id"], unique=False)

    op.create_table("spend",
    sa.Column("id", sa.Integer(), nullable=False),
    sa.Column("team_id", sa.Integer(), nullable=False),
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("attempt_id", sa.Integer(), nullable=False),
    sa.Column("market", sa.String(length=16), nullable=False),
    sa.Column("usd_per_h", sa.Float(), nullable=False),
    sa.Column("hours", sa.Float(), nullable=False),
    sa.Column("usd", sa.Float(), nullable=False),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"], name=op.f("fk_spend_attempt_id_attempt")),
    sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_spend_job_id_job")),
    sa.ForeignKeyConstraint(["team_id"], ["team.id"], name=op.f("fk_spend_team_id_team")),
    sa.PrimaryKeyConstraint("id", name=op.f("pk_spend")),
    sa.UniqueConstraint("attempt_id", name=op.f("uq_spend_attempt_id"))
    )
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_spend_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_spend_recorded_at"), ["recorded_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_spend_team_id"), ["team_id"], unique=False)



def downgrade() -> None:
    with op.batch_alter_table("spend", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_spend_team_id"))
        batch_op.drop_index(batch_op.f("ix_spend_recorded_at"))
        batch_op.drop_index(batch_op.f("ix_spend_job_id"))

    op.drop_table("spend")
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_event_job_id"))

    op.drop_table("event")
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempt_job_id"))
        batch_op.drop_index(batch_op.f("ix_attempt_ended_at"))

    op.drop_table("attempt")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_team_id_state")
        batch_op.drop_index("ix_job_state_next_run_at")
        batch_op.drop_index(batch_op.f("ix_job_created_at"))

    op.drop_table("job")
    with op.batch_alter_table("api_token", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_token_team_id"))

    op.drop_table("api_token")
    op.drop_table("team")
