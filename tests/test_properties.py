"""Properties every scheduling algorithm must have, on random graphs and clusters (hypothesis).

Graph families: random DAGs, chains, forks, joins, in-trees and out-trees; with
and without transfers, persistent and transient memory, memory limits,
colocation groups; homogeneous and heterogeneous (device types, speeds, links)
clusters, with links whose devices spend each transfer's time themselves or
not. Every algorithm must return a schedule that validates (its peak memory
within every device's capacity), that the simulator replays to the same
makespan, and that no bound beats; FD-DPS must never lose to one device. Under
capacities too tight for that guarantee, an algorithm may refuse, but never
returns a schedule whose peak overflows a device.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fddps
from fddps import Cluster, Device, OpGraph

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = ("GPU", "CPU")


@st.composite
def edge_lists(draw, n):
    shape = draw(st.sampled_from(["random", "chain", "fork", "join", "in_tree", "out_tree"]))
    if shape == "random":
        p = draw(st.floats(0.05, 0.6))
        mask = draw(st.lists(st.floats(0, 1), min_size=n * n, max_size=n * n))
        return [(i, j) for i in range(n) for j in range(i + 1, n) if mask[i * n + j] < p]
    if shape == "chain":
        return [(i, i + 1) for i in range(n - 1)]
    if shape == "fork":
        return [(0, j) for j in range(1, n)]
    if shape == "join":
        return [(j, n - 1) for j in range(n - 1)]
    parents = [draw(st.integers(0, j - 1)) for j in range(1, n)]
    if shape == "out_tree":
        return [(p, j) for j, p in zip(range(1, n), parents)]
    return [(j, p) for j, p in zip(range(1, n), parents)]  # in-tree: edges towards the root


@st.composite
def problems(draw, tight=False):
    """A (graph, cluster) pair that can always be placed by a greedy algorithm.

    With ``tight``, memory is always limited and capacities are cut to a
    random 20-100% of that, so the problem may not fit.
    """
    n = draw(st.integers(1, 14))
    edges = draw(edge_lists(n))
    # Mirror ids for in-trees so that every edge goes from a lower to a higher name.
    names = [f"op{i}" for i in range(n)]
    heterogeneous = draw(st.booleans())
    costs = draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    if heterogeneous:
        ratio = draw(st.lists(st.sampled_from([0.25, 1.0, 3.0, np.inf]), min_size=n, max_size=n))
        cost = np.array([[c, np.inf if r == np.inf else c * r] for c, r in zip(costs, ratio)])
        device_types = TYPES
    else:
        cost, device_types = np.array(costs), None
    with_transfers = draw(st.booleans())
    nbytes = draw(st.lists(st.floats(0, 1e6), min_size=len(edges), max_size=len(edges)))
    edge_tuples = [(names[u], names[v], b if with_transfers else 0.0) for (u, v), b in zip(edges, nbytes)]
    memory = np.array(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)), dtype=float)
    # Outputs' bytes; a received copy counts at most its producer's transient
    # bytes (fddps.simulate.peak_memory), so huge edge bytes stay memory-consistent.
    transient = (np.array(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)), dtype=float)
                 if draw(st.booleans()) else np.zeros(n))
    colocation = None
    if draw(st.booleans()) and n >= 2:
        colocation = draw(st.lists(st.sampled_from([None, None, "g1", "g2"]), min_size=n, max_size=n))
    graph = OpGraph(names, cost, edge_tuples, memory=memory, transient=transient,
                    device_types=device_types, colocation=colocation)

    m = draw(st.integers(1, 5))
    if heterogeneous:
        # At least one GPU so that ops with an infinite CPU cost can run.
        types = ["GPU"] + draw(st.lists(st.sampled_from(TYPES), min_size=m - 1, max_size=m - 1))
        speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=m, max_size=m))
    else:
        types, speeds = ["device"] * m, [1.0] * m
    limit_memory = tight or draw(st.booleans())
    if limit_memory:
        # Enough for any greedy placement reserving memory + transient (the
        # schedulers' fallback): an even share plus the largest unit, plus
        # room for received copies (at most one of each op's outputs).
        need = memory + transient
        groups = {}
        for i in range(n):
            key = colocation[i] if colocation and colocation[i] else i
            groups[key] = groups.get(key, 0.0) + need[i]
        capacity = need.sum() / m + max(groups.values(), default=0.0)
        # Colocated groups may have to share a GPU with ops that only run there.
        capacity = max(capacity, need.sum()) if heterogeneous else capacity
        capacity += transient.sum()
        if tight:
            capacity *= draw(st.floats(0.2, 1.0))
    else:
        capacity = float("inf")
    devices = [Device(f"d{k}", type=types[k], speed=speeds[k], memory=capacity) for k in range(m)]
    bandwidth = draw(st.sampled_from([1e5, 1e7, float("inf")]))
    latency = draw(st.sampled_from([0.0, 0.01, 1.0]))
    # Devices that spend (part of) each transfer themselves, like CPUs over gRPC.
    transfer_compute = draw(st.sampled_from([0.0, 0.0, 0.5, 1.0]))
    if draw(st.booleans()) and m > 1:
        bw = np.full((m, m), bandwidth)
        bw[: m // 2, m // 2:] = bw[m // 2:, : m // 2] = bandwidth / 10  # a slower link between halves
        cluster = Cluster(devices, bandwidth=bw, latency=latency, transfer_compute=transfer_compute)
    else:
        cluster = Cluster(devices, bandwidth=bandwidth, latency=latency,
                          transfer_compute=transfer_compute)
    return graph, cluster


# "exact" refuses clusters whose transfers spend device time and solves memory
# itself (persistent, then the replayed peak): tests/test_exact.py covers it.
ALGORITHMS = [a for a in fddps.available_algorithms() if a != "exact"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@SETTINGS
@given(problems())
def test_every_algorithm_returns_a_valid_schedule(algorithm, problem):
    graph, cluster = problem
    try:
        s = fddps.schedule(graph, cluster, algorithm=algorithm)
    except fddps.InfeasibleError:
        # Only "single" may refuse a placeable problem: the whole graph must fit one device.
        assert algorithm == "single"
        return
    s.validate()
    assert s.algorithm == algorithm
    assert s.makespan >= fddps.lower_bound(graph, cluster) * (1 - 1e-9) - 1e-12
    order = [[graph.names[i] for i in seq] for seq in s.order]
    replayed = fddps.simulate(graph, cluster, s.placement, order)
    assert replayed.makespan == pytest.approx(s.makespan, rel=1e-9, abs=1e-12)
    assert (replayed.peak_memory.to_numpy() <= cluster.memory * (1 + 1e-12)).all()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@SETTINGS
@given(problems(tight=True))
def test_no_algorithm_returns_a_schedule_over_memory(algorithm, problem):
    graph, cluster = problem
    try:
        s = fddps.schedule(graph, cluster, algorithm=algorithm)
    except fddps.InfeasibleError as err:
        event("refused")
        assert "bytes" in str(err)
        return
    event(f"placed reserving {s.info['memory_reservation']}")
    assert (s.peak_memory() <= cluster.memory * (1 + 1e-12)).all()
    s.validate()


@SETTINGS
@given(problems())
def test_fddps_never_loses_to_the_best_single_device(problem):
    graph, cluster = problem
    s = fddps.schedule(graph, cluster, algorithm="fddps").validate()
    try:
        single = fddps.schedule(graph, cluster, algorithm="single")
    except fddps.InfeasibleError:
        return
    assert s.makespan <= single.makespan * (1 + 1e-9) + 1e-12


@SETTINGS
@given(problems())
def test_improvement_pass_never_hurts(problem):
    graph, cluster = problem
    plain = fddps.schedule(graph, cluster, algorithm="fddps", improve=False)
    improved = fddps.schedule(graph, cluster, algorithm="fddps")
    assert improved.makespan <= plain.makespan * (1 + 1e-9) + 1e-12


def test_training_shaped_graph_on_hosts_with_a_slow_link():
    from fddps.generators import training_graph

    g = training_graph(600, seed=3)
    c = Cluster.multi_host(2, 4, intra_bandwidth=10e9, inter_bandwidth=1e9, inter_latency=5e-5)
    lb = fddps.lower_bound(g, c)
    for algorithm in ALGORITHMS:
        s = fddps.schedule(g, c, algorithm=algorithm).validate()
        assert s.makespan >= lb
    best_single = fddps.schedule(g, c, algorithm="single").makespan
    assert fddps.schedule(g, c).makespan < best_single / 2
