"""A sharded model built once: rank 0 builds the whole weights in host memory and every rank receives only its
FSDP2 shard (workers.train.setup; planner.host_memory.builds_once prices the same). Put back together, the
shards are exactly the model one process builds with the same seed or reads from the same folder, buffers and
tied embeddings included, and a training step keeps the tie. A full fine-tune about to load a checkpoint skips
that build (the checkpoint replaces every weight) and still has its rotary buffers; when no listed checkpoint
verifies, the run draws its weights as a fresh start does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.ranks import gloo, run_ranks
from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.model.build import build_model, resolve_model_source
from workers.train.setup import _adapt, prepare_model

pytestmark = pytest.mark.slow
SEED = 3


def _strategy(finetune: str) -> Any:
    lora = {"lora_rank": 4} if finetune == "lora" else {}
    return cpu_strategy(workers=2, sharding="fsdp", finetune=finetune, activation_checkpointing=True, **lora)


def _rank_main(rank: int, port: int, results: Any, folder: str, finetune: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    def whole(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}

    with gloo(rank, port):
        source = resolve_model_source(tiny_spec(Path(folder) / "config.json"))
        model, sharded, pending = prepare_model(_strategy(finetune), SEED, source, torch.device("cpu"), world=2)
        assert not pending
        built = whole(model)
        buffers = {name: b.clone() for name, b in model.named_buffers()}
        generator = torch.get_rng_state()
        tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight  # type: ignore[operator]
        ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(rank))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
        stepped = whole(model)
        # tensors travel as a file: a queue would hand them over in shared memory this process frees on exit
        torch.save({"sharded": sharded, "built": built, "buffers": buffers, "tied": tied, "stepped": stepped,
                    "rng": generator}, Path(folder) / f"rank{rank}.pt")
        results.put(rank)


def _reference(folder: Path, finetune: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What one process builds from the same source and seed, with the same adapters."""
    source = resolve_model_source(tiny_spec(folder / "config.json"))
    model = _adapt(build_model(source, seed=SEED, weights_dtype=torch.float32), _strategy(finetune))
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {name: b.clone() for name, b in model.named_buffers()})


@pytest.mark.parametrize(("finetune", "from_disk"), [("full", False), ("lora", False), ("full", True)])
def test_rank_0_builds_the_weights_once_and_each_rank_holds_its_shard_of_exactly_them(
        tmp_path: Path, finetune: str, from_disk: bool) -> None:
    write_config(tmp_path, tie_word_embeddings=True)
    if from_disk:  # weights in a local folder (save_pretrained), drawn from another seed than the job's
        saved = build_model(resolve_model_source(tiny_spec(tmp_path / "config.json")), seed=99,
                            weights_dtype=torch.float32)
        saved.save_pretrained(tmp_path)  # type: ignore[operator]
    expected, expected_buffers = _reference(tmp_path, finetune)
    assert sorted(run_ranks(_rank_main, str(tmp_path), finetune, results=2)) == [0, 1]
    first, second = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    built, buffers, stepped = first["built"], first["buffers"], first["stepped"]

    assert first["sharded"] and first["tied"] and second["tied"]
    assert built.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(built[key], tensor), key
    assert buffers.keys() == expected_buffers.keys() and any("rotary" in name for name in buffers)
    for name, b in expected_buffers.items():
        assert torch.equal(buffers[name], b), name
    assert torch.equal(first["rng"], second["rng"])  # rank 0's extra build leaves its generator where the others' is

    embed = next(k for k in stepped if "embed_tokens.weight" in k)
    head = next(k for k in stepped if k.endswith("lm_head.weight"))
    assert torch.equal(stepped[embed], stepped[head])  # the tie survived the shards and a step
    changed = [k for k in expected if not torch.equal(stepped[k], expected[k])]
    assert changed and (finetune == "full" or all("lora_" in k for k in changed))


def _follows_main(rank: int, port: int, results: Any, folder: str, finetune: str) -> None:
    """prepare_model told a checkpoint follows: what it left to draw, and the buffers it set without a build."""
    with gloo(rank, port):
        source = resolve_model_source(tiny_spec(Path(folder) / "config.json"))
        model, _, pending = prepare_model(_strategy(finetune), SEED, source, torch.device("cpu"), world=2,
                                          checkpoint_follows=True)
        torch.save({"pending": pending, "buffers": {n: b.clone() for n, b in model.named_buffers()}},
                   Path(folder) / f"follows{rank}.pt")
        results.put(rank)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_full_fine_tune_about_to_resume_skips_the_weights_build_and_still_has_its_rotary_buffers(
        tmp_path: Path, finetune: str) -> None:
    write_config(tmp_path, tie_word_embeddings=True)
    _, expected_buffers = _reference(tmp_path, finetune)
    assert sorted(run_ranks(_follows_main, str(tmp_path), finetune, results=2)) == [0, 1]
    for rank in (0, 1):
        got = torch.load(tmp_path / f"follows{rank}.pt")
        assert got["pending"] is (finetune == "full")  # LoRA checkpoints hold only the adapters: the base is built
        assert got["buffers"].keys() == expected_buffers.keys()
        for name, b in expected_buffers.items():
            assert torch.equal(got["buffers"][name], b), name


def _train_main(rank: int, port: int, results: Any, folder: str, store: str) -> None:
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
        spec = tiny_spec(Path(folder) / "m" / "config.json", steps=4, interval=2, world=2)
        job = TrainJob(job_id="once", spec=spec, strategy=_strategy("full"), checkpoint_uri=store, device="cpu",
                       cpu_threads=1, log_every_s=60.0)
        done = run_training(job)
        results.put((rank, done.resumed_from_step, done.steps))


def test_when_no_listed_checkpoint_verifies_the_run_draws_its_weights_as_a_fresh_start_does(tmp_path: Path) -> None:
    write_config(tmp_path / "m")
    fresh, damaged = str(tmp_path / "fresh"), str(tmp_path / "damaged")
    assert sorted(run_ranks(_train_main, str(tmp_path), fresh, results=2)) == [(0, None, 4), (1, None, 4)]
    # a store whose checkpoints are listed as complete but whose bytes are damaged (same sizes: only the hashes
    # tell), so the run sets out to skip the weights build and then finds nothing to load
    assert sorted(run_ranks(_train_main, str(tmp_path), damaged, results=2)) == [(0, None, 4), (1, None, 4)]
    shards = sorted((tmp_path / "damaged").glob("step-*/rank-*/shard-*.bin"))
    assert shards
    for blob in shards:  # the manifests (COMMIT) stay intact
        data = bytearray(blob.read_bytes())
        data[-1] ^= 0xFF
        blob.write_bytes(bytes(data))
    assert sorted(run_ranks(_train_main, str(tmp_path), damaged, results=2)) == [(0, None, 4), (1, None, 4)]
    assert_same_weights(final_state(fresh)[1], final_state(damaged)[1])


def test_every_catalog_model_builds_on_the_meta_device_and_a_restart_computes_its_unsaved_buffers() -> None:
    """The restart skip's inputs for every preset: the structure on the meta device (no memory), and the buffers no
    state dict holds computed from their modules' configs; only Gemma's scaled embedding (weights of its own) makes
    a restart build the weights as a fresh start does."""
    from catalog.loader import load_catalog
    from workers.model.build import ModelSource
    from workers.train.setup import _buffers_from_configs

    builds = []
    for config in load_catalog().models:
        net = build_model(ModelSource(config=config, weights_dir=None), seed=0, weights_dtype=torch.bfloat16,
                          device=torch.device("meta"))
        assert all(p.is_meta for p in net.parameters()), config.id
        buffers = _buffers_from_configs(net)
        if buffers is None:
            builds.append(config.id)
            continue
        unsaved = {name for name, _ in net.named_buffers()} - set(net.state_dict())
        assert set(buffers) == unsaved, config.id
        assert all(not b.is_meta and torch.isfinite(b).all() for b in buffers.values()), config.id
    assert builds and all(model_id.startswith("gemma-3") for model_id in builds)
