"""Gaudi 3 and Trainium2 are in the catalog, but the workers cannot run them: plans refuse them by name."""

from __future__ import annotations

from datetime import date

import pytest

from catalog.loader import PACKAGED_DATA_DIR, load_catalog
from catalog.schema import Offer, Source
from errors import NoFeasiblePlan
from planner.calibration import load_calibration
from planner.search import plan
from planner.spec import spec_from_dict

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

SRC = Source(url="https://example.test/prices", as_of=date(2026, 12, 1), note="test fixture")


@pytest.mark.parametrize("gpu_id,backend", [("Gaudi3", "HPU backend"), ("Trainium2", "Neuron SDK")])
def test_training_on_an_accelerator_the_workers_cannot_run_is_refused(gpu_id: str, backend: str) -> None:
    # A priced offer, so the refusal comes from the support record and not from "no offer".
    offer = Offer(cloud="test", instance_type=f"{gpu_id}-x8", gpu=gpu_id, gpu_count=8, vcpus=96, ram_gib=1024,
                  region="r1", on_demand_usd_per_h=30.0, source=SRC)
    catalog = load_catalog(PACKAGED_DATA_DIR).with_offers([offer])
    spec = spec_from_dict({"name": "t", "task": "train", "model": "llama-3.2-1b",
                           "train": {"tokens": 1e8, "seq_len": 2048}, "resources": {"accelerators": [gpu_id]}})
    with pytest.raises(NoFeasiblePlan) as err:
        plan(spec, catalog, calibration=CAL)
    text = str(err.value)
    assert backend in text and "pick a GPU" in text, text
