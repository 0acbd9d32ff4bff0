"""bench/accuracy/multi_gpu.py (issue 16) on CPU: two gloo ranks run a collective against the planner's comm
model, and a run whose last rank is SIGKILLed (after a commit, then in the middle of writing its shards)
resumes from the last complete checkpoint on every rank, also on one rank. The GPU numbers come from
the multi-GPU machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import BENCH, load_script

pytestmark = pytest.mark.slow


def test_the_model_of_a_collective_is_the_planners_link_and_constants() -> None:
    multi = load_script("accuracy/multi_gpu", "multi_gpu_bench")
    link, cal = multi.link_and_calibration(8)
    assert link == 450.0  # NVLink 900 GB/s per GPU, both directions: 450 each way
    big, small = 2**30, 2**20
    # a big all-gather runs at the link x comm_efficiency, plus the fixed cost of one FSDP collective
    gather = multi.predicted_collective("all_gather", big, 8, link, cal)
    assert gather == pytest.approx(big * 7 / 8 / (link * 1e9 * cal.comm_efficiency) + cal.fsdp_collective_s)
    assert multi.predicted_collective("reduce_scatter", big, 8, link, cal) == gather
    assert multi.bus_gbps("all_gather", small, 8, multi.predicted_collective("all_gather", small, 8, link, cal)) \
        < 0.1 * link  # a 1 MiB collective is all fixed cost in the model
    reduce = multi.predicted_collective("all_reduce", big, 8, link, cal)
    assert multi.bus_gbps("all_reduce", big, 8, reduce) == pytest.approx(link * cal.ddp_comm_efficiency)


def test_a_cpu_dry_run_resumes_from_the_last_complete_checkpoint_after_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "multi_2.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "accuracy" / "multi_gpu.py"), "--device", "cpu", "--gpus", "2", "--parts",
         "collectives,kill", "--sizes-mib", "0.0625", "--iters", "1", "--out", str(out), "--ckpt-root",
         str(tmp_path)], capture_output=True, text=True, timeout=560, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["gpus"] == 2 and doc["device"] == "cpu"

    rows = doc["collectives"]["rows"]
    assert [r["op"] for r in rows] == ["all_gather", "reduce_scatter", "all_reduce"]
    assert all(r["bytes"] == 65536 and r["seconds"] > 0 and r["predicted_s"] > 0 for r in rows)

    kill = doc["kill"]
    after = kill["after_commit"]  # parked after step 4, killed once step 4 was committed
    assert after["victim_exit"] == -9 and after["last_complete_step"] == 4
    assert after["on_disk"]["partial"] == []
    assert after["resumed_from_step_by_rank"] == [4, 4]
    during = kill["during_save"]  # rank 1 died half-way through its shards of step 6
    assert during["exit_codes"][1] == -9 and during["victim_files_written"] >= 1
    assert 6 not in during["on_disk"]["committed"] and during["partial_steps"] == [6]
    assert during["last_complete_step"] == 4
    assert during["resumed_from_step_by_rank"] == [4, 4] and during["started_at_by_rank"] == [4, 4]
    assert during["finished_steps"] == kill["total_steps"] == 10
    other = kill["other_world_size"]  # the FSDP shards of two ranks, resumed by one process
    assert (other["world_size"], other["resumed_from_step"], other["finished_steps"]) == (1, 4, 10)
    assert kill["resume_ok"] == {"after_commit": True, "during_save": True} and kill["passed"] is True
    assert "kill/resume PASS" in doc["summary"] and "| killed writing step 6 |" in proc.stdout
