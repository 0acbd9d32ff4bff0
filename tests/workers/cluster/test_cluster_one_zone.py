"""A multi-node job stays inside one zone and one placement group, wherever the scheduler places it.

For two-node plans whose region offers their GPU on more than one instance type and whose offers may be
regional (no zone priced), every placement a job's attempts can get (the plan's own, and each one
scheduler.loop.fallback moves a waiting job to: another zone, then on demand) is turned into the request the loop
builds (``scheduler.loop.dispatch.run_request``) and the Ray executor runs (``RayExecutor.pinned``); each worker's
resources, fed to the generated cluster config and to Ray's own autoscaler, fit exactly one worker type: one subnet, at
most one placement group, enough workers for every node of the run.

- 16 x H100 in us-east-1: two p5.48xlarge (spot in two zones, on demand), and p5.4xlarge on demand, a
  regional offer of the same GPU (one type per zone would carry the same GPU, market and zone resources);
- 8 x L40S in us-east-1: two g6e.12xlarge, a regional on-demand offer only (a run that asks for no zone fits
  a worker type in every zone that offers g6e).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.autoscaler._private.resource_demand_scheduler import _fits

from catalog.loader import load_catalog
from commands.specfile import load_spec
from planner.plan_record import planned_run
from planner.search import plan
from planner.spec import spec_from_dict
from planner.types import Plan
from scheduler.loop.dispatch import run_request
from scheduler.loop.fallback import planned_placements
from scheduler.store.models import Job
from scheduler.store.states import JobState
from tests.workers.cluster.test_cluster import _bundles, _ray_v2_picks
from tests.workers.cluster_setup import CAL, EXAMPLES, generate, options, subnets_of
from workers.executors.cluster_fit import ZONE_PREFIX
from workers.executors.ray_executor import RayExecutor, autoscaler_node_types

PLANS = {"h100": ["H100-SXM:16"], "l40s": ["L40S:8"]}


@pytest.fixture(scope="module")
def two_node_plans() -> dict[str, tuple[Plan, Job]]:
    """Name -> (plan, the job row the service stores for it: its leading candidates as "alternatives")."""
    out = {}
    for name, accelerators in PLANS.items():
        doc = load_spec(str(EXAMPLES / "llama3-8b-sft.yaml")).model_dump(mode="json", exclude_none=True)
        doc["resources"] = {**doc.get("resources", {}), "clouds": ["aws"], "accelerators": accelerators,
                            "regions": ["us-east-1"]}
        spec = spec_from_dict(doc)
        p = plan(spec, load_catalog(), calibration=CAL)
        assert p.chosen is not None and p.chosen.nodes == 2, (name, p.chosen)
        stored = planned_run(p)  # as the service stores it: the leading candidates as alternatives
        out[name] = p, Job(id="j-1", team_id=1, name="t", spec=spec.model_dump(mode="json"), spec_hash="h",
                           plan=stored, state=JobState.RUNNING, checkpoint_uri="s3://b/j-1")
    return out


def test_the_plans_have_what_could_split_a_run(aws: Any, two_node_plans: dict[str, tuple[Plan, Job]]) -> None:
    """The situations the test below guards against are in these plans' configs, not assumed."""
    h100, _ = generate(aws, two_node_plans["h100"][0], options(efa="all"))
    instance = {t["node_config"]["InstanceType"] for t in h100["available_node_types"].values()}
    assert {"p5.48xlarge", "p5.4xlarge"} <= instance
    l40s = two_node_plans["l40s"][0].chosen
    assert l40s is not None and l40s.offer.zone is None and l40s.cost.market == "on-demand"
    config, _ = generate(aws, two_node_plans["l40s"][0], options())
    zones = {t["labels"]["gpuplan/zone"] for k, t in config["available_node_types"].items() if k != "head"}
    assert len(zones) > 1, zones


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("every_zone", [False, True])
def test_every_node_of_an_attempt_comes_from_one_worker_type(aws: Any, two_node_plans: dict[str, tuple[Plan, Job]],
                                                            name: str, every_zone: bool, tmp_path: Path) -> None:
    p, job = two_node_plans[name]
    assert p.chosen is not None
    config, text = generate(aws, p, options(efa="all", every_zone=every_zone))
    (tmp_path / "c.yaml").write_text(text)
    node_types = autoscaler_node_types(tmp_path / "c.yaml")
    executor = RayExecutor(node_types=node_types)
    workers = {k: t for k, t in config["available_node_types"].items() if k != "head"}
    places = [(p.chosen.cost.market, p.chosen.offer.zone), *((q.market, q.zone) for q in planned_placements(job))]
    assert len(places) > 1, places  # a fallback to move down
    for number, (market, zone) in enumerate(places, start=1):
        request = executor.pinned(run_request(job, number, market, zone))
        bundles = _bundles(request, node_types)
        worker: dict[str, Any] = bundles[0]  # one worker's resources (they are all alike)
        fitting = [k for k, t in workers.items() if _fits(t["resources"], worker)]
        assert len(fitting) == 1, (market, zone, fitting)
        kind = workers[fitting[0]]
        assert len(subnets_of(kind["node_config"])) == 1, fitting
        zones = [key.removeprefix(ZONE_PREFIX) for key in kind["resources"] if key.startswith(ZONE_PREFIX)]
        assert zones == [kind["labels"]["gpuplan/zone"]] and zone in (None, zones[0]), (zone, fitting)
        assert "Placement" not in kind["node_config"] or set(kind["node_config"]["Placement"]) == {"GroupName"}
        assert kind["max_workers"] >= p.chosen.nodes
        assert _ray_v2_picks(config, bundles) == {fitting[0]: p.chosen.nodes}, (market, zone)

