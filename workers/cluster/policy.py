"""Whether an IAM role's policies grant the statements gpuplan's nodes need (``gpuplan cluster check``).

A role gets its permissions from inline policies and from attached managed ones (customer managed, or AWS's
own such as AmazonS3FullAccess), each read at its default version. A wanted statement is granted when one
Allow statement without a condition covers all its actions and all its resources, by IAM's wildcards (``*``
and ``?``; actions in any case): ``s3:*`` on ``*`` covers ``s3:PutObject`` on ``arn:aws:s3:::bucket/runs/*``,
and ``arn:aws:s3:::bucket/*`` covers ``arn:aws:s3:::bucket/runs/*``. Conditions, NotAction, NotResource,
Deny statements, permission boundaries and SCPs are not weighed: what is reported missing is missing, what is
reported granted holds unless one of those takes it away.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

Grant = tuple[set[str], set[str]]  # (action patterns, resource patterns) of one Allow statement


def missing_statements(iam: Any, role: str, wanted: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The statements of the policy ``wanted`` that no policy of ``role`` (inline or attached) grants."""
    grants = [grant for document in role_documents(iam, role) for grant in allows(document)]
    return [s for s in wanted["Statement"] if not any(covers(grant, s) for grant in grants)]


def role_documents(iam: Any, role: str) -> Iterator[dict[str, Any]]:
    """The policy documents of ``role``: its inline policies, then its attached policies' default versions."""
    for page in iam.get_paginator("list_role_policies").paginate(RoleName=role):
        for name in page["PolicyNames"]:
            yield _document(iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
    for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=role):
        for attached in page["AttachedPolicies"]:
            arn = attached["PolicyArn"]
            version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
            yield _document(iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"])


def allows(document: Mapping[str, Any]) -> list[Grant]:
    """The unconditional Allow statements of a policy document, as (actions, resources)."""
    statements = document.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    return [(as_set(s.get("Action")), as_set(s.get("Resource"))) for s in statements
            if s.get("Effect") == "Allow" and not s.get("Condition") and "Action" in s and "Resource" in s]


def covers(grant: Grant, statement: Mapping[str, Any]) -> bool:
    """Whether ``grant`` allows every action of ``statement`` on every resource of it."""
    actions, resources = grant
    return (all(any(fnmatchcase(a.lower(), g.lower()) for g in actions) for a in as_set(statement["Action"]))
            and all(any(fnmatchcase(r, g) for g in resources) for r in as_set(statement["Resource"])))


def as_set(value: Any) -> set[str]:
    return {value} if isinstance(value, str) else set(value or ())


def _document(document: Any) -> dict[str, Any]:
    """A policy document as boto3 returns it (decoded) or as IAM sends it (a JSON string)."""
    return json.loads(document) if isinstance(document, str) else dict(document)
