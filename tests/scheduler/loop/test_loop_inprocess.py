"""The loop with the real InProcessExecutor: a tiny model really trains, is preempted, resumes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from planner.spec import JobSpec
from planner.types import Candidate, CostEstimate, Estimate, MemoryEstimate, Plan, Strategy, ThroughputEstimate
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, TeamCreate
from tests.scheduler.conftest import OFFER
from tests.workers.tiny import Gate


def cpu_plan(spec: JobSpec) -> Plan:
    """Plan the job onto this machine's CPU (what the in-process executor can run)."""
    strategy = Strategy(gpu="cpu", gpu_count=1, precision="fp32", micro_batch=2)
    estimate = Estimate(strategy=strategy, memory=MemoryEstimate(peak_allocated_bytes=1, peak_reserved_bytes=1,
                                                                 total_bytes=1, usable_bytes=2, fits=True,
                                                                 breakdown={}),
                        throughput=ThroughputEstimate(tokens_per_s=100.0), hours=0.01)
    cand = Candidate(estimate=estimate, offer=OFFER, cost=CostEstimate(market="on-demand", usd_per_h=1.0,
                                                                        hours=0.01, usd=0.01))
    return Plan(job=spec.name, objective="cheapest", chosen=cand, candidates=[cand], rejections=[])


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_real_training_is_preempted_requeued_and_resumes_from_its_checkpoint(store: Store, tmp_path: Path) -> None:
    from workers.executors.inprocess import InProcessExecutor

    svc = SchedulerService(store, cpu_plan, checkpoint_root=str(tmp_path / "ckpt"))
    svc.create_team(ADMIN, TeamCreate(name="ml"))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    spec = {"name": "tiny", "task": "train", "model": "tiny-llama",
            "train": {"tokens": 64 * 2 * 8, "seq_len": 64, "micro_batch": 2, "checkpoint_interval_steps": 2}}
    job = svc.submit(me, JobCreate(spec=spec))
    gate = Gate(str(tmp_path / "gate"))
    ex = InProcessExecutor(log_every_s=0.1, step_hook=gate)
    loop = Scheduler(store, ex, poll_s=0.1)
    gate.hold(3)  # preempt mid-run, after a checkpoint
    assert loop.tick().dispatched == [job.id]
    first = ex.active()[0]
    gate.wait_held(3)
    ex.preempt(first)
    gate.release()
    deadline = time.monotonic() + 240
    while svc.status(me, job.id).state not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, svc.logs(me, job.id).lines[-5:]
        loop.tick()
        time.sleep(0.1)
    detail = svc.status(me, job.id)
    assert detail.state == "succeeded", detail.message
    assert [a.outcome for a in detail.attempt_list] == ["preempted", "succeeded"]
    second = detail.attempt_list[1].handle
    assert detail.attempt_list[0].handle == first and second is not None and second != first
    resumed = ex.status(second).progress.resumed_from_step
    assert resumed == 4  # the just-in-time checkpoint of the step after the notice
    assert any("attempt 2" in line for line in svc.logs(me, job.id).lines)
    # both attempts keep what they measured (the preempted one up to its checkpoint) next to the plan's prediction
    for attempt in detail.attempt_list:
        assert attempt.metrics is not None
        assert attempt.metrics["predicted"]["tokens_per_s"] == 100.0
        assert attempt.metrics["measured"]["steps"] > 0 and attempt.metrics["measured"]["micro_batch"] == 2
        assert attempt.metrics["oom_backoffs"] == []
    assert detail.attempt_list[1].metrics is not None
    assert detail.attempt_list[1].metrics["measured"]["checkpoint_save_s"] > 0
