"""The CUDA caching allocator's setting every worker runs with (no torch import here).

Workers set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless the user set the variable,
as torchtitan does. With PyTorch's stock setting an H200 run of a plan whose allocated memory the
planner predicted within 0.2% held 14.6 GiB reserved but unusable and died of OOM; with expandable
segments the same plan ran. The planner's reserved-memory model assumes this setting
(``planner.calibration.MemoryCalibration.allocator``).

The allocator reads the variable when CUDA initialises, so every worker entry calls
:func:`configure_allocator` before its first CUDA call. Where CUDA is already initialised in the
process (a second run in the same process, or Ray Train having set the device first), the setting
is also applied at run time, which takes effect for the memory mapped from then on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
DEFAULT_ALLOC_CONF = "expandable_segments:True"


def allocator_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The variable a worker process should start with: the user's value, else the default."""
    env = os.environ if environ is None else environ
    return {ALLOC_CONF_ENV: env.get(ALLOC_CONF_ENV) or DEFAULT_ALLOC_CONF}


def configure_allocator(environ: MutableMapping[str, str] | None = None) -> str:
    """Set the default allocator setting unless the user set one; returns the setting in effect."""
    env = os.environ if environ is None else environ
    user = env.get(ALLOC_CONF_ENV)
    if user:
        return user
    env[ALLOC_CONF_ENV] = DEFAULT_ALLOC_CONF
    torch = sys.modules.get("torch")  # only if already imported: importing it here would cost seconds
    if torch is not None and env is os.environ and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(DEFAULT_ALLOC_CONF)
    return DEFAULT_ALLOC_CONF
