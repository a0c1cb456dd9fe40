"""The forward-backward refinement refines only while it pays (fddps.algorithms.justify)."""

import pytest

import fddps
from fddps.algorithms.justify import forward_backward_improve
from fddps.generators import training_graph


def _list_schedule(graph, cluster):
    s = fddps.schedule(graph, cluster, algorithm="fddps", improve=False)
    return s.start, s.finish, s.makespan


def test_large_graphs_stop_at_the_first_pass_that_gains_less_than_min_gain():
    graph = training_graph(300, seed=3)
    cluster = fddps.Cluster.homogeneous(4, bandwidth=10e9, latency=1e-5)
    start, finish, makespan = _list_schedule(graph, cluster)
    # As a graph above small_graph_ops: no restarts, the descent stops paying early.
    big, big_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                              budget=10**6, min_gain=1e-3, small_graph_ops=100)
    # As a small graph: stalls end descents, then perturbed restarts.
    small, small_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                                  budget=10**6, small_graph_ops=1000)
    assert big_stats["improve_passes"] < small_stats["improve_passes"]
    # Every pass but the last gained at least min_gain; the last gained less (or nothing).
    assert big_stats["improve_passes"] in (big_stats["improvements"],
                                           big_stats["improvements"] + 1)
    assert big_stats.get("stopped_at_gain", 0.0) < 1e-3
    best_big = makespan if big is None else max(big.finish)
    best_small = makespan if small is None else max(small.finish)
    assert best_small <= best_big <= makespan
    # min_gain=0 is the small-graph rule at any size.
    _, zero_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                             budget=10**6, min_gain=0, small_graph_ops=100)
    assert zero_stats["improve_passes"] == small_stats["improve_passes"]


def test_restarts_that_stop_paying_end_above_patient_graph_ops():
    graph = training_graph(400, seed=0)
    cluster = fddps.Cluster.homogeneous(4, bandwidth=10e9, latency=1e-5)
    start, finish, makespan = _list_schedule(graph, cluster)
    kw = dict(budget=10**6, small_graph_ops=1000)
    patient, patient_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                                      patient_graph_ops=1000, **kw)
    assert "stale_restarts" not in patient_stats  # every restart made
    brief, brief_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                                  patient_graph_ops=100, max_stale_restarts=1,
                                                  **kw)
    assert brief_stats["stale_restarts"] == 1
    assert brief_stats["improve_passes"] < patient_stats["improve_passes"]
    # Both descents are seeded alike: the brief one is a prefix of the patient one.
    best_patient = makespan if patient is None else max(patient.finish)
    best_brief = makespan if brief is None else max(brief.finish)
    assert best_patient <= best_brief <= makespan
    # None makes every restart at any size.
    _, none_stats = forward_backward_improve(graph, cluster, start, finish, makespan,
                                             patient_graph_ops=100, max_stale_restarts=None,
                                             **kw)
    assert none_stats["improve_passes"] == patient_stats["improve_passes"]


def test_the_refined_schedule_is_valid_and_never_worse():
    graph = training_graph(1500, seed=1)
    cluster = fddps.Cluster.homogeneous(4, bandwidth=10e9, latency=1e-5)
    plain = fddps.schedule(graph, cluster, improve=False, local_search=False)
    refined = fddps.schedule(graph, cluster)
    refined.validate()
    assert refined.makespan <= plain.makespan
    # The old rule spent its whole budget here: 20 passes (40 * ops placements).
    assert refined.info["improve_passes"] < 20


def test_the_default_budget_is_proportional_to_the_list_pass():
    from fddps.algorithms.justify import DEFAULT_MAX_PASSES, DEFAULT_MAX_PLACEMENTS, default_budget

    cluster = fddps.Cluster.homogeneous(2, bandwidth=10e9, latency=1e-5)
    for ops in (60, 400):
        graph = training_graph(ops, seed=0)
        start, finish, makespan = _list_schedule(graph, cluster)
        _, stats = forward_backward_improve(graph, cluster, start, finish, makespan)
        # The same number of passes at any size: a budget in list passes, not in ops.
        assert stats["improve_max_passes"] == DEFAULT_MAX_PASSES
        assert stats["improve_passes"] <= DEFAULT_MAX_PASSES
    # With a ceiling in placements: one pass at 100k ops.
    assert default_budget(100_000) == DEFAULT_MAX_PLACEMENTS < 4 * 100_000


def test_fddps_takes_the_threshold_as_an_option():
    from fddps.algorithms.justify import DEFAULT_MIN_GAIN

    graph = training_graph(1100, seed=2)
    cluster = fddps.Cluster.homogeneous(4, bandwidth=10e9, latency=1e-5)
    default = fddps.schedule(graph, cluster, local_search=False)
    named = fddps.schedule(graph, cluster, local_search=False, improve_min_gain=DEFAULT_MIN_GAIN)
    assert named.makespan == default.makespan
    assert named.info["improve_passes"] == default.info["improve_passes"]
    # A threshold no pass reaches: one pass, kept only if it gained.
    one = fddps.schedule(graph, cluster, local_search=False, improve_min_gain=0.5)
    assert one.info["improve_passes"] == 1
    assert default.makespan <= one.makespan <= one.info["list_schedule_makespan"]
    for bad in (-0.1, 1.0, "0.1", True):
        with pytest.raises(ValueError, match="improve_min_gain"):
            fddps.schedule(graph, cluster, improve_min_gain=bad)


def test_fresh_states_share_the_tables_and_schedule_as_new_ones():
    from fddps.algorithms.base import PlacementState, list_schedule

    g = training_graph(200, seed=4)
    c = fddps.Cluster.homogeneous(4, bandwidth=1e9, latency=1e-5)
    empty = PlacementState(g, c)
    priority = -fddps.get_algorithm("heft").schedule(g, c).finish
    a = list_schedule(empty.fresh(), priority)
    b = list_schedule(PlacementState(g, c), priority)
    assert a.device == b.device and a.start == b.start
    assert empty.device == [-1] * g.num_ops  # the template itself stays empty
    rev = empty.fresh(g.reversed())
    assert rev.allowed is empty.allowed and rev.inputs == g.reversed().input_pairs()
    with pytest.raises(ValueError, match="same ops"):
        empty.fresh(training_graph(50, seed=1))
