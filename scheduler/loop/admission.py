"""Whether the server's executor could ever run a plan's placement, asked at submit.

The scheduling loop asks the executor the same question before each attempt and fails a job no node
could ever run. Asked first at submit, a server that cannot run the plan (an in-process executor,
which has this machine only, given a plan for cloud GPUs) refuses the job with the reason, instead
of answering "queued ... estimated" and failing it the same second.
"""

from __future__ import annotations

from collections.abc import Callable

from errors import ExecutionError, GpuplanError, Infeasible
from planner.spec import JobSpec
from planner.types import Plan
from workers.executors.protocol import RunRequest

Feasibility = Callable[[RunRequest], str | None]  # Executor.feasibility: None if some node can ever run it


def placement_problem(feasibility: Feasibility, spec: JobSpec, plan: Plan) -> str | None:
    """Why the executor could never run the plan's chosen placement; None if it could (or cannot tell now)."""
    chosen = plan.chosen
    assert chosen is not None
    market = chosen.cost.market if chosen.cost.market in ("spot", "on-demand") else "on-demand"
    request = RunRequest(job_id="(new job)", attempt=1, spec=spec, strategy=chosen.estimate.strategy,
                         checkpoint_uri="", run_name="(new job)", market=market, zone=chosen.offer.zone)
    try:
        return feasibility(request)
    except ExecutionError:  # the cluster cannot be asked now (Ray down): the loop asks again at launch
        return None
    except (GpuplanError, ValueError) as exc:
        return f"cannot build its run request: {exc}"


def refuse_unrunnable(feasibility: Feasibility | None, spec: JobSpec, plan: Plan) -> None:
    """Raise Infeasible, with the plan and the reason, when the executor could never run the plan."""
    if feasibility is None:
        return
    reason = placement_problem(feasibility, spec, plan)
    if reason is None:
        return
    chosen = plan.chosen
    assert chosen is not None
    raise Infeasible(f"job {spec.name!r} can never run on this server: its plan is "
                     f"{chosen.estimate.strategy.label()} on {chosen.offer.cloud} {chosen.offer.instance_type}, "
                     f"and {reason}",
                     hint="`gpuplan plan SPEC` lists every placement; resources.clouds: [local] (or accelerators: "
                          "[cpu]) keeps the plan on this server's machine")
