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


def test_local_search_helps_fddps_when_transfers_dominate():
    import fddps

    g, c = comm_heavy.make_graph("random", 20, 10.0), comm_heavy.cluster(4)
    plain = fddps.schedule(g, c, "fddps", local_search=False).validate()
    searched = fddps.schedule(g, c, "fddps").validate()
    assert searched.makespan < 0.95 * plain.makespan
    assert searched.info["local_search_moves"] > 0
    assert searched.makespan >= searched.info["lower_bound"]


def test_local_search_keeps_memory_pins_and_colocation():
    import numpy as np
    import fddps
    from fddps import Cluster, Device, OpGraph

    g = comm_heavy.make_graph("fork_join", 10, 10.0)
    # Each device holds at most 4 ops' persistent bytes; t1 pinned; t2 with t3.
    g = OpGraph(g.names, g.cost[:, 0], [(g.names[a], g.names[b], w) for a, b, w in
                                        zip(g.src, g.dst, g.bytes)],
                memory=np.ones(10), pinned={"t1": "d1"},
                colocation=[None, None, "x", "x"] + [None] * 6)
    c = Cluster([Device(f"d{k}", memory=4.0) for k in range(3)], bandwidth=1.0)
    s = fddps.schedule(g, c, "fddps").validate()
    assert s.placement["t1"] == "d1" and s.placement["t2"] == s.placement["t3"]
    assert np.bincount(s.device, minlength=3).max() <= 4


def test_exact_reach_smoke(tmp_path, capsys):
    from experiments import exact_reach

    df = exact_reach.main(["--sizes", "8", "--limits", "2", "--ccr", "1", "--devices", "2",
                           "--out", str(tmp_path / "reach.csv")])
    assert df.proven.all() and (df.gap.abs() < 1e-6).all()
    assert "largest size proven" in capsys.readouterr().out


def test_stg_exact_smoke(tmp_path, capsys):
    from experiments import stg_exact, stg_quality

    try:
        stg_quality.stg_root(None)
    except FileNotFoundError:
        pytest.skip("no STG benchmark set (set FDDPS_STG)")
    df = stg_exact.main(["--sizes", "50", "--procs", "16", "--per-case", "1", "--time-limit", "2",
                         "--out", str(tmp_path / "stg_exact.csv")])
    assert len(df) == 1 and (df.makespan >= df.optimum * (1 - 1e-9)).all()
    assert (df.lower_bound <= df.optimum * (1 + 1e-9)).all()
    assert "a SAMPLE" in capsys.readouterr().out
