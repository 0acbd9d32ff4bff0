"""Load test of the scheduler API: a real `gpuplan server` process on 127.0.0.1 (API only, no
executor) and load-generating processes (keep-alive connections, see _client_proc), httpx for setup and the
submit burst.

    .venv/bin/python bench/service/load.py --db sqlite --procs 2 --threads 4 --duration 20
    .venv/bin/python bench/service/load.py --db postgres --procs 2 --threads 4 --duration 20
    .venv/bin/python bench/service/load.py --db sqlite --submits 1000

Mixed traffic: 20% submit (real planner; a few spec variants, so after the first of each the
service's plan cache answers), 40% status of a random own job, 40% list (limit 20). The
``--submits`` mode fires N concurrent submits, each with its own idempotency key, retried on
any error or timeout (a fraction deliberately sent twice), then counts the team's jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.net import free_port  # noqa: E402
from tests.pg import drop_pg_schema, new_pg_schema  # noqa: E402

ADMIN = "bench-admin"


def spec(i: int) -> dict[str, Any]:
    return {"name": f"load-{i % 4}", "task": "train", "model": "llama-3-8b",
            "train": {"tokens": [1e8, 2e8, 5e8, 1e9][i % 4], "seq_len": 4096},
            "resources": {"spot": "auto"}}


def start_server(db_url: str, port: int, home: Path, workers: int = 1) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPLAN_DATABASE_URL": db_url, "GPUPLAN_HOME": str(home), "GPUPLAN_ADMIN_TOKEN": ADMIN}
    with open(home / "server.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "server", "--port", str(port),
                                 "--executor", "none", "--workers", str(workers)],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
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


def setup_team(url: str) -> str:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as admin:
        admin.post("/v1/teams", json={"name": "load"}).raise_for_status()
        token = admin.post("/v1/teams/load/tokens").json()["token"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        for i in range(4):  # warm the plan cache: planning is not what this measures
            c.post("/v1/jobs", json={"spec": spec(i)}).raise_for_status()
    return str(token)


def _client_proc(port: int, token: str, threads: int, duration: float, seed: int, job_ids: list[str],
                 out: Any) -> None:
    """One load-generating process: ``threads`` keep-alive connections through http.client.

    http.client, not httpx, on this hot path: on this 2-core box httpx's own per-request CPU made
    the client the bottleneck (static /docs: 49 req/s with httpx.AsyncClient, 339 with sync httpx
    in threads, 2,195 with a bare socket), so it measured the client, not the server.
    """
    import http.client
    import threading

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    results: list[tuple[str, float, int]] = []
    lock = threading.Lock()
    stop = time.perf_counter() + duration

    def worker(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[tuple[str, float, int]] = []
        ids = list(job_ids)
        i = 0
        while time.perf_counter() < stop:
            i += 1
            roll = rng.random()
            t0 = time.perf_counter()
            if roll < 0.2:
                kind = "submit"
                body = json.dumps({"spec": spec(i), "idempotency_key": f"{seed}-{n}-{i}"})
                conn.request("POST", "/v1/jobs", body=body, headers=headers)
            elif roll < 0.6:
                kind = "status"
                conn.request("GET", f"/v1/jobs/{rng.choice(ids)}", headers=headers)
            else:
                kind = "list"
                conn.request("GET", "/v1/jobs?limit=20", headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            mine.append((kind, time.perf_counter() - t0, resp.status))
            if kind == "submit" and resp.status == 201:
                ids.append(json.loads(data)["id"])
        with lock:
            results.extend(mine)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.send(results)


def mixed(url: str, token: str, procs: int, threads: int, duration: float) -> dict[str, Any]:
    import multiprocessing as mp

    port = int(url.rsplit(":", 1)[1])
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        job_ids = [j["id"] for j in c.get("/v1/jobs").json()]
    ctx = mp.get_context("fork")
    pipes, workers = [], []
    t0 = time.perf_counter()
    for p in range(procs):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client_proc, args=(port, token, threads, duration, p, job_ids, send))
        proc.start()
        pipes.append(recv)
        workers.append(proc)
    results = [r for pipe in pipes for r in pipe.recv()]
    for proc in workers:
        proc.join()
    elapsed = time.perf_counter() - t0
    errors = sum(1 for _k, _t, status in results if status >= 400)

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    every = [t for _k, t, _s in results]
    by_kind = {}
    for kind in ("submit", "status", "list"):
        xs = [t for k, t, _s in results if k == kind]
        by_kind[kind] = {"n": len(xs), "p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99),
                         "mean_ms": 1000 * statistics.fmean(xs) if xs else float("nan")}
    return {"requests": len(results), "seconds": elapsed, "rps": len(results) / elapsed, "errors": errors,
            "p50_ms": pct(every, 0.50), "p99_ms": pct(every, 0.99), "by_kind": by_kind}


def burst(url: str, token: str, n: int, concurrency: int) -> dict[str, Any]:
    """n submits from ``concurrency`` threads, each with its own idempotency key, retried until answered;
    every tenth is sent twice (a client that lost the reply)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    local = threading.local()
    counts = {"retries": 0, "duplicates_sent": 0}
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"}

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, headers=headers, timeout=10)
        return local.client  # type: ignore[no-any-return]

    def one(i: int) -> str:
        body = {"spec": spec(i), "idempotency_key": f"burst-{i}"}
        sends = 2 if i % 10 == 0 else 1
        ids: set[str] = set()
        for _ in range(sends):
            for attempt in range(20):
                try:
                    r = client().post("/v1/jobs", json=body)
                    if r.status_code == 201:
                        ids.add(r.json()["id"])
                        break
                except httpx.HTTPError:
                    pass
                with lock:
                    counts["retries"] += 1
                time.sleep(0.05 * 2 ** min(attempt, 5))
        with lock:
            counts["duplicates_sent"] += sends - 1
        assert len(ids) == 1, f"key burst-{i} gave {ids}"
        return ids.pop()

    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        before = len(c.get("/v1/jobs", params={"limit": 1000}).json())
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            ids = list(pool.map(one, range(n)))
        elapsed = time.perf_counter() - t0
        after: list[str] = []
        offset = 0
        while True:
            page = c.get("/v1/jobs", params={"limit": 1000, "offset": offset}).json()
            after += [j["id"] for j in page]
            offset += len(page)
            if len(page) < 1000:
                break
    return {"submits": n, "distinct_ids": len(set(ids)), "jobs_created": len(after) - before, **counts,
            "seconds": elapsed, "rps": (n + counts["duplicates_sent"]) / elapsed}


def dashboard_is_mounted(url: str) -> bool:
    """The server answers the dashboard's sign-in page: the API's numbers are with /ui mounted."""
    page = httpx.get(f"{url}/ui/login", timeout=10)
    return page.status_code == 200 and 'name="csrf"' in page.text


def table(paths: list[str]) -> str:
    """Markdown tables of recorded runs (JSON lines of this script's output plus an ``at`` time)."""
    runs = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    mixed_rows = ["| at (UTC) | database | API workers | req/s | p50 ms | p99 ms | submit / status / list p99 ms "
                  "| errors | load avg 1m | /ui mounted |", "|---|---|---|---|---|---|---|---|---|---|"]
    burst_rows = ["| at (UTC) | database | API workers | submits | re-sent | jobs created | distinct ids | seconds "
                  "| submits/s | load avg 1m |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        workers = r.get("server_workers", 1)
        if "submits" in r:
            burst_rows.append(f"| {r.get('at', '')} | {r['db']} | {workers} | {r['submits']} | {r['duplicates_sent']} "
                              f"| {r['jobs_created']} | {r['distinct_ids']} | {r['seconds']:.1f} "
                              f"| {r['submits'] / r['seconds']:.0f} | {r['load_avg_1m']:.2f} |")
        else:
            kinds = " / ".join(f"{r['by_kind'][k]['p99_ms']:.0f}" for k in ("submit", "status", "list"))
            mixed_rows.append(f"| {r.get('at', '')} | {r['db']} | {workers} | {r['rps']:.0f} | {r['p50_ms']:.1f} "
                              f"| {r['p99_ms']:.1f} | {kinds} | {r['errors']} | {r['load_avg_1m']:.2f} "
                              f"| {'yes' if r.get('ui_mounted') else 'not checked'} |")
    parts = [mixed_rows] if len(mixed_rows) > 2 else []
    parts += [burst_rows] if len(burst_rows) > 2 else []
    return "\n\n".join("\n".join(rows) for rows in parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="sqlite", help="sqlite | postgres | a database URL")
    ap.add_argument("--procs", type=int, default=2, help="load-generating processes")
    ap.add_argument("--threads", type=int, default=4, help="keep-alive connections per process")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--submits", type=int, default=0, help="burst mode: this many concurrent submits")
    ap.add_argument("--concurrency", type=int, default=64, help="connections in burst mode")
    ap.add_argument("--server-workers", type=int, default=1,
                    help="API processes of the server (gpuplan server --workers)")
    ap.add_argument("--table", nargs="+", metavar="JSONL", help="print Markdown tables of recorded runs and exit")
    ap.add_argument("--record", type=Path, metavar="JSONL", help="also append the result, with its time, to JSONL")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuplan-load-{secrets.token_hex(3)}"
    home.mkdir(parents=True)
    schema = None
    if args.db == "sqlite":
        db_url = f"sqlite:///{home / 'load.db'}"
    elif args.db == "postgres":
        schema, db_url = new_pg_schema("bench")
    else:
        db_url = args.db
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(db_url, port, home, args.server_workers)
    try:
        token = setup_team(url)
        ui_mounted = dashboard_is_mounted(url)
        if args.submits:
            result = burst(url, token, args.submits, args.concurrency)
        else:
            result = mixed(url, token, args.procs, args.threads, args.duration)
        result.update(db=args.db if args.db in ("sqlite", "postgres") else "url",
                      clients=args.concurrency if args.submits else args.procs * args.threads,
                      server_workers=args.server_workers,
                      load_avg_1m=os.getloadavg()[0], ui_mounted=ui_mounted)
        print(json.dumps(result, indent=2))
        if args.record:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
            with args.record.open("a") as out:
                out.write(json.dumps({"at": at, **result}) + "\n")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if schema:
            drop_pg_schema(schema)


if __name__ == "__main__":
    main()
