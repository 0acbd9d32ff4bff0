"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver) against a real
uvicorn server on 127.0.0.1: sign in, a team's jobs, the live log tail, cancel, plan from a pasted
spec, spend equal to `gpuplan report spend --json`, sign out. Skipped where Chromium is missing."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import Catalog
from cli import app as cli_app
from scheduler.api import create_app
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.models import TEAM_NAME_PATTERN, TeamUpdate, team_name_error
from scheduler.ui import views
from tests.scheduler.server import serve
from tests.scheduler.ui_world import ADMIN_TOKEN, World, catalog, world
from tests.scheduler.webdriver import Browser, browser_missing, chromium
from workers.executors.protocol import RunState

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


# ---------------------------------------------------------------- issue 44: the dashboard's fixes
# One Chromium for all of them; each test a fresh world and server (the real catalog's planner).

# Every plotted value (a dot's centre, a line's or bar's extent) inside its plot's frame (so the axes
# hold every value), and every mark clear of the legend.
FIGURE_PROBLEMS = """
const problems = [];
const inside = (b, f) => b.x >= f.x - 1 && b.y >= f.y - 1 && b.x + b.width <= f.x + f.width + 1
    && b.y + b.height <= f.y + f.height + 1;
const overlap = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
for (const svg of document.querySelectorAll('svg.plot')) {
  const frame = svg.querySelector('.frame').getBBox();
  const legends = [...svg.querySelectorAll('.legend')].map(g => g.getBBox());
  for (const mark of svg.querySelectorAll('.data')) {
    const b = mark.getBBox();  // a dot's value is its centre: one on an axis may overhang the frame
    const at = mark.tagName === 'circle' ? {x: b.x + b.width / 2, y: b.y + b.height / 2, width: 0, height: 0} : b;
    const what = svg.getAttribute('aria-label') + ': ' + mark.outerHTML.slice(0, 120);
    if (!inside(at, frame)) problems.push('outside the frame: ' + what);
    if (legends.some(l => overlap(l, b))) problems.push('under the legend: ' + what);
  }
}
return problems;
"""

# How far a table's right-aligned (number and money) columns reach, and whether its box scrolls.
TABLE_FIT = """
const table = document.querySelector(arguments[0]);
const box = table.closest('.scroll');
const right = Math.max(...[...table.querySelectorAll('th.r')].map(th => th.getBoundingClientRect().right));
return {overflow: box.scrollWidth - box.clientWidth, right: right, view: document.documentElement.clientWidth};
"""

TYPO_SPECS = [("name: typo\ntask: train\nmodel: tiny-lama\ntrain:\n  tokens: 3.0e6\n", "tiny-lama"),
              ("name: typo\ntask: train\nmodel: llama-3-8b\ntrain:\n  tokens: 3.0e6\nresources:\n"
               "  regions: [us-eastt-1]\n", "us-eastt-1")]


def _fits(b: Browser, css: str, page: str) -> None:
    fit = b.script(TABLE_FIT, css)
    assert fit["overflow"] <= 1 and fit["right"] <= fit["view"] + 1, (page, css, fit)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for these tests; gpuplan.test is 127.0.0.1 under a name that is not loopback to
    the browser (so plain HTTP there is not a secure context)."""
    with chromium(args=("--host-resolver-rules=MAP gpuplan.test 127.0.0.1",)) as b:
        yield b


@dataclass
class Live:
    url: str
    service: SchedulerService  # the world's store, planning with the real catalog
    world: World
    b: Browser

    def sign_in(self, token: str) -> None:
        b = self.b
        b.set_window(1280, 900)
        b.get(f"{self.url}/ui/login")
        b.type("input[name=token]", token)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.url.endswith("/ui/jobs"), "the jobs page after sign-in")

    def plan(self, spec: str) -> None:
        b = self.b
        b.get(f"{self.url}/ui/plan")
        b.type("textarea[name=spec]", spec)
        b.click("form.stack button[type=submit]")
        b.wait_for(lambda: b.find_all("#plan-table") or b.find_all("#plan-error"), "the plan or its error")


@pytest.fixture
def live(world: World, catalog: Catalog, tmp_path: Path, browser: Browser) -> Iterator[Live]:
    from scheduler.composition import catalog_planner

    service = SchedulerService(world.service.store, catalog_planner(catalog), clock=world.clock,
                               checkpoint_root=str(tmp_path / "ckpt"), admin_token=ADMIN_TOKEN)
    with serve(create_app(service, catalog)) as url:
        yield Live(url, service, world, browser)


def _shot(b: Browser, name: str) -> None:
    """A screenshot to look at, where $GPUPLAN_UI_SHOTS names a folder."""
    if os.environ.get("GPUPLAN_UI_SHOTS"):
        b.screenshot(Path(os.environ["GPUPLAN_UI_SHOTS"]) / name)


def test_sign_in_over_plain_http_off_loopback_says_https_is_needed(live: Live) -> None:
    b = live.b
    remote = live.url.replace("127.0.0.1", "gpuplan.test")
    b.get(f"{remote}/ui/login")
    assert "needs HTTPS" in b.text("#needs-https")  # said before trying
    b.type("input[name=token]", live.world.tokens["alpha"])
    b.click("form.stack button[type=submit]")
    b.wait_for(lambda: b.find_all("#login-error"), "the sign-in error")
    assert "needs HTTPS" in b.text("#login-error") and "ssh -L" in b.text("#login-error")
    assert "CSRF" not in b.text()
    b.get(f"{live.url}/ui/login")  # loopback: nothing to say
    assert not b.script("return document.getElementById('needs-https').checkVisibility()")


def test_a_catalog_typo_is_shown_inline_and_the_spec_kept(live: Live) -> None:
    live.sign_in(live.world.tokens["alpha"])
    for spec, typo in TYPO_SPECS:
        live.plan(spec)
        assert typo in live.b.text("#plan-error") and "did you mean" in live.b.text("#plan-error")
        assert live.b.script("return document.querySelector('textarea[name=spec]').value") == spec


def test_the_pareto_plot_rings_the_chosen_option(live: Live) -> None:
    b, service = live.b, live.service
    live.sign_in(live.world.tokens["alpha"])
    live.plan(SPEC)
    chosen = service.plan(service.parse_spec(yaml.safe_load(SPEC))).chosen
    assert chosen is not None
    ring = b.script("""const c = document.querySelectorAll('svg.plot circle.chosen');
        return c.length === 1 ? [c[0].getAttribute('cx'), c[0].getAttribute('cy'), c[0].textContent] : null""")
    assert ring is not None and f"{chosen.cost.hours:,.2f} h, ${chosen.cost.usd:,.2f}" in ring[2]
    assert b.script("return [...document.querySelectorAll('svg.plot circle.data:not(.chosen)')].some("
                    "c => c.getAttribute('cx') === arguments[0] && c.getAttribute('cy') === arguments[1])",
                    ring[0], ring[1])  # on an option's own dot
    ticks = b.script("return ['x', 'y'].map(a => [...document.querySelectorAll('svg.plot text.tick.' + a)]"
                     ".map(t => t.textContent))")
    for labels in ticks:  # not one per decade: ticks between them too
        assert len(labels) >= 5 and any(label.lstrip("0.")[:1] not in ("1", "") for label in labels), ticks
    assert b.script(FIGURE_PROBLEMS) == []


def test_submit_posted_twice_makes_one_job(live: Live) -> None:
    b, alpha = live.b, live.service.team_principal("alpha")
    live.sign_in(live.world.tokens["alpha"])
    live.plan(SPEC)
    before = len(live.service.list_jobs(alpha, limit=100))
    landed = b.script("""const form = document.querySelector('form[action="/ui/plan/submit"]');
        return [0, 1].map(() => { const x = new XMLHttpRequest(); x.open('POST', form.action, false);
            x.send(new FormData(form)); return x.responseURL; })""")
    assert landed[0] == landed[1] and "/ui/jobs/j-" in landed[0], landed
    assert len(live.service.list_jobs(alpha, limit=100)) == before + 1


def test_the_job_page_follows_the_state_and_drops_cancel(live: Live) -> None:
    b, world = live.b, live.world
    live.sign_in(world.tokens["alpha"])
    job = world.jobs["evil"]
    b.get(f"{live.url}/ui/jobs/{job}")
    assert b.text("#job-state") == "queued" and b.find_all("#cancel")
    world.loop.tick()  # starts it
    b.wait_for(lambda: b.text("#job-state") == "running", "the state badge to say running")
    world.executor.finish(world.executor.handle_of(job), RunState.SUCCEEDED)
    world.loop.tick()
    b.wait_for(lambda: b.text("#job-state") == "succeeded", "the state badge to say succeeded")
    b.wait_for(lambda: not b.find_all("#cancel"), "the Cancel button to go")
    b.get(f"{live.url}/ui/jobs/{job}/cancel")  # a stale tab's link
    assert "nothing to cancel" in b.text() and not b.find_all("button.danger")


def test_error_pages_keep_navigation_and_sign_out(live: Live) -> None:
    b = live.b
    live.sign_in(live.world.tokens["alpha"])
    for path, status in (("/ui/jobs/j-0000000000000000", "404"), ("/ui/jobs?state=bogus", "422")):
        b.get(live.url + path)
        assert f"Error {status}" in b.text(), path
        assert b.find_all("header nav a[href='/ui/spend']") and b.find_all("header form.who button"), path


def test_money_columns_stay_on_screen(live: Live) -> None:
    b = live.b
    live.sign_in(live.world.tokens["alpha"])
    live.plan(SPEC)
    for width in (1280, 800):
        b.set_window(width, 900)
        _fits(b, "#plan-table", f"plan at {width}")
    _shot(b, "plan-800.png")
    b.get(f"{live.url}/ui/jobs")
    for width in (800, 1280):
        b.set_window(width, 900)
        _fits(b, "#jobs-table", f"jobs at {width}")
    b.set_window(800, 900)
    _shot(b, "jobs-800.png")
    b.set_window(1280, 900)
    b.get(f"{live.url}/ui/accuracy")
    _fits(b, "#runs", "accuracy at 1280")
    _shot(b, "accuracy-1280.png")


def test_the_burn_down_holds_what_is_left_after_reservations(live: Live) -> None:
    b = live.b
    live.sign_in(live.world.tokens["alpha"])
    # $20 spent, $1 reserved by the queued job: a $15 budget leaves -$6, below the line's -$5
    live.service.update_team(ADMIN, "alpha", TeamUpdate(budget_usd=15.0))
    b.get(f"{live.url}/ui/spend")
    assert float(b.script("return document.getElementById('remaining').dataset.usd")) == pytest.approx(-6.0)
    assert b.script(FIGURE_PROBLEMS) == []
    _shot(b, "spend-1280.png")
    b.get(f"{live.url}/ui/accuracy")
    assert b.script(FIGURE_PROBLEMS) == []


def test_legends_sit_clear_of_the_data(live: Live) -> None:
    # The usual shapes: a burn-down whose line starts at the budget, top left; the tallest bar first.
    today = date(2026, 11, 20)
    history = [(today - timedelta(days=d), 10.0) for d in range(20, -1, -1)]
    burn = views.burn_down(history, 1000.0, 700.0, today, "alpha").plot
    bars = views.spend_series([(today - timedelta(days=d), "H100", "spot", 30.0 + 5 * d) for d in range(14)]
                              + [(today - timedelta(days=13), "A100", "on-demand", 30.0)], "day",
                              today - timedelta(days=13), today, "spend").plot
    live.sign_in(live.world.tokens["alpha"])
    live.b.script("document.querySelector('main').innerHTML = arguments[0]", burn + bars)
    assert live.b.script("return document.querySelectorAll('main svg.plot .legend').length") >= 5
    assert live.b.script(FIGURE_PROBLEMS) == []


def test_an_empty_accuracy_plot_shows_no_made_up_scale(live: Live) -> None:
    live.sign_in(ADMIN_TOKEN)
    live.b.get(f"{live.url}/ui/accuracy?team=beta")
    plots = live.b.script("return [...document.querySelectorAll('svg.plot')].map(s => s.textContent)")
    assert len(plots) == 2 and all("no runs" in t and "e-" not in t for t in plots), plots


def test_the_admin_form_takes_the_servers_team_name_rule(live: Live) -> None:
    live.sign_in(ADMIN_TOKEN)
    live.b.get(f"{live.url}/ui/admin")
    _shot(live.b, "admin-1280.png")
    names = ["Team.Upper", "ml", "ml-team_2", "-x", "a" * 63, "a" * 64]
    valid = live.b.script("""const input = document.querySelector('form[action="/ui/admin/teams"] input[name=name]');
        return arguments[0].map(v => { input.value = v; return input.checkValidity() && input.value === v; })""",
                          names)
    assert dict(zip(names, valid, strict=True)) == {n: team_name_error(n) is None for n in names}
    assert valid[:2] == [False, True]
    # README states the rule once
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert readme.count(TEAM_NAME_PATTERN.replace("\\", "")) == 1 and "team names are letters" not in readme
