"""bench/spot/spot.py's trace handling (spot_families: 5-minute ticks, N-node availability, families from folders), its
cell counts (spot_cells) and its probes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from scheduler.sim.traces import align, trace_from_dict
from tests.bench.scripts import load_script


def test_resample_keeps_a_tick_only_when_all_nodes_were_there_all_along() -> None:
    spot = load_script("spot/spot_families", "spot_families")
    counts = np.array([4, 4, 4, 3, 4, 4, 4, 4, 4, 4, 0, 4, 4, 4, 4, 4], dtype=np.float64)  # 100 s ticks
    avail, gap = spot.resample("z", counts, 100.0, nodes=4)
    assert gap == 300.0
    # ticks [0-2] full, [3-5] has a 3, [6-8] full, [9-11] has a 0, [12-14] full; 15 is a partial tick.
    assert avail.tolist() == [True, False, True, False, True]
    one_node, _ = spot.resample("z", counts, 100.0, nodes=1)
    assert one_node.tolist() == [True, True, True, False, True]
    coarse, gap = spot.resample("z", counts, 600.0, nodes=4)
    assert gap == 600.0 and coarse.tolist() == (counts >= 4).tolist()


def test_a_family_is_one_folder_of_zones_and_its_jobs_fit_in_the_trace(tmp_path: Path) -> None:
    spot = load_script("spot/spot", "spot_bench")
    folder = tmp_path / "preemption" / "4-node" / "aws-08-03-2023"
    folder.mkdir(parents=True)
    for name, n in (("us-east-1f_v100_1", 700), ("us-west-2c_v100_1", 800)):
        (folder / f"{name}.json").write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [4] * n}))
    [fam] = load_script("spot/spot_families", "spot_families").families(tmp_path)
    assert (fam.name, fam.cloud, fam.nodes, fam.notice_s) == ("aws-08-03-2023 4-node preemption", "aws", 4, 120.0)
    assert fam.zones.ticks == 700 and [z.ticks for z in fam.singles] == [700, 800]
    jobs = spot.job_grid(fam.singles[0])
    assert jobs is not None and len(jobs) > 0
    ends = jobs.start_tick * fam.zones.gap_h + jobs.deadline_h
    assert np.all(ends <= fam.singles[0].hours)


def test_cells_count_the_median_and_the_mean_each_on_their_own() -> None:
    # One cell (slack 50%, restart 0.4 h): gpuplan pays a little more on the median job and far less on the
    # worst one, so its median is above greedy's and its mean below.
    spot = load_script("spot/spot_cells", "spot_cells")
    n = 3
    cell = {"slack": np.full(n, 0.5), "restart": np.full(n, 0.4)}
    res = {"gpuplan": {"ratio": np.array([1.0, 1.1, 1.2]), **cell},
           "greedy": {"ratio": np.array([1.0, 1.05, 2.0]), **cell}}
    lines, below, within, cells, level = spot.cell_table(res)
    assert within == 0  # 1.1 > 1.02 x the bound
    assert (below, level, cells) == (0, 0, 1) and "1.100 / 1.050" in "\n".join(lines)
    assert spot.cell_table(res, np.mean)[1] == 1


def test_a_cell_is_won_job_by_job_when_more_jobs_cost_less_than_cost_more() -> None:
    spot = load_script("spot/spot_cells", "spot_cells")
    cell = {"slack": np.full(4, 0.2), "restart": np.full(4, 0.02)}
    # The median of gpuplan's own costs is the higher one, yet it is cheaper on two jobs and dearer on one.
    res = {"gpuplan": {"cost": np.array([1.0, 1.3, 1.4, 1.5]), "ratio": np.array([1.0, 1.3, 1.4, 1.5]), **cell},
           "greedy": {"cost": np.array([1.0, 1.1, 2.0, 2.0]), "ratio": np.array([1.0, 1.1, 2.0, 2.0]), **cell}}
    assert spot.cell_table(res)[1] == 1  # 1.35 < 1.55: here the medians agree
    res["greedy"]["cost"] = res["greedy"]["ratio"] = np.array([1.0, 1.1, 1.45, 2.0])
    assert spot.cell_table(res)[1] == 0  # medians 1.35 vs 1.275: above greedy
    assert spot.paired_cells(res) == (1, 1)  # cheaper on jobs 3 and 4, dearer on job 2
    # The cell is listed among those above greedy, with the job-by-job count and both statistics.
    (row,) = spot.above_cells("fam", res)
    assert row.startswith("| fam | 20% | 0.02 h | 4 | 2 / 1 / 1 | 1.350 / 1.275 | ")
    assert row.endswith(" | 1.300 / 1.387 |")
    lo, hi = spot.median_gap_interval(res, np.ones(4, dtype=bool))
    assert lo < 0.075 < hi and f"{lo:+.3f} .. {hi:+.3f}" in row  # four jobs cannot tell the medians apart
    res["greedy"]["ratio"] = np.array([1.0, 1.3, 1.4, 1.5])
    assert spot.above_cells("fam", res) == []  # level: not listed


def test_a_median_gap_is_beyond_noise_only_when_the_cells_jobs_can_tell_it() -> None:
    """The paired bootstrap of the median gap: 200 jobs where gpuplan costs 0.05 more on every one are above
    greedy beyond noise; 200 where the two differ at random by +-0.05 around the same middle are not."""
    spot = load_script("spot/spot_cells", "spot_cells")
    rng = np.random.default_rng(1)
    base = 1.0 + rng.exponential(0.1, 200)
    cell = {"slack": np.full(200, 0.5), "restart": np.full(200, 0.2)}
    res = {"gpuplan": {"ratio": base + 0.05, **cell}, "greedy": {"ratio": base, **cell}}
    assert spot.gap_beyond_noise(res) == (1, 0, 0)
    res["gpuplan"]["ratio"] = base + rng.choice([-0.05, 0.05], 200)
    assert spot.gap_beyond_noise(res) == (0, 0, 1)
    res["gpuplan"]["ratio"] = base - 0.05
    assert spot.gap_beyond_noise(res) == (0, 1, 0)


def test_hindsight_rates_are_the_whole_traces_mean_run_and_outage() -> None:
    spot = load_script("spot/spot", "spot_bench")
    zones = align([trace_from_dict({"metadata": {"gap_seconds": 3600}, "data": [1, 1, 0, 0, 0, 1]}, "a"),
                   trace_from_dict({"metadata": {"gap_seconds": 3600}, "data": [0, 1, 1, 1, 1, 1]}, "b")])
    runs, outages = spot.hindsight_rates(zones)
    assert runs == (1.5, 5.0)  # 3 h up over 2 runs; 5 h in one run
    assert outages == (3.0, 1.0)


def test_the_hazard_by_age_counts_ends_per_hour_spent_at_that_age() -> None:
    spot = load_script("spot/spot", "spot_bench")
    runs = spot.spell_lengths(np.array([1, 1, 0, 1, 1, 1, 1, 0], dtype=bool), 0.25, up=True)
    np.testing.assert_allclose(runs, [0.5, 1.0])
    outages = spot.spell_lengths(np.array([1, 1, 0, 1, 1, 1, 1, 0], dtype=bool), 0.25, up=False)
    np.testing.assert_allclose(outages, [0.25, 0.25])
    # Runs of 0.5 h and 1 h: one ends in [0, 0.5] after 1 h spent there, one in (0.5, 2] after 0.5 h.
    np.testing.assert_allclose(spot.hazard_by_age(runs)[:2], [1.0, 2.0])
    assert np.isnan(spot.hazard_by_age(runs)[3])  # nobody reached 6 h


def test_the_half_life_sensitivity_runs_the_policy_once_per_half_life(tmp_path: Path) -> None:
    spot = load_script("spot/spot", "spot_bench")
    folder = tmp_path / "availability" / "1-node" / "aws-02-15-2023"
    folder.mkdir(parents=True)
    # Capacity 4 h of every 6 h: runs and outages the online rates learn, at any half-life.
    data = ([1] * 48 + [0] * 24) * 12
    (folder / "us-east-1a_v100_1.json").write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": data}))
    [fam] = spot.families(tmp_path)
    lines = spot.half_life_table([fam], [24.0, float("inf")])
    assert [line.split(" | ")[1] for line in lines[2:]] == ["24 h", "inf h"]
    for line in lines[2:]:
        below, level, above = (int(x) for x in line.split(" | ")[2].split(" / "))
        assert below + level + above == 20  # every judged cell has jobs
