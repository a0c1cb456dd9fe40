"""Smoke test of experiments/place_time.py (place()'s seconds by stage against TensorFlow's import)."""

import pytest

pytest.importorskip("tensorflow")


def test_place_time_splits_place_into_its_stages_beside_the_import(tmp_path):
    from experiments import place_time

    out = tmp_path / "place_time.csv"
    df = place_time.main(["--models", "vgg16", "--rounds", "1", "--min-seconds", "0",
                          "--no-quickstart",
                          "--out", str(out)])
    assert out.exists() and out.with_suffix(".png").exists()
    page = out.with_suffix(".md").read_text()
    assert "python -m experiments.place_time --models vgg16" in page and "| vgg16 b8 4xP100 |" in page
    row = df.iloc[0]
    assert row["rounds"] == 1  # --min-seconds 0: no rounds beyond --rounds
    assert row["import_s"] > 0 and row["read_s"] > 0 and row["decide_s"] > 0
    # The stages are place()'s own parts: they add up to no more than its wall time.
    assert row["read_s"] + row["decide_s"] + row["write_s"] <= row["place_s"] * 1.001
    assert row["ratio"] == pytest.approx(row["place_s"] / row["import_s"])


def test_place_time_adds_rounds_while_a_case_is_quick():
    from experiments.place_time import MAX_ROUNDS, _more_rounds

    assert _more_rounds(2, 3, spent=100.0, min_seconds=5.0)       # --rounds first
    assert not _more_rounds(3, 3, spent=6.0, min_seconds=5.0)     # enough seconds
    assert _more_rounds(3, 3, spent=1.0, min_seconds=5.0)         # quick: one more
    assert not _more_rounds(MAX_ROUNDS, 3, spent=1.0, min_seconds=5.0)
