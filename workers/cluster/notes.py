"""The header of a generated cluster YAML: where each value came from, the IAM policy of the nodes'
role, the network of multi-node worker types, and what is still missing."""

from __future__ import annotations

import json
from typing import Any

from workers.cluster.config import AwsFacts, ClusterNeeds, ClusterOptions, backup_uri, efa_of, link_gbps
from workers.cluster.secrets import secret_resources

S3_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                     "s3:ListMultipartUploadParts")


def iam_policy(opts: ClusterOptions, account: str = "ACCOUNT") -> dict[str, Any]:
    """The permissions the nodes' role needs: launch and tag workers (the head's autoscaler), hand
    them the same role (iam:PassRole, which Ray's default role lacks), and the checkpoint prefix."""
    return {"Version": "2012-10-17",
            "Statement": node_statements(opts, account) + s3_statements(opts.checkpoint_root)
            + secret_statements(opts, account)}


def node_statements(opts: ClusterOptions, account: str = "ACCOUNT") -> list[dict[str, Any]]:
    """What the head's autoscaler calls: EC2 to launch and tag workers, PassRole to give them the role."""
    role = opts.instance_profile if not opts.instance_profile.startswith("arn:") else "ROLE"
    return [
        {"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:TerminateInstances", "ec2:StopInstances",
                                       "ec2:StartInstances", "ec2:CreateTags", "ec2:Describe*"], "Resource": "*"},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": f"arn:aws:iam::{account}:role/{role}"},
    ]


def s3_statements(root: str | None) -> list[dict[str, Any]]:
    """What the checkpoint and outputs stores call under ``s3://bucket/prefix`` (none off S3).

    ``s3:ListBucket`` holds on the whole bucket, with no ``s3:prefix`` condition: AWS authorizes
    HeadBucket (every store's first call, and the server's start check) as ListBucket, and that
    request carries no prefix, so a condition on it denies the store before it starts. Objects stay
    confined to the prefix; AbortMultipartUpload lets a failed multipart upload (a shard over the part
    size) be cleaned up instead of leaving billed parts behind."""
    if not root or not root.startswith("s3://"):
        return []
    bucket, _, prefix = root[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    objects = f"arn:aws:s3:::{bucket}/{prefix}/*" if prefix else f"arn:aws:s3:::{bucket}/*"
    return [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"},
            {"Effect": "Allow", "Action": list(S3_OBJECT_ACTIONS), "Resource": objects}]


def secret_statements(opts: ClusterOptions, account: str = "ACCOUNT") -> list[dict[str, Any]]:
    """Reading the head's named secrets (the admin token, the database URL) and nothing else. (An SSM
    SecureString under a customer-managed KMS key needs kms:Decrypt on that key too; AWS's own key does not.)"""
    refs = [r for r in (opts.admin_token_secret, opts.database_url_secret) if r]
    return [{"Effect": "Allow", "Action": action, "Resource": resource}
            for action, resource in (secret_resources(r, account) for r in refs)]


def notes(opts: ClusterOptions, facts: AwsFacts, needs: ClusterNeeds | None = None) -> list[str]:
    """What the YAML's header says: where the values came from, what to set up once, what is missing."""
    profile = facts.instance_profile
    lines = [f"{key}: {value}" for key, value in sorted(facts.sources.items())]
    lines += [f"{WARNING}{text}" for text in warnings(facts, needs)]
    lines += network_notes(opts, facts, needs)
    lines += [
        "",
        f"Head and workers run with the IAM instance profile {profile!r}. Its role needs the policy below:",
        "the head's autoscaler launches workers with that same profile, which takes iam:PassRole on the",
        "role (Ray's default ray-autoscaler-v1 role lacks it, and Ray gives a profile to the head only).",
        "Create it once:",
        f"  aws iam create-role --role-name {profile} --assume-role-policy-document "
        "'{\"Version\":\"2012-10-17\",\"Statement\":[{\"Effect\":\"Allow\",\"Principal\":{\"Service\":"
        "\"ec2.amazonaws.com\"},\"Action\":\"sts:AssumeRole\"}]}'",
        f"  aws iam put-role-policy --role-name {profile} --policy-name gpuplan --policy-document file://policy.json",
        f"  aws iam create-instance-profile --instance-profile-name {profile}",
        f"  aws iam add-role-to-instance-profile --instance-profile-name {profile} --role-name {profile}",
        "policy.json (ACCOUNT: your account id):",
        *("  " + line for line in json.dumps(iam_policy(opts), indent=2).splitlines()),
        "",
        f"The gpuplan server runs on the head (port {opts.server_port}, not opened to the internet): reach it",
        f"through SSH, e.g. `ray attach FILE -p {opts.server_port}`, then GPUPLAN_API_URL=http://127.0.0.1:"
        f"{opts.server_port}.",
        *server_notes(opts),
    ]
    if not (opts.checkpoint_root or "").startswith("s3://"):
        lines.append("No S3 --checkpoint-root: checkpoints stay on each node's disk and a multi-node or "
                     "preempted run cannot resume.")
    return lines


def server_notes(opts: ClusterOptions) -> list[str]:
    """Where the head's server gets its admin token and keeps teams, jobs and spend."""
    token = (f"The admin token is read on the head from {opts.admin_token_secret}." if opts.admin_token_secret else
             "The admin token was made on the head at its first start: ray exec FILE 'cat ~/.gpuplan/admin-token'.")
    if opts.database_url_secret or opts.database_url:
        data = f"Teams, jobs and spend: in the database of {opts.database_url_secret or 'the --database-url'}."
    elif (opts.checkpoint_root or "").startswith("s3://"):
        data = (f"Teams, jobs and spend: SQLite on the head, backed up every {opts.backup_every_s} s to "
                f"{backup_uri(opts.checkpoint_root or '')} and restored by a new head (ray down / ray up).")
    else:
        data = "Teams, jobs and spend: SQLite on the head's disk only; `ray down` deletes them (give an S3 root)."
    return [token, data]


WARNING = "Warning: "  # the header lines `gpuplan cluster config` also prints on stderr


def warnings(facts: AwsFacts, needs: ClusterNeeds | None) -> list[str]:
    """What works but costs more than the plan assumed: a checkpoint bucket in another region."""
    if needs is None or not facts.bucket_region or facts.bucket_region == needs.region:
        return []
    return [f"the checkpoint bucket is in {facts.bucket_region}, the cluster in {needs.region}: every checkpoint "
            f"crosses regions (slower saves and resumes, billed per GB); give a bucket in {needs.region}"]


def network_notes(opts: ClusterOptions, facts: AwsFacts, needs: ClusterNeeds | None) -> list[str]:
    """What the header says about multi-node worker types: EFA and placement group, or the slower link."""
    multi = [k for k in (needs.kinds if needs else ()) if k.candidate.nodes > 1]
    efa = sorted({(k.instance_type, efa_of(k, opts, facts)) for k in multi if efa_of(k, opts, facts)})
    slow = sorted({(k.instance_type, k.candidate.nodes, k.candidate.offer.network_gbps, link_gbps(k, opts, facts),
                    efa_of(k, opts, facts)) for k in multi
                   if link_gbps(k, opts, facts) < k.candidate.offer.network_gbps})
    lines: list[str] = []
    if efa:
        lines += ["", "EFA: " + ", ".join(f"{itype} gets {n} EFA interface(s)" for itype, n in efa)
                  + f", in security group {facts.security_group} and a cluster placement group per node type",
                  f"({', '.join(sorted(facts.placement_groups.values()))})."]
        if any(n > 1 for _, n in efa):
            lines += ["AWS gives no public IP to an instance with several interfaces: their subnet needs a NAT "
                      "gateway", "(or VPC endpoints) for the setup commands (apt, pip, S3)."]
    if slow:
        lines += ["", "These multi-node types provide less than the link speed the plan assumed (the head's server "
                  "plans with theirs):"]
        lines += [f"  {itype}: {nodes} nodes, {have:g} Gbit/s (the plan: {want:g}), {_why(opts, n)}"
                  for itype, nodes, want, have, n in slow]
    return lines


def _why(opts: ClusterOptions, efa: int) -> str:
    if efa == 1 and opts.efa == "auto":
        return ("one EFA interface: the subnet has no NAT gateway route, so several interfaces (no public IP) "
                "could not install; give --subnet ZONE=a NAT subnet or --efa all")
    if efa:
        return f"{efa} EFA interface(s) (--efa {opts.efa})"
    return "--efa off: TCP on one interface" if opts.efa == "off" else "no EFA on this instance type: TCP"
