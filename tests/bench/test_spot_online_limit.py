"""bench/spot/spot_online_limit.py's worlds: traces drawn from the slack-value program's own chain and from a zone's own
spells, and one world run end to end (both policies meet every deadline, no job below the omniscient bound)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from scheduler.sim.traces import Zones
from tests.bench.scripts import load_script

GAP_H = 1 / 12


def spells(av: np.ndarray, up: bool) -> np.ndarray:
    """Lengths in ticks of the runs (``up``) or outages strictly inside ``av`` (the cut-off ends dropped)."""
    x = (av if up else ~av).astype(np.int8)
    d = np.diff(np.concatenate([[0], x, [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = (starts > 0) & (ends < len(av))
    return (ends - starts)[keep]


def test_the_model_world_has_the_programs_means_and_its_young_spells() -> None:
    limit = load_script("spot/spot_online_limit", "spot_online_limit")
    av = limit.draw_model(2.0, 1.0, 200_000, GAP_H, True, np.random.default_rng(0))
    assert av[0] and av.dtype == bool and len(av) == 200_000
    runs, outages = spells(av, True) * GAP_H, spells(av, False) * GAP_H
    assert runs.mean() == pytest.approx(2.0, rel=0.1) and outages.mean() == pytest.approx(1.0, rel=0.1)
    # a memoryless run of mean 2 h ends within 30 minutes 22% of the time; the program's young runs end 6x as fast
    assert (runs <= 0.5).mean() > 0.35


def test_the_shuffled_world_is_made_of_the_zones_own_spells() -> None:
    limit = load_script("spot/spot_online_limit", "spot_online_limit")
    rng = np.random.default_rng(1)
    real = np.repeat(np.array([True, False, True, False, True, False] * 20),
                     np.tile([3, 1, 12, 2, 7, 5], 20))
    drawn = limit.draw_shuffled(real, GAP_H, rng)
    assert len(drawn) == len(real) and drawn[0] == real[0]
    assert set(spells(drawn, True).tolist()) <= {3, 12, 7} and set(spells(drawn, False).tolist()) <= {1, 2, 5}
    assert len(set(spells(drawn, True).tolist())) > 1  # drawn, not copied in one order


def test_every_world_of_a_zone_meets_every_deadline_above_the_bound(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    limit = load_script("spot/spot_online_limit", "spot_online_limit")
    monkeypatch.setattr(sys.modules["spot"], "CACHE", tmp_path / "bounds.json")  # not the bench's /tmp cache
    rng = np.random.default_rng(2)
    av = limit.draw_model(3.0, 1.0, 900, GAP_H, True, rng)
    zone = Zones(names=("z",), gap_seconds=300.0, available=av[None, :], prices=np.full((1, 900), np.nan))
    fam = load_script("spot/spot_families", "spot_families").Family(
        name="aws-test 1-node preemption", cloud="aws", nodes=1, zones=zone, singles=(zone,))
    worlds = limit.worlds_of(fam, 1, rng)
    assert [len(worlds[w]) for w in limit.WORLDS] == [1, 1, 1]
    for w in limit.WORLDS:
        res = limit.run_world(fam, worlds[w], {0: (3.0, 1.0)} if w == "model" else {})
        for p in limit.POLICIES:
            assert len(res[p]["ratio"]) > 0 and np.all(res[p]["ratio"] >= 1 - 1e-9)
        s = limit.summary(res)
        assert s["cells"] > 0 and 0 <= s["within"] <= s["cells"] and s["g_med"] >= 1 - 1e-9


def test_the_committed_record_reads_back_and_plots(tmp_path: Path) -> None:
    limit = load_script("spot/spot_online_limit", "spot_online_limit")
    record = limit.read_record(Path(__file__).resolve().parents[2] / "bench" / "results" / "spot"
                               / "online-limit-2026-12-04.md")
    assert len(record) == 8 and all(set(worlds) == set(limit.WORLDS) for worlds in record.values())
    assert record["all families"]["model"] == (1.053, 1.083)
    png = tmp_path / "limit.png"
    limit.plot(record, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
