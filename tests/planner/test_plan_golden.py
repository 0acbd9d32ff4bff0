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
