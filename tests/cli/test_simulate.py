"""`gpuplan simulate` and `gpuplan cluster config` through the real CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import validate_config
from typer.testing import CliRunner

from cli import app
from tests.moto_server import moto_server, use_moto

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
runner = CliRunner()
POLICY_NAMES = {"uniform-progress", "on-demand", "spot-only", "greedy", "omniscient", "gpuplan"}
FIELDS = {"cost_usd", "finish_hours", "deadline_met", "preemptions", "work_lost_hours"}


def test_simulate_json_reports_every_policy(tmp_path: Path) -> None:
    plot = tmp_path / "timeline.png"
    args = ["simulate", "--trace", str(DATA / "flaky-a.json"), "--trace", str(DATA / "flaky-b.json"),
            "--job-hours", "20", "--deadline-hours", "30", "--restart-hours", "0.2", "--on-demand-price", "3.06",
            "--spot-price", "0.92", "--start-hour", "5", "--plot", str(plot), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc["policies"]) == POLICY_NAMES
    for name, row in doc["policies"].items():
        assert set(row) >= FIELDS, name
    assert doc["policies"]["on-demand"]["cost_usd"] == round(20.2 * 3.06, 4)
    bound = doc["policies"]["omniscient"]["cost_usd"]
    for name in ("uniform-progress", "greedy", "gpuplan", "on-demand"):
        assert doc["policies"][name]["deadline_met"], name
        assert bound <= doc["policies"][name]["cost_usd"] + 1e-6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_boots_spot_beside_on_demand_unless_told_to_break_before_make() -> None:
    base = ["simulate", "--trace", str(DATA / "flaky-a.json"), "--job-hours", "20", "--deadline-hours", "30",
            "--restart-hours", "0.4", "--start-hour", "5", "--policy", "gpuplan", "--policy", "omniscient", "--json"]
    docs = {}
    for flag in ("--make-before-break", "--break-before-make"):
        result = runner.invoke(app, [*base, flag])
        assert result.exit_code == 0, result.output
        docs[flag] = json.loads(result.stdout)
    made, broken = docs["--make-before-break"], docs["--break-before-make"]
    assert made["job"]["make_before_break"] is True and broken["job"]["make_before_break"] is False
    assert broken["policies"]["gpuplan"]["spot_boots"] == 0
    # flaky-a's runs of capacity come and go: some boots beside on-demand take the job, some lose their capacity.
    assert made["policies"]["gpuplan"]["spot_boots"] > made["policies"]["gpuplan"]["spot_boots_lost"] > 0
    # The bound that may boot beside on-demand is the lower one, and still below the policy.
    assert made["policies"]["omniscient"]["cost_usd"] <= broken["policies"]["omniscient"]["cost_usd"] + 1e-9
    assert made["policies"]["omniscient"]["cost_usd"] <= made["policies"]["gpuplan"]["cost_usd"] + 1e-6
    default = runner.invoke(app, base)
    assert json.loads(default.stdout)["job"]["make_before_break"] is True  # what the scheduler loop does


def test_simulate_table_and_errors(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["simulate", "--trace", str(DATA / "scarce.json"), "--job-hours", "10",
                             "--deadline-hours", "15", "--policy", "greedy", "--policy", "omniscient"])
    assert ok.exit_code == 0, ok.output
    assert "greedy" in ok.stdout and "omniscient" in ok.stdout and "gpuplan" not in ok.stdout
    missing = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "nope.json"), "--json"])
    assert missing.exit_code == 2 and "does not exist" in missing.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"metadata": {}, "data": [1, 0]}))
    malformed = runner.invoke(app, ["simulate", "--trace", str(bad)])
    assert malformed.exit_code == 2 and "gap_seconds" in malformed.stderr
    early = runner.invoke(app, ["simulate", "--trace", str(DATA / "always.json"), "--job-hours", "48",
                                "--deadline-hours", "40", "--json"])
    assert early.exit_code == 2 and "shorter than --job-hours" in early.stdout
    unknown = runner.invoke(app, ["simulate", "--trace", str(DATA / "always.json"), "--job-hours", "1",
                                  "--policy", "greddy"])
    assert unknown.exit_code == 2 and "greedy" in unknown.stderr


def test_cluster_config_from_spec_writes_valid_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    spec = tmp_path / "job.yaml"
    # 32 x H200 pinned: the chosen run is multi-node (p5en x 4, EFA), whatever the near-ties among the alternatives
    resources = {"clouds": ["aws"], "regions": ["us-east-1"], "accelerators": ["H200:32"]}
    spec.write_text(yaml.safe_dump({"name": "demo", "task": "train", "model": "llama-3-8b", "train": {"tokens": 1.0e9},
                                    "resources": resources}))
    out = tmp_path / "cluster.yaml"
    no_wheel = runner.invoke(app, ["cluster", "config", str(spec), "--out", str(out)])  # refused before AWS
    assert no_wheel.exit_code == 2 and "not published" in no_wheel.stderr and not out.exists()
    from tests.workers.cluster_setup import FakePlacementGroups

    made = FakePlacementGroups()  # moto has no placement-group API (tests/workers/cluster/test_cluster_efa.py)
    monkeypatch.setattr("workers.cluster.aws.Ec2PlacementGroups", lambda ec2, cluster: made)
    with moto_server() as url:
        use_moto(monkeypatch, url)
        iam = boto3.client("iam")
        iam.create_role(RoleName="gpuplan-node", AssumeRolePolicyDocument="{}")
        iam.create_instance_profile(InstanceProfileName="gpuplan-node")
        iam.add_role_to_instance_profile(InstanceProfileName="gpuplan-node", RoleName="gpuplan-node")
        ami = boto3.client("ec2").register_image(Name="gpuplan-test-dlami", RootDeviceName="/dev/sda1")["ImageId"]
        result = runner.invoke(app, ["cluster", "config", str(spec), "--out", str(out), "--ami", ami,
                                     "--wheel", "dist/gpuplan-0.1.0-py3-none-any.whl"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(out.read_text())
    validate_config(config)
    assert any(t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
               for t in config["available_node_types"].values())
    assert "iam:PassRole" in out.read_text()  # the header documents the nodes' policy
    efa = [t["node_config"]["Placement"]["GroupName"] for t in config["available_node_types"].values()
           if "NetworkInterfaces" in t["node_config"]]
    assert efa and set(efa) == made.groups  # each multi-node EFA type (p5en x4): its own placement group, made
    missing = runner.invoke(app, ["cluster", "config", str(tmp_path / "nope.yaml"), "--json"])
    assert missing.exit_code == 2 and "does not exist" in missing.stdout


def test_simulate_a_stream_of_arrivals() -> None:
    args = ["simulate", "--trace", str(DATA / "flaky-a.json"), "--job-hours", "10", "--deadline-hours", "14",
            "--jobs", "5", "--every-hours", "12", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc["policies"]) == POLICY_NAMES
    for name in ("gpuplan", "greedy", "uniform-progress", "on-demand"):
        row = doc["policies"][name]
        assert row["jobs"] == 5 and row["deadlines_met"] == 5
        assert row["median_x_bound"] >= 1.0 - 1e-9
    assert doc["policies"]["on-demand"]["cost_usd"] == round(5 * 10.2 * 3.06, 2)
    late = runner.invoke(app, ["simulate", "--trace", str(DATA / "always.json"), "--job-hours", "1",
                               "--jobs", "100", "--every-hours", "24", "--json"])
    assert late.exit_code == 2 and "past the end of the trace" in late.stdout


def _rows(out: str) -> dict[str, list[str]]:
    """policy -> its cells, from the table's body lines."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] in POLICY_NAMES:
            rows[cells[0]] = cells
    return rows


def test_a_trace_that_ends_first_leaves_jobs_unfinished_not_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    from commands import output

    monkeypatch.setattr(output, "console", output.make_console(width=160))
    # halves-a: spot for 30 h, then none; the trace ends at 60 h, before the 70 h deadline.
    args = ["simulate", "--trace", str(DATA / "halves-a.json"), "--job-hours", "50", "--deadline-hours", "70"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "the trace ends at 60 h, before the job's deadline at 70 h" in " ".join(result.stderr.split())
    assert "50 h job, deadline 70 h," in result.stdout
    rows = _rows(result.stdout)
    assert rows["spot-only"][1:5] == ["27.60+", "-", "-", "unfinished"]  # spent so far; no ratio under the bound
    assert rows["on-demand"][4] == "met" and float(rows["on-demand"][2]) >= 1.0
    assert "unfinished: the trace ends at 60 h" in result.stdout
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["trace_hours"] == 60 and doc["policies"]["spot-only"]["outcome"] == "unfinished"


def test_no_deadline_says_so_and_a_stream_ratio_counts_finished_jobs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from commands import output

    monkeypatch.setattr(output, "console", output.make_console(width=160))
    single = runner.invoke(app, ["simulate", "--trace", str(DATA / "always.json"), "--job-hours", "48",
                                 "--start-hour", "20"])
    assert "48 h job, no deadline," in single.stdout and "deadline none" not in single.stdout
    assert "before the job can finish (it arrives at 20 h and needs 48 h of work)" in " ".join(single.stderr.split())
    assert {row[4] for row in _rows(single.stdout).values()} == {"unfinished"}
    stream = ["simulate", "--trace", str(DATA / "halves-a.json"), "--job-hours", "20", "--deadline-hours", "30",
              "--jobs", "4", "--every-hours", "10"]
    doc = json.loads(runner.invoke(app, [*stream, "--json"]).stdout)
    spot_only = doc["policies"]["spot-only"]
    assert spot_only["unfinished"] == 3 and spot_only["median_x_bound"] >= 1.0 - 1e-9
    table = runner.invoke(app, stream)
    for cells in _rows(table.stdout).values():  # one format per column, whatever the values
        assert all(re.fullmatch(r"\d+\.\d{3}", c) for c in cells[5:6]), cells
        assert re.fullmatch(r"\d+\.\d{2}", cells[6]), cells


def test_unknown_policy_lists_the_valid_policies() -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(DATA / "always.json"), "--policy", "zzz", "--json"])
    assert result.exit_code == 2
    assert "valid policies: " in json.loads(result.stdout)["error"]["message"]
