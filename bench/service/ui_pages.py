"""The dashboard (/ui) over a seeded database: server-side render time of every page, and screenshots.

    .venv/bin/python bench/service/ui_pages.py --db postgres --jobs 10000 --spend 50000 --requests 30
    .venv/bin/python bench/service/ui_pages.py --db sqlite --jobs 10000 --spend 50000 --requests 30
    .venv/bin/python bench/service/ui_pages.py --db sqlite --jobs 120 --spend 400 --screenshots docs/img
    .venv/bin/python bench/service/ui_pages.py --db postgres --api-ab 300   # the API with and without /ui mounted

Seeding: a few real submits per team (the real planner on the packaged catalog, examples/*.yaml),
then copies of those jobs in every state over the last 60 days with attempts, spend rows (one per
closed attempt, as the ledger writes them), events, log lines and predicted-vs-measured metrics,
inserted in bulk. Timing: each page requested ``--requests`` times through the real app in this
process (FastAPI's TestClient: the server's work, no network), p50/p95/max in ms.
Screenshots: a real uvicorn server on 127.0.0.1 and headless Chromium (tests/scheduler/webdriver.py).
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert, select  # noqa: E402

from catalog.loader import load_catalog  # noqa: E402
from commands.specfile import load_spec  # noqa: E402
from scheduler.api import create_app  # noqa: E402
from scheduler.composition import catalog_planner  # noqa: E402
from scheduler.service import ADMIN, SchedulerService  # noqa: E402
from scheduler.store import ledger  # noqa: E402
from scheduler.store.database import Store  # noqa: E402
from scheduler.store.models import Attempt, Event, Job, JobCreate, JobLog, Spend, TeamCreate, TeamUpdate  # noqa: E402
from tests.pg import PG_URL, drop_pg_schema, new_pg_schema  # noqa: E402

ADMIN_TOKEN = "bench-admin"
TEAMS = {"ml": 4_500.0, "research": 2_000.0, "infra": None}
EXAMPLES = ["llama3-8b-sft.yaml", "mixtral-qlora.yaml", "llama3-70b-lora.yaml", "llama3-8b-serve.yaml"]
STATES = ["succeeded"] * 6 + ["failed", "cancelled", "running", "queued", "preempted"]


def make_store(db: str, reuse: str | None = None) -> tuple[Store, str | None]:
    if reuse is not None:  # a database seeded by an earlier --keep run
        if db == "sqlite":
            return Store(f"sqlite:///{reuse}"), None
        store = Store(f"{PG_URL}?options=-csearch_path%3D{reuse}")
        store.migrate()  # a new revision since the seed (an index) applies to it
        vacuum_analyze(store)
        return store, reuse
    if db == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="gpuplan-ui-")) / "gpuplan.db"
        store = Store(f"sqlite:///{path}")
        store.migrate()
        return store, None
    schema, url = new_pg_schema("ui_bench")
    store = Store(url)
    store.migrate()
    return store, schema


def seed(service: SchedulerService, n_jobs: int, n_spend: int, rng: random.Random) -> dict[str, str]:
    """Teams with tokens, real submits, then bulk copies; returns {team: token}."""
    tokens = {}
    for name in TEAMS:
        service.create_team(ADMIN, TeamCreate(name=name))
        tokens[name] = service.create_token(ADMIN, name, "bench").token
    templates: dict[str, list[str]] = {}
    for name in TEAMS:
        who = service.team_principal(name)
        for example in EXAMPLES:
            spec = load_spec(ROOT / "examples" / example).model_dump(mode="json")
            job = service.submit(who, JobCreate(spec=spec))
            templates.setdefault(name, []).append(job.id)
    with service.store.read() as session:
        rows = {j.id: j for j in session.execute(select(Job)).scalars()}
        base = {k: {c.name: getattr(v, c.name) for c in Job.__table__.columns}  # type: ignore[attr-defined]
                for k, v in rows.items()}
    now = datetime.now(UTC)
    jobs, attempts, spend, events, logs = [], [], [], [], []
    team_ids = {name: service.team_principal(name).team_id for name in TEAMS}
    names = list(TEAMS)
    # runs ~ uniform 1..k, mean (k+1)/2; every state but queued has runs, a running job's last one is
    # still open: spend rows ~ n_jobs * ((1 - q) * (k+1)/2 - r), q and r the queued and running shares
    queued, running = STATES.count("queued") / len(STATES), STATES.count("running") / len(STATES)
    per_job_attempts = max(1, round(2 * (n_spend / max(n_jobs, 1) + running) / (1 - queued) - 1))
    attempt_id = 1
    for i in range(n_jobs):
        team = names[i % len(names)] if i % 5 else "ml"
        src = base[rng.choice(templates[team])]
        state = rng.choice(STATES)
        created = now - timedelta(days=60 * (1 - i / n_jobs), minutes=rng.randrange(60))
        job_id = f"j-{secrets.token_hex(8)}"
        hours = max(src["estimated_hours"], 0.05)
        row = dict(src) | {"id": job_id, "name": f"{src['name']}-{i:05d}", "state": state, "created_at": created,
                           "updated_at": created, "team_id": team_ids[team], "idempotency_key": None,
                           "checkpoint_uri": f"/ckpt/{job_id}", "message": ""}
        runs = 0 if state == "queued" else rng.randint(1, per_job_attempts)
        row["attempts"] = runs
        start = created + timedelta(minutes=5)
        row["started_at"] = start if runs else None
        for k in range(1, runs + 1):
            live = state == "running" and k == runs
            dur = hours * rng.uniform(0.2, 1.0) / runs
            end = None if live else min(start + timedelta(hours=dur), now)
            last = k == runs
            outcome = None if live else ("succeeded" if last and state == "succeeded" else
                                         "failed" if last and state == "failed" else "preempted")
            metrics = None
            if outcome == "succeeded":
                predicted = src["plan"].prediction()
                measured = {"peak_allocated_bytes": (predicted.peak_allocated_bytes or 0) * rng.uniform(0.97, 1.04),
                            "peak_reserved_bytes": (predicted.peak_reserved_bytes or 0) * rng.uniform(0.95, 1.1),
                            "tokens_per_s": (predicted.tokens_per_s or 0) * rng.uniform(0.85, 1.1)}
                metrics = {"measured": measured, "predicted": predicted.record(), "oom_backoffs": []}
            attempts.append({"id": attempt_id, "job_id": job_id, "number": k, "handle": f"h-{job_id}-{k}",
                             "market": src["market"], "usd_per_h": src["usd_per_h"], "started_at": start,
                             "last_seen_at": end or now, "ended_at": end, "outcome": outcome, "message": "",
                             "metrics": metrics})
            if end is not None:
                spend.append({"team_id": team_ids[team], "job_id": job_id, "attempt_id": attempt_id,
                              "market": src["market"], "usd_per_h": src["usd_per_h"],
                              "hours": (end - start).total_seconds() / 3600,
                              "usd": src["usd_per_h"] * (end - start).total_seconds() / 3600, "recorded_at": end})
            attempt_id += 1
            start = (end or now) + timedelta(minutes=3)
        if state in ("succeeded", "failed", "cancelled"):
            row["finished_at"] = start
        jobs.append(row)
        moves = [(None, "pending"), ("pending", "planned"), ("planned", "queued")]
        if runs:
            moves.append(("queued", "running"))
        if state not in ("queued", "running"):
            moves.append(("running", state))
        for seq, (a, b) in enumerate(moves):
            events.append({"job_id": job_id, "from_state": a, "to_state": b, "at": created, "reason": "bench seed"})
            logs.append({"job_id": job_id, "seq": seq, "attempt_id": None,
                         "line": f"{created:%Y-%m-%dT%H:%M:%SZ} {a or '-'} -> {b}: bench seed"})
    with service.store.write() as session:
        # explicit attempt ids (spend rows point at them); the real submits made no attempts
        for table, rows_ in ((Job, jobs), (Attempt, attempts), (Spend, spend), (Event, events), (JobLog, logs)):
            for chunk in range(0, len(rows_), 2000):
                session.execute(insert(table.__table__), rows_[chunk:chunk + 2000])  # type: ignore[union-attr]
        ledger.rebuild_days(session)  # the rows went around the ledger: sum them into spend_day as 0008 does
    for name, budget in TEAMS.items():
        if budget is not None:
            service.update_team(ADMIN, name, TeamUpdate(budget_usd=budget))
    if service.store.dialect == "postgresql":
        vacuum_analyze(service.store)
    print(f"seeded {len(jobs)} jobs, {len(attempts)} attempts, {len(spend)} spend rows, {len(logs)} log lines",
          file=sys.stderr)
    return tokens


def vacuum_analyze(store: Store) -> None:
    """Fresh statistics and visibility map, as autovacuum keeps them on a live database (since
    PostgreSQL 13 it also vacuums after inserts): without them the planner misjudges the fresh
    bulk insert and no index-only scan can skip the table."""
    from sqlalchemy import text

    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))


def sign_in(client: Any, token: str) -> None:
    import re

    page = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    assert client.post("/ui/login", data={"token": token, "csrf": csrf}, follow_redirects=False).status_code == 303


def time_pages(app: Any, tokens: dict[str, str], service: SchedulerService, requests: int,
               only: str = "") -> list[tuple[str, ...]]:
    import re

    from fastapi.testclient import TestClient

    team = TestClient(app, base_url="https://testserver")
    sign_in(team, tokens["ml"])
    admin = TestClient(app, base_url="https://testserver")
    sign_in(admin, ADMIN_TOKEN)
    ml = service.team_principal("ml")
    job = next(j for j in service.list_jobs(ml, state="succeeded", limit=1))
    spec_text = (ROOT / "examples" / EXAMPLES[0]).read_text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', team.get("/ui/plan").text).group(1)  # type: ignore[union-attr]
    pages: list[tuple[str, Any, str, dict[str, str] | None]] = [
        ("jobs (team)", team, "/ui/jobs", None),
        ("jobs page 40", team, "/ui/jobs?page=40", None),
        ("jobs state=failed", team, "/ui/jobs?state=failed", None),
        ("jobs search", team, "/ui/jobs?q=sft-00", None),
        ("job detail", team, f"/ui/jobs/{job.id}", None),
        ("job log (live tail)", team, f"/ui/jobs/{job.id}/log?since=0", None),
        ("spend 30d by day", team, "/ui/spend", None),
        ("spend 90d by week", team, "/ui/spend?since=90d&period=week", None),
        ("plan (form)", team, "/ui/plan", None),
        ("plan (POST, cached)", team, "/ui/plan", {"spec": spec_text, "csrf": csrf}),
        ("accuracy", team, "/ui/accuracy", None),
        ("admin", admin, "/ui/admin", None),
        ("spend, every team (admin)", admin, "/ui/spend", None),
        ("jobs (admin, team)", admin, "/ui/jobs?team=research", None),
    ]
    out: list[tuple[str, ...]] = []
    for label, client, path, form in pages:
        if only not in label:
            continue
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            resp = client.post(path, data=form) if form else client.get(path)
            times.append((time.perf_counter() - t0) * 1000)
            assert resp.status_code == 200, (label, resp.status_code, resp.text[:300])
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        out.append((label, path, f"{statistics.median(times):.1f}", f"{p95:.1f}", f"{times[-1]:.1f}"))
        print(f"{label:28s} p50 {out[-1][2]:>7s} ms  p95 {out[-1][3]:>7s} ms  max {out[-1][4]:>7s} ms", file=sys.stderr)
    return out


def api_with_and_without_ui(service: SchedulerService, catalog: Any, token: str, requests: int) -> list[str]:
    """The API's hot reads through the app as served (dashboard mounted at /ui) and through the same
    app with the /ui mount taken out, alternating request by request: what mounting costs the API."""
    from fastapi.testclient import TestClient

    mounted = create_app(service, catalog)
    bare = create_app(service, catalog)
    bare.router.routes = [r for r in bare.router.routes if getattr(r, "path", "") != "/ui"]
    headers = {"Authorization": f"Bearer {token}"}
    clients = {"mounted": TestClient(mounted, headers=headers), "bare": TestClient(bare, headers=headers)}
    assert clients["mounted"].get("/ui/login").status_code == 200
    assert clients["bare"].get("/ui/login").status_code == 404
    job_id = clients["bare"].get("/v1/jobs?limit=1").json()[0]["id"]
    lines = ["| API request | /ui mounted p50 / p95 ms | without /ui p50 / p95 ms |", "|---|---:|---:|"]
    for path in ("/v1/jobs?limit=20", f"/v1/jobs/{job_id}"):
        times: dict[str, list[float]] = {"mounted": [], "bare": []}
        for _ in range(requests):
            for name, client in clients.items():
                t0 = time.perf_counter()
                assert client.get(path).status_code == 200
                times[name].append((time.perf_counter() - t0) * 1000)
        cells = []
        for name in ("mounted", "bare"):
            xs = sorted(times[name])
            cells.append(f"{statistics.median(xs):.1f} / {xs[round(0.95 * (len(xs) - 1))]:.1f}")
        label = path if "limit" in path else "/v1/jobs/{id}"
        lines.append(f"| GET `{label}` | {cells[0]} | {cells[1]} |")
    return lines


def screenshots(app: Any, tokens: dict[str, str], service: SchedulerService, out: Path) -> None:
    from tests.scheduler.server import serve
    from tests.scheduler.webdriver import chromium

    ml = service.team_principal("ml")
    job = next(j for j in service.list_jobs(ml, state="succeeded", limit=5) if j.attempts > 1)
    out.mkdir(parents=True, exist_ok=True)
    with serve(app) as url, chromium(width=1280, height=900) as b:
        b.get(f"{url}/ui/login")
        b.type("input[name=token]", tokens["ml"])
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "sign-in")
        for name, path in (("jobs", "/ui/jobs"), ("job", f"/ui/jobs/{job.id}"), ("spend", "/ui/spend?since=60d"),
                           ("accuracy", "/ui/accuracy")):
            b.set_window(1280, 900)
            b.get(url + path)
            b.screenshot(out / f"ui-{name}.png")
        b.set_window(1280, 900)
        b.get(f"{url}/ui/plan")
        b.type("textarea[name=spec]", (ROOT / "examples" / EXAMPLES[0]).read_text())
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.find_all("#plan-table"), "the plan")
        b.screenshot(out / "ui-plan.png")
        b.set_window(1280, 900)
        b.click("header form.who button")
        b.wait_for(lambda: "/ui/login" in b.url, "sign-out")
        b.type("input[name=token]", ADMIN_TOKEN)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "admin sign-in")
        for name, path in (("admin", "/ui/admin"), ("spend-teams", "/ui/spend?since=60d")):
            b.set_window(1280, 900)
            b.get(url + path)
            b.screenshot(out / f"ui-{name}.png")
    with serve(app) as url, chromium(width=412, height=900) as b:  # a phone
        b.get(f"{url}/ui/login")
        b.type("input[name=token]", tokens["ml"])
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "sign-in")
        b.get(f"{url}/ui/spend")
        b.screenshot(out / "ui-phone-spend.png", full_page=False)
    print(f"screenshots in {out}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--spend", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--screenshots", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true",
                        help="keep the seeded database (PostgreSQL schema or SQLite file) and print its name")
    parser.add_argument("--reuse", metavar="NAME", default=None,
                        help="time a database an earlier --keep run seeded (skips seeding; implies --keep)")
    parser.add_argument("--only", metavar="TEXT", default="", help="time only the pages whose label contains TEXT")
    parser.add_argument("--api-ab", type=int, metavar="N", default=0,
                        help="instead of the pages: N API reads each with and without the /ui mount, alternating")
    args = parser.parse_args()
    store, schema = make_store(args.db, args.reuse)
    keep = args.keep or args.reuse is not None
    try:
        catalog = load_catalog()
        service = SchedulerService(store, catalog_planner(catalog), checkpoint_root="/tmp/ckpt",
                                   admin_token=ADMIN_TOKEN)
        t0 = time.perf_counter()
        if args.reuse is None:
            tokens = seed(service, args.jobs, args.spend, random.Random(args.seed))
            print(f"seeding took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        else:
            tokens = {name: service.create_token(ADMIN, name, "bench").token for name in TEAMS}
        if keep:
            print(f"database kept: --reuse {schema or store.url.removeprefix('sqlite:///')}", file=sys.stderr)
        app = create_app(service, catalog)
        if args.screenshots is not None:
            screenshots(app, tokens, service, args.screenshots)
            return
        if args.api_ab:
            print("\n".join(api_with_and_without_ui(service, catalog, tokens["ml"], args.api_ab)))
            return
        rows = time_pages(app, tokens, service, args.requests, args.only)
        print(f"\n{args.db}, {args.jobs} jobs, {args.spend} spend rows (target), {args.requests} requests per page\n")
        print("| page | path | p50 ms | p95 ms | max ms |\n|---|---|---:|---:|---:|")
        for label, path, p50, p95, worst in rows:
            print(f"| {label} | `{path.split('?')[0] if 'j-' in path else path}` | {p50} | {p95} | {worst} |")
    finally:
        store.dispose()
        if schema and not keep:
            drop_pg_schema(schema)


if __name__ == "__main__":
    main()
