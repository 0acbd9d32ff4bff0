"""Save and restore everything a training run needs to continue exactly: weights, optimizer, LR
schedule, every rank's RNG states and the data position, through the checkpoint store.

Rank 0 writes one file, ``train_state.pt``, holding the full (unsharded) state: with FSDP2 the
ranks gather it collectively first (``torch.distributed.checkpoint.state_dict``, which works over
gloo on CPU as well as NCCL), and each rank takes its own shard back on load. A full state dict
costs a gather at save time but keeps checkpoints independent of the world size and readable bare.
"""

from __future__ import annotations

import copy as copy_module
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from catalog.errors import CheckpointError, InvalidInput

STATE_FILE = "train_state.pt"


@dataclass
class LoadedState:
    step: int
    data_position: int
    tokens: int
    loss: float | None


def shape_signature(model: torch.nn.Module) -> dict[str, list[int]]:
    """Parameter name -> full shape: what a checkpoint must match to be loadable into ``model``."""
    # A DTensor's .shape is its global shape, so this needs no collective under FSDP.
    return {_clean(name): list(param.shape) for name, param in model.named_parameters()}


def _clean(name: str) -> str:
    # DDP and activation checkpointing add wrapper prefixes that are not part of the model's shape.
    for prefix in ("module.", "_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(prefix, "")
    return name


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rebuilt_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys of frozen 4-bit weights (QLoRA's NF4 base). They are rebuilt from the seed or
    the weights file on every start, so checkpoints leave them out: they are most of a QLoRA
    model's bytes, and torchao's copy into an NF4 tensor does not restore it exactly."""
    odd = {name for name, p in model.named_parameters() if not p.requires_grad and type(p.data) is not torch.Tensor}
    if not odd:
        return set()
    from torchao.quantization import NF4Tensor

    # under FSDP2 the parameter is a DTensor whose local shard is the NF4 tensor
    return {name for name, p in model.named_parameters()
            if name in odd and isinstance(getattr(p, "_local_tensor", p), NF4Tensor)}


def _model_and_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                               sharded: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    if not _distributed():
        rebuilt = rebuilt_keys(model)
        return {k: v for k, v in model.state_dict().items() if k not in rebuilt}, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    rebuilt = {_clean(name) for name in rebuilt_keys(model)}
    model_state = {k: v for k, v in get_model_state_dict(model, options=options).items() if k not in rebuilt}
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    return model_state, optim_state


class CheckpointWriter:
    """Writes rank 0's checkpoints in a background thread, one at a time, so training only stops
    for the snapshot into host memory. ``wait`` makes every submitted checkpoint durable (and
    raises the write's error, if any)."""

    def __init__(self, store: Any, on_saved: Callable[[int, float], None] | None = None) -> None:
        self._store = store
        self._on_saved = on_saved
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.write_s = 0.0

    def submit(self, step: int, state: dict[str, Any], metadata: dict[str, Any], *, blocking: bool) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(step, state, metadata), daemon=True,
                                        name=f"gpuplan-checkpoint-{step}")
        self._thread.start()
        if blocking:
            self.wait()

    def _write(self, step: int, state: dict[str, Any], metadata: dict[str, Any]) -> None:
        began = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="gpuplan-ckpt-") as tmp:
                torch.save(state, Path(tmp) / STATE_FILE)
                try:
                    self._store.save(step, Path(tmp), metadata=metadata)
                except CheckpointError:
                    raise
                except Exception as exc:  # a store failure must name the checkpoint, not leak a boto3 trace
                    raise CheckpointError(f"could not save the checkpoint of step {step}: {exc}") from exc
        except BaseException as exc:
            self._error = exc
            return
        took = time.perf_counter() - began
        self.write_s += took
        if self._on_saved is not None:
            self._on_saved(step, took)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def _snapshot(value: Any, copy: bool) -> Any:
    """Host-memory copies of every tensor, so training can go on while the copy is written."""
    if isinstance(value, torch.Tensor):
        # .to() then .clone(), not .to(copy=True): QLoRA's NF4 weights (a torchao tensor subclass) lack copy=
        host = value.detach()
        if host.device.type != "cpu":
            return host.to("cpu")
        return host.clone() if copy else host
    if isinstance(value, dict):
        return {k: _snapshot(v, copy) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_snapshot(v, copy) for v in value)
    return value


def save_state(writer: CheckpointWriter, *, step: int, data_position: int, tokens: int, loss: float | None,
               model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sharded: bool, extra_metadata: dict[str, Any], blocking: bool, on_cpu: bool) -> int | None:
    """Collective: every rank calls it. Rank 0 snapshots and hands the write to ``writer``."""
    rank = dist.get_rank() if _distributed() else 0
    model_state, optim_state = _model_and_optimizer_state(model, optimizer, sharded)
    rngs: list[Any] = [rng_state()]
    if _distributed():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rngs[0])
        rngs = gathered
    saved: int | None = None
    if rank == 0:
        # On CPU a state dict may alias the live parameters (even DDP's "offloaded" one): copy. On
        # GPU, tensors still on the device are copied to the host; offloaded ones are fresh already.
        copy = on_cpu
        state = {
            "step": step,
            "data_position": data_position,
            "tokens": tokens,
            "loss": loss,
            "model": _snapshot(model_state, copy),
            "optimizer": _snapshot(optim_state, copy),
            "scheduler": copy_module.deepcopy(scheduler.state_dict()),
            "rng": rngs,
            "shapes": shape_signature(model),
        }
        metadata = {"step": step, "data_position": data_position, "tokens": tokens, "loss": loss, **extra_metadata}
        writer.submit(step, state, metadata, blocking=blocking)
        saved = step
    if _distributed() and blocking:
        dist.barrier()
    return saved


def load_state(store: Any, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sharded: bool) -> LoadedState | None:
    """Collective: load the newest complete checkpoint into every rank, or None when there is none."""
    rank = dist.get_rank() if _distributed() else 0
    with tempfile.TemporaryDirectory(prefix="gpuplan-restore-") as tmp:
        step: int | None = None
        if rank == 0:
            # Newest checkpoint that verifies; torn or corrupt ones are skipped with a warning.
            found = store.restore_latest(Path(tmp))
            step = None if found is None else int(found[0].step)
        if _distributed():
            chosen: list[Any] = [step]
            dist.broadcast_object_list(chosen, src=0)
            step = chosen[0]
        if step is None:
            return None
        if rank != 0:
            info = next((i for i in store.list() if int(i.step) == step), None)
            if info is None:
                raise CheckpointError(f"checkpoint of step {step} vanished while loading it",
                                      hint="another run may be writing the same checkpoint directory")
            store.restore(info, Path(tmp))
        try:
            state = torch.load(Path(tmp) / STATE_FILE, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise CheckpointError(f"checkpoint of step {step} cannot be read: {exc}") from exc
    _check_shapes(state.get("shapes", {}), shape_signature(model), step)
    if _distributed():
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        rebuilt = rebuilt_keys(model)
        set_model_state_dict(model, state["model"], options=StateDictOptions(full_state_dict=True, strict=not rebuilt))
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"], options=options)
    else:
        rebuilt = rebuilt_keys(model)
        result = model.load_state_dict({k: v for k, v in state["model"].items() if k not in rebuilt},
                                       strict=not rebuilt)
        if set(result.missing_keys) - rebuilt or result.unexpected_keys:
            raise CheckpointError(f"checkpoint of step {step} does not match the model: missing "
                                  f"{sorted(set(result.missing_keys) - rebuilt)[:3]}, unexpected "
                                  f"{result.unexpected_keys[:3]}")
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rngs = state["rng"]
    world = dist.get_world_size() if _distributed() else 1
    # Same world size: every rank continues its own RNG stream; otherwise rank 0's is the best guess.
    set_rng_state(rngs[rank] if len(rngs) == world else rngs[0])
    return LoadedState(step=int(state["step"]), data_position=int(state["data_position"]),
                       tokens=int(state["tokens"]), loss=state.get("loss"))


def _check_shapes(saved: dict[str, list[int]], current: dict[str, list[int]], step: int) -> None:
    if saved == current:
        return
    missing = sorted(set(current) - set(saved))
    extra = sorted(set(saved) - set(current))
    differing = [name for name in current if name in saved and saved[name] != current[name]]
    if differing:
        name = differing[0]
        detail = f"{name} is {saved[name]} in the checkpoint but {current[name]} in this model"
    elif missing:
        detail = f"the checkpoint has no {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    else:
        detail = f"the checkpoint has {extra[0]}, which this model lacks"
    raise InvalidInput(
        f"the checkpoint of step {step} was written by a model of a different shape: {detail}",
        path="checkpoint_uri",
        hint="train with the model that wrote it, or point checkpoint_uri at a new directory "
        "(the existing checkpoints were left untouched)",
    )
