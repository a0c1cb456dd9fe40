"""experiments/tofu.py and fddps.search.tofu_baselines: a smoke run and the baselines (issue 30)."""

import numpy as np
import pandas as pd
import pytest

from costmodel import default_cost_model
from fddps.search.tofu import Tofu
from fddps.search.tofu_baselines import (AllRowGreedy, EqualChop, ICML18, Spartan,
                                         partitioner_plan, swap_seconds)
from fddps.strategy import validate

GPUS = [f"/device:GPU:{i}" for i in range(8)]


def _step():
    from test_tofu import _mlp

    return _mlp(64, [512, 2048, 512, 2048])


def test_partitioners_are_plans_the_same_evaluator_scores():
    step, devs = _step(), GPUS[:4]
    cm = default_cost_model("p100")
    cluster = cm.cluster(devs)
    plans = {name: partitioner_plan(name, step, cluster, cm)
             for name in ("tofu", "allrow_greedy", "spartan", "equalchop", "icml18")}
    for name, plan in plans.items():
        validate(plan.strategy, step, devs)
        assert plan.fits in (True, False) and plan.timeline.makespan > 0, name
    # One level of 4 ways for the non-recursive ones; two of 2 for Tofu and ICML18.
    assert [lv["ways"] for lv in plans["equalchop"].levels] == [4]
    assert [lv["ways"] for lv in plans["icml18"].levels] == [2, 2]
    # AllRow: every op that can split its first output axis does.
    for name, d in plans["allrow_greedy"].levels[0]["choices"].items():
        from fddps.strategy import resolve

        first = resolve(step.ops[name]).outputs[0][0]
        if first is not None and resolve(step.ops[name]).extent[first] >= 4:
            assert d == first, name
    # ICML18 searches a subset of Tofu's first-level choices: never fewer bytes there.
    assert plans["icml18"].levels[0]["bytes"] >= plans["tofu"].levels[0]["bytes"] - 1e-6
    # EqualChop is Tofu's exact DP on one level; Spartan's greedy cannot beat it there.
    assert plans["equalchop"].exact and not plans["spartan"].exact
    assert plans["spartan"].levels[0]["bytes"] >= plans["equalchop"].levels[0]["bytes"] - 1e-6
    with pytest.raises(ValueError, match="unknown partitioner"):
        partitioner_plan("nope", step, cluster, cm)


def test_swap_seconds_shares_the_host_links():
    from fddps.cluster import Device

    gpus = [Device(f"g{i}", "GPU") for i in range(8)]
    # One GPU alone: its own PCIe link (12 GB/s) and the 10 GB/s host link.
    assert swap_seconds([12e9] + [0] * 7, gpus) == pytest.approx(1.2)
    # Two GPUs behind one switch: the host link carries both (24 GB at 10 GB/s); with
    # an unbounded host link, their shared 12 GB/s switch uplink is the bottleneck.
    assert swap_seconds([12e9, 12e9] + [0] * 6, gpus) == pytest.approx(2.4)
    assert swap_seconds([12e9, 12e9] + [0] * 6, gpus, host_bandwidth=1e12) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="one byte count"):
        swap_seconds([1.0], gpus)


@pytest.mark.slow
def test_quick_run_writes_the_table_and_the_page(tmp_path):
    pytest.importorskip("tensorflow")
    from experiments import tofu

    out = tmp_path / "tofu.csv"
    df, _ = tofu.main(["--quick", "--models", "rnn2-256", "--methods",
                       "ideal,smallbatch,swapping,tofu", "--out", str(out)])
    assert out.exists() and out.with_suffix(".md").exists() and out.with_suffix(".png").exists()
    rows = df.set_index("method")
    assert rows.loc["tofu", "fits"] and rows.loc["tofu", "batch"] in tofu.QUICK_BATCHES["rnn"]
    assert rows.loc["tofu", "peak_gb"] <= rows.loc["tofu", "capacity_gb"]
    assert not rows.loc["smallbatch", "fits"]  # capacity is 0.6 x one GPU's peak
    assert 0 < rows.loc["tofu", "throughput"] <= rows.loc["ideal", "throughput"]
    page = out.with_suffix(".md").read_text()
    assert "Figure 9" in page and "rnn2-256" in page and "70-98%" in page
    # The page regenerates from the CSV alone.
    out.with_suffix(".md").unlink()
    tofu.main(["--quick", "--markdown-only", "--out", str(out)])
    assert out.with_suffix(".md").read_text().splitlines()[4:] == page.splitlines()[4:]
    assert isinstance(pd.read_csv(out), pd.DataFrame) and np.isfinite(rows.loc["ideal",
                                                                               "throughput"])
