"""The dashboard at /ui over the real app (FastAPI's TestClient) and a real SQLite store: sign-in and
its cookie, team isolation, CSRF, every page for a team and the admin, hostile inputs, and the
numbers the Spend page shows against the spend report the CLI prints."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from catalog.loader import Catalog
from scheduler.api import create_app
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.models import JobCreate, TeamUpdate
from scheduler.ui.session import COOKIE
from tests.scheduler.conftest import spec_dict
from tests.scheduler.ui_world import ADMIN_TOKEN, World, catalog, csrf_of, sign_in, world

__all__ = ["catalog", "world"]  # fixtures

# ---------------------------------------------------------------- sign-in and the cookie


def test_sign_in_sets_a_secure_httponly_strict_cookie_without_the_token(world: World) -> None:
    client = world.client()
    assert client.get("/ui/jobs", follow_redirects=False).headers["location"].startswith("/ui/login")
    page = client.get("/ui/login")
    resp = client.post("/ui/login", data={"token": world.tokens["alpha"], "csrf": csrf_of(page.text)},
                       follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/jobs"
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    flags = {f.strip().lower() for f in cookie.split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict", "path=/ui"} <= flags
    assert world.tokens["alpha"] not in cookie and world.tokens["alpha"] not in resp.headers["location"]
    jobs = client.get("/ui/jobs")
    assert jobs.status_code == 200 and "team alpha" in jobs.text and world.jobs["finetune-a"] in jobs.text
    assert "Content-Security-Policy" in jobs.headers and "script-src 'self'" in jobs.headers["content-security-policy"]


def test_wrong_token_is_refused_on_the_form(world: World) -> None:
    client = world.client()
    page = client.get("/ui/login")
    resp = client.post("/ui/login", data={"token": "gpt_wrong", "csrf": csrf_of(page.text)})
    assert resp.status_code == 401 and "invalid token" in resp.text
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_sign_out_ends_the_session(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    page = client.get("/ui/jobs")
    resp = client.post("/ui/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/login"
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_a_tampered_cookie_is_no_session(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    value = client.cookies[COOKIE]
    payload, mac = value.split(".")
    tampered = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + mac
    fresh = world.client()
    assert fresh.get("/ui/jobs", headers={"Cookie": f"{COOKIE}={value}"}).status_code == 200
    for bad in (tampered, payload + "." + mac[:-1], "x", "a.b.c", "." * 3000):
        assert fresh.get("/ui/jobs", headers={"Cookie": f"{COOKIE}={bad}"}, follow_redirects=False).status_code == 303


def test_a_revoked_token_ends_its_session(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    assert client.get("/ui/jobs").status_code == 200
    token_id = world.service.list_tokens(ADMIN, "alpha")[0].id
    world.service.revoke_token(ADMIN, "alpha", token_id)  # drops the token from this process's cache too
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303


# ---------------------------------------------------------------- CSRF


def test_posts_without_the_csrf_field_are_refused(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    job = world.jobs["evil"]
    assert client.post(f"/ui/jobs/{job}/cancel", data={}).status_code == 403
    assert client.post(f"/ui/jobs/{job}/cancel", data={"csrf": "forged"}).status_code == 403
    assert client.post("/ui/plan", data={"spec": "name: x"}).status_code == 403
    assert client.post("/ui/logout", data={}).status_code == 403
    # another site's form, even with the right field
    csrf = csrf_of(client.get(f"/ui/jobs/{job}").text)
    assert client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf},
                       headers={"Origin": "https://evil.example"}).status_code == 403
    assert world.service.status(world.service.team_principal("alpha"), job).state == "queued"
    # the sign-in form too (login CSRF)
    fresh = world.client()
    assert fresh.post("/ui/login", data={"token": world.tokens["alpha"]}).status_code == 403
    admin = world.signed_in(ADMIN_TOKEN)
    assert admin.post("/ui/admin/teams", data={"name": "gamma"}).status_code == 403
    assert [t.name for t in world.service.list_teams(ADMIN)] == ["alpha", "beta"]


# ---------------------------------------------------------------- isolation


def test_team_a_cannot_see_or_cancel_team_b_jobs(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    beta_job = world.jobs["beta-job"]
    assert beta_job not in client.get("/ui/jobs").text
    assert beta_job not in client.get("/ui/jobs?team=beta").text  # a team's ?team= is ignored
    for path in (f"/ui/jobs/{beta_job}", f"/ui/jobs/{beta_job}/log", f"/ui/jobs/{beta_job}/cancel",
                 f"/ui/jobs/{beta_job}?team=beta", "/ui/jobs/j-0000000000000000"):
        resp = client.get(path)
        assert resp.status_code == 404, path
        assert "beta-job" not in resp.text
    csrf = csrf_of(client.get("/ui/jobs").text)
    assert client.post(f"/ui/jobs/{beta_job}/cancel", data={"csrf": csrf}).status_code == 404
    assert world.service.status(world.service.team_principal("beta"), beta_job).state == "queued"
    assert client.get("/ui/admin").status_code == 403
    assert client.post("/ui/admin/teams", data={"csrf": csrf, "name": "mine"}).status_code == 403
    spend = client.get("/ui/spend?team=beta")
    assert spend.status_code == 200 and "team alpha" in spend.text and "beta-job" not in spend.text


# ---------------------------------------------------------------- pages


PAGES = ["/ui/jobs", "/ui/jobs?state=queued", "/ui/jobs?q=fine", "/ui/jobs?page=2", "/ui/spend",
         "/ui/spend?period=week&since=7d", "/ui/plan", "/ui/accuracy"]


@pytest.mark.parametrize("who", ["alpha", "admin"])
def test_every_page_renders(world: World, who: str) -> None:
    client = world.signed_in(ADMIN_TOKEN if who == "admin" else world.tokens[who])
    job = world.jobs["finetune-a"]
    team = "?team=alpha" if who == "admin" else ""
    pages = [*PAGES, f"/ui/jobs/{job}{team}", f"/ui/jobs/{job}/cancel{team}", f"/ui/jobs/{job}/log{team}"]
    if who == "admin":
        pages += ["/ui/admin", "/ui/spend?team=alpha", "/ui/jobs?team=beta", "/ui/accuracy?team=alpha"]
    for page in pages:
        resp = client.get(page)
        assert resp.status_code == 200, (page, resp.text[:500])
    assert client.get("/ui/static/app.js").status_code == 200
    assert client.get("/ui/static/style.css").status_code == 200


def test_job_page_shows_plan_attempts_events_accuracy_and_log(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    html = client.get(f"/ui/jobs/{world.jobs['finetune-a']}").text
    assert "p5.48xlarge" in html and "--- attempt 1" in html and "succeeded" in html
    assert "30.0" in html  # measured peak GiB
    assert "Cancel…" not in html  # finished: nothing to cancel
    log = client.get(f"/ui/jobs/{world.jobs['finetune-a']}/log?since=0").json()
    assert log["complete"] and log["lines"] and log["next"] == len(log["lines"])


def test_live_log_tail_receives_new_lines(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    job = world.jobs["evil"]
    first = client.get(f"/ui/jobs/{job}/log").json()
    assert not first["complete"]
    world.loop.tick()  # starts an attempt: a header and the executor's lines are appended
    world.loop.tick()
    more = client.get(f"/ui/jobs/{job}/log?since={first['next']}").json()
    assert more["lines"] and any("attempt 1" in line for line in more["lines"])
    assert more["next"] == first["next"] + len(more["lines"])


def test_cancel_with_confirmation(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    job = world.jobs["evil"]
    confirm = client.get(f"/ui/jobs/{job}/cancel")
    assert confirm.status_code == 200 and "cannot be undone" in confirm.text
    resp = client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf_of(confirm.text), "reason": "not needed"},
                       follow_redirects=False)
    assert resp.status_code == 303
    assert world.service.status(world.service.team_principal("alpha"), job).state == "cancelled"
    again = client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf_of(confirm.text)})
    assert again.status_code == 409 and "already cancelled" in again.text


def test_a_script_in_a_job_name_renders_as_text(world: World) -> None:
    # A spec name cannot hold '<' (the spec's pattern), but a log line or a reason can: check both.
    client = world.signed_in(world.tokens["alpha"])
    job = world.jobs["evil"]
    confirm = client.get(f"/ui/jobs/{job}/cancel")
    client.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf_of(confirm.text), "reason": "<script>alert(1)</script>"})
    html = client.get(f"/ui/jobs/{job}").text
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_job_named_like_a_script_renders_as_text_on_every_page(world: World) -> None:
    # The spec's name pattern refuses '<'; a row written another way (an older version, a manual
    # fix) must still render as text: set it in the database.
    from sqlalchemy import update

    from scheduler.store.models import Job

    evil = "<script>alert(1)</script>"
    with world.service.store.write() as session:
        session.execute(update(Job).where(Job.id == world.jobs["finetune-a"]).values(name=evil))
    client = world.signed_in(world.tokens["alpha"])
    for page in ("/ui/jobs", f"/ui/jobs/{world.jobs['finetune-a']}", "/ui/spend", "/ui/jobs?q=script"):
        html = client.get(page).text
        assert evil not in html, page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, page


def test_search_and_state_filter_and_pagination(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    alpha = world.service.team_principal("alpha")
    for i in range(30):
        world.service.submit(alpha, JobCreate(spec=spec_dict(tokens=1e3, name=f"bulk-{i:02d}")))
    first = client.get("/ui/jobs").text
    assert first.count('class="state ') == 25 and "older &rarr;" in first
    second = client.get("/ui/jobs?page=2").text
    assert second.count('class="state ') == 7 and "older &rarr;" not in second
    found = client.get("/ui/jobs?q=BULK-0").text
    assert found.count('class="state ') == 10
    assert client.get("/ui/jobs?q=50%25_").text.count('class="state ') == 0  # LIKE wildcards are literal
    assert client.get("/ui/jobs?state=succeeded").text.count('class="state ') == 1
    assert client.get("/ui/jobs?state=bogus").status_code == 422


def test_plan_from_a_pasted_spec_and_submit(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    page = client.get("/ui/plan")
    spec = ("name: pasted\ntask: train\nmodel: llama-3-8b\ntrain:\n  tokens: 3.0e6\n"
            "resources:\n  accelerators: ['H100:2']\n")
    resp = client.post("/ui/plan", data={"spec": spec, "csrf": csrf_of(page.text)})
    assert resp.status_code == 200, resp.text
    assert 'id="plan-table"' in resp.text and "<svg" in resp.text and "pasted" in resp.text
    submitted = client.post("/ui/plan/submit", data={"spec": spec, "csrf": csrf_of(resp.text)}, follow_redirects=False)
    assert submitted.status_code == 303
    job_id = submitted.headers["location"].rsplit("/", 1)[1]
    detail = world.service.status(world.service.team_principal("alpha"), job_id)
    assert detail.name == "pasted" and detail.gpus == 2 and detail.estimated_usd == pytest.approx(3.0)
    upload = client.post("/ui/plan", data={"csrf": csrf_of(page.text)},
                         files={"upload": ("spec.yaml", spec.encode(), "application/yaml")})
    assert upload.status_code == 200 and 'id="plan-table"' in upload.text


def test_plan_with_the_real_planner_groups_rejections(world: World, catalog: Catalog, tmp_path: Path) -> None:
    from scheduler.composition import catalog_planner

    service = SchedulerService(world.service.store, catalog_planner(catalog), checkpoint_root=str(tmp_path),
                               admin_token=ADMIN_TOKEN)
    client = TestClient(create_app(service, catalog), base_url="https://testserver")
    sign_in(client, world.tokens["alpha"])
    spec = Path("examples").glob("*.yaml")
    text = next(p for p in sorted(spec) if "infer" not in p.name).read_text()
    resp = client.post("/ui/plan", data={"spec": text, "csrf": csrf_of(client.get("/ui/plan").text)})
    assert resp.status_code == 200, resp.text[:2000]
    assert 'id="rejections"' in resp.text and "Pareto front" in resp.text


HOSTILE_SPECS = [
    ("", "empty"),
    ("name: a\x00b\ntask: train", "NUL"),
    ("x" * 70_000, "at most 64000 characters"),
    ("name: [unclosed", "not valid YAML"),
    ("- a list", "must be a mapping"),
    ("a: &x [1]\nb: *x", "alias"),
    ("name: ok\ntask: train\nmodel: llama-3-8b\ntrain: {tokens: 1e6}\nextra: " + "y" * 10_000, "characters long"),
    ("name: ok\ntask: fly\nmodel: llama-3-8b", "task"),
    ("{\"name\": \"j\", \"task\": \"train\", \"model\": 5}", "model"),
]


def test_hostile_specs_answer_422_with_a_message(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    csrf = csrf_of(client.get("/ui/plan").text)
    for spec, said in HOSTILE_SPECS:
        resp = client.post("/ui/plan", data={"spec": spec, "csrf": csrf})
        assert resp.status_code == 422, (said, resp.text[:300])
        assert said in resp.text
        sub = client.post("/ui/plan/submit", data={"spec": spec, "csrf": csrf})
        assert 400 <= sub.status_code < 500, (said, sub.text[:300])
    bad_upload = client.post("/ui/plan", data={"csrf": csrf},
                             files={"upload": ("s.yaml", b"name: \xff\xfe", "text/yaml")})
    assert bad_upload.status_code == 422 and "not UTF-8" in bad_upload.text


def test_hostile_query_and_form_values_answer_4xx(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    csrf = csrf_of(client.get("/ui/jobs").text)
    long = "x" * 10_000
    for path in (f"/ui/jobs?q={long}", "/ui/jobs?q=a%00b", "/ui/jobs?state=%00", "/ui/jobs?page=-1",
                 "/ui/jobs?page=99999999999999999999", f"/ui/jobs/{long}", "/ui/jobs/a%00b", "/ui/spend?since=%00",
                 "/ui/spend?since=99999999999d", "/ui/spend?period=year", f"/ui/spend?since={long}",
                 "/ui/jobs/j-1/log?since=-5", "/ui/nothing-here", "/ui/jobs?team=%ED%A0%80"):
        resp = client.get(path)
        assert 400 <= resp.status_code < 500, (path, resp.status_code, resp.text[:300])
    for data in ({"csrf": csrf, "reason": "a\x00b"}, {"csrf": csrf, "reason": long}):
        resp = client.post(f"/ui/jobs/{world.jobs['evil']}/cancel", data=data)
        assert resp.status_code == 422, resp.text[:300]
    login = world.client()
    page = login.get("/ui/login")
    for token in ("a\x00b", long):
        resp = login.post("/ui/login", data={"token": token, "csrf": csrf_of(page.text)})
        assert 400 <= resp.status_code < 500
    admin = world.signed_in(ADMIN_TOKEN)
    csrf = csrf_of(admin.get("/ui/admin").text)
    for data in ({"name": "bad name!"}, {"name": "x\x00"}, {"name": "ok", "budget": "lots"},
                 {"name": "ok", "budget": "-5"}, {"name": "ok", "quota": "1.5"},
                 {"name": "ok", "budget": "nan"}, {"name": long}):
        resp = admin.post("/ui/admin/teams", data={"csrf": csrf, **data})
        assert 400 <= resp.status_code < 500, (data, resp.status_code, resp.text[:300])


# ---------------------------------------------------------------- spend


def test_spend_page_numbers_equal_the_spend_report(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    html = client.get("/ui/spend?since=30d").text
    report = world.service.spend_report(world.service.team_principal("alpha"),
                                        since=world.clock() - (world.clock() - datetime(2026, 10, 21, 9, tzinfo=UTC)))
    assert report.total_usd > 0
    shown_total = float(re.search(r'<b data-usd="([^"]+)"', html).group(1))  # type: ignore[union-attr]
    assert shown_total == pytest.approx(report.total_usd)
    for market, usd in report.by_market.items():
        shown = float(re.search(rf'data-market="{market}" data-usd="([^"]+)"', html).group(1))  # type: ignore[union-attr]
        assert shown == pytest.approx(usd)
    assert float(re.search(r'id="remaining" data-usd="([^"]+)"', html).group(1)) == pytest.approx(  # type: ignore[union-attr]
        report.remaining_usd)
    assert "runs out on" in html and world.jobs["finetune-a"] in html and "<svg" in html
    # the budget burns at the last week's rate: $20 spent today -> $20/7 a day
    world.service.update_team(ADMIN, "alpha", TeamUpdate(budget_usd=1000.0))
    assert "($2.86/day)" in client.get("/ui/spend").text


def test_admin_sees_every_team_and_manages_tokens(world: World) -> None:
    admin = world.signed_in(ADMIN_TOKEN)
    spend = admin.get("/ui/spend").text
    assert "every team" in spend and "alpha" in spend and "beta" in spend
    assert world.jobs["beta-job"] in admin.get("/ui/jobs?team=beta").text
    assert f"/ui/jobs/{world.jobs['finetune-a']}?team=alpha" in admin.get("/ui/spend?team=alpha").text
    page = admin.get("/ui/admin")
    csrf = csrf_of(page.text)
    assert admin.post("/ui/admin/teams", data={"csrf": csrf, "name": "gamma", "budget": "100", "quota": "4"},
                      follow_redirects=False).status_code == 303
    assert world.service.get_team(ADMIN, "gamma").gpu_quota == 4
    created = admin.post("/ui/admin/teams/gamma/tokens", data={"csrf": csrf, "label": "laptop"})
    assert created.status_code == 201
    secret = re.search(r"<pre>(gpt_[^<]+)</pre>", created.text).group(1)  # type: ignore[union-attr]
    assert world.service.authenticate(secret).team_name == "gamma"
    assert secret not in admin.get("/ui/admin").text  # shown once
    token_id = world.service.list_tokens(ADMIN, "gamma")[0].id
    confirm = admin.get(f"/ui/admin/teams/gamma/tokens/{token_id}/revoke")
    assert confirm.status_code == 200 and "cannot be undone" in confirm.text
    assert admin.post(f"/ui/admin/teams/gamma/tokens/{token_id}/revoke", data={"csrf": csrf},
                      follow_redirects=False).status_code == 303
    assert world.service.list_tokens(ADMIN, "gamma")[0].revoked_at is not None
    assert admin.post("/ui/admin/teams/gamma", data={"csrf": csrf, "budget": "", "quota": "8"},
                      follow_redirects=False).status_code == 303
    team = world.service.get_team(ADMIN, "gamma")
    assert team.budget_usd is None and team.gpu_quota == 8


def test_the_ui_secret_is_one_file_for_every_api_process(tmp_path: Path) -> None:
    import stat

    from scheduler.ui.session import SECRET_ENV, Signer, load_or_create_secret, new_session

    first = load_or_create_secret(tmp_path / "home", env={})
    assert first == load_or_create_secret(tmp_path / "home", env={})  # a second process reads the same
    assert stat.S_IMODE((tmp_path / "home" / "ui-secret").stat().st_mode) == 0o600
    assert load_or_create_secret(tmp_path / "home", env={SECRET_ENV: "from-the-environment"}) == b"from-the-environment"
    cookie = Signer(first).dump(new_session("ab" * 32))
    assert Signer(first).load(cookie) is not None  # another worker with the same secret accepts it
    assert Signer(b"another-secret-0123456789").load(cookie) is None


# ---------------------------------------------------------------- issue 44 (the browser tests check these too)


def test_a_catalog_typo_keeps_the_spec_and_says_why(world: World, catalog: Catalog, tmp_path: Path) -> None:
    from html import unescape

    from scheduler.composition import catalog_planner

    service = SchedulerService(world.service.store, catalog_planner(catalog), checkpoint_root=str(tmp_path),
                               admin_token=ADMIN_TOKEN)
    client = TestClient(create_app(service, catalog), base_url="https://testserver")
    sign_in(client, world.tokens["alpha"])
    csrf = csrf_of(client.get("/ui/plan").text)
    for spec, typo in (("name: t\ntask: train\nmodel: tiny-lama\ntrain: {tokens: 1e6}\n", "tiny-lama"),
                       ("name: t\ntask: train\nmodel: llama-3-8b\ntrain: {tokens: 1e6}\nresources:\n"
                        "  regions: [us-eastt-1]\n", "us-eastt-1")):
        resp = client.post("/ui/plan", data={"spec": spec, "csrf": csrf})
        assert resp.status_code == 422 and 'id="plan-error"' in resp.text, resp.text[:300]
        assert typo in unescape(resp.text) and "did you mean" in resp.text
        assert unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", resp.text, re.S).group(1)) == spec  # type: ignore[union-attr]


def test_the_plan_pages_submit_form_posted_twice_makes_one_job(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    spec = "name: twice\ntask: train\nmodel: llama-3-8b\ntrain:\n  tokens: 3.0e6\n"
    page = client.post("/ui/plan", data={"spec": spec, "csrf": csrf_of(client.get("/ui/plan").text)}).text
    key = re.search(r'name="idempotency_key" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = {"spec": spec, "csrf": csrf_of(page), "idempotency_key": key}
    first, second = (client.post("/ui/plan/submit", data=form, follow_redirects=False) for _ in range(2))
    assert first.status_code == second.status_code == 303
    assert first.headers["location"] == second.headers["location"]
    alpha = world.service.team_principal("alpha")
    assert [j.name for j in world.service.list_jobs(alpha, limit=100)].count("twice") == 1


def test_sign_in_over_plain_http_elsewhere_says_https_is_needed(world: World) -> None:
    client = TestClient(world.app, base_url="http://dashboard.example")  # type: ignore[arg-type]
    page = client.get("/ui/login")  # the Secure cookie is not sent back over http
    resp = client.post("/ui/login", data={"token": world.tokens["alpha"], "csrf": csrf_of(page.text)})
    assert resp.status_code == 403 and "needs HTTPS" in resp.text and "ssh -L" in resp.text
    assert "CSRF" not in resp.text


def test_error_pages_keep_the_navigation_and_sign_out(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    for path, status in (("/ui/jobs/j-0000000000000000", 404), ("/ui/jobs?state=bogus", 422)):
        resp = client.get(path)
        assert resp.status_code == status
        assert 'href="/ui/spend"' in resp.text and 'action="/ui/logout"' in resp.text, path
    assert 'action="/ui/logout"' not in world.client().get("/ui/nothing-here").text  # signed out: no Sign out


def test_an_ended_job_offers_no_cancel(world: World) -> None:
    client = world.signed_in(world.tokens["alpha"])
    page = client.get(f"/ui/jobs/{world.jobs['finetune-a']}/cancel")
    assert page.status_code == 200 and "nothing to cancel" in page.text and 'class="danger"' not in page.text
