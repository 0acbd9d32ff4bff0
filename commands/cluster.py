"""`gpuplan cluster check`: whether the AWS account is ready for a plan's cluster (the `cluster` group's
other commands live in commands/plan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from commands import output
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table, styled
from commands.plan import _plan_from_file, cluster_app
from errors import InvalidInput

__all__ = ["cluster_app", "cluster_check_command"]

NOT_READY_EXIT = 1  # an item to fix; 8: no or rejected credentials; 9: AWS unreachable; 2: bad input
_STYLE = {"ok": "green", "fix": "bold red", "warn": "yellow", "could not check": "yellow"}


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
