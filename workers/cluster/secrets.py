"""Secrets of the head's server, named in the cluster YAML and read on the head: never their values in the
YAML, in ``ps`` or in a systemd unit's properties.

A reference is ``ssm:NAME`` (an SSM parameter, a SecureString read with decryption) or a Secrets Manager
secret's name or ARN. ``secret_resources`` gives the IAM resources that allow exactly those, and
``check_secret`` asks, at config time, whether one exists without reading its value.
"""

from __future__ import annotations

from typing import Any

from errors import InvalidInput

SSM_PREFIX = "ssm:"


def _code(exc: Exception) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def _ssm_name(ref: str) -> str:
    return ref[len(SSM_PREFIX):]


def check_ref(ref: str, what: str) -> str:
    """``ref`` if it names a secret; refuses an empty one or a value pasted where a name belongs."""
    name = _ssm_name(ref) if ref.startswith(SSM_PREFIX) else ref
    if not name or any(c.isspace() for c in name) or "://" in name:
        raise InvalidInput(f"{what} {ref!r} is not the name of a secret", path=what.replace(" ", "_"),
                           hint="give a Secrets Manager secret's name or ARN, or ssm:/NAME of a SecureString "
                           "parameter; never the value itself")
    return ref


def secret_resources(ref: str, account: str = "ACCOUNT", region: str = "*") -> tuple[str, str]:
    """(IAM action, resource ARN) that reads ``ref`` and nothing else. Secrets Manager appends six random
    characters to a secret's name in its ARN, hence ``-??????``."""
    if ref.startswith(SSM_PREFIX):
        name = _ssm_name(ref).lstrip("/")
        return "ssm:GetParameter", f"arn:aws:ssm:{region}:{account}:parameter/{name}"
    if ref.startswith("arn:"):
        return "secretsmanager:GetSecretValue", ref
    return "secretsmanager:GetSecretValue", f"arn:aws:secretsmanager:{region}:{account}:secret:{ref}-??????"


def read_secret(session: Any, ref: str, region: str | None = None) -> str:
    """The value of ``ref`` in ``region`` (None: the session's), on the head with its instance profile's
    credentials."""
    try:
        if ref.startswith(SSM_PREFIX):
            found = session.client("ssm", region_name=region).get_parameter(Name=_ssm_name(ref), WithDecryption=True)
            return str(found["Parameter"]["Value"])
        client = session.client("secretsmanager", region_name=region)
        return str(client.get_secret_value(SecretId=ref)["SecretString"])
    except Exception as exc:
        code = _code(exc)
        if code in ("ParameterNotFound", "ResourceNotFoundException"):
            raise InvalidInput(f"secret {ref!r} does not exist", path="secret",
                               hint="create it in the cluster's region (aws secretsmanager create-secret --name "
                               "NAME --secret-string ..., or aws ssm put-parameter --type SecureString)") from None
        if code in ("AccessDenied", "AccessDeniedException"):
            raise InvalidInput(f"the head may not read secret {ref!r}", path="secret",
                               hint="give the nodes' role the policy `gpuplan cluster config` prints") from None
        raise


def check_secret(session: Any, ref: str, region: str) -> str:
    """Where ``ref`` was found (for the YAML's notes), without reading its value."""
    try:
        if ref.startswith(SSM_PREFIX):
            found = session.client("ssm", region_name=region).describe_parameters(
                ParameterFilters=[{"Key": "Name", "Option": "Equals", "Values": [_ssm_name(ref)]}])["Parameters"]
            if not found:
                raise InvalidInput(f"SSM parameter {_ssm_name(ref)!r} does not exist in {region}", path="secret",
                                   hint=f"aws ssm put-parameter --region {region} --type SecureString --name "
                                   f"{_ssm_name(ref)} --value ...")
            return f"SSM parameter {_ssm_name(ref)} ({found[0].get('Type', '?')})"
        arn = session.client("secretsmanager", region_name=region).describe_secret(SecretId=ref)["ARN"]
        return f"Secrets Manager {arn}"
    except InvalidInput:
        raise
    except Exception as exc:
        if _code(exc) != "ResourceNotFoundException":
            raise
        raise InvalidInput(f"Secrets Manager secret {ref!r} does not exist in {region}", path="secret",
                           hint=f"aws secretsmanager create-secret --region {region} --name {ref} "
                           "--secret-string ...") from None
