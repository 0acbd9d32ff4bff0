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
