"""bf16 numerics on the GPU (issue 46): one real fine-tune under amp-bf16 (fp32 master weights), bf16-plain
(round-to-nearest into bf16 weights) and bf16 (stochastic rounding), same data order and seed.

Each run goes through the workers' own loop (workers.train.loop.run_training) on JSONL text through a tokenizer:
the corpus is this repository's own source and docs (the GPU machine reaches no hub), cut into documents, and
the tokenizer a byte-level BPE trained on it here. The model is llama-3.2-1b from its seeded random init (no
pretrained weights offline). For each run it records the loss at every step, the final loss, the weights'
relative change from their start (||w_end - w_0|| / ||w_0||, and the share of elements that moved), the loop's
tokens/s and peak memory, and the planner's prediction for the same strategy (planner.estimate.estimate).

Each precision runs in a process of its own (this script starts one per precision and merges their records):
a run after another in the same process would carry the first run's allocations into its peak.

    python3 bench/workers/bf16_numerics.py --out $OUT/bf16_numerics.json            # on the GPU machine
    python3 bench/workers/bf16_numerics.py --plot bench/results/numerics/2026-12-05_bf16_h100_fused.json \
        docs/img/bf16_numerics.png
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from workers.train.hooks import TrainHooks  # noqa: E402 - after the path set-up above

PRECISIONS = ("amp-bf16", "bf16-plain", "bf16")
CORPUS_DIRS = ("planner", "workers", "catalog", "scheduler", "commands", "bench", "examples")


def corpus(folder: Path, out: Path, doc_chars: int = 2000) -> int:
    """This repository's text as JSONL documents of ~``doc_chars``; returns how many."""
    docs: list[str] = []
    for sub in CORPUS_DIRS:
        for path in sorted((folder / sub).rglob("*")):
            if path.suffix not in (".py", ".md", ".yaml") or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            docs += [text[i:i + doc_chars] for i in range(0, len(text), doc_chars)]
    out.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return len(docs)


def tokenizer(data: Path, folder: Path, vocab: int) -> Path:
    """A byte-level BPE tokenizer trained on ``data``, saved as a transformers folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


def spec_for(precision: str, args: argparse.Namespace, data: Path, tok: Path) -> Any:
    from planner.spec import JobSpec

    tokens = args.steps * args.micro_batch * args.seq_len
    return JobSpec.model_validate({
        "name": f"bf16-numerics-{precision}", "task": "train", "model": args.model,
        "train": {"tokens": tokens, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
                  "global_batch": args.micro_batch, "precision": precision, "optimizer": "adamw",
                  "activation_checkpointing": False, "learning_rate": args.lr,
                  "seed": args.seed, "data": str(data), "tokenizer": str(tok),
                  "checkpoint_interval_steps": args.steps},
        "resources": {"spot": "never"}})


class _Losses(TrainHooks):
    """TrainHooks that keeps the loss of every step."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_progress(self, progress: Any) -> None:
        if progress.get("event") == "step" and progress.get("loss") is not None:
            self.losses[int(progress["step"])] = float(progress["loss"])


class _Weights:
    """The trained parameters as the loop's optimizer gets them, and a host copy of their start (taken before
    the first step, off the GPU so the run's peak memory is its own)."""

    def __init__(self) -> None:
        self.params: list[Any] = []
        self.start: list[Any] = []

    def wrap(self, make: Any) -> Any:
        def make_and_keep(name: str, params: list[Any], lr: float, **kwargs: Any) -> Any:
            self.params = list(params)
            self.start = [p.detach().to("cpu", copy=True) for p in self.params]
            return make(name, params, lr, **kwargs)

        return make_and_keep

    def change(self) -> dict[str, float]:
        """Relative Frobenius change ||w_end - w_0|| / ||w_0||, share of elements and tensors that moved."""
        diff2 = base2 = 0.0
        moved = total = still = 0
        for p, w0_host in zip(self.params, self.start, strict=True):
            w0 = w0_host.to(p.device).float()
            delta = p.detach().float() - w0
            diff2 += float(delta.double().pow(2).sum())
            base2 += float(w0.double().pow(2).sum())
            changed = int((delta != 0).sum())
            moved, total, still = moved + changed, total + delta.numel(), still + (changed == 0)
        tensors = len(self.params)
        self.params, self.start = [], []
        return {"relative_change": math.sqrt(diff2 / base2), "moved_share": moved / max(1, total),
                "tensors": tensors, "tensors_unmoved": still}


def run_one(precision: str, args: argparse.Namespace, data: Path, tok: Path, work: Path) -> dict[str, Any]:
    import torch

    from catalog.loader import load_catalog
    from catalog.local import detect_local_device, match_device_name
    from planner.calibration import load_calibration
    from planner.estimate import estimate
    from planner.numerics import numerics
    from workers.model.build import resolve_model_source
    from workers.train.loop import TrainJob, run_training

    spec = spec_for(precision, args, data, tok)
    catalog = load_catalog()
    if args.device == "cpu":  # a smoke run of this script: the planner does not price a CPU in bf16
        from planner.types import Strategy

        est = None
        strategy = Strategy(gpu="cpu", gpu_count=1, precision=precision, micro_batch=args.micro_batch,
                            sharding="none")
    else:
        device = detect_local_device()
        assert device is not None, "no GPU"
        gpu = match_device_name(device.name, catalog, device.memory_bytes)
        assert gpu is not None, device.name
        est = estimate(spec, catalog, gpu.id, 1, model=resolve_model_source(spec).config,
                       calibration=load_calibration())
        strategy = est.strategy
    checkpoint = work / f"ck-{precision}"
    losses, weights = _Losses(), _Weights()
    import workers.train.start as start

    make = getattr(start, "make_optimizer")  # noqa: B009 - the attempt's own name for it, replaced for this run
    setattr(start, "make_optimizer", weights.wrap(make))  # noqa: B010
    began = time.perf_counter()
    try:
        result = run_training(TrainJob(job_id=spec.name, spec=spec, strategy=strategy,
                                   checkpoint_uri=str(checkpoint), device=args.device, log_every_s=0.0,
                                   keep_checkpoints=1), losses)
    finally:
        setattr(start, "make_optimizer", make)  # noqa: B010
    wall = time.perf_counter() - began
    change = weights.change()
    shutil.rmtree(checkpoint, ignore_errors=True)
    if args.device == "cuda":
        torch.cuda.empty_cache()
    record = {
        "precision": precision, "numerics": numerics(precision), "strategy": strategy.label(),
        "final_loss": result.final_loss, "losses": [losses.losses[k] for k in sorted(losses.losses)],
        "tail_loss": _tail_mean(losses.losses, args.tail), "wall_s": wall,
        # tokens/s: the steady steps (first step excluded), as `gpuplan run` reports it against the plan
        "measured": {"tokens_per_s": result.steady_tokens_per_s, "loop_tokens_per_s": result.loop_tokens_per_s,
                     "peak_allocated_bytes": result.peak_allocated_bytes,
                     "peak_reserved_bytes": result.peak_reserved_bytes},
        "predicted": {"tokens_per_s": est.throughput.tokens_per_s if est else None,
                      "peak_allocated_bytes": float(est.memory.peak_allocated_bytes) if est else None,
                      "peak_reserved_bytes": float(est.memory.peak_reserved_bytes) if est else None,
                      "breakdown_s": est.throughput.breakdown_s if est else None},
        **change}
    print(f"{precision}: final loss {record['final_loss']:.4f}, tail {record['tail_loss']:.4f}, relative change "
          f"{change['relative_change']:.3e}, moved {change['moved_share']:.1%}, "
          f"{result.steady_tokens_per_s or 0:,.0f} tokens/s, peak {(result.peak_allocated_bytes or 0) / 2**30:.2f} GiB",
          flush=True)
    return record


def optimizer_steps(model_id: str, work: Path) -> dict[str, Any]:
    """Each optimizer's step alone over the model's bf16 parameters (bench/workers/sr_step.py, in a process of its own:
    torch AdamW, the first and the current stochastic-rounding AdamW, torchao's where it imports)."""
    out = work / "sr_step.json"
    script = ROOT / "bench" / "workers" / "sr_step.py"
    subprocess.run([sys.executable, str(script), "--device", "cuda", "--model", model_id,
                    "--json", str(out)], check=True)
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def _tail_mean(losses: dict[int, float], tail: int) -> float | None:
    values = [losses[k] for k in sorted(losses)][-tail:]
    return sum(values) / len(values) if values else None


def _err(measured: float | None, predicted: float | None) -> str:
    return f"{(predicted - measured) / measured:+.1%}" if measured and predicted else "-"


def table(records: list[dict[str, Any]]) -> str:
    ref = next((r for r in records if r["precision"] == "amp-bf16"), None)
    plain = next((r for r in records if r["precision"] == "bf16-plain"), None)
    lines = ["| precision | numerics | final loss | last-20 mean loss (vs amp-bf16) | weights' relative change | "
             "elements moved | tokens/s meas / pred (err) | vs bf16-plain | peak alloc GiB meas / pred (err) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        m, p = r["measured"], r["predicted"]
        vs_ref = (f" ({(r['tail_loss'] - ref['tail_loss']) / ref['tail_loss']:+.2%})"
                  if ref and r["tail_loss"] and ref["tail_loss"] else "")
        speed = (f"{m['tokens_per_s'] / plain['measured']['tokens_per_s'] - 1:+.1%}"
                 if plain and m["tokens_per_s"] and plain["measured"]["tokens_per_s"] else "-")
        lines.append(
            f"| {r['precision']} | {r['numerics']} | {r['final_loss']:.4f} | {r['tail_loss']:.4f}{vs_ref} | "
            f"{r['relative_change']:.3e} | {r['moved_share']:.1%} | {m['tokens_per_s'] or 0:,.0f} / "
            f"{p['tokens_per_s'] or 0:,.0f} ({_err(m['tokens_per_s'], p['tokens_per_s'])}) | {speed} | "
            f"{(m['peak_allocated_bytes'] or 0) / 2**30:.2f} / {(p['peak_allocated_bytes'] or 0) / 2**30:.2f} "
            f"({_err(m['peak_allocated_bytes'], p['peak_allocated_bytes'])}) |")
    return "\n".join(lines)


def plot(record_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(record_path.read_text())
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in record["runs"]:
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=f"{r['precision']} ({r['numerics']})",
                linewidth=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(f"{record['model']} full fine-tune, lr {record['lr']:g}, {record['device']}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the JSON record to write")
    ap.add_argument("--plot", nargs=2, type=Path, metavar=("RECORD", "PNG"), help="plot a record's loss curves")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tail", type=int, default=20, help="steps whose mean loss is compared")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--no-optimizer-bench", dest="optimizer_bench", action="store_false",
                    help="skip timing each optimizer's step alone (bench/workers/sr_step.py)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run of this script")
    # a child process's run of one precision, on the parent's corpus and tokenizer
    ap.add_argument("--child", nargs=2, type=Path, metavar=("DATA", "TOKENIZER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plot:
        plot(*args.plot)
        return 0
    if args.child:
        data, tok = args.child
        _write(args.out, run_one(args.precisions, args, data, tok, args.out.parent))
        return 0
    import torch

    work = Path(tempfile.mkdtemp(prefix="bf16-numerics-"))
    data = work / "corpus.jsonl"
    docs = corpus(ROOT, data)
    tok = tokenizer(data, work / "tok", args.vocab)
    print(f"corpus: {docs} documents, {data.stat().st_size / 1e6:.1f} MB; tokenizer vocab {args.vocab}", flush=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    out: dict[str, Any] = {
        "model": args.model, "device": name, "torch": torch.__version__, "steps": args.steps,
        "seq_len": args.seq_len, "micro_batch": args.micro_batch, "lr": args.lr, "seed": args.seed,
        "corpus_documents": docs, "tokenizer_vocab": args.vocab, "runs": [],
        "command": "python3 bench/workers/bf16_numerics.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for precision in args.precisions.split(","):  # the record is rewritten after each run: a cut-off keeps them
        out["runs"].append(_run_in_child(precision, argv if argv is not None else sys.argv[1:], data, tok, work))
        _write(args.out, out)
    print(table(out["runs"]))
    if args.device == "cuda" and args.optimizer_bench:
        out["optimizer_step"] = optimizer_steps(args.model, work)
        _write(args.out, out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _run_in_child(precision: str, argv: list[str], data: Path, tok: Path, work: Path) -> dict[str, Any]:
    """``precision``'s run in a process of its own: a run after another in one process carries the first's
    allocations into its peak (on the H100 record bf16-plain read 41.31 GiB for its 32.10)."""
    record_path = work / f"run-{precision}.json"
    passed = [a for a in _without(argv, ("--out", "--precisions", "--plot")) if a != "--no-optimizer-bench"]
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *passed, "--precisions", precision,
                    "--out", str(record_path), "--child", str(data), str(tok)], check=True)
    record: dict[str, Any] = json.loads(record_path.read_text())
    return record


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less ``options`` and their values (``--opt value`` and ``--opt=value``)."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg in options:
            skip = 2 if arg == "--plot" else 1
        elif not any(arg.startswith(o + "=") for o in options):
            kept.append(arg)
    return kept


def _write(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
