"""`gpuplan run` and `gpuplan export`: run a job on this machine, and take its trained model out."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from commands import output
from commands.backend import open_backend
from commands.output import JSON_OPTION, handle_errors, print_fields, print_json, styled
from commands.settings import Settings

if TYPE_CHECKING:
    from workers.executors.local_runner import RunSummary

app = typer.Typer()  # run and export: top-level commands


@app.command("run")
@handle_errors
def run_command(
    spec_path: str = typer.Argument(..., metavar="SPEC", help="Job spec (YAML or JSON), task train or infer."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Where checkpoints (train) or "
                                              "outputs.jsonl (infer) go: a directory or s3://bucket/prefix "
                                              "(default ~/.gpuplan/checkpoints/<job name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the directory."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run through a local Ray started on demand "
                                 "(Ray Train, like a cluster) instead of bare in this process (the default: "
                                 "one local device needs no Ray and starts in seconds)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a job on this machine: the local GPU, else the CPU; checkpoints in a local directory or on S3.

    The model is a preset, {config: path/to/config.json} (random init), or a folder written by
    save_pretrained (training starts from its weights); paths are relative to the spec file.
    Training data is synthetic, or train.data: token ids (.npy/.bin) or JSONL text/chat with
    train.tokenizer. task: infer reads infer.prompts (JSONL) and appends to <checkpoint-dir>/outputs.jsonl;
    a rerun skips the prompts already answered. The strategy is the planner's best among this machine's
    own placements (`gpuplan plan` shows them as cloud 'local'; the CPU in fp32). Ctrl-C cancels (the
    last checkpoint stays; --resume continues from it). `gpuplan export` takes the trained model out.

    Examples:

      gpuplan run examples/tiny-train.yaml

      gpuplan run examples/tiny-train.yaml --json --checkpoint-dir /tmp/ck

      gpuplan run examples/tiny-train.yaml --resume --ray

      gpuplan run examples/tiny-infer.yaml --checkpoint-dir /tmp/answers

      gpuplan run examples/tiny-train.yaml --checkpoint-dir s3://my-bucket/runs/tiny --resume
    """
    from commands.specfile import load_spec
    from workers.executors.local_runner import run_local

    spec = load_spec(spec_path)
    ckpt = checkpoint_dir  # a string: s3://bucket/prefix through pathlib would become a folder named "s3:"
    home = Settings.from_env().home
    if as_json:
        run = run_local(spec, checkpoint_dir=ckpt, resume=resume, use_ray=use_ray, home=home)
    else:
        run = _run_with_progress(spec, ckpt, resume, use_ray, home)
    result = run.to_dict()
    if as_json:
        print_json(result)
    else:
        _print_run_summary(result)
    if result["status"] != "succeeded":
        raise typer.Exit(1)


def _run_with_progress(spec: Any, ckpt: Any, resume: bool, use_ray: bool, home: Path) -> Any:
    from commands.progress import progress_bar
    from workers.executors.local_runner import run_local

    progress, show = progress_bar(output.err_console, spec.name, infer=spec.task == "infer")
    with progress:
        return run_local(spec, checkpoint_dir=ckpt, resume=resume, use_ray=use_ray, on_status=show, home=home)


def _print_run_summary(result: RunSummary) -> None:
    def gib(value: float | None) -> str:
        return f"{value / 2**30:.2f} GiB" if value else "-"

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value else "-"

    def ms(value: float | None) -> str:
        return f"{value * 1e3:,.2f} ms" if value else "-"

    title = f"{result['job']}: {result['status']}"
    measured, predicted = result["measured"], result["predicted"]
    if result.get("task") == "infer":
        rows = [("message", result["message"]),
                ("strategy", f"{result['strategy_label']} ({result['engine']}, {result['device']})"),
                ("prompts answered", f"{result['steps']} / {result['total_steps']}"),
                ("outputs", result["outputs"]),
                ("tokens/s measured / predicted",
                 f"{rate(measured['tokens_per_s'])} / {rate(predicted['tokens_per_s'])}"),
                ("wall time", _wall(result)),
                ("cost", "$0.00 (local machine)")]
        if measured.get("prefill_s") is not None:  # the compiled decoder times a batch's two terms apart
            rows.insert(-2, ("prompt pass / decode step measured / predicted",
                             f"{ms(measured['prefill_s'])} / {ms(predicted.get('prefill_s'))}, "
                             f"{ms(measured.get('decode_step_s'))} / {ms(predicted.get('decode_step_s'))}"))
        print_fields(title, [(key, str(value)) for key, value in rows])
        return
    rows = [
        ("message", result["message"]),
        ("strategy", f"{result['strategy_label']} ({result['engine']}, {result['device']})"),
        ("steps", f"{result['steps']} / {result['total_steps']}"),
        ("final loss", f"{result['final_loss']:.4f}" if result["final_loss"] is not None else "-"),
        ("checkpoints", f"{result['checkpoints_written']} written to {result['checkpoint_dir']}"),
        ("resumes", str(result["resumes"]) + (f" (from step {result['resumed_from_step']})"
                                              if result["resumed_from_step"] is not None else "")),
        ("tokens/s measured / predicted", f"{rate(measured['tokens_per_s'])} / {rate(predicted['tokens_per_s'])}"),
        ("peak memory measured / predicted",
         f"{gib(measured['peak_allocated_bytes'] or measured['peak_rss_bytes'])}"
         # a CPU run measures the whole process (Python and PyTorch's own ~0.5 GiB), the plan its tensors
         f"{' (process RSS, runtime included)' if not measured['peak_allocated_bytes'] else ''} / "
         f"{gib(predicted['peak_allocated_bytes'])}{' (tensors)' if not measured['peak_allocated_bytes'] else ''}"),
        ("wall time", _wall(result)),
        ("cost", "$0.00 (local machine)"),
    ]
    print_fields(title, [(key, str(value)) for key, value in rows])


@app.command("export")
@handle_errors
def export_command(
    source: str = typer.Argument(..., metavar="SOURCE", help="A checkpoint directory, the name of a "
                                 "`gpuplan run` job, or a job id in the database (`gpuplan list`)."),
    out: str = typer.Option(..., "--out", "-o", help="New folder for the model (must not exist or be empty)."),
    merge: bool = typer.Option(False, "--merge", help="LoRA/QLoRA: fold the adapters into the weights and write "
                               "a plain model folder instead of a peft adapter."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a job's trained model as a Hugging Face folder (from its newest checkpoint).

    A full fine-tune gives a folder AutoModelForCausalLM.from_pretrained loads. LoRA/QLoRA gives a
    peft adapter folder, read from the checkpoint alone (its base is the weights folder it was trained
    from, or a random init named by its seed). --merge writes that adapter to OUT/adapter first, then
    builds the base (on the GPU if there is one) and writes merged weights. The run's tokenizer, if any,
    is saved beside them. Each stage is reported on stderr as it starts.

    Examples:

      gpuplan export tiny-train --out ./tiny-model

      gpuplan export ~/.gpuplan/checkpoints/my-lora --out ./adapter

      gpuplan export j-0123456789abcdef --out ./merged --merge --json
    """
    from workers.model.export import export_checkpoint

    uri, note = _export_source(source)
    if note and not as_json:
        output.err_console.print(f"note: {note}", highlight=False)
    result = export_checkpoint(uri, Path(out).expanduser(), merge=merge, progress=_stage_printer()).to_dict()
    if as_json:
        print_json({**result, "note": note})
        return
    base = result["base"] or (f"a random init of {result['model']} (seed {result['base_seed']}; "
                              "--merge writes it merged)")
    what = {"model": "model", "adapter": f"peft adapter on {base}", "merged": "merged model"}
    output.console.print(styled(("exported", "bold green"), f" step {result['step']} of {result['job'] or source} as a "
                                f"{what[result['kind']]} to {result['out']}"
                                + (" (with its tokenizer)" if result["tokenizer"] else "")), highlight=False)


def _stage_printer() -> Callable[[str], None]:
    """Each export stage on stderr as it starts, with the time so far: an 8B base takes minutes on a CPU,
    and a silent command looks hung. stdout stays the result alone (--json)."""
    start = time.monotonic()

    def stage(text: str) -> None:
        output.err_console.print(styled((f"[{time.monotonic() - start:6.1f} s]", "dim"), f" {text} ..."),
                                 highlight=False, soft_wrap=True)

    return stage


def _export_source(source: str) -> tuple[str, str | None]:
    """(checkpoint uri, a note for the user) for a directory, a local run's name or a database job id."""
    from errors import NotFound

    if "://" in source or Path(source).expanduser().is_dir():
        return source, None
    local = Settings.from_env().home / "runs" / source / "result.json"
    if local.is_file():
        run = json.loads(local.read_text())
        return str(run["checkpoint_dir"]), None
    try:
        job = open_backend().status(source)
    except NotFound:
        raise NotFound(f"{source!r} is not a checkpoint directory, a `gpuplan run` job or a job id in the database",
                       hint="give the directory of its checkpoints, or see `gpuplan list`") from None
    uri = job.checkpoint_uri
    if not uri or ("://" not in uri and not Path(uri).expanduser().is_dir()):
        raise NotFound(f"job {job.id} ({job.state}) has no checkpoint to export",
                       hint=f"a job has one once it has saved a step; see `gpuplan status {job.id}`")
    note = None if job.state == "succeeded" else f"job {job.id} is {job.state}: exporting its newest checkpoint"
    return uri, note


def _wall(result: RunSummary) -> str:
    """The run's wall time, and the plan's where there is one (its start counts the process and the plan too,
    which this in-process run had done before its clock started)."""
    planned = result["predicted"].get("wall_s")
    return f"{result['wall_s']:.1f} s" + (f" (planned {planned:.0f} s with the process start)" if planned else "")
