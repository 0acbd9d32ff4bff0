"""Hypothesis state machine over service + loop: random submits, cancels, executor outcomes and
clock moves on a real SQLite file; after every step the bookkeeping invariants must hold."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlmodel import select

from errors import Conflict, LimitExceeded
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Event, Job, JobCreate, Spend, TeamCreate
from scheduler.store.states import JobState, allowed
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState

BUDGET, QUOTA = 20.0, 6


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.store = Store(f"sqlite:///{Path(self.dir.name) / 'db.sqlite'}")
        self.store.migrate()
        self.clock = FakeClock()
        ids = itertools.count(1)
        # ids from a counter: replaying a failing example must take the same path (jobs submitted at one fake
        # instant start in id order; random ids made a failure vanish on replay, a Hypothesis FlakyFailure)
        self.svc = SchedulerService(self.store, toy_plan, clock=self.clock, checkpoint_root=self.dir.name,
                                    job_ids=lambda: f"j-{next(ids):016x}")
        self.svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=BUDGET, gpu_quota=QUOTA))
        self.me = self.svc.authenticate(self.svc.create_token(ADMIN, "ml").token)
        self.ex = ScriptedExecutor()
        self.loop = Scheduler(self.store, self.ex, clock=self.clock, backoff_base_s=1)
        self.jobs: list[str] = []
        self.accepted_cost = 0.0
        self.seen_logs: dict[str, list[str]] = {}  # what a `gpuplan logs --follow` has printed so far

    def teardown(self) -> None:
        self.store.dispose()
        self.dir.cleanup()

    @rule(dollars=st.integers(1, 12), gpus=st.integers(1, QUOTA + 2), key=st.sampled_from([None, "a", "b"]))
    def submit(self, dollars: int, gpus: int, key: str | None) -> None:
        try:
            job = self.svc.submit(self.me, JobCreate(spec=spec_dict(tokens=dollars * 1e6, gpus=gpus),
                                                     idempotency_key=key))
        except (LimitExceeded, Conflict):
            return
        if job.id not in self.jobs:
            self.jobs.append(job.id)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.jobs))
        try:
            self.svc.cancel(self.me, job_id)
        except Conflict:
            assert JobState(self.svc.status(self.me, job_id).state).terminal

    @rule(outcome=st.sampled_from([RunState.SUCCEEDED, RunState.FAILED, RunState.PREEMPTED, None]),
          minutes=st.integers(0, 30))
    def tick(self, outcome: RunState | None, minutes: int) -> None:
        running = self.ex.running()
        if running and outcome is not None:
            self.ex.finish(running[0], outcome)
        self.clock.advance(minutes=minutes)
        self.loop.tick()
        self.queue_moves()

    def queue_moves(self) -> None:
        """After a tick, a due job left queued is one the quota holds back, and it says so."""
        now = self.clock()
        with self.store.read() as s:
            jobs = s.exec(select(Job)).all()
            running = sum(j.gpus for j in jobs if j.id in {a.job_id for a in s.exec(select(Attempt)).all()
                                                            if a.ended_at is None})
        for job in jobs:
            if job.state == JobState.QUEUED.value and (job.next_run_at is None or job.next_run_at <= now):
                assert job.message.startswith("waiting: "), (job.id, job.message)
                if "behind" not in job.message:
                    assert running + job.gpus > QUOTA, (job.id, job.message, running)

    @rule()
    def restart(self) -> None:
        self.ex = ScriptedExecutor()
        self.loop = Scheduler(self.store, self.ex, clock=self.clock, backoff_base_s=1)
        self.loop.reconcile()

    @invariant()
    def books_balance(self) -> None:
        with self.store.read() as s:
            jobs = {j.id: j for j in s.exec(select(Job)).all()}
            attempts = s.exec(select(Attempt)).all()
            spends = s.exec(select(Spend)).all()
            events = s.exec(select(Event).order_by(Event.id)).all()  # type: ignore[arg-type]
        # GPU quota: it admits jobs to run, so the jobs holding an attempt never hold more than it,
        # and no job larger than it is ever accepted.
        assert sum(jobs[a.job_id].gpus for a in attempts if a.ended_at is None) <= QUOTA
        assert all(j.gpus <= QUOTA for j in jobs.values())
        # Budget: at admission the estimate fit; reserved (estimate not yet spent) + spent never
        # exceeds the budget by more than what attempts ran past their estimates.
        team = self.svc.get_team(self.me)
        overrun = sum(max(0.0, sum(x.usd for x in spends if x.job_id == j) - jobs[j].estimated_usd) for j in jobs)
        assert team.spent_usd + team.reserved_usd <= BUDGET + overrun + 1e-6
        # Never two open attempts of one job; a closed attempt has exactly one spend row.
        open_by_job = [a.job_id for a in attempts if a.ended_at is None]
        assert len(open_by_job) == len(set(open_by_job))
        assert sorted(x.attempt_id for x in spends) == sorted(a.id or 0 for a in attempts if a.ended_at is not None)
        for a in attempts:
            if a.ended_at is None:
                assert jobs[a.job_id].state in (JobState.RUNNING.value, JobState.CANCELLED.value)
        # Every job's history is a legal walk ending in its current state.
        for job_id, job in jobs.items():
            path = [e for e in events if e.job_id == job_id]
            assert path[0].from_state is None and path[0].to_state == "pending"
            for before, after in itertools.pairwise(path):
                assert after.from_state == before.to_state
                assert allowed(JobState(after.from_state), JobState(after.to_state))
            assert path[-1].to_state == job.state

    @invariant()
    def logs_only_grow(self) -> None:
        """A follower that has printed N lines gets exactly the new ones with since=N: lines never
        move, and every state change is in the log in the order it happened."""
        for job_id in self.jobs:
            seen = self.seen_logs.get(job_id, [])
            page = self.svc.logs(self.me, job_id, len(seen))
            full = self.svc.logs(self.me, job_id).lines
            assert full == seen + page.lines and page.next == len(full)
            self.seen_logs[job_id] = full
            with self.store.read() as s:
                events = s.exec(select(Event).where(Event.job_id == job_id).order_by(Event.id)).all()  # type: ignore[arg-type]
            changes = [line.split(": ", 1)[0].split(" ", 1)[1] for line in full if " -> " in line.split(": ", 1)[0]]
            assert changes == [f"{e.from_state or '-'} -> {e.to_state}" for e in events]


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=12, stateful_step_count=14, deadline=None,
                                         suppress_health_check=list(HealthCheck))
pytestmark = pytest.mark.slow
