"""Smoke test of experiments/auto_default.py (fddps.place's default against auto, issue 15)."""

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_auto_default_quick_mode_compares_both_algorithms(tmp_path):
    from experiments import auto_default

    df = auto_default.main(["--quick", "--out", str(tmp_path / "a.csv")])
    assert (tmp_path / "a.csv").exists() and (tmp_path / "a.png").exists()
    assert "python -m experiments.auto_default --quick" in (tmp_path / "a.md").read_text()
    assert list(df["algorithm"]) == [auto_default.DEFAULT, "auto"]
    assert (df["step_ms"] > 0).all() and (df["place_s"] > 0).all()
    auto = df[df.algorithm == "auto"].iloc[0]
    assert auto["winner"] and auto["step_vs_default"] > 0
    assert df[df.algorithm == auto_default.DEFAULT].iloc[0]["step_vs_default"] == 1.0


def test_each_row_is_the_round_whose_seconds_are_the_median():
    from experiments.auto_default import median_round

    rounds = [dict(place_s=s, winner=w) for s, w in ((3.0, "a"), (1.0, "b"), (2.0, "c"))]
    row = median_round(rounds)
    assert (row["place_s"], row["winner"], row["rounds"]) == (2.0, "c", 3)
    assert row["place_s_rounds"] == "3 1 2"
    assert median_round(rounds[:2])["winner"] == "b"  # even count: the lower middle
