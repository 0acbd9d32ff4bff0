"""The per-day spend summary (``spend_day``, migration 0008): kept by the ledger in the transaction
that writes each spend row, and read by the spend report, the Spend page and the team figures.

Random spend histories (seeded) over many teams, GPU types and both markets, with closes on and
around UTC midnights, are reported twice: through the summary, and through the ledger-only queries
the reports ran before it (kept here as the reference). With prices and durations on a binary grid
every sum is exact, so the two must agree to the bit, pages included; with arbitrary floats they
agree to rounding (the order of additions differs).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import case, func, text
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, select

from catalog.loader import load_catalog
from scheduler import dashboard_reads
from scheduler.api import create_app
from scheduler.auth import Principal
from scheduler.dashboard_reads import DashboardReads
from scheduler.service import ADMIN, SchedulerService
from scheduler.store import ledger
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, Spend, SpendDay, Team
from tests.scheduler.conftest import toy_plan, toy_record
from tests.scheduler.fakes import FakeClock
from tests.scheduler.ui_world import sign_in

D0 = date(2026, 11, 1)
DAYS = 9
GPUS = ["H100-SXM", "A100-80GB", "L40S", ""]  # "" : a job without a GPU type (the page shows "?")
MARKETS = ["spot", "on-demand"]
ADMIN_TOKEN = "admin-secret"

_spend = Spend.__table__  # type: ignore[attr-defined]
_job = Job.__table__  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the reference: the ledger alone


def _raw_day(store: Store) -> Any:
    if store.dialect == "postgresql":
        return func.date(func.timezone("UTC", _spend.c.recorded_at))
    return func.date(_spend.c.recorded_at)


def _raw_window(stmt: Any, team_id: int | None, since: datetime | None, until: datetime | None) -> Any:
    if team_id is not None:
        stmt = stmt.where(_spend.c.team_id == team_id)
    if since is not None:
        stmt = stmt.where(_spend.c.recorded_at >= datetime.combine(since.date(), time(), tzinfo=UTC))
    if until is not None:
        stmt = stmt.where(_spend.c.recorded_at <= until)
    return stmt


def _date(d: Any) -> date:
    return d if isinstance(d, date) else date.fromisoformat(str(d))


def raw_spend_by_day(store: Store, team_id: int | None, since: datetime | None = None,
                     until: datetime | None = None) -> list[tuple[date, str, str, float]]:
    day = _raw_day(store).label("day")
    on = (_job.c.team_id == (_spend.c.team_id if team_id is None else team_id)) & (_job.c.id == _spend.c.job_id)
    stmt = _raw_window(sa_select(day, _job.c.gpu, _spend.c.market, func.sum(_spend.c.usd)).join(_job, on),
                       team_id, since, until).group_by(day, _job.c.gpu, _spend.c.market)
    with store.read() as session:
        rows = session.execute(stmt).all()
    return sorted((_date(d), str(g or "?"), str(m), float(u)) for d, g, m, u in rows)


def raw_spend_per_day(store: Store, team_id: int, until: datetime) -> list[tuple[date, float]]:
    day = _raw_day(store).label("day")
    stmt = _raw_window(sa_select(day, func.sum(_spend.c.usd)), team_id, None, until).group_by(day)
    with store.read() as session:
        return sorted((_date(d), float(u)) for d, u in session.execute(stmt).all())


def raw_spend_by_team_between(session: Session, since: datetime, until: datetime, team_ids: list[int] | None = None,
                              ) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    inside = case(((_spend.c.recorded_at >= since) & (_spend.c.recorded_at <= until), _spend.c.usd))
    stmt = (sa_select(_spend.c.team_id, _spend.c.market, func.sum(inside), func.sum(_spend.c.usd))
            .group_by(_spend.c.team_id, _spend.c.market))
    if team_ids is not None:
        stmt = stmt.where(_spend.c.team_id.in_(team_ids))
    window: dict[int, dict[str, float]] = {}
    ever: dict[int, float] = {}
    for team_id, market, usd, total in sorted(session.execute(stmt).all(), key=lambda r: (r[0], r[1])):
        if usd is not None:
            window.setdefault(int(team_id), {})[str(market)] = float(usd)
        ever[int(team_id)] = ever.get(int(team_id), 0.0) + float(total)
    return window, ever


def raw_spent_by_team(session: Session, team_ids: list[int] | None = None) -> dict[int, float]:
    stmt = sa_select(_spend.c.team_id, func.sum(_spend.c.usd)).group_by(_spend.c.team_id)
    if team_ids is not None:
        stmt = stmt.where(_spend.c.team_id.in_(team_ids))
    return {int(t): float(u) for t, u in session.execute(stmt).all()}


def raw_team_spent(session: Session, team_id: int) -> float:
    return raw_spent_by_team(session, [team_id]).get(team_id, 0.0)


def raw_spend_by_team(session: Session) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    stmt = sa_select(_spend.c.team_id, _spend.c.market, func.sum(_spend.c.usd)).group_by(_spend.c.team_id,
                                                                                         _spend.c.market)
    for team_id, market, usd in session.execute(stmt).all():
        out.setdefault(int(team_id), {})[str(market)] = float(usd)
    return out


# ---------------------------------------------------------------- random histories


@dataclass
class History:
    team_ids: list[int]
    closes: int


def _close_time(rng: random.Random) -> datetime:
    """A close on one of the days, often on or next to a UTC midnight."""
    day = midnight = datetime.combine(D0 + timedelta(days=rng.randrange(DAYS)), time(), tzinfo=UTC)
    pick = rng.random()
    if pick < 0.15:
        return midnight
    if pick < 0.3:
        return midnight - timedelta(microseconds=1)
    if pick < 0.4:
        return midnight + timedelta(microseconds=1)
    return day + timedelta(seconds=rng.randrange(86_400), microseconds=rng.randrange(1_000_000))


def build_history(store: Store, rng: random.Random, *, teams: int = 6, closes: int = 160,
                  exact: bool = True) -> History:
    """Teams with jobs on several GPU types, and ``closes`` attempts closed through the ledger in
    transactions of 1 to 4 closes. ``exact``: $/h on a 1/8 grid and durations in 1/16 h, so every
    spend row and every sum of them is exact in binary floating point."""
    t0 = datetime.combine(D0 - timedelta(days=3), time(), tzinfo=UTC)
    with store.write() as session:
        team_rows = [Team(name=f"team-{i}", budget_usd=rng.choice([None, 500.0, 20_000.0]), created_at=t0)
                     for i in range(teams)]
        session.add_all(team_rows)
        session.flush()
        team_ids = [t.id for t in team_rows if t.id is not None]
        jobs = [Job(id=f"j-{t}-{k}", team_id=t, name=f"job-{t}-{k}", spec={}, spec_hash="h", plan=toy_record(),
                    state="running", gpu=rng.choice(GPUS), created_at=t0, updated_at=t0)
                for t in team_ids for k in range(rng.randint(1, 4))]
        session.add_all(jobs)
    job_ids = [(j.id, j.team_id) for j in jobs]
    numbers: dict[str, int] = {}
    done = 0
    while done < closes:
        with store.write() as session:
            for _ in range(min(rng.randint(1, 4), closes - done)):
                job_id, _team = rng.choice(job_ids)
                job = session.get(Job, job_id)
                assert job is not None
                end = _close_time(rng)
                if exact:
                    usd_per_h, hours = rng.randrange(0, 400) / 8, rng.randrange(0, 65) / 16
                else:
                    usd_per_h, hours = rng.uniform(0.0, 98.32), rng.uniform(0.0, 5.0)
                numbers[job_id] = numbers.get(job_id, 0) + 1
                attempt = Attempt(job_id=job_id, number=numbers[job_id], market=rng.choice(MARKETS),
                                  usd_per_h=usd_per_h, started_at=end - timedelta(hours=hours))
                session.add(attempt)
                session.flush()
                ledger.close_attempt(session, attempt, job, end, "succeeded")
                done += 1
    return History(team_ids, closes)


def windows(rng: random.Random, n: int) -> list[tuple[datetime, datetime]]:
    """Report windows: whole days, midnights and a microsecond either side, inside one day, an
    offset other than UTC, since after until, and random ones."""
    def at(day: int, seconds: float = 0.0) -> datetime:
        return datetime.combine(D0 + timedelta(days=day), time(), tzinfo=UTC) + timedelta(seconds=seconds)

    us = 1e-6
    out = [(at(0), at(DAYS)), (at(-5), at(DAYS + 5)), (at(2), at(5)), (at(2, us), at(5, -us)), (at(2, -us), at(5, us)),
           (at(3, 3600), at(3, 7200)), (at(3), at(3)), (at(4, 10), at(4, 5)), (at(1, 12 * 3600), at(6, 1)),
           (at(2).astimezone(timezone(timedelta(hours=2))), at(7, 5).astimezone(timezone(timedelta(hours=-7))))]
    for _ in range(n):
        a, b = sorted(rng.uniform(-1, DAYS + 1) for _ in range(2))
        out.append((at(0, a * 86_400), at(0, b * 86_400)))
    return out


# ---------------------------------------------------------------- comparisons


def _same(got: Any, want: Any, exact: bool) -> None:
    """Equal in structure and order; floats equal to the bit (``exact``) or to rounding."""
    if isinstance(want, float):
        assert isinstance(got, float)
        assert got == want if exact else math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (got, want)
        for k in want:
            _same(got[k], want[k], exact)
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            _same(g, w, exact)
    else:
        assert got == want


def _caller(team_id: int | None) -> Principal:
    """The dashboard's caller for a team's rows (None: the admin, who reads every team's)."""
    return ADMIN if team_id is None else Principal(team_id=team_id, team_name=f"team-{team_id}")


def check_reports(store: Store, history: History, rng: random.Random, exact: bool) -> None:
    teams: list[int | None] = [None, *history.team_ids]
    reads = DashboardReads(store)
    for since, until in windows(rng, 12):
        for team_id in teams:
            _same(reads.spend_by_day(_caller(team_id), since, until), raw_spend_by_day(store, team_id, since, until),
                  exact)
            if team_id is not None:
                _same(reads.spend_per_day(_caller(team_id), until), raw_spend_per_day(store, team_id, until), exact)
        with store.read() as session:
            for ids in (None, history.team_ids[:1], history.team_ids[1:3]):
                _same(ledger.spend_by_team_between(session, since, until, ids),
                      raw_spend_by_team_between(session, since, until, ids), exact)
    _same(reads.spend_by_day(ADMIN), raw_spend_by_day(store, None), exact)
    with store.read() as session:
        _same(ledger.spent_by_team(session), raw_spent_by_team(session), exact)
        _same(ledger.spend_by_team(session), raw_spend_by_team(session), exact)
        for team_id in history.team_ids:
            _same(ledger.team_spent(session, team_id), raw_team_spent(session, team_id), exact)
        assert session.execute(sa_select(func.sum(SpendDay.__table__.c.attempts))).scalar_one() == history.closes  # type: ignore[attr-defined]


def summary_rows(store: Store) -> list[tuple[Any, ...]]:
    with store.read() as session:
        rows = session.exec(select(SpendDay)).all()
        return sorted((r.team_id, r.day, r.gpu, r.market, r.usd, r.hours, r.attempts) for r in rows)


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", [1, 2])
def test_reports_from_the_summary_equal_the_ledger_sums_to_the_bit(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    history = build_history(store, rng)
    check_reports(store, history, rng, exact=True)
    kept = summary_rows(store)
    with store.write() as session:  # the summary kept row by row is the one summed from the ledger at once
        assert ledger.rebuild_days(session) == len(kept)
    assert summary_rows(store) == kept


def test_reports_from_the_summary_equal_the_ledger_sums_to_rounding(store: Store) -> None:
    rng = random.Random(3)
    history = build_history(store, rng, teams=4, closes=120, exact=False)
    check_reports(store, history, rng, exact=False)


def test_the_spend_pages_are_byte_identical_to_the_ledger_only_pages(store: Store, tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    history = build_history(store, rng, teams=3, closes=120)
    with store.write() as session:  # a budget on every team: the burn-down shows
        for team in session.exec(select(Team)).all():
            team.budget_usd = 5_000.0
            session.add(team)
    clock = FakeClock(datetime.combine(D0 + timedelta(days=DAYS - 2), time(13, 30), tzinfo=UTC))
    service = SchedulerService(store, toy_plan, clock=clock, checkpoint_root=str(tmp_path / "ckpt"),
                               admin_token=ADMIN_TOKEN)
    app = create_app(service, load_catalog())
    admin = TestClient(app, base_url="https://testserver")
    sign_in(admin, ADMIN_TOKEN)
    team = TestClient(app, base_url="https://testserver")
    sign_in(team, service.create_token(ADMIN, "team-0", "t").token)
    paths = [(team, "/ui/spend"), (team, "/ui/spend?since=3d&period=week"), (team, "/ui/spend?since=2026-11-02"),
             (admin, "/ui/spend"), (admin, "/ui/spend?since=5d&period=week"), (admin, "/ui/admin")]
    paths += [(admin, f"/ui/spend?team=team-{i}&since=2026-11-03T12:00") for i in range(len(history.team_ids))]

    def render() -> list[str]:
        pages = []
        for client, path in paths:
            resp = client.get(path)
            assert resp.status_code == 200, (path, resp.text[:300])
            pages.append(resp.text)
        return pages

    summary = render()
    for module, name, raw in ((ledger, "spend_by_team_between", raw_spend_by_team_between),
                              (ledger, "spent_by_team", raw_spent_by_team), (ledger, "team_spent", raw_team_spent),
                              (dashboard_reads, "_spend_by_day", raw_spend_by_day),
                              (dashboard_reads, "_spend_per_day", raw_spend_per_day)):
        monkeypatch.setattr(module, name, raw)
    before = render()
    assert "run out" in before[0] or "runs out" in before[0]  # the burn-down is on the team page
    for path, got, want in zip(paths, summary, before, strict=True):
        assert got == want, path[1]
    report = service.spend_report(ADMIN, since=clock() - timedelta(days=30), team="team-0")
    assert report.total_usd > 0


def test_concurrent_writers_add_every_row_to_the_summary(store: Store) -> None:
    # Four writers close attempts of one team on one day, GPU type and market at once: on
    # PostgreSQL each upsert waits on the summary row the others hold; nothing is lost.
    history = build_history(store, random.Random(5), teams=1, closes=1)
    end = datetime.combine(D0 + timedelta(days=2), time(10), tzinfo=UTC)
    with store.write() as session:
        job = Job(id="j-hot", team_id=history.team_ids[0], name="hot", spec={}, spec_hash="h", plan=toy_record(),
                  state="running", gpu="H100-SXM", created_at=end, updated_at=end)
        session.add(job)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            start.wait()
            for k in range(10):
                with store.write() as session:
                    hot = session.get(Job, "j-hot")
                    assert hot is not None
                    attempt = Attempt(job_id="j-hot", number=w * 100 + k, market="spot", usd_per_h=2.5,
                                      started_at=end - timedelta(minutes=30))
                    session.add(attempt)
                    session.flush()
                    ledger.close_attempt(session, attempt, hot, end, "succeeded")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store.read() as session:
        row = session.get(SpendDay, (history.team_ids[0], end.date(), "H100-SXM", "spot"))
        assert row is not None and (row.usd, row.hours, row.attempts) == (50.0, 20.0, 40)
    check_reports(store, History(history.team_ids, 41), random.Random(6), exact=True)


def _refuse_summary_writes(store: Store) -> Callable[[], None]:
    """A trigger that makes every write to spend_day fail; returns what removes it."""
    with store.engine.begin() as conn:
        if store.is_postgres:
            conn.execute(text("CREATE FUNCTION refuse_spend_day() RETURNS trigger LANGUAGE plpgsql AS "
                              "$$ BEGIN RAISE EXCEPTION 'spend_day refused'; END $$"))
            conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON spend_day "
                              "FOR EACH ROW EXECUTE FUNCTION refuse_spend_day()"))
        else:
            for op in ("INSERT", "UPDATE"):
                conn.execute(text(f"CREATE TRIGGER refuse_{op.lower()} BEFORE {op} ON spend_day "
                                  "BEGIN SELECT RAISE(ABORT, 'spend_day refused'); END"))

    def remove() -> None:
        with store.engine.begin() as conn:
            if store.is_postgres:
                conn.execute(text("DROP TRIGGER IF EXISTS refuse ON spend_day"))
                conn.execute(text("DROP FUNCTION IF EXISTS refuse_spend_day()"))
            else:
                conn.execute(text("DROP TRIGGER IF EXISTS refuse_insert"))
                conn.execute(text("DROP TRIGGER IF EXISTS refuse_update"))

    return remove


def test_a_failing_summary_update_writes_no_spend_and_leaves_the_attempt_open(store: Store) -> None:
    history = build_history(store, random.Random(7), teams=2, closes=12)
    with store.read() as session:
        before = sorted(session.execute(sa_select(_spend.c.attempt_id, _spend.c.usd)).all())
    kept = summary_rows(store)
    end = datetime.combine(D0 + timedelta(days=1), time(8), tzinfo=UTC)
    with store.write() as session:  # an open attempt on a day and key the summary already has, and a new one
        job = session.exec(select(Job)).first()
        assert job is not None
        attempts = [Attempt(job_id=job.id, number=1000 + i, market=market, usd_per_h=4.0,
                            started_at=end - timedelta(hours=1)) for i, market in enumerate(MARKETS)]
        session.add_all(attempts)
    remove = _refuse_summary_writes(store)
    try:
        for attempt in attempts:
            with pytest.raises(DBAPIError, match="spend_day refused"), store.write() as session:
                fresh = session.get(Attempt, attempt.id)
                job = session.get(Job, attempt.job_id)
                assert fresh is not None and job is not None
                ledger.close_attempt(session, fresh, job, end, "succeeded")
    finally:
        remove()
    with store.read() as session:
        assert sorted(session.execute(sa_select(_spend.c.attempt_id, _spend.c.usd)).all()) == before
        for attempt in attempts:
            still = session.get(Attempt, attempt.id)
            assert still is not None and still.ended_at is None and still.outcome is None  # the loop closes it again
    assert summary_rows(store) == kept
    with store.write() as session:  # once the summary takes writes again, the close goes through whole
        for attempt in attempts:
            fresh, job = session.get(Attempt, attempt.id), session.get(Job, attempt.job_id)
            assert fresh is not None and job is not None
            ledger.close_attempt(session, fresh, job, end, "succeeded")
    check_reports(store, History(history.team_ids, history.closes + len(attempts)), random.Random(8), exact=True)
