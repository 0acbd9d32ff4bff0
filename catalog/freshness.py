"""Which clouds `gpuplan catalog refresh` renews, and the command that renews any cloud's prices: shared by the
catalog's stale-price warning and the planner's (no imports, so both can use it)."""

from __future__ import annotations

from collections.abc import Iterable

REFRESHABLE_CLOUDS = ("aws", "azure")  # `gpuplan catalog refresh <cloud>`; any other cloud: `gpuplan catalog import`


def refresh_commands(clouds: Iterable[str]) -> str:
    """The commands that renew the prices of ``clouds``: `gpuplan catalog refresh <cloud>` for the clouds it
    refreshes, `gpuplan catalog import` of a skypilot-catalog vms.csv for the others."""
    names = sorted({c.lower() for c in clouds})
    parts = [f"`gpuplan catalog refresh {c}`" for c in names if c in REFRESHABLE_CLOUDS]
    others = [c for c in names if c not in REFRESHABLE_CLOUDS]
    if len(others) == 1:
        parts.append(f"`gpuplan catalog import vms.csv --cloud {others[0]}` (skypilot-catalog's "
                     f"catalogs/v8/{others[0]}/vms.csv)")
    elif others:
        parts.append(f"`gpuplan catalog import vms.csv --cloud <cloud>` for {', '.join(others)} (skypilot-catalog's "
                     "catalogs/v8/<cloud>/vms.csv)")
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]
