"""Which network NCCL used (workers.cluster.nccl_net): NCCL's own INFO lines parsed, and a real training run that
reads its rank's NCCL log after the first step and records the network and its link on the result (which
the scheduler keeps as the attempt's metrics)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.workers.tiny import cpu_strategy, tiny_spec, write_config
from workers.cluster import nccl_net
from workers.train.hooks import TrainHooks
from workers.train.loop import TrainJob, run_training

# NCCL 2.2x INFO lines as a p5 rank writes them: with aws-ofi-nccl loaded, and without it (TCP sockets)
EFA_LOG = """ip-10-0-1-5:4242:4242 [0] NCCL INFO Bootstrap : Using ens32:10.0.1.5<0>
ip-10-0-1-5:4242:4242 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)
ip-10-0-1-5:4242:4242 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
ip-10-0-1-5:4242:4242 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
ip-10-0-1-5:4242:4242 [0] NCCL INFO Using network Libfabric
"""
SOCKET_LOG = """ip-10-0-1-5:4242:4242 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
ip-10-0-1-5:4242:4242 [0] NCCL INFO NET/Socket : Using [0]ens32:10.0.1.5<0>
ip-10-0-1-5:4242:4242 [0] NCCL INFO Using network Socket
"""


def test_nccls_own_lines_name_the_network() -> None:
    assert nccl_net.parse_network(EFA_LOG) == "efa"
    assert nccl_net.parse_network(SOCKET_LOG) == "socket"
    assert nccl_net.parse_network("x NCCL INFO Using network AWS Libfabric\n") == "efa"
    assert nccl_net.parse_network("x NCCL INFO Using network IB\n") == "ib"
    assert nccl_net.parse_network("x NCCL INFO Bootstrap : Using ens32\n") is None  # not chosen yet


def test_a_run_on_sockets_records_it_and_its_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a p5 whose NCCL fell back to TCP: the cluster YAML's variables, NCCL's log of this process."""
    pattern = str(tmp_path / "nccl.%h.%p.log")
    monkeypatch.setenv("NCCL_DEBUG_FILE", pattern)
    monkeypatch.setenv(nccl_net.SOCKET_GBPS_VAR, "100")
    monkeypatch.setenv(nccl_net.EFA_GBPS_VAR, "3200")
    Path(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))).write_text(SOCKET_LOG)
    job = TrainJob(job_id="t", spec=tiny_spec(write_config(tmp_path / "m"), steps=2, interval=2),
                   strategy=cpu_strategy(), checkpoint_uri=str(tmp_path / "ck"), device="cpu", cpu_threads=1)
    lines: list[str] = []

    class Hooks(TrainHooks):
        def on_log(self, line: str) -> None:
            lines.append(line)

    result = run_training(job, Hooks())
    assert (result.nccl_network, result.nccl_link_gbps) == ("socket", 100.0)
    assert result.to_dict()["nccl_network"] == "socket"
    assert "NCCL network: socket (100 Gbit/s)" in lines


def test_a_run_without_an_nccl_log_records_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    job = TrainJob(job_id="t", spec=tiny_spec(write_config(tmp_path / "m"), steps=1, interval=1),
                   strategy=cpu_strategy(), checkpoint_uri=str(tmp_path / "ck"), device="cpu", cpu_threads=1)
    result = run_training(job)
    assert (result.nccl_network, result.nccl_link_gbps) == (None, None)


def test_the_warning_says_what_ran_and_the_speed_on_that_link() -> None:
    said = nccl_net.network_warning("socket", 100.0, 3200.0, 52_000.0, 31_000.0)
    assert said is not None and "TCP sockets (100 Gbit/s)" in said and "3200 Gbit/s" in said
    assert "31,000 tokens/s, not 52,000" in said
    assert nccl_net.network_warning("efa", 3200.0, 3200.0, 52_000.0, 52_000.0) is None
    assert nccl_net.network_warning(None, None, 3200.0, None, None) is None
