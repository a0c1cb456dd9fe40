"""experiments/tofu.py: a smoke run in --quick mode and the largest-model table."""

import pandas as pd
import pytest

pytest.importorskip("tensorflow")


def test_largest_fitting_picks_the_heaviest_model_that_fits():
    from experiments.tofu import largest_fitting

    df = pd.DataFrame(dict(model=["wrn152-4", "wrn152-4", "wrn152-10", "wrn152-10"],
                           strategy=["single", "tofu"] * 2, status=["ok", "ok", "OOM", "ok"],
                           weights_gb=[10.0, 10.0, 60.0, 60.0]))
    out = largest_fitting(df).set_index("strategy")["largest"].to_dict()
    assert out == {"single": "wrn152-4", "tofu": "wrn152-10"}


@pytest.mark.slow
def test_quick_run_places_a_model_single_cannot_hold(tmp_path):
    from experiments import tofu

    out = tmp_path / "tofu.csv"
    df = tofu.main(["--quick", "--models", "rnn2-256", "--devices", "2",
                    "--algorithms", "single,data_parallel,etf,tofu", "--out", str(out)])
    assert out.exists() and out.with_suffix(".png").exists()
    rows = df.set_index("strategy")
    assert rows.loc["single", "status"] == "OOM"  # capacity is 0.6 x its peak
    assert rows.loc["tofu", "status"] == "ok"
    assert rows.loc["tofu", "peak_max"] <= rows.loc["tofu", "capacity_gb"] * 1e9
    assert rows.loc["tofu", "step_seconds"] > 0 and rows.loc["tofu", "search_seconds"] >= 0
