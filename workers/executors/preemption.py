"""Per-node spot-notice watcher: metadata service -> Ray drain-node (reason preemption, with deadline).

Nothing in Ray reads the cloud's interruption notice. This watcher polls it (workers.executors.imds) and, on
a notice, asks the GCS to drain the node with ``DRAIN_NODE_REASON_PREEMPTION`` and the notice's
deadline. AWS's rebalance recommendation, an earlier warning without a deadline, drains it with a
far provisional one (the ranks checkpoint at once and train on); the interruption notice, if one
follows, drains it again with the real deadline (Ray Train takes the earliest). Ray Train then sees
the draining node, every rank gets ``ray.train.get_preemption_info()`` and saves a just-in-time
checkpoint before the node goes away.

Run it on each node either as a lightweight actor pinned to the node (``start_watcher_actor``) or
as a process (``python -m workers.executors.preemption --gcs-address HOST:PORT --node-id HEX``).
A metadata service that does not answer is logged once and polled again; the watcher never dies of it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from errors import ExecutionError, GpuplanError, InvalidInput
from workers.executors.imds import (
    DEFAULT_METADATA_URL,
    Clock,
    MetadataUnavailable,
    NoticeSource,
    SpotNotice,
    make_source,
)

logger = logging.getLogger(__name__)

DrainFn = Callable[[SpotNotice], None]
_NODE_ID_RE = re.compile(r"^[0-9a-f]{56}$")


def drain_ray_node(
    gcs_address: str,
    node_id: str,
    deadline_s: float,
    *,
    reason_message: str = "spot preemption notice",
    timeout_s: float = 10.0,
) -> None:
    """Ask the GCS at ``gcs_address`` to drain ``node_id`` (hex) for preemption.

    ``deadline_s`` is the unix time (seconds) at which the node will be terminated. Raises
    ExecutionError if the GCS refuses (e.g. the node is unknown or already dead).
    """
    if not _NODE_ID_RE.match(node_id):
        # A non-hex id decodes to the nil node, which the GCS accepts and silently ignores.
        raise InvalidInput(
            f"Ray node id must be 56 hex characters, got {node_id!r}",
            hint="use ray.get_runtime_context().get_node_id() or the NodeID column of `ray list nodes`",
        )
    # Ray's stubs do not declare these (Cython / generated protobuf): go through Any.
    raylet: Any = importlib.import_module("ray._raylet")
    autoscaler_pb2: Any = importlib.import_module("ray.core.generated.autoscaler_pb2")

    # 0 means "no deadline" to Ray; a notice whose time has already passed still has one.
    deadline_ms = max(int(deadline_s * 1000), 1)
    client = raylet.GcsClient(address=gcs_address)
    accepted, rejection = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
        reason_message,
        deadline_ms,
        timeout=timeout_s,
    )
    if not accepted:
        raise ExecutionError(f"Ray refused to drain node {node_id}: {rejection}")
    logger.warning("drained Ray node %s for preemption (deadline %.0f)", node_id, deadline_s)


class SpotWatcher:
    """Polls a notice source; on a notice calls ``on_notice`` (the drain) until it succeeds once."""

    def __init__(
        self,
        source: NoticeSource,
        on_notice: DrainFn,
        *,
        poll_interval_s: float = 2.0,
        clock: Clock = time.time,
    ) -> None:
        if poll_interval_s <= 0:
            raise InvalidInput(f"poll interval must be positive, got {poll_interval_s}")
        self.source = source
        self.on_notice = on_notice
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._stop = threading.Event()
        self.polls = 0
        self.notice: SpotNotice | None = None
        self.drained = False
        self.last_error: str | None = None

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> SpotNotice | None:
        self.polls += 1
        try:
            notice = self.source.check()
        except MetadataUnavailable as exc:
            if self.last_error is None:  # once per outage, not once per poll
                logger.warning(
                    "%s metadata service unavailable (%s); polling again every %.1f s",
                    self.source.provider,
                    exc,
                    self.poll_interval_s,
                )
            self.last_error = str(exc)
            return None
        if self.last_error is not None:
            logger.info("%s metadata service reachable again", self.source.provider)
            self.last_error = None
        return notice

    def run(self, *, max_polls: int | None = None) -> SpotNotice | None:
        """Poll until an interruption notice has been acted on (returns it), ``stop()``, or ``max_polls``
        rounds. An early notice (AWS's rebalance recommendation) is acted on too (the ranks checkpoint
        now and train on), and polling goes on for the interruption notice, which brings the deadline."""
        rounds = 0
        drain_failed = False
        pending = False  # a notice not yet acted on
        while not self._stop.is_set() and (max_polls is None or rounds < max_polls):
            rounds += 1
            if self.notice is None or self.notice.early:
                polled = self.poll_once()
                if polled is not None and (self.notice is None or not polled.early):
                    self.notice, pending = polled, True
                    left = polled.deadline - self._clock()
                    logger.warning("%s %s: %s in %.0f s", polled.provider, "early notice" if polled.early else
                                   "spot notice", polled.action, left)
            if pending and self.notice is not None:
                try:
                    self.on_notice(self.notice)
                except Exception as exc:  # the drain is retried every poll until the node is gone
                    if not drain_failed:
                        logger.warning("draining after spot notice failed (%s); retrying", exc)
                    drain_failed = True
                else:
                    self.drained, pending, drain_failed = True, False, False
                    if not self.notice.early:
                        return self.notice
            self._stop.wait(self.poll_interval_s)
        return None


def _reason(notice: SpotNotice) -> str:
    return "rebalance recommendation (early notice)" if notice.early else "spot preemption notice"


class _WatcherActor:
    """Runs a SpotWatcher in a thread of a zero-CPU actor pinned to the node it watches."""

    def __init__(self, provider: str, metadata_url: str, poll_interval_s: float) -> None:
        import ray

        ctx = ray.get_runtime_context()
        self.node_id: str = ctx.get_node_id()
        gcs_address: str = ctx.gcs_address
        node_id = self.node_id
        self.watcher = SpotWatcher(
            make_source(provider, metadata_url),
            lambda notice: drain_ray_node(gcs_address, node_id, notice.deadline, reason_message=_reason(notice)),
            poll_interval_s=poll_interval_s,
        )
        self.thread = threading.Thread(target=self.watcher.run, name="spot-watcher", daemon=True)
        self.thread.start()

    def status(self) -> dict[str, object]:
        notice = self.watcher.notice
        return {
            "node_id": self.node_id,
            "polls": self.watcher.polls,
            "last_error": self.watcher.last_error,
            "notice": None if notice is None else {"action": notice.action, "deadline": notice.deadline},
            "drained": self.watcher.drained,
            "running": self.thread.is_alive(),
        }

    def stop(self) -> None:
        self.watcher.stop()
        self.thread.join(timeout=5)


def start_watcher_actor(
    node_id: str,
    *,
    provider: str = "aws",
    metadata_url: str = DEFAULT_METADATA_URL,
    poll_interval_s: float = 2.0,
    detached: bool = False,
) -> Any:
    """Start (or find) the watcher actor on ``node_id``; returns its handle (``status()``, ``stop()``).

    Needs ``ray.init()`` first. The actor takes no CPU, so it never competes with training, and is
    named per node so calling this twice does not start two watchers.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray: Any = importlib.import_module("ray")
    if not _NODE_ID_RE.match(node_id):
        raise InvalidInput(f"Ray node id must be 56 hex characters, got {node_id!r}")
    make_source(provider, metadata_url)  # validate the provider here, not inside the actor
    actor_cls = ray.remote(num_cpus=0, max_concurrency=2)(_WatcherActor)
    options: dict[str, Any] = {
        "name": f"gpuplan-spot-watcher-{node_id[:16]}",
        "get_if_exists": True,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
    }
    if detached:
        options["lifetime"] = "detached"
    return actor_cls.options(**options).remote(provider, metadata_url, poll_interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.executors.preemption",
        description="Watch this node's spot/preemption notice and drain the Ray node when it comes.",
        epilog="example: python -m workers.executors.preemption --gcs-address 10.0.0.5:6379 --node-id $(ray-node-id)"
        " --provider aws",
    )
    parser.add_argument("--gcs-address", required=True, help="Ray GCS address, HOST:PORT")
    parser.add_argument("--node-id", required=True, help="hex id of the Ray node on this machine")
    parser.add_argument("--provider", choices=["aws", "gcp"], default="aws")
    parser.add_argument("--metadata-url", default=DEFAULT_METADATA_URL)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    parser.add_argument("--max-polls", type=int, default=None, help="give up after this many polls")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if not _NODE_ID_RE.match(args.node_id):
            raise InvalidInput(f"--node-id must be 56 hex characters, got {args.node_id!r}")
        watcher = SpotWatcher(
            make_source(args.provider, args.metadata_url),
            lambda notice: drain_ray_node(args.gcs_address, args.node_id, notice.deadline,
                                          reason_message=_reason(notice)),
            poll_interval_s=args.interval,
        )
        notice = watcher.run(max_polls=args.max_polls)
    except GpuplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    if notice is None:
        print("no spot notice before --max-polls ran out", file=sys.stderr)
        return 1
    print(f"drained node {args.node_id}: {notice.action} at {notice.deadline:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
