"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver) against a real
uvicorn server on 127.0.0.1: sign in, a team's jobs, the live log tail, cancel, plan from a pasted
spec, spend equal to `gpuplan report spend --json`, sign out. Skipped where Chromium is missing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli import app as cli_app
from tests.scheduler.server import serve
from tests.scheduler.ui_world import ADMIN_TOKEN, World, catalog, world
from tests.scheduler.webdriver import browser_missing, chromium

__all__ = ["catalog", "world"]  # fixtures

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=browser_missing() or "")

SPEC = "name: pasted\ntask: train\nmodel: llama-3-8b\ntrain:\n  tokens: 3.0e6\n"


def test_a_team_in_the_browser(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    alpha = world.tokens["alpha"]
    with serve(world.app) as url, chromium() as b:  # type: ignore[arg-type]
        # sign in: the protected page sends us to the form and back
        b.get(f"{url}/ui/jobs")
        assert "/ui/login" in b.url
        b.type("input[name=token]", alpha)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "the jobs page after sign-in")
        page = b.text()
        assert world.jobs["finetune-a"] in page and world.jobs["evil"] in page
        assert world.jobs["beta-job"] not in page
        assert b.script("return document.cookie") == ""  # HttpOnly: no script can read the session

        # the live log tail: new lines appear without a reload
        job = world.jobs["evil"]
        b.get(f"{url}/ui/jobs/{job}")
        assert "attempt 1" not in b.text("#log")
        world.loop.tick()  # the loop starts an attempt: its header and executor lines are appended
        b.wait_for(lambda: "--- attempt 1" in b.text("#log"), "the new attempt's lines in the log tail")
        world.loop.tick()  # the next tick copies the attempt's executor lines
        b.wait_for(lambda: "line 2" in b.text("#log"), "the executor's lines in the log tail")

        # cancel, through the confirmation
        b.click("a.button.danger")
        assert "cannot be undone" in b.text()
        b.type("input[name=reason]", "<script>alert(1)</script>")
        b.click("button.danger")
        b.wait_for(lambda: b.url.endswith(f"/ui/jobs/{job}"), "the job page after cancel")
        assert "cancelled" in b.text(".state")
        assert "<script>alert(1)</script>" in b.text()  # shown as text, never run
        assert b.script("return document.querySelectorAll('main script').length") == 0

        # plan from a pasted spec
        b.get(f"{url}/ui/plan")
        b.type("textarea[name=spec]", SPEC)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.find_all("#plan-table"), "the plan table")
        assert "p5.48xlarge" in b.text("#plan-table") and b.find_all("svg.plot")

        # spend: the numbers `gpuplan report spend --json` prints for this team
        monkeypatch.setenv("GPUPLAN_API_URL", url)
        monkeypatch.setenv("GPUPLAN_TOKEN", alpha)
        monkeypatch.delenv("GPUPLAN_ADMIN_TOKEN", raising=False)
        result = CliRunner().invoke(cli_app, ["report", "spend", "--since", "30d", "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        b.get(f"{url}/ui/spend?since=30d")
        shown = b.script("""return {total: document.querySelector('#spend-total b').dataset.usd,
            remaining: document.getElementById('remaining').dataset.usd,
            markets: Object.fromEntries([...document.querySelectorAll('[data-market]')]
                .map(e => [e.dataset.market, e.dataset.usd]))}""")
        assert float(shown["total"]) == pytest.approx(report["total_usd"])
        assert float(shown["remaining"]) == pytest.approx(report["remaining_usd"])
        assert {m: float(v) for m, v in shown["markets"].items()} == pytest.approx(report["by_market"])
        assert report["total_usd"] > 0

        # sign out: the session is gone
        b.click("header form.who button")
        b.wait_for(lambda: "/ui/login" in b.url, "the sign-in page after sign-out")
        b.get(f"{url}/ui/jobs")
        assert "/ui/login" in b.url


def test_the_admin_in_the_browser(world: World) -> None:
    with serve(world.app) as url, chromium(width=412, height=900) as b:  # type: ignore[arg-type]  # a phone
        b.get(f"{url}/ui/login")
        b.type("input[name=token]", ADMIN_TOKEN)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "the jobs page after sign-in")
        b.get(f"{url}/ui/admin")
        assert "alpha" in b.text() and "beta" in b.text()
        # every page fits a phone's width (wide tables scroll inside their own box)
        for page in ("/ui/admin", "/ui/jobs?team=alpha", f"/ui/jobs/{world.jobs['finetune-a']}?team=alpha",
                     "/ui/spend", "/ui/spend?team=alpha", "/ui/plan", "/ui/accuracy?team=alpha"):
            b.get(url + page)
            widths = b.script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert widths[0] <= widths[1] + 1, (page, widths)
        b.get(f"{url}/ui/jobs?team=beta")
        assert world.jobs["beta-job"] in b.text()
