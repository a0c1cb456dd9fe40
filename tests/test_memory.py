"""The memory constraint: each device's replayed peak, not a whole-step reservation.

Schedulers reserve persistent bytes only, check the peak of the schedule
(persistent + live transients + received copies) and fall back to reserving
``memory + transient`` of every op for the whole step when a device overflows.
"""

import numpy as np
import pytest

import fddps
from fddps import Cluster, Device, OpGraph
from fddps.algorithms.base import PlacementState, memory_overflow, reserving_transient
from fddps.algorithms.single import best_single_device, single_device_peak
from fddps.errors import InfeasibleError, InvalidScheduleError
from fddps.simulate import peak_memory
from fddps.strategy.fddps_splits import SplitCandidate, rules_for

# "exact" refuses clusters whose transfers spend device time and solves memory
# itself (persistent, then the replayed peak): tests/test_exact.py covers it.
ALGORITHMS = [a for a in fddps.available_algorithms() if a != "exact"]


def chain(n=6, memory=1.0, transient=10.0):
    """o0 -> o1 -> ... each op 1 s, its output (``transient`` bytes) read by the next."""
    names = [f"o{i}" for i in range(n)]
    return OpGraph(names, [1.0] * n, [(a, b, transient) for a, b in zip(names, names[1:])],
                   memory=[memory] * n, transient=[transient] * n)


def cluster(m, memory, latency=0.0):
    return Cluster([Device(f"d{k}", memory=memory) for k in range(m)], bandwidth=1e3, latency=latency)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_graph_whose_reservation_exceeds_capacity_but_whose_peak_fits_is_placed(algorithm):
    # 6 x (1 + 10) = 66 bytes reserved for the whole step > 2 x 30; one device
    # running the chain holds 6 persistent bytes and two outputs at once: 26.
    g, c = chain(), cluster(2, memory=30.0)
    assert (g.memory + g.transient).sum() > c.memory.sum()
    with pytest.raises(InfeasibleError, match="needs 66 bytes"):
        PlacementState(g, c, reserve_transient=True)
    s = fddps.schedule(g, c, algorithm).validate()
    assert s.info["memory_reservation"] == "persistent"
    assert (s.peak_memory() <= 30.0).all()
    assert s.peak_memory().max() >= 22.0  # the chain's outputs are counted


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "single"])
def test_the_fallback_reserves_transient_bytes_when_the_persistent_schedule_overflows(algorithm):
    # a feeds b and c (control edges); transfers take 100 s, so reserving
    # persistent bytes (none) keeps all three on one device, which holds a's
    # output and b's or c's at once: 20 bytes > 15. Reserving 10 bytes per op
    # for the whole step puts one op on each device.
    g = OpGraph(list("abc"), [1.0] * 3, [("a", "b"), ("a", "c")], transient=[10.0] * 3)
    c = cluster(3, memory=15.0, latency=100.0)
    with reserving_transient(False):
        first = fddps.get_algorithm(algorithm)._schedule(g, c)
    k, peak, capacity = memory_overflow(first)
    assert (peak, capacity) == (20.0, 15.0)
    s = fddps.schedule(g, c, algorithm).validate()
    assert s.info["memory_reservation"] == "memory + transient"
    assert sorted(s.device.tolist()) == [0, 1, 2]
    assert (s.peak_memory() == 10.0).all()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_graph_whose_peak_fits_nowhere_is_refused_naming_device_bytes_and_capacity(algorithm):
    # a's 40-byte output is held with b's 40 wherever b runs (locally or as a
    # received copy): 80 bytes on a device of 50.
    g = OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 40.0)], transient=[40.0, 40.0])
    with pytest.raises(InfeasibleError, match=r"'d[01]'.* peaks at 80 bytes.*capacity (of )?50") as err:
        fddps.schedule(g, cluster(2, memory=50.0), algorithm)
    assert (err.value.needed, err.value.available) == (80.0, 50.0)


def test_received_copies_count_against_the_receiving_device():
    # Alone, b needs 40 bytes; with its input received from d0 it holds 80.
    g = OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 40.0)], transient=[40.0, 40.0])
    c = cluster(2, memory=50.0)
    split = fddps.Schedule.from_order(g, c, [0, 1], [[0], [1]])
    np.testing.assert_allclose(split.peak_memory(), [40.0, 80.0])
    assert (split.device_memory() <= 50.0).all()  # the reservation misses the copy
    with pytest.raises(InvalidScheduleError, match="device 'd1' holds 80 bytes at its peak, over "
                                                   "its capacity of 50"):
        split.validate()


def test_validate_checks_the_peak_not_the_reservation():
    g, c = chain(), cluster(1, memory=26.0)
    s = fddps.Schedule.from_order(g, c, [0] * 6, [list(range(6))]).validate()
    assert s.device_memory()[0] == 66.0 and s.peak_memory()[0] == 26.0
    with pytest.raises(InvalidScheduleError, match="holds 26 bytes at its peak"):
        fddps.Schedule.from_order(g, cluster(1, memory=25.0), [0] * 6, [list(range(6))]).validate()


def test_a_received_tensor_counts_once_per_device_and_at_most_its_producer_transient():
    # a (on d0) feeds b and c (on d1) 30 bytes each: one copy on d1.
    def peak(transient_a):
        g = OpGraph(list("abc"), [1.0] * 3, [("a", "b", 30.0), ("a", "c", 30.0)],
                    transient=[transient_a, 0.0, 0.0])
        s = fddps.Schedule.from_order(g, cluster(2, memory=np.inf), [0, 1, 1], [[0], [1, 2]])
        return s.peak_memory().tolist()

    assert peak(30.0) == [30.0, 30.0]
    # A copy of an output is no larger than the producer's outputs; a graph
    # without transient bytes models no activation memory on any device.
    assert peak(20.0) == [20.0, 20.0]
    assert peak(0.0) == [0.0, 0.0]


def test_single_device_uses_the_peak_of_a_topological_run():
    g = chain()
    assert single_device_peak(g, cluster(1, memory=26.0), 0) == 26.0
    assert fddps.schedule(g, cluster(1, memory=26.0), "single").makespan == 6.0
    with pytest.raises(InfeasibleError, match="'d0' peaks at 26 bytes \\(capacity 25\\)"):
        fddps.schedule(g, cluster(1, memory=25.0), "single")
    # FD-DPS's guard against losing to one device follows the same rule.
    state = PlacementState(g, cluster(2, memory=26.0), reserve_transient=False)
    assert best_single_device(state) == (0, 6.0)
    state = PlacementState(g, cluster(2, memory=25.0), reserve_transient=False)
    assert best_single_device(state) == (None, np.inf)


def test_placement_state_reserves_what_it_is_told():
    g = chain(3, memory=1.0, transient=10.0)
    c = cluster(2, memory=np.inf)
    assert PlacementState(g, c).need == [11.0] * 3  # outside a scheduler: conservative
    with reserving_transient(False):
        assert PlacementState(g, c).need == [1.0] * 3
        assert PlacementState(g, c, reserve_transient=True).need == [11.0] * 3
    assert PlacementState(g, c).need == [11.0] * 3


def test_a_split_schedule_is_checked_on_the_split_graph():
    # A long conv split over 4 devices: its combine op holds the 1000-byte output.
    rule = rules_for("Conv2D", {"data_format": "NHWC"})[0]
    cand = SplitCandidate("conv", rule, 8, (("x", 1e3),), 1e3, slice_cost=(0.01,), combine_cost=(0.01,))
    g = OpGraph(["x", "w", "conv", "relu"], [0.1, 0.0, 8.0, 0.1],
                [("x", "conv", 1e3), ("w", "conv", 1e3), ("conv", "relu", 1e3)],
                transient=[0, 0, 100, 0], split_candidates=[cand])
    c = Cluster.homogeneous(4, bandwidth=1e6, latency=1e-4, memory=1100.0)
    s = fddps.schedule(g, c).validate()
    assert s.info["splits"] and s.graph is not g
    peak = peak_memory(s.graph, c, s.device, s.start, s.finish)
    np.testing.assert_allclose(s.peak_memory(), peak)
    assert peak.max() == 1100.0 and memory_overflow(s) is None
