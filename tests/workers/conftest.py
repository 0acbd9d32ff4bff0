"""Fixtures of the cluster-config tests (test_cluster*.py): moto's server as the AWS account, example plans; and of the
compiled decoder's tests (test_decode.py, test_gqa_attention.py): torch.compile on dynamo's eager backend."""

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
    # The 8B plans are pinned to 16 x A100-40GB: these tests need a two-node plan (EFA, placement groups, a
    # cluster's max_workers), which the cheapest choice stops being whenever the calibration moves (it chose
    # one node after the 2026-12-04 refit, two before)
    two_nodes = {"accelerators": ["A100-40GB:16"], "regions": ["us-east-1"]}
    return {
        "8b-auto": example_plan("llama3-8b-sft.yaml", clouds=["aws"], **two_nodes),  # p4d x 2, use1-az1
        "8b-always": example_plan("llama3-8b-sft.yaml", clouds=["aws"], **two_nodes, spot="always"),
        "8b-never": example_plan("llama3-8b-sft.yaml", clouds=["aws"], **two_nodes, spot="never"),
        "70b": example_plan("llama3-70b-lora.yaml", clouds=["aws"]),  # p5en in eu-north-1 (no Ray default AMI there)
    }


def _dynamo_eager(monkeypatch: pytest.MonkeyPatch, fullgraph: bool | None) -> Iterator[None]:
    """GraphDecoder's torch.compile with dynamo's "eager" backend: the same guards and recompiles as
    reduce-overhead's CUDA graphs (those are decided by dynamo, before any backend), without inductor's
    C++ builds on CPU; a recompile raises, and with ``fullgraph`` a graph break too (None: the caller's choice).
    (dynamo's config through its own patch: undoing a monkeypatched setattr on that module deletes the option for
    every later test of the process.)"""
    import torch

    compile_ = torch.compile

    def eager(fn: Any, **kwargs: Any) -> Any:
        whole = kwargs.get("fullgraph", False) if fullgraph is None else fullgraph
        return compile_(fn, backend="eager", fullgraph=whole, dynamic=kwargs.get("dynamic"))

    monkeypatch.setattr(torch, "compile", eager)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


@pytest.fixture
def eager_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from _dynamo_eager(monkeypatch, fullgraph=None)


@pytest.fixture
def one_graph_compile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As ``eager_compile``, and the step must trace as one graph: a graph break raises."""
    yield from _dynamo_eager(monkeypatch, fullgraph=True)
