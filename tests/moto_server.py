"""moto's real S3/EC2/SSM HTTP server on 127.0.0.1, for every test that talks to "AWS"."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
REGION = "us-east-1"


@contextmanager
def moto_server() -> Iterator[str]:
    """Start moto on a free port; yields its endpoint URL and stops it on exit."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def use_moto(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """Every boto3 client made from here on (and in processes started from here) reaches moto at ``url``
    with test credentials; a developer's own AWS profile or session is never used."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {"AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": REGION, **TEST_CREDENTIALS}.items():
        monkeypatch.setenv(key, value)


def moto_s3(url: str) -> Any:
    """A boto3 S3 client on moto at ``url``, whatever the environment says."""
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


# The IAM action AWS checks for each S3 operation the product calls ("Actions, resources, and condition
# keys for Amazon S3" in AWS's Service Authorization Reference). HeadBucket has no action of its own: it
# is ListBucket on the bucket, with no s3:prefix in the request. An operation not listed keeps its name.
S3_ACTIONS = {
    "HeadBucket": "ListBucket", "ListObjectsV2": "ListBucket", "ListObjects": "ListBucket",
    "HeadObject": "GetObject", "CreateMultipartUpload": "PutObject", "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject", "ListParts": "ListMultipartUploadParts",
    "DeleteObjects": "DeleteObject",
}


@contextmanager
def as_policy_user(url: str, policy: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """From here on moto (at ``url``) enforces IAM, and every boto3 client made from the environment is an
    IAM user holding exactly ``policy``; yields that user's keys. Enforcement is switched off on exit.

    moto names the IAM action of an S3 request after its API operation (``s3:HeadBucket``,
    ``s3:ListObjectsV2``, ``s3:UploadPart``), which AWS does not: for the duration, each operation is
    authorized as the action AWS checks for it (``S3_ACTIONS``)."""
    import json
    import uuid

    import boto3
    import httpx
    from moto.iam.access_control import S3IAMRequest

    use_moto(monkeypatch, url)
    iam = boto3.client("iam", endpoint_url=url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    user = f"gpuplan-node-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="gpuplan", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    keys = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # its credentials are cached from the first client made
    check = S3IAMRequest.check_action_permitted

    def check_as_aws(request: Any, resource: str) -> None:
        service, _, operation = request._action.partition(":")
        request._action = f"{service}:{S3_ACTIONS.get(operation, operation)}"
        check(request, resource)

    monkeypatch.setattr(S3IAMRequest, "check_action_permitted", check_as_aws)
    httpx.post(f"{url}/moto-api/reset-auth", content=b"0").raise_for_status()  # enforce from the next request on
    try:
        yield keys
    finally:
        httpx.post(f"{url}/moto-api/reset-auth", content=b"inf").raise_for_status()
