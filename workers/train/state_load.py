"""Load a training state saved by workers.train.state_save: the newest checkpoint that verifies, into
every rank, each tensor read straight to the device it trains on (workers.checkpoint.read).

An FSDP checkpoint resumes on the world size that wrote it with each rank reading only its own
files. On another world size (more or fewer GPUs, or one GPU without FSDP) every rank reads every
rank's files to the host, puts each tensor back together, and loads the full state through
``torch.distributed.checkpoint``'s full-state API, which gives each rank its part: slower and
host-memory hungry (the whole state per process), but the run continues where it stopped. A
checkpoint of a run without FSDP resumes under FSDP the same way.
"""

from __future__ import annotations

import io
import logging
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from errors import CheckpointError, InvalidInput
from workers.checkpoint.format import CheckpointInfo
from workers.checkpoint.read import read_tensors, target_devices
from workers.train.state_save import (
    FORMAT,
    META_FILE,
    REF,
    STATE_FILE,
    distributed,
    model_and_optimizer_state,
    set_rng_state,
    shape_signature,
    state_shapes,
    unwrap,
)

logger = logging.getLogger(__name__)


@dataclass
class LoadedState:
    step: int
    data_position: int
    tokens: int
    loss: float | None
    # (micro_batch, grad_accum) the run was at when it saved: smaller than the plan's after an OOM
    # back-off, which a resume keeps instead of running out of memory again (None: not recorded)
    split: tuple[int, int] | None = None


def _split(meta: dict[str, Any]) -> tuple[int, int] | None:
    split = meta.get("run_split")
    return (int(split[0]), int(split[1])) if isinstance(split, list | tuple) and len(split) == 2 else None


def _unflatten(value: Any, tensors: Sequence[torch.Tensor], mesh: Any) -> Any:
    if isinstance(value, dict):
        if REF in value:
            local = tensors[value[REF]]
            if "placements" not in value:
                return local
            from torch.distributed.tensor import DTensor

            return DTensor.from_local(local.to(mesh.device_type), mesh, value["placements"], run_check=False,
                                      shape=torch.Size(value["shape"]), stride=value["stride"])
        return {k: _unflatten(v, tensors, mesh) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_unflatten(v, tensors, mesh) for v in value)
    return value



# -- load ---------------------------------------------------------------------------------------
def checkpoint_layout(info: CheckpointInfo) -> str:
    """'sharded' | 'legacy'; InvalidInput for a layout this version cannot read (never guessed at)."""
    if META_FILE in info.sha256 or f"rank-{0:04d}/{META_FILE}" in info.sha256:
        return "sharded"
    if STATE_FILE in info.sha256:
        return "legacy"
    raise InvalidInput(
        f"the checkpoint of step {info.step} at {info.uri} is in a layout this version of gpuplan cannot read"
        f" (files: {', '.join(sorted(info.sha256)[:4])})",
        path="checkpoint_uri",
        hint="resume it with the gpuplan version that wrote it, or point checkpoint_uri at a new directory",
    )


def read_sharded(store: Any, info: CheckpointInfo, prefix: str = "",
                 device: torch.device | None = None) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """(meta, tensors) of one rank's part of a sharded checkpoint, every file read in parallel and
    verified against the manifest as it is read; tensors that were on an accelerator go to ``device``
    when one is given (workers.checkpoint.read), the rest to the CPU."""
    meta_rel = prefix + META_FILE
    if meta_rel not in info.sizes:
        raise CheckpointError(f"the checkpoint of step {info.step} has no {meta_rel}",
                              hint="resume on the number of ranks that wrote it")
    raw = bytearray(info.sizes[meta_rel])
    store.read_into(info, meta_rel, memoryview(raw))
    try:
        meta = torch.load(io.BytesIO(bytes(raw)), map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, ValueError, TypeError, AttributeError, ImportError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"the checkpoint of step {info.step}: {meta_rel} cannot be read ({exc})",
                              hint="resume from an older checkpoint (done automatically)") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise InvalidInput(path="checkpoint_uri",
                           message=f"the checkpoint of step {info.step} has state format {found!r}; this version"
                           f" reads format {FORMAT}",
                           hint="resume it with the gpuplan version that wrote it")
    entries = [(rel, offset, nbytes, dtype, tuple(shape)) for rel, offset, nbytes, dtype, shape in meta["tensors"]]
    return meta, read_tensors(store, info, entries, target_devices(meta.get("devices"), len(entries), device))


def load_state(store: Any, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sharded: bool) -> LoadedState | None:
    """Collective: load the newest complete checkpoint into every rank, or None when there is none.
    A checkpoint whose files do not verify is skipped (with a warning) for the one before it."""
    rank = dist.get_rank() if distributed() else 0
    infos = {int(i.step): i for i in store.list()}
    steps: list[Any] = [sorted(infos) if rank == 0 else None]
    if distributed():
        dist.broadcast_object_list(steps, src=0)
    for step in reversed(steps[0]):
        info = infos.get(step)
        loaded: Any = None
        problem: Exception | None = None
        try:
            if info is None:
                raise CheckpointError(f"checkpoint of step {step} vanished while loading it")
            loaded = _read(store, info, rank, sharded, _device_of(model))
        except CheckpointError as exc:  # torn or corrupt: the one before it is tried
            problem = exc
        oks: list[Any] = [problem is None]
        if distributed():
            oks = [None] * dist.get_world_size()
            dist.all_gather_object(oks, problem is None)
        if not all(oks):
            logger.warning("skipping checkpoint step %d: %s", step, problem or "another rank could not read it")
            continue
        assert info is not None
        if loaded == "legacy":
            return _load_legacy(store, info, model=model, optimizer=optimizer, scheduler=scheduler)
        if isinstance(loaded, list):
            return _reshard(loaded, model=model, optimizer=optimizer, scheduler=scheduler)
        if sharded and not loaded[0].get("fsdp"):
            return _reshard([loaded], model=model, optimizer=optimizer, scheduler=scheduler)
        return _apply(loaded[0], loaded[1], model=model, optimizer=optimizer, scheduler=scheduler, sharded=sharded)
    return None


def _device_of(model: torch.nn.Module) -> torch.device | None:
    """The accelerator the model trains on (None on the CPU): where its checkpoint's tensors load to."""
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        return local.device if local.device.type != "cpu" else None
    return None


def fsdp_ranks(info: CheckpointInfo) -> int:
    """How many FSDP ranks wrote ``info`` (0: one state for all ranks)."""
    return sum(1 for rel in info.sha256 if rel.endswith("/" + META_FILE) and rel.startswith("rank-"))


Part = tuple[dict[str, Any], list[torch.Tensor]]


def _read(store: Any, info: CheckpointInfo, rank: int, sharded: bool,
          device: torch.device | None) -> str | Part | list[Part]:
    """What this rank reads of ``info``: 'legacy'; its own part (same layout as the run); or every
    rank's part, on the host, when the checkpoint's FSDP world size is not this run's (resharded)."""
    if checkpoint_layout(info) == "legacy":
        return "legacy"
    ranks = fsdp_ranks(info)
    if not ranks:  # one full state: an FSDP run reads it to the host and keeps only its part
        return read_sharded(store, info, "", None if sharded else device)
    world = dist.get_world_size() if distributed() else 1
    if sharded and ranks == world:
        return read_sharded(store, info, f"rank-{rank:04d}/", device)
    logger.warning("the checkpoint of step %d was written by %d FSDP ranks and this run has %d%s: every rank"
                   " reads all of it and takes its part (slower than a resume on %d ranks)", info.step, ranks,
                   world, "" if sharded else " without FSDP", ranks)
    return [read_sharded(store, info, f"rank-{r:04d}/") for r in range(ranks)]


def _apply(meta: dict[str, Any], tensors: list[torch.Tensor], *, model: torch.nn.Module,
           optimizer: torch.optim.Optimizer, scheduler: Any, sharded: bool) -> LoadedState:
    step = int(meta["step"])
    if bool(meta.get("fsdp")) != sharded:  # load_state routes every other combination through _reshard
        raise InvalidInput(path="checkpoint_uri",
                           message=f"the checkpoint of step {step} does not match this run's FSDP sharding",
                           hint="resume with the sharding that wrote it, or point checkpoint_uri at a new directory")
    live_model, _ = model_and_optimizer_state(model, optimizer, sharded)
    _check_shapes(meta["shapes"], state_shapes(live_model), step)
    mesh = None
    if sharded:
        from torch.distributed.tensor import DTensor

        mesh = next(v.device_mesh for v in live_model.values() if isinstance(v, DTensor))
    state = _unflatten(meta["state"], tensors, mesh)
    frozen = bool(meta.get("trainable_only"))
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=False, ignore_frozen_params=frozen, strict=not frozen)
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"], options=options)
    else:
        unwrap(model).load_state_dict(state["model"], strict=not frozen)
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(meta["scheduler"])
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed() else (0, 1)
    rngs = meta["rng"]
    # Same world size: every rank continues its own RNG stream; otherwise rank 0's is the best guess.
    set_rng_state(rngs[0] if sharded else (rngs[rank] if len(rngs) == world else rngs[0]))
    return LoadedState(step=step, data_position=int(meta["data_position"]), tokens=int(meta["tokens"]),
                       loss=meta.get("loss"), split=_split(meta))


@dataclass(frozen=True)
class _Local:
    """One rank's piece of a tensor: its local bytes, and how the pieces make the whole."""

    tensor: torch.Tensor
    placements: tuple[Any, ...] | None
    shape: tuple[int, ...]


def _locals(value: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if REF in value:
            local = tensors[value[REF]]
            return _Local(local, value.get("placements"), tuple(value.get("shape", local.shape)))
        return {k: _locals(v, tensors) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_locals(v, tensors) for v in value)
    return value


def _merge(pieces: list[Any], step: int) -> Any:
    """The full state from every rank's (same-structured) state: sharded tensors put back together."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as ShardPlacement

    first = pieces[0]
    if isinstance(first, _Local):
        if first.placements is None or all(isinstance(p, Replicate) for p in first.placements):
            return first.tensor
        if len(first.placements) != 1 or not isinstance(first.placements[0], ShardPlacement):
            raise InvalidInput(
                f"the checkpoint of step {step} is sharded as {first.placements}, which cannot be resharded",
                path="checkpoint_uri", hint="resume on the number of workers that wrote it")
        full = torch.cat([piece.tensor for piece in pieces], dim=first.placements[0].dim)
        if tuple(full.shape) != first.shape:
            raise CheckpointError(f"the checkpoint of step {step}: a tensor's pieces make {tuple(full.shape)},"
                                  f" not its recorded shape {first.shape}",
                                  hint="resume on the number of workers that wrote it")
        return full
    if isinstance(first, dict):
        return {k: _merge([piece[k] for piece in pieces], step) for k in first}
    if isinstance(first, list | tuple):
        return type(first)(_merge([piece[i] for piece in pieces], step) for i in range(len(first)))
    return first


def _reshard(parts: list[Part], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any) -> LoadedState:
    """Load an FSDP checkpoint of another world size: put each tensor together from every rank's
    piece, then let torch.distributed.checkpoint's full-state loader give this run's ranks theirs."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    meta = parts[0][0]
    step = int(meta["step"])
    sharded = any(_is_dtensor(p) for p in model.parameters())
    live_model, _ = model_and_optimizer_state(model, optimizer, sharded)
    _check_shapes(meta["shapes"], state_shapes(live_model), step)
    state = _merge([_locals(m["state"], tensors) for m, tensors in parts], step)
    if not meta.get("fsdp"):  # a plain optimizer state, keyed by parameter index
        state["optimizer"] = _keyed_by_name(state["optimizer"], model, optimizer)
    frozen = bool(meta.get("trainable_only"))
    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=frozen, strict=not frozen)
    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"], options=options)
    scheduler.load_state_dict(meta["scheduler"])
    set_rng_state(meta["rng"][0])  # another world size: rank 0's stream is the best guess for every rank
    return LoadedState(step=step, data_position=int(meta["data_position"]), tokens=int(meta["tokens"]),
                       loss=meta.get("loss"), split=_split(meta))


def _keyed_by_name(saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` of a run without FSDP (parameters by index) keyed by parameter name,
    as torch.distributed.checkpoint loads it: the names come from this run's optimizer, group by
    group, in the same order (both optimizers take the trainable parameters in model order)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    template: Any = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))
    names: dict[int, str] = {}
    for group, named in zip(saved["param_groups"], template["param_groups"], strict=True):
        if len(group["params"]) != len(named["params"]):
            raise InvalidInput(
                f"the checkpoint's optimizer has {len(group['params'])} parameters in a group where this run has"
                f" {len(named['params'])}", path="checkpoint_uri",
                hint="resume with the model and fine-tuning method that wrote it")
        names.update(zip(group["params"], named["params"], strict=True))
    return {"state": {names[int(index)]: value for index, value in saved["state"].items()},
            "param_groups": [{**group, "params": named["params"]}
                             for group, named in zip(saved["param_groups"], template["param_groups"], strict=True)]}


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def read_checkpoint_state(store: Any) -> tuple[int, dict[str, torch.Tensor]] | None:
    """(step, full model tensors) of the newest verified checkpoint, any layout (FSDP ranks' shards
    are put together): what tests and tools compare weights with."""
    for info in reversed(store.list()):
        try:
            if checkpoint_layout(info) == "legacy":
                with tempfile.TemporaryDirectory() as tmp:
                    store.restore(info, Path(tmp))
                    state = torch.load(Path(tmp) / STATE_FILE, map_location="cpu", weights_only=False)
                return int(info.step), state["model"]
            ranks = sorted(rel.split("/")[0] + "/" for rel in info.sha256 if rel.endswith("/" + META_FILE))
            parts = [read_sharded(store, info, prefix) for prefix in ranks or [""]]
        except CheckpointError as exc:
            logger.warning("skipping checkpoint step %d: %s", info.step, exc)
            continue
        return int(info.step), _full_model(parts)
    return None


def _full_model(parts: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import Shard as ShardPlacement

    out: dict[str, torch.Tensor] = {}
    for name, ref in parts[0][0]["state"]["model"].items():
        locals_ = [tensors[meta["state"]["model"][name][REF]] for meta, tensors in parts]
        placement = ref.get("placements", (None,))[0]
        if isinstance(placement, ShardPlacement):
            out[name] = torch.cat(locals_, dim=placement.dim)
        else:
            out[name] = locals_[0]
    return out


def _load_legacy(store: Any, info: CheckpointInfo, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any) -> LoadedState:
    """A checkpoint of the single-file layout: the full state, gathered to rank 0 when it was written."""
    rank = dist.get_rank() if distributed() else 0
    with tempfile.TemporaryDirectory(prefix="gpuplan-restore-") as tmp:
        store.restore(info, Path(tmp))
        step = int(info.step)
        try:
            state = torch.load(Path(tmp) / STATE_FILE, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise CheckpointError(f"checkpoint of step {step} cannot be read: {exc}") from exc
    _check_shapes(state.get("shapes", {}), shape_signature(model), step)
    if distributed():
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, state["model"], options=options)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"], options=options)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rngs = state["rng"]
    world = dist.get_world_size() if distributed() else 1
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
