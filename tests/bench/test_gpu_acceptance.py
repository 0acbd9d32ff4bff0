"""bench/accuracy/gpu_acceptance.py's own machinery on CPU: it drives the real CLI, reads its JSON, and turns a
refusal into SKIP with the CLI's reason (the GPU numbers themselves come from the GPU machine)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.scripts import load_script


def test_a_tiny_run_through_the_cli_is_read_back_and_a_refusal_is_skip(tmp_path: Path) -> None:
    acc = load_script("accuracy/gpu_acceptance", "gpu_acceptance")
    tiny = {"name": "acc-tiny", "task": "train", "model": "tiny-llama",
            "train": {"tokens": 4 * 2 * 64, "seq_len": 64, "micro_batch": 2, "checkpoint_interval_steps": 2}}
    ran = acc._simple("tiny", tiny, tmp_path, 300.0, accuracy=False)
    assert ran.result == "PASS", (ran.reason, ran.output_tail)
    assert ran.run is not None and ran.run["status"] == "succeeded" and ran.run["steps"] == 4
    assert ran.oom_backoffs == 0 and ran.wall_s > 0
    # on CPU there is no planner prediction: the accuracy bar cannot be met, and says why
    judged = acc._judge(acc.Outcome(case="tiny"), 0, acc.json.dumps(ran.run), "")
    assert judged.result == "FAIL" and "no peak allocated measured or predicted" in judged.reason

    refused = acc._simple("bad", {**tiny, "model": "no-such-model"}, tmp_path, 300.0)
    assert refused.result == "SKIP" and refused.reason.startswith("refused: ") and "no-such-model" in refused.reason
    text = acc.table([ran, refused])
    assert "| tiny | PASS |" in text and "| bad | SKIP |" in text
