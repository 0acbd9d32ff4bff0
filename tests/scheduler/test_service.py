"""The service against real databases: budgets, quotas, idempotency, isolation, tokens."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlmodel import select

from errors import AuthError, Conflict, Forbidden, InvalidInput, LimitExceeded, NotFound
from scheduler.service import ADMIN, Principal, SchedulerService, hash_token
from scheduler.store.database import Store
from scheduler.store.models import ApiToken, Event, JobCreate, TeamCreate, TeamUpdate
from tests.scheduler.conftest import spec_dict, toy_plan


def team(service: SchedulerService, name: str, budget: float | None = None, quota: int | None = None) -> Principal:
    service.create_team(ADMIN, TeamCreate(name=name, budget_usd=budget, gpu_quota=quota))
    token = service.create_token(ADMIN, name).token
    return service.authenticate(token)


def test_submit_plans_queues_and_records_every_transition(service: SchedulerService) -> None:
    ml = team(service, "ml")
    job = service.submit(ml, JobCreate(spec=spec_dict(tokens=2e6, gpus=2)))
    assert job.state == "queued" and job.estimated_usd == pytest.approx(2.0) and job.gpus == 2
    assert job.checkpoint_uri.endswith("/" + job.id)
    detail = service.status(ml, job.id)
    assert [(e.from_state, e.to_state) for e in detail.events] == [
        (None, "pending"), ("pending", "planned"), ("planned", "queued")]
    assert detail.plan["chosen"]["cost"]["usd"] == pytest.approx(2.0)


def test_budget_refusal_says_by_how_much(service: SchedulerService) -> None:
    ml = team(service, "ml", budget=500)
    service.submit(ml, JobCreate(spec=spec_dict(tokens=257.9e6)))  # $257.90 reserved
    with pytest.raises(LimitExceeded) as info:
        service.submit(ml, JobCreate(spec=spec_dict(tokens=484.2e6)))
    assert str(info.value) == ("estimated $484.20 exceeds team ml's remaining budget $242.10 by $242.10; "
                               "raise the budget or lower tokens")
    assert service.get_team(ml).remaining_usd == pytest.approx(242.10)
    assert len(service.list_jobs(ml)) == 1


def test_quota_admits_to_run_so_a_job_over_it_is_queued_with_the_reason(service: SchedulerService) -> None:
    ml = team(service, "ml", quota=16)
    first = service.submit(ml, JobCreate(spec=spec_dict(gpus=16)))
    # Nothing runs yet (no loop): the second job is queued too, not refused as "16 of 16 in use".
    second = service.submit(ml, JobCreate(spec=spec_dict(gpus=16)))
    assert (first.state, second.state, first.message, second.message) == ("queued", "queued", "", "")
    info = service.get_team(ml)
    assert (info.gpus_in_use, info.gpus_queued) == (0, 32)


def test_a_job_larger_than_the_whole_quota_is_refused_with_advice(service: SchedulerService) -> None:
    ml = team(service, "ml", quota=8)
    with pytest.raises(LimitExceeded) as info:
        service.submit(ml, JobCreate(spec=spec_dict(gpus=16)))
    assert str(info.value) == ("the job needs 16 GPUs, more than team ml's whole quota of 8, so it could never start; "
                               "set resources.max_gpus: 8 in the spec so the planner picks a plan that fits, or raise "
                               "the quota (gpuplan team quota ml 16)")
    assert service.list_jobs(ml) == []


def test_revoking_another_teams_token_is_not_found_and_changes_nothing(service: SchedulerService) -> None:
    team(service, "ml")
    research = service.create_team(ADMIN, TeamCreate(name="research"))
    theirs = service.create_token(ADMIN, research.name)
    ml_token = service.list_tokens(ADMIN, "ml")[0]
    with pytest.raises(NotFound, match=f"^team ml has no token {theirs.id};"):
        service.revoke_token(ADMIN, "ml", theirs.id)
    with pytest.raises(NotFound, match="team 'nosuch' does not exist") as info:
        service.revoke_token(ADMIN, "nosuch", ml_token.id)
    assert "ml, research" in (info.value.hint or "")
    assert service.authenticate(theirs.token).team_name == "research"
    assert [t.revoked_at for t in service.list_tokens(ADMIN, "ml") + service.list_tokens(ADMIN, "research")] == [
        None, None]
    assert service.revoke_token(ADMIN, "research", theirs.id).revoked_at is not None


def test_idempotency_key_returns_the_same_job(service: SchedulerService) -> None:
    ml = team(service, "ml")
    a = service.submit(ml, JobCreate(spec=spec_dict(), idempotency_key="k1"))
    b = service.submit(ml, JobCreate(spec=spec_dict(), idempotency_key="k1"))
    assert a.id == b.id and len(service.list_jobs(ml)) == 1
    with pytest.raises(Conflict, match="different spec"):
        service.submit(ml, JobCreate(spec=spec_dict(tokens=5e6), idempotency_key="k1"))
    other = team(service, "other")  # keys are per team
    assert service.submit(other, JobCreate(spec=spec_dict(), idempotency_key="k1")).id != a.id


def test_teams_cannot_see_each_others_jobs(service: SchedulerService) -> None:
    a, b = team(service, "a"), team(service, "b")
    job = service.submit(a, JobCreate(spec=spec_dict()))
    for call in (lambda: service.status(b, job.id), lambda: service.cancel(b, job.id),
                 lambda: service.logs(b, job.id)):
        with pytest.raises(NotFound):
            call()
    assert service.list_jobs(b) == [] and [j.id for j in service.list_jobs(a)] == [job.id]
    with pytest.raises(Forbidden):
        service.spend_report(b, since=job.created_at, team="a")
    with pytest.raises(Forbidden):
        service.create_team(a, TeamCreate(name="x"))
    with pytest.raises(Forbidden, match="use a team token"):
        service.submit(ADMIN, JobCreate(spec=spec_dict()))


def test_tokens_are_hashed_and_revocable(service: SchedulerService, store: Store) -> None:
    service.create_team(ADMIN, TeamCreate(name="ml"))
    created = service.create_token(ADMIN, "ml")
    with store.read() as session:
        row = session.exec(select(ApiToken)).one()
    assert row.token_hash == hash_token(created.token) and created.token not in row.token_hash
    assert service.authenticate(created.token).team_name == "ml"
    service.revoke_token(ADMIN, "ml", created.id)
    with pytest.raises(AuthError, match="revoked"):
        service.authenticate(created.token)
    with pytest.raises(AuthError, match="invalid token"):
        service.authenticate("gpt_wrong")
    with pytest.raises(AuthError, match="missing"):
        service.authenticate(None)
    assert service.authenticate("admin-secret").is_admin


def test_bad_input_is_refused_with_the_field(service: SchedulerService) -> None:
    ml = team(service, "ml")
    with pytest.raises(InvalidInput, match=r"train\.tokens"):
        service.submit(ml, JobCreate(spec={"task": "train", "model": "m", "train": {"tokens": -1}}))
    with pytest.raises(InvalidInput, match="unknown state"):
        service.list_jobs(ml, state="runing")
    with pytest.raises(Conflict, match="already exists"):
        service.create_team(ADMIN, TeamCreate(name="ml"))
    with pytest.raises(NotFound, match="team 'nope' does not exist"):
        service.update_team(ADMIN, "nope", TeamUpdate(budget_usd=1))


def test_events_are_only_written_through_transitions(service: SchedulerService, store: Store) -> None:
    ml = team(service, "ml")
    job = service.submit(ml, JobCreate(spec=spec_dict()))
    service.cancel(ml, job.id, "changed my mind")
    with store.read() as session:
        last = session.exec(select(Event).where(Event.job_id == job.id).order_by(Event.id.desc())).first()  # type: ignore[union-attr]
    assert last is not None and last.to_state == "cancelled" and "changed my mind" in last.reason


def test_concurrent_submits_never_exceed_budget_or_quota(store: Store, tmp_path: Path) -> None:
    # Separate service instances (separate engines) race like separate server workers would.
    services = [SchedulerService(Store(store.url), toy_plan, checkpoint_root=str(tmp_path), admin_token="adm")
                for _ in range(4)]
    for s in services:
        s.store.migrate()
    services[0].create_team(ADMIN, TeamCreate(name="ml", budget_usd=10.0, gpu_quota=12))
    token = services[0].create_token(ADMIN, "ml").token
    results: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        s = services[i % len(services)]
        who = s.authenticate(token)
        for j in range(5):
            try:
                s.submit(who, JobCreate(spec=spec_dict(tokens=1e6, gpus=1, name=f"w{i}-{j}")))
                outcome = "ok"
            except LimitExceeded:
                outcome = "refused"
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = services[0].get_team(services[0].authenticate(token))
    # $1 and 1 GPU each: the budget ($10) binds; the quota (12 GPUs) admits to run, not to the queue.
    assert results.count("ok") == 10 and results.count("refused") == 30
    assert info.reserved_usd == pytest.approx(10.0) and (info.gpus_in_use, info.gpus_queued) == (0, 10)
    for s in services:
        s.store.dispose()


@pytest.mark.parametrize("name", ["a/b", "bad name!", "ML", "-ml", "x" * 64, ""])
def test_team_names_follow_one_rule_on_every_path(service: SchedulerService, name: str) -> None:
    with pytest.raises(ValueError, match="is not valid: use 1 to 63 lowercase letters"):
        TeamCreate(name=name)
    team(service, "ml")
    for call in (lambda: service.update_team(ADMIN, name, TeamUpdate(budget_usd=10)),
                 lambda: service.create_token(ADMIN, name), lambda: service.team_principal(name, create=True)):
        with pytest.raises(InvalidInput, match=f"^team: team name {name!r} is not valid"):
            call()
    assert [t.name for t in service.list_teams(ADMIN)] == ["ml"]


def test_an_unknown_team_is_not_created_and_the_error_lists_the_teams(service: SchedulerService) -> None:
    team(service, "ml")
    team(service, "research")
    with pytest.raises(NotFound) as info:
        service.team_principal("mll")
    assert str(info.value) == "team 'mll' does not exist; did you mean 'ml'? teams: ml, research"
    assert service.team_principal("ml").team_name == "ml"
    # The default team is made on first use (the in-process CLI asks with create=True for it), but in a
    # shared database (GPUPLAN_DATABASE_URL) only while it has no teams: one with teams is a server's.
    with pytest.raises(NotFound, match="which is a server's"):
        service.team_principal("default", create=True, shared=True)
    assert [t.name for t in service.list_teams(ADMIN)] == ["ml", "research"]
    assert service.team_principal("default", create=True).team_name == "default"
    assert [t.name for t in service.list_teams(ADMIN)] == ["default", "ml", "research"]
