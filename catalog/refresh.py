"""`gpuplan catalog refresh <cloud>` and `gpuplan catalog import`: which clouds, and where results go.

Refreshed and imported files land in the user catalog directory (see :func:`catalog.loader.default_user_dir`),
as ``offers/<cloud>.csv``; :func:`catalog.loader.load_catalog` then prefers them over the packaged
file of the same cloud. Delete the file to go back to the packaged prices.
"""

from __future__ import annotations

import re
from pathlib import Path

from catalog.freshness import REFRESHABLE_CLOUDS
from errors import InvalidInput, UnknownName

AWS_DEFAULT_REGIONS = ("us-east-1", "us-east-2", "us-west-2")  # `gpuplan catalog refresh aws` without --regions
_CLOUD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


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
