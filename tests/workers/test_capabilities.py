"""The planner's strategy space against what the workers run: every strategy a plan can hold, for
each task and every knob value a spec can pin, passes the workers' own refusal check, so the two
cannot drift apart again. Both read catalog/data/support.yaml; these tests walk the search."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog
from commands.specfile import load_spec
from errors import InvalidInput, NoFeasiblePlan
from planner.calibration import load_calibration
from planner.capability import knob_problem, registry_problems
from planner.placement import searched_shardings
from planner.search import plan
from planner.spec import Optimizer, Weights, spec_from_dict
from planner.strategies import FINETUNES, PRECISIONS, SHARDINGS, data_parallel_shardings
from planner.types import Plan, Strategy, WeightDtype
from workers.capabilities import strategy_problem
from workers.train.setup import check_supported

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)


@pytest.fixture(scope="module")
def train_plans(cat: Catalog) -> list[Plan | NoFeasiblePlan]:
    return _plans(cat, _train_variants())


def _train(**train: Any) -> dict[str, Any]:
    section = {"tokens": 2e8, "seq_len": 1024, **train}
    return {"name": "space", "task": "train", "model": "llama-3.2-1b", "train": section,
            "resources": {"max_gpus": 16}}


def _infer(**infer: Any) -> dict[str, Any]:
    section = {"batch": 8, "prompt_tokens": 512, "output_tokens": 64, "requests": 1e3, **infer}
    return {"name": "space", "task": "infer", "model": "llama-3.2-1b", "infer": section}


def _values(alias: Any) -> list[Any]:
    return [v for v in get_args(alias) if v != "auto"]


def _train_variants() -> list[dict[str, Any]]:
    """Every pinnable value of every training knob (one knob at a time), 'auto' everywhere else, and
    the finetune x sharding x parallel-degree grid the search combines."""
    out = [_train()]
    out += [_train(precision=p) for p in PRECISIONS]
    out += [_train(optimizer=o) for o in _values(Optimizer)]
    out += [_train(activation_checkpointing=c) for c in (True, False)]
    for finetune, sharding, tp, pp in itertools.product(FINETUNES, ["auto", *data_parallel_shardings()], (1, 2),
                                                        (1, 2)):
        out.append(_train(finetune=finetune, sharding=sharding, tensor_parallel=tp, pipeline_parallel=pp))
    return out


MXFP4_MODEL = "gpt-oss-20b-mxfp4"  # mxfp4 is a checkpoint's own format: only a model stored in it may pin it


def _infer_variants() -> list[dict[str, Any]]:
    pinned = [{**_infer(weights=w), **({"model": MXFP4_MODEL} if w == "mxfp4" else {})} for w in _values(Weights)]
    return [_infer(), {**_infer(), "model": MXFP4_MODEL}, *pinned]


def _plans(cat: Catalog, specs: list[dict[str, Any]]) -> list[Plan | NoFeasiblePlan]:
    out: list[Plan | NoFeasiblePlan] = []
    for raw in specs:
        for objective in ("cheapest", "fastest"):
            try:
                out.append(plan(spec_from_dict(raw), cat, objective=objective, calibration=CAL))
            except NoFeasiblePlan as exc:
                out.append(exc)
    return out


def _mismatches(cat: Catalog, plans: list[Plan | NoFeasiblePlan]) -> list[str]:
    bad: list[str] = []
    for p in plans:
        if not isinstance(p, Plan):
            continue
        for c in p.candidates:
            s = c.estimate.strategy
            refused = strategy_problem(s)
            if refused is not None:
                bad.append(f"{s.label()}: {refused[1]}")
            gpu = cat.gpu(s.gpu)
            knobs = [("weights", s.weights)] if s.task == "infer" else \
                [("precision", s.precision), ("optimizer", s.optimizer), ("finetune", s.finetune)]
            for knob, value in knobs:
                problem = knob_problem(cat.support, gpu, s.task, knob, value)
                if problem is not None:
                    bad.append(f"{s.label()}: {problem}")
    return bad


@pytest.mark.parametrize("task", ["train", "infer"])
def test_every_planned_strategy_is_one_the_workers_run(cat: Catalog, train_plans: list[Plan | NoFeasiblePlan],
                                                       task: str) -> None:
    plans = train_plans if task == "train" else _plans(cat, _infer_variants())
    strategies = {c.estimate.strategy for p in plans if isinstance(p, Plan) for c in p.candidates}
    assert len(strategies) > (100 if task == "train" else 10)  # the walk reached a real strategy space
    assert _mismatches(cat, plans) == []


def test_the_walk_covers_every_value_the_workers_run(cat: Catalog, train_plans: list[Plan | NoFeasiblePlan]) -> None:
    """Each value the workers run is emitted by some plan, so the walk above is not vacuous."""
    plans = train_plans
    seen = {(k, str(getattr(c.estimate.strategy, k))) for p in plans if isinstance(p, Plan) for c in p.candidates
            for k in ("sharding", "precision", "optimizer", "finetune")}
    t = cat.support.workers.train
    for knob in ("sharding", "precision", "optimizer", "finetune"):
        for value in getattr(t, knob).run:
            assert (knob, value) in seen, f"no plan holds {knob} {value}"


def test_the_record_covers_every_value_a_plan_can_hold(cat: Catalog) -> None:
    """Every value of the Strategy's domains (the registry's kinds) is either run by the workers or refused with a
    reason, and the record names no kind the registry lacks."""
    t, i = cat.support.workers.train, cat.support.workers.infer
    domains = {"sharding": (t.sharding, list(SHARDINGS)), "precision": (t.precision, list(PRECISIONS)),
               "optimizer": (t.optimizer, get_args(Optimizer)), "finetune": (t.finetune, list(FINETUNES)),
               "weights": (i.weights, list(get_args(WeightDtype)))}
    assert registry_problems(cat.support) == []
    for knob, (support, values) in domains.items():
        for value in values:
            assert (value in support.run) != (value in support.not_run), f"{knob} {value}"
            assert set(support.run) | set(support.not_run) <= set(values), knob


@pytest.mark.parametrize("knob,value,why", [("sharding", "zero1", "fsdp-grad-op"),
                                            ("tensor_parallel", 2, "data parallelism only"),
                                            ("pipeline_parallel", 2, "data parallelism only")])
def test_a_pinned_knob_the_workers_do_not_run_is_refused_with_the_reason(cat: Catalog, knob: str, value: Any,
                                                                         why: str) -> None:
    with pytest.raises(NoFeasiblePlan) as caught:
        plan(spec_from_dict(_train(**{"sharding": "fsdp", knob: value})), cat, calibration=CAL)
    assert "support" in str(caught.value) and why in str(caught.value)
    strategy = Strategy(gpu="H100-SXM", gpu_count=4, **{"sharding": "fsdp", knob: value})
    with pytest.raises(InvalidInput, match=why):
        check_supported(strategy, torch.device("cpu"))


def test_int4_weights_are_not_planned_and_not_run(cat: Catalog) -> None:
    with pytest.raises(NoFeasiblePlan, match="mslk"):
        plan(spec_from_dict(_infer(weights="int4")), cat, calibration=CAL)


def test_workers_accept_fsdp_grad_op() -> None:
    check_supported(Strategy(gpu="cpu", gpu_count=2, precision="fp32", sharding="fsdp-grad-op"),
                     torch.device("cpu"))


def test_inference_plans_one_gpu_and_says_why_not_more(cat: Catalog) -> None:
    p = plan(spec_from_dict(_infer()), cat, calibration=CAL)
    assert {c.estimate.strategy.gpu_count for c in p.candidates} == {1}
    assert {c.estimate.strategy.tensor_parallel for c in p.candidates} == {1}
    assert any(r.constraint == "support" and "one GPU" in r.reason for r in p.rejections)


@pytest.mark.parametrize("source", ["mixtral-qlora.yaml", "70b"])
def test_qlora_is_not_planned_on_rocm_and_the_plan_says_why(cat: Catalog, source: str) -> None:
    if source == "70b":
        spec = spec_from_dict({"name": "q70", "task": "train", "model": "llama-3-70b",
                               "train": {"tokens": 1e8, "seq_len": 2048, "finetune": "qlora"},
                               "resources": {"spot": "never", "max_gpus": 8}})
    else:
        spec = load_spec(EXAMPLES / source)
    for objective in ("cheapest", "fastest"):
        p = plan(spec, cat, objective=objective, calibration=CAL)
        assert {cat.gpu(c.estimate.strategy.gpu).vendor for c in p.candidates} == {"nvidia"}
    amd = [r for r in p.rejections if "MI300X" in r.option]
    assert amd and all(r.constraint == "support" and "bitsandbytes" in r.reason for r in amd)


def test_qlora_keeps_its_frozen_base_in_4_bit(tmp_path: Path) -> None:
    """The planner counts QLoRA's base linear weights at NF4's ~0.5 byte each; the workers store them so."""
    from torchao.quantization import NF4Tensor

    from tests.workers.tiny import write_config
    from workers.model.build import apply_lora, build_model, quantize_base_nf4, resolve_model_source

    config = write_config(tmp_path / "m", hidden_size=128, intermediate_size=256)
    spec = spec_from_dict({"name": "q", "task": "train", "model": {"config": str(config)},
                           "train": {"tokens": 1e3, "finetune": "qlora"}})
    model = build_model(resolve_model_source(spec), seed=0, weights_dtype=torch.bfloat16)
    assert quantize_base_nf4(model) > 0
    model = apply_lora(model, 4)
    base = [p for n, p in model.named_parameters() if "base_layer" in n and isinstance(p, NF4Tensor)]
    assert base and not any(p.requires_grad for p in base)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_a_sharding_kind_added_to_the_registry_alone_is_planned_and_refused_by_the_workers(
        cat: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A made-up kind (fsdp's predicates under another name), added to planner.strategies and to nothing else: the
    spec takes it, ``sharding: auto``'s space offers it wherever the support record runs it, the planner prices it
    by its predicates exactly as fsdp, and the workers, whose record does not name it, refuse it with one message."""
    clone = replace(SHARDINGS["fsdp"], name="fsdp-made-up")
    monkeypatch.setitem(SHARDINGS, clone.name, clone)
    train = cat.support.workers.train
    sharding = train.sharding.model_copy(update={"run": [*train.sharding.run, clone.name]})
    workers = cat.support.workers.model_copy(update={"train": train.model_copy(update={"sharding": sharding})})
    runs_it = cat.support.model_copy(update={"workers": workers})
    h100 = cat.gpu("H100-SXM")
    assert searched_shardings(runs_it, h100) == ["ddp", "fsdp-grad-op", "fsdp", clone.name]
    assert clone.name not in searched_shardings(cat.support, h100)

    def planned(name: str, catalog: Catalog) -> dict[str, Any]:
        spec = _train(sharding=name, micro_batch=2)
        spec["resources"] = {"accelerators": ["H100:4", "H100:8"]}
        return plan(spec_from_dict(spec), catalog, calibration=CAL).model_dump(mode="json")

    made_up = planned(clone.name, replace(cat, support=runs_it))
    assert {c["estimate"]["strategy"]["sharding"] for c in made_up["candidates"]} == {clone.name}
    assert json.loads(json.dumps(made_up).replace(clone.name, "fsdp")) == planned("fsdp", cat)

    strategy = Strategy.model_validate(made_up["chosen"]["estimate"]["strategy"])
    with pytest.raises(InvalidInput) as refused:
        check_supported(strategy, torch.device("cpu"))
    assert str(refused.value) == (f"train.sharding: sharding {clone.name} is not run by the workers: the workers "
                                  "have no code path for it; plan the job again with `gpuplan plan`; see README "
                                  "'What the workers run'")


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_the_workers_build_each_precision_as_the_planner_counts_it(precision: str) -> None:
    """The weights in the bytes the plan counts, autocast for mixed precision only (FSDP2's policy in its place
    where the kind says so), fp8's and QLoRA's torchao loaded where they are used."""
    from workers.train.setup import autocast_dtype, build_libraries, weights_dtype

    kind = PRECISIONS[precision]
    for sharding in ("ddp", "fsdp"):
        s = Strategy(gpu="H100-SXM", gpu_count=2, precision=precision, sharding=sharding)
        assert weights_dtype(s).itemsize == kind.bytes.param
        cast = autocast_dtype(s, sharded=sharding == "fsdp")
        assert (cast is not None) == (kind.mixed and not (sharding == "fsdp" and kind.fsdp_casts))
        assert cast is None or cast.itemsize == kind.bytes.compute
        assert ("torchao" in build_libraries(s)) == kind.float8_matmuls
    qlora = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16", finetune="qlora")
    assert build_libraries(qlora) == ("transformers", "peft", "torchao")
