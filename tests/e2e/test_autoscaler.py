"""The whole cluster under Ray's real autoscaler, on this machine.

Ray's autoscaler runs the node types ``gpuplan cluster config`` generates for a plan (same names, the
(GPU, market, zone) resources, min/max workers, idle timeout; one CPU standing in for each GPU) through a
cloud-like local provider (tests.e2e.autoscale_provider): nodes are local processes it launches and
terminates, each with its own spot-notice watcher polling its own metadata endpoint. On it runs the real
head: ``gpuplan server --executor ray`` on PostgreSQL, checkpoints on moto's S3, restarted by a supervisor
when it dies. The scenarios run in order on one cluster, each waiting on events (a job held at a step, a
checkpoint in the bucket, a node in the provider's log), never on how fast something runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from planner.cost import JIT_MARGIN_S
from tests.e2e.autoscale_cluster import (
    ROOT,
    FakeImds,
    LocalAutoscaler,
    Supervisor,
    fake_imds,
    generated_node_types,
    local_autoscaler,
    local_node_types,
)
from tests.e2e.autoscale_reference import Uninterrupted
from tests.moto_server import REGION, TEST_CREDENTIALS, moto_s3, moto_server, use_moto
from tests.net import free_port
from tests.pg import drop_pg_schema, new_pg_schema, pg_reason
from tests.waits import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.whole_box,
              pytest.mark.skipif(pg_reason() is not None, reason=str(pg_reason()))]

ADMIN = "autoscale-admin"
BUCKET = "gpuplan-autoscale"
STEPS, INTERVAL = 24, 8
# Ray Train's own polls, every 2 s (its workers' health: how soon it sees a run end) and every 5 s (a node's
# drain: how soon a run hears of a spot notice), made 0.5 s as the autoscaler's own look is made 1 s: the
# server hands RAY_TRAIN_* from its environment to every attempt's controller and workers
RAY_TRAIN_POLLS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}


def spec(name: str, model: Path, spot: str = "auto") -> dict[str, Any]:
    """A Llama of 28 thousand parameters (``model``: tests.workers.tiny's config.json; tiny-llama's checkpoints
    are 60 MB, and every one goes through moto's S3 in this test's process) on one A100-40GB of a p4d: us-east-1
    prices it as spot in two zones and on demand."""
    return {"name": name, "task": "train", "model": {"config": str(model)},
            "train": {"tokens": STEPS * 4 * 32, "seq_len": 32, "micro_batch": 4, "checkpoint_interval_steps": INTERVAL,
                      "learning_rate": 5e-3, "seed": 0},
            "resources": {"clouds": ["aws"], "accelerators": ["A100-40GB:1"], "regions": ["us-east-1"],
                          "spot": spot}}


@dataclass
class Head:
    cluster: LocalAutoscaler
    imds: FakeImds
    server: Supervisor
    url: str
    db_url: str
    gates: Path
    s3: Any
    tokens: dict[str, str]
    types: list[str]  # the generated worker node types
    reference: Uninterrupted  # the jobs' model after an uninterrupted run in this process
    model: Path  # the jobs' config.json
    engine: Engine
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def api(self, team: str) -> httpx.Client:
        """The team's client, kept for the module: the waits below ask many times a second, and a connection of
        its own for each question was a good part of this test's own CPU."""
        if team not in self.clients:
            self.clients[team] = httpx.Client(base_url=self.url, timeout=60,
                                              headers={"Authorization": f"Bearer {self.tokens[team]}"})
        return self.clients[team]

    def spec(self, name: str, spot: str = "auto") -> dict[str, Any]:
        return spec(name, self.model, spot)

    def submit(self, team: str, body: dict[str, Any]) -> str:
        resp = self.api(team).post("/v1/jobs", json={"spec": body})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])

    def job(self, team: str, job_id: str) -> dict[str, Any]:
        resp = self.api(team).get(f"/v1/jobs/{job_id}")
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def logs(self, team: str, job_id: str) -> list[str]:
        return list(self.api(team).get(f"/v1/jobs/{job_id}/logs").json()["lines"])

    def cancel(self, team: str, job_id: str) -> None:
        assert self.api(team).post(f"/v1/jobs/{job_id}/cancel", json={}).status_code == 200

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.engine.dispose()

    def finished(self, team: str, job_id: str) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            try:
                job = self.job(team, job_id)
            except httpx.HTTPError:  # the server is restarting
                return None
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None
        try:
            return dict(wait_until(f"job {job_id} to finish", done))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log ends {self.logs(team, job_id)[-15:]}") from None

    def hold_next(self, step: int | None) -> None:
        """Hold every job without a hold of its own before ``step`` (None: no more)."""
        (self.gates / "default.hold").write_text("go" if step is None else str(step))

    def release(self, job_id: str) -> None:
        (self.gates / f"{job_id}.hold").write_text("go")

    def held_at(self, job_id: str, step: int) -> None:
        path = self.gates / f"{job_id}.held"
        wait_until(f"job {job_id} to hold at step {step}",
                   lambda: path.exists() and path.read_text() == str(step))

    def checkpoints(self, job_id: str) -> list[int]:
        """The steps of the job's committed checkpoints in the bucket."""
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{job_id}/")
        return sorted(int(o["Key"].split("/")[-2].split("-")[1]) for o in listed.get("Contents", [])
                      if o["Key"].endswith("/COMMIT"))

    def node_of(self, job_id: str) -> tuple[str, str]:
        """(node id, node type) of the node the job's open attempt runs on: the only node of the (GPU, market,
        zone) type its attempt was placed on (each planned type has max_workers: 1)."""
        [(market, zone)] = self.sql("SELECT market, zone FROM attempt WHERE job_id = :j AND ended_at IS NULL",
                                    j=job_id)
        kind = type_of(market, zone)
        [node] = [n for n, t in self.cluster.live().items() if t == kind]
        return node, kind

    def sql(self, query: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(text(query), params).all())


def _server(argv: list[str], env: dict[str, str], log: Path, port: int) -> Callable[[], subprocess.Popen[bytes]]:
    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(argv, cwd=ROOT, env={**env, "GPUPLAN_PORT_HINT": str(port)}, stdout=out,
                                    stderr=subprocess.STDOUT)
    return start


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    from catalog.loader import load_catalog
    from planner.spec import spec_from_dict
    from scheduler.composition import catalog_planner
    from tests.workers.tiny import write_config
    from workers.cluster.config import ClusterOptions

    work = tmp_path_factory.mktemp("autoscale")
    model = write_config(work / "model")
    # the server's own planner (it reads the model's config.json), so the node types are those of its plans
    planned = catalog_planner(load_catalog())(spec_from_dict(spec("plan", model)))
    assert planned.chosen is not None
    # the cluster the plan's config describes: the chosen spot zone, the region's other zone, on demand;
    # a short idle timeout (fractions of a minute are Ray's too) so scale-down is seen within the test
    generated = generated_node_types(planned, ClusterOptions(every_zone=True, idle_timeout_minutes=0.2,
                                                             source_dir=str(ROOT)))
    schema, db_url = new_pg_schema("autoscale")
    gates = work / "gates"
    gates.mkdir()
    with moto_server() as s3_url, fake_imds() as imds, pytest.MonkeyPatch.context() as mp:
        use_moto(mp, s3_url)  # this process reads the bucket's checkpoints too
        s3 = moto_s3(s3_url)
        s3.create_bucket(Bucket=BUCKET)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUPLAN_", "RAY_ADDRESS"))}
        env.update({"AWS_ENDPOINT_URL": s3_url, "AWS_DEFAULT_REGION": REGION, **TEST_CREDENTIALS,
                    "RAY_AUTH_MODE": "disabled",
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "e2e" / "autoscale_site"), str(ROOT)])})
        port = free_port()
        with local_autoscaler(local_node_types(generated), generated["idle_timeout_minutes"], work, free_port(),
                              imds.url, env) as cluster:
            api_port = free_port()
            server_env = {**env, "RAY_ADDRESS": cluster.address, "GPUPLAN_DATABASE_URL": db_url,
                          "GPUPLAN_HOME": str(work / "home"), "GPUPLAN_ADMIN_TOKEN": ADMIN, **RAY_TRAIN_POLLS}
            argv = [sys.executable, "-m", "tests.e2e.autoscale_server", str(gates), "--", "server", "--executor",
                    "ray", "--port", str(api_port), "--workers", "1", "--poll", "0.25", "--launch-timeout", "1",
                    "--checkpoint-root", f"s3://{BUCKET}/runs", "--ray-cluster-config", str(cluster.config_path)]
            supervisor = Supervisor(_server(argv, server_env, work / "server.log", port))
            url = f"http://127.0.0.1:{api_port}"
            try:
                wait_until("the server to answer", lambda: _healthy(url) or supervisor.restarts > 0)
                assert supervisor.restarts == 0, (work / "server.log").read_text()[-3000:]
                tokens = {}
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60) as admin:
                    for team in ("vision", "nlp"):
                        assert admin.post("/v1/teams", json={"name": team}).status_code == 201
                        tokens[team] = admin.post(f"/v1/teams/{team}/tokens", json={"name": "ci"}).json()["token"]
                strategy = planned.chosen.estimate.strategy.model_dump(mode="json")
                reference = Uninterrupted(spec("reference", model), strategy, work / "reference")
                head = Head(cluster, imds, supervisor, url, db_url, gates, s3, tokens, sorted(generated["types"]),
                            reference, model, create_engine(db_url))
                yield head
                head.close()
                reference.close()
            finally:
                supervisor.stop()
    drop_pg_schema(schema)


def type_of(market: str, zone: str) -> str:
    """The generated node type of an attempt's (market, zone): workers.cluster.config.node_type_name."""
    return f"p4d-24xlarge-{market}-{zone}"


def attempts(head: Head, job_id: str) -> list[Any]:
    return head.sql("SELECT number, market, zone, outcome, started_at, ended_at, last_seen_at FROM attempt "
                    "WHERE job_id = :j ORDER BY number", j=job_id)


def test_two_teams_run_side_by_side_on_exactly_the_planned_worker_type(head: Head) -> None:
    # one job on spot, one on demand: a worker that a spot node's resources would fit too must still get its own
    jobs = {"vision": head.submit("vision", head.spec("vision-a")),
            "nlp": head.submit("nlp", head.spec("nlp-a", spot="never"))}
    done = {team: head.finished(team, job) for team, job in jobs.items()}
    for team, job in done.items():
        assert job["state"] == "succeeded", head.logs(team, job["id"])[-20:]
        assert any(f"step {STEPS}/{STEPS}" in line for line in head.logs(team, job["id"]))
        assert STEPS in head.checkpoints(job["id"])
    placed = {type_of(a.market, a.zone) for job in jobs.values() for a in attempts(head, job)}
    assert {a.market for job in jobs.values() for a in attempts(head, job)} == {"spot", "on-demand"}
    launched = {e["type"] for e in head.cluster.events() if e["event"] == "launched"}
    assert launched == placed, (launched, placed)
    assert not [e for e in head.cluster.events() if e["event"] == "refused"]


def uninterrupted(head: Head, job: dict[str, Any]) -> dict[str, Any]:
    step, weights = head.reference.weights(job)
    assert step == STEPS
    return weights


def final_weights(job: dict[str, Any]) -> dict[str, Any]:
    from workers.checkpoint.local import open_store
    from workers.train.state_load import read_checkpoint_state

    found = read_checkpoint_state(open_store(job["checkpoint_uri"]))
    assert found is not None and found[0] == STEPS
    return found[1]


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_spot_notice_checkpoints_then_the_job_resumes_on_a_replacement_node(head: Head) -> None:
    head.hold_next(12)
    job_id = head.submit("vision", head.spec("noticed"))
    head.held_at(job_id, 12)
    node, kind = head.node_of(job_id)
    # The notice as the watcher reads it late in its two minutes (a full two would have the run train on
    # until just before the deadline): the node's watcher drains the node, the run checkpoints the step it is at.
    # Late by the workers' own margin (planner.cost.JIT_MARGIN_S, the least time they leave a just-in-time
    # checkpoint): sooner, Ray Train would end the workers at the deadline while a busy box is still writing it
    head.imds.notice(node, in_s=JIT_MARGIN_S)

    def saved_or_ended() -> str | None:
        saved = next((x for x in head.logs("vision", job_id) if "just-in-time checkpoint saved" in x), None)
        return saved or ("the job ended" if head.job("vision", job_id)["state"] in ("succeeded", "failed") else None)

    line = wait_until("the just-in-time checkpoint, or the job's end", saved_or_ended)
    assert "just-in-time checkpoint saved" in line, head.logs("vision", job_id)[-20:]
    jit = int(line.split("step ")[1].split(":")[0])
    assert jit >= 12
    wait_until(f"the checkpoint of step {jit} in the bucket", lambda: jit in head.checkpoints(job_id))
    head.release(job_id)
    head.cluster.reclaim([node])  # the notice's deadline: the cloud takes the node (if the autoscaler has not)
    job = head.finished("vision", job_id)
    lines = head.logs("vision", job_id)
    assert job["state"] == "succeeded", lines[-20:]
    assert any(f"resumed from the checkpoint of step {jit}" in x for x in lines), lines
    events = head.cluster.events()
    gone = next(i for i, e in enumerate(events) if e["event"] in ("reclaimed", "terminated") and e["id"] == node)
    assert [e["type"] for e in events[gone:] if e["event"] == "launched"][:1] == [kind]  # its replacement
    assert [(a.number, a.outcome) for a in attempts(head, job_id)] == [(1, "succeeded")]
    assert_same(final_weights(job), uninterrupted(head, job))


def test_a_node_lost_without_notice_resumes_from_the_last_periodic_checkpoint(head: Head) -> None:
    head.hold_next(12)
    job_id = head.submit("nlp", head.spec("vanished"))
    head.held_at(job_id, 12)
    wait_until("the periodic checkpoint of step 8", lambda: 8 in head.checkpoints(job_id))
    node, _ = head.node_of(job_id)
    head.cluster.reclaim([node])  # no notice: gone
    wait_until("the provider to take the node", lambda: node not in head.cluster.live())
    head.release(job_id)
    job = head.finished("nlp", job_id)
    lines = head.logs("nlp", job_id)
    assert job["state"] == "succeeded", lines[-20:]
    assert any("resumed from the checkpoint of step 8" in line for line in lines), lines
    assert [(a.number, a.outcome) for a in attempts(head, job_id)] == [(1, "succeeded")]
    assert_same(final_weights(job), uninterrupted(head, job))


def test_the_server_killed_9_is_restarted_and_no_job_is_lost_or_run_twice(head: Head) -> None:
    """The restarted server follows the attempt that ran on while it was down; one whose run died meanwhile (its
    driver ended) is closed as lost, billed to its last heartbeat (not to the restart), and its job requeued."""
    from scheduler.composition import ray_namespace_for

    head.hold_next(4)
    job_id, orphan = head.submit("vision", head.spec("survivor")), head.submit("nlp", head.spec("orphaned"))
    head.held_at(job_id, 4)
    head.held_at(orphan, 4)
    restarts = head.server.restarts
    with head.server.held():  # down until the orphan's run is gone
        head.server.proc.send_signal(signal.SIGKILL)
        head.server.proc.wait()
        down_at = datetime.now(UTC)
        [(handle,)] = head.sql("SELECT handle FROM attempt WHERE job_id = :j", j=orphan)
        head.cluster.kill_actor(handle, ray_namespace_for(head.db_url))
    wait_until("the supervisor to restart the server",
               lambda: head.server.restarts == restarts + 1 and _healthy(head.url))
    head.release(job_id)
    head.release(orphan)
    job = head.finished("vision", job_id)
    assert job["state"] == "succeeded", head.logs("vision", job_id)[-20:]
    assert [(a.number, a.outcome) for a in attempts(head, job_id)] == [(1, "succeeded")]
    lines = head.logs("vision", job_id)
    assert sum(f"step {STEPS}/{STEPS}" in line for line in lines) == 1
    requeued = any("attempt 1 lost" in x and "requeued" in x for x in head.logs("nlp", orphan))
    head.cancel("nlp", orphan)  # its run again is the notice scenarios' business
    wait_until("the loop to close the orphan's attempts", lambda: head.sql(
        "SELECT count(*) FROM attempt WHERE job_id = :j AND ended_at IS NULL", j=orphan) == [(0,)])
    lost = attempts(head, orphan)[0]
    assert lost.outcome == "lost" and requeued, head.logs("nlp", orphan)[-10:]
    assert lost.ended_at == lost.last_seen_at < down_at, lost


def test_refused_spot_launches_move_an_auto_job_down_its_planned_types_and_an_always_job_waits(head: Head) -> None:
    head.hold_next(None)
    spot = [t for t in head.types if "-spot-" in t]
    assert len(spot) == 2 and len(head.types) == 4  # two spot zones, on demand in each: the plan's placements
    # No spot capacity anywhere: no launch, and the spot nodes still up are taken back. It stays so for the rest
    # of the module: a run that died without withdrawing its request for nodes (the orphan above: Ray Train's
    # request outlives its controller by up to 180 s) would have the autoscaler start a spot node no job wants
    head.cluster.refuse(spot)
    head.cluster.reclaim([node for node, kind in head.cluster.live().items() if kind in spot])
    wait_until("the provider to take the spot nodes", lambda: not set(spot) & set(head.cluster.live().values()))
    since = len(head.cluster.events())
    auto = head.submit("vision", head.spec("fallback-auto"))
    always = head.submit("nlp", head.spec("fallback-always", spot="always"))
    moved = wait_until("the spot: auto job to move on demand, or to wait", lambda: next(
        (a for a in attempts(head, auto) if a.market == "on-demand"), None) or (
            "no other planned placement" in head.job("vision", auto)["message"] and "it waits"))
    assert moved != "it waits", head.logs("vision", auto)[-20:]
    waiting = wait_until("the spot: always job to wait with the reason", lambda: (
        lambda m: m if "InsufficientInstanceCapacity" in m and "no other planned placement" in m else None)(
            head.job("nlp", always)["message"]))
    assert head.job("nlp", always)["state"] == "running", waiting
    job = head.finished("vision", auto)
    lines = head.logs("vision", auto)
    assert job["state"] == "succeeded", lines[-20:]
    tried = [(a.market, a.zone, a.outcome) for a in attempts(head, auto)]
    # spot in a zone, then (if it started in the cheaper one) the other zone, then on demand
    assert [m for m, _, _ in tried][-1] == "on-demand" and {m for m, _, _ in tried[:-1]} == {"spot"}, tried
    assert len({z for m, z, _ in tried if m == "spot"}) == len(tried) - 1
    assert any("InsufficientInstanceCapacity" in x and "moves to" in x for x in lines), lines
    assert {a.market for a in attempts(head, always)} == {"spot"}
    launched = {e["type"] for e in head.cluster.events()[since:] if e["event"] == "launched"}
    assert launched <= {type_of("on-demand", tried[-1][1])}, launched  # none on spot
    head.cancel("nlp", always)
    assert head.finished("nlp", always)["state"] == "cancelled"
    wait_until("the loop to close the cancelled job's attempt", lambda: head.sql(
        "SELECT count(*) FROM attempt WHERE job_id = :j AND ended_at IS NULL", j=always) == [(0,)])


def test_idle_workers_scale_down_and_nothing_is_billed_while_no_job_runs(head: Head) -> None:
    head.hold_next(None)
    assert head.sql("SELECT count(*) FROM attempt WHERE ended_at IS NULL") == [(0,)]
    billed = head.sql("SELECT count(*), sum(usd) FROM spend")
    wait_until("the idle workers to be terminated", lambda: not head.cluster.live())
    terminated = [e for e in head.cluster.events() if e["event"] == "terminated"]
    assert terminated
    assert head.sql("SELECT count(*), sum(usd) FROM spend") == billed


def test_the_ledger_has_one_row_per_attempt_billed_to_the_attempts_end(head: Head) -> None:
    rows = head.sql("SELECT a.id, a.started_at, a.ended_at, s.hours, s.usd, a.usd_per_h, s.recorded_at "
                    "FROM attempt a LEFT JOIN spend s ON s.attempt_id = a.id")
    assert rows and len(rows) == head.sql("SELECT count(*) FROM spend")[0][0]
    lost = head.sql("SELECT ended_at, last_seen_at FROM attempt WHERE outcome = 'lost'")
    assert lost and all(ended == seen for ended, seen in lost)  # billed to the last heartbeat
    for _, started, ended, hours, usd, price, recorded in rows:
        assert ended is not None and recorded == ended
        assert hours == pytest.approx((ended - started).total_seconds() / 3600, abs=1e-9)
        assert usd == pytest.approx(hours * price)
