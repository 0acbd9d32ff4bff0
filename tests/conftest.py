"""Shared fixtures. One Ray instance per pytest process (this is a 2-core box; `make test` runs two
xdist workers, each test file whole on one of them, so at most two small local clusters at once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist exports its terminal size to the workers; the CLI's consoles must size themselves as on a
# user's pipe (80 columns unless a test sets COLUMNS), the same under -n 2 as in one process.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local multi-node-capable Ray cluster (head only to start); tests add/remove nodes.

    Fake GPUs: add a node with ``num_gpus=N, resources={"accelerator_type:H100": N}``.
    Tests must remove the nodes they add.
    """
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False},
    )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
