"""What ``status`` says about a multi-node run's network: a run planned with EFA whose NCCL ran over TCP
sockets (the attempt's ``nccl_link_gbps`` / ``nccl_on_sockets``, recorded by the workers) is slower than
its plan, and the plan's speed on the link it really had is computed again (``Relink``: the planner, given
that link as a value)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from errors import GpuplanError
from planner.plan_record import PlannedRun
from workers.cluster.nccl_net import network_warning, parse_network_line

# (job spec, the job's plan, Gbit/s) -> the plan's tokens/s on that link, or None when it cannot say
Relink = Callable[[Mapping[str, Any], PlannedRun, float], float | None]


def network_warnings(spec: Mapping[str, Any], plan: PlannedRun, attempts: Iterable[Mapping[str, Any]],
                     relink: Relink | None, running_line: str | None = None) -> list[str]:
    """The warning of the newest attempt that recorded its network, when that was slower than the plan's;
    ``running_line``: the running attempt's log line naming it (``workers.cluster.nccl_net.network_line``)."""
    if plan.nodes < 2:
        return []
    planned_gbps = plan.chosen.offer.network_gbps
    planned_tps = plan.chosen.estimate.throughput.tokens_per_s
    for attempt in sorted(attempts, key=lambda a: int(a.get("number") or 0), reverse=True):
        measured = (attempt.get("metrics") or {}).get("measured") or {}
        link = measured.get("nccl_link_gbps")
        network: str | None = "socket" if measured.get("nccl_on_sockets") else "efa"
        if link is None and attempt.get("ended_at") is None and running_line:
            network, link = parse_network_line(running_line)
        if link is None:
            continue
        on_link = relink(spec, plan, float(link)) if relink and float(link) < planned_gbps else None
        said = network_warning(network, float(link), planned_gbps, planned_tps, on_link)
        return [f"attempt {attempt.get('number')}: {said}"] if said else []
    return []


def planner_relink(catalog: Any, calibration: Any) -> Relink:
    """``Relink`` through the planner's estimate for the plan's placement at the given link."""
    from planner.estimate import estimate
    from planner.spec import spec_from_dict
    from workers.spec_files import spec_model

    def relink(spec: Mapping[str, Any], plan: PlannedRun, gbps: float) -> float | None:
        try:
            job_spec = spec_from_dict(dict(spec))
            est = estimate(job_spec, catalog, plan.strategy.gpu, plan.strategy.gpu_count, calibration=calibration,
                           model=spec_model(job_spec, catalog), gpus_per_node=plan.chosen.offer.gpu_count,
                           network_gbps=gbps)
        except (GpuplanError, ValueError):  # a plan the catalog no longer knows: no number
            return None
        return float(est.throughput.tokens_per_s)

    return relink
