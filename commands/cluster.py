"""`gpuplan cluster config` and `gpuplan cluster check`: a plan's Ray cluster for AWS, and whether the account
is ready for it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from commands import output
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table, styled, warn
from commands.plan import load_planning_inputs
from errors import InvalidInput

if TYPE_CHECKING:
    from planner.types import Plan
    from workers.cluster.config import ClusterOptions

__all__ = ["cluster_app", "cluster_check_command", "cluster_config_command"]

NOT_READY_EXIT = 1  # an item to fix; 8: no or rejected credentials; 9: AWS unreachable; 2: bad input
_STYLE = {"ok": "green", "fix": "bold red", "warn": "yellow", "could not check": "yellow"}


cluster_app = typer.Typer(help="Ray cluster configs for running plans on spot instances.\n\nExample:\n\n"
                          "  gpuplan cluster config examples/llama3-8b-sft.yaml --out cluster.yaml",
                          no_args_is_help=True)


def _plan_from_file(path: str) -> Any:
    """A Plan from `gpuplan plan --json` output, or planned now from a job spec."""
    import json as _json

    from planner.types import Plan

    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"{path!r} does not exist",
                           hint="give a job spec (YAML/JSON) or a `gpuplan plan --json` file")
    if file.suffix == ".json":
        try:
            doc = _json.loads(file.read_text())
        except _json.JSONDecodeError as exc:
            raise InvalidInput(f"not valid JSON ({exc})", path=path) from None
        if isinstance(doc, dict) and "candidates" in doc and "chosen" in doc:
            try:
                return Plan.model_validate(doc)
            except ValueError as exc:
                raise InvalidInput(f"not a gpuplan plan: {exc}", path=path) from None
    from planner.search import plan

    job, catalog, model, calibration = load_planning_inputs(path, this_machine=False)
    return plan(job, catalog, calibration=calibration, model=model)


def subnet_map(subnet: list[str]) -> dict[str, str]:
    subnets = dict(item.split("=", 1) for item in subnet if "=" in item)
    if len(subnets) != len(subnet):
        raise InvalidInput("--subnet takes ZONE_ID=SUBNET_ID", path="subnet", hint="e.g. --subnet use1-az1=subnet-0abc")
    return subnets


def _cluster_config(path: str) -> dict[str, Any] | None:
    """The Ray cluster config in ``path`` (None: a job spec or a plan)."""
    import yaml

    from workers.cluster.check_yaml import is_cluster_config

    file = Path(path)
    if file.suffix not in (".yaml", ".yml") or not file.is_file():
        return None
    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError):
        return None  # the spec loader says what is wrong with it
    return doc if is_cluster_config(doc) else None


@cluster_app.command("config")
@handle_errors
def cluster_config_command(
    plan_or_spec: str = typer.Argument(..., help="A job spec, or the output of `gpuplan plan --json`."),
    out: str | None = typer.Option(None, "--out", help="Write the YAML here (default: print it)."),
    wheel: str | None = typer.Option(None, "--wheel", help="A gpuplan wheel to install on the nodes "
                                     "(pip wheel --no-deps -w dist . in the checkout)."),
    source_dir: str | None = typer.Option(None, "--source-dir", help="Or sync this gpuplan checkout to the nodes."),
    checkpoint_root: str | None = typer.Option(None, "--checkpoint-root", help="s3://bucket/prefix the nodes "
                                               "checkpoint to (the head's server gets it)."),
    ami: str | None = typer.Option(None, "--ami", help="AMI for every node (default: the region's current Deep "
                                   "Learning Base AMI, Ubuntu 24.04, through SSM)."),
    subnet: list[str] = typer.Option([], "--subnet", help="ZONE_ID=SUBNET_ID, e.g. use1-az1=subnet-0abc "
                                     "(default: the account's subnets of each zone)."),
    instance_profile: str = typer.Option("gpuplan-node", "--instance-profile", help="IAM instance profile of "
                                         "head and workers (the YAML's header has its policy)."),
    database_url: str | None = typer.Option(None, "--database-url", help="The head server's database, without a "
                                            "password (default: SQLite on the head, backed up to the S3 root)."),
    database_url_secret: str | None = typer.Option(None, "--database-url-secret", help="Secrets Manager name/ARN "
                                                   "or ssm:NAME (SecureString) holding the database URL; the head "
                                                   "reads it."),
    admin_token_secret: str | None = typer.Option(None, "--admin-token-secret", help="Secrets Manager name/ARN or "
                                                  "ssm:NAME holding the admin token (default: the head makes one, "
                                                  "in ~/.gpuplan/admin-token there)."),
    alternatives: int = typer.Option(2, "--alternatives", min=0, help="Extra offers to give node types."),
    every_zone: bool = typer.Option(False, "--every-zone", help="Also the plan's prices of the chosen instance type "
                                    "in its other zones as kinds of their own (every kind gets a fallback type in "
                                    "each zone that offers its instance type anyway, ranked by gpuplan/fallback)."),
    head_instance: str = typer.Option("m5.2xlarge", "--head-instance", help="On-demand head node type."),
    efa: str = typer.Option("auto", "--efa", help="EFA for multi-node p4d/p5/p5en/p6 types (interfaces and a "
                            "cluster placement group, made in the account now): all (one per network card; the "
                            "subnet needs a NAT gateway), one (with a public IP), auto (all where the subnet has a "
                            "NAT route, else one), off. Less than all: the head's server plans with the lower speed."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A Ray cluster-launcher YAML for AWS: the plan's GPU, market and zone as node types, the gpuplan
    server on the head, the preemption watcher on every worker. Looks up AMIs, subnets, the instance
    profile and the bucket in the account first (AWS credentials needed); for multi-node types with EFA it
    also makes the cluster's security group and a cluster placement group per type.

    Examples:

      pip wheel --no-deps -w dist . && gpuplan cluster config examples/llama3-8b-sft.yaml \\
        --wheel dist/gpuplan-0.1.0-py3-none-any.whl --checkpoint-root s3://my-bucket/gpuplan --out cluster.yaml \\
        && ray up cluster.yaml

      gpuplan plan job.yaml --json > plan.json && gpuplan cluster config plan.json --source-dir . --json
    """
    from workers.cluster.config import ClusterOptions

    # the YAML is used from wherever `ray up` runs: a relative --wheel / --source-dir is this folder's
    wheel, source_dir = (str(Path(p).expanduser().resolve()) if p else None for p in (wheel, source_dir))
    opts = ClusterOptions(wheel=wheel, source_dir=source_dir, checkpoint_root=checkpoint_root, ami=ami,
                          subnets=subnet_map(subnet), instance_profile=instance_profile, database_url=database_url,
                          database_url_secret=database_url_secret, admin_token_secret=admin_token_secret,
                          alternatives=alternatives, every_zone=every_zone, head_instance=head_instance, efa=efa)
    _write_config(_plan_from_file(plan_or_spec), opts, out, as_json)


def _write_config(plan: Plan, opts: ClusterOptions, out: str | None, as_json: bool) -> None:
    """Generate the YAML for ``plan`` (the account's lookups), write or print it, and say its warnings."""
    from workers.cluster.aws import generate
    from workers.cluster.aws_errors import aws_errors
    from workers.cluster.notes import WARNING

    with aws_errors("the account lookups of `cluster config`"):
        config, text = generate(plan, opts)
    if out:
        Path(out).write_text(text)
    for line in text.splitlines():
        if line.startswith(f"# {WARNING}"):
            warn(line[len(f"# {WARNING}"):])
    if as_json:
        print_json({"path": out, "config": config})
    elif out:
        output.console.print(f"wrote {out}: {len(config['available_node_types']) - 1} worker type(s); start with "
                             f"`ray up {out}`", highlight=False)
    else:
        sys.stdout.write(text)


@cluster_app.command("check")
@handle_errors
def cluster_check_command(
    plan_or_spec: str = typer.Argument(..., metavar="SPEC|PLAN|CLUSTER_YAML", help="A job spec, the output of "
                                       "`gpuplan plan --json`, or a cluster YAML of `gpuplan cluster config` (the "
                                       "options below are then read from it)."),
    checkpoint_root: str | None = typer.Option(None, "--checkpoint-root", help="s3://bucket/prefix the nodes "
                                               "would checkpoint to."),
    ami: str | None = typer.Option(None, "--ami", help="The AMI `cluster config` would get (default: the DLAMI)."),
    subnet: list[str] = typer.Option([], "--subnet", help="ZONE_ID=SUBNET_ID, as for `cluster config`."),
    instance_profile: str = typer.Option("gpuplan-node", "--instance-profile", help="The nodes' IAM instance "
                                         "profile: its role's policy is compared with the one gpuplan needs."),
    alternatives: int = typer.Option(2, "--alternatives", min=0, help="Extra offers, as for `cluster config`."),
    every_zone: bool = typer.Option(False, "--every-zone", help="As for `cluster config`."),
    head_instance: str = typer.Option("m5.2xlarge", "--head-instance", help="On-demand head node type."),
    efa: str = typer.Option("auto", "--efa", help="all, one, auto or off, as for `cluster config`."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check the AWS account before `ray up`: credentials and region, the instance types and GPU AMI, the
    spot service-linked role, the vCPU quotas of every instance family and market the plan may launch
    (against its largest node type there), subnets in each planned zone, a NAT route for multi-interface
    EFA nodes, the instance profile's policy, and the checkpoint bucket (its region, and a probe write).
    Changes nothing in the account but the probe object, which it deletes.

    Exit codes: 0 ready; 1 an item to fix (each says what to do); 2 a bad spec or option; 8 no AWS
    credentials, or credentials AWS rejects; 9 AWS cannot be reached.

    Examples:

      gpuplan cluster check examples/llama3-8b-sft.yaml --checkpoint-root s3://my-bucket/gpuplan

      gpuplan plan job.yaml --json > plan.json && gpuplan cluster check plan.json --json

      gpuplan cluster check cluster.yaml    # the YAML `cluster config` wrote, before `ray up`
    """
    from workers.cluster.check import FIX, check_account
    from workers.cluster.check_yaml import check_cluster_config
    from workers.cluster.config import ClusterOptions

    config = _cluster_config(plan_or_spec)
    if config is not None:  # a cluster YAML: the options are in it
        items = check_cluster_config(config)
    else:
        opts = ClusterOptions(checkpoint_root=checkpoint_root, ami=ami, subnets=subnet_map(subnet),
                              instance_profile=instance_profile, alternatives=alternatives, every_zone=every_zone,
                              head_instance=head_instance, efa=efa)
        items = check_account(_plan_from_file(plan_or_spec), opts)
    ready = not any(item.status == FIX for item in items)
    if as_json:
        print_json({"ready": ready, "items": [vars(item) for item in items]})
    else:
        print_table("AWS account for this plan's cluster", [Col("item"), Col("status"), Col("detail", wrap=True)],
                    [[item.name, styled((item.status, _STYLE[item.status])), item.detail] for item in items])
        verdict = ("ready", "bold green") if ready else ("not ready: fix the items above", "bold red")
        output.console.print(styled(verdict), highlight=False)
    if not ready:
        raise typer.Exit(NOT_READY_EXIT)
