"""JobSpec validation: bad input is refused with the field's path and what to write instead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from errors import InvalidInput
from planner.calibration import load_calibration
from planner.spec import JobSpec, parse_hours, spec_from_dict

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

BASE = {"name": "j", "task": "train", "model": "llama-3-8b", "train": {"tokens": 1e9}}


def with_(path: str, value: object) -> dict[str, object]:
    data: dict[str, object] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    section, _, key = path.partition(".")
    if key:
        inner = dict(data.get(section) or {})  # type: ignore[call-overload]
        inner[key] = value
        data[section] = inner
    else:
        data[section] = value
    return data


def test_minimal_train_spec_gets_defaults() -> None:
    spec = spec_from_dict(BASE)
    assert spec.train is not None
    assert spec.train.precision == "auto" and spec.train.sharding == "auto"
    assert spec.resources.spot == "auto"
    assert spec.model_id == "llama-3-8b"


def test_infer_section_defaults_when_missing() -> None:
    spec = spec_from_dict({"task": "infer", "model": "gpt2"})
    assert spec.infer is not None and spec.infer.batch == 32


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("train.tokens", -5, "train.tokens"),
        ("train.seq_len", 0, "train.seq_len"),
        ("train.precision", "fp9", "train.precision"),
        ("train.sharding", "zero9", "train.sharding"),
        ("train.tensor_parallel", 0, "tensor_parallel"),
        ("train.bogus", 1, "train.bogus"),
        ("resources.deadline", "soon", "resources.deadline"),
        ("resources.budget_usd", 0, "resources.budget_usd"),
        ("resources.accelerators", ["H100:x"], "resources.accelerators"),
    ],
)
def test_bad_field_is_named_with_its_path(path: str, value: object, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        spec_from_dict(with_(path, value))
    assert needle in str(info.value)


def test_unknown_top_level_field_is_refused() -> None:
    with pytest.raises(InvalidInput, match="modle: unknown field"):
        spec_from_dict({**BASE, "modle": "x"})


def test_train_task_without_train_section_says_what_is_missing() -> None:
    with pytest.raises(InvalidInput, match="'train' section is missing"):
        spec_from_dict({"task": "train", "model": "gpt2"})


def test_qlora_with_fp32_is_refused() -> None:
    with pytest.raises(InvalidInput, match="qlora"):
        spec_from_dict(with_("train", {"tokens": 1e6, "finetune": "qlora", "precision": "fp32"}))


def test_accelerator_pins_parse_counts() -> None:
    spec = spec_from_dict(with_("resources", {"accelerators": ["H100:8", "A100-80GB"], "deadline": "2d"}))
    assert spec.resources.accelerator_pins() == {"H100": 8, "A100-80GB": None}
    assert spec.resources.deadline == 48.0


def test_single_string_accelerator_becomes_a_list() -> None:
    spec = spec_from_dict(with_("resources", {"accelerators": "H200"}))
    assert spec.resources.accelerators == ["H200"]


@given(st.floats(min_value=0.01, max_value=1e4, allow_nan=False), st.sampled_from(["s", "m", "h", "d", "w"]))
def test_parse_hours_round_trips_units(amount: float, unit: str) -> None:
    factor = {"s": 1 / 3600, "m": 1 / 60, "h": 1, "d": 24, "w": 168}[unit]
    assert parse_hours(f"{amount}{unit}") == pytest.approx(amount * factor)


@pytest.mark.parametrize("bad", ["", "24x", "-3h", 0, True, None])
def test_parse_hours_rejects_nonsense(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_hours(bad)


def test_spec_is_frozen() -> None:
    spec = spec_from_dict(BASE)
    with pytest.raises(Exception, match="frozen"):
        spec.name = "other"  # type: ignore[misc]
    assert isinstance(spec, JobSpec)


def test_every_problem_is_reported_at_once() -> None:
    bad = {"task": "train", "model": "gpt2", "train": {"tokens": -5, "precision": "fp9"},
           "resources": {"budget_usd": 0}}
    with pytest.raises(InvalidInput) as info:
        spec_from_dict(bad)
    message = str(info.value)
    assert message.startswith("3 problems in the spec:") and "more problem" not in message
    for path in ("train.tokens:", "train.precision:", "resources.budget_usd:"):
        assert path in message


def test_infer_task_with_only_a_train_section_is_refused() -> None:
    with pytest.raises(InvalidInput, match="task is 'infer' but the spec has only a 'train' section"):
        spec_from_dict({"task": "infer", "model": "gpt2", "train": {"tokens": 1e6}})


def test_global_batch_that_is_not_whole_micro_batches_is_refused() -> None:
    with pytest.raises(InvalidInput, match="global_batch 3 is not a multiple of micro_batch 2 "
                                           r"\(it would run 4\); write global_batch 2 or 4"):
        spec_from_dict(with_("train", {"tokens": 1e6, "global_batch": 3, "micro_batch": 2}))
    assert spec_from_dict(with_("train", {"tokens": 1e6, "global_batch": 4, "micro_batch": 2})).train is not None


@pytest.mark.parametrize(("model", "section", "needle"), [
    ("gpt2", {"train": {"tokens": 1e6, "seq_len": 4096}}, "train.seq_len: 4,096 tokens is longer than gpt2's "
                                                          "context of 1,024"),
    ("llama-3-8b", {"train": {"tokens": 1e6, "seq_len": 65536}}, "context of 8,192"),
    ("gpt2", {"infer": {"prompt_tokens": 1000, "output_tokens": 100}}, "infer.prompt_tokens: prompt_tokens + "
                                                                       "output_tokens = 1,100 tokens"),
])
def test_a_sequence_longer_than_the_models_context_is_refused(model: str, section: dict[str, object],
                                                               needle: str) -> None:
    from catalog.loader import load_catalog
    from planner.search import estimate, plan

    task = "train" if "train" in section else "infer"
    spec = spec_from_dict({"task": task, "model": model, **section})
    catalog = load_catalog()
    for attempt in (lambda: plan(spec, catalog, calibration=CAL),
                    lambda: estimate(spec, catalog, "H200", 1, calibration=CAL)):
        with pytest.raises(InvalidInput) as info:
            attempt()
        assert needle in str(info.value) and "a model with a longer context" in str(info.value)
