"""The pieces of tests/e2e/test_autoscaler.py: the node types `gpuplan cluster config` generates for a plan,
made into a local autoscaling cluster (Ray's real autoscaler with ``tests.e2e.autoscale_provider``), a fake
instance-metadata service with one endpoint per node, and a supervisor that restarts the head's server.

The cluster is started with ``ray start --head --block`` on its own port and temp dir (never ``ray stop``,
which would take down every Ray on the machine: the other pytest worker's too) and stopped by ending that
process and the node processes its provider recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from planner.types import Plan
from tests.net import QuietHandler
from workers.cluster.config import AwsFacts, ClusterOptions, cluster_config, cluster_needs, kind_key, node_type_name

ROOT = Path(__file__).resolve().parents[2]
HEAD_TYPE = "ray.head.default"
# The head's CPUs, as a real head has its vCPUs (no GPU job fits there: those ask for a worker type's GPU,
# market and zone). Ray starts at most this many worker processes at once on a node (never fewer than one),
# and every attempt starts six on the head (its driver and Ray Train's controller and helpers): with none,
# they start one after another.
HEAD_CPUS = 2


def generated_node_types(plan: Plan, opts: ClusterOptions) -> dict[str, Any]:
    """The worker node types of ``gpuplan cluster config`` for ``plan`` (names, custom resources, min/max
    workers), with account facts made up for its zones (no AWS is asked)."""
    needs = cluster_needs(plan, opts)
    zones = {kind_key(k): k.zone or "use1-az1" for k in needs.kinds}
    facts = AwsFacts(images={t: "ami-0test" for t in needs.instance_types},
                     subnets={z: f"subnet-{z}" for z in zones.values()}, zones=zones, instance_profile="test")
    config = cluster_config(plan, opts, facts)
    types = {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}
    assert types and all(name == node_type_name(t["node_config"]["InstanceType"], t["labels"]["gpuplan/market"],
                                                t["labels"]["gpuplan/zone"]) for name, t in types.items())
    return {"idle_timeout_minutes": config["idle_timeout_minutes"], "types": types}


def local_node_types(generated: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The generated types as local nodes: the same names, custom resources, GPUs and min/max workers, with
    one CPU standing in for each GPU (a p4d's 96 vCPUs would be 96 worker slots on this box)."""
    out = {}
    for name, t in generated["types"].items():
        resources = {**t["resources"], "CPU": t["resources"]["GPU"]}
        out[name] = {"resources": resources, "labels": dict(t["labels"]), "node_config": {},
                     "min_workers": t["min_workers"], "max_workers": t["max_workers"]}
    return out


# ------------------------------------------------------------------------------------------ metadata


@dataclass
class FakeImds:
    """IMDSv2 per node at ``{url}/{node id}``: 404 until :meth:`notice`, then the spot instance action."""

    notices: dict[str, str] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def notice(self, node_id: str, in_s: float = 120.0) -> None:
        at = datetime.fromtimestamp(time.time() + in_s).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")
        with self.lock:
            self.notices[node_id] = json.dumps({"action": "terminate", "time": at[:-2] + ":" + at[-2:]})

    def polled(self, node_id: str) -> int:
        with self.lock:
            return self.polls.get(node_id, 0)


def _imds_handler(fake: FakeImds) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_PUT(self) -> None:
            _, _, path = self.path.lstrip("/").partition("/")
            self._send(200, uuid.uuid4().hex) if path == "latest/api/token" else self._send(404)

        def do_GET(self) -> None:
            node, _, path = self.path.lstrip("/").partition("/")
            if path != "latest/meta-data/spot/instance-action" or not self.headers.get("X-aws-ec2-metadata-token"):
                return self._send(404)
            with fake.lock:
                fake.polls[node] = fake.polls.get(node, 0) + 1
                notice = fake.notices.get(node)
            self._send(404, "Not Found") if notice is None else self._send(200, notice)

    return Handler


@contextlib.contextmanager
def fake_imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _imds_handler(fake))
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------------ the cluster


@dataclass
class LocalAutoscaler:
    """A running head (``ray start --head --block``) whose autoscaler launches ``types`` locally."""

    address: str
    control: Path
    config_path: Path
    head: subprocess.Popen[bytes]

    def events(self) -> list[dict[str, Any]]:
        path = self.control / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def refuse(self, types: list[str]) -> None:
        _write_json(self.control / "refuse.json", types)

    def reclaim(self, node_ids: list[str]) -> None:
        """The cloud takes these nodes away (applied at the autoscaler's next look at its nodes)."""
        _write_json(self.control / "terminate.json", node_ids)

    def kill_actor(self, name: str, namespace: str) -> None:
        """End a named actor of the cluster as a crash would (no restart), from a driver of its own."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], namespace=sys.argv[2], logging_level='ERROR'); "
                "ray.kill(ray.get_actor(sys.argv[3]), no_restart=True)")
        subprocess.run([sys.executable, "-c", code, self.address, namespace, name], check=True, timeout=300,
                       capture_output=True)

    def live(self) -> dict[str, str]:
        """Node id -> type of the worker nodes the provider runs now (launched, not terminated or reclaimed)."""
        nodes: dict[str, str] = {}
        for event in self.events():
            if event["event"] == "launched":
                nodes[event["id"]] = event["type"]
            elif event["event"] in ("terminated", "reclaimed"):
                nodes.pop(event["id"], None)
        return nodes


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


@contextlib.contextmanager
def local_autoscaler(types: Mapping[str, Any], idle_timeout_minutes: float, workdir: Path, port: int,
                     imds_url: str, env: Mapping[str, str]) -> Iterator[LocalAutoscaler]:
    control = workdir / "control"
    control.mkdir(parents=True)
    from ray._private.services import get_node_ip_address

    # the address Ray's own processes see: one cluster, one address
    gcs = f"{get_node_ip_address()}:{port}"  # type: ignore[no-untyped-call]
    config = {
        "cluster_name": "gpuplan-autoscale-test",
        "max_workers": sum(int(t["max_workers"]) for t in types.values()),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {"type": "external", "module": "tests.e2e.autoscale_provider.CloudLikeProvider",
                     "gcs_address": gcs, "control_dir": str(control), "imds_url": imds_url,
                     # what Ray's own fake_multinode example sets: a local node needs no SSH setup
                     "disable_node_updaters": True, "disable_launch_config_check": True, "use_node_id_as_ip": True},
        "auth": {"ssh_user": "ubuntu"},
        "head_node_type": HEAD_TYPE,
        "available_node_types": {**types, HEAD_TYPE: {"resources": {"CPU": HEAD_CPUS}, "node_config": {},
                                                      "max_workers": 0}},
        # nothing to sync or run on a local node; the autoscaler still reads every key
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False, "rsync_exclude": [],
        "rsync_filter": [], "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }
    config_path = workdir / "autoscaler.json"  # JSON is YAML: the server's --ray-cluster-config reads it too
    config_path.write_text(json.dumps(config))
    # RAY_ADDRESS: the cluster's own processes (Ray Train's placement-group cleaner asks the state API every
    # second) find this cluster without scanning the machine's processes for a Ray, where the other pytest
    # worker's may be the one they find
    # RAY_health_check_*: the GCS finds a node gone (a reclaim kills its processes: nothing says goodbye) after
    # 5 missed checks, one every 3 s, and a run restarted on the replacement node waits for that (10-20 s);
    # here 3 missed checks, one a second (a live node under load still answers within the 2 s timeout)
    run_env = {**env, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_ADDRESS": gcs,
               "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
               "RAY_health_check_failure_threshold": "3",
               "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    # Ray's sockets live under its temp dir and AF_UNIX paths stop at 107 bytes: pytest's own temp folders
    # (/tmp/pytest-of-USER/pytest-N/popen-gwK/autoscaleM/...) leave too little room, so a short one of its own
    ray_dir = Path(tempfile.mkdtemp(prefix="gpr", dir="/tmp"))
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
            f"--num-cpus={HEAD_CPUS}", "--object-store-memory=80000000", "--include-dashboard=false",
            f"--autoscaling-config={config_path}", f"--temp-dir={ray_dir}", "--disable-usage-stats"]
    log = (workdir / "head.log").open("ab")
    head = subprocess.Popen(argv, env=run_env, stdout=log, stderr=log, start_new_session=True)
    cluster = LocalAutoscaler(address=gcs, control=control, config_path=config_path, head=head)
    try:
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(ray_dir, ignore_errors=True)


def _stop(cluster: LocalAutoscaler) -> None:
    """Kill the head's process group (``ray start --block`` and what it started), then the nodes its provider
    started and their watchers: the processes this cluster made, by their ids. Nothing here is worth a
    graceful stop: the test is over."""
    pids = [int(p) for e in cluster.events() if e["event"] == "launched" for p in e.get("pids", [])]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(cluster.head.pid, signal.SIGKILL)
    cluster.head.wait()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------ supervisor


class Supervisor:
    """Restarts a process whenever it dies, as the head's systemd unit does (``Restart=always``; ``held``:
    not before the block ends, as its ``RestartSec``)."""

    def __init__(self, start: Callable[[], subprocess.Popen[bytes]]) -> None:
        self._start = start
        self._stop = threading.Event()
        self._hold = threading.Lock()
        self.proc = start()
        self.restarts = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._hold:
            yield

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._hold:
                if self.proc.poll() is not None and not self._stop.is_set():
                    self.proc = self._start()
                    self.restarts += 1
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
