"""The exact (CP-SAT) scheduler against brute force, the heuristics, and bad input."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fddps import Cluster, Device, OpGraph, available_algorithms, schedule
from fddps.bounds import communication_lower_bound, lower_bound
from fddps.errors import ClusterError, InvalidScheduleError
from fddps.simulate import replay, peak_memory

pytest.importorskip("ortools")

REL = 1e-9


def linear_extensions(ops, reach):
    """Every order of ``ops`` in which no op comes before one it depends on."""
    if not ops:
        yield ()
        return
    for a in ops:
        if not any(reach[b, a] for b in ops if b != a):
            rest = [b for b in ops if b != a]
            for tail in linear_extensions(rest, reach):
                yield (a,) + tail


def brute_force_optimum(graph, cluster):
    """Smallest makespan over every device assignment and per-device order
    (each replayed by fddps.simulate.replay), among those within memory."""
    n, m = graph.num_ops, cluster.num_devices
    et = graph.exec_times(cluster)
    reach = np.zeros((n, n), dtype=bool)
    for i in reversed(graph.topo.tolist()):
        for j in graph.successors(i).tolist():
            reach[i, j] = True
            reach[i] |= reach[j]
    best = np.inf
    for assign in itertools.product(range(m), repeat=n):
        device = np.array(assign)
        if not np.all(np.isfinite(et[np.arange(n), device])):
            continue
        if any(cluster.names[device[i]] != d for i, d in graph.pinned.items()):
            continue
        per_device = [list(linear_extensions([i for i in range(n) if assign[i] == k], reach))
                      for k in range(m)]
        for order in itertools.product(*per_device):
            try:
                start, finish = replay(graph, cluster, device, order, et)
            except InvalidScheduleError:
                continue  # the devices' orders wait on each other in a cycle
            span = finish.max()
            if span < best and np.all(peak_memory(graph, cluster, device, start, finish)
                                      <= cluster.memory * (1 + 1e-12)):
                best = span
    return best


@st.composite
def small_instances(draw, memory=False):
    m = draw(st.integers(2, 3))
    n = draw(st.integers(2, 5 if memory else 7 if m == 3 else 8))
    p = draw(st.floats(0.3, 0.7))
    cost = [draw(st.floats(0.1, 10.0)) for _ in range(n)]
    edges = []
    for i in range(n):
        for j in range(i + 1, n):
            if draw(st.floats(0, 1)) < p:
                edges.append((f"o{i}", f"o{j}", draw(st.floats(0.0, 20.0))))
    mem = [draw(st.sampled_from([0.0, 1.0, 2.0])) for _ in range(n)] if memory else None
    transient = [draw(st.sampled_from([0.0, 1.0])) for _ in range(n)] if memory else None
    g = OpGraph([f"o{i}" for i in range(n)], cost, edges, memory=mem, transient=transient)
    speeds = [draw(st.sampled_from([1.0, 1.0, 2.0])) for _ in range(m)]
    heterogeneous_links = draw(st.booleans())
    if heterogeneous_links:
        bw = np.array([[draw(st.sampled_from([1.0, 2.0, 5.0])) for _ in range(m)] for _ in range(m)])
        lat = np.array([[draw(st.sampled_from([0.0, 0.5])) for _ in range(m)] for _ in range(m)])
    else:
        bw, lat = draw(st.sampled_from([1.0, 4.0])), draw(st.sampled_from([0.0, 0.5]))
    capacity = float(draw(st.integers(max(1, n // m), n))) if memory else np.inf
    devices = [Device(f"d{k}", speed=speeds[k], memory=capacity) for k in range(m)]
    return g, Cluster(devices, bandwidth=bw, latency=lat)


# No shrinking: a brute-force check per example makes it take minutes.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
FAST = settings(max_examples=25, deadline=None, derandomize=True, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(small_instances())
def test_exact_equals_brute_force(instance):
    graph, cluster = instance
    s = schedule(graph, cluster, "exact", time_limit=20)
    s.validate()
    assert s.info["optimal"], s.info
    best = brute_force_optimum(graph, cluster)
    assert s.makespan == pytest.approx(best, rel=REL, abs=1e-12)
    assert s.info["lower_bound"] <= best * (1 + REL)
    # No heuristic beats a proven optimum, and no bound exceeds it.
    assert communication_lower_bound(graph, cluster) <= best * (1 + REL)
    for name in available_algorithms():
        if name != "exact":
            h = schedule(graph, cluster, name)
            assert h.makespan >= s.makespan * (1 - REL), name
            assert h.info["lower_bound"] <= best * (1 + REL), name
            assert h.info.get("optimal", False) == (h.makespan <= h.info["lower_bound"] * (1 + 1e-9))


@settings(max_examples=15, deadline=None, derandomize=True, phases=PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(small_instances(memory=True))
def test_memory_constrained_schedules_validate(instance):
    graph, cluster = instance
    from fddps.errors import InfeasibleError
    try:
        s = schedule(graph, cluster, "exact", time_limit=10)
    except InfeasibleError as err:
        if "proven" in str(err) or "cluster has" in str(err):
            # Then no schedule fits, as brute force confirms.
            assert brute_force_optimum(graph, cluster) == np.inf
        return
    s.validate()
    best = brute_force_optimum(graph, cluster)
    assert s.makespan >= best * (1 - REL)
    assert s.info["lower_bound"] <= best * (1 + REL)
    if s.info["optimal"]:
        assert s.makespan == pytest.approx(best, rel=REL)


def test_pins_colocation_and_kernels_are_respected():
    # d2 is a CPU without a kernel for "gpu_only"; o0 pinned to d1; o3 and o4 colocated.
    names = [f"o{i}" for i in range(6)]
    cost = [[1.0, 2.0], [2.0, 1.0], [3.0, np.inf], [1.0, 1.0], [2.0, 2.0], [1.0, 3.0]]
    edges = [("o0", "o2", 2.0), ("o1", "o2", 1.0), ("o2", "o5", 1.0), ("o3", "o4", 5.0),
             ("o1", "o3", 1.0)]
    g = OpGraph(names, cost, edges, device_types=["GPU", "CPU"],
                pinned={"o0": "d1"}, colocation=[None, None, None, "g", "g", None])
    c = Cluster([Device("d0", "GPU"), Device("d1", "GPU"), Device("d2", "CPU")], bandwidth=2.0)
    s = schedule(g, c, "exact", time_limit=20).validate()
    assert s.info["optimal"]
    assert s.placement["o0"] == "d1" and s.placement["o2"] != "d2"
    assert s.placement["o3"] == s.placement["o4"]
    assert s.makespan == pytest.approx(brute_force_optimum(g, c), rel=REL)


def test_identical_devices_symmetry_keeps_the_optimum():
    # Four identical devices and a fork of equal tasks: the optimum spreads the fork.
    g = OpGraph(list("rabcd"), [1.0, 4.0, 4.0, 4.0, 4.0],
                [("r", x, 0.5) for x in "abcd"])
    s = schedule(g, Cluster.homogeneous(4, bandwidth=1.0), "exact", time_limit=20).validate()
    assert s.info["optimal"] and s.makespan == pytest.approx(5.5)
    assert s.info["lower_bound"] == pytest.approx(5.5)


def test_deterministic():
    g = OpGraph([f"o{i}" for i in range(10)], np.linspace(1, 3, 10),
                [(f"o{i}", f"o{j}", 3.0) for i in range(10) for j in range(i + 1, 10) if (i * j) % 3 == 1])
    c = Cluster.homogeneous(3, bandwidth=1.0)
    a = schedule(g, c, "exact", time_limit=2)
    b = schedule(g, c, "exact", time_limit=2)
    assert a.makespan == b.makespan and np.array_equal(a.device, b.device)
    assert a.info["status"] == b.info["status"] and a.info["lower_bound"] == b.info["lower_bound"]


@pytest.mark.parametrize("options, message", [
    ({"time_limit": 0}, "time_limit must be a positive"),
    ({"time_limit": -1.0}, "time_limit must be a positive"),
    ({"time_limit": float("nan")}, "time_limit must be a positive"),
    ({"workers": 0}, "workers must be a positive integer"),
    ({"workers": 1.5}, "workers must be a positive integer"),
    ({"max_ops": 2}, "the graph has 3 ops, more than max_ops=2"),
    ({"warm_start": "fddps"}, "warm_start must be a sequence"),
])
def test_bad_options_raise_clear_errors(options, message):
    g = OpGraph(list("abc"), [1.0, 1.0, 1.0], [("a", "b"), ("b", "c")])
    with pytest.raises(ValueError, match=message):
        schedule(g, Cluster.homogeneous(2), "exact", **options)


def test_refuses_links_that_spend_device_time():
    g = OpGraph(list("ab"), [1.0, 1.0], [("a", "b", 1.0)])
    c = Cluster([Device("cpu0", "CPU"), Device("cpu1", "CPU")], bandwidth=1.0, transfer_compute=1.0)
    with pytest.raises(ClusterError, match="transfer_compute"):
        schedule(g, c, "exact")


def test_unknown_warm_start_algorithm_is_named():
    g = OpGraph(list("ab"), [1.0, 1.0], [("a", "b", 1.0)])
    with pytest.raises(ValueError, match="nosuch"):
        schedule(g, Cluster.homogeneous(2), "exact", warm_start=("nosuch",))


def test_communication_bound_beats_the_plain_one_on_a_costly_join():
    # Two inputs of 4 s transfer into a join: serialise them on one device or pay.
    g = OpGraph(list("abc"), [2.0, 2.0, 1.0], [("a", "c", 4.0), ("b", "c", 4.0)])
    c = Cluster.homogeneous(2, bandwidth=1.0)
    assert lower_bound(g, c) == 3.0
    assert communication_lower_bound(g, c) == 5.0
    s = schedule(g, c, "fddps")
    assert s.info["lower_bound"] == 5.0 and s.makespan == 5.0 and s.info["optimal"]
    s = schedule(g, c, "heft")  # spreads a and b, then pays a transfer
    assert s.makespan == 7.0 and "optimal" not in s.info


def test_bound_counts_pins_and_device_types():
    # a and b pinned apart: the join pays one transfer whatever is done.
    g = OpGraph(list("abc"), [2.0, 2.0, 1.0], [("a", "c", 4.0), ("b", "c", 4.0)],
                pinned={"a": "0", "b": "1"})
    c = Cluster.homogeneous(2, bandwidth=1.0)
    assert communication_lower_bound(g, c) == 7.0
    assert schedule(g, c, "exact").makespan == 7.0
    # Three GPU-only ops of 2 s and one GPU among a GPU and a CPU: 6 s of GPU work.
    g = OpGraph(list("xyz"), [[2.0, float("inf")]] * 3, device_types=["GPU", "CPU"])
    c = Cluster([Device("g", "GPU"), Device("c", "CPU")])
    assert lower_bound(g, c) == 3.0 and communication_lower_bound(g, c) == 6.0


def test_placement_summary_reports_the_gap():
    tf = pytest.importorskip("tensorflow")
    from fddps.tf import place

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 16])
        y = tf.nn.relu(tf.matmul(x, w), name="y")
        tf.reduce_sum(tf.matmul(y, w) + tf.matmul(y, tf.transpose(w)), name="out")
    p = place(graph.as_graph_def(), ["/cpu:0", "/cpu:1"], fetches=["out"])
    bound = p.schedule.info["lower_bound"]
    assert 0 < bound <= p.makespan
    text = p.summary()
    if p.schedule.info.get("optimal"):
        assert "optimal (proven)" in text
    else:
        assert f"within {p.makespan / bound - 1:.1%} of optimal" in text


def test_whole_number_times_round_the_bound_up():
    # Three independent 1 s ops on 2 devices: work / devices = 1.5, but every
    # makespan is a whole number, so 2 is a bound, and met.
    g = OpGraph(list("abc"), [1.0, 1.0, 1.0])
    s = schedule(g, Cluster.homogeneous(2), "heft")
    assert s.info["lower_bound"] == 2.0 and s.info["optimal"]
    g = OpGraph(list("abc"), [1.0, 1.0, 1.5])
    assert schedule(g, Cluster.homogeneous(2), "heft").info["lower_bound"] == 1.75


def test_exact_refuses_clusters_that_share_hardware():
    from fddps.cluster import SharedCores

    g = OpGraph(["a", "b"], cost=[1.0, 1.0], edges=[("a", "b", 10.0)])
    c = Cluster.homogeneous(2, names=["x", "y"], bandwidth=1e3)
    shared = c.with_sharing([SharedCores(("x", "y"), cores=1)])
    with pytest.raises(ClusterError, match="share cores or links"):
        schedule(g, shared, algorithm="exact")


def test_exact_runs_after_tensorflow_was_imported(tmp_path):
    """TensorFlow imported before OR-Tools makes CP-SAT crash in-process
    (google/or-tools#3230): then the solve runs in a child process."""
    import subprocess
    import sys

    pytest.importorskip("tensorflow")
    code = (
        "import tensorflow, fddps\n"
        "from fddps.algorithms.exact import solver_needs_child_process\n"
        "g = fddps.OpGraph(['a', 'b', 'c'], cost=[1.0, 2.0, 2.0], "
        "edges=[('a', 'b', 1e3), ('a', 'c', 1e3)])\n"
        "s = fddps.schedule(g, fddps.Cluster.homogeneous(2, bandwidth=1e3, latency=0.5), "
        "algorithm='exact', time_limit=5)\n"
        "s.validate()\n"
        "print(solver_needs_child_process(), s.info['optimal'], s.makespan)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    child, optimal, makespan = run.stdout.split()[-3:]
    assert child == "True" and optimal == "True"
    # a on one device, b after it, c on the other after the transfer: 1 + max(2, 1.5 + 2)
    assert float(makespan) == pytest.approx(4.5)
