"""Each database's server gets its own Ray namespace, so servers can share one Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.composition import make_executor, ray_namespace_for
from workers.executors.ray_executor import RayExecutor


def test_the_namespace_follows_the_database_not_its_password_or_driver(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pg = ray_namespace_for("postgresql://gpuplan:s3cret@db:5432/gpuplan")
    assert pg.startswith("gpuplan-") and len(pg) == len("gpuplan-") + 8
    assert ray_namespace_for("postgresql://gpuplan:rotated@db:5432/gpuplan") == pg
    assert ray_namespace_for("postgres://gpuplan:s3cret@db:5432/gpuplan") == pg
    assert ray_namespace_for("postgresql+psycopg://gpuplan@db:5432/gpuplan") == pg
    assert ray_namespace_for("postgresql://gpuplan@db/gpuplan") == pg  # the default port
    assert ray_namespace_for("postgresql://gpuplan@db:5432/other") != pg
    assert ray_namespace_for("postgresql://gpuplan@db2:5432/gpuplan") != pg
    schema_a = ray_namespace_for("postgresql://gpuplan@db/gpuplan?options=-csearch_path%3Da")
    assert schema_a != pg and schema_a != ray_namespace_for("postgresql://gpuplan@db/gpuplan?options=-csearch_path%3Db")
    assert schema_a == ray_namespace_for("postgres://gpuplan:pw@db:5432/gpuplan?options=-csearch_path%3Da")
    # The same SQLite file by a relative and an absolute path is one database.
    monkeypatch.chdir(tmp_path)
    assert ray_namespace_for("sqlite:///gpuplan.db") == ray_namespace_for(f"sqlite:///{tmp_path / 'gpuplan.db'}")
    assert ray_namespace_for("sqlite:///a.db") != ray_namespace_for("sqlite:///b.db")


def test_the_ray_executor_takes_the_namespace() -> None:
    executor = make_executor("ray", ray_namespace="gpuplan-team-a")
    assert isinstance(executor, RayExecutor) and executor.namespace == "gpuplan-team-a"
    default = make_executor("ray")
    assert isinstance(default, RayExecutor) and default.namespace == "gpuplan"
