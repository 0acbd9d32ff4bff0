"""The thread pool every checkpoint read and write runs on (hashlib and file I/O release the GIL)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

IO_THREADS = 8  # files copied/hashed at once: one sha256 stream is ~1 GB/s, a disk or S3 takes more
# Shards written/read at once: each thread hashes its own file as it goes, so more threads = more hashing.
SHARD_THREADS = max(IO_THREADS, min(16, os.cpu_count() or 1))

# -- threads -----------------------------------------------------------------------------------
T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], on_done: Callable[[int], None] | None = None,
                 threads: int = IO_THREADS) -> list[R]:
    """``[fn(i) for i in items]`` on up to ``threads`` threads (hashlib and file I/O release the GIL).

    ``on_done(index)`` runs in the calling thread as each item finishes. The first error is raised
    after the items not yet started are cancelled.
    """
    if len(items) <= 1:
        out = []
        for index, item in enumerate(items):
            out.append(fn(item))
            if on_done is not None:
                on_done(index)
        return out
    results: dict[int, R] = {}
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        futures = {pool.submit(fn, item): index for index, item in enumerate(items)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(futures[future])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] for i in range(len(items))]
