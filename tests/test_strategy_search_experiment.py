"""Smoke test of experiments/strategy_search.py (issue 15's simulated benchmark)."""

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_strategy_search_benchmark_quick_mode_writes_its_table(tmp_path):
    from experiments import strategy_search

    # Two hosts of one GPU each: the --hosts cluster (shared NICs) and its cross-host bytes.
    df = strategy_search.main(["--quick", "--hosts", "2", "--out", str(tmp_path / "s.csv")])
    assert (tmp_path / "s.csv").exists() and (tmp_path / "s.png").exists()
    assert set(df["strategy"]) == {"one device", "data parallel", "fddps", "fddps_space", "pase",
                                   "tofu", "flexflow", "auto"}
    assert (df["hosts"] == 2).all() and (df["cross_host_mb"] >= 0).all()
    # Data parallelism sums every gradient across the two hosts; one device sends nothing.
    mb = dict(zip(df["strategy"], df["cross_host_mb"]))
    assert mb["one device"] == 0 and mb["data parallel"] > 0
    assert (df["step_ms"] > 0).all() and df["fits"].all()
    best = df[df.strategy.isin(["one device", "data parallel", "fddps"])]["step_ms"].min()
    auto = df[df.strategy == "auto"].iloc[0]
    assert auto["step_ms"] <= best * (1 + 1e-9)  # never slower than the baselines
    space = df[df.strategy == "fddps_space"].iloc[0]
    assert space["step_ms"] <= df[df.strategy == "fddps"].iloc[0]["step_ms"]
    assert space["critical_ops"] > 0
    if not auto["cut"]:  # fddps_space finished within auto's budget: auto found it too
        assert auto["step_ms"] <= space["step_ms"] * (1 + 1e-9)
    flows = df[df.strategy == "flexflow"].iloc[0]
    assert flows["proposals"] > 0 and flows["delta_ms"] > 0
    shares = df[[c for c in df.columns if c.startswith("flops_")]].sum(axis=1)
    assert ((shares - 1).abs() < 1e-9).all()


@pytest.mark.slow
def test_delta_mode_times_both_simulations_and_they_agree(tmp_path):
    from experiments import strategy_search

    df = strategy_search.main(["--delta", "3", "--models", "vgg16", "--batch", "4", "--devices",
                               "2", "--out", str(tmp_path / "s.csv")])
    assert (tmp_path / "s_delta.csv").exists() and (tmp_path / "s_delta.png").exists()
    row = df.iloc[0]
    assert row["equal"] and row["delta_ms"] > 0 and row["full_ms"] > 0
