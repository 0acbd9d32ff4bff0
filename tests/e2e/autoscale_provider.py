"""Ray's ``fake_multinode`` provider with what a cloud does that the fake leaves out, for
tests/e2e/test_autoscaler.py. It runs in the autoscaler's own process (the head's monitor), loaded as an
``external`` provider; the test steers it through files in ``control_dir``:

- ``refuse.json``: node types whose launches fail, as EC2's InsufficientInstanceCapacity does (a
  ``NodeLaunchException``, which the autoscaler records as the type's unavailability);
- ``terminate.json``: node ids the cloud takes away (a spot reclaim: the node's processes are killed, the
  workers its raylet started with them, no drain, no goodbye); applied the next time the autoscaler lists the
  nodes.

Every node it starts gets its own spot-notice watcher (``python -m workers.executors.preemption``, as the generated
config's worker start commands run it), polling that node's metadata endpoint ``{imds_url}/{node id}``.
What it did goes to ``events.jsonl`` (one JSON object a line): launches, refusals, terminations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE


class CloudLikeProvider(FakeMultiNodeProvider):
    _nodes: dict[str, Any]  # node id -> {"tags": ..., "node": ray._private.node.Node}

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._control = Path(provider_config["control_dir"])
        self._imds_url = str(provider_config["imds_url"])
        self._watchers: dict[str, subprocess.Popen[bytes]] = {}

    def _read(self, name: str) -> list[str]:
        path = self._control / name
        try:
            return [str(x) for x in json.loads(path.read_text())]
        except (OSError, ValueError):
            return []

    def _event(self, **fields: Any) -> None:
        with (self._control / "events.jsonl").open("a") as out:
            out.write(json.dumps({"t": time.time(), **fields}) + "\n")

    def create_node_with_resources_and_labels(self, node_config: dict[str, Any], tags: dict[str, str], count: int,
                                              resources: dict[str, Any], labels: dict[str, str]) -> Any:
        node_type = tags[TAG_RAY_USER_NODE_TYPE]
        if node_type in self._read("refuse.json"):
            self._event(event="refused", type=node_type)
            raise NodeLaunchException("InsufficientInstanceCapacity",
                                      f"There is no Spot capacity available that matches your request ({node_type})",
                                      None)
        with self.lock:
            before = set(self._nodes)
            super().create_node_with_resources_and_labels(  # type: ignore[no-untyped-call]
                node_config, tags, count, resources, labels)
            for node_id in sorted(set(self._nodes) - before):
                self._watch(node_id)
                node = self._nodes[node_id]["node"]
                pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
                self._event(event="launched", type=node_type, id=node_id,
                            pids=[*pids, self._watchers[node_id].pid])
        return None

    def _watch(self, node_id: str) -> None:
        gcs = str(self._gcs_address)
        log = (self._control / f"watcher-{node_id[-5:]}.log").open("ab")
        self._watchers[node_id] = subprocess.Popen(
            [sys.executable, "-m", "workers.executors.preemption", "--gcs-address", gcs, "--node-id", node_id,
             "--metadata-url", f"{self._imds_url}/{node_id}", "--interval", "0.5"],
            stdout=log, stderr=log, start_new_session=True)

    def _reclaim(self) -> None:
        for node_id in self._read("terminate.json"):
            with self.lock:
                node = self._nodes.pop(node_id, None)
            if node is None:
                continue
            self._stop_watcher(node_id)
            _kill_machine(node["node"])
            self._event(event="reclaimed", id=node_id, type=node["tags"][TAG_RAY_USER_NODE_TYPE])

    def _stop_watcher(self, node_id: str) -> None:
        watcher = self._watchers.pop(node_id, None)
        if watcher is not None and watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
            watcher.wait()

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        self._reclaim()
        nodes: list[str] = super().non_terminated_nodes(tag_filters)  # type: ignore[no-untyped-call]
        return nodes

    def terminate_node(self, node_id: str) -> None:
        with self.lock:
            node_type = self._nodes.get(node_id, {}).get("tags", {}).get(TAG_RAY_USER_NODE_TYPE)
        self._stop_watcher(node_id)
        super().terminate_node(node_id)  # type: ignore[no-untyped-call]
        self._event(event="terminated", id=node_id, type=node_type)


def _kill_machine(node: Any) -> None:
    """Everything the node runs, gone at once as with the machine: its Ray processes and every process they
    started (the workers its raylet spawned). Ray's ``kill_all_processes`` ends the first only, and a worker
    outlives its raylet by a moment: long enough, with a held job released just then, to train on to the end
    on a node the test has taken away."""
    machine: list[psutil.Process] = []
    for infos in node.all_processes.values():
        for info in infos:
            try:
                root = psutil.Process(info.process.pid)
                machine += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
    for proc in machine:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    node.kill_all_processes(check_alive=False, allow_graceful=False)
