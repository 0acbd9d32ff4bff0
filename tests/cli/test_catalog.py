"""`gpuplan catalog ...` through Typer's CliRunner: tables, --json, errors, stale-price warning, refresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from catalog.offers_io import read_offers
from cli import app


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    # An empty user catalog dir: the CLI must show packaged data regardless of this machine's ~/.gpuplan.
    monkeypatch.setenv("GPUPLAN_CATALOG_DIR", str(tmp_path / "no-user-catalog"))
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_gpus_table_and_json(runner: CliRunner) -> None:
    table = runner.invoke(app, ["catalog", "gpus"])
    assert table.exit_code == 0, table.output
    assert "H100-SXM" in table.stdout and "MI300X" in table.stdout and "TPU-v5e" in table.stdout
    assert "older than 30 days" in table.stderr  # shipped prices are dated; the warning goes to stderr

    as_json = runner.invoke(app, ["catalog", "gpus", "--json"])
    rows = json.loads(as_json.stdout)
    h100 = next(r for r in rows if r["id"] == "H100-SXM")
    assert h100["tflops"]["bf16"] == pytest.approx(989.4)
    assert h100["cheapest_spot_usd_per_gpu_h"] < h100["cheapest_on_demand_usd_per_gpu_h"]
    assert next(r for r in rows if r["id"] == "GB200")["cheapest_spot_offer"] is None


def test_offers_for_h100_spot_sorted_by_price(runner: CliRunner) -> None:
    result = runner.invoke(app, ["catalog", "offers", "--gpu", "H100", "--spot", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and {r["gpu"] for r in rows} == {"H100-SXM"}
    prices = [r["usd_per_gpu_h"] for r in rows]
    assert prices == sorted(prices) and all(r["spot_usd_per_h"] is not None for r in rows)

    table = runner.invoke(app, ["catalog", "offers", "--gpu", "H100", "--spot"])
    assert "p5.48xlarge" in table.stdout and "cheapest spot" in table.stdout


def test_offers_filters_by_cloud_and_region(runner: CliRunner) -> None:
    rows = json.loads(runner.invoke(app, ["catalog", "offers", "--cloud", "aws", "--region", "us-east-1",
                                          "--json"]).stdout)
    assert rows and {(r["cloud"], r["region"]) for r in rows} == {("aws", "us-east-1")}


def test_unknown_gpu_gets_did_you_mean(runner: CliRunner) -> None:
    result = runner.invoke(app, ["catalog", "offers", "--gpu", "H1000"])
    assert result.exit_code == 2
    assert "unknown GPU 'H1000'" in result.stderr and "did you mean" in result.stderr and "H100" in result.stderr

    as_json = runner.invoke(app, ["catalog", "offers", "--gpu", "H1000", "--json"])
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["error"]["code"] == "unknown_name"


def test_unknown_cloud_is_rejected(runner: CliRunner) -> None:
    result = runner.invoke(app, ["catalog", "offers", "--cloud", "awz"])
    assert result.exit_code == 2 and "did you mean aws" in result.stderr


def test_unknown_region_is_rejected_not_an_empty_table(runner: CliRunner) -> None:
    result = runner.invoke(app, ["catalog", "offers", "--region", "us-east-l"])
    assert result.exit_code == 2 and "unknown region 'us-east-l'" in result.stderr and "us-east-1" in result.stderr
    # a known zone prefix still filters
    rows = json.loads(runner.invoke(app, ["catalog", "offers", "--region", "us-east-1", "--json"]).stdout)
    assert rows and all(r["region"] == "us-east-1" or (r["zone"] or "").startswith("us-east-1") for r in rows)


def test_models_table_and_json(runner: CliRunner) -> None:
    table = runner.invoke(app, ["catalog", "models"])
    assert table.exit_code == 0 and "mixtral-8x7b" in table.stdout and "46.70B" in table.stdout
    rows = {r["id"]: r for r in json.loads(runner.invoke(app, ["catalog", "models", "--json"]).stdout)}
    assert rows["llama-3-8b"]["params_total"] == 8_030_261_248
    assert rows["mixtral-8x7b"]["params_active"] < rows["mixtral-8x7b"]["params_total"]


@pytest.mark.slow
def test_local_on_this_machine(runner: CliRunner) -> None:
    result = runner.invoke(app, ["catalog", "local", "--json"])
    assert result.exit_code == 0
    body = json.loads(result.stdout)
    assert set(body) == {"device", "gpu", "offer", "cpu", "cpu_offer"}


def test_help_has_examples(runner: CliRunner) -> None:
    for cmd in (["catalog", "--help"], ["catalog", "offers", "--help"], ["catalog", "refresh", "--help"],
                ["catalog", "import", "--help"]):
        result = runner.invoke(app, cmd)
        assert result.exit_code == 0 and "gpuplan catalog" in result.stdout


@pytest.mark.slow
def test_refresh_aws_end_to_end_then_offers_use_it(
    runner: CliRunner, tmp_path: Path, moto_endpoint: str, price_server: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user_dir = tmp_path / "user-catalog"
    monkeypatch.setenv("GPUPLAN_CATALOG_DIR", str(user_dir))
    template = price_server[0] + "/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
    result = runner.invoke(app, ["catalog", "refresh", "aws", "--regions", "us-east-1", "--ec2-endpoint-url",
                                 moto_endpoint, "--price-list-url", template, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    written = user_dir / "offers" / "aws.csv"
    assert summary["path"] == str(written) and summary["offers"] == len(read_offers(written)) > 0

    # The refreshed file now overrides the packaged AWS offers everywhere.
    rows = json.loads(runner.invoke(app, ["catalog", "offers", "--cloud", "aws", "--gpu", "H100", "--json"]).stdout)
    assert rows and all(r["source"]["url"] == template.format(region="us-east-1") for r in rows)


def test_refresh_unknown_cloud_and_bad_regions(runner: CliRunner) -> None:
    bad_cloud = runner.invoke(app, ["catalog", "refresh", "gcp"])
    assert bad_cloud.exit_code == 2 and "aws" in bad_cloud.stderr and "azure" in bad_cloud.stderr
    no_regions = runner.invoke(app, ["catalog", "refresh", "aws", "--regions", " , "])
    assert no_regions.exit_code == 2 and "--regions" in no_regions.stderr


def test_refresh_azure_end_to_end_then_offers_use_it(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.catalog.azure_server import API_PATH, azure_price_server

    user_dir = tmp_path / "user-catalog"
    monkeypatch.setenv("GPUPLAN_CATALOG_DIR", str(user_dir))
    with azure_price_server() as (base, _):
        api = f"{base}/ok{API_PATH}"
        result = runner.invoke(app, ["catalog", "refresh", "azure", "--regions", "eastus", "--prices-api-url", api,
                                     "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        written = user_dir / "offers" / "azure.csv"
        assert summary["path"] == str(written) and summary["offers"] == len(read_offers(written)) > 0
        assert "fractional" in summary["skipped"]["Standard_NV6ads_A10_v5"]
        rows = json.loads(runner.invoke(app, ["catalog", "offers", "--cloud", "azure", "--json"]).stdout)
        assert rows and all(r["source"]["url"].startswith(api) and r["zone"] is None for r in rows)

        before = written.read_bytes()
        failed = runner.invoke(app, ["catalog", "refresh", "azure", "--regions", "eastus", "--prices-api-url",
                                     f"{base}/truncated{API_PATH}"])
        assert failed.exit_code == 1 and "not valid JSON" in failed.stderr and "nothing was written" in failed.stderr
        assert written.read_bytes() == before


def test_import_skypilot_file_with_counted_warning(runner: CliRunner, tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "catalog" / "data" / "skypilot_vms_aws.csv"
    out = tmp_path / "aws.csv"
    table = runner.invoke(app, ["catalog", "import", str(fixture), "--cloud", "aws", "--out", str(out)])
    assert table.exit_code == 0, table.output
    assert "Wrote 5 aws offers" in table.stdout
    assert "skipped 3 rows whose accelerator is not in the catalog: T4g (2), Inferentia2 (1)" in table.stderr
    as_json = json.loads(runner.invoke(app, ["catalog", "import", str(fixture), "--cloud", "aws", "--out", str(out),
                                             "--json"]).stdout)
    assert as_json["offers"] == 5 and as_json["unknown_accelerators"] == {"T4g": 2, "Inferentia2": 1}

    no_cloud = runner.invoke(app, ["catalog", "import", str(fixture)])
    assert no_cloud.exit_code == 2 and "--cloud" in no_cloud.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("InstanceType,Price\nx,1\n")
    refused = runner.invoke(app, ["catalog", "import", str(bad), "--cloud", "aws", "--out", str(out), "--json"])
    assert refused.exit_code == 2
    assert "missing column(s) AcceleratorName, AcceleratorCount" in json.loads(refused.stdout)["error"]["message"]
