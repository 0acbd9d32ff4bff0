"""How a cluster node installs gpuplan: pinned, cached, and reinstalled when its code changes.

- **pinned**: every ``pip install`` takes ``-c`` the constraints file shipped in ``workers/data/`` (the GPU
  stack the planner is calibrated on, torch and torchao included; the rest as the tests run them), mounted
  on each node;
- **cached**: the wheels live in a wheelhouse on the node (``~/gpuplan-wheels``) and, with an S3 checkpoint
  root, under ``<root>/_wheels/<constraints digest>/``. A node first fetches that prefix (same region: no
  package index, no gigabytes from the internet) and installs with ``--no-index``; only when something is
  missing does it download from the index and put the wheelhouse back for the next node;
- **repeatable across rebuilds**: gpuplan itself is reinstalled (``--force-reinstall --no-deps``) whenever
  the sha256 of its wheel, or of the checkout's files, differs from the one installed last; pip alone skips
  a rebuilt wheel of the same version and leaves the old code.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from errors import InvalidInput

RAY_PIN = "ray[default,train]==2.60.0"  # default: dashboard and job submission; the project's Ray version
VENV = "$HOME/gpuplan-venv"
CONSTRAINTS = Path(__file__).resolve().parents[1] / "data" / "cluster-constraints.txt"
NODE_CONSTRAINTS = "~/gpuplan-dist/constraints.txt"
WHEELHOUSE = "$HOME/gpuplan-wheels"
STAMP = "$HOME/gpuplan-venv/.gpuplan-installed"  # the sha256 of the gpuplan code installed last
BUILT = "~/gpuplan-dist/built"  # a --source-dir checkout's wheel, built on the node


def constraints_digest(path: Path = CONSTRAINTS) -> str:
    """Names the S3 wheelhouse: other pins, other wheels."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def package_source(wheel: str | None, source_dir: str | None) -> tuple[dict[str, str], str, str]:
    """(file mounts, the wheel's path on the node, a shell expression of its content's sha256); a checkout
    is built into a wheel on the node first (``build_commands``)."""
    if wheel:
        name = wheel.rstrip("/").rsplit("/", 1)[-1]
        if not name.endswith(".whl"):
            raise InvalidInput(f"{wheel!r} is not a wheel file", path="wheel",
                               hint="build one from the gpuplan checkout: pip wheel --no-deps -w dist .")
        package = f"~/gpuplan-dist/{name}"
        return {package: wheel}, package, f"$(sha256sum {package} | cut -d' ' -f1)"
    if source_dir:
        digest = ("$(cd ~/gpuplan && find . -type f -not -path './.git/*' -print0 | sort -z"
                  " | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)")
        return {"~/gpuplan": source_dir}, f"{BUILT}/gpuplan-*.whl", digest
    raise InvalidInput(
        "no gpuplan to install on the nodes: gpuplan is not published on PyPI",
        path="wheel",
        hint="give --wheel dist/gpuplan-*.whl (pip wheel --no-deps -w dist . in the checkout) or --source-dir .",
    )


def pip_commands(package: str, digest: str, checkpoint_root: str | None) -> list[str]:
    """The setup commands that install Ray and gpuplan into the venv from the wheelhouse."""
    pip, wheels = f"{VENV}/bin/pip", WHEELHOUSE
    want = f'"{RAY_PIN}" {package}'
    local = f"{pip} install -q --no-index --find-links {wheels} -c {NODE_CONSTRAINTS} {want}"
    # wheels only (an sdist is built here, once): the --no-index install needs no build tools from the index
    fetch = f"{pip} wheel -q -w {wheels} -c {NODE_CONSTRAINTS} {want}"
    root = checkpoint_root or ""
    s3 = f"{root.rstrip('/')}/_wheels/{constraints_digest()}" if root.startswith("s3://") else None
    pull = [f"aws s3 sync --only-show-errors {shlex.quote(s3)} {wheels} || true"] if s3 else []
    push = f" && (aws s3 sync --only-show-errors {wheels} {shlex.quote(s3)} || true)" if s3 else ""
    return [
        f"mkdir -p {wheels}",
        *pull,
        f"{local} || {{ {fetch} && {local}{push}; }}",
        # the same version rebuilt is new code: pip would keep the old one
        f'h={digest}; test "$h" = "$(cat {STAMP} 2>/dev/null)" || {{ {pip} install -q --no-index --find-links '
        f'{wheels} -c {NODE_CONSTRAINTS} --force-reinstall --no-deps {package} && echo "$h" > {STAMP}; }}',
    ]


def install_commands(wheel: str | None, source_dir: str | None, checkpoint_root: str | None,
                     bucket_region: str | None = None) -> tuple[dict[str, str], list[str]]:
    """File mounts and setup commands: Python >= 3.11 in a venv, then ``pip_commands``."""
    mounts, package, digest = package_source(wheel, source_dir)
    mounts[NODE_CONSTRAINTS] = str(CONSTRAINTS)
    venv = VENV
    commands = [
        # the DLAMI's python3 is 3.12; Ubuntu keeps venv apart and may still be upgrading at boot
        "sudo apt-get -o DPkg::Lock::Timeout=600 update -q"
        " && sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv",
        f"test -x {venv}/bin/python || python3 -m venv {venv}",
        # Ray runs every command in `bash -i` after `source ~/.bashrc`: the venv first on PATH everywhere
        f"grep -q gpuplan-venv ~/.bashrc || sed -i '1i export PATH={venv}/bin:$PATH' ~/.bashrc",
        *([f"grep -q AWS_DEFAULT_REGION ~/.bashrc || sed -i '1i export AWS_DEFAULT_REGION={bucket_region}' ~/.bashrc"]
          if bucket_region else []),  # boto3 and Ray Train's pyarrow reach the bucket in its region
        f"{venv}/bin/pip install -q -U pip",
        *([f"rm -rf {BUILT} && {venv}/bin/pip wheel -q --no-deps -w {BUILT} ~/gpuplan"] if source_dir and not wheel
          else []),
        *pip_commands(package, digest, checkpoint_root),
    ]
    return mounts, commands
