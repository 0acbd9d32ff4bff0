"""GPU acceptance: README-style specs end to end through the CLI (`gpuplan run`) on one GPU.

Every field is left to the planner (`auto`), the environment is the caller's (the workers set
expandable segments themselves unless PYTORCH_CUDA_ALLOC_CONF is set). Cases:

  1b-full-auto     llama-3.2-1b full fine-tune, everything auto
  8b-lora-auto     llama-3-8b LoRA, everything else auto
  config-path      a model given as a Hugging Face config.json path (Qwen3-0.6B's shape)
  infer            an inference job (llama-3.2-1b, JSONL-style prompts synthetic)
  infer-gemma      the same job on gemma-3-1b: sliding-window layers through the compiled decoder
  infer-moe        gpt-oss-20b served at batch 32: grouped_mm experts decoded in a CUDA graph
  infer-moe-b8     gpt-oss-20b at batch 8, the same decoder
  infer-moe-b64    gpt-oss-20b at batch 64, the same decoder
  infer-moe-qwen3  qwen3-30b-a3b at batch 32: a model held out of the graph's MoE fit
  kill-resume      the 1B run killed with SIGKILL after its first checkpoint, then `--resume`
  deepseek-lora    DeepSeek-V2-Lite (MLA, 64 routed + 2 shared experts) LoRA from its config.json, all else auto
  deepseek-l8-full the same shape cut to 8 layers, full fine-tune, all else auto
  infer-deepseek   DeepSeek-V2-Lite from its config.json served at batch 32 (the compiled MoE decoder)
  qwen3-moe-lora   Qwen3-30B-A3B LoRA, all else auto (before 2026-12-04 the planner chose a plan ~54 GiB short)
  mixtral-qlora    Mixtral-8x7B QLoRA on one GPU (examples/mixtral-qlora.yaml's model), all else auto

A case passes when the run succeeds with zero OOMs (no OOM back-off either), peak allocated is
within 5% of the prediction and the loop's tokens/s within 15% (issue 10's bar). A case the CLI
refuses before it starts (a job type `gpuplan run` does not take yet) is SKIP with the CLI's reason,
never a crash of this script. Each case is short (tens of steps); all of them take a few minutes on
one H200.

Run it on the GPU machine from the repository root:

    python3 bench/accuracy/gpu_acceptance.py --out $OUT/acceptance.json
    python3 bench/accuracy/gpu_acceptance.py --cases 1b-full-auto,infer --out /tmp/a.json

It prints a markdown table (paste it into docs/lab-notes/gpu-acceptance.md with the date) and writes every
case's predicted and measured numbers, the CLI's JSON and the tail of its output to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
ALLOC_TOLERANCE = 0.05
TOKENS_TOLERANCE = 0.15

# Qwen3-0.6B's config.json shape keys (public on the Hugging Face hub); weights are random
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
}


@dataclass
class Outcome:
    case: str
    result: str = "FAIL"  # PASS | FAIL | SKIP
    reason: str = ""
    strategy: str | None = None
    predicted_peak_allocated_bytes: float | None = None
    measured_peak_allocated_bytes: float | None = None
    predicted_peak_reserved_bytes: float | None = None
    measured_peak_reserved_bytes: float | None = None
    predicted_tokens_per_s: float | None = None
    measured_tokens_per_s: float | None = None
    oom_backoffs: int = 0
    wall_s: float = 0.0  # `gpuplan run` end to end: the process, the plan and the job
    predicted_wall_s: float | None = None  # the plan's hours (their start included), not judged: reported
    run: dict[str, Any] | None = None
    output_tail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _cli(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-c", "import cli; cli.main()", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def _text(raw: str | bytes | None) -> str:
    """What a timed-out subprocess had written (bytes, whatever text= said)."""
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUPLAN_HOME"] = str(home)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _parse(stdout: str) -> dict[str, Any] | None:
    text = stdout.strip()
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _error(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return (a - b) / b


def _fill(out: Outcome, run: dict[str, Any]) -> None:
    measured, predicted = run.get("measured") or {}, run.get("predicted") or {}
    out.run = run
    out.strategy = run.get("strategy_label")
    out.predicted_peak_allocated_bytes = predicted.get("peak_allocated_bytes")
    out.measured_peak_allocated_bytes = measured.get("peak_allocated_bytes")
    out.predicted_peak_reserved_bytes = predicted.get("peak_reserved_bytes")
    out.measured_peak_reserved_bytes = measured.get("peak_reserved_bytes")
    out.predicted_tokens_per_s = predicted.get("tokens_per_s")
    out.measured_tokens_per_s = measured.get("tokens_per_s")
    out.oom_backoffs = len(run.get("oom_backoffs") or [])
    out.predicted_wall_s = predicted.get("wall_s")


def _judge(out: Outcome, rc: int, stdout: str, stderr: str, *, check_accuracy: bool = True) -> Outcome:
    out.output_tail = (stdout[-3000:] + "\n" + stderr[-3000:]).strip()
    run = _parse(stdout)
    if run is None or "status" not in run:
        # refused before anything ran: a job type or model source `gpuplan run` does not take yet
        error = (run or {}).get("error")
        if isinstance(error, dict):
            why = str(error.get("message") or error)
            why += f" (hint: {error['hint']})" if error.get("hint") else ""
        else:
            lines = [line for line in stderr.strip().splitlines() if line.strip()]
            why = lines[-1] if lines else f"exit {rc}, no output"
        out.result = "SKIP" if rc != 0 else "FAIL"
        out.reason = "refused: " + why[:400]
        return out
    _fill(out, run)
    problems: list[str] = []
    if run.get("status") != "succeeded":
        problems.append(f"status {run.get('status')}: {str(run.get('message', ''))[:200]}")
    if "out of memory" in (str(run.get("message", "")) + stderr).lower():
        problems.append("CUDA OOM")
    if out.oom_backoffs:
        problems.append(f"{out.oom_backoffs} OOM back-off(s)")
    if check_accuracy:
        alloc = _error(out.measured_peak_allocated_bytes, out.predicted_peak_allocated_bytes)
        rate = _error(out.measured_tokens_per_s, out.predicted_tokens_per_s)
        if alloc is None:
            problems.append("no peak allocated measured or predicted")
        elif abs(alloc) > ALLOC_TOLERANCE:
            problems.append(f"peak allocated {alloc:+.1%} off the prediction (> {ALLOC_TOLERANCE:.0%})")
        if rate is None:
            problems.append("no tokens/s measured or predicted")
        elif abs(rate) > TOKENS_TOLERANCE:
            problems.append(f"tokens/s {rate:+.1%} off the prediction (> {TOKENS_TOLERANCE:.0%})")
    out.result = "FAIL" if problems else "PASS"
    out.reason = "; ".join(problems)
    return out


def _write_spec(folder: Path, name: str, spec: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _train_spec(name: str, model: Any, tokens: float, **train: Any) -> dict[str, Any]:
    return {"name": name, "task": "train", "model": model,
            "train": {"tokens": tokens, "seq_len": 2048, **train}, "resources": {"spot": "never"}}


def _simple(name: str, spec: dict[str, Any], work: Path, timeout: float, *, accuracy: bool = True,
            before: Callable[[Path], None] | None = None) -> Outcome:
    out = Outcome(case=name)
    folder = work / name
    if before is not None:
        before(folder)
    path = _write_spec(folder, name, spec)
    began = time.perf_counter()
    try:
        rc, stdout, stderr = _cli(["run", str(path), "--json", "--checkpoint-dir", str(folder / "ck")],
                                  _env(work / "home"), timeout)
    except subprocess.TimeoutExpired as exc:
        out.wall_s = time.perf_counter() - began
        out.reason = f"timed out after {timeout:.0f} s"
        out.output_tail = (_text(exc.stdout)[-2000:] + "\n" + _text(exc.stderr)[-2000:]).strip()
        return out
    out.wall_s = time.perf_counter() - began
    out = _judge(out, rc, stdout, stderr, check_accuracy=accuracy)
    log = work / "home" / "runs" / str(spec["name"]) / "train.log"
    if log.is_file():  # the worker's own account (e.g. inference: model load, share of time inside generate())
        out.extra["log_tail"] = log.read_text(errors="replace").strip().splitlines()[-4:]
    return out


def case_1b(work: Path, timeout: float) -> Outcome:
    return _simple("1b-full-auto", _train_spec("acc-1b", "llama-3.2-1b", 2.0e6), work, timeout)


def case_8b_lora(work: Path, timeout: float) -> Outcome:
    return _simple("8b-lora-auto", _train_spec("acc-8b-lora", "llama-3-8b", 4.0e5, finetune="lora"), work, timeout)


def case_config_path(work: Path, timeout: float) -> Outcome:
    def write_config(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "qwen3-0.6b.json").write_text(json.dumps(QWEN3_06B, indent=1))

    spec = _train_spec("acc-config", {"config": "qwen3-0.6b.json"}, 1.5e6)  # relative to the spec file
    return _simple("config-path", spec, work, timeout, before=write_config)


# deepseek-ai/DeepSeek-V2-Lite's config.json (tests/data/hf_configs; 15.7B parameters, 2.4B activated): latent
# attention (no query low rank), 64 routed experts of width 1408, top-6, 2 shared experts, the first layer dense. No
# DeepSeek model ran on a GPU before 2026-12-04: these cases were written before any ran.
DEEPSEEK_V2_LITE = ROOT / "tests" / "data" / "hf_configs" / "deepseek-v2-lite.json"


def _deepseek(name: str, spec: dict[str, Any], work: Path, timeout: float, **shape: Any) -> Outcome:
    def write_config(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        published = json.loads(DEEPSEEK_V2_LITE.read_text())
        (folder / "deepseek.json").write_text(json.dumps({**published, **shape}, indent=1))

    return _simple(name, {**spec, "model": {"config": "deepseek.json"}}, work, timeout, before=write_config)


def case_deepseek_lora(work: Path, timeout: float) -> Outcome:
    """A user's LoRA of DeepSeek-V2-Lite, given as its config.json; full fine-tuning does not fit one H200."""
    return _deepseek("deepseek-lora", _train_spec("acc-deepseek-lora", None, 4.0e5, finetune="lora"), work, timeout)


def case_deepseek_l8_full(work: Path, timeout: float) -> Outcome:
    """Full fine-tuning of the same shape with 8 of its 27 layers (one dense, seven MoE): the routed experts'
    gradients and optimizer states."""
    return _deepseek("deepseek-l8-full", _train_spec("acc-deepseek-l8", None, 1.0e6), work, timeout,
                     num_hidden_layers=8)


def case_infer_deepseek(work: Path, timeout: float) -> Outcome:
    """DeepSeek-V2-Lite served at batch 32 in bf16: latent attention's expanded cache, the compiled MoE decoder."""
    spec = {"name": "acc-infer-deepseek", "task": "infer",
            "infer": {"batch": 32, "prompt_tokens": 512, "output_tokens": 64, "requests": 96},
            "resources": {"spot": "never"}}
    return _deepseek("infer-deepseek", spec, work, timeout)


def case_qwen3_moe_lora(work: Path, timeout: float) -> Outcome:
    """LoRA of Qwen3-30B-A3B (48 sparse layers, 128 experts): each layer's merged expert weights (1.13 GiB) are
    kept for backward; the planner chose mb=2 without checkpointing at 117 GiB before it counted them."""
    return _simple("qwen3-moe-lora", _train_spec("acc-qwen3-moe-lora", "qwen3-30b-a3b", 3.0e5, finetune="lora"),
                   work, timeout)


def case_mixtral_qlora(work: Path, timeout: float) -> Outcome:
    """QLoRA of Mixtral-8x7B: NF4 attention, the fused experts left bf16 (90 GB) and adapted through their merged
    weights (2.8 GB a layer), held out of every fit of the merged experts' costs."""
    return _simple("mixtral-qlora", _train_spec("acc-mixtral-qlora", "mixtral-8x7b", 2.0e5, finetune="qlora"),
                   work, timeout)


def case_infer(work: Path, timeout: float) -> Outcome:
    spec = {"name": "acc-infer", "task": "infer", "model": "llama-3.2-1b",
            "infer": {"batch": 32, "prompt_tokens": 512, "output_tokens": 128, "requests": 128},
            "resources": {"spot": "never"}}
    return _simple("infer", spec, work, timeout)


def case_infer_gemma(work: Path, timeout: float) -> Outcome:
    """Gemma 3's sliding layers decode through the graph with a full-length static cache (workers/infer/decode.py),
    priced as such; its compile once recompiled every token (docs/lab-notes/2026-12-01-compiled-decoder.md)."""
    spec = {"name": "acc-infer-gemma", "task": "infer", "model": "gemma-3-1b",
            "infer": {"batch": 32, "prompt_tokens": 512, "output_tokens": 128, "requests": 128},
            "resources": {"spot": "never"}}
    return _simple("infer-gemma", spec, work, timeout)


def _moe_spec(batch: int, requests: int, model: str = "gpt-oss-20b") -> dict[str, Any]:
    return {"name": f"acc-infer-moe-{model}-b{batch}", "task": "infer", "model": model,
            "infer": {"batch": batch, "prompt_tokens": 512, "output_tokens": 64, "requests": requests},
            "resources": {"spot": "never"}}


def case_infer_moe(work: Path, timeout: float) -> Outcome:
    """A mixture of experts served at batch 32 in bf16: the workers decode with the compiled static-cache step, its
    grouped_mm experts routed on the GPU (planner.decoder.graph_decode; 2x generate() with grouped_mm kept, which
    was 2x generate()'s own batched_mm on an H200)."""
    return _simple("infer-moe", _moe_spec(32, 128), work, timeout)


def case_infer_moe_b8(work: Path, timeout: float) -> Outcome:
    """The same model at batch 8 (under generate() it would run batched_mm here): the compiled step."""
    return _simple("infer-moe-b8", _moe_spec(8, 48), work, timeout)


def case_infer_moe_b64(work: Path, timeout: float) -> Outcome:
    """gpt-oss-20b at batch 64: eager attention's expanded cache grows the compiled step with the batch."""
    return _simple("infer-moe-b64", _moe_spec(64, 192), work, timeout)


def case_infer_moe_qwen3(work: Path, timeout: float) -> Outcome:
    """Qwen3-30B-A3B (128 experts, top-8, 48 layers, SDPA) at batch 32: held out of the fits of the compiled MoE
    step and prompt pass (bench/workers/graph_decode.py and bench/probes/prefill_probe.py --fit: gpt-oss, Qwen1.5-MoE,
    Mixtral)."""
    return _simple("infer-moe-qwen3", _moe_spec(32, 96, "qwen3-30b-a3b"), work, timeout)


def case_infer_moe_mixtral(work: Path, timeout: float) -> Outcome:
    """Mixtral-8x7B (8 wide experts, top-2, 93 GB in bf16) at batch 32: the largest model one H200 serves in bf16,
    every expert read each step, its prompt pass's grouped GEMMs near the dense ones' efficiency."""
    return _simple("infer-moe-mixtral", _moe_spec(32, 96, "mixtral-8x7b"), work, timeout)


def case_infer_moe_qwen15(work: Path, timeout: float) -> Outcome:
    """Qwen1.5-MoE-A2.7B (60 experts, top-4, a gated shared expert in every layer) at batch 32."""
    return _simple("infer-moe-qwen15", _moe_spec(32, 128, "qwen1.5-moe-a2.7b"), work, timeout)


def case_kill_resume(work: Path, timeout: float) -> Outcome:
    """SIGKILL the run after its first complete checkpoint, then `--resume` it to the end."""
    from workers.checkpoint.local import open_store

    name = "kill-resume"
    out = Outcome(case=name)
    folder = work / name
    ck = folder / "ck"
    path = _write_spec(folder, name, _train_spec("acc-kill", "llama-3.2-1b", 2.5e6, checkpoint_interval_steps=10))
    env = _env(work / "home")
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import cli; cli.main()", "run", str(path), "--json",
                             "--checkpoint-dir", str(ck)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    killed_at: int | None = None
    while time.perf_counter() - began < timeout:
        if proc.poll() is not None:
            break
        latest = open_store(str(ck)).latest() if ck.exists() else None
        if latest is not None:
            killed_at = int(latest.step)
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.5)
    if killed_at is None:
        proc.kill()
        stdout, stderr = proc.communicate()
        out.wall_s = time.perf_counter() - began
        first = _judge(Outcome(case=name), proc.returncode or 1, stdout, stderr, check_accuracy=False)
        out.result = "SKIP" if first.result == "SKIP" else "FAIL"
        out.reason = first.reason or "the run ended before its first checkpoint, nothing to kill"
        out.output_tail = first.output_tail
        return out
    proc.communicate()
    out.extra["killed_after_checkpoint_step"] = killed_at
    try:
        rc, stdout, stderr = _cli(["run", str(path), "--json", "--checkpoint-dir", str(ck), "--resume"], env,
                                  max(30.0, timeout - (time.perf_counter() - began)))
    except subprocess.TimeoutExpired:
        out.wall_s = time.perf_counter() - began
        out.reason = "the resumed run timed out"
        return out
    out.wall_s = time.perf_counter() - began
    # the resumed attempt's tokens/s and memory are measured like any run's
    _judge(out, rc, stdout, stderr)
    resumed = (out.run or {}).get("resumed_from_step")
    if out.run is not None and (resumed is None or resumed < killed_at):
        out.result = "FAIL"
        out.reason = "; ".join(x for x in (out.reason, f"resumed from {resumed}, not from step {killed_at}") if x)
    out.extra["resumed_from_step"] = resumed
    return out


CASES: dict[str, Callable[[Path, float], Outcome]] = {
    "1b-full-auto": case_1b,
    "8b-lora-auto": case_8b_lora,
    "config-path": case_config_path,
    "infer": case_infer,
    "infer-gemma": case_infer_gemma,
    "infer-moe": case_infer_moe,
    "infer-moe-b8": case_infer_moe_b8,
    "infer-moe-b64": case_infer_moe_b64,
    "infer-moe-qwen3": case_infer_moe_qwen3,
    "infer-moe-mixtral": case_infer_moe_mixtral,
    "infer-moe-qwen15": case_infer_moe_qwen15,
    "kill-resume": case_kill_resume,
    "deepseek-lora": case_deepseek_lora,
    "deepseek-l8-full": case_deepseek_l8_full,
    "infer-deepseek": case_infer_deepseek,
    "qwen3-moe-lora": case_qwen3_moe_lora,
    "mixtral-qlora": case_mixtral_qlora,
}


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def _pct(a: float | None, b: float | None) -> str:
    e = _error(a, b)
    return "-" if e is None else f"{e:+.1%}"


def _rate(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}"


def table(outcomes: list[Outcome]) -> str:
    head = ("| case | result | strategy (planner's) | alloc GiB pred / meas | err | reserved GiB pred / meas "
            "| tok/s pred / meas | err | OOM back-offs | wall s pred / meas | reason |")
    rows = [head, "|" + "---|" * 11]
    for o in outcomes:
        alloc_err = _pct(o.measured_peak_allocated_bytes, o.predicted_peak_allocated_bytes)
        rows.append(
            f"| {o.case} | {o.result} | {o.strategy or '-'} | {_gib(o.predicted_peak_allocated_bytes)} / "
            f"{_gib(o.measured_peak_allocated_bytes)} | {alloc_err} "
            f"| {_gib(o.predicted_peak_reserved_bytes)} / {_gib(o.measured_peak_reserved_bytes)} | "
            f"{_rate(o.predicted_tokens_per_s)} / {_rate(o.measured_tokens_per_s)} | "
            f"{_pct(o.measured_tokens_per_s, o.predicted_tokens_per_s)} | {o.oom_backoffs} | "
            f"{_rate(o.predicted_wall_s)} / {o.wall_s:.0f} | "
            f"{o.reason.replace('|', '/') or '-'} |")
    return "\n".join(rows)


def _environment() -> dict[str, Any]:
    info: dict[str, Any] = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                            "python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        info["torch"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file for every case's numbers")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per case (default 240)")
    parser.add_argument("--workdir", default=None, help="keep specs, checkpoints and outputs here (default: temp, "
                        "and each case's checkpoints are deleted once it is judged: a 64 GB disk fills otherwise)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no case after this many seconds, so the table is printed within a lease")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    sys.path.insert(0, str(ROOT))
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="gpuplan-acceptance-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        outcomes: list[Outcome] = []
        for name in names:
            elapsed = (datetime.now(UTC) - started).total_seconds()
            if args.budget_s is not None and elapsed > args.budget_s:
                outcomes.append(Outcome(case=name, result="SKIP", reason=f"--budget-s {args.budget_s:.0f} spent"))
                continue
            print(f"== {name}", file=sys.stderr, flush=True)
            try:
                outcome = CASES[name](work, args.timeout)
            except Exception as exc:  # one broken case must not hide the others' results
                outcome = Outcome(case=name, result="FAIL", reason=f"the case itself crashed: "
                                  f"{type(exc).__name__}: {exc}")
            print(f"   {outcome.result} {outcome.reason}\n   {_detail(outcome)}", file=sys.stderr, flush=True)
            if outcome.result != "PASS":
                print("   " + outcome.output_tail[-1500:].replace("\n", "\n   "), file=sys.stderr, flush=True)
            outcomes.append(outcome)
            _write(args.out, started, outcomes)  # a lease that ends mid-run still leaves every judged case
            if not args.workdir:
                shutil.rmtree(work / name, ignore_errors=True)
    print(f"GPU acceptance, {started:%Y-%m-%d %H:%M} UTC\n")
    print(table(outcomes))
    return 0 if all(o.result != "FAIL" for o in outcomes) else 1


def _detail(o: Outcome) -> str:
    run = o.run or {}
    return (f"strategy {o.strategy or '-'}; alloc GiB {_gib(o.predicted_peak_allocated_bytes)} pred / "
            f"{_gib(o.measured_peak_allocated_bytes)} meas; reserved {_gib(o.predicted_peak_reserved_bytes)} / "
            f"{_gib(o.measured_peak_reserved_bytes)}; tok/s {_rate(o.predicted_tokens_per_s)} / "
            f"{_rate(o.measured_tokens_per_s)}; wall {o.wall_s:.0f} s; steps {run.get('steps')}; "
            f"checkpoint {json.dumps(run.get('checkpoint'), default=str)[:300]}")


def _write(out: str, started: datetime, outcomes: list[Outcome]) -> None:
    text = table(outcomes)
    doc = {"started": started.isoformat(), "environment": _environment(),
           "tolerances": {"peak_allocated": ALLOC_TOLERANCE, "tokens_per_s": TOKENS_TOLERANCE},
           "summary": {r: sum(o.result == r for o in outcomes) for r in ("PASS", "FAIL", "SKIP")},
           "table_markdown": text, "cases": [asdict(o) for o in outcomes]}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
