"""gpuplan run reads this machine's available memory (the planner's check of it: tests/planner/test_cpu.py)."""

from __future__ import annotations

from workers.executors.local_runner import available_ram_bytes


def test_available_ram_is_read_from_this_machine() -> None:
    import os
    import sys

    ram = available_ram_bytes()
    if sys.platform != "linux":
        assert ram is None
        return
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert ram is not None and 64 * 2**20 < ram <= total  # bytes (meminfo says kB), at most all of it
