"""`gpuplan catalog refresh <cloud>` and `gpuplan catalog import FILE`: rebuild a cloud's offers file."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from catalog.refresh import AWS_DEFAULT_REGIONS
from commands import output
from commands.output import JSON_OPTION, handle_errors, print_json, warn
from errors import InvalidInput

if TYPE_CHECKING:
    from catalog.loader import Catalog


def _regions(text: str | None, cloud: str) -> list[str]:
    """--regions as a list; Azure's "all" is every region ([])."""
    from catalog.refresh_azure import AZURE_DEFAULT_REGIONS

    if text is None:
        return list(AZURE_DEFAULT_REGIONS if cloud == "azure" else AWS_DEFAULT_REGIONS)
    if cloud == "azure" and text.strip().lower() == "all":
        return []
    regions = [r.strip() for r in text.split(",") if r.strip()]
    if not regions:
        example = "eastus" if cloud == "azure" else "us-east-1"
        raise InvalidInput("give at least one region", path="--regions", hint=f"e.g. --regions {example}")
    return regions


def catalog_refresh(
    cloud: str = typer.Argument(..., help="Cloud to refresh: aws or azure."),
    regions: str | None = typer.Option(
        None, "--regions",
        help=f"Comma-separated regions [aws: {','.join(AWS_DEFAULT_REGIONS)}; azure: eastus,eastus2,southcentralus,"
        "westus2,westus3,westeurope,northeurope; azure also takes 'all'].",
    ),
    out: str | None = typer.Option(
        None, "--out",
        help="Offers file to write [default: $GPUPLAN_HOME/catalog/offers/<cloud>.csv (~/.gpuplan/...), which "
        "overrides the packaged one].",
    ),
    ec2_endpoint_url: str | None = typer.Option(None, "--ec2-endpoint-url", help="aws: EC2 endpoint (e.g. moto)."),
    price_list_url: str | None = typer.Option(None, "--price-list-url",
                                              help="aws: on-demand offer-file URL template with {region}."),
    prices_api_url: str | None = typer.Option(None, "--prices-api-url",
                                              help="azure: Retail Prices API URL [https://prices.azure.com/api/retail/prices]."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Rebuild a cloud's offers from the cloud itself; a failed refresh leaves the old file as it was.

    aws: EC2 API via boto3 (credentials allowed ec2:DescribeInstanceTypes and ec2:DescribeSpotPriceHistory)
    plus the public price list (the us-east-1 file is hundreds of MB: expect a few minutes).
    azure: the public Retail Prices API (no credentials); GPUs, vCPUs and RAM of each VM size come from
    the catalog's cloud_names.yaml; Azure publishes no zone prices.

    Examples:

      gpuplan catalog refresh aws

      gpuplan catalog refresh aws --regions us-east-1 --out ./aws.csv --json

      gpuplan catalog refresh azure --regions eastus,westus3

      gpuplan catalog refresh azure --regions all --json
    """
    from catalog.loader import load_catalog
    from catalog.refresh import check_cloud, default_offers_path

    name = check_cloud(cloud)
    region_list = _regions(regions, name)
    path = Path(out).expanduser() if out else default_offers_path(name)
    if name == "azure":
        _refresh_azure(region_list, path, prices_api_url, as_json, date.today(), load_catalog())
        return
    _refresh_aws(region_list, path, ec2_endpoint_url, price_list_url, as_json, date.today(), load_catalog())


def _refresh_aws(region_list: list[str], path: Path, ec2_endpoint_url: str | None, price_list_url: str | None,
                 as_json: bool, today: date, catalog: Catalog) -> None:
    from catalog.refresh_aws import PRICE_LIST_URL, AwsEndpoints, refresh_aws

    endpoints = AwsEndpoints(ec2_endpoint_url=ec2_endpoint_url, price_list_url=price_list_url or PRICE_LIST_URL)
    with output.err_console.status("refreshing AWS offers...") as status:
        result = refresh_aws(catalog, region_list, path, today=today, endpoints=endpoints,
                             progress=lambda msg: status.update(f"refreshing AWS offers: {msg}"))
    if as_json:
        print_json({"path": str(path), "regions": result.regions, "offers": len(result.offers),
                    "skipped": result.skipped})
        return
    gpus = sorted({o.gpu for o in result.offers})
    output.console.print(f"Wrote {len(result.offers)} AWS offers ({', '.join(gpus) or 'none'}) for "
                         f"{', '.join(result.regions)} to {path}")
    if result.skipped:
        output.err_console.print(f"skipped {len(result.skipped)} instance types whose GPU is not in the catalog or "
                                 "that have no price (see --json)")


def _refresh_azure(region_list: list[str], path: Path, api_url: str | None, as_json: bool, today: date,
                   catalog: Catalog) -> None:
    from catalog.refresh_azure import AZURE_PRICES_URL, refresh_azure

    with output.err_console.status("refreshing Azure offers...") as status:
        result = refresh_azure(catalog, region_list, path, today=today,
                               api_url=api_url or AZURE_PRICES_URL,
                               progress=lambda msg: status.update(f"refreshing Azure offers: {msg}"))
    if as_json:
        print_json({"path": str(path), "regions": result.regions or "all", "offers": len(result.offers),
                    "pages": result.pages, "skipped": result.skipped})
        return
    gpus = sorted({o.gpu for o in result.offers})
    output.console.print(f"Wrote {len(result.offers)} Azure offers ({', '.join(gpus)}) for "
                         f"{', '.join(result.regions) or 'every region'} to {path}")
    if result.skipped:
        warn(f"skipped {len(result.skipped)} VM sizes (fractional GPUs, GPUs not in the catalog, or no price in "
             "these regions; see --json)")


def catalog_import(
    file: str = typer.Argument(..., help="A skypilot-catalog v8 vms.csv: a path, or an http(s) URL to download."),
    cloud: str | None = typer.Option(None, "--cloud",
                                     help="Cloud the file prices [default: the folder name, e.g. .../v8/lambda/]."),
    out: str | None = typer.Option(
        None, "--out",
        help="Offers file to write [default: $GPUPLAN_HOME/catalog/offers/<cloud>.csv (~/.gpuplan/...), which "
        "overrides the packaged one].",
    ),
    source_url: str | None = typer.Option(None, "--source-url",
                                          help="Each offer's source URL [default: the file's file:// URL]."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Import a skypilot-catalog v8 vms.csv of any cloud as that cloud's offers (written atomically).

    Give a downloaded file, or its raw URL (github.com/skypilot-org/skypilot-catalog, catalogs/v8/<cloud>/vms.csv).
    Accelerators not in the catalog are skipped and counted; CPU-only, fractional-GPU and unpriced
    rows are skipped too.

    Examples:

      gpuplan catalog import catalogs/v8/lambda/vms.csv

      gpuplan catalog import https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v8/lambda/vms.csv

      gpuplan catalog import vms.csv --cloud runpod --source-url https://github.com/skypilot-org/skypilot-catalog

      gpuplan catalog import vms.csv --cloud aws --out ./aws.csv --json
    """
    import tempfile

    from catalog.import_skypilot import cloud_from_path, download_vms_csv, import_skypilot
    from catalog.loader import load_catalog
    from catalog.refresh import check_cloud_name, user_offers_path

    name = check_cloud_name(cloud) if cloud else cloud_from_path(file)
    if name is None:
        raise InvalidInput(f"cannot tell which cloud {file} prices", path="--cloud",
                           hint="give --cloud (e.g. --cloud lambda), or keep skypilot's catalogs/v8/<cloud>/ folder")
    path = Path(out).expanduser() if out else user_offers_path(name)
    with tempfile.TemporaryDirectory(prefix="gpuplan-import-") as tmp:
        remote = file.startswith(("http://", "https://"))
        local = download_vms_csv(file, Path(tmp) / "vms.csv") if remote else Path(file).expanduser()
        result = import_skypilot(local, load_catalog(), path, cloud=name, today=date.today(),
                                 source_url=source_url or (file if remote else None))
    if as_json:
        print_json({"path": str(path), "cloud": name, "rows": result.rows, "offers": len(result.offers),
                    "unknown_accelerators": dict(result.unknown_accelerators), "skipped": dict(result.skipped)})
        return
    gpus = sorted({o.gpu for o in result.offers})
    output.console.print(f"Wrote {len(result.offers)} {name} offers ({', '.join(gpus)}) from {result.rows} rows to "
                         f"{path}")
    if result.unknown_accelerators:
        names = ", ".join(f"{k} ({v})" for k, v in result.unknown_accelerators.most_common())
        warn(f"skipped {sum(result.unknown_accelerators.values())} rows whose accelerator is not in the catalog: "
             f"{names}")
    other = {k: v for k, v in result.skipped.items() if k != "accelerator not in the catalog"}
    if other:
        warn("also skipped: " + ", ".join(f"{v} rows: {k}" for k, v in other.items()))


def register(app: typer.Typer) -> None:
    """Add `refresh` and `import` to the `gpuplan catalog` group."""
    app.command("refresh")(handle_errors(catalog_refresh))
    app.command("import")(handle_errors(catalog_import))
