"""A sharded model built once: rank 0 builds the whole weights in host memory and every rank receives only its
FSDP2 shard (workers.train_setup; planner.host_memory.builds_once prices the same). Put back together, the
shards are exactly the model one process builds with the same seed or reads from the same folder, buffers and
tied embeddings included, and a training step keeps the tie."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.ranks import gloo, run_ranks
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config
from workers.model import build_model, resolve_model_source
from workers.train_setup import _adapt, prepare_model

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
        model, sharded = prepare_model(_strategy(finetune), SEED, source, torch.device("cpu"), world=2)
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
