"""A scratch schema in the PostgreSQL at 127.0.0.1:5432 (database ``test``), for every test and benchmark
that needs a fresh PostgreSQL database: another schema is another gpuplan database."""

from __future__ import annotations

import os
import secrets

PG_URL = os.environ.get("GPUPLAN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def pg_reason() -> str | None:
    """None when PostgreSQL answers at 127.0.0.1:5432, else why it is skipped."""
    try:
        import psycopg

        with psycopg.connect(PG_URL.replace("+psycopg", ""), connect_timeout=2):
            return None
    except Exception as exc:
        return f"no PostgreSQL at 127.0.0.1:5432 db test ({type(exc).__name__}: {exc})"


def new_pg_schema(prefix: str = "gp") -> tuple[str, str]:
    """(schema, url) for a fresh schema, so parallel runs never share tables."""
    from sqlalchemy import create_engine, text

    schema = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    engine = create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    return schema, f"{PG_URL}?options=-csearch_path%3D{schema}"


def drop_pg_schema(schema: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()
