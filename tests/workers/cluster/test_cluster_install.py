"""A cluster node's install (workers.cluster.install): pinned to the constraints file, served from the S3
wheelhouse on a replacement node, and gpuplan reinstalled when its wheel's content changes. The setup
commands run in bash with stand-ins for pip and the AWS CLI that act on real folders."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from workers.cluster.install import CONSTRAINTS, constraints_digest, install_commands

ROOT = Path(__file__).resolve().parents[3]

# pip: `wheel -w DIR` puts a wheel in DIR; `install --no-index --find-links DIR` fails on an empty DIR (what
# pip does when a requirement has no wheel there); every call is recorded
PIP = r"""#!/bin/bash
printf '%s\n' "--- pip" "$@" >> "$HOME/calls"
if [ "$1" = wheel ]; then
  shift; while [ $# -gt 0 ]; do [ "$1" = -w ] && touch "$2/torch-2.11.0-x.whl"; shift; done; exit 0
fi
prev=""; for a in "$@"; do [ "$prev" = --find-links ] && dir="$a"; prev="$a"; done
case " $* " in *" --no-index "*) [ -n "$(ls -A "$dir" 2>/dev/null)" ] || exit 1;; esac
exit 0
"""
# aws s3 sync SRC DST between a folder and s3://bucket/... kept under $FAKE_S3
AWS = r"""#!/bin/bash
printf '%s\n' "--- aws" "$@" >> "$HOME/calls"
args=()
for a in "$@"; do
  case "$a" in s3|sync|--only-show-errors) ;; s3://*) args+=("$FAKE_S3/${a#s3://}");; *) args+=("$a");; esac
done
mkdir -p "${args[0]}" "${args[1]}" && cp -r "${args[0]}/." "${args[1]}/"
"""


def test_every_dependency_is_pinned_within_the_projects_ranges() -> None:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            spec = next(iter(req.specifier))
            assert spec.operator == "==", line
            pins[req.name.lower()] = spec.version
    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    for dep in deps:
        assert dep.name.lower() in pins, f"{dep.name} is not pinned in {CONSTRAINTS.name}"
        assert dep.specifier.contains(pins[dep.name.lower()], prereleases=True), (dep, pins[dep.name.lower()])
    assert (pins["torch"], pins["torchao"]) == ("2.11.0", "0.17.0")  # the stack the calibration was measured on


def _node(tmp_path: Path, name: str, wheel: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / name
    venv, stubs = home / "gpuplan-venv" / "bin", tmp_path / "bin"
    venv.mkdir(parents=True)
    (venv / "pip").write_text(PIP)
    (venv / "pip").chmod(0o755)
    stubs.mkdir(exist_ok=True)
    (stubs / "aws").write_text(AWS)
    (stubs / "aws").chmod(0o755)
    (home / "gpuplan-dist").mkdir()
    (home / "gpuplan-dist" / wheel.name).write_bytes(wheel.read_bytes())  # what Ray's file mount puts there
    return home, {"HOME": str(home), "PATH": f"{stubs}:/usr/bin:/bin", "FAKE_S3": str(tmp_path / "s3")}


def _setup(home: Path, env: dict[str, str], wheel: Path) -> list[list[str]]:
    _, commands = install_commands(str(wheel), None, "s3://bucket/runs")
    for cmd in commands[4:]:  # after apt, the venv and ~/.bashrc
        done = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (cmd, done.stderr)
    calls = [b.strip().split("\n") for b in (home / "calls").read_text().split("--- ")[1:]]
    (home / "calls").unlink()
    return calls


def test_a_replacement_node_installs_from_the_s3_wheelhouse_not_the_index(tmp_path: Path) -> None:
    wheel = tmp_path / "gpuplan-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"v1")
    first, env = _node(tmp_path, "node1", wheel)
    calls = _setup(first, env, wheel)
    assert [c[1] for c in calls if c[0] == "pip"].count("wheel") == 1  # the first node fetches once
    assert all("-c" in c and "~/gpuplan-dist/constraints.txt".replace("~", str(first)) in c
               for c in calls if c[0] == "pip" and c[1] in ("install", "wheel") and "-U" not in c)
    wheelhouse = tmp_path / "s3" / "bucket" / "runs" / "_wheels" / constraints_digest()
    assert (wheelhouse / "torch-2.11.0-x.whl").exists()  # and leaves the wheels for the next node
    second, env2 = _node(tmp_path, "node2", wheel)
    calls = _setup(second, env2, wheel)
    assert not [c for c in calls if c[0] == "pip" and c[1] == "wheel"]  # nothing from the package index
    assert (second / "gpuplan-wheels" / "torch-2.11.0-x.whl").exists()


def test_a_rebuilt_wheel_of_the_same_version_is_reinstalled(tmp_path: Path) -> None:
    wheel = tmp_path / "gpuplan-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"v1")
    home, env = _node(tmp_path, "head", wheel)

    def reinstalls() -> int:
        return sum("--force-reinstall" in c for c in _setup(home, env, wheel) if c[0] == "pip")

    assert reinstalls() == 1  # the first install
    assert reinstalls() == 0  # ray up again, the same code: nothing to do
    wheel.write_bytes(b"v2, same version")
    (home / "gpuplan-dist" / wheel.name).write_bytes(wheel.read_bytes())
    assert reinstalls() == 1
