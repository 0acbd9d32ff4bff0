"""schemathesis against the served OpenAPI schema, then every hostile input (tests.scheduler.hostile)
in every parameter and field: no 5xx on SQLite or PostgreSQL, and every error in the one format."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case

from catalog.loader import load_catalog
from scheduler.api import create_app
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, TeamCreate
from tests.pg import drop_pg_schema, new_pg_schema, pg_reason
from tests.scheduler import hostile
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.server import serve

ADMIN_TOKEN = "admin-secret"


@dataclass
class Served:
    url: str
    token: str
    openapi: dict[str, Any]
    job_id: str


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp: Path = tmp_path_factory.mktemp("schema")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'db.sqlite'}"
    elif reason := pg_reason():
        pytest.skip(reason)
    else:
        schema, url = new_pg_schema()
    store = Store(url)
    try:
        store.migrate()
        service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp / "ckpt"), admin_token=ADMIN_TOKEN)
        service.create_team(ADMIN, TeamCreate(name="ml", budget_usd=1000, gpu_quota=64))
        token = service.create_token(ADMIN, "ml").token
        job = service.submit(service.authenticate(token), JobCreate(spec=spec_dict()))
        app = create_app(service, load_catalog())
        with serve(app) as base:
            yield Served(base, token, app.openapi(), job.id)
    finally:
        store.dispose()
        if schema:
            drop_pg_schema(schema)


def one_error_format(response: Any) -> None:
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str), body
        assert set(body["error"]) <= {"code", "message", "path"}, body


def test_api_conforms(served: Served) -> None:
    """Every operation, a few generated requests each (schemathesis' pytest plugin does not load
    under this pytest, so the operations are driven through their Hypothesis strategies)."""
    schema = schemathesis.openapi.from_dict(served.openapi)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 15
    for operation in operations:
        admin = operation.path.startswith(("/v1/teams", "/metrics"))
        headers = {"Authorization": "Bearer " + (ADMIN_TOKEN if admin else served.token)}
        _checker(operation.as_strategy(), served.url, headers)()


# A valid body for each operation that takes one; the probes change one field at a time.
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/jobs"): {"spec": spec_dict(), "idempotency_key": "hostile"},
    ("POST", "/v1/plans"): {"spec": spec_dict()},
    ("POST", "/v1/jobs/{job_id}/cancel"): {"reason": "no longer needed"},
    ("POST", "/v1/teams"): {"name": "other", "budget_usd": 10, "gpu_quota": 8},
    ("PATCH", "/v1/teams/{name}"): {"budget_usd": 1000},
    ("POST", "/v1/teams/{name}/tokens"): {"name": "ci"},
}


def test_hostile_inputs_in_every_parameter_and_field_answer_4xx(served: Served) -> None:
    """NUL, lone surrogates, control characters, 10k characters and over-long numbers, in each
    path and query parameter, top-level field and job spec field, one at a time."""
    outcome = hostile.check(served.url, served.openapi, token=served.token, admin_token=ADMIN_TOKEN,
                            path_values={"job_id": served.job_id, "name": "ml", "token_id": "999999"},
                            bodies=BODIES)
    assert outcome.sent > 900
    assert outcome.problems == []


def _checker(strategy: Any, url: str, headers: dict[str, str]) -> Any:
    @given(case=strategy)
    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Case[Any]) -> None:
        response = case.call(base_url=url, headers=headers)
        assert response.status_code < 500, (case.method, case.formatted_path, response.text)
        one_error_format(response)
        if response.status_code < 400:
            case.validate_response(response)

    return check
