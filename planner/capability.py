"""Which dtypes a part can run, by its GpuSpec (never by its name).

fp8 needs an fp8 unit (Hopper, Blackwell, Ada, MI300); bf16 needs Ampere or newer (or a TPU /
Apple part that lists it); fp16 needs Volta or newer; anything else trains in fp32.
"""

from __future__ import annotations

from catalog.schema import GpuSpec

# what each precision needs from the part
PRECISION_NEEDS: dict[str, str] = {
    "fp32": "fp32", "amp-bf16": "bf16", "bf16": "bf16", "amp-fp16": "fp16", "fp8": "fp8",
}
WEIGHTS_NEEDS: dict[str, str] = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "int8"}


def has(gpu: GpuSpec, dtype: str) -> bool:
    return dtype in gpu.dtypes


def precision_problem(gpu: GpuSpec, precision: str) -> str | None:
    """Why ``gpu`` cannot train in ``precision`` (None when it can)."""
    need = PRECISION_NEEDS[precision]
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
        return ["bf16"] if finetune != "full" else ["amp-bf16", "bf16"]
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
    """Inference weight dtypes for weights: auto, most accurate first (int4 only when pinned)."""
    ladder = ["bf16"] if has(gpu, "bf16") else (["fp16"] if has(gpu, "fp16") else [])
    if has(gpu, "fp8"):
        ladder.append("fp8")
    if has(gpu, "bf16") or has(gpu, "fp16"):
        ladder.append("int8")
    return ladder or ["bf16"]


def multi_gpu_problem(gpu: GpuSpec, count: int) -> str | None:
    """Parts that cannot form a multi-GPU PyTorch job (Apple unified memory, TPU needs XLA)."""
    if count > 1 and gpu.vendor == "cpu":
        return f"{gpu.id} is this machine's CPU, one device; it cannot be combined into a {count}-device job"
    if count > 1 and gpu.vendor == "apple":
        return f"{gpu.id} is a single Apple SoC; it cannot be combined into a {count}-GPU job"
    return None
