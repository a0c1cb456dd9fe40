"""experiments.search_time --saga: fddps against SAGA's HEFT, fastest of interleaved rounds,
and its generated page (SAGA is not a dependency: skipped where it is not installed)."""

import pandas as pd
import pytest

from experiments import search_time


def test_versus_saga_keeps_the_fastest_round_and_writes_its_page(tmp_path):
    pytest.importorskip("saga")
    df = search_time.main(["--saga", "--sizes", "150", "--repeats", "1", "--rounds", "2",
                           "--out", str(tmp_path / "search_time.csv")])
    row = df.iloc[0]
    assert row.rounds == 2 and row.ops >= 150
    assert row.speedup == pytest.approx(row.saga_heft_s / row.fddps_s)
    assert row.makespan_ratio == pytest.approx(row.fddps_makespan / row.saga_heft_makespan)
    saved = pd.read_csv(tmp_path / "search_time_saga.csv")
    assert list(saved.columns) == list(df.columns)
    page = (tmp_path / "search_time_saga.md").read_text()
    assert "fastest of `rounds` interleaved rounds" in page and "of 1;" in page
    assert "`python -m experiments.search_time --saga --sizes 150" in page
    with pytest.raises(ValueError, match="rounds"):
        search_time.versus_saga(150, rounds=0)
