"""Where a job goes when the cloud will not launch the nodes its attempt waits for.

The cluster config (``gpuplan cluster config``, workers.cluster.config) gives the plan's offer a worker node type
per (market, zone) it was priced in: the chosen spot zone, the region's other zones, on demand. This is
that list, read through the generator's own ``cluster_needs`` (so whatever types it makes, this sees),
cheapest first: the planner's cost order. A job whose attempt waits on a type whose launches fail moves
to the next placement of the list that the cluster can run; ``spot: always`` lists spot types only (the
plan priced no other market), so such a job moves between spot zones and then waits with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from errors import GpuplanError
from scheduler.loop.attempt_placement import MarketChoice
from scheduler.store.models import Attempt, Job
from workers.cluster.config import ClusterOptions, cluster_needs


def planned_placements(job: Job) -> list[MarketChoice]:
    """The (market, zone) placements of the node types generated for the job's planned instance type, cheapest
    first; [] when the plan has none (not on AWS, or no plan the generator accepts)."""
    planned = job.plan
    try:  # the job keeps the plan's leading candidates (planner.plan_record): the generator reads them as a plan
        needs = cluster_needs(planned.as_plan(), ClusterOptions(every_zone=True))
    except GpuplanError:
        return []
    nodes = max(planned.nodes, 1)
    out: dict[tuple[str, str | None], MarketChoice] = {}
    for kind in needs.kinds:
        # another instance type (even of the same GPU) would need its own strategy and price: not a fallback
        if kind.instance_type != planned.chosen.offer.instance_type:
            continue
        offer = kind.candidate.offer
        price = offer.spot_usd_per_h if kind.market == "spot" else offer.on_demand_usd_per_h
        if price is not None:
            out.setdefault((kind.market, kind.zone), MarketChoice(kind.market, price * nodes, kind.zone))
    return sorted(out.values(), key=lambda p: (p.usd_per_h, p.market != "spot", p.zone or ""))


def next_placement(job: Job, attempt: Attempt, runnable: Callable[[MarketChoice], bool]) -> MarketChoice | None:
    """The first placement after the attempt's own in :func:`planned_placements` that ``runnable`` accepts
    (the cluster has such a node type); None at the end of the list."""
    placements = planned_placements(job)
    here = next((i for i, p in enumerate(placements) if (p.market, p.zone) == (attempt.market, attempt.zone)),
                None)
    if here is None:
        return None
    return next((p for p in placements[here + 1:] if runnable(p)), None)
