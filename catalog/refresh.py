"""`gpuplan catalog refresh <cloud>` and `gpuplan catalog import`: which clouds, and where results go.

Refreshed and imported files land in the user catalog directory (see :func:`catalog.loader.default_user_dir`),
as ``offers/<cloud>.csv``; :func:`catalog.loader.load_catalog` then prefers them over the packaged
file of the same cloud. Delete the file to go back to the packaged prices.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from catalog.errors import InvalidInput, UnknownName

REFRESHABLE_CLOUDS = ("aws", "azure")
AWS_DEFAULT_REGIONS = ("us-east-1", "us-east-2", "us-west-2")  # `gpuplan catalog refresh aws` without --regions
_CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


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


def check_cloud(cloud: str) -> str:
    if cloud.lower() not in REFRESHABLE_CLOUDS:
        raise UnknownName("refreshable cloud", cloud, REFRESHABLE_CLOUDS)
    return cloud.lower()


def check_cloud_name(cloud: str) -> str:
    """A cloud name usable as an offers file name (any cloud: imports are not limited to the refreshable ones)."""
    name = cloud.strip().lower()
    if not _CLOUD_NAME.match(name):
        raise InvalidInput(f"cloud name {cloud!r} is not a short lowercase name", path="--cloud",
                           hint="e.g. --cloud lambda (letters, digits and dashes)")
    return name


def user_offers_path(cloud: str, user_dir: Path | None = None) -> Path:
    """``offers/<cloud>.csv`` in the user catalog directory: it replaces the packaged file of that cloud."""
    from catalog.loader import default_user_dir  # yaml and the schema: only when a refresh writes

    return (user_dir or default_user_dir()) / "offers" / f"{check_cloud_name(cloud)}.csv"


def default_offers_path(cloud: str, user_dir: Path | None = None) -> Path:
    return user_offers_path(check_cloud(cloud), user_dir)
