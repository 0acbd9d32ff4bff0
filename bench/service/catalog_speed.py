"""Catalog speed: load_catalog() and the lookups the planner makes per candidate.

    .venv/bin/python bench/service/catalog_speed.py   # a markdown table (docs/lab-notes/2026-11-30-catalog-speed.md)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from catalog.loader import PACKAGED_DATA_DIR, load_catalog
from catalog.params import count_params
from catalog.query import cheapest_by_gpu, filter_offers


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def main() -> None:
    catalog = load_catalog(PACKAGED_DATA_DIR)
    model = catalog.model("llama-3-8b")
    rows = [
        ("load_catalog() (all data files, validated)", lambda: load_catalog(PACKAGED_DATA_DIR), 20),
        ("catalog.gpu('h100') (alias, case-insensitive)", lambda: catalog.gpu("h100"), 20000),
        ("catalog.offers_for('H100')", lambda: catalog.offers_for("H100"), 20000),
        ("catalog.model('llama-3-8b')", lambda: catalog.model("llama-3-8b"), 20000),
        ("count_params(llama-3-8b)", lambda: count_params(model), 20000),
        ("filter_offers(gpu=H100, spot=True)", lambda: filter_offers(catalog, gpu="H100", spot=True), 2000),
        ("cheapest_by_gpu(catalog)", lambda: cheapest_by_gpu(catalog), 500),
    ]
    print(f"catalog: {len(catalog.gpus)} GPUs, {len(catalog.offers)} offers, {len(catalog.models)} models\n")
    print("| operation | median | p90 | runs |\n| --- | ---: | ---: | ---: |")
    for name, fn, repeat in rows:
        p50, p90 = timed(fn, repeat)
        unit, scale = ("ms", 1e3) if p50 >= 1e-3 else ("µs", 1e6)
        print(f"| {name} | {p50 * scale:.1f} {unit} | {p90 * scale:.1f} {unit} | {repeat} |")


if __name__ == "__main__":
    main()
