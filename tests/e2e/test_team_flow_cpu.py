"""The README's team flow, command by command, on this machine with no GPU: `gpuplan server`,
`team create`, `team token`, `submit examples/tiny-train.yaml`; the job trains for real on the
server machine's CPU, planned there at $0/h."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.net import free_port
from tests.scheduler.server import start_process, wait_for

ROOT = Path(__file__).resolve().parents[2]


def gpuplan(*args: str, env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "cli.py", *args, "--json"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout)
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.slow
def test_the_readme_team_flow_trains_the_tiny_example_on_this_cpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the flow is meant for one without")
    port = free_port()
    env = {**os.environ, "GPUPLAN_HOME": str(tmp_path / "home"), "GPUPLAN_ADMIN_TOKEN": "s3cret"}
    env.pop("GPUPLAN_DATABASE_URL", None)
    server = start_process([sys.executable, "cli.py", "server", "--port", str(port)], port, tmp_path / "server.log",
                           cwd=ROOT, env=env, timeout=180)
    try:
        env["GPUPLAN_API_URL"] = f"http://127.0.0.1:{port}"
        gpuplan("team", "create", "ml", "--budget", "5000", "--quota", "16", env=env)
        token = gpuplan("team", "token", "ml", env=env)["token"]
        assert isinstance(token, str)
        env["GPUPLAN_TOKEN"] = token
        job = gpuplan("submit", "examples/tiny-train.yaml", env=env)
        assert (job["gpu"], job["usd_per_h"], job["estimated_usd"]) == ("cpu", 0.0, 0.0)
        api = httpx.Client(base_url=env["GPUPLAN_API_URL"], headers={"Authorization": f"Bearer {token}"}, timeout=60)
        # An upper bound for a loaded 2-core box; the job ends well before on an idle one.
        wait_for(lambda: api.get(f"/v1/jobs/{job['id']}").json()["state"] in ("succeeded", "failed"), 900,
                 "the tiny job to finish")
        status = gpuplan("status", str(job["id"]), env=env)
        lines = api.get(f"/v1/jobs/{job['id']}/logs").json()["lines"]
    finally:
        server.kill()
        server.wait()
    assert status["state"] == "succeeded", lines[-10:]
    assert any("step 64/64" in line for line in lines)
