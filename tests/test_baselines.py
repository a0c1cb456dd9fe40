"""Baseline schedulers: HEFT, m-ETF, m-TOPO, FastT, MP-DPS.

Known answers (the HEFT paper's example, small graphs whose schedules are
worked out by hand in the comments), memory limits, constraints, and validity
on the Standard Task Graph Set. Runtime: a few seconds.
"""

import os
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

import fddps
from fddps import Cluster, Device, InfeasibleError, OpGraph, read_stg
from fddps.algorithms.base import PlacementState
from fddps.algorithms.fastt import static_priority
from fddps.algorithms.heft import upward_rank
from fddps.algorithms.mpdps import merge_ops, optimistic_cost_table
from fddps.generators import training_graph
from fddps.stg import read_optimal_values

BASELINES = ["heft", "etf", "topo", "fastt", "mpdps"]
STG_ROOT = Path(os.environ.get("FDDPS_STG",
                               Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "stg"))


def test_baselines_are_registered_with_their_options():
    assert set(BASELINES) <= set(fddps.available_algorithms())
    assert fddps.get_algorithm("heft", insertion=False).insertion is False
    assert fddps.get_algorithm("fastt", insertion=False).insertion is False
    assert fddps.get_algorithm("mpdps", granularity=4).granularity == 4
    with pytest.raises(TypeError):
        fddps.get_algorithm("etf", insertion=True)


# -- HEFT ------------------------------------------------------------------------

def topcuoglu_example():
    """Fig. 2 / Table 1 of Topcuoglu, Hariri & Wu (2002): 10 tasks, 3 processors.

    One device type per processor carries the paper's per-processor costs;
    edge costs become bytes on links of bandwidth 1 and latency 0.
    """
    w = [[14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10],
         [13, 16, 9], [7, 15, 11], [5, 11, 14], [18, 12, 20], [21, 7, 16]]
    c = [(1, 2, 18), (1, 3, 12), (1, 4, 9), (1, 5, 11), (1, 6, 14), (2, 8, 19), (2, 9, 16),
         (3, 7, 23), (4, 8, 27), (4, 9, 23), (5, 9, 13), (6, 8, 15), (7, 10, 17), (8, 10, 11),
         (9, 10, 13)]
    graph = OpGraph([f"n{i}" for i in range(1, 11)], np.array(w, dtype=float),
                    [(f"n{a}", f"n{b}", x) for a, b, x in c], device_types=["P1", "P2", "P3"])
    cluster = Cluster([Device(f"P{k}", type=f"P{k}") for k in (1, 2, 3)], bandwidth=1.0)
    return graph, cluster


def test_heft_reproduces_the_papers_ranks_and_schedule():
    graph, cluster = topcuoglu_example()
    ranks = upward_rank(PlacementState(graph, cluster))
    np.testing.assert_allclose(ranks, [108, 77, 80, 80, 69, 63.333, 42.667, 35.667, 44.333, 14.667],
                               atol=1e-3)
    result = fddps.schedule(graph, cluster, "heft").validate()
    assert result.makespan == pytest.approx(80.0)
    # The paper's Fig. 4(a).
    assert result.placement == {"n1": "P3", "n2": "P1", "n3": "P3", "n4": "P2", "n5": "P3",
                                "n6": "P2", "n7": "P3", "n8": "P1", "n9": "P2", "n10": "P2"}


def gap_graph():
    """A needs T0, B and C need T1; A's 4-byte output to B takes 4 s.

    B (cost 3) waits on device 1 until time 5; C (cost 2, lowest priority,
    placed last) fits in the idle gap [0, 5) with insertion (makespan 8),
    and only after B without it (makespan 10).
    """
    inf = np.inf
    graph = OpGraph(["A", "B", "C"], [[1, inf], [inf, 3], [inf, 2]], [("A", "B", 4.0)],
                    device_types=["T0", "T1"])
    cluster = Cluster([Device("d0", "T0"), Device("d1", "T1")], bandwidth=1.0)
    return graph, cluster


@pytest.mark.parametrize("algorithm", ["heft", "fastt"])
def test_insertion_fills_idle_gaps(algorithm):
    graph, cluster = gap_graph()
    with_gaps = fddps.schedule(graph, cluster, algorithm).validate()
    assert with_gaps.makespan == pytest.approx(8.0)
    assert with_gaps.start[graph.index["C"]] == 0.0
    without = fddps.schedule(graph, cluster, algorithm, insertion=False).validate()
    assert without.makespan == pytest.approx(10.0)


# -- small graphs with known optima ------------------------------------------------

def diamond():
    """a(1) -> b(2), c(2) -> d(1), no transfer cost: optimum 4 on two devices."""
    return OpGraph(list("abcd"), [1.0, 2.0, 2.0, 1.0],
                   [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])


@pytest.mark.parametrize("algorithm", ["heft", "etf", "fastt", "mpdps"])
def test_diamond_reaches_its_optimum(algorithm):
    result = fddps.schedule(diamond(), Cluster.homogeneous(2), algorithm).validate()
    assert result.makespan == pytest.approx(4.0)
    assert result.device[1] != result.device[2]  # b and c run side by side


@pytest.mark.parametrize("algorithm", ["heft", "etf", "fastt", "mpdps"])
def test_expensive_transfers_keep_a_chain_on_one_device(algorithm):
    # Moving any tensor costs 100 s; the optimum runs the chain on one device: 3 s.
    graph = OpGraph(list("xyz"), [1.0, 1.0, 1.0], [("x", "y", 100.0), ("y", "z", 100.0)])
    result = fddps.schedule(graph, Cluster.homogeneous(2, bandwidth=1.0), algorithm).validate()
    assert result.makespan == pytest.approx(3.0)
    assert len(set(result.device.tolist())) == 1


def test_fastt_priority_is_the_static_critical_path_slack():
    # a(1) -> b(3); a -> c(1) -> d(1). EST: a0 b1 c1 d2; blevel: a4 b3 c2 d1.
    # EST + blevel: a4 b4 c3 d3 -> order a, b (ties: larger blevel), c, d.
    graph = OpGraph(list("abcd"), [1.0, 3.0, 1.0, 1.0], [("a", "b"), ("a", "c"), ("c", "d")])
    rank = static_priority(PlacementState(graph, Cluster.homogeneous(2)))
    assert rank.tolist() == [0, 1, 2, 3]


def test_fastt_chooses_the_earliest_start_heft_the_earliest_finish():
    # Device f is fast (type F), s slow (type S). a (F 4, S 8) goes first
    # (larger mean time) to f. b (F 1, S 10) can start at 4 on f (finish 5) or
    # at 0 on s (finish 10): FastT starts it at 0 on s, HEFT finishes it at 5 on f.
    graph = OpGraph(["a", "b"], [[4.0, 8.0], [1.0, 10.0]], device_types=["F", "S"])
    cluster = Cluster([Device("f", "F"), Device("s", "S")])
    fastt = fddps.schedule(graph, cluster, "fastt").validate()
    assert fastt.placement == {"a": "f", "b": "s"} and fastt.makespan == pytest.approx(10.0)
    heft = fddps.schedule(graph, cluster, "heft").validate()
    assert heft.placement == {"a": "f", "b": "f"} and heft.makespan == pytest.approx(5.0)


# -- memory: m-ETF and m-TOPO ------------------------------------------------------------

def chain(n=4, nbytes=10.0, memory=1.0):
    names = [f"o{i}" for i in range(n)]
    return OpGraph(names, [1.0] * n, [(a, b, nbytes) for a, b in zip(names, names[1:])],
                   memory=[memory] * n)


def test_metf_splits_a_chain_when_the_device_is_full():
    # Transfers cost 10 s, so ETF keeps the chain together while memory lasts:
    # o0, o1 fill device 0 (capacity 2), o2, o3 go to device 1 after one transfer.
    cluster = Cluster.homogeneous(2, bandwidth=1.0, memory=2.0)
    result = fddps.schedule(chain(), cluster, "etf").validate()
    assert result.device.tolist() == [0, 0, 1, 1]
    assert result.makespan == pytest.approx(14.0)
    assert (result.device_memory() <= 2.0).all()


def test_metf_ties_go_to_the_larger_static_level_then_topological_order():
    # After a, b (level 3) and c (level 2) can both start at 1 on either device:
    # b takes device 0 first, then c device 1 at 1.
    graph = OpGraph(list("abcd"), [1.0, 2.0, 1.0, 1.0], [("a", "b"), ("a", "c"), ("b", "d")])
    result = fddps.schedule(graph, Cluster.homogeneous(2), "etf").validate()
    assert result.placement == {"a": "0", "b": "0", "c": "1", "d": "0"}
    assert result.makespan == pytest.approx(4.0)


def test_mtopo_fills_devices_in_topological_order_up_to_the_budget():
    # Budget: 4 bytes / 2 devices + largest op (1) = 3 bytes per device.
    result = fddps.schedule(chain(), Cluster.homogeneous(2, memory=10.0), "topo").validate()
    assert result.device.tolist() == [0, 0, 0, 1]
    assert result.info["budget_bytes"] == pytest.approx(3.0)


def test_mtopo_budget_is_capped_by_device_capacity():
    result = fddps.schedule(chain(), Cluster.homogeneous(2, memory=2.0), "topo").validate()
    assert result.device.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("algorithm", BASELINES)
def test_greedy_placement_that_cannot_fit_raises_naming_the_op(algorithm):
    # 6 bytes in all on 2 x 3 bytes, but ops of 2 bytes: the third fits nowhere.
    graph = OpGraph(["p", "q", "r"], [1.0, 1.0, 1.0], memory=[2.0, 2.0, 2.0])
    with pytest.raises(InfeasibleError, match="op 'r' needs 2 bytes"):
        fddps.schedule(graph, Cluster.homogeneous(2, memory=3.0), algorithm)


@pytest.mark.parametrize("algorithm", BASELINES)
def test_graph_larger_than_the_cluster_is_infeasible(algorithm):
    with pytest.raises(InfeasibleError, match="needs 8 bytes of device memory"):
        fddps.schedule(chain(memory=2.0), Cluster.homogeneous(2, memory=3.0), algorithm)


# -- MP-DPS -----------------------------------------------------------------------------------

def test_merging_is_sized_to_the_devices_compute_power():
    # Balanced step time T* = 4 s of work / 2 devices = 2 s. granularity 1 caps
    # units at 2 s: the chain becomes two units of two ops.
    graph = chain(nbytes=0.0)
    units = merge_ops(PlacementState(graph, Cluster.homogeneous(2)), granularity=1)
    assert units.tolist() == [0, 0, 1, 1]
    # A device twice as fast: T* = 1 / (1/4 + 1/2) = 4/3 s, so single ops only.
    fast = Cluster([Device("0"), Device("1", speed=2.0)])
    assert merge_ops(PlacementState(graph, fast), granularity=1).tolist() == [0, 1, 2, 3]
    # Finer granularity: no unit may hold two ops.
    assert merge_ops(PlacementState(graph, Cluster.homogeneous(2)), granularity=4).tolist() == \
        [0, 1, 2, 3]


def test_small_ops_join_their_only_neighbour():
    # Transfers take 0.5 s. z costs nothing and its only producer is x: it
    # joins x. w is small too but has three producers and no consumer, so it
    # stays alone; y and v compute longer than a transfer, so they stay alone.
    graph = OpGraph(list("xzyvw"), [1.0, 0.0, 1.0, 1.0, 0.0],
                    [("x", "z", 0.5), ("z", "y", 0.5), ("z", "v", 0.5),
                     ("y", "w", 0.5), ("v", "w", 0.5), ("x", "w", 0.5)])
    state = PlacementState(graph, Cluster.homogeneous(2, bandwidth=1.0))
    units = merge_ops(state, granularity=1, chains=False)
    assert units[0] == units[1]
    assert len(set(units.tolist())) == 4


def test_merged_units_are_placed_whole_and_the_unit_graph_is_acyclic():
    graph = training_graph(400, seed=3)
    cluster = Cluster.homogeneous(4, bandwidth=1e9, latency=1e-5)
    units = merge_ops(PlacementState(graph, cluster), granularity=4)
    assert len(set(units.tolist())) < graph.num_ops  # something was merged
    assert np.all(units[graph.src] <= units[graph.dst])  # numbered topologically
    result = fddps.schedule(graph, cluster, "mpdps", granularity=4).validate()
    for u in np.unique(units):
        assert len(set(result.device[units == u].tolist())) == 1


def test_optimistic_cost_table_by_hand():
    # Unit 0 feeds 1 (times [2, 4], transfer 1) and 2 (times [3, 1], transfer 5).
    # Via 1: min([2, 4], 2 + 1) = [2, 3]; via 2: min([3, 1], 1 + 5) = [3, 1].
    unit_et = np.array([[1.0, 1.0], [2.0, 4.0], [3.0, 1.0]])
    table = optimistic_cost_table(unit_et, np.array([0, 0]), np.array([1, 2]), np.array([1.0, 5.0]))
    np.testing.assert_allclose(table, [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]])


def test_mpdps_splits_a_unit_that_no_device_can_hold_whole():
    # c and e (5 bytes each) take one device each first; the merged chain
    # a -> b (8 bytes) then fits on neither, so its ops are placed one by one.
    graph = OpGraph(list("ceab"), [1.0, 1.0, 0.1, 0.1], [("a", "b")], memory=[5.0, 5.0, 4.0, 4.0])
    result = fddps.schedule(graph, Cluster.homogeneous(2, memory=9.0), "mpdps",
                            granularity=1).validate()
    assert result.info["dissolved_units"] == 1
    assert result.device[2] != result.device[3]


# -- constraints and the STG set -------------------------------------------------------------

def constrained_graph():
    """A training-shaped graph with colocation groups, pinned ops, an op with no
    kernel on the slow type, and two device types."""
    g = training_graph(300, seed=5).to_networkx()
    for node in list(g.nodes)[:3]:
        g.nodes[node]["device"] = "gpu1"
    for node, data in g.nodes(data=True):
        data["cost"] = {"GPU": data["cost"], "CPU": 4 * data["cost"]}
        data["transient"] = 1e5
    g.nodes[list(g.nodes)[10]]["cost"] = {"GPU": 1e-3}  # no CPU kernel
    return OpGraph.from_networkx(g)


@pytest.mark.parametrize("algorithm", BASELINES)
def test_constraints_are_honoured(algorithm):
    graph = constrained_graph()
    need = float((graph.memory + graph.transient).sum())
    cluster = Cluster([Device("gpu0", "GPU", memory=0.4 * need), Device("gpu1", "GPU", memory=0.4 * need),
                       Device("cpu", "CPU", memory=0.4 * need)], bandwidth=1e9, latency=1e-5)
    result = fddps.schedule(graph, cluster, algorithm).validate()
    assert all(result.placement[graph.names[i]] == "gpu1" for i in graph.pinned)
    assert result.placement[graph.names[10]] != "cpu"


def stg_cases():
    if not (STG_ROOT / "50").is_dir():
        return []
    return [(f"rand{k:04d}.stg", p) for k in range(5) for p in (2, 4)]


@pytest.mark.skipif(not stg_cases(), reason=f"no STG benchmark set at {STG_ROOT} (set FDDPS_STG)")
@pytest.mark.parametrize("algorithm", BASELINES)
def test_stg_schedules_are_valid_and_never_beat_the_optimum(algorithm):
    optima = {}
    for p in (2, 4):
        table = read_optimal_values(STG_ROOT / "Optimal_values" / f"Case50_{p}_OPT.csv")
        optima.update({(row.graph, p): row.lower for row in table.itertuples()})
    for name, p in stg_cases():
        graph = read_stg(STG_ROOT / "50" / name)
        cluster = Cluster.homogeneous(p)
        result = fddps.schedule(graph, cluster, algorithm).validate()
        assert result.makespan >= optima[f"50/{name}", p] - 1e-9
        assert result.makespan >= fddps.lower_bound(graph, cluster) - 1e-9
        if algorithm != "topo":  # m-TOPO puts a graph without memory needs on one device
            assert result.makespan < graph.cost.sum()


def test_networkx_input_is_not_modified():
    g = nx.DiGraph()
    g.add_node("a", cost=1.0)
    g.add_node("b", cost=1.0)
    g.add_edge("a", "b", bytes=4.0)
    before = nx.to_dict_of_dicts(g), dict(g.nodes(data=True))
    for algorithm in BASELINES:
        fddps.schedule(g, Cluster.homogeneous(2), algorithm).validate()
    assert (nx.to_dict_of_dicts(g), dict(g.nodes(data=True))) == before


# -- FastT's splitting of critical-path ops -------------------------------------------------

def conv_branches(side_cost):
    """x -> conv (8 s, splittable on a batch of 8) -> relu, beside x -> side -> end."""
    from fddps.strategy.fddps_splits import SplitCandidate, rules_for

    rule = rules_for("Conv2D", {"data_format": "NHWC"})[0]
    cand = SplitCandidate("conv", rule, 8, (("x", 1e3),), 1e3, slice_cost=(0.01,),
                          combine_cost=(0.01,))
    return OpGraph(["x", "w", "conv", "relu", "side", "end"], [0.1, 0.0, 8.0, 0.1, side_cost, 0.1],
                   [("x", "conv", 1e3), ("w", "conv", 1e3), ("conv", "relu", 1e3),
                    ("x", "side", 1e3), ("side", "end", 1e3)], split_candidates=[cand])


def test_fastt_splits_an_op_on_the_critical_path():
    graph = conv_branches(side_cost=1.0)
    cluster = Cluster.homogeneous(4, bandwidth=1e6, latency=1e-4)
    whole = fddps.schedule(graph, cluster, "fastt", split=False).validate()
    split = fddps.schedule(graph, cluster, "fastt").validate()
    assert whole.info["splits"] == [] and whole.graph is graph
    assert [d.candidate.op for d in split.info["splits"]] == ["conv"]
    assert split.makespan < 0.5 * whole.makespan
    assert split.info["unsplit_makespan"] == pytest.approx(whole.makespan)


def test_fastt_leaves_near_critical_ops_whole():
    # The side branch (8.5 s) is the critical path; conv has a little slack.
    # FD-DPS's planner would take it (slack under 10% of the path), FastT does not.
    from fddps.algorithms.split_step import plan_splits

    graph = conv_branches(side_cost=8.5)
    cluster = Cluster.homogeneous(4, bandwidth=1e6, latency=1e-4)
    assert [d.candidate.op for d in plan_splits(graph, cluster)] == ["conv"]
    result = fddps.schedule(graph, cluster, "fastt").validate()
    assert result.info["splits_planned"] == 0 and result.graph is graph
