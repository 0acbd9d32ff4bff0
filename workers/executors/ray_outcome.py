"""What a Ray attempt ends with: its outcome in words (rank 0's error, Ray Train's root cause, the resumes on
the way), and the record its driver leaves next to the Ray Train run (``{storage_path}/gpuplan-attempts/
{handle}.json``), which answers ``status`` and ``logs`` once the driver actor is gone (workers.executors.ray_attempt).
"""

from __future__ import annotations

import json
from typing import Any

from workers.executors.protocol import RunProgress

FAILED_PREFIX = "gpuplan-failed: "


def _record_location(storage_path: str, handle: str) -> tuple[Any, str]:
    import pyarrow.fs  # type: ignore[import-untyped]

    fs, root = pyarrow.fs.FileSystem.from_uri(storage_path)
    return fs, f"{root.rstrip('/')}/gpuplan-attempts/{handle}.json"


def write_record(storage_path: str, handle: str, record: dict[str, Any]) -> None:
    fs, path = _record_location(storage_path, handle)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(record, default=str).encode())


def read_record(storage_path: str, handle: str) -> dict[str, Any] | None:
    """The record a finished attempt's driver left, with its progress as a RunProgress; None if none."""
    import pyarrow.fs

    fs, path = _record_location(storage_path, handle)
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        record: dict[str, Any] = json.loads(stream.read().decode())
    record["snapshot"]["progress"] = RunProgress(**record["snapshot"]["progress"])
    return record


def rank0_outcome(result: Any) -> str:
    """"ok", or FAILED_PREFIX and the error rank 0 returned (bad input ends the run rather than raise,
    workers.executors.ray_loop)."""
    value = getattr(result, "return_value", None)
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return FAILED_PREFIX + str(value["error"])
    return "ok"


def resume_note(snapshot: dict[str, Any], task: str = "train") -> str:
    resumes = int(snapshot.get("resumes", 0))
    progress = snapshot["progress"]
    if not resumes:
        return ""
    if task == "infer":
        return f"; resumed {resumes} time(s), last with {progress.resumed_from_step} requests already written"
    return f"; resumed {resumes} time(s), last from the checkpoint of step {progress.resumed_from_step}"


def failure_message(exc: BaseException) -> str:
    """The root cause of a Ray Train failure in one line, without Ray's wrapping."""
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        rank, error = sorted(failures.items())[0]
        cause = getattr(error, "cause", None) or error
        text = str(cause).strip().splitlines()
        return f"training failed on rank {rank}: {text[-1] if text else type(cause).__name__}"
    controller = getattr(exc, "controller_failure", None)
    if controller is not None:
        return f"Ray Train controller failed: {controller}"
    return f"{type(exc).__name__}: {exc}"
