"""The registry of sharding, precision and finetune kinds (planner.strategies): the spec validates against it as
it is, the support record may name only its kinds, and a rule stated once holds wherever it is asked."""

from __future__ import annotations

from dataclasses import replace

import pytest

from catalog.loader import load_catalog, load_support
from errors import InvalidInput
from planner.calibration import load_calibration
from planner.capability import registry_problems
from planner.estimate import estimate
from planner.spec import spec_from_dict
from planner.strategies import (
    PRECISIONS,
    SHARDINGS,
    data_parallel_shardings,
    most_sharded,
    precision_kind,
    sharding_kind,
    stochastic_twin,
)
from planner.types import Strategy


def _train(**train: object) -> dict[str, object]:
    return {"name": "s", "task": "train", "model": "llama-3.2-1b", "train": {"tokens": 1e8, "seq_len": 1024, **train}}


def test_the_spec_takes_the_kinds_of_the_registry_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput) as refused:
        spec_from_dict(_train(sharding="zero3"))
    assert str(refused.value) == ("train.sharding: Input should be 'auto', 'ddp', 'zero1', 'fsdp-grad-op' or 'fsdp', "
                                  "got 'zero3'")
    with pytest.raises(InvalidInput, match=r"train\.sharding: Input should be"):
        spec_from_dict(_train(sharding="none"))  # one replica's kind: a plan's, never a spec's
    monkeypatch.setitem(SHARDINGS, "zero3", replace(SHARDINGS["fsdp"], name="zero3"))
    spec = spec_from_dict(_train(sharding="zero3"))
    assert spec.train is not None and spec.train.sharding == "zero3"
    assert most_sharded() == "zero3" and data_parallel_shardings()[-1] == "zero3"
    assert Strategy(gpu="H100-SXM", gpu_count=2, sharding="zero3").label() == "2xH100-SXM zero3 bf16 mb=1"


def test_a_plan_names_only_kinds_and_labels_by_their_meaning() -> None:
    with pytest.raises(ValueError, match="Input should be 'fp32', 'amp-bf16'"):
        Strategy(gpu="H100-SXM", gpu_count=1, precision="fp9")
    assert Strategy(gpu="H100-SXM", gpu_count=1, sharding="none", finetune="full").label() == "1xH100-SXM bf16 mb=1"
    assert Strategy(gpu="H100-SXM", gpu_count=2, sharding="ddp", finetune="qlora").label() == \
        "2xH100-SXM ddp bf16 qlora mb=1"
    with pytest.raises(InvalidInput, match="sharding 'zero3' is not a sharding kind gpuplan knows"):
        sharding_kind("zero3")


def test_sharding_predicates_count_what_fsdp2_and_ddp_do() -> None:
    fsdp, grad_op, ddp, zero1 = (SHARDINGS[k] for k in ("fsdp", "fsdp-grad-op", "ddp", "zero1"))
    assert [fsdp.collectives_per_layer(c) for c in (False, True)] == [3, 4]  # gather twice (+ recompute), scatter
    assert [grad_op.collectives_per_layer(c) for c in (False, True)] == [2, 2]  # kept gathered to backward
    assert ddp.collectives_per_layer(True) == 0 and zero1.shards_optimizer_state and not zero1.shards_gradients
    assert data_parallel_shardings() == ["ddp", "zero1", "fsdp-grad-op", "fsdp"]  # lightest first


def test_precision_bytes_and_dtypes_agree() -> None:
    for kind in PRECISIONS.values():
        assert kind.bytes.param == (2 if kind.weights_dtype == "bf16" else 4)
        assert kind.bytes.autocast == kind.mixed
    assert precision_kind("bf16-plain").storage == "bf16" and stochastic_twin("bf16-plain") == "bf16"
    assert [p for p in PRECISIONS if stochastic_twin(p)] == ["bf16-plain"]
    assert precision_kind("amp-fp16").sharded_activations == "bf16"


@pytest.mark.parametrize("precision", ["bf16-plain", "amp-bf16", "bf16"])
def test_qlora_trains_under_every_sixteen_bit_precision_the_spec_allows(precision: str) -> None:
    """One rule (PrecisionKind.sixteen_bit_compute) for the spec and the search: bf16-plain, which the spec
    allows with qlora, was refused on every GPU as 'neither bf16 nor fp16'."""
    spec = spec_from_dict(_train(finetune="qlora", precision=precision, micro_batch=1))
    est = estimate(spec, load_catalog(), "H100-SXM", 1, calibration=load_calibration())
    assert est.strategy.precision == precision and est.memory.fits
    with pytest.raises(InvalidInput, match="qlora trains bf16/fp16 adapters"):
        spec_from_dict(_train(finetune="qlora", precision="fp8"))


def test_the_support_record_may_name_only_kinds_of_the_registry() -> None:
    support = load_support()
    assert registry_problems(support) == []
    train = support.workers.train
    typo = train.sharding.model_copy(update={"run": [*train.sharding.run, "fsdp-gradop"]})
    record = support.model_copy(update={"workers": support.workers.model_copy(
        update={"train": train.model_copy(update={"sharding": typo})})})
    assert registry_problems(record) == [
        "sharding 'fsdp-gradop' is no sharding kind of planner.strategies (it defines none, ddp, zero1, "
        "fsdp-grad-op, fsdp)"]
