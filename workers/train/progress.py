"""Turns the training loop's progress events into a RunProgress, metrics and log lines.

Both executors feed the same tracker (in a thread, or inside a small Ray actor), so a status
means the same thing whichever one ran the job.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from workers.executors.protocol import RunProgress
from workers.train.hooks import ProgressEvent

_MAX_LOG_LINES = 20_000


class ProgressTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress = RunProgress()
        self._logs: list[str] = []
        self._dropped = 0
        self._starts = 0
        self._resumes = 0
        self._result: dict[str, Any] | None = None
        self._first_step_after_start: dict[int, float] = {}
        self._started_at: list[float] = []
        self._node_id: str | None = None
        self._booting_at: list[float] = []

    def event(self, event: ProgressEvent) -> None:
        with self._lock:
            p = self._progress
            if event["event"] == "booting":
                self._booting_at.append(time.time())
            elif event["event"] == "started":
                self._starts += 1
                self._started_at.append(time.time())
                p.total_steps, p.step, p.tokens = event["total_steps"], event["step"], event["tokens"]
                self._node_id = event.get("node_id") or self._node_id
                resumed = event["resumed_from_step"]
                if resumed is not None:
                    self._resumes += 1
                    p.resumed_from_step = int(resumed)
                    p.checkpoint_step = _newest(p.checkpoint_step, int(resumed))
            elif event["event"] == "step":
                p.step, p.total_steps, p.tokens = event["step"], event["total_steps"], event["tokens"]
                p.loss = event["loss"]
                p.tokens_per_s = event["tokens_per_s"] or p.tokens_per_s
                self._first_step_after_start.setdefault(self._starts, time.time())
            elif event["event"] == "checkpoint":
                p.checkpoints += 1
                p.checkpoint_step = _newest(p.checkpoint_step, int(event["step"]))
            elif event["event"] in ("finished", "failed"):  # a failed run reports what it measured up to the failure
                result = self._result = dict(event["result"])
                p.step = int(result.get("steps", p.step))
                p.tokens = int(result.get("tokens", p.tokens))
                if result.get("final_loss") is not None:
                    p.loss = float(result["final_loss"])
                if result.get("steady_tokens_per_s") is not None:
                    p.tokens_per_s = float(result["steady_tokens_per_s"])
                if result.get("checkpoint_step") is not None:  # durable: the loop waits for its writes first
                    p.checkpoint_step = _newest(p.checkpoint_step, int(result["checkpoint_step"]))

    def log(self, line: str) -> None:
        with self._lock:
            self._logs.append(line)
            if len(self._logs) > _MAX_LOG_LINES:  # keep memory bounded on very long runs
                cut = len(self._logs) - _MAX_LOG_LINES
                del self._logs[:cut]
                self._dropped += cut

    def logs(self, since: int = 0) -> list[str]:
        with self._lock:
            start = max(0, since - self._dropped)
            return list(self._logs[start:])

    def progress(self) -> RunProgress:
        with self._lock:
            p = self._progress
            return RunProgress(step=p.step, total_steps=p.total_steps, tokens=p.tokens, loss=p.loss,
                               tokens_per_s=p.tokens_per_s, checkpoints=p.checkpoints,
                               resumed_from_step=p.resumed_from_step, checkpoint_step=p.checkpoint_step)

    @property
    def resumes(self) -> int:
        """Times the loop started from a checkpoint in this attempt (Ray Train restarts included)."""
        with self._lock:
            return self._resumes

    @property
    def restarts(self) -> int:
        """Times the loop started again inside this attempt (each Ray Train recovery adds one)."""
        with self._lock:
            return max(0, self._starts - 1)

    def result(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._result is None else dict(self._result)

    def snapshot(self) -> dict[str, Any]:
        """Everything in one picklable value (what the Ray progress actor returns)."""
        with self._lock:
            node_id, started_at, booting_at = self._node_id, list(self._started_at), list(self._booting_at)
            first_steps = dict(self._first_step_after_start)
        return {"progress": self.progress(), "resumes": self.resumes, "restarts": self.restarts,
                "result": self.result(), "node_id": node_id, "started_at": started_at, "booting_at": booting_at,
                "first_step_at": [first_steps.get(i + 1) for i in range(len(started_at))]}


def _newest(known: int | None, step: int) -> int:
    return step if known is None else max(known, step)


def result_metrics(result: dict[str, Any] | None, resumes: int) -> dict[str, float]:
    """Measured vs predicted numbers of a finished run, as RunStatus.metrics (floats only)."""
    metrics: dict[str, float] = {"resumes": float(resumes)}
    if result is None:
        return metrics
    measured = {
        "steps": result.get("steps"),
        "total_steps": result.get("total_steps"),
        "tokens": result.get("tokens"),
        "final_loss": result.get("final_loss"),
        "checkpoints_written": result.get("checkpoints_written"),
        "measured_tokens_per_s": result.get("steady_tokens_per_s"),
        "measured_prefill_s": result.get("prefill_s"),
        "measured_decode_step_s": result.get("decode_step_s"),
        "measured_wall_tokens_per_s": result.get("tokens_per_s"),
        "measured_peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "measured_peak_reserved_bytes": result.get("peak_reserved_bytes"),
        "measured_peak_rss_bytes": result.get("peak_rss_bytes"),
        "checkpoint_save_s": result.get("checkpoint_save_s"),
        "checkpoint_interval_steps": result.get("checkpoint_interval_steps"),
        "checkpoint_interval_s": result.get("checkpoint_interval_s"),
        "checkpoint_stall_s": result.get("checkpoint_stall_s"),
        "checkpoint_durable_s": result.get("checkpoint_durable_s"),
        "wall_s": result.get("wall_s"),
        "world_size": result.get("world_size"),
        "micro_batch": result.get("micro_batch"),
        "grad_accum": result.get("grad_accum"),
        "oom_backoffs": len(result.get("oom_backoffs") or []),
        # the network NCCL chose (workers.cluster.nccl_net) as numbers: its link speed, and whether it was TCP sockets
        "nccl_link_gbps": result.get("nccl_link_gbps"),
        "nccl_on_sockets": (result.get("nccl_network") == "socket") if result.get("nccl_network") else None,
    }
    for key, value in measured.items():
        if isinstance(value, int | float):
            metrics[key] = float(value)
    for key, value in (result.get("predicted") or {}).items():
        if isinstance(value, int | float):
            metrics[f"predicted_{key}"] = float(value)
    return metrics


def result_backoffs(result: dict[str, Any] | None) -> list[dict[str, int]]:
    """The OOM back-offs a run recorded: step, from/to micro_batch and grad_accum, in order."""
    backoffs = (result or {}).get("oom_backoffs") or []
    return [{k: int(v) for k, v in b.items()} for b in backoffs if isinstance(b, dict)]
