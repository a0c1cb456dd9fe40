"""experiments/sharded_variables.py: a smoke run in --quick mode."""

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_quick_run_shards_variables_and_computes_the_same(tmp_path):
    from experiments import sharded_variables

    out = tmp_path / "sv.csv"
    df = sharded_variables.main(["--quick", "--out", str(out)])
    assert out.exists() and out.with_suffix(".png").exists()
    rows = df.set_index("split_variables")
    sharded = rows.loc[True]
    assert sharded["fits"] and sharded["sharded"] > 0
    assert sharded["loss_rel"] < 1e-5 and sharded["vars_rel"] < 1e-5
    assert sharded["variable_mb_max"] <= sharded["capacity_mb"]
    assert rows.loc[False, "sharded"] == 0
