"""The `gpuplan` command line: the app assembled from the command modules in `commands/`, and main().

Each area's commands live in their own module (parse, call a package, render through `commands.output`).
"""

from __future__ import annotations

import typer

from commands import calibrate, catalog, cluster, jobs, plan, reports, run, server, simulate, teams
from commands.output import escape_help

app = typer.Typer(
    name="gpuplan",
    help="Cost-aware GPU job planner and scheduler.\n\nExamples:\n\n"
    "  gpuplan plan examples/llama3-8b-sft.yaml\n\n"
    "  gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json\n\n"
    "  gpuplan catalog offers --gpu H100 --spot\n\n"
    "  gpuplan run examples/tiny-train.yaml",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
# Top-level commands (a Typer added without a name lends its commands), then the groups, in the order --help lists them.
for module in (plan, run, server, jobs, calibrate, simulate):
    app.add_typer(module.app)
app.add_typer(catalog.app, name="catalog")
app.add_typer(reports.app, name="report")
app.add_typer(teams.app, name="team")
app.add_typer(cluster.cluster_app, name="cluster")
escape_help(app)  # after every command is registered


def _quiet_third_party_logs() -> None:
    # torchao warns at import about optional CUDA kernels built for other Pythons, and torch's pytree
    # about deprecations inside torchao: noise for a CLI user, never actionable by them.
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main() -> None:
    _quiet_third_party_logs()
    app()


if __name__ == "__main__":
    main()
