"""Fixtures of the cluster-config tests (test_cluster*.py): moto's server as the AWS account, example plans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from planner.types import Plan
from tests.moto_server import moto_server
from tests.workers.cluster_setup import aws_account, example_plan


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """moto's server on 127.0.0.1 with an instance profile, a bucket and a DLAMI parameter per region;
    yields one boto3 session for all lookups (a session loads each service model once)."""
    with moto_server() as url, pytest.MonkeyPatch.context() as mp:
        yield from aws_account(url, mp, tmp_path_factory)


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {
        "8b-auto": example_plan("llama3-8b-sft.yaml", clouds=["aws"]),  # p4d spot, use1-az1, 2 nodes; both markets
        "8b-always": example_plan("llama3-8b-sft.yaml", clouds=["aws"], spot="always"),
        "8b-never": example_plan("llama3-8b-sft.yaml", clouds=["aws"], spot="never"),
        "70b": example_plan("llama3-70b-lora.yaml", clouds=["aws"]),  # p5en in eu-north-1 (no Ray default AMI there)
    }
