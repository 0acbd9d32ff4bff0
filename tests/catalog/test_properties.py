"""Hypothesis invariants: offers files round-trip exactly; offer queries sort and filter; HF configs parse."""

from __future__ import annotations

import tempfile
from datetime import date
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.hf_config import model_from_hf_config
from catalog.loader import Catalog
from catalog.offers_io import read_offers, write_offers
from catalog.params import count_params
from catalog.query import filter_offers, price_per_gpu_hour
from catalog.schema import Offer, Source

GPU_IDS = ["H100-SXM", "A100-80GB", "L4", "MI300X"]
price = st.one_of(st.none(), st.floats(min_value=0.001, max_value=500, allow_nan=False, allow_infinity=False))
text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)

offers = st.builds(
    Offer,
    cloud=st.sampled_from(["aws", "gcp", "x"]),
    instance_type=text.filter(lambda s: s.strip() == s and not s.startswith("#")),
    gpu=st.sampled_from(GPU_IDS),
    gpu_count=st.integers(1, 16),
    vcpus=st.integers(1, 256),
    ram_gib=st.floats(min_value=0.5, max_value=4096, allow_nan=False),
    region=st.sampled_from(["us-east-1", "eu-west-1"]),
    zone=st.one_of(st.none(), st.sampled_from(["us-east-1a", "az-2"])),
    on_demand_usd_per_h=price,
    spot_usd_per_h=price,
    network_gbps=st.floats(min_value=1, max_value=3200, allow_nan=False),
    source=st.builds(Source, url=st.just("https://example.invalid/x"), as_of=st.dates(date(2020, 1, 1)),
                     note=text.filter(lambda s: s.strip() == s)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(offers, max_size=12))
def test_offers_csv_round_trips_exactly(rows: list[Offer]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "offers" / "x.csv"
        write_offers(path, rows, header_comment="property test\nsecond line")
        assert read_offers(path) == rows


@settings(max_examples=60, deadline=None)
@given(st.lists(offers, max_size=15), st.booleans(), st.sampled_from([None, *GPU_IDS]))
def test_filter_offers_sorted_and_complete(catalog: Catalog, rows: list[Offer], spot: bool, gpu: str | None) -> None:
    cat = Catalog(gpus=catalog.gpus, offers=tuple(rows), models=())
    out = filter_offers(cat, gpu=gpu, spot=spot)
    expected = [o for o in rows if (gpu is None or o.gpu == gpu) and (not spot or o.spot_usd_per_h is not None)]
    assert sorted(map(id, out)) == sorted(map(id, expected))
    prices = [price_per_gpu_hour(o, spot) for o in out]
    known = [p for p in prices if p is not None]
    assert known == sorted(known) and prices[: len(known)] == known  # unpriced rows last


@settings(max_examples=80, deadline=None)
@given(
    heads=st.integers(1, 64), head_dim=st.sampled_from([32, 64, 128]), kv_div=st.sampled_from([1, 2, 4, 8]),
    layers=st.integers(1, 96), ffn=st.integers(1, 60000), vocab=st.integers(1, 260000),
    experts=st.sampled_from([1, 8]), tie=st.booleans(),
)
def test_llama_like_configs_parse_and_count(heads: int, head_dim: int, kv_div: int, layers: int, ffn: int,
                                            vocab: int, experts: int, tie: bool) -> None:
    kv = heads // kv_div if heads % kv_div == 0 else heads
    cfg: dict[str, object] = {
        "model_type": "mixtral" if experts > 1 else "llama", "hidden_size": heads * head_dim,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 4096, "tie_word_embeddings": tie,
    }
    if experts > 1:
        cfg.update(num_local_experts=experts, num_experts_per_tok=2)
    model = model_from_hf_config(cfg, model_id="m")
    counts = count_params(model)
    h = heads * head_dim
    attn = 2 * h * h + 2 * h * kv * head_dim
    per_layer_dense = attn + 3 * h * ffn + 2 * h
    embeddings = vocab * h * (1 if tie else 2)
    if experts == 1:
        assert counts.total == counts.active == embeddings + h + layers * per_layer_dense
    else:
        assert counts.total - counts.active == layers * (experts - 2) * 3 * h * ffn
        assert counts.active > 0
