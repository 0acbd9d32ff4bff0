"""The embedded default behind ``gpuplan run``: one job on this machine, nothing to start by hand.

The strategy is the planner's best among this machine's own $0/h placements, its GPUs and its CPU
(``catalog.local_cpu.with_this_machine``: the universe ``gpuplan plan`` and ``submit`` choose from).
The job runs either bare in this process
(``InProcessExecutor``: the default for one local device, no Ray start-up cost) or through a
local Ray started on demand (``RayExecutor``), with checkpoints in a local directory.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from catalog.local import LOCAL_CLOUD
from catalog.local_cpu import CPU_ID, training_threads
from catalog.schema import ModelConfig
from errors import Conflict, GpuplanError, InvalidInput
from planner.calibration import CostCalibration, load_user_calibration
from planner.cpu import check_fits_in_ram, cpu_strategy, predict_on_cpu
from planner.decoder import moe_decode_phrase
from planner.prediction import Prediction, prediction_of
from planner.spec import JobSpec
from planner.types import Strategy
from workers.executors.protocol import RunRequest, RunStatus


@dataclass
class LocalPlan:
    strategy: Strategy
    device: str  # "cuda" or "cpu"
    predicted: Prediction = field(default_factory=Prediction)  # none on a CPU serving a model
    note: str = ""
    # what the planner predicted from (the part, the model, the sequence lengths): kept with the
    # result so `gpuplan calibrate` can predict the run again under refitted constants
    inputs: dict[str, Any] = field(default_factory=dict)


def planner_inputs(spec: JobSpec, model: ModelConfig, gpu: Any) -> dict[str, Any]:
    """The planner's inputs for one run besides its strategy, as JSON (see ``LocalPlan.inputs``)."""
    out: dict[str, Any] = {"gpu": gpu.model_dump(mode="json"), "model": model.model_dump(mode="json")}
    if spec.train is not None:
        out["seq_len"] = spec.train.seq_len
    if spec.infer is not None and spec.task == "infer":
        out["prompt_tokens"], out["output_tokens"] = spec.infer.prompt_tokens, spec.infer.output_tokens
    return out


def available_ram_bytes() -> int | None:
    """This machine's available memory (Linux MemAvailable); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def plan_locally(spec: JobSpec, *, home: Path,
                 ram_bytes: Callable[[], int | None] = available_ram_bytes) -> LocalPlan:
    """The strategy for this machine: the planner's best placement among this machine's own offers.

    The offers are :func:`catalog.local_cpu.with_this_machine`'s (its GPUs and its CPU at $0/h), the
    same universe ``gpuplan plan`` and ``submit`` choose from, restricted to this machine: where the
    plan's choice is local, ``run`` runs it. The spec's deadline and budget do not bind here (a local
    run costs nothing and starts now). On CPU a model whose weights alone exceed the available memory
    is refused first: building it would swap or be OOM-killed (an 8B model is 30 GiB in fp32).
    """
    from workers.model.build import resolve_model_source

    source = resolve_model_source(spec)  # a bad model reference fails here, before anything starts
    from planner.spec import check_model

    check_model(spec, source.config)  # a sequence longer than the model's context, before anything starts
    check_inputs(spec, source)
    machine = machine_catalog(home)
    if all(o.gpu == CPU_ID for o in machine.offers if o.cloud == LOCAL_CLOUD):  # no GPU here: RAM says it first
        check_fits_in_ram(source.config, cpu_strategy(spec), ram_bytes())
    est = machine_choice(spec, source.config, machine, home).estimate
    if est.strategy.gpu == CPU_ID:
        strategy = est.strategy
        doing = "training" if spec.task == "train" else "generating"
        predicted, inputs = Prediction(), {}
        if spec.task == "train":
            predicted = predict_on_cpu(spec, source.config, strategy, _this_cpu(home), load_user_calibration(home))
            inputs = planner_inputs(spec, source.config, _this_cpu(home))
        return LocalPlan(strategy=strategy, device="cpu", predicted=predicted,
                         note=f"no supported GPU here: {doing} on the CPU", inputs=inputs)
    # the workers follow the same rules (decoder_for, moe_decode_kernel)
    kernel = moe_decode_phrase(est.throughput.decoder, est.throughput.moe_kernel)
    return LocalPlan(strategy=est.strategy, device="cuda", predicted=prediction_of(est),
                     note=f"planned for the local {est.strategy.gpu}{kernel}",
                     inputs=planner_inputs(spec, source.config, machine.gpu(est.strategy.gpu)))


def machine_catalog(home: Path) -> Any:
    """The packaged catalog plus this machine's $0/h GPUs and CPU (the one placement universe)."""
    from datetime import date

    from catalog.loader import load_catalog
    from catalog.local_cpu import with_this_machine

    return with_this_machine(load_catalog(), home, today=date.today())


def machine_choice(spec: JobSpec, model: ModelConfig, machine: Any, home: Path) -> Any:
    """The planner's chosen candidate among this machine's own offers, for ``gpuplan run``.

    Raises InvalidInput, saying why, where nothing local fits (the cloud offers are ``gpuplan plan``'s)."""
    from catalog.local_cpu import local_offers
    from errors import NoFeasiblePlan
    from planner.search import plan

    here = spec.model_copy(update={"resources": spec.resources.model_copy(
        update={"deadline": None, "budget_usd": None, "clouds": None, "regions": None})})
    try:
        return plan(here, local_offers(machine), calibration=load_user_calibration(home), model=model).chosen
    except NoFeasiblePlan as exc:
        raise InvalidInput(f"the job does not run on this machine: {exc.message}",
                           hint="see `gpuplan plan` for placements that fit, and `gpuplan submit` to run "
                                "on them") from None


def _this_cpu(home: Path, probe: Any = None) -> Any:
    from datetime import date

    from catalog.local_cpu import local_cpu

    return local_cpu(home, today=date.today(), probe=probe)[0]


def check_inputs(spec: JobSpec, source: Any) -> None:
    """Data, tokenizer and prompts files are checked before anything starts, so a typo costs nothing."""
    if spec.train is not None and spec.train.data is not None:
        from workers.train.batches import check_data

        check_data(spec.train, source)
    if spec.infer is not None:
        for name, value in (("prompts", spec.infer.prompts), ("tokenizer", spec.infer.tokenizer)):
            if value is not None and not Path(value).expanduser().exists():
                raise InvalidInput(f"the {name} path {value!r} does not exist", path=f"infer.{name}",
                                   hint="paths in a spec file are relative to that file")


class MeasuredSummary(TypedDict):
    peak_allocated_bytes: float | None
    peak_reserved_bytes: float | None
    peak_rss_bytes: float | None
    tokens_per_s: float | None
    wall_tokens_per_s: float | None
    checkpoint_save_s: float | None
    micro_batch: float | None
    grad_accum: float | None
    checkpoint_interval_steps: float | None
    checkpoint_interval_s: float | None
    checkpoint_stall_s: float | None
    checkpoint_durable_s: float | None
    prefill_s: float | None  # inference, compiled decoder: a batch's prompt pass, after the first batch
    decode_step_s: float | None  # inference, compiled decoder: one decode step


class RunSummary(TypedDict):
    """A finished local run: what `gpuplan run` prints (and --json shows), and runs/<job>/result.json holds."""

    job: str
    status: str  # a RunState value
    message: str
    steps: int  # train: optimizer steps; infer: prompts answered
    total_steps: int
    tokens: int
    final_loss: float | None
    checkpoints_written: int
    checkpoint_dir: str
    resumes: int
    resumed_from_step: int | None
    strategy: dict[str, Any]
    strategy_label: str
    device: str
    engine: str
    wall_s: float
    cost_usd: float
    measured: MeasuredSummary
    oom_backoffs: list[dict[str, int]]
    predicted: dict[str, Any]  # planner.prediction.Prediction.record(): the plan's numbers for this run
    note: str
    task: str
    outputs: str | None  # infer: the answers file
    planner_inputs: dict[str, Any]  # what the prediction was made from (gpuplan calibrate refits on it)


@dataclass
class LocalRun:
    job_id: str
    checkpoint_dir: str  # a resolved local directory, or s3://bucket/prefix
    plan: LocalPlan
    status: RunStatus
    wall_s: float
    engine: str  # "in-process" | "ray"

    def to_dict(self) -> RunSummary:
        m = self.status.metrics
        p = self.status.progress

        def num(key: str) -> float | None:
            return m.get(key)

        return {
            "job": self.job_id,
            "status": self.status.state.value,
            "message": self.status.message,
            "steps": p.step,
            "total_steps": p.total_steps,
            "tokens": p.tokens,
            "final_loss": p.loss,
            "checkpoints_written": p.checkpoints,
            "checkpoint_dir": str(self.checkpoint_dir),
            "resumes": int(m.get("resumes", 0)),
            "resumed_from_step": p.resumed_from_step,
            "strategy": self.plan.strategy.model_dump(mode="json"),
            "strategy_label": self.plan.strategy.label(),
            "device": self.plan.device,
            "engine": self.engine,
            "wall_s": round(self.wall_s, 3),
            "cost_usd": 0.0,
            "measured": {
                "peak_allocated_bytes": num("measured_peak_allocated_bytes"),
                "peak_reserved_bytes": num("measured_peak_reserved_bytes"),
                "peak_rss_bytes": num("measured_peak_rss_bytes"),
                "tokens_per_s": num("measured_tokens_per_s"),
                "wall_tokens_per_s": num("measured_wall_tokens_per_s"),
                "prefill_s": num("measured_prefill_s"),
                "decode_step_s": num("measured_decode_step_s"),
                "checkpoint_save_s": num("checkpoint_save_s"),
                "micro_batch": num("micro_batch"),
                "grad_accum": num("grad_accum"),
                "checkpoint_interval_steps": num("checkpoint_interval_steps"),
                "checkpoint_interval_s": num("checkpoint_interval_s"),
                "checkpoint_stall_s": num("checkpoint_stall_s"),
                "checkpoint_durable_s": num("checkpoint_durable_s"),
            },
            "oom_backoffs": self.status.oom_backoffs,
            "predicted": self.plan.predicted.record(),  # the plan's, even when the run failed before reporting
            "note": self.plan.note,
            "planner_inputs": self.plan.inputs,
            "task": self.plan.strategy.task,
            "outputs": f"{self.checkpoint_dir}/outputs.jsonl" if self.plan.strategy.task == "infer" else None,
        }


def run_local(spec: JobSpec, *, checkpoint_dir: str | Path | None = None, resume: bool = False, use_ray: bool = False,
              on_status: Callable[[RunStatus], None] | None = None, poll_s: float = 0.5,
              home: Path) -> LocalRun:
    """Run ``spec`` here to the end; ``on_status`` sees every poll (the CLI draws its progress bar)."""
    from workers.executors.cuda_env import configure_allocator

    configure_allocator()  # before detecting the local GPU initialises CUDA in this process
    job_id = spec.name
    ckpt = checkpoint_location(checkpoint_dir, home / "checkpoints" / job_id)
    _check_resume(ckpt, resume)
    plan = plan_locally(spec, home=home)
    if spec.infer is not None and spec.infer.weights == "auto":  # the worker reads the spec: give it the plan's
        spec = spec.model_copy(update={"infer": spec.infer.model_copy(update={"weights": plan.strategy.weights})})
    threads = training_threads()
    cost = load_user_calibration(home).cost  # the checkpoint interval's write speed and spot hazard
    started = time.perf_counter()
    request = RunRequest(job_id=job_id, attempt=1, spec=spec, strategy=plan.strategy, checkpoint_uri=str(ckpt),
                         run_name=f"{job_id}-{datetime.now(UTC):%Y%m%d%H%M%S}")
    if use_ray:
        executor: Any = _local_ray_executor(home, plan, threads, cost)
        engine = "ray"
    else:
        from workers.executors.inprocess import InProcessExecutor

        executor = InProcessExecutor(device=plan.device, cpu_threads=threads,
                                     predict=lambda _r: plan.predicted.numbers(),
                                     resources={"CPU": float(os.cpu_count() or 1), "GPU": 8.0,
                                                f"accelerator_type:{plan.strategy.gpu.split('-')[0]}": 8.0},
                                     cost=cost)
        engine = "in-process"
    handle = executor.submit(request)
    try:
        while True:
            status = executor.status(handle)
            if on_status is not None:
                on_status(status)
            if status.state.finished:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        executor.cancel(handle)
        status = executor.wait(handle, timeout=120)
    run = LocalRun(job_id=job_id, checkpoint_dir=ckpt, plan=plan, status=status,
                   wall_s=time.perf_counter() - started, engine=engine)
    _write_result(home, run, executor.logs(handle))
    return run


def checkpoint_location(given: str | Path | None, default: Path) -> str:
    """Where a local run's checkpoints go: ``s3://bucket/prefix`` as given (the worker's store reaches it,
    as under the server's S3 checkpoint root), else the local directory, resolved (``s3:/x`` through
    pathlib would be a folder named ``s3:``)."""
    if given is not None and str(given).startswith("s3://"):
        return str(given).rstrip("/")
    if given is not None and "://" in str(given):
        raise InvalidInput(f"--checkpoint-dir {given!r}: only local directories and s3://bucket/prefix are supported",
                           path="checkpoint_dir", hint="give a directory, or s3://bucket/prefix")
    return str(Path(given or default).expanduser().resolve())


def _check_resume(ckpt: str, resume: bool) -> None:
    from workers.checkpoint.local import open_store

    if not ckpt.startswith("s3://") and not Path(ckpt).exists():
        return
    latest = open_store(ckpt).latest()  # on S3: a missing bucket or no credentials fail here, before the run
    if latest is not None and not resume:
        raise Conflict(f"{ckpt} already holds checkpoints of this job (newest: step {latest.step})",
                       hint="pass --resume to continue from it, or --checkpoint-dir DIR to start afresh elsewhere")


def _local_ray_executor(home: Path, plan: LocalPlan, threads: int, cost: CostCalibration) -> Any:
    import ray

    from workers.executors.ray_executor import RayExecutor

    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private, local-only Ray
        ray.init(num_cpus=os.cpu_count() or 2, object_store_memory=96 * 1024 * 1024, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)
    return RayExecutor(storage_path=str(home / "ray"), cpu_threads=threads,
                       predict=lambda _r: plan.predicted.numbers(), log_every_s=1.0, cost=cost)


def _write_result(home: Path, run: LocalRun, logs: list[str]) -> None:
    """The finished job as JSON next to its logs: what the planner's recalibration reads."""
    folder = home / "runs" / run.job_id
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "result.json").write_text(json.dumps(run.to_dict(), indent=2))
        (folder / "train.log").write_text("\n".join(logs) + "\n")
    except OSError as exc:
        raise GpuplanError(f"the run finished but its result could not be written to {folder}: {exc}") from exc

