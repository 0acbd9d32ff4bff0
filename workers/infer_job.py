"""An inference attempt as the executors run it: the spec's generation, resumable by request index.

Outputs go to ``<checkpoint_uri>/outputs.jsonl`` (a local or shared directory): a resubmitted
attempt, or a retry after a lost node, skips the requests already written there, so none is
redone or duplicated. Both executors call :func:`run_infer_attempt` (in a thread, or in a Ray task).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from catalog.errors import InvalidInput
from workers.executor import RunRequest

OUTPUTS_FILE = "outputs.jsonl"


def outputs_folder(request: RunRequest) -> Path:
    """Where the attempt's outputs go; an object store is refused (outputs are appended and fsynced)."""
    if "://" in request.checkpoint_uri and not request.checkpoint_uri.startswith("file://"):
        raise InvalidInput("inference outputs need a local or shared directory, not an object store",
                           path="checkpoint_uri", hint="give a directory path")
    return Path(request.checkpoint_uri.removeprefix("file://")).expanduser()


def _lines_written(outputs: Path) -> int:
    """Whole lines already in the outputs file: the requests an earlier try finished (a count for
    progress only; ``load_finished`` is what decides what is skipped)."""
    if not outputs.exists():
        return 0
    return outputs.read_bytes().count(b"\n")


def run_infer_attempt(request: RunRequest, *, device: str | None, on_progress: Callable[[dict[str, Any]], None],
                      on_log: Callable[[str], None], cpu_threads: int | None = None) -> dict[str, Any]:
    from workers.cuda_env import configure_allocator

    configure_allocator()  # before torch touches CUDA (workers.infer builds the model)
    from workers.infer import run_infer_spec

    if cpu_threads and device == "cpu":
        import torch

        torch.set_num_threads(cpu_threads)  # as training does: OpenMP spinning on a busy box costs 10x

    folder = outputs_folder(request)
    folder.mkdir(parents=True, exist_ok=True)
    outputs = folder / OUTPUTS_FILE
    seed = request.spec.train.seed if request.spec.train else 0
    already = _lines_written(outputs)
    on_progress({"event": "started", "step": already, "total_steps": 0, "tokens": 0,
                 "resumed_from_step": already or None})
    if already:
        on_log(f"resuming: {already} requests are already in {outputs}")

    def progress(done: int, total: int) -> None:
        on_progress({"event": "step", "step": done, "total_steps": total, "tokens": 0, "loss": None,
                     "tokens_per_s": None})

    planned = request.strategy
    # a planned GPU strategy carries the weights dtype its memory estimate assumed
    weights = planned.weights if planned.task == "infer" and planned.gpu != "cpu" else None
    result = run_infer_spec(request.spec, outputs, workdir=folder, seed=seed, device=device, progress=progress,
                            weights=weights)
    steady = (f"; after the first batch {result.steady_tokens_per_s:,.0f} tokens/s, {result.steady_generate_share:.1%} "
              "of it inside generate()" if result.steady_tokens_per_s and result.steady_generate_share else "")
    on_log(f"generated {result.requests_done} requests ({result.requests_skipped} already done) into {outputs}, "
           f"{result.tokens_per_s:,.0f} tokens/s (model load {result.load_seconds:.1f} s){steady}")
    finished = {"event": "finished", "status": "succeeded", "steps": result.requests_total,
                "total_steps": result.requests_total, "tokens": result.tokens_generated, "final_loss": None,
                "checkpoints_written": 0, "resumed_from_step": result.requests_skipped or None,
                "steady_tokens_per_s": result.steady_tokens_per_s or result.tokens_per_s,
                "tokens_per_s": result.tokens_per_s,
                "peak_allocated_bytes": result.peak_memory_bytes, "wall_s": result.seconds + result.load_seconds,
                "predicted": {}}
    on_progress(finished)
    return finished
