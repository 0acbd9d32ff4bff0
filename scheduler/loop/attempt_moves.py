"""Moving a live attempt: what the loop (scheduler.loop.scheduling) does with each attempt it finds running.

A live attempt that a chooser with ``reconsider`` (scheduler.loop.attempt_placement.SpotChooser) wants elsewhere is
changed over (scheduler.loop.changeover: decision recorded, checkpointed and stopped, or stopped without a checkpoint
after ``changeover_timeout_s``; requeued, started where the chooser said). A changeover the chooser makes before it
breaks (``MarketChoice.boot``, with an executor that ``BootsAhead``) first boots the target's nodes beside the
running attempt and changes over only once they are up; nodes that do not come up within ``boot_timeout_s``
(no capacity there) are given back and the attempt stays. An attempt still waiting for nodes whose launches
the cloud refuses (``RunStatus.launch_failure``) says so on its job and, after ``launch_timeout_s``, is changed
over to the job's next planned placement (scheduler.loop.fallback: another zone, then on-demand, in the plan's cost
order). A spot attempt's advancing steps show its zone's capacity to the chooser, steps stalled for ``stall_s``
its loss.

What is decided here is kept in memory (where the next attempt goes, the boots, the stops asked for): after a
restart the chooser decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from errors import GpuplanError
from scheduler.loop import changeover, fallback
from scheduler.loop.attempt_placement import MarketChoice, MarketChooser, ObservesZones
from scheduler.loop.dispatch import run_request
from scheduler.store import logbook
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job
from scheduler.store.states import JobState, Market
from workers.executors.protocol import BootsAhead, BootState, Executor, RunState, RunStatus

log = logging.getLogger("gpuplan.loop")


class AttemptMoves:
    """The changeovers of live attempts, from the chooser's decision to the stop (or the boot's end)."""

    def __init__(self, store: Store, executor: Executor, choose_market: MarketChooser, *, stall_s: float,
                 changeover_timeout_s: float, boot_timeout_s: float, launch_timeout_s: float) -> None:
        self.store = store
        self.executor = executor
        self.choose_market = choose_market
        # job id -> where its next attempt goes: a changeover decided on a running attempt
        self._moves: dict[str, MarketChoice] = {}
        # spot attempt id -> (its step, when it last advanced): advancing steps show the zone's capacity,
        # steps stalled for stall_s its loss
        self._steps: dict[int, tuple[int, datetime]] = {}
        self.stall_s = stall_s
        # a changeover asks the attempt to checkpoint and stop, and waits this long (loop clock) for it to end
        # before stopping it without a checkpoint (scheduler.loop.changeover)
        self.changeover_timeout_s = changeover_timeout_s
        # attempt id -> (when the loop asked it to checkpoint and stop, whether it fell back to a plain stop)
        self._stopping: dict[int, tuple[datetime, bool]] = {}
        # attempt id -> (boot token, where it moves once the boot is up, when the boot began): changeovers made
        # before they break; in memory, like the executor's hold
        self._boots: dict[int, tuple[str, MarketChoice, datetime]] = {}
        self.boot_timeout_s = boot_timeout_s
        # attempt id -> when the loop first saw the cloud refuse the nodes it waits for (scheduler.loop.fallback): after
        # launch_timeout_s of that (loop clock) the job moves to its next planned placement
        self._refused: dict[int, datetime] = {}
        # jobs moved down their placements for refused launches: the chooser does not move them back up (the
        # refused placement would only refuse again, and each move stops an attempt)
        self._descended: set[str] = set()
        self.launch_timeout_s = launch_timeout_s

    def next_placement(self, job_id: str) -> MarketChoice | None:
        """Where the job's next attempt goes when a changeover decided it (taken once); None: the chooser decides."""
        return self._moves.pop(job_id, None)

    def forget(self, attempt_id: int) -> bool:
        """The attempt ended: drop what was kept for it and give back a boot beside it that was not up yet.
        True when a changeover stop fell back to a plain stop (no checkpoint: work was lost)."""
        self._steps.pop(attempt_id, None)
        boot = self._boots.pop(attempt_id, None)
        if boot is not None and isinstance(self.executor, BootsAhead):  # ended before its boot was up
            self.executor.unboot(boot[0])
        self._refused.pop(attempt_id, None)
        return self._stopping.pop(attempt_id, (None, False))[1]

    def watch(self, attempt: Attempt, job: Job, status: RunStatus, now: datetime) -> None:
        """A live attempt: what it shows of its zone's spot capacity, and whether to change it over
        (scheduler.loop.changeover: the decision is recorded on its row before it is stopped)."""
        assert attempt.handle is not None
        self._watch_zone(attempt, status, now)
        if changeover.marked(attempt):  # stopping already (after a restart between mark and stop: asks now)
            self._stop_for_changeover(attempt, now)
            return
        if attempt.id in self._boots:
            self._follow_boot(attempt, job, now)
            return
        if status.launch_failure and status.state is RunState.PENDING:
            self._wait_for_launch(attempt, job, status.launch_failure, now)
            return
        self._refused.pop(attempt.id or 0, None)
        if (not isinstance(self.choose_market, changeover.Reconsiders) or job.state != JobState.RUNNING.value
                or job.id in self._descended):
            return
        target = self.choose_market.reconsider(job, changeover.running(job, attempt, status), now)
        if target is None or target.wait_s is not None:
            return
        if target.boot:  # never broken instead: the slack that affords a boot may not afford a restart
            if isinstance(self.executor, BootsAhead):
                self._start_boot(attempt, job, target, now)
            return
        self._change_over(attempt, job, target, now)

    def _wait_for_launch(self, attempt: Attempt, job: Job, failure: str, now: datetime) -> None:
        """The attempt waits for nodes whose launches fail: say so on the job, and after ``launch_timeout_s``
        move it to its next planned placement that the cluster runs (scheduler.loop.fallback); at the end of
        that list (``spot: always`` out of spot zones) it waits on, with the reason."""
        assert attempt.id is not None
        if attempt.market == Market.SPOT.value and attempt.zone:  # a refused launch: no capacity there now
            self.observe(attempt.zone, False, now)
        since = self._refused.setdefault(attempt.id, now)
        target = fallback.next_placement(job, attempt, self._runnable(job, attempt.number + 1))
        where = f"{attempt.market}" + (f" in {attempt.zone}" if attempt.zone else "")
        if target is None:
            message = f"attempt {attempt.number} waits for {where}: {failure}; no other planned placement to move to"
        elif (now - since).total_seconds() >= self.launch_timeout_s:
            moved = MarketChoice(target.market, target.usd_per_h, target.zone,
                              why=f"launches on {where} failed for {self.launch_timeout_s:.0f} s: {failure}")
            self._refused.pop(attempt.id, None)
            self._descended.add(job.id)
            self._change_over(attempt, job, moved, now)
            return
        else:
            there = target.market + (f" in {target.zone}" if target.zone else "")
            message = (f"attempt {attempt.number} waits for {where}: {failure}; moves to {there} if no node "
                       f"comes within {self.launch_timeout_s:.0f} s")
        with self.store.write() as session:
            fresh = session.get(Job, job.id)
            if fresh is not None and fresh.message != message[:2000]:
                fresh.message = message[:2000]
                logbook.append(session, job.id, [logbook.note_line(now, message)])

    def _runnable(self, job: Job, number: int) -> Callable[[MarketChoice], bool]:
        """Whether the executor's cluster can ever run the job's next attempt at a placement."""
        def runnable(place: MarketChoice) -> bool:
            try:
                return self.executor.feasibility(run_request(job, number, place.market, place.zone)) is None
            except (GpuplanError, ValueError):
                return False
        return runnable

    def _change_over(self, attempt: Attempt, job: Job, target: MarketChoice, now: datetime) -> None:
        with self.store.write() as session:
            if not changeover.mark(session, attempt.id, target, now):
                return
        self._moves[job.id] = target
        self._stop_for_changeover(attempt, now)

    def _start_boot(self, attempt: Attempt, job: Job, target: MarketChoice, now: datetime) -> None:
        """Boot the target's nodes beside the running attempt (make-before-break); the attempt works on."""
        assert isinstance(self.executor, BootsAhead) and attempt.id is not None
        request = run_request(job, attempt.number + 1, target.market, target.zone, target.mttp_h)
        try:
            token = self.executor.boot(request)
        except GpuplanError as exc:
            log.warning("could not boot %s for job %s: %s", target.market, job.id, exc)
            return
        self._boots[attempt.id] = (token, target, now)
        where = f" in {target.zone}" if target.zone else ""
        with self.store.write() as session:
            logbook.append(session, job.id, [logbook.note_line(
                now, f"attempt {attempt.number} works on while {target.market}{where} boots beside it "
                f"(make-before-break; it moves once the nodes are up){f' ({target.why})' if target.why else ''}")])

    def _follow_boot(self, attempt: Attempt, job: Job, now: datetime) -> None:
        """A boot beside the attempt: up -> change over onto it; gone, or not up within ``boot_timeout_s``
        (no capacity there) -> give it back, note the zone's lack of capacity, and leave the attempt."""
        assert isinstance(self.executor, BootsAhead) and attempt.id is not None
        token, target, since = self._boots[attempt.id]
        try:
            state = self.executor.boot_state(token)
        except GpuplanError as exc:  # not known this tick: still booting, until the timeout says otherwise
            log.warning("could not read boot %s of job %s: %s", token, job.id, exc)
            state = BootState.BOOTING
        waited = (now - since).total_seconds()
        if state is BootState.BOOTING and waited < self.boot_timeout_s:
            return
        del self._boots[attempt.id]
        if state is BootState.READY:
            self._change_over(attempt, job, target, now)
            self.executor.unboot(token)  # after the stop is asked for: the nodes stay up for the next attempt
            return
        self.executor.unboot(token)
        if target.zone:
            self.observe(target.zone, False, now)
        where = f" in {target.zone}" if target.zone else ""
        why = "its nodes were lost" if state is BootState.GONE else f"it was not up within {waited:.0f} s"
        with self.store.write() as session:
            logbook.append(session, job.id, [logbook.note_line(
                now, f"attempt {attempt.number} stays on {attempt.market}: the {target.market} boot{where} was given "
                f"up ({why})")])

    def _stop_for_changeover(self, attempt: Attempt, now: datetime) -> None:
        """Ask a marked attempt to checkpoint and stop; past ``changeover_timeout_s`` without an outcome,
        stop it as a cancel does (scheduler.loop.changeover.fall_back), and say so in the job's log."""
        assert attempt.handle is not None and attempt.id is not None
        asked = self._stopping.get(attempt.id)
        if asked is None:
            checkpoints = changeover.stop(self.executor, attempt.handle)
            self._stopping[attempt.id] = (now, not checkpoints)
            return
        since, fell_back = asked
        if fell_back:
            return
        waited = (now - since).total_seconds()
        if waited < self.changeover_timeout_s:
            return
        changeover.fall_back(self.executor, attempt.handle)
        self._stopping[attempt.id] = (since, True)
        with self.store.write() as session:
            logbook.append(session, attempt.job_id, [logbook.note_line(
                now, f"attempt {attempt.number} did not checkpoint and stop within {waited:.0f} s of the changeover "
                "request: stopped without a checkpoint; the work since its newest checkpoint is lost")])

    def _watch_zone(self, attempt: Attempt, status: RunStatus, now: datetime) -> None:
        """A spot attempt's steps advancing show its zone's capacity; stalled for ``stall_s`` (after a
        first step, so loading never counts), its loss: Ray waits in place for a node after a preemption."""
        if attempt.market != Market.SPOT.value or not attempt.zone or attempt.id is None:
            return
        step, last = status.progress.step, self._steps.get(attempt.id)
        if last is None or step > last[0]:
            if last is not None:
                self.observe(attempt.zone, True, now)
            self._steps[attempt.id] = (step, now)
        elif step > 0 and (now - last[1]).total_seconds() >= self.stall_s:
            self.observe(attempt.zone, False, now)

    def observe(self, zone: str, available: bool, now: datetime) -> None:
        """Spot capacity in ``zone`` was (``available``) or was not there at ``now``: the chooser's zone feed."""
        if isinstance(self.choose_market, ObservesZones):
            self.choose_market.observe(zone, available, now)
