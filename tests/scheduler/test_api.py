"""The REST API over a real uvicorn server on 127.0.0.1: auth, team isolation, one error format."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from catalog.loader import load_catalog
from scheduler.api import create_app
from scheduler.loop.scheduling import Scheduler
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import ScriptedExecutor
from tests.scheduler.server import serve
from workers.executors.protocol import RunState

ADMIN = "admin-secret"


@dataclass
class Api:
    url: str
    service: SchedulerService
    routes: list[tuple[str, str]]

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def team(self, name: str, **limits: Any) -> str:
        with self.client(ADMIN) as admin:
            assert admin.post("/v1/teams", json={"name": name, **limits}).status_code == 201
            created = admin.post(f"/v1/teams/{name}/tokens", json={"name": "ci"})
            assert created.status_code == 201
            return str(created.json()["token"])


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[Api]:
    service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt"), admin_token=ADMIN)
    app = create_app(service, load_catalog())
    routes = [(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops]
    with serve(app) as url:
        yield Api(url, service, routes)


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    assert set(body["error"]) <= {"code", "message", "path"}
    return dict(body["error"])


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_team_isolation_on_every_endpoint(api: Api) -> None:
    a, b = api.team("a"), api.team("b")
    with api.client(a) as ca, api.client(b) as cb:
        job = ca.post("/v1/jobs", json={"spec": spec_dict(tokens=3e6)})
        assert job.status_code == 201
        job_id = job.json()["id"]
        # Give team a some spend so its report is not trivially empty.
        ex = ScriptedExecutor()
        loop = Scheduler(api.service.store, ex)
        loop.tick()
        ex.finish(ex.handle_of(job_id), RunState.SUCCEEDED)
        loop.tick()
        assert ca.get("/v1/reports/spend").json()["jobs"][0]["job_id"] == job_id

        for method, path in [("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/logs"),
                             ("POST", f"/v1/jobs/{job_id}/cancel")]:
            assert_error(cb.request(method, path), 404, "not_found")
        assert cb.get("/v1/jobs").json() == []
        assert [j["id"] for j in ca.get("/v1/jobs").json()] == [job_id]
        b_report = cb.get("/v1/reports/spend").json()
        assert b_report["team"] == "b" and b_report["jobs"] == [] and b_report["total_usd"] == 0
        for method, path in [("GET", "/v1/reports/spend?team=a"), ("GET", "/v1/teams/a"), ("GET", "/v1/teams"),
                             ("PATCH", "/v1/teams/a"), ("POST", "/v1/teams"), ("GET", "/v1/teams/a/tokens"),
                             ("POST", "/v1/teams/a/tokens"), ("DELETE", "/v1/teams/a/tokens/1"), ("GET", "/metrics")]:
            body = {"budget_usd": 1} if method == "PATCH" else ({"name": "zz"} if path == "/v1/teams" else None)
            assert_error(cb.request(method, path, json=body), 403, "forbidden")
        assert cb.get("/v1/teams/me").json()["name"] == "b"
        assert ca.get(f"/v1/jobs/{job_id}/logs").json()["lines"]
        assert ca.get(f"/v1/jobs/{job_id}").json()["state"] == "succeeded"
    with api.client(ADMIN) as admin:
        metrics = admin.get("/metrics").text
        assert 'gpuplan_jobs{team="a",state="succeeded"} 1' in metrics and "gpuplan_spend_usd_total" in metrics
        assert admin.get("/v1/reports/spend", params={"team": "a"}).json()["jobs"][0]["job_id"] == job_id


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_missing_wrong_and_revoked_tokens_are_refused_everywhere(api: Api) -> None:
    token = api.team("a")
    with api.client(ADMIN) as admin:
        token_id = admin.get("/v1/teams/a/tokens").json()[0]["id"]
        with api.client(token) as live:
            assert live.get("/v1/jobs").status_code == 200
        assert admin.delete(f"/v1/teams/a/tokens/{token_id}").json()["revoked_at"]
    protected = [(m, p) for m, p in api.routes if p not in ("/healthz", "/openapi.json", "/docs", "/redoc")
                 and not p.startswith("/docs")]
    assert len(protected) >= 15
    for bad, needle in ((None, "missing bearer token"), ("gpt_wrong", "invalid token"), (token, "revoked")):
        with api.client(bad) as client:
            for method, path in protected:
                concrete = path.replace("{job_id}", "j-1").replace("{name}", "a").replace("{token_id}", "1")
                err = assert_error(client.request(method, concrete), 401, "unauthorized")
                assert needle in err["message"], (method, path, err)


def test_revoking_a_token_needs_the_team_that_owns_it(api: Api) -> None:
    ml_token, research_token = api.team("ml"), api.team("research")
    with api.client(ADMIN) as admin:
        [ml_id] = [t["id"] for t in admin.get("/v1/teams/ml/tokens").json()]
        [research_id] = [t["id"] for t in admin.get("/v1/teams/research/tokens").json()]
        err = assert_error(admin.delete(f"/v1/teams/nosuch/tokens/{ml_id}"), 404, "not_found")
        assert "team 'nosuch' does not exist" in err["message"] and "ml, research" in err["message"]
        err = assert_error(admin.delete(f"/v1/teams/ml/tokens/{research_id}"), 404, "not_found")
        assert f"team ml has no token {research_id}" in err["message"]
        assert all(t["revoked_at"] is None for name in ("ml", "research")
                   for t in admin.get(f"/v1/teams/{name}/tokens").json())
    for token in (ml_token, research_token):
        with api.client(token) as c:
            assert c.get("/v1/jobs").status_code == 200


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_team_name_outside_the_rule_is_refused_not_created(api: Api) -> None:
    with api.client(ADMIN) as admin:
        for name in ("a/b", "bad name!", "ML"):
            err = assert_error(admin.post("/v1/teams", json={"name": name}), 422, "invalid_input")
            assert err["path"] == "name" and err["message"].startswith(f"name: team name {name!r} is not valid: use")
        err = assert_error(admin.patch("/v1/teams/Bad!", json={"budget_usd": 1}), 422, "invalid_input")
        assert err["message"].startswith("team: team name 'Bad!' is not valid")
        assert admin.get("/v1/teams").json() == []


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_errors_share_one_format(api: Api) -> None:
    token = api.team("ml", budget_usd=5)
    with api.client(token) as c:
        assert_error(c.get("/v1/nope"), 404, "not_found")
        assert_error(c.delete("/v1/jobs"), 405, "method_not_allowed")
        err = assert_error(c.post("/v1/jobs", json={"spec": {"task": "train"}}), 422, "invalid_input")
        assert "model" in err["message"]
        err = assert_error(c.post("/v1/jobs", json={"spec": spec_dict(), "bogus": 1}), 422, "invalid_input")
        assert err["path"] == "bogus"
        err = assert_error(c.post("/v1/jobs", json={"spec": spec_dict(tokens=7.5e6)}), 402, "limit_exceeded")
        assert err["message"] == ("estimated $7.50 exceeds team ml's remaining budget $5.00 by $2.50; "
                                  "raise the budget or lower tokens")
        assert_error(c.get("/v1/reports/spend", params={"since": "soon"}), 422, "invalid_input")
        assert_error(c.get("/v1/catalog/offers", params={"gpu": "H1OO-XYZ"}), 422, "unknown_name")
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/v1/catalog/gpus").status_code == 200


def _spec_json(literal: str) -> str:
    """A job request whose spec's train.seed is ``literal`` verbatim (json.dumps cannot write 1e400)."""
    return json.dumps({"spec": spec_dict()}).replace('"train": {', f'"train": {{"seed": {literal}, ', 1)


# (method, URL, raw JSON body or None, admin?, path, message): issue 9's inputs, each with what it says.
HOSTILE = [
    ("GET", "/v1/jobs/%00", None, False, "job_id", "job_id: contains a NUL byte (U+0000) at character 1; remove it"),
    ("GET", "/v1/jobs/%ED%A0%80", None, False, None,
     "the URL's path is not UTF-8 once its %-escapes are decoded (byte 0xED); percent-encode text as UTF-8"),
    ("GET", "/v1/jobs/" + "j" * 10_000, None, False, "job_id",
     "job_id: is 10000 characters long; at most 32 are allowed"),
    ("GET", "/v1/jobs?state=queued%1B%5B2J", None, False, "state",
     "state: contains the control character U+001B at character 7; remove it"),
    ("GET", "/v1/jobs?limit=99999999999999999999999", None, False, "limit",
     "limit: Input should be less than or equal to 1000"),
    ("GET", "/v1/jobs/j-1/logs?since=1e400", None, False, "since",
     "since: Input should be a valid integer, unable to parse string as an integer"),
    ("POST", "/v1/jobs/j-1/cancel", '{"reason": "oops\\ud800"}', False, "reason",
     "reason: contains a lone surrogate (U+D800) at character 5, which is not Unicode; send UTF-8 text"),
    ("POST", "/v1/jobs", '{"priority": 1e400, "spec": {}}', False, "priority",
     "priority: Input should be a finite number"),
    ("POST", "/v1/jobs", _spec_json("99999999999999999999999"), False, "spec",
     "spec: train.seed is an integer of 23 digits; at most ±9223372036854775807 is allowed"),
    ("POST", "/v1/plans", _spec_json("1e400"), False, "spec",
     "spec: train.seed is not a finite number; write one such as 1e6"),
    ("POST", "/v1/jobs", '{"spec": {"name": "a\\u0000b"}}', False, "spec",
     "spec: name contains a NUL byte (U+0000) at character 2; remove it"),
    ("POST", "/v1/jobs", '{"priority": 1' + "0" * 5000 + ', "spec": {}}', False, "body",
     "body: holds a number with thousands of digits; no field takes one that long"),
    ("POST", "/v1/plans", '{"spec": {"name": "x"', False, "body",
     "body: not valid JSON (Expecting ',' delimiter at character 21)"),
    ("POST", "/v1/teams", '{"name": "a b"}', True, "name",
     "name: team name 'a b' is not valid: use 1 to 63 lowercase letters, digits, '-' or '_', starting with a "
     "letter or digit, e.g. 'a-b'"),
    ("GET", "/v1/teams/ml%00", None, True, "name", "name: contains a NUL byte (U+0000) at character 3; remove it"),
    ("DELETE", "/v1/teams/ml/tokens/2147483648", None, True, "token_id",
     "token_id: Input should be less than or equal to 2147483647"),
]


def test_hostile_inputs_are_refused_saying_what_was_wrong(api: Api) -> None:
    """On SQLite and PostgreSQL alike (a NUL reached psycopg and was a 500 there)."""
    token = api.team("ml")
    answers = []
    with api.client(token) as team, api.client(ADMIN) as admin:
        for method, url, body, as_admin, _, _ in HOSTILE:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            response = (admin if as_admin else team).request(method, url, content=body, headers=headers)
            err = assert_error(response, 422, "invalid_input")
            answers.append((url, err.get("path"), err["message"]))
        assert team.get("/v1/jobs").json() == []  # nothing got in
    assert answers == [(url, path, message) for _, url, _, _, path, message in HOSTILE]


_SUBMITTER = """
import sys, httpx
url, token, name = sys.argv[1:4]
ok = refused = 0
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + token}, timeout=60) as c:
    for i in range(6):
        spec = {"name": f"{name}-{i}", "task": "train", "model": "m", "train": {"tokens": 1e6},
                "resources": {"accelerators": ["H100:2"], "spot": "never"}}
        r = c.post("/v1/jobs", json={"spec": spec, "idempotency_key": f"{name}-{i}"})
        if r.status_code == 201: ok += 1
        elif r.status_code == 402 and r.json()["error"]["code"] == "limit_exceeded": refused += 1
        else: raise SystemExit(f"unexpected {r.status_code} {r.text}")
print(ok, refused)
"""


def test_concurrent_submits_from_separate_processes_respect_budget_and_quota(api: Api) -> None:
    # $1 and 2 GPUs per job: a $7 budget admits exactly 7 jobs to the queue (the 4-GPU quota
    # admits jobs to run, so it refuses none of them at submit).
    token = api.team("ml", budget_usd=7, gpu_quota=4)
    procs = [subprocess.Popen([sys.executable, "-c", _SUBMITTER, api.url, token, f"p{i}"],
                              stdout=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o[0]) for o in outs) == 7 and sum(int(o[1]) for o in outs) == 17
    with api.client(token) as c:
        me = c.get("/v1/teams/me").json()
        assert (me["gpus_in_use"], me["gpus_queued"]) == (0, 14) and len(c.get("/v1/jobs").json()) == 7
