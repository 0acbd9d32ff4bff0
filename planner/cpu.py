"""A run on this machine's CPU (``gpuplan run`` where there is no GPU): the strategy it can honour of the
spec, whether the model's weights fit in the memory there, and the planner's prediction for it.

Pure: the CPU (the part its probe measured), its available memory and the calibration are passed in by
the edge that reads them (workers.executors.local_runner).
"""

from __future__ import annotations

import math

from catalog.params import count_params
from catalog.schema import GpuSpec, ModelConfig
from errors import InvalidInput
from planner.calibration import Calibration
from planner.prediction import Prediction, predict
from planner.spec import JobSpec
from planner.strategies import precision_kind
from planner.types import Strategy


def cpu_strategy(spec: JobSpec) -> Strategy:
    """What a CPU run can honour of the spec: fp32 unless pinned otherwise, one worker, no sharding."""
    train = spec.train
    if train is None:  # inference: the worker reads batch and weights from the spec
        infer = spec.infer
        assert infer is not None
        weights = "fp32" if infer.weights == "auto" else infer.weights
        return Strategy(task="infer", gpu="cpu", gpu_count=1, weights=weights, batch=infer.batch)
    precision = "fp32" if train.precision == "auto" else train.precision
    micro = train.micro_batch or 1
    accum = max(1, math.ceil(train.global_batch / micro)) if train.global_batch else 1
    return Strategy(gpu="cpu", gpu_count=1, precision=precision, optimizer=train.optimizer, sharding="none",
                    activation_checkpointing=train.activation_checkpointing is True, micro_batch=micro,
                    grad_accum=accum, finetune=train.finetune, lora_rank=train.lora_rank)


def check_fits_in_ram(model: ModelConfig, strategy: Strategy, ram: int | None) -> None:
    """Refuse a model whose weights alone exceed ``ram`` bytes (None: unknown, let the run try): building it
    would swap or be OOM-killed (an 8B model is 30 GiB in fp32)."""
    params = count_params(model).total
    weights = params * precision_kind(strategy.precision).bytes.param  # a lower bound: no grads, no states
    if ram is not None and weights > ram:
        raise InvalidInput(f"{model.id} has {params / 1e9:.1f}B parameters: {weights / 2**30:.1f} GiB for its "
                           f"{strategy.precision} weights alone, more than the {ram / 2**30:.1f} GiB of memory "
                           "available on this CPU-only machine",
                           hint="run it on GPUs with `gpuplan submit` (see `gpuplan plan`), or try "
                           "examples/tiny-train.yaml here")


def predict_on_cpu(spec: JobSpec, model: ModelConfig, strategy: Strategy, cpu: GpuSpec,
                   calibration: Calibration) -> Prediction:
    """The planner's peak memory, tokens/s and hours for training ``strategy`` on ``cpu``."""
    from planner.memory_train import train_memory
    from planner.throughput_train import train_throughput

    assert spec.train is not None
    cal = calibration.for_vendor(cpu.vendor)
    memory = train_memory(model, strategy, spec.train.seq_len, cpu, cal.memory)
    thr = train_throughput(model, strategy, spec.train.seq_len, cpu, cal.throughput)
    # no start in these hours, so no wall clock to compare with (the start is timed on GPUs only)
    return predict(strategy, memory, thr, spec.train.tokens / thr.tokens_per_s / 3600, timed_start=False)
