"""Which dtypes a part can run, by its GpuSpec (never by its name).

fp8 needs an fp8 unit (Hopper, Blackwell, Ada, MI300); bf16 needs Ampere or newer (or a TPU /
Apple part that lists it); fp16 needs Volta or newer; anything else trains in fp32.
"""

from __future__ import annotations

from collections.abc import Mapping

from catalog.schema import DegreeSupport, GpuSpec, KnobSupport, PlatformKnob, StackSupport
from planner.strategies import FINETUNES, PRECISIONS, SHARDINGS, finetune_kind, precision_kind

WEIGHTS_NEEDS: dict[str, str] = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "int8",
                                 "mxfp4": "bf16"}  # mxfp4: bf16 activations over 4-bit experts


def has(gpu: GpuSpec, dtype: str) -> bool:
    return dtype in gpu.dtypes


def precision_problem(gpu: GpuSpec, precision: str) -> str | None:
    """Why ``gpu`` cannot train in ``precision`` (None when it can)."""
    need = precision_kind(precision).compute_dtype
    if has(gpu, need):
        return None
    return f"{gpu.id} ({gpu.architecture}) has no {need} support, so precision {precision} cannot run on it"


def auto_precisions(gpu: GpuSpec, finetune: str = "full") -> list[str]:
    """Candidate training precisions for precision: auto, safest first.

    fp8 is never chosen automatically: it changes numerics; pin ``precision: fp8`` to get it.
    LoRA/QLoRA keep the frozen base in bf16 (peft already trains the adapters in fp32), so fp32
    master weights would only waste memory.
    """
    if has(gpu, "bf16"):
        return ["bf16"] if finetune_kind(finetune).adapters else ["amp-bf16", "bf16"]
    if has(gpu, "fp16"):
        return ["amp-fp16"]
    return ["fp32"]


def weights_problem(gpu: GpuSpec, weights: str) -> str | None:
    need = WEIGHTS_NEEDS[weights]
    if weights in ("bf16", "fp16", "fp8") and not has(gpu, need):
        return f"{gpu.id} ({gpu.architecture}) has no {need} support, so {weights} weights cannot run on it"
    if weights in ("int8", "int4") and not (has(gpu, "bf16") or has(gpu, "fp16")):
        return f"{gpu.id} has no 16-bit compute to dequantize {weights} weights into"
    return None


def auto_weights(gpu: GpuSpec) -> list[str]:
    """Inference weight dtypes for weights: auto, most accurate first (int4 only when pinned).

    A part without 16-bit compute (this machine's CPU) serves fp32 weights: what the workers load there,
    since bf16 matmuls on a CPU are emulated and slower than fp32."""
    ladder = ["bf16"] if has(gpu, "bf16") else (["fp16"] if has(gpu, "fp16") else [])
    if has(gpu, "fp8"):
        ladder.append("fp8")
    if has(gpu, "bf16") or has(gpu, "fp16"):
        ladder.append("int8")
    return ladder or ["fp32"]


def multi_gpu_problem(gpu: GpuSpec, count: int) -> str | None:
    """Parts that cannot form a multi-GPU PyTorch job (Apple unified memory, TPU needs XLA)."""
    if count > 1 and gpu.vendor == "cpu":
        return f"{gpu.id} is this machine's CPU, one device; it cannot be combined into a {count}-device job"
    if count > 1 and gpu.vendor == "apple":
        return f"{gpu.id} is a single Apple SoC; it cannot be combined into a {count}-GPU job"
    return None


# ----------------------------------------------------------------------------- what the workers run
# The record comes from the catalog (support.yaml) as a value: the planner offers only what the
# workers run there, and each refusal carries the record's reason into the plan's rejections.


PLATFORM_KNOBS: dict[str, PlatformKnob] = {
    "precision": "precision", "optimizer": "optimizer", "finetune": "finetune", "weights": "weights",
}


def gpu_support_problem(support: StackSupport, gpu: GpuSpec) -> str | None:
    """Why the workers run nothing on ``gpu`` (None when they run something)."""
    record = support.platform(gpu.vendor, gpu.architecture)
    if record is None:
        return (f"{gpu.id} ({gpu.vendor} {gpu.architecture}) has no record of what the workers run on it; "
                "add one to the catalog's support.yaml (see README 'What the workers run')")
    if record.unsupported:
        return f"{gpu.id}: {record.unsupported}"
    return None


def knob_problem(support: StackSupport, gpu: GpuSpec, task: str, knob: str, value: str) -> str | None:
    """Why the workers do not run ``knob = value`` for ``task`` on ``gpu`` (None when they do).

    Checks the GPU-independent capability first, then the (vendor, architecture) record.
    """
    workers: KnobSupport = getattr(support.workers.train if task == "train" else support.workers.infer, knob)
    problem = workers.problem(knob, value)
    if problem is None and knob in PLATFORM_KNOBS:
        record = support.platform(gpu.vendor, gpu.architecture)
        problem = record.problem(PLATFORM_KNOBS[knob], value) if record is not None \
            else gpu_support_problem(support, gpu)
    return problem


def degree_problem(support: StackSupport, task: str, knob: str, value: int) -> str | None:
    """Why the workers do not run a parallel degree or GPU count of ``value`` (None when they do)."""
    degree: DegreeSupport = getattr(support.workers.train if task == "train" else support.workers.infer, knob)
    return degree.problem(knob, value)


def registry_problems(support: StackSupport) -> list[str]:
    """Kind names the support record gives (run, not run, per platform) that planner.strategies does not define:
    a misspelt kind would otherwise be offered nowhere and refused with no reason."""
    registries: dict[str, Mapping[str, object]] = {"sharding": SHARDINGS, "precision": PRECISIONS,
                                                    "finetune": FINETUNES}
    named: list[tuple[str, str]] = []
    for knob in registries:
        listed: KnobSupport = getattr(support.workers.train, knob)
        named += [(knob, name) for name in (*listed.run, *listed.not_run)]
    for platform in support.platforms:
        named += [(knob, name) for knob in ("precision", "finetune") for name in getattr(platform, knob)]
        for key in platform.not_run:
            knob, _, name = key.partition(" ")
            if knob in registries:
                named.append((knob, name))
    return [f"{knob} {name!r} is no {knob} kind of planner.strategies (it defines {', '.join(registries[knob])})"
            for knob, name in dict.fromkeys(named) if name not in registries[knob]]
