"""Alembic environment: runs on the connection Store.migrate() passes in (or the ini's URL)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from scheduler.store.models import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `gpuplan server` or Store.migrate()")
run_migrations_online()
