"""A job's plan as the scheduler keeps it (:class:`PlannedRun`), and the one place it becomes the JSON stored
with the job and is read back.

The planner's :class:`~planner.types.Plan` holds every candidate and every rejection; a job keeps the chosen
candidate and the leading ones (the placements it may fall back to, the alternatives its page shows). Everything
downstream (the loop, the spot policy, changeovers, fallbacks, accuracy records, calibration, the dashboard) reads
that record through its typed fields and accessors, never the stored JSON.

Stored documents carry ``schema_version``. :func:`load_planned_run` reads every version stored so far, upgrading
older documents as it reads them, so a database keeps working across versions without a data migration:

- version 1, what the scheduler stored before plans had versions: no ``schema_version`` key; job, objective,
  chosen, warnings and ``alternatives`` (the plan's four leading candidates, best first).
- version 2: version 1 with ``schema_version``.

A new version adds its upgrade step to ``_UPGRADES`` and its captured documents to tests/data/plans.

A job's public JSON (``GET /v1/jobs/{id}``'s ``plan``) is :meth:`PlannedRun.public`: the record's fields,
without the storage's version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from errors import InvalidInput
from planner.prediction import Prediction, prediction_of
from planner.types import Candidate, Plan, Strategy

PLAN_SCHEMA_VERSION = 2
ALTERNATIVES = 4  # the plan's leading candidates a job keeps


class PlannedRun(BaseModel):
    """The plan a job runs: its chosen candidate and the leading alternatives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    objective: Literal["cheapest", "fastest"]
    chosen: Candidate
    warnings: list[str] = Field(default_factory=list)
    alternatives: list[Candidate] = Field(default_factory=list, description="the plan's leading candidates, best "
                                          "first (the chosen one among them)")

    @property
    def strategy(self) -> Strategy:
        return self.chosen.estimate.strategy

    @property
    def hours(self) -> float:
        """The planned hours of work, its start included (no preemption overhead)."""
        return self.chosen.estimate.hours

    @property
    def zone(self) -> str | None:
        """The zone the plan priced (None: any zone of its region)."""
        return self.chosen.offer.zone

    @property
    def nodes(self) -> int:
        return self.chosen.nodes

    @property
    def spot_mttp_h(self) -> float | None:
        """The mean time to preemption the plan priced spot at (None when it priced on-demand): the workers
        checkpoint for it, so the interval that runs is the plan's."""
        mttp_h = self.chosen.cost.mean_time_to_preemption_h
        return mttp_h if mttp_h is not None and mttp_h > 0 else None

    def prediction(self) -> Prediction:
        """What the plan predicts of a run of its chosen candidate."""
        return prediction_of(self.chosen.estimate)

    def as_plan(self) -> Plan:
        """The record as a planner Plan (its alternatives as the candidates, no rejections): for what reads
        plans, such as the cluster config's node types (workers.cluster.config.cluster_needs)."""
        return Plan(job=self.job, objective=self.objective, chosen=self.chosen, candidates=self.alternatives,
                    rejections=[], warnings=self.warnings)

    def public(self) -> dict[str, Any]:
        """The job's plan in the API's JSON (``JobDetail.plan``)."""
        return self.model_dump(mode="json")


def planned_run(plan: Plan) -> PlannedRun:
    """The record a job keeps of the planner's plan; a plan without a chosen candidate runs nothing."""
    if plan.chosen is None:
        raise InvalidInput(f"plan {plan.job!r} has no chosen candidate, so no job can run it",
                           hint="relax resources (accelerators, deadline, budget) until `gpuplan plan` picks one")
    return PlannedRun(job=plan.job, objective=plan.objective, chosen=plan.chosen, warnings=plan.warnings,
                      alternatives=plan.candidates[:ALTERNATIVES])


def dump_planned_run(run: PlannedRun) -> dict[str, Any]:
    """The JSON document stored with the job (current schema version)."""
    return {"schema_version": PLAN_SCHEMA_VERSION, **run.public()}


def _from_v1(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "schema_version": 2}


# version -> the step that upgrades its documents to the next version
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1}


def load_planned_run(doc: Mapping[str, Any]) -> PlannedRun:
    """The record of a stored document of any schema version so far (older ones are upgraded as read), or of a
    job's public plan (``PlannedRun.public``, which has the current fields without the version)."""
    body = dict(doc)
    version = body.get("schema_version", 1)
    if not isinstance(version, int) or not 1 <= version <= PLAN_SCHEMA_VERSION:
        raise InvalidInput(f"the job's plan has schema version {version!r}; this gpuplan reads versions 1 to "
                           f"{PLAN_SCHEMA_VERSION}", path="plan",
                           hint="run the gpuplan version that stored it (or a newer one) against this database")
    while version < PLAN_SCHEMA_VERSION:
        body = _UPGRADES[version](body)
        version = body["schema_version"]
    del body["schema_version"]
    try:
        return PlannedRun.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidInput(f"the job's stored plan does not read as a plan: {where}: {first['msg']}", path="plan",
                           hint="it was not written by gpuplan's scheduler; resubmit the job") from None
