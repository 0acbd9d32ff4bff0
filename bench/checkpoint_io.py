"""Checkpoint store save/verify/restore speed on local disk, against a plain copy of the same files.

Writes ``--shards`` files of random bytes totalling ``--size-gib`` (a stand-in for model +
optimizer shards), then times, ``--repeats`` times each:
  copy     shutil.copy of every file + fsync (the floor for any durable copy)
  save     LocalStore.save: copy while hashing, fsync, re-read to verify, marker, rename, prune
  move     LocalStore.save(move=True) of a same-filesystem copy: rename + hash in place + fsync
  latest   LocalStore.latest(): re-hashes every byte of the newest checkpoint
  restore  LocalStore.restore: copy while hashing into a fresh directory

    python3 bench/checkpoint_io.py --size-gib 4 --shards 4 --dir /tmp/ckbench --out $OUT/ckpt.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.checkpoint import LocalStore

GIB = 1024**3


def _write_source(src: Path, size: int, shards: int) -> None:
    src.mkdir(parents=True, exist_ok=True)
    block = os.urandom(64 * 1024 * 1024)
    per = size // shards
    for i in range(shards):
        with (src / f"shard-{i:02d}.bin").open("wb") as fh:
            left = per
            while left > 0:
                fh.write(block[: min(left, len(block))])
                left -= len(block)


def _plain_copy(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        shutil.copyfile(f, dst / f.name)
        with (dst / f.name).open("rb+") as fh:
            os.fsync(fh.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=4)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    size = int(args.size_gib * GIB)
    root = args.dir
    shutil.rmtree(root, ignore_errors=True)
    _write_source(root / "src", size, args.shards)
    store = LocalStore(root / "store", keep=2)
    rows: dict[str, list[float]] = {"copy": [], "save": [], "move": [], "latest": [], "restore": []}
    for rep in range(args.repeats):
        t = time.perf_counter()
        _plain_copy(root / "src", root / f"copy-{rep}")
        rows["copy"].append(time.perf_counter() - t)
        t = time.perf_counter()
        store.save(2 * rep + 1, root / f"copy-{rep}", metadata={"rep": rep}, move=True)
        rows["move"].append(time.perf_counter() - t)
        t = time.perf_counter()
        store.save(2 * rep + 2, root / "src", metadata={"rep": rep})
        rows["save"].append(time.perf_counter() - t)
        t = time.perf_counter()
        info = store.latest()
        rows["latest"].append(time.perf_counter() - t)
        assert info is not None and info.step == 2 * rep + 2
        t = time.perf_counter()
        store.restore(info, root / f"restore-{rep}")
        rows["restore"].append(time.perf_counter() - t)
        shutil.rmtree(root / f"restore-{rep}")
        print({k: round(v[-1], 3) for k, v in rows.items()}, flush=True)
    result = {
        "size_bytes": size,
        "shards": args.shards,
        "cpu_count": os.cpu_count(),
        "seconds_median": {k: sorted(v)[len(v) // 2] for k, v in rows.items()},
        "gib_per_s_median": {k: size / GIB / sorted(v)[len(v) // 2] for k, v in rows.items()},
        "raw_seconds": rows,
        "checkpoint_dir_bytes": sum(f.stat().st_size for f in (store.root).rglob("*") if f.is_file()),
    }
    shutil.rmtree(root, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
