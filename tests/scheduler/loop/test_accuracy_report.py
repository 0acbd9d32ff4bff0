"""`gpuplan report accuracy`: predicted vs measured from local run results and from team attempts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli import app
from planner.plan_record import PlannedRun
from planner.prediction import Prediction, inference_split
from planner.types import Candidate, CostEstimate, Estimate, MemoryEstimate, Strategy, ThroughputEstimate
from scheduler.loop.accuracy import accuracy_rows, attempt_metrics, summarize, team_records
from tests.scheduler.conftest import OFFER
from tests.workers.tiny import cpu_strategy
from workers.executors.local_runner import LocalPlan, LocalRun
from workers.executors.protocol import RunProgress, RunState, RunStatus

runner = CliRunner()


def _planned(strategy: Strategy, throughput: ThroughputEstimate, peak_allocated_bytes: int,
             peak_reserved_bytes: int = 0) -> PlannedRun:
    """A job's plan of ``strategy`` predicting these numbers (an hour on the test offer)."""
    memory = MemoryEstimate(peak_allocated_bytes=peak_allocated_bytes, peak_reserved_bytes=peak_reserved_bytes,
                            total_bytes=peak_reserved_bytes, usable_bytes=2**40, fits=True, breakdown={})
    chosen = Candidate(estimate=Estimate(strategy=strategy, memory=memory, throughput=throughput, hours=1.0),
                       offer=OFFER, cost=CostEstimate(market="on-demand", usd_per_h=1.0, hours=1.0, usd=1.0))
    return PlannedRun(job="j", objective="cheapest", chosen=chosen, alternatives=[chosen])


def _write_run(home: Path, name: str, state: RunState, metrics: dict[str, float], predicted: Prediction,
               backoffs: list[dict[str, int]] | None = None) -> None:
    status = RunStatus(handle="h", state=state, progress=RunProgress(step=3), metrics=metrics,
                       oom_backoffs=backoffs or [])
    run = LocalRun(job_id=name, checkpoint_dir=home / "ck", status=status, wall_s=1.0, engine="in-process",
                   plan=LocalPlan(strategy=cpu_strategy(), device="cuda", predicted=predicted))
    folder = home / "runs" / name
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(run.to_dict()))


def test_local_runs_become_rows_a_summary_and_a_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    predicted = Prediction(peak_allocated_bytes=100 * 2**30, peak_reserved_bytes=101 * 2**30, tokens_per_s=1000.0)
    _write_run(home, "good", RunState.SUCCEEDED, {"measured_peak_allocated_bytes": 99.8 * 2**30,
                                                  "measured_tokens_per_s": 1100.0}, predicted)
    _write_run(home, "died", RunState.FAILED, {"measured_peak_allocated_bytes": 50.0 * 2**30}, predicted,
               [{"step": 1, "from_micro_batch": 2, "to_micro_batch": 1, "from_grad_accum": 1, "to_grad_accum": 2}])
    (home / "runs" / "broken").mkdir()
    (home / "runs" / "broken" / "result.json").write_text("{not json")
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    png = tmp_path / "acc.png"
    result = runner.invoke(app, ["report", "accuracy", "--plot", str(png), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = {r["job"]: r for r in doc["rows"]}
    assert set(rows) == {"good", "died"}
    assert rows["good"]["error_peak_allocated_bytes"] == pytest.approx(100 / 99.8 - 1)
    assert rows["good"]["error_tokens_per_s"] == pytest.approx(1000 / 1100 - 1)
    assert rows["died"]["outcome"] == "failed" and rows["died"]["oom_backoffs"] == 1
    assert rows["died"]["error_tokens_per_s"] is None  # it never measured a rate: no made-up error
    assert doc["summary"]["peak_allocated_bytes"]["n"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = runner.invoke(app, ["report", "accuracy"])
    assert table.exit_code == 0 and "good" in table.output and "tokens_per_s: 1 runs" in table.output


def test_team_attempts_with_metrics_become_rows() -> None:
    plan = _planned(Strategy(gpu="H200", gpu_count=1, micro_batch=4), ThroughputEstimate(tokens_per_s=500.0),
                    peak_allocated_bytes=2_000_000_000, peak_reserved_bytes=2_100_000_000)
    status = RunStatus(handle="h", state=RunState.SUCCEEDED,
                       metrics={"measured_peak_allocated_bytes": 2e9, "measured_tokens_per_s": 400.0})
    metrics = attempt_metrics(status, plan)
    assert metrics["predicted"]["label"] == "1xH200 bf16 mb=4"

    attempts = [SimpleNamespace(number=1, outcome="succeeded", metrics=metrics),
                SimpleNamespace(number=2, outcome="lost", metrics=None)]
    job = SimpleNamespace(id="j-1", attempt_list=attempts)

    rows = accuracy_rows(team_records([job]))
    assert len(rows) == 1 and rows[0]["job"] == "j-1/1" and rows[0]["error_tokens_per_s"] == pytest.approx(0.25)
    assert summarize(rows)["peak_allocated_bytes"] == {"n": 1, "median_abs_error": 0.0, "max_abs_error": 0.0}


def test_a_served_models_prompt_pass_and_decode_step_are_compared_apart(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An inference plan prices a batch's prompt pass and each decode step apart; the compiled decoder times both
    (workers/decode.DecodeTiming), so a report says which of the two the plan got wrong."""
    # two replicas of batch 32: one worker's step is 32 rows at half the placement's decode rate
    throughput = ThroughputEstimate(tokens_per_s=9000.0, decode_tokens_per_s=32000.0,
                                    breakdown_s={"prefill": 0.09, "decode": 0.25})
    strategy = Strategy(task="infer", gpu="H200", gpu_count=2, batch=32)
    split = inference_split(throughput, strategy)
    assert split.prefill_s == 0.09 and split.decode_step_s == pytest.approx(0.002)
    assert inference_split(ThroughputEstimate(tokens_per_s=500.0), Strategy(gpu="H200", gpu_count=1)) == (None, None)

    plan = _planned(strategy, throughput, peak_allocated_bytes=4_000_000_000)
    status = RunStatus(handle="h", state=RunState.SUCCEEDED,
                       metrics={"measured_tokens_per_s": 9500.0, "measured_prefill_s": 0.1,
                                "measured_decode_step_s": 0.0025})
    job = SimpleNamespace(id="j-2", attempt_list=[SimpleNamespace(number=1, outcome="succeeded",
                                                                  metrics=attempt_metrics(status, plan))])
    (row,) = accuracy_rows(team_records([job]))
    assert row["error_prefill_s"] == pytest.approx(-0.1) and row["error_decode_step_s"] == pytest.approx(-0.2)
    assert summarize([row])["decode_step_s"]["n"] == 1

    # the same through a local run's result.json and the CLI's table
    home = tmp_path / "home"
    _write_run(home, "serve", RunState.SUCCEEDED,
               {"measured_tokens_per_s": 9500.0, "measured_prefill_s": 0.1, "measured_decode_step_s": 0.0025},
               Prediction(tokens_per_s=9000.0, prefill_s=0.09, decode_step_s=0.002))
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    doc = json.loads(runner.invoke(app, ["report", "accuracy", "--json"]).output)
    assert doc["rows"][0]["error_decode_step_s"] == pytest.approx(-0.2)
    table = runner.invoke(app, ["report", "accuracy"])
    assert table.exit_code == 0
    assert "prefill_s: 1 runs, median |error| 10.0%" in table.output
    assert "decode_step_s: 1 runs, median |error| 20.0%" in table.output
