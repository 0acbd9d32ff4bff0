"""`gpuplan catalog`: GPU specs, priced offers, model presets, this machine, and refreshing a cloud's offers."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from commands import catalog_prices, output
from commands.output import JSON_OPTION, Col, handle_errors, money, print_json, print_table, styled, warn
from commands.settings import Settings

app = typer.Typer(
    help="GPU specs, priced cloud offers and model presets (like `sky show-gpus`).\n\nExamples:\n\n"
    "  gpuplan catalog gpus\n\n"
    "  gpuplan catalog offers --gpu H100 --spot\n\n"
    "  gpuplan catalog offers --cloud aws --region us-east-1 --json\n\n"
    "  gpuplan catalog models\n\n"
    "  gpuplan catalog refresh aws --regions us-east-1,us-west-2\n\n"
    "  gpuplan catalog refresh azure --regions eastus\n\n"
    "  gpuplan catalog import ~/Downloads/vms.csv --cloud lambda",
    no_args_is_help=True,
)


_LINK_SHORT = {"nvlink": "NVL", "infinity-fabric": "IF", "pcie": "PCIe", "ici": "ICI"}
# Ids, names and numbers are never cut; ``drop`` orders what a narrow terminal leaves out (first the highest).
GPU_COLS = [Col("GPU"), Col("GiB", right=True, drop=1), Col("bf16", right=True, drop=2),
            Col("fp8", right=True, drop=5), Col("GB/s", right=True, drop=6), Col("link GB/s", right=True, drop=8),
            Col("OD $/h", right=True, drop=3), Col("spot $/h", right=True, drop=4), Col("cheapest at", drop=7)]
OFFER_COLS = [Col("cloud"), Col("instance"), Col("GPUs", drop=1), Col("vCPU", right=True, drop=6),
              Col("RAM GiB", right=True, drop=7), Col("region / zone", drop=2),
              Col("on-demand $/h", right=True, drop=4),
              Col("spot $/h", right=True, drop=5), Col("$/GPU/h", right=True), Col("as of", drop=8)]
MODEL_COLS = [Col("id"), Col("family", drop=3), Col("params", right=True, drop=1), Col("active", right=True, drop=4),
              Col("layers", right=True, drop=5), Col("hidden", right=True, drop=6), Col("heads/kv", right=True, drop=7),
              Col("ffn", right=True, drop=8), Col("vocab", right=True, drop=9), Col("context", right=True, drop=2)]


def _warn_stale(catalog: Any, offers: Any) -> None:
    """Prices older than 30 days: one warning line on stderr (never on stdout, so --json stays clean)."""
    from datetime import date

    from catalog.loader import stale_offer_warning

    today = date.today()
    shown = {id(o) for o in offers}
    stale = [o for o in catalog.stale_offers(today) if id(o) in shown]
    text = stale_offer_warning(stale, today)
    if text:
        warn(text)


@app.command("gpus")
@handle_errors
def catalog_gpus(as_json: bool = JSON_OPTION) -> None:
    """Every GPU: memory, dense bf16/fp8 TFLOPS, bandwidth, and the cheapest on-demand and spot $/GPU/h.

    Examples:

      gpuplan catalog gpus

      gpuplan catalog gpus --json
    """
    from catalog.loader import load_catalog
    from catalog.query import cheapest_by_gpu

    catalog = load_catalog()
    cheapest = cheapest_by_gpu(catalog)
    if as_json:
        print_json([
            {**g.model_dump(mode="json"),
             "cheapest_on_demand_usd_per_gpu_h": cheapest[g.id].on_demand_per_gpu,
             "cheapest_on_demand_offer": cheapest[g.id].on_demand,
             "cheapest_spot_usd_per_gpu_h": cheapest[g.id].spot_per_gpu,
             "cheapest_spot_offer": cheapest[g.id].spot}
            for g in catalog.gpus
        ])
    else:
        rows: list[list[str | Text]] = []
        for g in catalog.gpus:
            c = cheapest[g.id]
            where = c.spot or c.on_demand
            link = g.interconnect
            rows.append([
                g.id, f"{g.memory_gib:.1f}",
                *(f"{g.tflops[d]:,.0f}" if d in g.tflops else "-" for d in ("bf16", "fp8")),
                f"{g.memory_bandwidth_gbps:,.0f}",
                f"{link.gbps_per_gpu:,.0f} {_LINK_SHORT.get(link.kind, link.kind)}" if link.gbps_per_gpu else link.kind,
                money(c.on_demand_per_gpu), money(c.spot_per_gpu),
                f"{where.cloud} {where.instance_type}" if where else "-",
            ])
        print_table("GPUs: dense TFLOPS; cheapest $ per GPU-hour in the catalog", GPU_COLS, rows)
    _warn_stale(catalog, catalog.offers)


@app.command("offers")
@handle_errors
def catalog_offers(
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id or alias, e.g. H100, A100-80GB, L40S."),
    spot: bool = typer.Option(False, "--spot", help="Only offers with a spot price; sort by spot $/GPU/h."),
    cloud: str | None = typer.Option(None, "--cloud", help="aws, gcp, azure, lambda, runpod."),
    region: str | None = typer.Option(None, "--region", help="Region (or zone prefix), e.g. us-east-1."),
    limit: int = typer.Option(50, "--limit", min=1, help="Rows to show in the table (JSON has all)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Priced offers, cheapest $/GPU-hour first.

    Examples:

      gpuplan catalog offers --gpu H100 --spot

      gpuplan catalog offers --gpu A100 --cloud gcp

      gpuplan catalog offers --region us-east-1 --json
    """
    from catalog.loader import load_catalog
    from catalog.query import filter_offers, price_per_gpu_hour

    catalog = load_catalog()
    offers = filter_offers(catalog, gpu=gpu, cloud=cloud, region=region, spot=spot)
    if as_json:
        print_json([{**o.model_dump(mode="json"), "usd_per_gpu_h": price_per_gpu_hour(o, spot)} for o in offers])
    else:
        what = catalog.gpu(gpu).id if gpu else "all GPUs"
        rows: list[list[str | Text]] = []
        for o in offers[:limit]:
            where = f"{o.region} {o.zone}" if o.zone else o.region
            rows.append([o.cloud, o.instance_type, f"{o.gpu_count} x {o.gpu}", str(o.vcpus), f"{o.ram_gib:,.0f}",
                         where, money(o.on_demand_usd_per_h), money(o.spot_usd_per_h),
                         money(price_per_gpu_hour(o, spot)), o.source.as_of.isoformat()])
        print_table(f"{len(offers)} offers for {what}, cheapest {'spot' if spot else 'on-demand'} $/GPU-hour first",
                    OFFER_COLS, rows)
        if len(offers) > limit:
            output.err_console.print(f"({len(offers) - limit} more; --limit or --json to see them)")
    _warn_stale(catalog, offers)


@app.command("models")
@handle_errors
def catalog_models(as_json: bool = JSON_OPTION) -> None:
    """Model presets (shapes, no weights) usable as `model:` in a job spec.

    Examples:

      gpuplan catalog models

      gpuplan catalog models --json
    """
    from catalog.loader import load_catalog
    from catalog.params import count_params

    catalog = load_catalog()
    if as_json:
        rows = []
        for m in catalog.models:
            p = count_params(m)
            rows.append({**m.model_dump(mode="json"), "params_total": p.total, "params_active": p.active})
        print_json(rows)
        return
    table: list[list[str | Text]] = []
    for m in catalog.models:
        p = count_params(m)
        table.append([m.id, m.family, f"{p.total / 1e9:.2f}B", f"{p.active / 1e9:.2f}B" if p.active != p.total
                     else "", str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}",
                     str(m.intermediate_size), f"{m.vocab_size:,}", f"{m.max_position_embeddings:,}"])
    print_table("Model presets (or give `model: {config: path/to/config.json}`)", MODEL_COLS, table)


@app.command("local")
@handle_errors
def catalog_local(as_json: bool = JSON_OPTION) -> None:
    """The accelerator of this machine (torch / NVML), the catalog GPU it maps to, and its CPU as measured.

    The CPU is measured once (fp32 matmul GFLOP/s and memory GB/s, under a second) and cached in
    ~/.gpuplan/cpu-probe.json; `gpuplan server` and `gpuplan submit` offer both at $0/h.

    Examples:

      gpuplan catalog local --json
    """
    from datetime import date

    from catalog.loader import load_catalog
    from catalog.local import detect_local_device, local_offer, match_device_name
    from catalog.local_cpu import local_cpu

    catalog = load_catalog()
    device = detect_local_device()
    gpu = match_device_name(device.name, catalog, device.memory_bytes) if device else None
    offer = local_offer(catalog, device, today=date.today())
    cpu, cpu_offer = local_cpu(Settings.from_env().home, today=date.today())
    if as_json:
        print_json({"device": None if device is None else device.__dict__, "gpu": gpu, "offer": offer,
                    "cpu": cpu, "cpu_offer": cpu_offer})
        return
    # Styled as Text: the console reads no markup, so "[bold]" in the string would print as written.
    free = cpu.torch_total_gib or 0
    output.console.print(styled(f"CPU: {cpu.architecture}, {cpu.memory_gib:.1f} GiB RAM ({free:.1f} free), "
                                f"{cpu.tflops['fp32'] * 1000:,.1f} fp32 GFLOP/s, "
                                f"{cpu.memory_bandwidth_gbps:,.1f} GB/s -> ", ("cpu", "bold"),
                                ", offered to the planner at $0/h as cloud 'local' (pin it with accelerators: [cpu])."))
    if device is None:
        output.console.print("No GPU found: plans weigh this CPU against the cloud offers; `gpuplan run` uses the CPU.")
    elif gpu is None:
        output.console.print(f"{device.count} x {device.name!r} found, but it is not in the catalog: plans ignore it.")
    else:
        output.console.print(styled(f"{device.count} x {device.name!r} -> ", (gpu.id, "bold"),
                                    f" ({gpu.memory_gib:.1f} GiB); offered to the planner at $0/h as cloud 'local'."))


catalog_prices.register(app)  # refresh <cloud> and import FILE
