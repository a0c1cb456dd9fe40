"""When no schedule fits in memory, InfeasibleError names the smallest
per-device peak the attempts reached (reserving persistent bytes, then the
fallback reserving memory + transient bytes) and its device."""

import dataclasses

import numpy as np
import pytest

import fddps
from fddps import Cluster, Device, OpGraph
from fddps.algorithms.base import memory_overflow, reserving_transient
from fddps.errors import InfeasibleError

ALGORITHMS = ["fddps", "heft", "etf", "fastt", "mpdps"]


def _attempt(algorithm, graph, cluster, reserve_transient):
    """(device, peak, capacity) of the algorithm's own schedule under one reservation,
    None when it fits, or "no schedule" when the greedy placement ran out of memory."""
    with reserving_transient(reserve_transient):
        try:
            schedule = fddps.get_algorithm(algorithm)._schedule(graph, cluster)
        except InfeasibleError:
            return "no schedule"
    over = memory_overflow(schedule)
    return None if over is None else (cluster.names[over[0]], over[1], over[2])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_smallest_peak_of_the_attempts_is_reported(algorithm):
    # a -> b -> c, a's output also read by c. Reserving persistent bytes (none),
    # the chain runs on one device, which holds a's and b's 40-byte outputs and c's
    # 5 at once: 85 > 47. Reserving 40 + 40 + 5 puts b on the other device; c's
    # device then holds a's 40, c's 5 and a 5-byte copy of b's output: 50 > 47.
    g = OpGraph(list("abc"), [1.0] * 3, [("a", "b", 5.0), ("a", "c", 5.0), ("b", "c", 5.0)],
                transient=[40.0, 40.0, 5.0])
    c = Cluster([Device(f"d{k}", memory=47.0) for k in range(2)], bandwidth=1e3, latency=100.0)
    persistent = _attempt(algorithm, g, c, False)
    fallback = _attempt(algorithm, g, c, True)
    assert persistent[1] == 85.0 and fallback[1] == 50.0
    with pytest.raises(InfeasibleError) as err:
        fddps.schedule(g, c, algorithm)
    e = err.value
    assert (e.device, e.needed, e.available) == (fallback[0], 50.0, 47.0)
    assert e.attempts == [("memory + transient", *fallback), ("persistent", *persistent)]
    assert f"smallest per-device peak reached is 50 bytes on {fallback[0]!r}" in str(e)
    assert f"{persistent[0]!r} peaks at 85 bytes (capacity 47)" in str(e)


@pytest.fixture(scope="module")
def wide_resnet_graph():
    """A small wide ResNet's step, read for two P100s (pinned presets)."""
    pytest.importorskip("tensorflow")
    import costmodel
    import slim_models
    from fddps.tf import make_cluster, read_graph_def

    cpu = dataclasses.replace(costmodel.presets["p100"], name="p100-as-cpu", device_type="CPU")
    cm = costmodel.default_cost_model(gpu="p100", cpu=cpu)
    m = slim_models.build_training_graph("wide_resnet", 8, image_size=32, num_classes=10,
                                         depth=50, width=0.25)
    devices = ["/device:GPU:0", "/device:GPU:1"]
    graph, _ = read_graph_def(m.graph_def, cm, make_cluster(devices, cm),
                              fetches=[m.train_op.name, m.loss.name])
    alone = fddps.schedule(graph, make_cluster(devices, cm, 1e12), "single")
    return graph, cm, devices, float(alone.peak_memory().max())


@pytest.mark.slow  # builds and reads a 2.7k-op step
@pytest.mark.parametrize("algorithm", ["fddps", "heft", "etf"])
def test_a_wide_resnet_on_small_devices_reports_its_smallest_peak(wide_resnet_graph, algorithm):
    from fddps.tf import make_cluster

    graph, cm, devices, peak_alone = wide_resnet_graph
    # Each device holds 40% of what the step peaks at on one device: the
    # persistent bytes fit (the placement is made) but every placement's peak
    # overflows, and reserving memory + transient bytes makes no placement.
    capacity = 0.4 * peak_alone
    cluster = make_cluster(devices, cm, capacity)
    assert graph.memory.sum() < 2 * capacity < (graph.memory + graph.transient).sum()
    persistent = _attempt(algorithm, graph, cluster, False)
    assert persistent not in (None, "no schedule")
    assert _attempt(algorithm, graph, cluster, True) == "no schedule"
    with pytest.raises(InfeasibleError) as err:
        fddps.schedule(graph, cluster, algorithm)
    e = err.value
    assert (e.device, e.needed, e.available) == persistent
    assert e.device in devices and e.needed > capacity
    assert e.attempts == [("persistent", *persistent)]
    text = str(e)
    assert f"smallest per-device peak reached is {e.needed:.6g} bytes on {e.device!r}" in text
    assert "reserving memory + transient bytes made no schedule" in text


def _with_activations(g):
    """``g`` with each op's largest output as its transient bytes (the generator's
    graphs hold only persistent memory, so no peak could overflow)."""
    out = np.zeros(g.num_ops)
    np.maximum.at(out, g.src, g.bytes)
    edges = [(g.names[s], g.names[d], b)
             for s, d, b in zip(g.src.tolist(), g.dst.tolist(), g.bytes.tolist())]
    return OpGraph(g.names, g.cost, edges, memory=g.memory, transient=out,
                   colocation=g.colocation)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_on_random_training_graphs_the_report_is_the_best_attempt(algorithm):
    from fddps.generators import training_graph

    refused = 0
    for seed in range(4):
        g = _with_activations(training_graph(40, seed=seed))
        alone = fddps.schedule(g, Cluster([Device("d0", memory=float("inf"))]), "single")
        for m, frac in ((2, 0.4), (3, 0.3)):
            capacity = frac * float(alone.peak_memory().max())
            c = Cluster([Device(f"d{k}", memory=capacity) for k in range(m)], bandwidth=1e9,
                        latency=1e-5)
            try:
                fddps.schedule(g, c, algorithm)
            except InfeasibleError as e:
                if not e.attempts:  # no schedule was made at all
                    continue
                refused += 1
                made = [a for a in (_attempt(algorithm, g, c, False),
                                    _attempt(algorithm, g, c, True))
                        if a not in (None, "no schedule")]
                best = min(made, key=lambda a: a[1] - a[2])
                assert (e.device, e.needed, e.available) == best
                assert e.needed > e.available == capacity
                assert sorted(a[1:] for a in e.attempts) == sorted(made)
    assert refused > 0
