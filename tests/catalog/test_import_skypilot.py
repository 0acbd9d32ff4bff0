"""`gpuplan catalog import`: a skypilot-catalog v8 vms.csv, read from disk or downloaded from a real local
HTTP server, mapped to catalog GPUs; unknown accelerators counted; bad files refused; writes atomic."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Iterator
from datetime import date
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from catalog.import_skypilot import cloud_from_path, download_vms_csv, import_skypilot, read_skypilot_vms
from catalog.loader import Catalog, load_catalog
from catalog.offers_io import read_offers
from errors import ExternalServiceError, InvalidInput

FIXTURE = Path(__file__).parent / "data" / "skypilot_vms_aws.csv"
TODAY = date(2026, 12, 1)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Serves catalogs/v8/aws/vms.csv (the fixture) and catalogs/v8/lambda/vms.csv (columns missing)."""
    root = tmp_path_factory.mktemp("skypilot-catalog")
    (root / "catalogs/v8/aws").mkdir(parents=True)
    (root / "catalogs/v8/lambda").mkdir(parents=True)
    shutil.copy(FIXTURE, root / "catalogs/v8/aws/vms.csv")
    (root / "catalogs/v8/lambda/vms.csv").write_text("InstanceType,AcceleratorName,Price,Region\nx,H100,1.0,r\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_rows_map_to_catalog_gpus_and_skips_are_counted(catalog: Catalog) -> None:
    result = read_skypilot_vms(FIXTURE, catalog, cloud="aws", today=TODAY, source_url="https://example.test/vms.csv")
    assert result.rows == 13
    by_key = {(o.instance_type, o.zone): o for o in result.offers}
    assert set(by_key) == {("p5.48xlarge", "use1-az2"), ("p5.48xlarge", "use1-az6"), ("p4d.24xlarge", "use1-az1"),
                           ("p4de.24xlarge", "use1-az2"), ("g5.xlarge", "usw2-az1")}
    p5 = by_key[("p5.48xlarge", "use1-az6")]
    assert (p5.gpu, p5.gpu_count, p5.vcpus, p5.ram_gib, p5.region) == ("H100-SXM", 8, 192, 2048.0, "us-east-1")
    assert (p5.on_demand_usd_per_h, p5.spot_usd_per_h) == (55.04, 17.6289)  # the first row of a duplicated zone
    assert by_key[("p4d.24xlarge", "use1-az1")].gpu == "A100-40GB"  # skypilot's A100 is 40 GB
    assert by_key[("p4de.24xlarge", "use1-az2")].gpu == "A100-80GB"
    assert by_key[("g5.xlarge", "usw2-az1")].spot_usd_per_h is None  # spot above on-demand is dropped
    assert dict(result.unknown_accelerators) == {"T4g": 2, "Inferentia2": 1}
    assert dict(result.skipped) == {
        "duplicate instance type and zone (first row kept)": 1, "fractional GPU": 1,
        "accelerator not in the catalog": 3, "no accelerator (CPU-only instance)": 1,
        "GPU-only row with no instance type (priced apart from a VM)": 1, "no price": 1}
    assert all(o.source.url == "https://example.test/vms.csv" and o.source.as_of == TODAY for o in result.offers)


def test_downloaded_import_replaces_the_cloud_offers(catalog: Catalog, file_server: str, tmp_path: Path) -> None:
    url = f"{file_server}/catalogs/v8/aws/vms.csv"
    assert cloud_from_path(url) == "aws"
    local = download_vms_csv(url, tmp_path / "vms.csv")
    out = tmp_path / "user" / "offers" / "aws.csv"
    result = import_skypilot(local, catalog, out, cloud="aws", today=TODAY, source_url=url)
    assert read_offers(out) == result.offers and result.path == out
    merged = load_catalog(user_dir=tmp_path / "user")
    assert sorted(o.instance_type for o in merged.offers if o.cloud == "aws") == sorted(
        o.instance_type for o in result.offers)


def test_missing_columns_are_named_and_nothing_is_written(file_server: str, catalog: Catalog, tmp_path: Path) -> None:
    local = download_vms_csv(f"{file_server}/catalogs/v8/lambda/vms.csv", tmp_path / "vms.csv")
    out = tmp_path / "offers" / "lambda.csv"
    with pytest.raises(InvalidInput) as info:
        import_skypilot(local, catalog, out, cloud="lambda", today=TODAY)
    text = str(info.value)
    assert "missing column(s) AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, SpotPrice, AvailabilityZone" in text
    assert not out.parent.exists()


def test_a_failed_import_keeps_the_previous_file(catalog: Catalog, tmp_path: Path) -> None:
    out = tmp_path / "offers" / "aws.csv"
    import_skypilot(FIXTURE, catalog, out, cloud="aws", today=TODAY)
    before = out.read_bytes()
    only_unknown = tmp_path / "unknown.csv"
    lines = FIXTURE.read_text().splitlines()
    only_unknown.write_text("\n".join([lines[0], *(ln for ln in lines if ln.startswith(("g5g", "inf2")))]) + "\n")
    with pytest.raises(InvalidInput, match="none of its 3 rows maps"):
        import_skypilot(only_unknown, catalog, out, cloud="aws", today=TODAY)
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["aws.csv"]


def test_download_errors_are_external_service_errors(file_server: str, tmp_path: Path) -> None:
    with pytest.raises(ExternalServiceError, match="HTTP 404"):
        download_vms_csv(f"{file_server}/catalogs/v8/nope/vms.csv", tmp_path / "vms.csv")
    with pytest.raises(ExternalServiceError, match="cannot download"):
        download_vms_csv("http://127.0.0.1:9/vms.csv", tmp_path / "vms.csv")
    assert not (tmp_path / "vms.csv").exists()


def test_cloud_from_path(tmp_path: Path) -> None:
    assert cloud_from_path("catalogs/v8/lambda/vms.csv") == "lambda"
    assert cloud_from_path(str(tmp_path / "vms.csv")) is None


LAMBDA_ROWS = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
    "gpu_1x_h100_pcie,H100,1,26,200,\"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 1.0, "
    "'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 81920}\",2.49,,us-east-1,\n"
    "gpu_8x_h100_sxm5,H100,8,208,1800,\"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 8.0, "
    "'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}\",23.92,,us-east-1,\n")


def test_lambda_pcie_h100_is_the_pcie_part(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "catalogs" / "v8" / "lambda" / "vms.csv"
    path.parent.mkdir(parents=True)
    path.write_text(LAMBDA_ROWS)
    result = read_skypilot_vms(path, catalog, cloud="lambda", today=TODAY)
    assert {o.instance_type: o.gpu for o in result.offers} == {"gpu_1x_h100_pcie": "H100-PCIe",
                                                               "gpu_8x_h100_sxm5": "H100-SXM"}


def test_cli_import_writes_under_the_gpuplan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from cli import app

    home = tmp_path / "home"
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    monkeypatch.delenv("GPUPLAN_CATALOG_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # where a wrong default would write: not the real home
    path = tmp_path / "catalogs" / "v8" / "lambda" / "vms.csv"
    path.parent.mkdir(parents=True)
    path.write_text(LAMBDA_ROWS)
    result = CliRunner().invoke(app, ["catalog", "import", str(path), "--json"])
    assert result.exit_code == 0, result.output
    written = home / "catalog" / "offers" / "lambda.csv"
    assert result.stdout and str(written) in result.stdout and written.is_file()
    # and the catalog the commands load reads it from there
    assert {o.instance_type for o in load_catalog().offers if o.cloud == "lambda"} == {
        "gpu_1x_h100_pcie", "gpu_8x_h100_sxm5"}
