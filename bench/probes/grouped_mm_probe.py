"""What one grouped GEMM costs beyond the weights it reads, by group count: the term the compiled MoE decode step
pays per expert (standalone: torch only; the device's python3).

    python3 bench/probes/grouped_mm_probe.py --out $OUT/grouped_mm.json
    python3 bench/probes/grouped_mm_probe.py --report bench/results/workers/grouped_mm_probe_2026-12-03.json

Each shape is captured in a CUDA graph and replayed (the compiled decoder replays its step the same way), so the
time is the GPU's: ``torch.nn.functional.grouped_mm`` (``torch._grouped_mm`` on older torch) over ``groups``
experts of a (K x N) bf16 weight each, ``rows`` tokens routed to each expert, in the two layouts transformers uses
(gpt-oss stores experts as (E, K, N); Qwen3-MoE and Mixtral as (E, N, K), multiplied through a transposed view).
Nothing here is a model: the sweep over groups at fixed shapes gives a cost per group and per call. Measured on the
H200 (bench/results/workers/grouped_mm_probe_2026-12-03.json, docs/lab-notes/2026-12-03-moe-in-a-cuda-graph.md):
0.04-0.79 us per group and 14-55 us per call beyond the weights' bytes, too small to explain why
Qwen3-30B-A3B's compiled step costs more per sparse layer than gpt-oss-20b's, so the planner has no per-group term.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

# (name, K, N, layout): the up (gate_up) and down projections of two published MoEs
SHAPES = (("oss-up", 2880, 5760, "ekn"), ("oss-down", 2880, 2880, "ekn"),
          ("qwen3-up", 2048, 1536, "enk"), ("qwen3-down", 768, 2048, "enk"))
GROUPS = (8, 16, 32, 64, 128, 256)
ROWS = (1, 2, 4, 8)


def _gmm() -> Any:
    import torch

    return torch.nn.functional.grouped_mm if hasattr(torch.nn.functional, "grouped_mm") else torch._grouped_mm


def time_one(k: int, n: int, layout: str, groups: int, rows: int, replays: int = 50) -> float:
    """Median seconds of one grouped GEMM, replayed from a CUDA graph."""
    import torch

    gmm = _gmm()
    dev = "cuda"
    x = torch.randn(groups * rows, k, device=dev, dtype=torch.bfloat16)
    if layout == "ekn":
        w = torch.randn(groups, k, n, device=dev, dtype=torch.bfloat16)
    else:
        w = torch.randn(groups, n, k, device=dev, dtype=torch.bfloat16).transpose(-2, -1)
    offs = torch.arange(1, groups + 1, device=dev, dtype=torch.int32) * rows
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            gmm(x, w, offs=offs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            gmm(x, w, offs=offs)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / 10)
    del graph, x, w
    torch.cuda.empty_cache()
    return statistics.median(times)


def measure(out: Path) -> None:
    import torch

    record: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                              "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "command": "python3 bench/probes/grouped_mm_probe.py --out ...", "cases": []}
    for name, k, n, layout in SHAPES:
        for groups in GROUPS:
            for rows in ROWS:
                s = time_one(k, n, layout, groups, rows)
                record["cases"].append({"shape": name, "k": k, "n": n, "layout": layout, "groups": groups,
                                        "rows": rows, "seconds": s})
                print(name, groups, rows, f"{s * 1e6:.1f} us", flush=True)
        out.write_text(json.dumps(record, indent=1))


def report(path: Path, bandwidth_gbps: float, efficiency: float) -> None:
    """Per shape: least squares of (time - the weights' bytes at the planner's decode bandwidth) on the group
    count, over every rows setting; the slope is the cost per group."""
    import numpy as np

    cases = json.loads(path.read_text())["cases"]
    bw = bandwidth_gbps * 1e9 * efficiency
    print("| shape | K x N | layout | per group us (slope) | intercept us | bytes time at 256 groups us "
          "| time at 256 groups us |")
    print("|---|---|---|---|---|---|---|")
    slopes = []
    for name, k, n, layout in SHAPES:
        rows = [c for c in cases if c["shape"] == name]
        x = np.array([c["groups"] for c in rows], dtype=float)
        y = np.array([c["seconds"] - c["groups"] * k * n * 2 / bw for c in rows])
        slope, intercept = np.polyfit(x, y, 1)
        slopes.append(slope)
        last = [c["seconds"] for c in rows if c["groups"] == max(GROUPS)]
        print(f"| {name} | {k} x {n} | {layout} | {slope * 1e6:.3f} | {intercept * 1e6:.1f} "
              f"| {max(GROUPS) * k * n * 2 / bw * 1e6:.1f} | {statistics.median(last) * 1e6:.1f} |")
    print(f"median per group: {statistics.median(slopes) * 1e6:.3f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--bandwidth-gbps", type=float, default=4800.0, help="the GPU's (H200: 4800)")
    parser.add_argument("--efficiency", type=float, default=0.7, help="the planner's decode_bw_efficiency")
    args = parser.parse_args()
    if args.report:
        report(args.report, args.bandwidth_gbps, args.efficiency)
    elif args.out:
        measure(args.out)
    else:
        parser.error("--out to measure or --report to read a record")


if __name__ == "__main__":
    main()
