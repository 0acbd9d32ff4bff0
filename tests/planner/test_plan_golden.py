"""plan() gives exactly the pinned answers (tests/planner/plan_golden.py): the whole Plan JSON of each spec,
every candidate, rejection and warning, so a speed-up that changes any result fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.spec import spec_from_dict
from tests.planner.plan_golden import SPECS, answer, answers, inputs, load_golden


def _first_difference(got: Any, want: Any, path: str = "") -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if got.get(key) != want.get(key):
                return _first_difference(got.get(key), want.get(key), f"{path}.{key}")
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f"{path}: {len(got)} items, pinned {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: {json.dumps(got)[:300]} != pinned {json.dumps(want)[:300]}"


def test_plans_equal_the_pinned_answers() -> None:
    want = load_golden()
    got = answers()
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name}: {_first_difference(got[name], want[name])}"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.permutations(range(len(SPECS))), repeat=st.integers(min_value=0, max_value=len(SPECS) - 1))
def test_answers_do_not_depend_on_what_was_planned_before(order: list[int], repeat: int) -> None:
    """Caches kept across plan() calls (per model, GPU, knobs) never leak one job's numbers into another:
    any order of the pinned specs, one of them planned twice, gives the pinned answers."""
    want = load_golden()
    catalog, cal = inputs()
    for i in [*order[:4], order[repeat % 4]]:
        name, objective, spec = SPECS[i]
        assert answer(catalog, cal, objective, spec_from_dict(spec)) == want[name], name


@pytest.mark.parametrize("name", [name for name, _, _ in SPECS])
def test_each_pinned_answer_is_a_plan_or_a_refusal(name: str) -> None:
    pinned = load_golden()[name]
    assert ("chosen" in pinned and pinned["candidates"]) or pinned["error"] == "NoFeasiblePlan"


def test_construct_builds_what_model_construct_builds() -> None:
    """planner.types.construct is a faster model_construct: the same fields in the same order, the same
    fields-set, defaults and factories, and the same JSON."""
    from planner.types import CostEstimate, Estimate, MemoryEstimate, Strategy, ThroughputEstimate, construct

    cases: list[tuple[type[Any], dict[str, Any]]] = [
        (Strategy, {"gpu": "H200", "gpu_count": 2, "precision": "amp-bf16", "micro_batch": 4}),
        (CostEstimate, {"market": "spot", "usd_per_h": 1.5, "hours": 2.0, "usd": 3.0}),
        (ThroughputEstimate, {"tokens_per_s": 10.0}),
        (MemoryEstimate, {"peak_allocated_bytes": 1, "peak_reserved_bytes": 2, "total_bytes": 3, "usable_bytes": 4,
                          "fits": True, "breakdown": {"weights": 1}}),
    ]
    for cls, values in cases:
        fast, slow = construct(cls, **values), cls.model_construct(**values)
        assert fast == slow and list(fast.__dict__) == list(slow.__dict__), cls
        assert fast.model_fields_set == slow.model_fields_set and fast.model_dump_json() == slow.model_dump_json()
    est = construct(Estimate, strategy=cases[0][0](**cases[0][1]), memory=construct(MemoryEstimate, **cases[3][1]),
                    throughput=construct(ThroughputEstimate, tokens_per_s=1.0), hours=1.0)
    assert est.warnings == [] and est.warnings is not construct(Estimate, **{**est.__dict__, "warnings": []}).warnings
    with pytest.raises(TypeError, match="missing"):
        construct(CostEstimate, market="spot")
    with pytest.raises(TypeError, match="unknown"):
        construct(ThroughputEstimate, tokens_per_s=1.0, speed=2.0)
