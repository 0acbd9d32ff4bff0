"""`gpuplan calibrate`: refit the planner's calibration from this user's finished runs."""

from __future__ import annotations

from typing import Any

import typer

from commands import output
from commands.backend import open_backend
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table
from commands.plan import user_calibration
from commands.settings import Settings

app = typer.Typer()  # calibrate: a top-level command
# Names and numbers are never cut; ``drop`` orders what a narrow terminal leaves out (first the highest).
HELD_OUT_COLS = [Col("quantity"), Col("runs", right=True, drop=3), Col("median before", right=True),
                 Col("after", right=True), Col("worst before", right=True, drop=2),
                 Col("worst after", right=True, drop=1), Col("refit", wrap=True)]
CONSTANT_COLS = [Col("constant"), Col("shipped", right=True), Col("refit", right=True),
                 Col("fit runs", right=True, drop=1), Col("verdict")]


@app.command("calibrate")
@handle_errors
def calibrate_command(
    source: str = typer.Option("local", "--source", help="local: this machine's `gpuplan run` results; team: your "
                               "team's finished attempts (the server, or the local database); all: both."),
    holdout: float = typer.Option(1 / 3, "--holdout", min=0.1, max=0.5,
                                  help="Share of the records held out to judge the refit on (never fitted on)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the refit and its held-out effect; write nothing."),
    reset: bool = typer.Option(False, "--reset", help="Delete your calibration file: plan with the shipped one again."),
    limit: int = typer.Option(200, "--limit", min=1, max=1000, help="team: how many recent jobs to read."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Refit the planner's calibration from your finished runs (predicted vs measured).

    The constants are fitted on part of the records and judged on the held-out rest; a quantity
    whose held-out error would grow keeps the shipped constants. The result goes to
    ~/.gpuplan/calibration.json (GPUPLAN_HOME), which plan, estimate, run and server then use.

    Examples:

      gpuplan calibrate --dry-run

      gpuplan calibrate --source all --json

      gpuplan calibrate --reset
    """
    from scheduler import calibrate as calib

    home = Settings.from_env().home
    if reset:
        removed = calib.reset(home)
        if as_json:
            print_json({"reset": removed, "path": str(user_calibration())})
        else:
            output.console.print(f"removed {user_calibration()}: plans use the shipped calibration" if removed
                                 else "no calibration file to remove: plans already use the shipped calibration",
                                 highlight=False)
        return

    def team_jobs() -> list[Any]:
        backend = open_backend()
        return [backend.status(j.id) for j in backend.list_jobs(limit=limit)]

    out = calib.calibrate(home, source=source, holdout=holdout, write=not dry_run,
                          team_jobs=team_jobs if source in ("team", "all") else None)
    if as_json:
        print_json(out)
        return
    _print_calibration(out)


def _print_calibration(out: dict[str, Any]) -> None:
    def err(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    def num(v: float) -> str:
        return f"{v:.4g}"

    output.console.print(f"{out['records']} recorded runs: fitted on {out['fit']}, judged on {out['held_out']} "
                         "held out", highlight=False)
    print_table("held-out error, |predicted - measured| / measured", HELD_OUT_COLS,
                [[r["quantity"], str(r["held_out"]), err(r["median_before"]), err(r["median_after"]),
                  err(r["max_before"]), err(r["max_after"]), "kept" if r["kept"] else (r["note"] or "-")]
                 for r in out["report"]])
    if out["changes"] or out["reverted"]:
        print_table("constants", CONSTANT_COLS,
                    [[c["name"], num(c["before"]), num(c["after"]), str(c["records"]), verdict]
                     for key, verdict in (("changes", "kept"), ("reverted", "dropped")) for c in out[key]])
    if out["skipped_records"]:
        output.console.print(f"{len(out['skipped_records'])} records not usable (see --json: skipped_records)",
                             highlight=False)
    if out["written"]:
        output.console.print(f"wrote {out['path']}: plan, estimate, run and server now use it "
                             "(gpuplan calibrate --reset goes back to the shipped calibration)", highlight=False)
    elif not out["changes"]:
        output.console.print("nothing to change: the shipped calibration stays", highlight=False)
    else:
        output.console.print(f"--dry-run: {out['path']} not written", highlight=False)
