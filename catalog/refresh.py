"""`gpuplan catalog refresh <cloud>`: which clouds can be refreshed, and where results go.

Refreshed files land in the user catalog directory (see :func:`catalog.loader.default_user_dir`),
as ``offers/<cloud>.csv``; :func:`catalog.loader.load_catalog` then prefers them over the packaged
file of the same cloud. Delete the file to go back to the packaged prices.
"""

from __future__ import annotations

from pathlib import Path

from catalog.errors import UnknownName

REFRESHABLE_CLOUDS = ("aws",)
AWS_DEFAULT_REGIONS = ("us-east-1", "us-east-2", "us-west-2")  # `gpuplan catalog refresh aws` without --regions


def check_cloud(cloud: str) -> str:
    if cloud.lower() not in REFRESHABLE_CLOUDS:
        raise UnknownName("refreshable cloud", cloud, REFRESHABLE_CLOUDS)
    return cloud.lower()


def default_offers_path(cloud: str, user_dir: Path | None = None) -> Path:
    from catalog.loader import default_user_dir  # yaml and the schema: only when a refresh writes

    return (user_dir or default_user_dir()) / "offers" / f"{check_cloud(cloud)}.csv"
