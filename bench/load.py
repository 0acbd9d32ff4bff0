"""Load test of the scheduler API: a real `gpuplan server` process on 127.0.0.1 (API only, no
executor) and this process as the load generator (asyncio + httpx, N concurrent clients).

    .venv/bin/python bench/load.py --db sqlite --clients 8 --duration 20
    .venv/bin/python bench/load.py --db postgres --clients 8 --duration 20
    .venv/bin/python bench/load.py --db sqlite --submits 1000

Mixed traffic: 20% submit (real planner; a few spec variants, so after the first of each the
service's plan cache answers), 40% status of a random own job, 40% list (limit 20). The
``--submits`` mode fires N concurrent submits, each with its own idempotency key, retried on
any error or timeout (a fraction deliberately sent twice), then counts the team's jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"
PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def spec(i: int) -> dict[str, Any]:
    return {"name": f"load-{i % 4}", "task": "train", "model": "llama-3-8b",
            "train": {"tokens": [1e8, 2e8, 5e8, 1e9][i % 4], "seq_len": 4096},
            "resources": {"spot": "auto"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db_url: str, port: int, home: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPLAN_DATABASE_URL": db_url, "GPUPLAN_HOME": str(home), "GPUPLAN_ADMIN_TOKEN": ADMIN}
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "server", "--port", str(port), "--executor", "none"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(home / "server.log", "wb"))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit((home / "server.log").read_text())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def pg_url() -> tuple[str, str]:
    from sqlalchemy import create_engine, text

    schema = f"bench_{secrets.token_hex(4)}"
    engine = create_engine(PG)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()
    return schema, f"{PG}?options=-csearch_path%3D{schema}"


def drop_pg(schema: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


def setup_team(url: str) -> str:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as admin:
        admin.post("/v1/teams", json={"name": "load"}).raise_for_status()
        token = admin.post("/v1/teams/load/tokens").json()["token"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        for i in range(4):  # warm the plan cache: planning is not what this measures
            c.post("/v1/jobs", json={"spec": spec(i)}).raise_for_status()
    return str(token)


async def mixed(url: str, token: str, clients: int, duration: float) -> dict[str, Any]:
    latencies: dict[str, list[float]] = {"submit": [], "status": [], "list": []}
    errors = 0
    job_ids: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                 limits=limits) as c:
        job_ids.extend(j["id"] for j in (await c.get("/v1/jobs")).json())
        stop = time.perf_counter() + duration

        async def client(n: int) -> None:
            nonlocal errors
            rng = random.Random(n)
            i = 0
            while time.perf_counter() < stop:
                i += 1
                roll = rng.random()
                t0 = time.perf_counter()
                if roll < 0.2:
                    kind = "submit"
                    r = await c.post("/v1/jobs", json={"spec": spec(i), "idempotency_key": f"{n}-{i}"})
                    if r.status_code == 201:
                        job_ids.append(r.json()["id"])
                elif roll < 0.6:
                    kind = "status"
                    r = await c.get(f"/v1/jobs/{rng.choice(job_ids)}")
                else:
                    kind = "list"
                    r = await c.get("/v1/jobs", params={"limit": 20})
                latencies[kind].append(time.perf_counter() - t0)
                if r.status_code >= 400:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(clients)))
        elapsed = time.perf_counter() - t0
    every = sorted(x for v in latencies.values() for x in v)

    def pct(xs: list[float], p: float) -> float:
        return 1000 * xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")

    return {
        "requests": len(every), "seconds": elapsed, "rps": len(every) / elapsed, "errors": errors,
        "p50_ms": pct(every, 0.50), "p99_ms": pct(every, 0.99),
        "by_kind": {k: {"n": len(v), "p50_ms": pct(sorted(v), 0.5), "p99_ms": pct(sorted(v), 0.99),
                        "mean_ms": 1000 * statistics.fmean(v) if v else float("nan")} for k, v in latencies.items()},
    }


async def burst(url: str, token: str, n: int, concurrency: int) -> dict[str, Any]:
    """n concurrent submits with idempotency keys, each retried until it gets an answer."""
    retries = 0
    duplicates_sent = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10,
                                 limits=limits) as c:
        before = len((await c.get("/v1/jobs", params={"limit": 1000})).json())

        async def one(i: int) -> str:
            nonlocal retries, duplicates_sent
            body = {"spec": spec(i), "idempotency_key": f"burst-{i}"}
            sends = 2 if i % 10 == 0 else 1  # every tenth client "lost the reply" and sends again
            ids = set()
            for _ in range(sends):
                for attempt in range(20):
                    try:
                        r = await c.post("/v1/jobs", json=body)
                        if r.status_code == 201:
                            ids.add(r.json()["id"])
                            break
                    except httpx.HTTPError:
                        pass
                    retries += 1
                    await asyncio.sleep(0.05 * 2 ** min(attempt, 5))
            duplicates_sent += sends - 1
            assert len(ids) == 1, f"key burst-{i} gave {ids}"
            return ids.pop()

        t0 = time.perf_counter()
        ids = await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - t0
        after: list[str] = []
        offset = 0
        while True:
            page = (await c.get("/v1/jobs", params={"limit": 1000, "offset": offset})).json()
            after += [j["id"] for j in page]
            offset += len(page)
            if len(page) < 1000:
                break
    return {"submits": n, "distinct_ids": len(set(ids)), "jobs_created": len(after) - before,
            "retries": retries, "duplicates_sent": duplicates_sent, "seconds": elapsed, "rps": n / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="sqlite", help="sqlite | postgres | a database URL")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--submits", type=int, default=0, help="burst mode: this many concurrent submits")
    ap.add_argument("--concurrency", type=int, default=64, help="connections in burst mode")
    args = ap.parse_args()
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuplan-load-{secrets.token_hex(3)}"
    home.mkdir(parents=True)
    schema = None
    if args.db == "sqlite":
        db_url = f"sqlite:///{home / 'load.db'}"
    elif args.db == "postgres":
        schema, db_url = pg_url()
    else:
        db_url = args.db
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(db_url, port, home)
    try:
        token = setup_team(url)
        if args.submits:
            result = asyncio.run(burst(url, token, args.submits, args.concurrency))
        else:
            result = asyncio.run(mixed(url, token, args.clients, args.duration))
        result.update(db=args.db if args.db in ("sqlite", "postgres") else "url", clients=args.clients)
        print(json.dumps(result, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if schema:
            drop_pg(schema)


if __name__ == "__main__":
    main()
