"""schemathesis against the served OpenAPI schema: no 5xx, and every error in the one format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case

from catalog.loader import load_catalog
from scheduler.api import create_app
from scheduler.models import JobCreate, TeamCreate
from scheduler.service import ADMIN, SchedulerService
from scheduler.store import Store
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.server import serve

ADMIN_TOKEN = "admin-secret"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("schema")
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    store.migrate()
    service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp / "ckpt"), admin_token=ADMIN_TOKEN)
    service.create_team(ADMIN, TeamCreate(name="ml", budget_usd=1000, gpu_quota=64))
    token = service.create_token(ADMIN, "ml").token
    service.submit(service.authenticate(token), JobCreate(spec=spec_dict()))
    app = create_app(service, load_catalog())
    with serve(app) as url:
        yield url, token, app.openapi()
    store.dispose()


def one_error_format(response: Any) -> None:
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str), body
        assert set(body["error"]) <= {"code", "message", "path"}, body


def test_api_conforms(served: tuple[str, str, Any]) -> None:
    """Every operation, a few generated requests each (schemathesis' pytest plugin does not load
    under this pytest, so the operations are driven through their Hypothesis strategies)."""
    url, token, openapi = served
    schema = schemathesis.openapi.from_dict(openapi)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 15
    for operation in operations:
        admin = operation.path.startswith(("/v1/teams", "/metrics"))
        headers = {"Authorization": "Bearer " + (ADMIN_TOKEN if admin else token)}
        _checker(operation.as_strategy(), url, headers)()


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
