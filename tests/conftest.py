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


# The tests kill nodes on purpose; Ray's defaults (a check every 3 s, dead after 5 failed checks of up to
# 10 s each) spend 15-25 s of each such test noticing. A raylet answers its health check from its own
# thread, so a 3 s timeout is still far above any stall this box's load gives it.
FAST_NODE_DEATH: dict[str, int] = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 4,
}


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
        head_node_args={"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False,
                        "_system_config": FAST_NODE_DEATH},
    )
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _file_weight(items: list[pytest.Item]) -> int:
    """Ray files first, then other slow files: under `--dist loadfile` the longest files then start first
    and the short ones fill in around them, instead of one long file running alone at the end. A file that
    starts a whole cluster (``whole_box``: a Ray head, its nodes, a server, a dozen attempts' processes) goes
    last instead: the other worker then finishes its short files and leaves the box's 2 cores to it, where
    beside another Ray file each would starve the other (tests/e2e/test_autoscaler.py: 186-217 s alone,
    234-261 s beside the others, docs/lab-notes/2026-12-05-cluster-under-the-autoscaler.md)."""
    marks = {mark.name for item in items for mark in item.iter_markers()}
    return -1 if "whole_box" in marks else 2 if "ray" in marks else 1 if "slow" in marks else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    # A stable sort on what every xdist worker collects alike, so all of them agree on the order.
    ordered = sorted(by_file.values(), key=_file_weight, reverse=True)
    items[:] = [item for group in ordered for item in group]


class _FileTimes:
    """Seconds each test file took (setup, call and teardown of its tests, on whichever worker ran it), for
    the slowest files in the summary: the per-test list splits a file's module fixture from its tests."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        slowest = sorted(self.seconds.items(), key=lambda item: item[1], reverse=True)[:10]
        if slowest:
            terminalreporter.write_sep("=", "slowest 10 test files (seconds, setup + tests + teardown)")
            for path, seconds in slowest:
                terminalreporter.write_line(f"{seconds:8.1f}s {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(_FileTimes(), "gpuplan-file-times")
