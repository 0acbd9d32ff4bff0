"""The scheduler's CLI commands, in-process (local SQLite) and over HTTP against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import load_catalog
from cli import app
from scheduler.api import create_app
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import TeamCreate, TeamUpdate
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import ScriptedExecutor
from tests.scheduler.server import serve
from workers.executors.protocol import RunState

runner = CliRunner()


def write_spec(tmp_path: Path, **kwargs: object) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec_dict(**kwargs)))  # type: ignore[arg-type]
    return str(path)


@pytest.fixture
def remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SchedulerService, str]]:
    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    store.migrate()
    service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt"), admin_token="adm")
    service.create_team(ADMIN, TeamCreate(name="ml", budget_usd=10))
    token = service.create_token(ADMIN, "ml").token
    with serve(create_app(service, load_catalog())) as url:
        monkeypatch.setenv("GPUPLAN_API_URL", url)
        monkeypatch.setenv("GPUPLAN_TOKEN", token)
        monkeypatch.setenv("GPUPLAN_ADMIN_TOKEN", "adm")
        yield service, token
    store.dispose()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout


def test_cli_over_http(remote: tuple[SchedulerService, str], tmp_path: Path) -> None:
    service, _ = remote
    spec = write_spec(tmp_path, tokens=4e6, gpus=2)
    code, out = run("submit", spec, "--key", "nightly-1", "--json")
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "queued" and job["estimated_usd"] == 4.0 and job["gpus"] == 2
    code, out = run("submit", spec, "--key", "nightly-1", "--json")  # same key, same job
    assert json.loads(out)["id"] == job["id"]
    code, out = run("submit", write_spec(tmp_path, tokens=7e6), "--json")
    assert code == 7 and json.loads(out)["error"]["message"].startswith("estimated $7.00 exceeds team ml's")
    ex = ScriptedExecutor()
    loop = Scheduler(service.store, ex)
    loop.tick()
    ex.finish(ex.handle_of(job["id"]), RunState.SUCCEEDED)
    loop.tick()
    code, out = run("list", "--json")
    assert [j["id"] for j in json.loads(out)] == [job["id"]]
    code, out = run("status", job["id"])
    assert code == 0 and "succeeded" in out
    code, out = run("logs", job["id"], "--follow", "--json")
    lines = [json.loads(x)["line"] for x in out.splitlines()]
    assert any("queued -> running" in x for x in lines) and any("--- attempt 1" in x for x in lines)
    code, out = run("report", "spend", "--since", "1d", "--json")
    assert code == 0 and json.loads(out)["jobs"][0]["job_id"] == job["id"]
    code, out = run("cancel", job["id"])
    assert code == 5  # already finished: Conflict
    code, out = run("status", "j-nope")
    assert code == 4
    code, out = run("team", "budget", "ml", "25", "--json")
    assert code == 0 and json.loads(out)["budget_usd"] == 25
    code, out = run("team", "token", "ml", "--json")
    assert json.loads(out)["token"].startswith("gpt_")


def test_cli_resubmit_with_a_key_prints_the_jobs_real_state(remote: tuple[SchedulerService, str],
                                                             tmp_path: Path) -> None:
    spec = write_spec(tmp_path, tokens=1e6)
    code, out = run("submit", spec, "--key", "nightly-42")
    assert code == 0 and out.startswith("queued j-"), out
    job_id = out.split()[1]
    assert run("cancel", job_id)[0] == 0
    code, out = run("submit", spec, "--key", "nightly-42")
    assert code == 0 and out.startswith(f"cancelled {job_id} (job): submitted earlier with key 'nightly-42' at "), out
    assert "queued" not in out.replace("not queued again", "")
    code, out = run("submit", spec, "--key", "nightly-42", "--json")
    assert (json.loads(out)["id"], json.loads(out)["state"]) == (job_id, "cancelled")


def test_cli_submit_over_the_quota_is_queued_and_says_why_it_waits(remote: tuple[SchedulerService, str],
                                                                     tmp_path: Path) -> None:
    service, _ = remote
    service.update_team(ADMIN, "ml", TeamUpdate(gpu_quota=16))
    first = run("submit", write_spec(tmp_path, tokens=1e6, gpus=16), "--json")[1]
    Scheduler(service.store, ScriptedExecutor()).tick()
    code, out = run("submit", write_spec(tmp_path, tokens=1e6, gpus=16))
    assert code == 0 and out.startswith("queued j-"), out
    assert (f"waiting: 16 of 16 GPUs of team ml's quota in use by {json.loads(first)['id']}; needs 16, starts when "
            "16 are free") in " ".join(out.split())
    waiting = out.split()[1]
    code, out = run("list")
    assert code == 0 and f"{waiting} waiting: 16 of 16 GPUs of team ml's quota" in " ".join(out.split()), out
    code, out = run("status", waiting)
    assert code == 0 and "waiting: 16 of 16 GPUs" in " ".join(out.split()), out
    code, out = run("logs", waiting)
    assert code == 0 and "waiting: 16 of 16 GPUs" in out, out
    code, out = run("submit", write_spec(tmp_path, tokens=1e6, gpus=32), "--json")
    assert code == 7 and json.loads(out)["error"]["message"].startswith(
        "the job needs 32 GPUs, more than team ml's whole quota of 16, so it could never start; "
        "set resources.max_gpus: 16")


def test_cli_report_spend_takes_dates_and_gives_the_admin_every_team(remote: tuple[SchedulerService, str],
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    service, _ = remote
    service.create_team(ADMIN, TeamCreate(name="research", budget_usd=50))
    job = json.loads(run("submit", write_spec(tmp_path, tokens=1e6), "--json")[1])
    ex = ScriptedExecutor()
    loop = Scheduler(service.store, ex)
    loop.tick()
    ex.finish(ex.handle_of(job["id"]), RunState.SUCCEEDED)
    loop.tick()
    today = f"{service.clock():%Y-%m-%d}"
    for since in (today, today + "T00:00", today + "T00:00:00+00:00", "1d"):
        code, out = run("report", "spend", "--since", since, "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["team"] == "ml" and [j["job_id"] for j in report["jobs"]] == [job["id"]], since
        assert report["since"].startswith(today) or since == "1d"
    monkeypatch.delenv("GPUPLAN_TOKEN")  # the admin alone: every team's totals, not "no team token"
    code, out = run("report", "spend", "--since", today, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["team"] is None and [(t["team"], t["budget_usd"]) for t in report["teams"]] == [
        ("ml", 10), ("research", 50)]
    assert report["teams"][0]["total_usd"] == report["total_usd"] > 0 and report["teams"][1]["total_usd"] == 0
    code, out = run("report", "spend", "--since", today)
    assert code == 0 and "spend of every team" in out and "research" in out and "--team TEAM" in out, out
    code, out = run("report", "spend", "--all", "--team", "ml", "--json")
    assert code == 2 and json.loads(out)["error"]["message"] == "team: give --team or --all, not both"


@pytest.mark.parametrize(("args", "code", "line"), [
    (["status", "a\x00b"], 2, "job_id: contains a NUL byte (U+0000) at character 2; remove it"),
    (["status", "\udced\udca0\udc80"], 2,  # an argv that was not UTF-8 (Python keeps its bytes as surrogates)
     "the URL's path is not UTF-8 once its %-escapes are decoded (byte 0xED); percent-encode text as UTF-8"),
    (["status", "j" * 10_000], 2, "job_id: is 10000 characters long; at most 32 are allowed"),
    (["cancel", "j-1", "--reason", "stop\x1b[31m"], 2,
     "reason: contains the control character U+001B at character 5; remove it"),
    (["list", "--state", "queued\x00"], 2, "state: contains a NUL byte (U+0000) at character 7; remove it"),
    (["logs", "[bold]a/../b"], 4,  # one path segment, and no markup read into the line
     "no API route GET /v1/jobs/[bold]a/../b/logs; the routes are listed at /docs "
     "(a job id or team name holds no '/')"),
])
def test_cli_over_http_prints_a_refused_input_as_one_line(remote: tuple[SchedulerService, str], args: list[str],
                                                          code: int, line: str) -> None:
    result = runner.invoke(app, args)
    assert (result.exit_code, result.stderr) == (code, f"error: {line}\n")


def test_cli_refuses_bad_tokens(remote: tuple[SchedulerService, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLAN_TOKEN", "gpt_wrong")
    code, out = run("list", "--json")
    assert code == 6 and json.loads(out)["error"]["code"] == "unauthorized"
    monkeypatch.setenv("GPUPLAN_ADMIN_TOKEN", "wrong")
    code, out = run("team", "list", "--json")
    assert code == 6 and "GPUPLAN_ADMIN_TOKEN" in json.loads(out)["error"]["message"]


def test_cli_without_a_token_says_which_variable_to_set(remote: tuple[SchedulerService, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_TOKEN")
    monkeypatch.delenv("GPUPLAN_ADMIN_TOKEN")
    code, out = run("list", "--json")
    assert code == 6 and json.loads(out)["error"]["message"].startswith("no team token: set GPUPLAN_TOKEN")
    code, out = run("team", "list", "--json")
    assert code == 6 and json.loads(out)["error"]["message"].startswith("no admin token: set GPUPLAN_ADMIN_TOKEN")


def test_cli_in_process_uses_the_local_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    code, out = run("team", "create", "ml", "--budget", "1000", "--quota", "64")
    assert code == 0, out
    monkeypatch.setenv("GPUPLAN_TEAM", "ml")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "tiny", "task": "train", "model": "tiny-llama",
                                    "train": {"tokens": 1e6, "seq_len": 256}}))
    result = runner.invoke(app, ["submit", str(spec), "--json"])  # the real planner and catalog
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)  # the note goes to stderr, stdout stays one JSON document
    assert "queued in the local database as team ml" in result.stderr and "gpuplan server" in result.stderr
    assert (tmp_path / "home" / "gpuplan.db").exists()
    code, out = run("list", "--json")
    assert [j["id"] for j in json.loads(out)] == [job["id"]]
    code, out = run("cancel", job["id"], "--json")
    assert json.loads(out)["state"] == "cancelled"
    code, out = run("team", "list", "--json")
    [ml] = [t for t in json.loads(out) if t["name"] == "ml"]
    assert ml["reserved_usd"] == 0 and ml["gpus_in_use"] == 0


def test_cli_in_process_refuses_an_unknown_team_instead_of_creating_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPLAN_TEAM", "ml")
    assert run("team", "create", "ml", "--budget", "10", "--quota", "16")[0] == 0  # before ml exists
    monkeypatch.setenv("GPUPLAN_TEAM", "mll")
    code, out = run("submit", write_spec(tmp_path, tokens=70e6, gpus=16), "--json")
    assert code == 4, out
    assert json.loads(out)["error"]["message"] == (
        "GPUPLAN_TEAM=mll: team 'mll' does not exist; did you mean 'ml'? teams: ml")
    monkeypatch.delenv("GPUPLAN_TEAM")
    assert run("list", "--json")[0] == 0  # the default team is created on first use
    code, out = run("team", "list", "--json")
    assert [t["name"] for t in json.loads(out)] == ["default", "ml"]


@pytest.mark.parametrize("where", ["in-process", "http"])
def test_cli_team_names_are_checked_before_anything_is_created(where: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               request: pytest.FixtureRequest) -> None:
    if where == "http":
        request.getfixturevalue("remote")
    else:
        monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
        monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
        monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    rule = "is not valid: use 1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit"
    for args, name, fixed in ((("team", "create", "a/b"), "a/b", "a-b"),
                              (("team", "create", "bad name!"), "bad name!", "bad-name"),
                              (("team", "budget", "a/b", "10"), "a/b", "a-b"),
                              (("team", "token", "a/b"), "a/b", "a-b"),
                              (("report", "spend", "--team", "a/b"), "a/b", "a-b")):
        code, out = run(*args, "--json")
        assert code == 2, (args, out)
        message = json.loads(out)["error"]["message"]
        assert message.endswith(f"team name {name!r} {rule}, e.g. {fixed!r}"), (args, message)
    code, out = run("team", "list", "--json")
    assert all(t["name"] in ("ml", "default") for t in json.loads(out))


@pytest.mark.parametrize(("command", "value", "expected"), [
    ("budget", "-5", "budget: must be a number >= 0 or 'none', got '-5'"),
    ("budget", "nan", "budget: must be a number >= 0 or 'none', got 'nan'"),
    ("budget", "1e13", "budget: Input should be less than or equal to 1000000000000"),
    ("quota", "-3", "quota: must be a whole number >= 0 or 'none', got '-3'"),
    ("quota", "2.5", "quota: must be a whole number >= 0 or 'none', got '2.5'"),
])
def test_cli_team_limits_out_of_range_are_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         command: str, value: str, expected: str) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    assert run("team", "create", "ml", "--budget", "10", "--quota", "4")[0] == 0
    code, out = run("team", command, "ml", value, "--json")
    assert code == 2, out  # not a pydantic traceback, not click's "No such option: -5"
    assert json.loads(out)["error"]["message"].startswith(expected)
    code, out = run("team", "list", "--json")
    assert [(t["budget_usd"], t["gpu_quota"]) for t in json.loads(out) if t["name"] == "ml"] == [(10, 4)]


@pytest.mark.parametrize(("since", "expected"), [
    ("3x", "since: '3x' is not a duration; write e.g. '24h', '90m' or '2d', or a date such as 2026-11-01"),
    ("0d", "since: a duration must be positive, got '0d'; write e.g. '24h', '90m' or '2d', or a date such as "
           "2026-11-01"),
    ("99999999999d", "since: window '99999999999d' is too large; write a window (30d, 12h, 90m) or a UTC date or "
                     "time (2026-11-01, 2026-11-01T08:00)"),
    ("2026-13-01", "since: '2026-13-01' is not a date; write a window (30d, 12h, 90m) or a UTC date or time "
                   "(2026-11-01, 2026-11-01T08:00)"),
    ("2999-01-01", "since: '2999-01-01' is in the future (now is "),
])
def test_cli_report_spend_bad_window_is_one_hint(remote: tuple[SchedulerService, str], since: str,
                                                 expected: str) -> None:
    code, out = run("report", "spend", "--since", since, "--json")
    assert code == 2 and json.loads(out)["error"]["message"].startswith(expected)


def test_cli_in_process_refuses_a_team_name_the_server_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPLAN_TEAM", "my team")
    code, out = run("list", "--json")
    assert code == 2
    assert json.loads(out)["error"]["message"] == (
        "GPUPLAN_TEAM=my team: team: team name 'my team' is not valid: use 1 to 63 lowercase letters, digits, '-' "
        "or '_', starting with a letter or digit, e.g. 'my-team'")


def test_cli_report_spend_bad_window_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    code, out = run("report", "spend", "--since", "3x", "--json")
    assert code == 2
    assert json.loads(out)["error"]["message"] == ("since: '3x' is not a duration; write e.g. '24h', '90m' or '2d', "
                                                   "or a date such as 2026-11-01")


def test_cli_logs_prints_each_line_whole(remote: tuple[SchedulerService, str], tmp_path: Path) -> None:
    code, out = run("submit", write_spec(tmp_path, tokens=1e6), "--json")
    assert code == 0, out
    job_id = json.loads(out)["id"]
    code, out = run("logs", job_id, "--json")
    lines = [json.loads(x)["line"] for x in out.splitlines()]
    assert any(len(line) > 80 for line in lines)  # the plan line: longer than a piped terminal is wide
    code, out = run("logs", job_id)
    assert code == 0 and out.splitlines() == lines  # not wrapped at 80 columns, not re-rendered


def test_cli_server_on_a_taken_port_fails_before_touching_running_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from commands.settings import Settings
    from scheduler.store.models import JobCreate

    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path))
    store = Store(Settings.from_env().database_url)
    store.migrate()
    service = SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt"))
    service.create_team(ADMIN, TeamCreate(name="ml"))
    ml = service.authenticate(service.create_token(ADMIN, "ml").token)
    job = service.submit(ml, JobCreate(spec=spec_dict()))
    Scheduler(store, ScriptedExecutor()).tick()  # the live server's attempt, unknown to any other executor
    assert service.status(ml, job.id).state == "running"
    with socket.socket() as live:  # the live server holds the port
        live.bind(("127.0.0.1", 0))
        live.listen()
        port = live.getsockname()[1]
        result = runner.invoke(app, ["server", "--port", str(port), "--workers", "1"])
    assert result.exit_code == 5, result.output
    assert f"port {port} on 127.0.0.1 is already in use" in result.output
    detail = service.status(ml, job.id)  # a reconcile would have closed it as lost and requeued the job
    assert detail.state == "running" and [a.outcome for a in detail.attempt_list] == [None]
    store.dispose()


def test_every_command_and_group_help_shows_an_example() -> None:
    import typer.main

    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    paths = list(walk(typer.main.get_command(app), []))
    assert len(paths) > 20  # every command and group, not a few
    missing = [" ".join(p) for p in paths if "Example" not in runner.invoke(app, [*p, "--help"]).stdout]
    assert missing == []


def test_spend_of_another_team_with_a_team_token_says_whose_token_it_is(remote: tuple[SchedulerService, str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    service, _ = remote
    service.create_team(ADMIN, TeamCreate(name="ops"))
    monkeypatch.delenv("GPUPLAN_ADMIN_TOKEN")  # only team ml's token
    result = runner.invoke(app, ["report", "spend", "--team", "ops"])
    assert result.exit_code != 0
    said = " ".join(result.stderr.split())
    assert "this is team ml's token, not team ops's" in said and "use a token of team ops, or the admin token" in said
    assert "manage teams" not in said


def test_a_local_command_adds_no_default_team_to_a_servers_database(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    store = Store(url)
    store.migrate()
    SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt")).create_team(
        ADMIN, TeamCreate(name="ml"))
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_TEAM", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPLAN_DATABASE_URL", url)
    for command in (["list"], ["submit", write_spec(tmp_path, tokens=1e6)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 4, result.output
        said = " ".join(result.stderr.split())
        assert "which is a server's (its teams: ml)" in said and "set GPUPLAN_TEAM to your team" in said
    admin = SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt"))
    assert [t.name for t in admin.list_teams(ADMIN)] == ["ml"]
    monkeypatch.setenv("GPUPLAN_TEAM", "ml")  # acting as a team that is there works
    assert runner.invoke(app, ["list"]).exit_code == 0
    store.dispose()
