"""The dashboard's reads beside the service (scheduler.dashboard_reads): asked as a caller, answered under
the service's rules; a team reads its own rows only, the team names are the admin's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from errors import Forbidden
from scheduler.auth import ADMIN, Principal
from scheduler.dashboard_reads import DashboardReads
from scheduler.store.database import Store
from scheduler.store.models import Job, Team
from tests.scheduler.conftest import toy_record

T0 = datetime(2026, 11, 2, 12, tzinfo=UTC)


def _two_teams(store: Store) -> tuple[Principal, Principal]:
    with store.write() as session:
        teams = [Team(name=name, created_at=T0) for name in ("red", "blue")]
        session.add_all(teams)
        session.flush()
        session.add_all([Job(id=f"j-{t.name}", team_id=t.id, name=f"shared-name-{t.name}", spec={}, spec_hash="h",
                             plan=toy_record(), state="queued", created_at=T0, updated_at=T0) for t in teams])
    red, blue = teams
    assert red.id is not None and blue.id is not None
    return Principal(team_id=red.id, team_name="red"), Principal(team_id=blue.id, team_name="blue")


def test_a_team_finds_its_own_jobs_only(store: Store) -> None:
    red, blue = _two_teams(store)
    reads = DashboardReads(store)
    assert [j.id for j in reads.search_jobs(red, text="SHARED", state=None, limit=10, offset=0)] == ["j-red"]
    assert [j.id for j in reads.search_jobs(blue, text="shared", state=None, limit=10, offset=0)] == ["j-blue"]
    assert reads.search_jobs(red, text="shared", state="running", limit=10, offset=0) == []


def test_the_team_names_are_the_admins_and_jobs_are_a_teams(store: Store) -> None:
    red, _ = _two_teams(store)
    reads = DashboardReads(store)
    assert reads.team_names(ADMIN) == ["blue", "red"]
    with pytest.raises(Forbidden):
        reads.team_names(red)
    with pytest.raises(Forbidden):  # the admin reads a team's jobs as that team (the dashboard's team picker)
        reads.search_jobs(ADMIN, text="shared", state=None, limit=10, offset=0)
    with pytest.raises(Forbidden):
        reads.accuracy_records(ADMIN)
    assert reads.spend_by_day(red) == [] and reads.spend_by_day(ADMIN) == []
