"""`gpuplan plan` and `gpuplan estimate`: what fits, how fast, what it costs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from commands import output
from commands.output import (
    JSON_OPTION,
    Col,
    gib,
    handle_errors,
    print_json,
    print_table,
    styled,
    to_jsonable,
    usd,
    warn,
)
from commands.settings import Settings
from errors import InvalidInput, NoFeasiblePlan
from planner.decoder import moe_decode_phrase
from planner.prediction import prediction_of

app = typer.Typer()  # plan and estimate: top-level commands


def load_planning_inputs(spec_path: str, *, this_machine: bool = True) -> tuple[Any, Any, Any, Any]:
    """(spec, catalog, model, calibration) for the commands that plan (plan, estimate, cluster, report).

    ``this_machine``: the catalog holds this machine's GPUs and CPU at $0/h, as ``submit`` and ``run``
    plan with (catalog.local_cpu.with_this_machine), so one spec gets one placement everywhere; a
    cluster config plans the cloud offers only."""
    from datetime import date

    from catalog.loader import load_catalog, resolve_model
    from catalog.local_cpu import with_this_machine
    from commands.specfile import load_spec
    from planner.calibration import load_user_calibration
    from planner.spec import ModelRef

    spec = load_spec(spec_path)
    catalog = load_catalog()
    if this_machine:
        catalog = with_this_machine(catalog, Settings.from_env().home, today=date.today())
    model = resolve_model(catalog, spec.model.config if isinstance(spec.model, ModelRef) else spec.model)
    return spec, catalog, model, load_user_calibration(Settings.from_env().home)


def user_calibration() -> Path:
    """``gpuplan calibrate``'s file under the gpuplan home, laid over the shipped calibration if present."""
    from planner.calibration import user_calibration_path

    return user_calibration_path(Settings.from_env().home)


def check_objective(objective: str) -> None:
    if objective not in ("cheapest", "fastest"):
        raise InvalidInput(f"must be cheapest or fastest, got {objective!r}", path="--objective")


@app.command("plan")
@handle_errors
def plan_command(
    spec: str = typer.Argument(..., help="Job spec, YAML or JSON (see examples/)."),
    objective: str = typer.Option("cheapest", "--objective", help="cheapest (meeting the deadline) or fastest."),
    top: int = typer.Option(10, "--top", min=1, help="How many ranked candidates to show."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every way to run the job: GPU x count x strategy x offer x spot/on-demand, ranked, with rejections.

    Examples:

      gpuplan plan examples/llama3-8b-sft.yaml

      gpuplan plan examples/llama3-8b-sft.yaml --objective fastest --top 5 --json
    """
    from datetime import date

    from planner.search import plan, summarize_rejections

    check_objective(objective)
    job, catalog, model, calibration = load_planning_inputs(spec)
    result = plan(job, catalog, objective=objective, calibration=calibration, model=model,  # type: ignore[arg-type]
                  today=date.today())
    _warn_plain_bf16(job)
    if as_json:
        doc = to_jsonable(result)
        for candidate in [*(doc.get("candidates") or []), *([doc["chosen"]] if doc.get("chosen") else [])]:
            candidate["estimate"]["numerics"] = _numerics(candidate["estimate"]["strategy"])
        print_json(doc)
        return
    _print_plan_table(result, objective, top, deadline=job.resources.deadline)
    chosen = result.chosen
    if chosen is not None:
        output.console.print(styled(("chosen:", "bold"), " " + _chosen_line(chosen)), highlight=False)
    groups = summarize_rejections(result.rejections)
    if groups:
        print_table(f"{len(result.rejections)} rejected options (all in --json)",
                    [Col("constraint"), Col("count", right=True), Col("example", wrap=True)],
                    [[constraint, str(count), example] for constraint, count, example in groups])
    for warning in result.warnings:
        warn(warning)


# Plan table columns, most important first; ``drop`` says which go first on a narrow terminal.
PLAN_COLS = [
    Col("#", right=True), Col("GPUs / strategy", wrap=True), Col("numerics", wrap=True, drop=2),
    Col("cloud instance region", wrap=True),
    Col("market"), Col("GiB need/limit", right=True, drop=1), Col("tok/s", right=True, drop=4),
    Col("hours", right=True), Col("preempt h", right=True, drop=5), Col("P(deadline)", right=True, drop=6),
    Col("$/h", right=True, drop=3), Col("total $", right=True),
]


def _print_plan_table(result: Any, objective: str, top: int, *, deadline: float | None) -> None:
    # hours and total $ are expected values: on spot they include the preemption overhead column
    cols = [c for c in PLAN_COLS if deadline is not None or c.header != "P(deadline)"]
    rows: list[list[str | Text]] = []
    for i, c in enumerate(result.candidates[:top], 1):
        e = c.estimate
        row: list[str | Text] = [
            f"{i}*" if c.pareto else str(i), e.strategy.label(), _numerics(e.strategy) or "-",
            f"{c.offer.cloud} {c.offer.instance_type} {c.offer.region}", c.cost.market,
            f"{gib(e.memory.required_bytes)}/{gib(e.memory.limit_bytes)}", f"{e.throughput.tokens_per_s:,.0f}",
            f"{c.cost.hours:,.1f}", f"{c.cost.preemption_overhead_h:,.2f}" if c.cost.market == "spot" else "-"]
        if deadline is not None:
            row.append("-" if c.cost.deadline_probability is None else f"{c.cost.deadline_probability:.0%}")
        rows.append([*row, f"{c.cost.usd_per_h:,.2f}", f"{c.cost.usd:,.0f}"])
    headroom = result.candidates[0].estimate.memory.headroom if result.candidates else 0.0
    print_table(f"{result.job}: {len(result.candidates)} candidates ({objective}; * = cost/time Pareto front; "
                f"limit = usable memory less {headroom:.0%} headroom)", cols, rows)


def _numerics(strategy: Any) -> str | None:
    """What a training candidate's weight updates go through (planner/numerics.py); None for inference."""
    from planner.numerics import numerics

    fields = strategy if isinstance(strategy, dict) else strategy.model_dump()
    return numerics(str(fields["precision"]), str(fields["finetune"])) if fields["task"] == "train" else None


def _warn_plain_bf16(job: Any) -> None:
    """A pinned precision that rounds a full fine-tune's updates to nearest where one of the same memory rounds
    them stochastically (planner.strategies.stochastic_twin)."""
    from planner.strategies import AUTO, finetune_kind, stochastic_twin

    train = job.train
    if train is None or train.precision == AUTO or finetune_kind(train.finetune).adapters:
        return
    twin = stochastic_twin(train.precision)
    if twin is not None:
        warn(f"precision {train.precision} rounds every update to the nearest bf16: at fine-tuning learning rates "
             "most round to nothing and the weights barely move (docs/NUMERICS.md); precision "
             f"{twin} takes the same memory and rounds stochastically")


def _chosen_line(chosen: Any) -> str:
    from commands.human import duration, money

    e = chosen.estimate
    extra = ""
    if chosen.cost.market == "spot" and chosen.cost.checkpoint_interval_h:
        extra = f", checkpoint every {chosen.cost.checkpoint_interval_h * 60:.0f} min"
    if chosen.cost.deadline_probability is not None:  # None: the job has no deadline
        extra += f", {chosen.cost.deadline_probability:.0%} chance to meet the deadline"
    extra += moe_decode_phrase(e.throughput.decoder, e.throughput.moe_kernel)
    return (f"{e.strategy.label()} on {chosen.offer.cloud} {chosen.offer.instance_type} ({chosen.offer.region}, "
            f"{chosen.cost.market}): {duration(chosen.cost.hours)}, {money(chosen.cost.usd)}, needs "
            f"{gib(e.memory.required_bytes)} of {gib(e.memory.limit_bytes)} GiB "
            f"({gib(e.memory.usable_bytes)} GiB usable less {e.memory.headroom:.0%} headroom){extra}")


DOES_NOT_FIT_EXIT = NoFeasiblePlan.exit_code  # `estimate` when the placement does not fit: 3, as `plan` with no plan


@app.command("estimate")
@handle_errors
def estimate_command(
    spec: str = typer.Argument(..., help="Job spec, YAML or JSON."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id or alias, e.g. H200, H100, A100-80GB, or cpu (this "
                                   "machine's CPU); default: the placement `gpuplan plan` chooses."),
    count: int | None = typer.Option(None, "--count", min=1, help="Number of GPUs (default: 1, or the plan's)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Memory, throughput, time and cost of the job on a pinned placement ('auto' fields resolved).

    The cost is the cheapest offer of that placement in the spec's clouds (this machine's own GPUs and
    CPU at $0); a spec with a deadline is told when the hours miss it.

    Exit codes: 0 it fits; 3 it does not fit in memory (the least memory-hungry strategy is shown, with
    how much it needs, and no time: it would not run; in --json "hours" is null); 2 a bad spec or option.

    Memory (per GPU, most loaded rank): "peak allocated" is what torch.cuda.max_memory_allocated()
    reports; "peak reserved" adds the caching allocator's cached blocks when memory is ample;
    "total" adds the CUDA context (what nvidia-smi shows). "needs" is the least the run needs under
    memory pressure (allocated + a small slack + context, since the allocator frees its cache before an
    out-of-memory error): it is what is compared with "usable", so it can be below "total".

    Examples:

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H100 --count 8
    """
    from planner.search import estimate, plan

    job, catalog, model, calibration = load_planning_inputs(spec)
    if gpu is None:  # the plan's own placement: estimate and plan agree on where the job runs
        best = plan(job, catalog, calibration=calibration, model=model).chosen
        assert best is not None  # plan() raises NoFeasiblePlan rather than choose nothing
        strategy = best.estimate.strategy
        gpu, count = strategy.gpu, count or strategy.gpu_count
    result = estimate(job, catalog, gpu, count or 1, model=model, calibration=calibration)
    fits = result.memory.fits
    priced = _priced(job, catalog, model, calibration, result) if fits else None
    deadline = job.resources.deadline
    meets = None if deadline is None or not fits else result.hours <= deadline
    extra = {"deadline_h": deadline, "meets_deadline": meets, "cost": priced}
    _warn_plain_bf16(job)
    if as_json:
        print_json({**to_jsonable(result), "numerics": _numerics(result.strategy),
                    **({} if fits else {"hours": None}), **extra})
    else:
        _print_estimate(result, calibration.memory.pressure_slack)
        if fits:
            _print_cost_and_deadline(result.hours, priced, deadline)
    for warning in result.warnings:
        warn(warning)
    if not fits:
        raise typer.Exit(DOES_NOT_FIT_EXIT)


def _priced(job: Any, catalog: Any, model: Any, calibration: Any, result: Any) -> dict[str, Any] | None:
    """The cheapest offer of the estimate's placement in the spec's clouds and regions, deadline and budget
    aside, priced for the estimate's hours: {usd, usd_per_h, market, offer}; None where nothing offers it."""
    from planner.search import plan

    s = result.strategy
    pinned = job.model_copy(update={"resources": job.resources.model_copy(update={
        "accelerators": [f"{s.gpu}:{s.gpu_count}"], "deadline": None, "budget_usd": None})})
    try:
        chosen = plan(pinned, catalog, calibration=calibration, model=model).chosen
    except NoFeasiblePlan:
        return None
    assert chosen is not None
    o, rate = chosen.offer, chosen.cost.usd_per_h
    return {"usd": result.hours * rate, "usd_per_h": rate, "market": chosen.cost.market,
            "offer": f"{o.cloud} {o.instance_type} {o.region}"}


def _print_cost_and_deadline(hours: float, priced: dict[str, Any] | None, deadline: float | None) -> None:
    from commands.human import duration, money

    if priced is None:
        line = "cost: no offer of this placement in the spec's clouds and regions"
    else:
        line = (f"cost: {money(priced['usd'])} for {duration(hours)} at {usd(priced['usd_per_h'])}/h "
                f"({priced['offer']}, {priced['market']})")
    output.console.print(line, highlight=False)
    if deadline is not None and hours > deadline:
        output.console.print(styled(("misses the deadline:", "bold red"), f" {duration(hours)} > the spec's "
                                    f"{duration(deadline)}; `gpuplan plan` searches placements that meet it"),
                             highlight=False)
    elif deadline is not None:
        output.console.print(f"meets the deadline: {duration(hours)} of the spec's {duration(deadline)}",
                             highlight=False)


# Components whose name alone does not say why they are there.
_COMPONENT_MEANING = {
    "merged_expert_weights": "LoRA on a mixture of experts: peft merges B @ A into each sparse layer's fused "
                             "experts, kept until that layer's backward (activation checkpointing keeps one)",
}

# Memory rows outside the allocator's peak, and the allocator's cache, come after its components.
_OUTSIDE_ALLOCATOR = ("allocator_cache", "cuda_context", "nccl")


def _print_estimate(result: Any, slack: float) -> None:
    from commands.human import duration

    mem, thr = result.memory, result.throughput
    verdict = ("fits", "green") if mem.fits else ("does not fit", "bold red")
    numerics = _numerics(result.strategy)
    output.console.print(styled((result.strategy.label(), "bold"), f" ({numerics})" if numerics else "", ": ", verdict,
                                f" — needs {gib(mem.required_bytes)} GiB of {gib(mem.limit_bytes)} GiB "
                                f"({gib(mem.usable_bytes)} GiB usable less {mem.headroom:.0%} headroom; "
                                f"peak at {mem.peak_moment})"), highlight=False)
    parts = sorted(((k, v) for k, v in mem.breakdown.items() if k not in _OUTSIDE_ALLOCATOR), key=lambda kv: -kv[1])
    bold = "bold"
    rows: list[list[str | Text]] = [[name, gib(value), _COMPONENT_MEANING.get(name, "")] for name, value in parts]
    rows.append([Text("= peak allocated", bold), gib(mem.peak_allocated_bytes), "torch.cuda.max_memory_allocated()"])
    rows.append(["allocator_cache", gib(mem.breakdown.get("allocator_cache", 0)),
                 "cached blocks, freed under pressure"])
    rows.append([Text("= peak reserved", bold), gib(mem.peak_reserved_bytes),
                 "torch.cuda.max_memory_reserved() when memory is ample"])
    for name in ("cuda_context", "nccl"):
        if name in mem.breakdown:
            rows.append([name, gib(mem.breakdown[name]), "outside the allocator"])
    rows.append([Text("= total", bold), gib(mem.total_bytes), "what nvidia-smi shows when memory is ample"])
    rows.append([Text("needs", bold), gib(mem.required_bytes),
                 f"peak allocated + {slack:.0%} slack + context: the least it runs in; compared with limit"])
    rows.append([Text("usable", bold), gib(mem.usable_bytes), "what the GPU offers the job"])
    rows.append([Text("limit", bold), gib(mem.limit_bytes), f"usable less {mem.headroom:.0%} headroom"])
    print_table("memory per GPU (most loaded rank)",
                [Col("component"), Col("GiB", right=True), Col("meaning", wrap=True, drop=1)], rows)
    if not mem.fits:
        short = mem.required_bytes - mem.limit_bytes
        fix = ("lora/qlora, activation_checkpointing, fsdp over more GPUs (--count), a smaller micro_batch or "
               "seq_len, or a GPU with more memory" if result.strategy.task == "train" else
               "int8/int4 weights, tensor parallel over more GPUs (--count), a smaller batch or context, or a GPU "
               "with more memory")
        output.console.print(styled(("does not fit:", "bold red"), f" {gib(short)} GiB short, so no time "
                                    f"estimate (exit code {DOES_NOT_FIT_EXIT}). To fit: {fix}; `gpuplan plan` "
                                    "searches them all."), highlight=False)
        return
    line = f"throughput: {thr.tokens_per_s:,.0f} tokens/s"
    if thr.mfu:
        line += f" (MFU {thr.mfu:.0%})"
    if thr.requests_per_s is not None:
        line += f", {thr.requests_per_s:,.2f} requests/s"
    how = ""
    if thr.decoder is not None:  # inference: which decoder the workers run, and its one-time capture
        how = f" ({'compiled decoder' if thr.decoder == 'graph' else 'generate()'}"
        how += moe_decode_phrase(thr.decoder, thr.moe_kernel) + ")"
    start = f", its start included: {result.start_s:,.0f} s" if result.start_s else ""
    start += f", {thr.warmup_s:,.0f} s of it the capture" if thr.warmup_s else ""
    output.console.print(f"{line}; {duration(result.hours)} for the job{how}{start}", highlight=False)
    predicted = prediction_of(result)
    if predicted.prefill_s is not None and predicted.decode_step_s is not None:
        # the same two numbers a run logs and `gpuplan report accuracy` compares (workers/decode.DecodeTiming)
        output.console.print(f"per batch of {result.strategy.batch}: prompt pass {predicted.prefill_s * 1e3:,.1f} ms, "
                             f"then {predicted.decode_step_s * 1e3:,.2f} ms per decode step", highlight=False)
