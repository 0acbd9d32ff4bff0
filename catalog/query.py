"""Questions the CLI and planner ask of a Catalog: filtered offers, prices per GPU-hour, cheapest per GPU."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.loader import Catalog
from catalog.schema import Offer
from errors import UnknownName


def price_per_gpu_hour(offer: Offer, spot: bool) -> float | None:
    price = offer.spot_usd_per_h if spot else offer.on_demand_usd_per_h
    return None if price is None else price / offer.gpu_count


def filter_offers(
    catalog: Catalog,
    *,
    gpu: str | None = None,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool = False,
) -> list[Offer]:
    """Offers matching the filters, cheapest per GPU-hour first (spot prices when ``spot``).

    Unknown GPU, cloud or region names raise UnknownName with the closest valid names; with ``spot`` only
    offers that have a spot price are kept.
    """
    offers = list(catalog.offers_for(gpu)) if gpu else list(catalog.offers)
    if cloud:
        clouds = sorted({o.cloud for o in catalog.offers})
        if cloud.lower() not in clouds:
            raise UnknownName("cloud", cloud, clouds, path="--cloud")
        offers = [o for o in offers if o.cloud == cloud.lower()]
    if region:
        def in_region(o: Offer) -> bool:
            return o.region == region or (o.zone or "").startswith(region)

        if not any(in_region(o) for o in catalog.offers):  # a typo, not a region without such GPUs
            raise UnknownName("region", region, sorted({o.region for o in catalog.offers}), path="--region")
        offers = [o for o in offers if in_region(o)]
    if spot:
        offers = [o for o in offers if o.spot_usd_per_h is not None]

    def key(o: Offer) -> tuple[float, str, str, str]:
        price = price_per_gpu_hour(o, spot)
        return (price if price is not None else float("inf"), o.cloud, o.instance_type, o.zone or o.region)

    return sorted(offers, key=key)


@dataclass(frozen=True)
class CheapestOffers:
    on_demand: Offer | None
    spot: Offer | None

    @property
    def on_demand_per_gpu(self) -> float | None:
        return price_per_gpu_hour(self.on_demand, False) if self.on_demand else None

    @property
    def spot_per_gpu(self) -> float | None:
        return price_per_gpu_hour(self.spot, True) if self.spot else None


def cheapest_by_gpu(catalog: Catalog) -> dict[str, CheapestOffers]:
    """For every GPU id: its cheapest on-demand and cheapest spot offer per GPU-hour (None if none)."""
    out: dict[str, CheapestOffers] = {}
    for gpu in catalog.gpus:
        offers = catalog.offers_for(gpu.id)
        od = [o for o in offers if o.on_demand_usd_per_h is not None]
        sp = [o for o in offers if o.spot_usd_per_h is not None]
        out[gpu.id] = CheapestOffers(
            on_demand=min(od, key=lambda o: price_per_gpu_hour(o, False) or 0.0) if od else None,
            spot=min(sp, key=lambda o: price_per_gpu_hour(o, True) or 0.0) if sp else None,
        )
    return out
