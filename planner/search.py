"""Enumerate placements x strategies x offers x markets, prune, rank, explain every rejection.

``plan`` works in three layers so it stays fast: (1) placements (GPU type x count x node shape)
are few, and memory/throughput depend only on them, so each strategy is estimated once per
placement (memory first, micro-batch by bisection); (2) each placement's best strategy is then
priced on every matching offer and market; (3) deadline and budget filter, then rank and mark
the cost/time Pareto front. Every option that was considered and dropped gets a Rejection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Literal

from pydantic import TypeAdapter

from catalog.freshness import refresh_commands
from catalog.loader import Catalog
from catalog.params import ParamCount
from catalog.schema import GpuSpec, ModelConfig, Offer, StackSupport
from errors import InvalidInput, NoFeasiblePlan
from planner.calibration import Calibration
from planner.cost import notice_loss_h, on_demand_cost, spot_cost
from planner.estimate import estimate, estimate_placement, require_calibration
from planner.host_memory import checkpoint_state_bytes, host_memory_problem
from planner.placement import Memo, Placement, PlacementOutcome
from planner.resolve import resolve_for_plan
from planner.spec import JobSpec, Resources
from planner.types import Candidate, CostEstimate, Estimate, Plan, Rejection, Strategy, construct

__all__ = ["Objective", "estimate", "plan", "summarize_rejections"]

Objective = Literal["cheapest", "fastest"]


@dataclass
class _Funnel:
    """How many options each constraint removed, in order, for the 'what to relax' message."""

    removed: dict[str, int] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)

    def reject(self, option: str, reason: str, constraint: str, weight: int = 1) -> None:
        self.rows.append({"option": option, "reason": reason, "constraint": constraint})
        self.removed[constraint] = self.removed.get(constraint, 0) + weight

    @property
    def rejections(self) -> list[Rejection]:
        # one validation call for thousands of rows is much cheaper than one model per row
        return _REJECTIONS.validate_python(self.rows)


_REJECTIONS = TypeAdapter(list[Rejection])


MIN_GPUS_PER_NODE_FOR_MULTI_NODE = 4  # many 1-2 GPU boxes over a 10-25 Gbit/s network: pin the count to get it


def _counts_for(g_per_node: int, pinned: int | None, max_gpus: int) -> list[int]:
    if pinned is not None:
        return [pinned] if pinned <= max_gpus else []
    if g_per_node < MIN_GPUS_PER_NODE_FOR_MULTI_NODE:
        return [g_per_node] if g_per_node <= max_gpus else []
    out = []
    nodes = 1
    while g_per_node * nodes <= max_gpus:
        out.append(g_per_node * nodes)
        nodes *= 2
    return out


def _checkpoint_hours(pc: ParamCount, s: Strategy, cal: Calibration) -> tuple[float, float]:
    """(what one checkpoint stops the loop for, snapshot to durable), in hours."""
    state = checkpoint_state_bytes(pc, s)
    # Checkpoints are written in the background: the loop pays only the snapshot into host memory
    # (the workers keep the interval above twice the write time, so no snapshot waits for a write).
    snapshot_h = state / (cal.cost.checkpoint_snapshot_gbps * 1e9) / 3600
    durable_h = state / (cal.cost.checkpoint_write_gbps * 1e9) / 3600
    return max(cal.cost.min_checkpoint_h, snapshot_h), durable_h


def _markets(offer: Offer, spot_mode: str) -> list[tuple[str, float | None]]:
    if offer.cloud == "local":
        return [("local", 0.0)]
    out: list[tuple[str, float | None]] = []
    if spot_mode != "never":
        out.append(("spot", offer.spot_usd_per_h))
    if spot_mode != "always":
        out.append(("on-demand", offer.on_demand_usd_per_h))
    return out


def plan(spec: JobSpec, catalog: Catalog, *, calibration: Calibration, objective: Objective = "cheapest",
         model: ModelConfig | None = None, today: date | None = None,
         hazard_per_h: dict[str, float] | None = None) -> Plan:
    """Every way to run ``spec`` on ``catalog``, ranked by ``objective``; raises NoFeasiblePlan if none.

    ``calibration``: the fitted constants to plan with; the caller reads them (the planner reads no files).
    ``hazard_per_h`` overrides the calibration's spot preemption rates per cloud (e.g. from traces).
    """
    cal = require_calibration(calibration, "plan")
    if objective not in ("cheapest", "fastest"):
        raise InvalidInput(f"objective must be 'cheapest' or 'fastest', got {objective!r}", path="objective")
    mdl, gpus, pinned_counts = resolve_for_plan(spec, catalog, model)  # every problem of the spec in one error
    search = _Search(spec, mdl, cal, catalog.support, {**cal.cost.spot_hazard_per_h, **(hazard_per_h or {})})
    _reject_outside_allow_list(catalog, {g.id for g in gpus}, search.funnel)
    for gpu in gpus:
        for o in _offers_in_scope(catalog, gpu, spec.resources, search.funnel):
            for count in _counts_for(o.gpu_count, pinned_counts.get(gpu.id), spec.resources.max_gpus):
                out = search.placement(gpu, count, o)
                if out.estimate is not None:
                    search.price(out, o, count, gpu)
    if not search.candidates:
        message, hint = _explain(spec, search.funnel, search.priced, mdl, cal)
        raise NoFeasiblePlan(message, hint=hint)
    ranked = _rank(search.candidates, objective)
    warnings: list[str] = list(mdl.assumptions)
    warnings += [w for w in ranked[0].estimate.warnings if w not in warnings]  # e.g. weights planned dequantized
    stale = _stale_prices_warning(catalog, ranked[:10], today) if today is not None else None
    if stale:
        warnings.append(stale)
    return Plan(job=spec.name, objective=objective, chosen=ranked[0], candidates=ranked,
                rejections=search.funnel.rejections, warnings=warnings)


def _reject_outside_allow_list(catalog: Catalog, allowed_ids: set[str], funnel: _Funnel) -> None:
    for g in catalog.gpus:
        if g.id not in allowed_ids and catalog.offers_for(g.id):
            funnel.reject(f"{g.id} (any count)", f"{g.id} is not in resources.accelerators", "allow-list", 0)


def _offers_in_scope(catalog: Catalog, gpu: GpuSpec, res: Resources, funnel: _Funnel) -> list[Offer]:
    """The GPU's offers in the allowed clouds and regions (a zone counts as its region's)."""
    clouds = {c.lower() for c in res.clouds} if res.clouds else None
    regions = set(res.regions) if res.regions else None
    offers = catalog.offers_for(gpu.id)
    kept = [o for o in offers if (clouds is None or o.cloud.lower() in clouds)
            and (regions is None or o.region in regions or (o.zone or "") in regions)]
    if not kept:
        why = "no offer in the catalog" if not offers else "no offer in the allowed clouds/regions"
        funnel.reject(f"{gpu.id} (any count)", f"{why} for {gpu.id}", "offers")
    return kept


def _stale_prices_warning(catalog: Catalog, top: list[Candidate], today: date) -> str | None:
    stale = [o for o in catalog.stale_offers(today) if o in {c.offer for c in top}]
    if not stale:
        return None
    oldest = min(o.source.as_of for o in stale)
    clouds = sorted({o.cloud for o in stale})
    return (f"{len(stale)} offer price(s) used here from {', '.join(clouds)} are older than 30 days "
            f"(oldest {oldest}); refresh with {refresh_commands(clouds)}")


class _Search:
    """One plan's search state: each placement estimated once, each offer x market priced and kept or
    rejected with its reason."""

    def __init__(self, spec: JobSpec, mdl: ModelConfig, cal: Calibration, support: StackSupport,
                 hazards: dict[str, float]) -> None:
        self.spec, self.mdl, self.cal, self.support, self.hazards = spec, mdl, cal, support, hazards
        self.funnel = _Funnel()
        self.memo = Memo()
        self.outcomes: dict[tuple[str, int, int, float], PlacementOutcome] = {}
        self.candidates: list[Candidate] = []
        self.priced: list[Candidate] = []  # fit in memory, before deadline/budget

    def placement(self, gpu: GpuSpec, count: int, o: Offer) -> PlacementOutcome:
        """The best strategy for ``count`` x ``gpu`` laid out as offer ``o``'s nodes (estimated once per layout)."""
        multi = count > o.gpu_count
        key = (gpu.id, count, o.gpu_count if multi else 0, o.network_gbps if multi else 0.0)
        if key not in self.outcomes:
            p = Placement(gpu, count, o.gpu_count if multi else max(count, o.gpu_count), o.network_gbps)
            self.outcomes[key] = estimate_placement(self.spec, self.mdl, p, self.cal, self.support, self.memo)
            if self.outcomes[key].estimate is None:
                self.funnel.reject(p.label(), self.outcomes[key].reason, self.outcomes[key].constraint)
        out = self.outcomes[key]
        if out.estimate is not None and not out.label:
            out.label = out.estimate.strategy.label()
            out.checkpoint_h, out.durable_h = _checkpoint_hours(self.memo.count(self.mdl), out.estimate.strategy,
                                                                 self.cal)
        return out

    def price(self, out: PlacementOutcome, o: Offer, count: int, gpu: GpuSpec) -> None:
        """Offer ``o`` in each allowed market: a candidate, or a rejection (host memory, no price, deadline,
        budget)."""
        assert out.estimate is not None
        res = self.spec.resources
        nodes = math.ceil(count / o.gpu_count)
        if self.spec.task == "train":
            short = host_memory_problem(self.memo.count(self.mdl), out.estimate.strategy, gpu,
                                        min(count, o.gpu_count), o.ram_gib, o.instance_type)
            if short:
                self.funnel.reject(f"{out.label} on {o.cloud} {o.instance_type} {o.region}", short, "host-memory")
                return
        for market, price in _markets(o, res.spot):
            if price is None:
                if res.spot == "always" and market == "spot":
                    self.funnel.reject(_option(out, o, market), f"{o.cloud} {o.instance_type} has no spot price",
                                       "price")
                continue
            cost = _cost(out.estimate, (out.checkpoint_h, out.durable_h), market, price * nodes, nodes, o.cloud,
                         self.hazards, res.deadline, self.cal)
            cand = construct(Candidate, estimate=out.estimate, offer=o, cost=cost, nodes=nodes, pareto=False)
            self.priced.append(cand)
            problem = _deadline_problem(cost, res.deadline, self.cal)
            if problem:
                self.funnel.reject(_option(out, o, market), problem, "deadline")
            elif res.budget_usd is not None and cost.usd > res.budget_usd:
                self.funnel.reject(_option(out, o, market),
                                   f"costs ${cost.usd:,.0f} > budget ${res.budget_usd:,.0f}", "budget")
            else:
                self.candidates.append(cand)


def _option(out: PlacementOutcome, o: Offer, market: str) -> str:
    """A priced option as a rejection names it (built only for rejections: most options are kept)."""
    return f"{out.label} on {o.cloud} {o.instance_type} {o.region} {market}"


def _cost(est: Estimate, checkpoint_h: tuple[float, float], market: str, usd_per_h: float, nodes: int, cloud: str,
          hazards: dict[str, float], deadline: float | None, cal: Calibration) -> CostEstimate:
    if market == "spot":
        hazard = hazards.get(cloud, hazards.get("default", 0.1)) * nodes
        notice = cal.cost.spot_notice_s.get(cloud, cal.cost.spot_notice_s.get("default", 0.0))
        lost = notice_loss_h(notice, checkpoint_h[0] * 3600, checkpoint_h[1] * 3600, est.throughput.step_time_s)
        return spot_cost(est.hours, usd_per_h, hazard_per_h=hazard, checkpoint_h=checkpoint_h[0],
                         durable_h=checkpoint_h[1], restart_h=cal.cost.restart_h, deadline_h=deadline, lost_h=lost)
    return on_demand_cost(est.hours, usd_per_h, deadline, market="local" if market == "local" else "on-demand")


def _deadline_problem(cost: CostEstimate, deadline: float | None, cal: Calibration) -> str | None:
    if deadline is None:
        return None
    if cost.market == "spot":
        prob = cost.deadline_probability or 0.0
        if prob < cal.cost.deadline_confidence:
            return (f"spot: {prob:.0%} chance to finish within the {deadline:g} h deadline "
                    f"(< {cal.cost.deadline_confidence:.0%}; expected {cost.hours:.1f} h)")
        return None
    if cost.hours > deadline:
        return f"takes {cost.hours:,.1f} h > deadline {deadline:g} h"
    return None


def _rank(cands: list[Candidate], objective: Objective) -> list[Candidate]:
    def key(c: Candidate) -> tuple[float, float]:
        return (c.cost.usd, c.cost.hours) if objective == "cheapest" else (c.cost.hours, c.cost.usd)

    ordered = sorted(cands, key=key)
    # Pareto front on (usd, hours): walking by cost, a candidate is on it if faster than all cheaper ones
    front: set[int] = set()
    best_hours = math.inf
    for j in sorted(range(len(ordered)), key=lambda j: (ordered[j].cost.usd, ordered[j].cost.hours)):
        if ordered[j].cost.hours < best_hours - 1e-12:
            front.add(j)
            best_hours = ordered[j].cost.hours
    return [c.model_copy(update={"pareto": True}) if i in front else c for i, c in enumerate(ordered)]


def _explain(spec: JobSpec, funnel: _Funnel, priced: list[Candidate], model: ModelConfig,
             cal: Calibration) -> tuple[str, str]:
    """(message, hint) naming the constraint that removed the last candidates and what to relax."""
    res = spec.resources
    if priced:
        on_time = [c for c in priced if _deadline_problem(c.cost, res.deadline, cal) is None]
        if on_time and res.budget_usd is not None:
            cheapest = min(on_time, key=lambda c: c.cost.usd)
            n = funnel.removed.get("budget", 0)
            return (f"budget ${res.budget_usd:,.0f} removed the last {n} candidates; the cheapest that meets the "
                    f"deadline costs ${cheapest.cost.usd:,.0f} ({cheapest.estimate.strategy.label()} on "
                    f"{cheapest.offer.cloud} {cheapest.offer.instance_type} {cheapest.cost.market})",
                    f"raise budget_usd to at least ${math.ceil(cheapest.cost.usd):,} or relax the deadline")
        fastest = min(priced, key=lambda c: c.cost.hours)
        n = funnel.removed.get("deadline", 0)
        return (f"deadline {res.deadline:g} h removed the last {n} candidates; the fastest takes "
                f"{fastest.cost.hours:.1f} h ({fastest.estimate.strategy.label()} on {fastest.offer.cloud} "
                f"{fastest.offer.instance_type}, ${fastest.cost.usd:,.0f})",
                f"relax resources.deadline to at least {math.ceil(fastest.cost.hours)}h, allow more GPUs "
                f"(resources.max_gpus={res.max_gpus}) or more accelerator types")
    mem = [r for r in funnel.rejections if r.constraint == "memory"]
    if mem:
        hint = ("allow bigger or more GPUs (resources.accelerators / max_gpus), or reduce memory: "
                + ("lora/qlora, activation_checkpointing, fsdp sharding, a smaller micro_batch or seq_len"
                   if spec.task == "train" else "int8/int4 weights, a smaller batch or context"))
        return (f"memory removed the last {len(mem)} placements of {model.id}; e.g. {mem[0].option}: {mem[0].reason}",
                hint)
    if funnel.rejections:
        # a GPU with no offer says little about why the offered ones were refused
        telling = [r for r in funnel.rejections if r.constraint not in ("offers", "allow-list")]
        last = (telling or funnel.rejections)[-1]
        return (f"{last.constraint} removed the last candidates: {last.option}: {last.reason}",
                "relax resources.accelerators / clouds / regions / spot or the pinned train/infer fields")
    return ("no offer in the catalog matches the job's resources",
            "check resources.accelerators, clouds and regions against `gpuplan catalog offers`")


def summarize_rejections(rejections: Iterable[Rejection]) -> list[tuple[str, int, str]]:
    """(constraint, count, one example 'option: reason') for a short table."""
    groups: dict[str, list[Rejection]] = {}
    for r in rejections:
        groups.setdefault(r.constraint, []).append(r)
    return [(k, len(v), f"{v[0].option}: {v[0].reason}") for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
