"""An inference attempt as the executors run it: the spec's generation, resumable by request index.

Outputs go to ``<checkpoint_uri>/outputs.jsonl`` (a local directory): a resubmitted attempt skips
the requests already written there, so none is redone or duplicated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from catalog.errors import InvalidInput
from workers.executor import RunRequest


def run_infer_attempt(request: RunRequest, *, device: str | None, on_progress: Callable[[dict[str, Any]], None],
                      on_log: Callable[[str], None]) -> dict[str, Any]:
    from workers.infer import run_infer_spec

    if "://" in request.checkpoint_uri and not request.checkpoint_uri.startswith("file://"):
        raise InvalidInput("inference outputs need a local or shared directory, not an object store",
                           path="checkpoint_uri", hint="give a directory path")
    folder = Path(request.checkpoint_uri.removeprefix("file://")).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    outputs = folder / "outputs.jsonl"
    seed = request.spec.train.seed if request.spec.train else 0
    on_progress({"event": "started", "step": 0, "total_steps": 0, "tokens": 0, "resumed_from_step": None})

    def progress(done: int, total: int) -> None:
        on_progress({"event": "step", "step": done, "total_steps": total, "tokens": 0, "loss": None,
                     "tokens_per_s": None})

    result = run_infer_spec(request.spec, outputs, workdir=folder, seed=seed, device=device, progress=progress)
    on_log(f"generated {result.requests_done} requests ({result.requests_skipped} already done) into {outputs}, "
           f"{result.tokens_per_s:,.0f} tokens/s")
    finished = {"event": "finished", "status": "succeeded", "steps": result.requests_total,
                "total_steps": result.requests_total, "tokens": result.tokens_generated, "final_loss": None,
                "checkpoints_written": 0, "resumed_from_step": result.requests_skipped or None,
                "steady_tokens_per_s": result.tokens_per_s, "tokens_per_s": result.tokens_per_s,
                "peak_allocated_bytes": result.peak_memory_bytes, "wall_s": result.seconds + result.load_seconds,
                "predicted": {}}
    on_progress(finished)
    return finished
