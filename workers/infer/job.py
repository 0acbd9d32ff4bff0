"""An inference attempt as the executors run it: the spec's generation, resumable by request index.

Outputs go to ``<checkpoint_uri>/outputs.jsonl``: a local or shared directory, or ``s3://bucket/prefix``
(staged on the node's disk and put back as it grows: ``workers.infer.s3_outputs``). A resubmitted attempt,
or a retry after a lost node, skips the requests already written there, so none is duplicated.
Both executors call :func:`run_infer_attempt` (in a thread, or in a Ray task).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from errors import InvalidInput
from workers.executors.protocol import RunRequest
from workers.train.hooks import ProgressEvent, StopRequested

if TYPE_CHECKING:
    from workers.infer.generate import InferenceResult
    from workers.infer.s3_outputs import S3Outputs

OUTPUTS_FILE = "outputs.jsonl"


def outputs_folder(request: RunRequest) -> Path:
    """The folder the attempt appends its outputs in: the checkpoint directory itself, or this node's
    staging copy of an ``s3://`` one (``workers.infer.s3_outputs``); other object stores are refused."""
    uri = request.checkpoint_uri
    if uri.startswith("s3://"):
        from workers.infer.s3_outputs import staging_folder

        return staging_folder(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise InvalidInput(f"inference outputs cannot go to {uri!r}", path="checkpoint_uri",
                           hint="give a directory path, file:///path or s3://bucket/prefix")
    return Path(uri.removeprefix("file://")).expanduser()


def _lines_written(outputs: Path) -> int:
    """Whole lines already in the outputs file: the requests an earlier try finished (a count for
    progress only; ``load_finished`` is what decides what is skipped)."""
    if not outputs.exists():
        return 0
    return outputs.read_bytes().count(b"\n")


def _s3_outputs(request: RunRequest, outputs: Path, on_log: Callable[[str], None]) -> S3Outputs | None:
    """The S3 side of an ``s3://`` attempt, its object copied here first (None: a directory)."""
    if not request.checkpoint_uri.startswith("s3://"):
        return None
    from workers.infer.s3_outputs import S3Outputs

    remote = S3Outputs(request.checkpoint_uri, outputs)
    if remote.download():
        on_log(f"copied {remote.uri} to {outputs} to resume from it")
    return remote


def run_infer_attempt(request: RunRequest, *, device: str | None, on_progress: Callable[[ProgressEvent], None],
                      on_log: Callable[[str], None], cpu_threads: int | None = None,
                      should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Generate the requests not yet in the outputs; returns the result (``status`` "succeeded", or
    "stopped" when ``should_stop``, asked after each written batch, said to stop for a changeover: the
    outputs then hold whole batches, flushed, and on S3 uploaded, for the next attempt to resume from)."""
    from workers.executors.cuda_env import configure_allocator

    configure_allocator()  # before torch touches CUDA (workers.infer.generate builds the model)
    from workers.model.isolation import load_libraries

    load_libraries("transformers")  # once per process, under a lock: attempts may start side by side
    from workers.infer.generate import run_infer_spec

    if cpu_threads and device == "cpu":
        import torch

        torch.set_num_threads(cpu_threads)  # as training does: OpenMP spinning on a busy box costs 10x

    folder = outputs_folder(request)
    folder.mkdir(parents=True, exist_ok=True)
    outputs = folder / OUTPUTS_FILE
    remote = _s3_outputs(request, outputs, on_log)
    seed = request.spec.train.seed if request.spec.train else 0
    already = _lines_written(outputs)
    on_progress({"event": "started", "step": already, "total_steps": 0, "tokens": 0,
                 "resumed_from_step": already or None})
    if already:
        on_log(f"resuming: {already} requests are already in {outputs}")

    def progress(done: int, total: int) -> None:
        if remote is not None:
            remote.upload_if_due()
        on_progress({"event": "step", "step": done, "total_steps": total, "tokens": 0, "loss": None,
                     "tokens_per_s": None})
        if should_stop is not None and done < total and should_stop():
            raise StopRequested(done, total)  # the batch is written and fsynced: stop here

    planned = request.strategy
    # a planned GPU strategy carries the weights dtype its memory estimate assumed
    weights = planned.weights if planned.task == "infer" and planned.gpu != "cpu" else None
    try:
        result = run_infer_spec(request.spec, outputs, workdir=folder, seed=seed, device=device, progress=progress,
                                weights=weights)
    except StopRequested as stop:
        if remote is not None:
            remote.upload()  # the next attempt, on another node, resumes from the object
        where = remote.uri if remote is not None else outputs
        on_log(f"{stop}: outputs flushed to {where}; the next attempt resumes there")
        stopped = _stopped_result(stop, already)
        on_progress({"event": "finished", "result": stopped})
        return stopped
    except BaseException:
        if remote is not None:
            remote.upload_after_failure()  # what was generated before the failure is kept
        raise
    if remote is not None:
        remote.upload()  # a put that fails fails the attempt: the outputs are not where they should be
    where = remote.uri if remote is not None else outputs
    on_log(f"generated {result.requests_done} requests ({result.requests_skipped} already done) into {where}, "
           f"{result.tokens_per_s:,.0f} tokens/s (model load {result.load_seconds:.1f} s){_steady_words(result)}")
    finished = _finished_result(result)
    on_progress({"event": "finished", "result": finished})
    return finished


def _steady_words(result: InferenceResult) -> str:
    """The log's account of the time after the first batch: speed, share decoding, and the decoder's split."""
    steady = (f"; after the first batch {result.steady_tokens_per_s:,.0f} tokens/s, {result.steady_generate_share:.1%} "
              f"of it decoding ({result.decoder} decoder"
              + (f", {result.moe_kernel} experts)" if result.moe_kernel else ")")
              if result.steady_tokens_per_s and result.steady_generate_share else "")
    if result.steady_prefill_s is not None and result.steady_step_s is not None:
        steady += (f"; a batch's prompt pass {result.steady_prefill_s * 1e3:,.1f} ms, a decode step "
                   f"{result.steady_step_s * 1e3:,.2f} ms")
    return steady


def _stopped_result(stop: StopRequested, already: int) -> dict[str, Any]:
    """The result of an attempt stopped for a changeover after ``stop.done`` requests."""
    return {"status": "stopped", "steps": stop.done, "total_steps": stop.total, "tokens": 0,
            "final_loss": None, "checkpoints_written": 0,
            "resumed_from_step": already or None, "checkpoint_step": stop.done,
            "predicted": {}}


def _finished_result(result: InferenceResult) -> dict[str, Any]:
    """The result of an attempt that generated every request, in the fields a training result reports too."""
    return {"status": "succeeded", "steps": result.requests_total,
            "total_steps": result.requests_total, "tokens": result.tokens_generated, "final_loss": None,
            "checkpoints_written": 0, "resumed_from_step": result.requests_skipped or None,
            "steady_tokens_per_s": result.steady_tokens_per_s or result.tokens_per_s,
            "tokens_per_s": result.tokens_per_s,
            "peak_allocated_bytes": result.peak_memory_bytes, "wall_s": result.seconds + result.load_seconds,
            "decoder": result.decoder, "moe_kernel": result.moe_kernel, "predicted": {},
            "prefill_s": result.steady_prefill_s, "decode_step_s": result.steady_step_s}
