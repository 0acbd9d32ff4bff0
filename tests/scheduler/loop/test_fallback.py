"""scheduler.loop.fallback: the placements a job moves down when the cloud refuses its nodes, read from the node
types the cluster config generator makes of the job's stored plan, cheapest first."""

from __future__ import annotations

from catalog.loader import load_catalog
from planner.calibration import load_calibration
from planner.plan_record import planned_run
from planner.search import plan
from planner.spec import spec_from_dict
from scheduler.loop.attempt_placement import MarketChoice
from scheduler.loop.fallback import next_placement, planned_placements
from scheduler.store.models import Attempt, Job
from scheduler.store.states import JobState
from tests.scheduler.conftest import toy_record


def stored_job(spot: str, accelerator: str = "A100-40GB:1", model: str = "tiny-llama") -> Job:
    """A job (by default on one A100-40GB of a p4d in us-east-1: spot in two zones, on demand), its plan stored as
    the service stores it (the leading candidates as "alternatives")."""
    spec = spec_from_dict({"name": "t", "task": "train", "model": model,
                           "train": {"tokens": 4096, "seq_len": 32, "micro_batch": 4},
                           "resources": {"clouds": ["aws"], "accelerators": [accelerator], "regions": ["us-east-1"],
                                         "spot": spot}})
    planned = planned_run(plan(spec, load_catalog(), calibration=load_calibration()))
    return Job(id="j-1", team_id=1, name="t", spec=spec.model_dump(mode="json"), spec_hash="h", plan=planned,
               state=JobState.RUNNING)


def attempt(market: str, zone: str) -> Attempt:
    return Attempt(job_id="j-1", number=1, market=market, usd_per_h=1.0, zone=zone)


def test_spot_auto_moves_to_the_other_zone_then_on_demand_in_cost_order() -> None:
    job = stored_job("auto")
    places = planned_placements(job)
    assert [(p.market, p.zone) for p in places] == [("spot", "use1-az1"), ("spot", "use1-az2"),
                                                    ("on-demand", "use1-az1"), ("on-demand", "use1-az2")]
    assert [p.usd_per_h for p in places] == sorted(p.usd_per_h for p in places)
    every = lambda p: True  # noqa: E731
    assert next_placement(job, attempt("spot", "use1-az1"), every) == places[1]
    assert next_placement(job, attempt("spot", "use1-az2"), every) == places[2]
    # a type the cluster does not have is skipped
    assert next_placement(job, attempt("spot", "use1-az1"), lambda p: p.market == "on-demand") == places[2]


def test_spot_always_moves_between_spot_zones_only_then_stays() -> None:
    job = stored_job("always")
    assert {p.market for p in planned_placements(job)} == {"spot"}
    moved = next_placement(job, attempt("spot", "use1-az1"), lambda p: True)
    assert isinstance(moved, MarketChoice) and (moved.market, moved.zone) == ("spot", "use1-az2")
    assert next_placement(job, attempt("spot", "use1-az2"), lambda p: True) is None


def test_a_job_moves_only_between_placements_of_its_own_instance_type() -> None:
    """Four H100s: one p5.48xlarge, and among the leading candidates p5.4xlarge on demand (one H100 each,
    regional). That is no place for the p5.48xlarge run (its strategy and price are another's): it moves between
    p5.48xlarge's own zones and markets only."""
    job = stored_job("auto", "H100-SXM:4", "llama-3-8b")
    alternatives = job.plan.alternatives
    assert "p5.4xlarge" in {c.offer.instance_type for c in alternatives}
    own = {(c.cost.market, c.offer.zone) for c in alternatives if c.offer.instance_type == "p5.48xlarge"}
    places = planned_placements(job)
    assert {(p.market, p.zone) for p in places} == own and len(own) > 1


def test_a_plan_the_generator_cannot_read_has_no_fallback() -> None:
    """Cluster configs are made for AWS only: a plan on another cloud has no node types to move between."""
    record = toy_record()
    elsewhere = record.model_copy(update={"chosen": record.chosen.model_copy(update={
        "offer": record.chosen.offer.model_copy(update={"cloud": "gcp"})})})
    job = Job(id="j-1", team_id=1, name="t", spec={}, spec_hash="h", plan=elsewhere, state=JobState.RUNNING)
    assert planned_placements(job) == []
    assert next_placement(job, attempt("spot", "use1-az1"), lambda p: True) is None
