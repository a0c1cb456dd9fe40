"""FD-DPS over the strategy space (fddps.search.fddps_space): its split step chooses among every
configuration of the critical ops, FD-DPS's scheduler places the parts."""

import pytest

tf = pytest.importorskip("tensorflow")

from test_search import CPUS, GPUS, _assert_runs_like_original, small_cnn  # noqa: E402

from costmodel import default_cost_model  # noqa: E402
from fddps.search import SearchError, StrategyEvaluator, get_search  # noqa: E402
from fddps.search.fddps_space import FDDPSSpaceSearch, parts_graph  # noqa: E402
from fddps.search.space import baseline_strategies  # noqa: E402
from fddps.strategy import validate  # noqa: E402
from fddps.strategy.expand import part_of_task, shared_task  # noqa: E402
from fddps.tf.strategy_graph import step_graph  # noqa: E402


@pytest.fixture(scope="module")
def cm():
    return default_cost_model("p100")


@pytest.fixture(scope="module")
def wide():
    g, fetches, init, variables = small_cnn(batch=64, width=64)
    return g, fetches, init, variables, step_graph(g.as_graph_def(), fetches)


def _configs(strategy):
    return {n: (c.split, c.devices) for n, c in strategy.configs.items()}


@pytest.mark.slow
def test_result_validates_fits_runs_like_the_original_and_beats_whole_ops(wide, cm):
    g, fetches, init, variables, step = wide
    cluster = cm.cluster(CPUS)
    r = get_search("fddps_space", writable=True).fit(step, cluster, cm)
    validate(r.strategy, step, CPUS)
    assert r.fits and r.search == "fddps_space"
    # Splits were chosen among more than Conv2D's batch/channel halves, and kept. (Since
    # parts pay for the slices and concatenations they read through, it keeps
    # splits of the convolutions only.)
    split = r.info["splits"]
    assert r.info["kept"] != "whole ops" and len(split) >= 2
    assert any(max(factors.values()) > 2 for factors in split.values())
    # Never predicted slower than FD-DPS's whole-op placement; here strictly faster.
    whole = baseline_strategies(step, cluster, cm, writable=True)["fddps"]
    ev = StrategyEvaluator(step, cluster, cm)
    assert r.makespan < ev.full(whole).makespan
    assert ev.full(r.strategy).makespan == pytest.approx(r.makespan, rel=1e-12)
    _assert_runs_like_original(g, fetches, init, variables, r.strategy)
    # Reproducible.
    again = get_search("fddps_space", writable=True).fit(step, cluster, cm)
    assert _configs(again.strategy) == _configs(r.strategy) and again.makespan == r.makespan


@pytest.mark.parametrize("devices", [GPUS[:2], GPUS])
def test_never_predicted_slower_than_whole_op_fddps(wide, cm, devices):
    step = wide[-1]
    cluster = cm.cluster(devices)
    r = FDDPSSpaceSearch().fit(step, cluster, cm)
    whole = StrategyEvaluator(step, cluster, cm).full(
        baseline_strategies(step, cluster, cm)["fddps"])
    assert r.fits and r.makespan <= whole.makespan
    assert r.info["whole_ops_step"] == whole.makespan
    assert min(r.info["tried"].values()) == r.makespan


def test_a_spent_time_budget_returns_the_whole_op_placement(wide, cm):
    step = wide[-1]
    r = FDDPSSpaceSearch(time_budget=1e-9).fit(step, cm.cluster(GPUS), cm)
    assert r.info["out_of_time"] and r.info["kept"] == "whole ops"
    assert r.info["splits_chosen"] == 0 and r.makespan == r.info["whole_ops_step"]


def test_parts_graph_keeps_bytes_apart_and_binds_what_must_share_a_device(wide, cm):
    from fddps.strategy import data_parallel
    from fddps.strategy.expand import expand

    step = wide[-1]
    cluster = cm.cluster(GPUS)
    dp = data_parallel(step, GPUS)
    graph, tasks = parts_graph(step, dp, cluster, cm)
    pinned = expand(step, dp, cluster, cm)
    assert not graph.pinned and set(tasks) == set(step.ops)
    # Apart, every tensor edge carries bytes (pinned, the data-parallel chain moves none).
    assert graph.bytes.sum() > pinned.graph.bytes.sum()
    group = dict(zip(graph.names, graph.colocation.tolist()))
    for u, v in zip(graph.src.tolist(), graph.dst.tolist()):
        a, b = graph.names[u], graph.names[v]
        if shared_task(a) or part_of_task(a) == part_of_task(b):  # reduces, statistics, passes
            assert group[a] == group[b] >= 0, (a, b)
    by_variable = {}
    for name, op in step.ops.items():
        if op.tied:
            by_variable.setdefault(op.group, []).append(group[tasks[name][0]])
    shared = [g for g in by_variable.values() if len(g) > 1]
    assert len(shared) >= 6 and all(len(set(g)) == 1 and g[0] >= 0 for g in shared)


def test_bad_options_are_named():
    for bad in (-0.1, 2, "x", None):
        with pytest.raises(SearchError, match="option 'critical_slack' must be a number in"):
            FDDPSSpaceSearch(critical_slack=bad)
    with pytest.raises(SearchError, match="option 'min_gain'"):
        FDDPSSpaceSearch(min_gain=1.0)
    with pytest.raises(SearchError, match="option 'max_dims' must be a positive integer"):
        FDDPSSpaceSearch(max_dims=0)
    with pytest.raises(SearchError, match="option 'fddps_options'"):
        FDDPSSpaceSearch(fddps_options={"no_such_option": 1})
    for bad in (0, -1.0, float("inf"), "soon"):
        with pytest.raises(SearchError, match="option 'time_budget' must be a positive number"):
            FDDPSSpaceSearch(time_budget=bad)
    with pytest.raises(SearchError, match="strategy search 'fddps_space' has no option 'beta'"):
        get_search("fddps_space", beta=1)


@pytest.mark.slow
def test_place_runs_it_as_an_algorithm(wide, cm):
    import fddps

    g, fetches, init, variables, step = wide
    before = g.as_graph_def()
    p = fddps.place(g, CPUS, cost_model=cm, fetches=fetches, algorithm="fddps_space")
    assert p.info["search"] == "fddps_space"
    assert p.makespan == pytest.approx(p.info["search_info"]["tried"][
        p.info["search_info"]["kept"]], rel=1e-9)
    assert "fddps_space" in p.summary()
    assert g.as_graph_def() == before


@pytest.mark.slow
def test_auto_runs_it_and_is_never_slower_than_it(wide, cm):
    step = wide[-1]
    cluster = cm.cluster(CPUS)
    r = get_search("auto", time_budget=60, max_proposals=20, seed=0, writable=True).fit(
        step, cluster, cm)
    alone = get_search("fddps_space", writable=True).fit(step, cluster, cm)
    assert r.info["steps"]["fddps_space"] == alone.makespan  # within its share: the same result
    assert r.fits and r.makespan <= alone.makespan


def test_critical_ops_of_a_step_too_big_for_the_cluster_whole():
    """A step whose whole-op graph needs more memory than the cluster has in all still has a
    critical path (its slack needs only times): found by auto at 16 P100s, ResNet-101."""
    from fddps.algorithms.split_step import path_slack
    from fddps.cluster import Cluster
    from fddps.graph import OpGraph

    g = OpGraph(["a", "b", "c"], [[2.0], [1.0], [2.0]], [("a", "c", 0.0), ("b", "c", 0.0)],
                memory=[3e9, 3e9, 3e9])
    tiny = Cluster.homogeneous(2, memory=1e9)
    slack, length, _ = path_slack(g, tiny)
    assert slack.tolist() == [0.0, 1.0, 0.0] and length == 4.0
