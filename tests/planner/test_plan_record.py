"""planner.plan_record: a job's plan as stored, read back typed from every schema version stored so far, and the
public JSON of a job's plan unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from errors import InvalidInput
from planner.plan_record import PLAN_SCHEMA_VERSION, dump_planned_run, load_planned_run, planned_run
from planner.types import Plan

PLANS = Path(__file__).resolve().parents[1] / "data" / "plans"
CASES = sorted(p.name.removeprefix("v1_").removesuffix(".json") for p in PLANS.glob("v1_*.json"))


def _stored(version: int, case: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((PLANS / f"v{version}_{case}.json").read_text())
    return doc


def test_there_are_plans_of_the_previous_and_the_current_version() -> None:
    assert len(CASES) == 3 and PLAN_SCHEMA_VERSION == 2
    assert all((PLANS / f"v{PLAN_SCHEMA_VERSION}_{case}.json").is_file() for case in CASES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("version", [1, 2])
def test_a_stored_plan_reads_what_the_code_that_stored_it_read(version: int, case: str) -> None:
    doc = _stored(version, case)
    expected = doc["expected"]
    record = load_planned_run(doc["plan"])
    assert record.spot_mttp_h == expected["mttp_h"]
    assert (record.hours, record.zone, record.nodes) == (expected["hours"], expected["zone"], expected["nodes"])
    stored = doc["plan"]["chosen"]["estimate"]["strategy"]
    assert record.strategy.model_dump(mode="json") == stored
    assert record.alternatives[0] == record.chosen and len(record.alternatives) == 4
    # the predicted block holds every number the version-1 code predicted, the same, and the plan's wall clock
    predicted = record.prediction().record()
    assert {k: predicted[k] for k in expected["predicted"]} == expected["predicted"]
    assert predicted["wall_s"] == pytest.approx(expected["hours"] * 3600)


@pytest.mark.parametrize("case", CASES)
def test_both_versions_of_a_plan_are_the_same_record(case: str) -> None:
    old, new = load_planned_run(_stored(1, case)["plan"]), load_planned_run(_stored(2, case)["plan"])
    assert old == new


@pytest.mark.parametrize("case", CASES)
def test_a_plan_is_stored_with_the_current_version_and_shown_in_the_shape_clients_know(case: str) -> None:
    v1, v2 = _stored(1, case)["plan"], _stored(2, case)["plan"]
    record = load_planned_run(v1)
    assert dump_planned_run(record) == v2 and v2["schema_version"] == PLAN_SCHEMA_VERSION
    assert record.public() == v1  # GET /v1/jobs/{id}'s plan: the fields it always had, no storage version
    assert load_planned_run(record.public()) == record  # what a client reads back


@pytest.mark.parametrize("case", CASES)
def test_the_plan_it_was_made_from_is_kept_for_what_reads_plans(case: str) -> None:
    record = load_planned_run(_stored(2, case)["plan"])
    plan = record.as_plan()
    assert isinstance(plan, Plan) and plan.chosen == record.chosen and plan.candidates == record.alternatives
    assert planned_run(plan) == record


def test_a_plan_stored_by_a_newer_gpuplan_is_refused_saying_what_to_run() -> None:
    doc = {**_stored(2, CASES[0])["plan"], "schema_version": PLAN_SCHEMA_VERSION + 1}
    with pytest.raises(InvalidInput, match=r"schema version 3; this gpuplan reads versions 1 to 2") as err:
        load_planned_run(doc)
    assert err.value.hint is not None and "gpuplan version that stored it" in err.value.hint


def test_a_document_that_is_no_plan_is_refused_saying_where() -> None:
    doc = _stored(2, CASES[0])["plan"]
    with pytest.raises(InvalidInput, match=r"does not read as a plan: chosen: Field required"):
        load_planned_run({k: v for k, v in doc.items() if k != "chosen"})
    with pytest.raises(InvalidInput, match=r"chosen\.estimate\.hours"):
        load_planned_run({**doc, "chosen": {**doc["chosen"], "estimate": {**doc["chosen"]["estimate"],
                                                                           "hours": "soon"}}})


def test_a_plan_without_a_choice_makes_no_record() -> None:
    plan = load_planned_run(_stored(2, CASES[0])["plan"]).as_plan().model_copy(update={"chosen": None})
    with pytest.raises(InvalidInput, match="no chosen candidate"):
        planned_run(plan)
