"""Jobs side by side in one executor: the requests, and what a finished one left to compare with its solo run.

Also a script (``python -m tests.workers.side_by_side N``): a fresh process that starts N attempts together in
one InProcessExecutor, as a server does, and prints each one's end state and message as JSON. transformers is
not imported before they start, and the interpreter switches threads as often as it can, so any attempt that
resolves a transformers name outside workers.model.isolation's lock meets the lazy import race.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from planner.spec import spec_from_dict
from tests.waits import RUN_END_S
from tests.workers.tiny import cpu_strategy, final_state, tiny_spec, write_config
from workers.executors.protocol import RunRequest, RunState


def train_request(config: Path, out: Path, name: str, *, finetune: str = "full", seed: int = 7) -> RunRequest:
    """A seeded tiny training run (its only checkpoint: the last step's)."""
    extra: dict[str, Any] = {"finetune": finetune, "lora_rank": 4} if finetune != "full" else {}
    spec = tiny_spec(config, steps=6, interval=6, seed=seed, **extra)
    strategy = cpu_strategy(**extra)
    return RunRequest(job_id=name, attempt=1, spec=spec, strategy=strategy, checkpoint_uri=str(out), run_name=name)


def infer_request(config: Path, out: Path, name: str) -> RunRequest:
    spec = spec_from_dict({"name": name, "task": "infer", "model": {"config": str(config)},
                           "infer": {"batch": 2, "prompt_tokens": 6, "output_tokens": 3, "requests": 4}})
    return RunRequest(job_id=name, attempt=1, spec=spec, strategy=cpu_strategy(), checkpoint_uri=str(out),
                      run_name=name)


def run_together(executor: Any, requests: list[RunRequest]) -> list[Any]:
    """Submit every request at once (to an in-process or a Ray executor), then wait for each; every one must
    succeed."""
    handles = [executor.submit(r) for r in requests]
    statuses = [executor.wait(h, timeout=RUN_END_S) for h in handles]
    for request, status in zip(requests, statuses, strict=True):
        assert status.state is RunState.SUCCEEDED, (request.job_id, status.message)
    for handle in handles:
        if hasattr(executor, "release"):  # a Ray attempt's driver lives until its outcome is read
            executor.release(handle)
    return statuses


def trained(out: Path) -> dict[str, torch.Tensor]:
    step, weights = final_state(str(out))
    assert step == 6
    return weights


def generated(out: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    return [row["output_ids"] for row in sorted(rows, key=lambda r: r["index"])]


def _start_together(count: int) -> list[list[str]]:
    sys.setswitchinterval(1e-6)  # many more thread switches: a race window this small is met, not missed
    from workers.executors.inprocess import InProcessExecutor

    assert "transformers" not in sys.modules
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "m")
        requests = [train_request(config, root / f"t{i}", f"t{i}") if i % 2 else
                    infer_request(config, root / f"g{i}", f"g{i}") for i in range(count)]
        executor = InProcessExecutor(cpu_threads=1)
        handles = [executor.submit(r) for r in requests]
        statuses = [executor.wait(h, timeout=RUN_END_S) for h in handles]
    return [[s.state.value, s.message] for s in statuses]


if __name__ == "__main__":
    print(json.dumps(_start_together(int(sys.argv[1]))))
