"""Which network NCCL really used, and the environment that lets it use EFA.

pip's torch brings its own NCCL, which finds AWS's libfabric plugin (aws-ofi-nccl) only through
``LD_LIBRARY_PATH``; without it NCCL falls back to TCP sockets on one interface, silently, while the plan
priced the EFA link. A worker type with EFA therefore gets ``EFA_ENV`` (the variables the AWS Deep Learning
AMIs document for NCCL over EFA: the EFA provider, GPUDirect RDMA, fork safety, the plugin's and
libfabric's library folders under ``/opt/amazon``), and every multi-node type NCCL's INFO log in a file per
process (``DEBUG_ENV``). At start each rank reads its own file: ``Using network <name>`` is NCCL's choice
(``AWS Libfabric``/``Libfabric`` or ``NET/OFI``: EFA; ``Socket``: TCP; ``IB``: InfiniBand), and the run
records it (``TrainResult.nccl_network``) with the link speed it then has (``nccl_link_gbps``).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

# the folders the DLAMIs put aws-ofi-nccl in (newer: /opt/amazon/ofi-nccl, older: /opt/aws-ofi-nccl) and libfabric
EFA_LIBRARY_PATH = "/opt/amazon/ofi-nccl/lib:/opt/aws-ofi-nccl/lib:/opt/amazon/efa/lib"
EFA_ENV: Mapping[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",  # GPUDirect RDMA on p4d/p5/p5en/p6
    "FI_EFA_FORK_SAFE": "1",
    "RDMAV_FORK_SAFE": "1",
    "LD_LIBRARY_PATH": f"{EFA_LIBRARY_PATH}:$LD_LIBRARY_PATH",
}
DEBUG_FILE = "/tmp/gpuplan-nccl.%h.%p.log"  # NCCL expands %h (host) and %p (pid)
DEBUG_ENV: Mapping[str, str] = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": DEBUG_FILE}
SOCKET_GBPS_VAR = "GPUPLAN_SOCKET_GBPS"  # the node's TCP speed (one card), set by the cluster YAML
EFA_GBPS_VAR = "GPUPLAN_EFA_GBPS"  # the speed its EFA interfaces give, set by the cluster YAML



def parse_network(log: str) -> str | None:
    """"efa", "socket", "ib" or the name NCCL gave, from NCCL's INFO lines; None before it chose one."""
    chosen: str | None = None
    for line in log.splitlines():
        if "NCCL INFO" not in line:
            continue
        m = re.search(r"Using network (.+?)\s*$", line)
        if m:
            chosen = m.group(1)
        elif chosen is None and "NET/OFI" in line and "Selected provider is efa" in line:
            chosen = "Libfabric"
    if chosen is None:
        return None
    name = chosen.lower()
    if "libfabric" in name or "ofi" in name or "efa" in name:
        return "efa"
    if name.startswith("socket"):
        return "socket"
    if name.startswith("ib"):
        return "ib"
    return name


LINE_PREFIX = "NCCL network: "


def network_line(networks: list[str], gbps: float | None) -> str:
    """The run's log line once NCCL has chosen (``parse_network_line`` reads it back, e.g. in ``status``)."""
    return LINE_PREFIX + ", ".join(networks) + (f" ({gbps:g} Gbit/s)" if gbps else "")


def parse_network_line(line: str) -> tuple[str | None, float | None]:
    """(the slowest network, its Gbit/s) of a ``network_line``, wherever it sits in a log line."""
    m = re.search(re.escape(LINE_PREFIX) + r"([\w, -]+?)(?: \(([\d.]+) Gbit/s\))?\s*$", line)
    if m is None:
        return None, None
    names = [n.strip() for n in m.group(1).split(",") if n.strip()]
    network = "socket" if "socket" in names else (names[0] if names else None)
    return network, float(m.group(2)) if m.group(2) else None


def export_lines(env: Mapping[str, str]) -> list[str]:
    """Shell lines exporting ``env`` (values are ours: paths and numbers, and ``$LD_LIBRARY_PATH``)."""
    return [f"export {k}={v}" for k, v in env.items()]


def own_log(env: Mapping[str, str] | None = None, pid: int | None = None, host: str | None = None) -> Path | None:
    """This process's NCCL debug file, when NCCL_DEBUG_FILE asks for one."""
    pattern = (env if env is not None else os.environ).get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    name = pattern.replace("%h", host or socket.gethostname()).replace("%p", str(pid or os.getpid()))
    return Path(name)


def observed(env: Mapping[str, str] | None = None, pid: int | None = None,
             host: str | None = None) -> tuple[str | None, float | None]:
    """(network NCCL chose, the link speed in Gbit/s the node then has) for this process; (None, None)
    when NCCL logged nothing (no multi-node run, or no debug file asked for)."""
    env = env if env is not None else os.environ
    path = own_log(env, pid, host)
    try:
        text = path.read_text(errors="replace") if path else ""
    except OSError:
        return None, None
    network = parse_network(text)
    var = {"socket": SOCKET_GBPS_VAR, "efa": EFA_GBPS_VAR}.get(network or "")
    try:
        gbps = float(env[var]) if var and env.get(var) else None
    except ValueError:
        gbps = None
    return network, gbps


def network_warning(network: str | None, link_gbps: float | None, planned_gbps: float,
                    planned_tokens_per_s: float | None, tokens_per_s_on_link: float | None) -> str | None:
    """What ``status`` says when a run's network is slower than the one its plan priced (None: it is not)."""
    if network is None or link_gbps is None or link_gbps >= planned_gbps:
        return None
    what = "TCP sockets" if network == "socket" else network
    speed = ""
    if planned_tokens_per_s and tokens_per_s_on_link:
        speed = (f"; at {link_gbps:g} Gbit/s the plan runs at {tokens_per_s_on_link:,.0f} tokens/s, not "
                 f"{planned_tokens_per_s:,.0f}")
    return (f"NCCL ran over {what} ({link_gbps:g} Gbit/s), not the {planned_gbps:g} Gbit/s the plan priced{speed}: "
            "check the worker's EFA setup (aws-ofi-nccl under /opt/amazon, FI_PROVIDER=efa)")
