"""plan() and estimate(): honour pins, explain rejections, name the constraint when nothing fits."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.loader import Catalog
from catalog.params import count_params
from errors import InvalidInput, NoFeasiblePlan, UnknownName
from planner.calibration import load_calibration
from planner.search import estimate, plan, summarize_rejections
from planner.spec import JobSpec, spec_from_dict
from tests.planner.factory import small_catalog

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

CAT = small_catalog()


def job(**over: Any) -> JobSpec:
    data: dict[str, Any] = {
        "name": "t", "task": "train", "model": "llama-3-8b",
        "train": {"tokens": 2e8, "seq_len": 2048},
        "resources": {},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return spec_from_dict(data)


def test_plan_ranks_cheapest_first_and_every_candidate_fits() -> None:
    p = plan(job(), CAT, calibration=CAL)
    assert p.chosen is not None and p.chosen == p.candidates[0]
    costs = [c.cost.usd for c in p.candidates]
    assert costs == sorted(costs)
    assert all(c.estimate.memory.fits for c in p.candidates)
    assert any(c.pareto for c in p.candidates) and p.candidates[0].pareto


def test_fastest_objective_orders_by_hours() -> None:
    p = plan(job(), CAT, objective="fastest", calibration=CAL)
    hours = [c.cost.hours for c in p.candidates]
    assert hours == sorted(hours)


def test_pareto_front_is_not_dominated() -> None:
    p = plan(job(), CAT, calibration=CAL)
    front = [c for c in p.candidates if c.pareto]
    for f in front:
        assert not any(o.cost.usd < f.cost.usd and o.cost.hours < f.cost.hours for o in p.candidates)


def test_memory_rejections_say_needs_x_gib_gt_usable() -> None:
    p = plan(job(), CAT, calibration=CAL)
    mem = [r for r in p.rejections if r.constraint == "memory"]
    assert mem, "an 8B full fine-tune cannot fit on one L4 or V100"
    assert all("GiB >" in r.reason and "usable less 5% headroom" in r.reason for r in mem)
    assert all(r.reason for r in p.rejections)
    groups = dict((k, n) for k, n, _ in summarize_rejections(p.rejections))
    assert groups["memory"] == len(mem)


def test_pinned_fields_are_honoured() -> None:
    spec = job(train={"precision": "bf16", "micro_batch": 1, "activation_checkpointing": True,
                      "sharding": "fsdp", "optimizer": "sgd"},
               resources={"accelerators": ["H100:8"], "spot": "never"})
    p = plan(spec, CAT, calibration=CAL)
    for c in p.candidates:
        s = c.estimate.strategy
        assert (s.gpu, s.gpu_count, s.precision, s.micro_batch, s.activation_checkpointing, s.sharding,
                s.optimizer) == ("H100-SXM", 8, "bf16", 1, True, "fsdp", "sgd")
        assert c.cost.market == "on-demand"
    assert any(r.constraint == "allow-list" for r in p.rejections)


def test_pinned_precision_the_part_lacks_is_rejected_with_reason() -> None:
    spec = job(model="gpt2", train={"precision": "bf16", "seq_len": 512},
               resources={"accelerators": ["V100-16GB", "L4"]})
    p = plan(spec, CAT, calibration=CAL)
    assert all(c.estimate.strategy.gpu == "L4" for c in p.candidates)
    dtype = [r for r in p.rejections if r.constraint == "dtype"]
    assert dtype and "V100-16GB" in dtype[0].reason and "bf16" in dtype[0].reason


def test_auto_precision_never_picks_a_dtype_the_part_lacks() -> None:
    spec = job(model="gpt2", train={"seq_len": 512}, resources={"accelerators": ["V100-16GB"]})
    p = plan(spec, CAT, calibration=CAL)
    assert {c.estimate.strategy.precision for c in p.candidates} <= {"amp-fp16", "fp32"}


def test_the_caller_passes_the_calibration_and_one_that_forgets_is_told_where_to_read_it() -> None:
    with pytest.raises(TypeError, match="calibration"):
        plan(job(), CAT)  # type: ignore[call-arg]
    for attempt in (lambda: plan(job(), CAT, calibration=None),  # type: ignore[arg-type]
                    lambda: estimate(job(), CAT, "H200", 1, calibration=None)):  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="needs the planner's calibration") as info:
            attempt()
        assert "load_calibration()" in (info.value.hint or "")


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(UnknownName, match=r"did you mean.*H100"):
        plan(job(resources={"accelerators": ["H10"]}), CAT, calibration=CAL)
    with pytest.raises(UnknownName, match="H200"):
        estimate(job(), CAT, "H2000", 1, calibration=CAL)


def test_unknown_model_and_cloud_suggest_close_names() -> None:
    with pytest.raises(UnknownName, match="llama-3-8b"):
        plan(job(model="llama-3-8"), CAT, calibration=CAL)
    with pytest.raises(UnknownName, match="aws"):
        plan(job(resources={"clouds": ["awz"]}), CAT, calibration=CAL)


def test_budget_names_itself_and_the_cheapest_price() -> None:
    with pytest.raises(NoFeasiblePlan) as err:
        plan(job(resources={"budget_usd": 1}), CAT, calibration=CAL)
    text = str(err.value)
    assert "budget $1 removed the last" in text and "raise budget_usd to at least $" in text


def test_deadline_names_itself_and_the_fastest_time() -> None:
    with pytest.raises(NoFeasiblePlan) as err:
        plan(job(train={"tokens": 1e12}, resources={"deadline": "1h", "max_gpus": 8}), CAT, calibration=CAL)
    assert "deadline 1 h removed the last" in str(err.value) and "relax resources.deadline" in str(err.value)


def test_memory_names_itself_when_nothing_fits() -> None:
    spec = job(model="llama-3-405b", resources={"accelerators": ["L4"], "max_gpus": 4})
    with pytest.raises(NoFeasiblePlan, match="memory removed the last"):
        plan(spec, CAT, calibration=CAL)


def test_estimate_pinned_placement_and_not_fitting_reports_fits_false() -> None:
    e = estimate(job(train={"precision": "bf16", "micro_batch": 1}), CAT, "H200", 1, calibration=CAL)
    assert e.strategy.gpu == "H200" and e.memory.fits and e.throughput.tokens_per_s > 0 and e.hours > 0
    big = estimate(job(model="llama-3-70b"), CAT, "H100", 1, calibration=CAL)
    assert not big.memory.fits and big.memory.required_bytes > big.memory.usable_bytes
    with pytest.raises(InvalidInput, match="fp8"):
        estimate(job(train={"precision": "fp8"}), CAT, "A100-80GB", 1, calibration=CAL)


def test_inference_plan_prefers_full_precision_weights_when_they_fit() -> None:
    spec = spec_from_dict({"task": "infer", "model": "llama-3-8b",
                           "infer": {"batch": 16, "prompt_tokens": 2048, "output_tokens": 128, "requests": 1e4}})
    p = plan(spec, CAT, calibration=CAL)
    h100 = [c for c in p.candidates if c.estimate.strategy.gpu == "H100-SXM"]  # the 1-GPU offer
    assert h100 and all(c.estimate.strategy.weights == "bf16" for c in h100)
    l4 = [c for c in p.candidates if c.estimate.strategy.gpu == "L4" and c.estimate.strategy.gpu_count == 1]
    assert all(c.estimate.strategy.weights in ("fp8", "int8") for c in l4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["gpt2", "llama-3.2-1b", "llama-3-8b", "llama-2-13b"]),
    seq=st.sampled_from([512, 2048, 4096]),
    tokens=st.floats(1e7, 5e9),
    finetune=st.sampled_from(["full", "lora"]),
    deadline=st.none() | st.floats(1, 500),
    budget=st.none() | st.floats(5, 5000),
    spot=st.sampled_from(["auto", "always", "never"]),
)
def test_plan_invariants(model: str, seq: int, tokens: float, finetune: str, deadline: float | None,
                         budget: float | None, spot: str) -> None:
    resources: dict[str, Any] = {"spot": spot}
    if deadline is not None:
        resources["deadline"] = deadline
    if budget is not None:
        resources["budget_usd"] = budget
    seq = min(seq, CAT.model(model).max_position_embeddings)  # longer is refused (test_spec_validation)
    spec = job(model=model, train={"tokens": tokens, "seq_len": seq, "finetune": finetune}, resources=resources)
    try:
        p = plan(spec, CAT, calibration=CAL)
    except NoFeasiblePlan as exc:
        assert "removed the last" in str(exc) or "no offer" in str(exc)
        return
    assert p.chosen is not None
    for c in p.candidates:
        assert c.estimate.memory.fits
        assert c.estimate.memory.required_bytes <= c.estimate.memory.usable_bytes
        if budget is not None:
            assert c.cost.usd <= budget
        if deadline is not None:
            if c.cost.market == "spot":
                assert (c.cost.deadline_probability or 0) >= 0.9
            else:
                assert c.cost.hours <= deadline
        if spot == "never":
            assert c.cost.market != "spot"
        if spot == "always":
            assert c.cost.market == "spot"
    assert all(r.reason and r.constraint for r in p.rejections)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["gpt2", "llama-3.2-1b", "llama-3-8b", "llama-2-13b"]),
    task=st.sampled_from(["train", "infer"]),
    seq=st.sampled_from([512, 2048, 8192]),
    finetune=st.sampled_from(["full", "lora"]),
    headroom=st.none() | st.floats(0.0, 0.5),
)
def test_a_chosen_plan_always_leaves_the_headroom(model: str, task: str, seq: int, finetune: str,
                                                  headroom: float | None) -> None:
    resources: dict[str, Any] = {} if headroom is None else {"memory_headroom": headroom}
    context = CAT.model(model).max_position_embeddings  # longer is refused by the spec check, not planned
    seq = min(seq, context if task == "train" else context - 128)
    if task == "train":
        spec = job(model=model, train={"seq_len": seq, "finetune": finetune}, resources=resources)
    else:
        spec = spec_from_dict({"name": "t", "task": "infer", "model": model, "resources": resources,
                               "infer": {"prompt_tokens": seq, "output_tokens": 128, "batch": 64}})
    want = 0.05 if headroom is None else headroom
    try:
        p = plan(spec, CAT, calibration=CAL)
    except NoFeasiblePlan as exc:
        assert f"less {want:.0%} headroom" in str(exc) or "removed the last" in str(exc)
        return
    for c in p.candidates:
        mem = c.estimate.memory
        assert mem.headroom == want and mem.fits
        assert mem.required_bytes <= mem.usable_bytes * (1 - want)
    for r in p.rejections:
        if r.constraint == "memory":
            assert f"less {want:.0%} headroom" in r.reason


def test_memory_headroom_is_validated_and_changes_the_choice() -> None:
    with pytest.raises(InvalidInput, match="memory_headroom"):
        job(resources={"memory_headroom": 0.9})
    roomy = plan(job(model="llama-3.2-1b", resources={"accelerators": ["H200:1"], "memory_headroom": 0.0}), CAT,
                 calibration=CAL)
    tight = plan(job(model="llama-3.2-1b", resources={"accelerators": ["H200:1"], "memory_headroom": 0.4}), CAT,
                 calibration=CAL)
    assert roomy.chosen is not None and tight.chosen is not None
    assert tight.chosen.estimate.memory.required_bytes <= tight.chosen.estimate.memory.usable_bytes * 0.6
    a, b = roomy.chosen.estimate.strategy, tight.chosen.estimate.strategy
    assert (a.micro_batch, a.activation_checkpointing) != (b.micro_batch, b.activation_checkpointing)


@settings(max_examples=15, deadline=None)
@given(model=st.sampled_from(["llama-3.2-1b", "llama-3-8b", "llama-2-13b"]), n=st.sampled_from([2, 4, 8]))
def test_more_gpus_never_raise_per_gpu_fsdp_state(model: str, n: int) -> None:
    from planner.calibration import MemoryCalibration
    from planner.memory_train import train_memory
    from planner.types import Strategy

    m, g = CAT.model(model), CAT.gpu("H200")
    def per_gpu(count: int) -> int:
        s = Strategy(gpu="H200", gpu_count=count, sharding="fsdp", micro_batch=1, activation_checkpointing=True)
        b = train_memory(m, s, 2048, g, MemoryCalibration()).breakdown
        return b["weights"] + b.get("optimizer_states", 0)
    assert per_gpu(2 * n) <= per_gpu(n)
    assert per_gpu(n) * n == pytest.approx(count_params(m).total * 6, rel=0.01)


def test_lora_auto_precision_keeps_the_base_in_bf16() -> None:
    p = plan(job(model="llama-3-70b", train={"finetune": "lora"}, resources={"accelerators": ["H200"]}), CAT,
             calibration=CAL)
    assert {c.estimate.strategy.precision for c in p.candidates} == {"bf16"}


def test_inference_strategy_label_names_weights_tp_and_batch() -> None:
    spec = spec_from_dict({"task": "infer", "model": "llama-3-8b", "infer": {"batch": 8}})
    e = estimate(spec, CAT, "H200", 1, calibration=CAL)
    assert e.strategy.task == "infer" and e.strategy.label() == "1xH200 tp=1 w=bf16 batch=8"
    assert e.throughput.requests_per_s is not None and e.throughput.decode_tokens_per_s is not None


def test_local_offer_is_free_and_wins_cheapest() -> None:
    from catalog.schema import Offer
    from tests.planner.factory import SRC

    local = Offer(cloud="local", instance_type="this-machine", gpu="H200", gpu_count=1, vcpus=16, ram_gib=128,
                  region="local", source=SRC)
    p = plan(job(model="llama-3.2-1b", train={"tokens": 1e7}), CAT.with_offers([local]), calibration=CAL)
    assert p.chosen is not None
    assert p.chosen.cost.market == "local" and p.chosen.cost.usd == 0.0 and p.chosen.offer.cloud == "local"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(1, 12), global_batch=st.integers(1, 96), micro_batch=st.none() | st.integers(1, 8))
def test_a_global_batch_runs_exactly_or_is_refused_with_the_fix(count: int, global_batch: int,
                                                                micro_batch: int | None) -> None:
    if micro_batch is not None and global_batch % micro_batch:
        return  # refused by the spec itself (test_spec_validation)
    train = {"global_batch": global_batch, **({"micro_batch": micro_batch} if micro_batch else {})}
    spec = job(model="llama-3.2-1b", train=train)
    try:
        est = estimate(spec, CAT, "H200", count, calibration=CAL)
    except InvalidInput as exc:
        assert global_batch < count or global_batch % count or (micro_batch and (global_batch // count) % micro_batch)
        assert "precision" not in str(exc)  # the fix is the count or the batch
        assert "global_batch" in str(exc) or "micro_batch" in str(exc)
        return
    s = est.strategy
    assert s.micro_batch * s.grad_accum * s.data_parallel == global_batch  # never rounded


def test_count_that_does_not_divide_the_global_batch_names_the_counts_that_do() -> None:
    spec = job(model="llama-3.2-1b", train={"global_batch": 64})
    with pytest.raises(InvalidInput, match=r"global_batch 64 does not split evenly over 3 data-parallel ranks "
                                           r"\(it would run 66\); use 2 or 4 data-parallel ranks"):
        estimate(spec, CAT, "H200", 3, calibration=CAL)
    with pytest.raises(InvalidInput, match="use at most 64 GPUs or a global_batch of at least 1000") as info:
        estimate(spec, CAT, "H200", 1000, calibration=CAL)
    assert "precision" not in str(info.value)


def test_stale_price_warning_names_the_command_for_each_stale_cloud() -> None:
    """The plan's warning asks for the refresh of the clouds whose prices it used, not always `refresh aws`."""
    base = small_catalog()
    old = [o.model_copy(update={"source": o.source.model_copy(update={"as_of": date(2026, 1, 1)})})
           for o in base.offers]
    cat = Catalog(gpus=base.gpus, offers=tuple(old), models=base.models)
    spec = spec_from_dict({"task": "infer", "model": "llama-3.2-1b", "resources": {"clouds": ["lambda"]}})
    result = plan(spec, cat, calibration=load_calibration(), today=date(2026, 3, 1))
    (warning,) = result.warnings
    assert "from lambda are older than 30 days" in warning
    assert warning.endswith("refresh with `gpuplan catalog import vms.csv --cloud lambda` (skypilot-catalog's "
                            "catalogs/v8/lambda/vms.csv)")
    aws = plan(spec.model_copy(update={"resources": spec.resources.model_copy(update={"clouds": ["aws"]})}), cat,
                calibration=load_calibration(), today=date(2026, 3, 1))
    assert aws.warnings[-1].endswith("refresh with `gpuplan catalog refresh aws`")
