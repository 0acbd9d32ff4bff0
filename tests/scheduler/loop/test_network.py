"""``status`` of a multi-node job whose NCCL ran over TCP sockets where its plan priced EFA: a warning, with
the plan's speed on the link it really had (the real planner, given that link as a value)."""

from __future__ import annotations

from pathlib import Path

from catalog.loader import load_catalog
from commands.specfile import load_spec
from planner.calibration import load_calibration
from planner.plan_record import planned_run
from planner.search import plan
from planner.spec import JobSpec, spec_from_dict
from planner.types import Plan
from scheduler.loop.network_status import planner_relink
from scheduler.loop.scheduling import Scheduler
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate
from tests.scheduler.conftest import ml_team, spec_dict, toy_plan
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.cluster.nccl_net import network_line
from workers.executors.protocol import RunState

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _two_nodes(spec: JobSpec) -> Plan:
    """toy_plan's job on two 8-GPU nodes priced at 3,200 Gbit/s (EFA)."""
    p = toy_plan(spec)
    assert p.chosen is not None
    chosen = p.chosen.model_copy(update={"nodes": 2, "offer": p.chosen.offer.model_copy(update={
        "network_gbps": 3200.0, "gpu_count": 8})})
    return p.model_copy(update={"chosen": chosen, "candidates": [chosen]})


def test_status_warns_when_nccl_ran_on_sockets(store: Store, tmp_path: Path, clock: FakeClock) -> None:
    relinked: list[float] = []

    def relink(spec: object, stored: object, gbps: float) -> float:
        relinked.append(gbps)
        return 310.0

    svc = SchedulerService(store, _two_nodes, clock=clock, checkpoint_root=str(tmp_path / "ck"), relink=relink)
    ml = ml_team(svc)
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    sockets = svc.submit(ml, JobCreate(spec=spec_dict(gpus=16, name="sockets")))
    efa = svc.submit(ml, JobCreate(spec=spec_dict(gpus=16, name="efa")))
    loop.tick()
    clock.advance(hours=1)
    ex.finish(ex.handle_of(sockets.id), RunState.SUCCEEDED, {"nccl_link_gbps": 100.0, "nccl_on_sockets": 1.0})
    ex.finish(ex.handle_of(efa.id), RunState.SUCCEEDED, {"nccl_link_gbps": 3200.0, "nccl_on_sockets": 0.0})
    loop.tick()
    [said] = svc.status(ml, sockets.id).warnings
    assert "TCP sockets (100 Gbit/s)" in said and "3200 Gbit/s the plan priced" in said
    assert "310 tokens/s, not 1,000" in said and relinked == [100.0]
    assert svc.status(ml, efa.id).warnings == []
    assert svc.status(ml, sockets.id).model_dump()["warnings"] == [said]  # what `status --json` and the API say


def test_a_running_attempt_is_warned_about_from_its_log_line(store: Store, tmp_path: Path, clock: FakeClock) -> None:
    """Before the attempt ends (and its metrics are kept), the run's own line, copied to the job's log by the
    loop, already says NCCL chose sockets."""

    class Logging(ScriptedExecutor):
        def logs(self, handle: str, since: int = 0) -> list[str]:
            return ["step 1/100 loss 2.3", network_line(["socket"], 100.0)][since:]

    svc = SchedulerService(store, _two_nodes, clock=clock, checkpoint_root=str(tmp_path / "ck"),
                           relink=lambda spec, stored, gbps: 250.0)
    ml = ml_team(svc)
    ex = Logging()
    loop = Scheduler(store, ex, clock=clock)
    job = svc.submit(ml, JobCreate(spec=spec_dict(gpus=16, name="sockets")))
    loop.tick()
    clock.advance(minutes=5)
    loop.tick()  # copies the running attempt's lines
    detail = svc.status(ml, job.id)
    assert detail.state == "running"
    [said] = detail.warnings
    assert said.startswith("attempt 1: NCCL ran over TCP sockets (100 Gbit/s)") and "250 tokens/s" in said


def test_the_planner_prices_the_plan_again_at_the_real_link() -> None:
    doc = load_spec(str(EXAMPLES / "llama3-8b-sft.yaml")).model_dump(mode="json", exclude_none=True)
    doc["resources"] = {**doc.get("resources", {}), "clouds": ["aws"], "accelerators": ["A100-40GB:16"],
                        "regions": ["us-east-1"]}
    spec = spec_from_dict(doc)
    cal = load_calibration()
    catalog = load_catalog()
    p = plan(spec, catalog, calibration=cal)
    assert p.chosen is not None and p.chosen.nodes == 2
    stored = planned_run(p)
    planned = p.chosen.estimate.throughput.tokens_per_s
    relink = planner_relink(catalog, cal)
    slow = relink(doc, stored, 25.0)
    assert slow is not None and slow < planned
    same = relink(doc, stored, p.chosen.offer.network_gbps)
    assert same is not None and abs(same - planned) / planned < 0.01
