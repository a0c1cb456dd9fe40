"""Smoke test of experiments/strategies.py (issue 12's simulated benchmark)."""

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_strategies_benchmark_runs_and_writes_its_table(tmp_path):
    from experiments import strategies

    df = strategies.main(["--models", "vgg16", "--batch", "4", "--devices", "2",
                          "--out", str(tmp_path / "s.csv")])
    assert (tmp_path / "s.csv").exists() and (tmp_path / "s.png").exists()
    assert set(df["strategy"]) == {"one device", "fddps", "data_parallel", "parameter_split",
                                   "mixed", "attribute_split"}
    assert (df["step_ms"] > 0).all() and (df["peak_mb"] > 0).all()
    split = df[df.strategy.isin(["data_parallel", "parameter_split", "mixed", "attribute_split"])]
    assert (split["ops_split"] > 0).all() and (split["moved_mb"] > 0).all()
