"""/v1/catalog: the GPUs and priced offers the planner chooses from."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from catalog.schema import GpuSpec, Offer
from scheduler.api.deps import CatalogDep, PrincipalDep
from scheduler.inputs import Word

router = APIRouter(prefix="/v1/catalog", tags=["catalog"])


@router.get("/gpus", response_model=list[GpuSpec])
def gpus(_principal: PrincipalDep, catalog: CatalogDep) -> list[GpuSpec]:
    return list(catalog.gpus)


@router.get("/offers", response_model=list[Offer])
def offers(_principal: PrincipalDep, catalog: CatalogDep,
           gpu: Annotated[Word | None, Query(description="GPU id or alias, e.g. H100")] = None,
           cloud: Annotated[Word | None, Query()] = None,
           spot: Annotated[bool, Query(description="only offers with a spot price")] = False) -> list[Offer]:
    rows = catalog.offers_for(gpu) if gpu else list(catalog.offers)  # unknown GPU -> UnknownName (422)
    if cloud:
        rows = [o for o in rows if o.cloud == cloud]
    if spot:
        rows = [o for o in rows if o.spot_usd_per_h is not None]
    return rows
