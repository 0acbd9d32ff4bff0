"""Spot-notice watcher against a real HTTP server on 127.0.0.1 playing AWS IMDSv2 and GCP metadata,
and real drains of nodes of the shared local Ray cluster."""

from __future__ import annotations

import importlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from errors import InvalidInput
from tests.net import QuietHandler
from workers.executors.imds import EARLY_NOTICE_HORIZON_S, AwsImdsSource, GcpMetadataSource, SpotNotice, parse_aws_time
from workers.executors.preemption import SpotWatcher, drain_ray_node, start_watcher_actor

REPO = Path(__file__).resolve().parents[3]
NOTICE = '{"action": "terminate", "time": "2026-11-30T12:00:00Z"}'


def _notice_in(seconds: int) -> tuple[str, float]:
    when = int(time.time()) + seconds
    text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    return f'{{"action": "terminate", "time": "{text}"}}', float(when)


@dataclass
class FakeMetadata:
    """State of the fake metadata service; tests flip it while the watcher polls."""

    aws_notice: str | None = None
    rebalance: str | None = None  # the rebalance recommendation's body once AWS issued one
    notice_after_polls: int | None = None  # serve aws_notice only once this many polls were answered
    gcp_preempted: bool = False
    gcp_answer: str | None = None  # overrides TRUE/FALSE
    tokens: set[str] = field(default_factory=set)
    token_requests: list[str] = field(default_factory=list)  # the TTL header of each PUT
    aws_polls: int = 0
    gcp_polls: int = 0
    unauthorized: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(fake: FakeMetadata) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_PUT(self) -> None:
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if self.path != "/latest/api/token":
                return self._send(404)
            if ttl is None or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self._send(400, "missing or invalid X-aws-ec2-metadata-token-ttl-seconds")
            token = uuid.uuid4().hex
            with fake.lock:
                fake.tokens.add(token)
                fake.token_requests.append(ttl)
            self._send(200, token)

        def do_GET(self) -> None:
            if self.path == "/latest/meta-data/spot/instance-action":
                with fake.lock:
                    if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                        fake.unauthorized += 1
                        return self._send(401)
                    fake.aws_polls += 1
                    ready = fake.notice_after_polls is None or fake.aws_polls > fake.notice_after_polls
                    notice = fake.aws_notice if ready else None
                return self._send(404, "Not Found") if notice is None else self._send(200, notice)
            if self.path == "/latest/meta-data/events/recommendations/rebalance":
                if self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens:
                    return self._send(401)
                return self._send(404, "Not Found") if fake.rebalance is None else self._send(200, fake.rebalance)
            if self.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                with fake.lock:
                    fake.gcp_polls += 1
                answer = fake.gcp_answer or ("TRUE" if fake.gcp_preempted else "FALSE")
                return self._send(200, answer)
            return self._send(404)

    return Handler


def _serve(fake: FakeMetadata, port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(fake))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def metadata() -> Iterator[tuple[FakeMetadata, str]]:
    fake = FakeMetadata()
    server = _serve(fake)
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_aws_notice_after_404s_drains_once(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    fake.aws_notice, fake.notice_after_polls = NOTICE, 3
    drained: list[SpotNotice] = []
    watcher = SpotWatcher(AwsImdsSource(url), drained.append, poll_interval_s=0.01)
    notice = watcher.run(max_polls=50)
    assert notice is not None and drained == [notice]
    assert notice.provider == "aws" and notice.action == "terminate"
    assert notice.deadline == parse_aws_time("2026-11-30T12:00:00Z") == 1796040000.0
    assert fake.aws_polls == 4 and watcher.polls == 4, "three 404s, then the notice"
    assert fake.token_requests == ["21600"], "one IMDSv2 token, reused"
    assert fake.unauthorized == 0
    assert watcher.drained


def test_a_rebalance_recommendation_is_an_early_notice_and_the_interruption_drains_again(
        metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    fake.rebalance = '{"noticeTime": "2026-11-30T11:50:00Z"}'
    drained: list[SpotNotice] = []
    watcher = SpotWatcher(AwsImdsSource(url), drained.append, poll_interval_s=0.01)
    assert watcher.run(max_polls=5) is None, "an early notice does not end the watch"
    assert [(n.action, n.early) for n in drained] == [("rebalance", True)]
    assert drained[0].deadline == parse_aws_time("2026-11-30T11:50:00Z") + EARLY_NOTICE_HORIZON_S
    fake.aws_notice = NOTICE  # the interruption follows: the real deadline, drained again
    notice = watcher.run(max_polls=50)
    assert notice is not None and not notice.early and drained == [drained[0], notice]
    assert notice.deadline == parse_aws_time("2026-11-30T12:00:00Z")


def test_aws_token_is_refreshed_when_rejected(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    source = AwsImdsSource(url)
    assert source.check() is None
    fake.tokens.clear()  # IMDS restarted / token revoked
    fake.aws_notice = NOTICE
    notice = source.check()
    assert notice is not None and notice.action == "terminate"
    assert len(fake.token_requests) == 2 and fake.unauthorized == 1


def test_aws_token_is_refreshed_when_expired(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    now = [1000.0]
    source = AwsImdsSource(url, clock=lambda: now[0])
    assert source.check() is None and source.check() is None
    now[0] += 21600  # past the token's TTL
    assert source.check() is None
    assert len(fake.token_requests) == 2 and fake.unauthorized == 0


def test_unreadable_aws_notice_still_drains_with_two_minutes(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    fake.aws_notice = "<html>not json</html>"
    notice = AwsImdsSource(url, clock=lambda: 5000.0).check()
    assert notice is not None and notice.deadline == 5120.0


def test_gcp_preempted_flag(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    drained: list[SpotNotice] = []
    watcher = SpotWatcher(GcpMetadataSource(url, clock=lambda: 1000.0), drained.append, poll_interval_s=0.01)
    assert watcher.run(max_polls=3) is None and drained == []
    assert fake.gcp_polls == 3, "the Metadata-Flavor header was sent (the server refuses requests without it)"
    fake.gcp_preempted = True
    notice = watcher.run(max_polls=3)
    assert notice is not None and drained == [notice]
    assert (notice.provider, notice.action, notice.deadline) == ("gcp", "preempted", 1030.0)


def test_unreachable_metadata_logs_once_and_keeps_polling(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    drained: list[SpotNotice] = []
    watcher = SpotWatcher(AwsImdsSource(f"http://127.0.0.1:{port}"), drained.append, poll_interval_s=0.01)
    with caplog.at_level(logging.INFO, logger="workers.executors.preemption"):
        assert watcher.run(max_polls=5) is None
        assert watcher.polls == 5 and watcher.last_error is not None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()
        # The service comes up (on the same address) with a notice: the same watcher drains.
        fake = FakeMetadata(aws_notice=NOTICE)
        server = _serve(fake, port)
        try:
            notice = watcher.run(max_polls=5)
        finally:
            server.shutdown()
            server.server_close()
    assert notice is not None and drained == [notice]
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_garbage_gcp_answer_is_unavailable_not_a_crash(metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    fake.gcp_answer = "maybe"
    watcher = SpotWatcher(GcpMetadataSource(url), lambda n: None, poll_interval_s=0.01)
    assert watcher.run(max_polls=2) is None
    assert watcher.last_error is not None and "maybe" in watcher.last_error


def test_failed_drain_is_retried(metadata: tuple[FakeMetadata, str], caplog: pytest.LogCaptureFixture) -> None:
    fake, url = metadata
    fake.aws_notice = NOTICE
    calls: list[SpotNotice] = []

    def flaky_drain(notice: SpotNotice) -> None:
        calls.append(notice)
        if len(calls) < 3:
            raise ConnectionError("GCS unreachable")

    watcher = SpotWatcher(AwsImdsSource(url), flaky_drain, poll_interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="workers.executors.preemption"):
        notice = watcher.run(max_polls=10)
    assert notice is not None and len(calls) == 3 and watcher.drained
    assert fake.aws_polls == 1, "the notice is read once; only the drain is retried"
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 1


def test_bad_inputs() -> None:
    with pytest.raises(InvalidInput, match="56 hex"):
        drain_ray_node("127.0.0.1:1", "node-1", time.time())
    with pytest.raises(InvalidInput, match="poll interval"):
        SpotWatcher(AwsImdsSource(), lambda n: None, poll_interval_s=0)
    with pytest.raises(InvalidInput, match="aws or gcp"):
        start_watcher_actor("a" * 56, provider="azure")


def test_cli_rejects_bad_node_id_and_gives_up_after_max_polls(metadata: tuple[FakeMetadata, str]) -> None:
    _, url = metadata
    base = [sys.executable, "-m", "workers.executors.preemption", "--gcs-address", "127.0.0.1:1", "--metadata-url", url]
    bad = subprocess.run([*base, "--node-id", "xyz"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "56 hex" in bad.stderr
    quiet = subprocess.run(
        [*base, "--node-id", "a" * 56, "--interval", "0.01", "--max-polls", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert quiet.returncode == 1 and "no spot notice" in quiet.stderr


# -- real Ray drains -----------------------------------------------------------------------------


def _node_drain_state(node_id: str) -> str:
    """'preempted' (dead, drained for preemption), 'draining', or the node's status name."""
    ray: Any = importlib.import_module("ray")

    common_pb2: Any = importlib.import_module("ray.core.generated.common_pb2")
    for node in ray.nodes():
        if node["NodeID"] == node_id and not node["Alive"]:
            preempted = node.get("DeathReason") == common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
            return "preempted" if preempted else f"dead({node.get('DeathReason')})"
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    raylet: Any = importlib.import_module("ray._raylet")
    autoscaler_pb2: Any = importlib.import_module("ray.core.generated.autoscaler_pb2")
    gcs = raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    for state in get_cluster_resource_state(gcs).node_states:
        if state.node_id.hex() == node_id:
            return "draining" if state.status == autoscaler_pb2.NodeStatus.DRAINING else "alive"
    return "unknown"


def _wait_drained(node_id: str, timeout_s: float = 60) -> str:
    end = time.monotonic() + timeout_s
    state = _node_drain_state(node_id)
    while state not in ("draining", "preempted") and time.monotonic() < end:
        time.sleep(0.2)
        state = _node_drain_state(node_id)
    return state


@pytest.mark.ray
@pytest.mark.slow
def test_cli_watcher_drains_a_real_ray_node(ray_cluster: Any, metadata: tuple[FakeMetadata, str]) -> None:
    fake, url = metadata
    fake.aws_notice, _ = _notice_in(120)
    fake.notice_after_polls = 2
    node = ray_cluster.add_node(num_cpus=1, resources={"spot_cli_node": 1})
    try:
        ray_cluster.wait_for_nodes()
        assert _node_drain_state(node.node_id) == "alive"
        args = ["--gcs-address", ray_cluster.address, "--node-id", node.node_id, "--metadata-url", url]
        done = subprocess.run(
            [sys.executable, "-m", "workers.executors.preemption", *args, "--interval", "0.05", "--max-polls", "400"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
        assert done.returncode == 0, done.stderr
        assert fake.aws_polls == 3
        assert _wait_drained(node.node_id) in ("draining", "preempted")
    finally:
        ray_cluster.remove_node(node)


@pytest.mark.ray
@pytest.mark.slow
def test_watcher_actor_pinned_to_node_drains_it(ray_cluster: Any, metadata: tuple[FakeMetadata, str]) -> None:
    ray: Any = importlib.import_module("ray")

    fake, url = metadata
    node = ray_cluster.add_node(num_cpus=1, resources={"spot_actor_node": 1})
    try:
        ray_cluster.wait_for_nodes()
        actor = start_watcher_actor(node.node_id, metadata_url=url, poll_interval_s=0.05)
        status = ray.get(actor.status.remote(), timeout=60)
        assert status["node_id"] == node.node_id, "the watcher runs on the node it watches"
        assert status["running"] and status["notice"] is None
        end = time.monotonic() + 30
        while fake.aws_polls == 0 and time.monotonic() < end:
            time.sleep(0.05)
        assert fake.aws_polls > 0 and _node_drain_state(node.node_id) == "alive"
        fake.aws_notice, deadline = _notice_in(120)
        # The watcher says it drained only once Ray has the drain: wait on that, then look at the node.
        end = time.monotonic() + 60
        while not (final := ray.get(actor.status.remote(), timeout=30))["drained"]:
            assert time.monotonic() < end, f"the watcher never drained its node: {final}"
            time.sleep(0.05)
        assert final["notice"]["deadline"] == deadline
        # The watcher actor itself keeps the node busy, so it stays up, draining, until the deadline.
        assert _wait_drained(node.node_id) == "draining"
    finally:
        ray_cluster.remove_node(node)
