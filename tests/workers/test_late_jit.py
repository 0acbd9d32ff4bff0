"""A spot notice with time to spare: the loop trains on and takes its just-in-time checkpoint only when the time
left reaches planner.cost.just_in_time_reserve_s (real CPU training; the notice's clock is the hooks')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import workers.train.loop
from planner.cost import JIT_MARGIN_S, just_in_time_reserve_s
from tests.workers.ranks import gloo, run_ranks
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config
from workers.train.hooks import Signal, TrainHooks
from workers.train.loop import TrainJob, run_training


class NoticeWithTimeLeft(TrainHooks):
    """A notice from step ``at`` on, with ``left_s[step]`` seconds left to the node's deadline at each poll (the
    time left shrinking as a clock would, without waiting for it)."""

    def __init__(self, at: int, left_s: dict[int, float]) -> None:
        self.at, self.left_s, self.step, self.lines = at, left_s, 0, []
        self.deadlines: list[float] = []

    def fault(self, step: int, where: str) -> None:
        if where == "backward":
            self.step = step + 1

    def poll(self) -> Signal | None:
        import time

        if self.step < self.at:
            return None
        left = self.left_s.get(self.step, min(self.left_s.values()))
        return Signal("preempt", deadline=time.time() + left)

    def on_log(self, line: str) -> None:
        self.lines.append(line)


def _job(tmp_path: Path) -> TrainJob:
    spec = tiny_spec(write_config(tmp_path / "m"), steps=10, interval=10)  # no periodic checkpoint before the end
    return TrainJob(job_id="jit", spec=spec, strategy=cpu_strategy(), checkpoint_uri=str(tmp_path / "ck"),
                    device="cpu", cpu_threads=1, predicted={})


@pytest.fixture
def teardowns(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The node never goes (the drain was cancelled), without the loop idling 30 s for it."""
    seen: list[float] = []
    monkeypatch.setattr(workers.train.loop, "wait_for_teardown", seen.append)
    return seen


def test_the_loop_trains_through_a_long_notice_and_checkpoints_when_the_reserve_is_reached(
        tmp_path: Path, teardowns: list[float]) -> None:
    hooks = NoticeWithTimeLeft(at=3, left_s={3: 120.0, 4: 90.0, 5: 60.0, 6: JIT_MARGIN_S - 1})
    result = run_training(_job(tmp_path), hooks)
    assert result.status == "succeeded" and result.steps == 10
    assert any(line.startswith("step 3: spot notice") and "training on, the just-in-time checkpoint" in line
               for line in hooks.lines), hooks.lines
    saved = [line for line in hooks.lines if "just-in-time checkpoint saved" in line]
    assert [line.split(":")[0] for line in saved] == ["step 6"]  # once, when the time left fell below the reserve
    assert any(line.startswith("step 6: checkpoint saved to") for line in hooks.lines)
    assert not any(line.startswith(("step 3: checkpoint", "step 4: checkpoint", "step 5: checkpoint"))
                   for line in hooks.lines)
    assert len(teardowns) == 1


def test_an_early_notice_checkpoints_now_and_trains_on(tmp_path: Path, teardowns: list[float]) -> None:
    """AWS's rebalance recommendation (the watcher drains with a provisional deadline hours away): a checkpoint
    at once, in the background, then training on; no just-in-time checkpoint, no idling."""
    hooks = NoticeWithTimeLeft(at=3, left_s={3: 6 * 3600.0})
    result = run_training(_job(tmp_path), hooks)
    assert result.status == "succeeded" and result.steps == 10
    assert [line.split(":")[0] for line in hooks.lines if "early notice; checkpoint now" in line] == ["step 3"]
    assert any(line.startswith("step 3: checkpoint saved to") for line in hooks.lines), hooks.lines
    assert not any("just-in-time checkpoint saved" in line for line in hooks.lines) and teardowns == []


def test_a_notice_shorter_than_the_reserve_checkpoints_at_once(tmp_path: Path, teardowns: list[float]) -> None:
    hooks = NoticeWithTimeLeft(at=3, left_s={3: JIT_MARGIN_S / 2})
    run_training(_job(tmp_path), hooks)
    assert [line.split(":")[0] for line in hooks.lines if "just-in-time checkpoint saved" in line] == ["step 3"]
    assert not any("training on" in line for line in hooks.lines)


def _skewed_rank(rank: int, port: int, results: Any, folder: str) -> None:
    """A rank whose clock says the deadline is 60 s away at step 5 (rank 0) or 1 s (rank 1)."""
    workers.train.loop.wait_for_teardown = lambda deadline: None  # this rank's process: the node never goes
    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=10, interval=10, world=2)
        hooks = NoticeWithTimeLeft(at=3, left_s={3: 120.0, 4: 90.0, 5: 60.0 if rank == 0 else 1.0, 6: 1.0})
        out = run_training(TrainJob(job_id="skew", spec=spec, strategy=cpu_strategy(workers=2, sharding="fsdp"),
                                    checkpoint_uri=str(root / "ck"), device="cpu", cpu_threads=1), hooks)
        saved = [line.split(":")[0] for line in hooks.lines if "just-in-time checkpoint saved" in line]
        results.put((rank, out.status, out.steps, saved))


@pytest.mark.slow
def test_ranks_whose_clocks_disagree_checkpoint_at_the_same_step(tmp_path: Path) -> None:
    """FSDP's checkpoint is a collective: rank 1 finds the reserve reached at step 5, rank 0 only at step 6; they
    agree on step 5 (an all-reduce of the verdict), where rank 0 alone would have waited and the save hung."""
    write_config(tmp_path / "m")
    out = sorted(run_ranks(_skewed_rank, str(tmp_path), results=2))
    assert out == [(0, "succeeded", 10, ["step 5"]), (1, "succeeded", 10, [])]  # only rank 0 logs


@pytest.mark.parametrize(("stall", "durable", "step", "want"), [
    (0.3, 3.1, 1.0, 2 * 3.4 + 2 * 1.0 + JIT_MARGIN_S),  # the H200 host's measured checkpoint, a 1 s step
    (0.0, 0.0, 0.0, JIT_MARGIN_S),
    (-1.0, 2.0, -3.0, 4.0 + JIT_MARGIN_S),  # nonsense negatives count as zero
])
def test_the_reserve(stall: float, durable: float, step: float, want: Any) -> None:
    assert just_in_time_reserve_s(stall, durable, step) == pytest.approx(want)
