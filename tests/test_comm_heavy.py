"""Smoke test of experiments.comm_heavy (the communication-heavy benchmark)."""

import pandas as pd
import pytest

pytest.importorskip("ortools")

from experiments import comm_heavy  # noqa: E402


def test_generator_is_deterministic_and_shaped():
    a, b = comm_heavy.make_graph("random", 20, 10.0), comm_heavy.make_graph("random", 20, 10.0)
    assert a.num_edges == b.num_edges and (a.cost == b.cost).all() and (a.bytes == b.bytes).all()
    assert comm_heavy.make_graph("join", 10, 1.0).num_edges == 9
    assert comm_heavy.make_graph("fork_join", 10, 1.0).num_edges == 16
    assert comm_heavy.make_graph("independent", 10, 1.0).num_edges == 0
    assert comm_heavy.make_graph("in_tree", 10, 1.0).num_edges == 9
    # CCR scales transfers against the mean task cost.
    g = comm_heavy.make_graph("fork", 30, 10.0)
    assert 5 * g.cost.mean() <= g.bytes.mean() <= 15 * g.cost.mean()


def test_comm_heavy_smoke(tmp_path, capsys):
    out = tmp_path / "ch.csv"
    summary = comm_heavy.main(["--shapes", "fork", "join", "--sizes", "10", "--ccr", "10",
                               "--devices", "2", "--algorithms", "fddps", "heft",
                               "--time-limit", "2", "--out", str(out)])
    text = capsys.readouterr().out
    assert "2 instances" in text and "proven optimal" in text
    results = pd.read_csv(out)
    assert set(results.algorithm) == {"exact", "fddps", "heft"}
    assert (results.ratio >= 1 - 1e-9).all()  # exact is warm-started from both
    assert out.with_suffix(".png").exists()
    assert set(summary.algorithm) == {"exact", "fddps", "heft"}
