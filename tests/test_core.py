"""The problem model, the schedule, the simulator, the STG reader: behaviour and bad input."""

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

import fddps
from fddps import Cluster, Device, OpGraph
from fddps.errors import (ClusterError, GraphError, InfeasibleError, InvalidScheduleError,
                          UnknownAlgorithmError)
from fddps.stg import read_optimal_values, read_stg

STG = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "stg"
needs_stg = pytest.mark.skipif(not STG.is_dir(), reason="../shared/benchmarks/stg not present")


def diamond(**kw):
    return OpGraph(["a", "b", "c", "d"], [1.0, 2.0, 3.0, 1.0],
                   [("a", "b", 10), ("a", "c", 10), ("b", "d", 10), ("c", "d", 10)], **kw)


# -- OpGraph -----------------------------------------------------------------------
def test_graph_structure_and_topological_order():
    g = diamond()
    assert (g.num_ops, g.num_edges) == (4, 4)
    assert sorted(g.names[i] for i in g.successors(0)) == ["b", "c"]
    pos = {g.names[i]: k for k, i in enumerate(g.topo)}
    assert pos["a"] < pos["b"] < pos["d"] and pos["c"] < pos["d"]


def test_parallel_edges_are_merged_and_bytes_summed():
    g = OpGraph(["a", "b"], [1, 1], [("a", "b", 3), ("a", "b", 4), ("a", "b")])
    assert g.num_edges == 1 and g.bytes.tolist() == [7.0]


def test_cycle_is_reported_with_an_op_on_it():
    with pytest.raises(GraphError, match=r"cycle through op '(x|y|z)'"):
        OpGraph(["w", "x", "y", "z"], [1] * 4, [("w", "x"), ("x", "y"), ("y", "z"), ("z", "x")])
    with pytest.raises(GraphError, match="itself"):
        OpGraph(["a"], [1], [("a", "a")])


@pytest.mark.parametrize("cost", [[1.0, -1.0], [1.0, float("nan")]])
def test_bad_cost_names_the_op(cost):
    with pytest.raises(GraphError, match="op 'b' has an invalid cost"):
        OpGraph(["a", "b"], cost)


def test_bad_memory_and_bytes_and_unknown_op():
    with pytest.raises(GraphError, match="op 'a' has an invalid memory"):
        OpGraph(["a"], [1.0], memory=[float("nan")])
    with pytest.raises(GraphError, match="unknown op 'zz'"):
        OpGraph(["a"], [1.0], [("a", "zz")])
    with pytest.raises(GraphError, match="invalid byte count"):
        OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", -5)])
    with pytest.raises(GraphError, match="more than once"):
        OpGraph(["a", "a"], [1.0, 1.0])


def test_networkx_round_trip_keeps_attributes():
    g = nx.DiGraph()
    g.add_node("x", cost=1.5, memory=8, op_type="MatMul")
    g.add_node("y", cost={"GPU": 1.0, "CPU": 4.0}, colocation="v", device="/gpu:0")
    g.add_node("z", cost={"GPU": 2.0, "CPU": 3.0}, colocation="v")
    g.add_edge("x", "y", bytes=100)
    g.add_edge("y", "z")
    og = OpGraph.from_networkx(g)
    assert og.device_types == ("CPU", "GPU")
    assert og.cost[og.index["x"]].tolist() == [1.5, 1.5]
    back = OpGraph.from_networkx(og.to_networkx())
    assert back.names == og.names
    np.testing.assert_array_equal(back.cost, og.cost)
    np.testing.assert_array_equal(back.bytes, og.bytes)
    assert back.pinned == og.pinned == {og.index["y"]: "/gpu:0"}
    assert back.colocation[og.index["y"]] == back.colocation[og.index["z"]] >= 0
    with pytest.raises(GraphError, match="no 'cost'"):
        g.add_node("w")
        OpGraph.from_networkx(g)


def test_exec_times_by_type_and_speed():
    g = OpGraph(["a"], [[2.0, np.inf]], device_types=["GPU", "CPU"])
    c = Cluster([Device("g0", "GPU", speed=2.0), Device("c0", "CPU")])
    assert g.exec_times(c).tolist() == [[1.0, np.inf]]
    with pytest.raises(ClusterError, match="type 'TPU'"):
        g.exec_times(Cluster([Device("t0", "TPU")]))


# -- Cluster -------------------------------------------------------------------------
def test_cluster_links_and_errors():
    c = Cluster.multi_host(2, 2, intra_bandwidth=1e9, inter_bandwidth=1e8, inter_latency=1e-3)
    assert c.names[2] == "/job:worker/task:1/device:device:0"
    assert c.transfer_time(1e8, 0, 1) == pytest.approx(0.1)
    assert c.transfer_time(1e8, 0, 2) == pytest.approx(1.001)
    assert c.transfer_time(1e8, 3, 3) == 0.0
    with pytest.raises(ClusterError, match="no devices"):
        Cluster([])
    with pytest.raises(ClusterError, match="at least one device"):
        Cluster.homogeneous(0)
    with pytest.raises(ClusterError, match="unknown device 'x'"):
        c.device_index("x")
    with pytest.raises(ClusterError, match="invalid speed"):
        Cluster([Device("a", speed=0)])
    with pytest.raises(ClusterError, match="bandwidth > 0"):
        Cluster.homogeneous(2, bandwidth=0.0)


# -- schedule(), registry, errors -----------------------------------------------------------
def test_unknown_algorithm_lists_the_known_ones():
    with pytest.raises(UnknownAlgorithmError, match="known algorithms: .*fddps.*single"):
        fddps.schedule(diamond(), Cluster.homogeneous(2), algorithm="nope")


def test_schedule_accepts_networkx_and_places_the_diamond_optimally():
    s = fddps.schedule(diamond().to_networkx(), Cluster.homogeneous(2))
    s.validate()
    assert s.makespan == pytest.approx(5.0)  # a, then b || c, then d
    df = s.to_dataframe()
    assert set(df.columns) >= {"op", "device", "start", "finish"}
    assert set(df.op) == {"a", "b", "c", "d"}


def test_infeasible_memory_says_how_much():
    g = diamond(memory=[10, 10, 10, 10])
    with pytest.raises(InfeasibleError, match="needs 40 bytes .* has 30") as err:
        fddps.schedule(g, Cluster.homogeneous(2, memory=15))
    assert (err.value.needed, err.value.available) == (40, 30)
    with pytest.raises(InfeasibleError, match="op 'a' needs 25 bytes"):
        fddps.schedule(OpGraph(["a"], [1.0], memory=[25]), Cluster.homogeneous(3, memory=10))


def test_memory_capacity_forces_a_spread_placement():
    g = OpGraph(list("abcd"), [1.0] * 4, [("a", "b"), ("b", "c"), ("c", "d")], memory=[6] * 4)
    c = Cluster.homogeneous(2, memory=12, bandwidth=1.0, latency=100.0)
    for algorithm in fddps.available_algorithms():
        if algorithm == "single":
            with pytest.raises(InfeasibleError):
                fddps.schedule(g, c, algorithm=algorithm)
            continue
        s = fddps.schedule(g, c, algorithm=algorithm).validate()
        assert s.device_memory().max() <= 12


def test_op_with_no_runnable_device_is_named():
    g = OpGraph(["a", "b"], [[1.0, 1.0], [np.inf, np.inf]], [("a", "b")], device_types=["GPU", "CPU"],
                op_types=["MatMul", "Weird"])
    c = Cluster([Device("g", "GPU"), Device("c", "CPU")])
    with pytest.raises(InfeasibleError, match="op 'b' \\(Weird\\) can run on no device"):
        fddps.schedule(g, c)


def test_pins_and_colocation_are_obeyed():
    g = OpGraph(list("abcd"), [1.0] * 4, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
                colocation=[None, "v", None, "v"], pinned={"c": "1"})
    c = Cluster.homogeneous(3)
    for algorithm in fddps.available_algorithms():
        if algorithm == "single":
            continue
        s = fddps.schedule(g, c, algorithm=algorithm).validate()
        assert s.placement["c"] == "1"
        assert s.placement["b"] == s.placement["d"]
    with pytest.raises(ClusterError, match="pinned to 'gpu9'"):
        fddps.schedule(OpGraph(["a"], [1.0], pinned={"a": "gpu9"}), c)


# -- validate() catches broken schedules ------------------------------------------------
def test_validate_rejects_each_broken_constraint():
    g = diamond()
    c = Cluster.homogeneous(2, bandwidth=10.0)
    good = fddps.schedule(g, c).validate()

    def broken(**changes):
        s = fddps.Schedule(g, c, good.device, good.order, good.start.copy(), good.finish.copy())
        for key, value in changes.items():
            setattr(s, key, value)
        return s

    late = good.start.copy()
    late[g.index["d"]] -= 0.5
    with pytest.raises(InvalidScheduleError):
        broken(start=late).validate()
    short = good.finish.copy()
    short[g.index["b"]] -= 0.5
    with pytest.raises(InvalidScheduleError, match="op 'b' runs"):
        broken(finish=short).validate()
    together = np.zeros(4, dtype=np.int64)
    with pytest.raises(InvalidScheduleError):
        fddps.Schedule(g, c, together, [np.arange(4), []], [0, 1, 1, 4], [1, 3, 4, 5]).validate()
    with pytest.raises(InvalidScheduleError, match="capacity"):
        tight = Cluster.homogeneous(2, memory=1.0)
        gm = diamond(memory=[1, 1, 1, 1])
        fddps.Schedule(gm, tight, together, [np.arange(4), []], [0, 1, 3, 6], [1, 3, 6, 7]).validate()


# -- simulator -----------------------------------------------------------------------------
def test_schedule_makespan_equals_simulated_makespan():
    g = diamond(memory=[1, 2, 3, 4], transient=[5, 5, 5, 5])
    c = Cluster.homogeneous(2, bandwidth=20.0, latency=0.1)
    s = fddps.schedule(g, c)
    order = [[g.names[i] for i in seq] for seq in s.order]
    t = fddps.simulate(g, c, s.placement, order)
    assert t.makespan == pytest.approx(s.makespan, rel=1e-12)
    assert t.busy.sum() == pytest.approx(7.0)


def test_simulator_counts_transfers_and_peak_memory():
    g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [("a", "b", 100), ("a", "c", 100)],
                memory=[10, 0, 0], transient=[100, 50, 50])
    c = Cluster.homogeneous(2, bandwidth=100.0)
    t = fddps.simulate(g, c, {"a": "0", "b": "0", "c": "1"})
    assert t.makespan == pytest.approx(3.0)  # c waits 1 s for its input
    assert t.transfers[["src", "dst", "bytes", "tensors"]].values.tolist() == [["0", "1", 100.0, 1]]
    # Device 0: a's 10 persistent + its 100-byte output + b's 50 while b runs.
    assert t.peak_memory["0"] == pytest.approx(160)
    # Device 1: the received 100-byte copy + c's 50.
    assert t.peak_memory["1"] == pytest.approx(150)
    with pytest.raises(GraphError, match="no device for op 'c'"):
        fddps.simulate(g, c, {"a": "0", "b": "0"})
    with pytest.raises(InvalidScheduleError, match="can never start"):
        fddps.simulate(g, c, {"a": "0", "b": "0", "c": "0"}, order=[["b", "a", "c"], []])


def test_transfers_that_devices_compute_occupy_both_ends_once_per_tensor():
    """CPU tasks over gRPC: a transfer's T splits into a send on the producer's
    device and a receive on the consumer's, and is made once for two readers."""
    g = OpGraph(["p", "x", "r1", "r2"], [1.0, 1.0, 1.0, 1.0],
                [("p", "r1", 100), ("p", "r2", 100)])
    where = {"p": "0", "x": "0", "r1": "1", "r2": "1"}
    free = Cluster.homogeneous(2, bandwidth=100.0, latency=1.0)   # T = 1 + 100 / 100 = 2
    charged = Cluster(free.devices, bandwidth=100.0, latency=1.0, transfer_compute=1.0)
    order = [["p", "x"], ["r1", "r2"]]
    t0 = fddps.simulate(g, free, where, order)
    t1 = fddps.simulate(g, charged, where, order)
    # Contention-free: x runs right after p; r1 starts when the tensor lands (1 + 2).
    assert t0.ops.set_index("op").loc[["x", "r1", "r2"], "start"].tolist() == [1.0, 3.0, 4.0]
    # Charged: device 0 sends for T/2 = 1 s before x; device 1 receives for 1 s, once.
    assert t1.ops.set_index("op").loc[["x", "r1", "r2"], "start"].tolist() == [2.0, 3.0, 4.0]
    assert t1.busy.tolist() == [3.0, 3.0] and t0.busy.tolist() == [2.0, 2.0]
    assert t1.transfers[["bytes", "tensors"]].values.tolist() == [[100.0, 1]]
    assert t0.transfers[["bytes", "tensors"]].values.tolist() == [[200.0, 2]]
    # Half charged: 0.5 s send, 1 s on the wire, 0.5 s receive.
    half = Cluster(free.devices, bandwidth=100.0, latency=1.0, transfer_compute=0.5)
    th = fddps.simulate(g, half, where, order)
    assert th.ops.set_index("op").loc[["x", "r1"], "start"].tolist() == [1.5, 3.0]
    # Schedules are timed the same way, so a schedule and the simulator agree.
    s = fddps.schedule(g, charged, algorithm="heft")
    sim = fddps.simulate(g, charged, s.placement, [[g.names[i] for i in q] for q in s.order])
    assert s.makespan == pytest.approx(sim.makespan) and s.validate()
    with pytest.raises(ClusterError, match="transfer_compute"):
        Cluster(free.devices, transfer_compute=1.5)


def test_a_send_and_the_next_ops_receive_in_one_gap_do_not_deadlock():
    # b's send after a's receive's gap: b on the slow devices, c back on d2, a ping-pong.
    g = OpGraph(["a", "b", "c"], [0.0, 1.0, 0.0], [("a", "b"), ("b", "c")])
    c = Cluster([Device("d0", speed=0.5), Device("d1", speed=0.5), Device("d2", speed=1.0)],
                transfer_compute=0.5)
    for algorithm in ("heft", "fastt", "mpdps", "fddps"):
        fddps.schedule(g, c, algorithm=algorithm).validate()
    t = fddps.simulate(g, c, {"a": "d2", "b": "d0", "c": "d2"}, [["b"], [], ["a", "c"]])
    assert t.makespan == pytest.approx(2.0)


def test_schedulers_charge_remote_inputs_to_the_receiving_device_once():
    from fddps.algorithms.base import PlacementState

    g = OpGraph(["p", "r1", "r2"], [1.0, 1.0, 1.0], [("p", "r1", 100), ("p", "r2", 100)])
    devices = Cluster.homogeneous(2).devices
    charged = Cluster(devices, bandwidth=100.0, latency=1.0, transfer_compute=1.0)   # T = 2
    state = PlacementState(g, charged)
    state.place(0, 0, 0.0)
    # On device 1, r1 waits for no wire time but spends T receiving (and sending).
    assert state.ready_time(1, 1) == 1.0 and state.duration_row(1) == [1.0, 3.0]
    state.place(1, 1, state.earliest_start(1, 1))
    assert state.finish[1] == 4.0
    # r2 reads the tensor r1 already received: no second transfer.
    assert state.duration_row(2) == [1.0, 1.0] and state.ready_time(2, 1) == 3.0
    free = PlacementState(g, Cluster(devices, bandwidth=100.0, latency=1.0))
    free.place(0, 0, 0.0)
    assert free.ready_time(1, 1) == 3.0 and free.duration_row(1) == [1.0, 1.0]


def test_tensorflow_executor_policy_runs_depth_first_and_remote_inputs_last():
    from fddps.simulate import executor_order

    # Device 1 runs q1 -> q2 -> q3 while r's input arrives from device 0 at t = 1.5.
    g = OpGraph(["p", "q1", "r", "q2", "q3"], [0.5, 1.0, 1.0, 1.0, 1.0],
                [("p", "r", 0), ("q1", "q2", 0), ("q2", "q3", 0)])
    c = Cluster.homogeneous(2, latency=1.0)
    device = np.array([0, 1, 1, 1, 1])
    names = lambda seq: [g.names[i] for i in seq]  # noqa: E731
    fifo = executor_order(g, c, device, policy="fifo")
    tf = executor_order(g, c, device, policy="tensorflow")
    assert names(fifo[1]) == ["q1", "q2", "r", "q3"]      # r, there at 1.5, is before q3 in topological order
    assert names(tf[1]) == ["q1", "q2", "q3", "r"]        # the receive callback queues r last
    # Depth first: what b readies runs right after b, before b's sibling c (or c's
    # chain runs first, whichever of them went first).
    fork = OpGraph(["a", "b", "c", "d", "e"], [1.0] * 5,
                   [("a", "b"), ("a", "c"), ("b", "d"), ("c", "e")])
    got = [fork.names[i] for i in executor_order(fork, Cluster.homogeneous(1), [0] * 5,
                                                 policy="tensorflow")[0]]
    assert got in (["a", "b", "d", "c", "e"], ["a", "c", "e", "b", "d"])
    fifo = executor_order(fork, Cluster.homogeneous(1), [0] * 5)[0]
    assert fifo.tolist() == fork.topo.tolist()
    assert fddps.simulate(g, c, device, policy="tensorflow").makespan == pytest.approx(4.0)
    with pytest.raises(ValueError, match="unknown executor policy 'lifo'"):
        executor_order(g, c, device, policy="lifo")



def test_tensorflow_policy_sends_after_the_op_the_sender_starts_next():
    from fddps.simulate import executor_order

    # a (1 s) on device 0 feeds b (5 s, local) and c (1 s, on device 1) over a
    # compute-charged link: T = 1 + 100 B / 100 B/s = 2 s, 1 s of it on each end.
    g = OpGraph(["a", "b", "c"], [1.0, 5.0, 1.0], [("a", "b", 0), ("a", "c", 100)])
    devices = Cluster.homogeneous(2).devices
    c = Cluster(devices, bandwidth=100.0, latency=1.0, transfer_compute=1.0)
    device = np.array([0, 0, 1])
    # FIFO: the send goes first (1-2 s), the receive 2-3 s, c 3-4 s; b 2-7 s.
    fifo = fddps.simulate(g, c, device, policy="fifo")
    assert fifo.ops.set_index("op").loc["c", "start"] == pytest.approx(3.0)
    assert fifo.makespan == pytest.approx(7.0)
    # TensorFlow: the worker serves the tensor only once b, which it started
    # when a finished, is done: send 6-7 s, receive 7-8 s, c 8-9 s.
    tf = fddps.simulate(g, c, device, policy="tensorflow")
    assert tf.ops.set_index("op").loc["c", "start"] == pytest.approx(8.0)
    assert tf.makespan == pytest.approx(9.0)
    order = executor_order(g, c, device, policy="tensorflow", tasks=True)
    assert [g.names[i] if i < 3 else "send" for i in order[0]] == ["a", "b", "send"]
    # With nothing else to start, the send goes at once.
    alone = OpGraph(["a", "c"], [1.0, 1.0], [("a", "c", 100)])
    assert fddps.simulate(alone, c, [0, 1], policy="tensorflow").makespan == pytest.approx(4.0)
    # Held to an order by order edges, the worker still sends after the next op.
    held = fddps.simulate(g, c, device, order=[["a", "b"], ["c"]], policy="tensorflow")
    assert held.makespan == pytest.approx(9.0)
    with pytest.raises(InvalidScheduleError, match="can never start"):
        fddps.simulate(OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 0)]), c, [0, 0],
                       order=[["b", "a"], []], policy="tensorflow")
    # A copy engine's transfer (no compute charge) waits for nothing.
    gpu = Cluster(devices, bandwidth=100.0, latency=1.0)
    assert fddps.simulate(g, gpu, device, policy="tensorflow").ops.set_index("op").loc[
        "c", "start"] == pytest.approx(3.0)

def test_fifo_simulation_runs_ready_ops_first_in_topological_order():
    g = OpGraph(["a", "b", "c"], [1.0, 2.0, 3.0], [("a", "c")])
    t = fddps.simulate(g, Cluster.homogeneous(1), ["0", "0", "0"])
    assert t.makespan == 6.0
    assert list(t.ops.sort_values("start").op) in (["a", "b", "c"], ["b", "a", "c"], ["a", "c", "b"])


def test_lower_bound():
    g = diamond()
    assert fddps.lower_bound(g, Cluster.homogeneous(1)) == 7.0
    assert fddps.lower_bound(g, Cluster.homogeneous(4)) == 5.0


# -- STG -------------------------------------------------------------------------------------
@needs_stg
def test_read_stg_and_optimal_values():
    g = read_stg(STG / "50" / "rand0000.stg")
    assert g.num_ops == 52 and g.cost[0, 0] == 0 and g.cost[-1, 0] == 0
    assert g.cost[1, 0] == 9
    opt = read_optimal_values(STG / "Optimal_values" / "Case50_2_OPT.csv")
    assert opt.iloc[0].tolist()[:3] == ["50/rand0000.stg", 2, 131.0]
    assert opt.proven.mean() > 0.8
    s = fddps.schedule(g, Cluster.homogeneous(2)).validate()
    assert s.makespan >= 131.0


def test_read_stg_rejects_malformed_files(tmp_path):
    bad = tmp_path / "bad.stg"
    bad.write_text("2\n0 0 0\n1 x 1 0\n")
    with pytest.raises(GraphError, match="bad.stg:3"):
        read_stg(bad)
    short = tmp_path / "short.stg"
    short.write_text("3\n0 0 0\n1 4 1 0\n")
    with pytest.raises(GraphError, match="expected 3 tasks"):
        read_stg(short)


def _earliest_start_by_scan(intervals, ready, duration):
    """Reference for DeviceTimeline.earliest_start: the first gap after ``ready``, by a
    walk over the sorted intervals."""
    t = ready
    for start, finish in sorted(intervals):
        if t + duration <= start:
            return t
        t = max(t, finish)
    return t


def test_device_timeline_keeps_its_largest_gaps_and_finds_slots_as_a_plain_scan():
    from fddps.algorithms.base import DeviceTimeline

    class SmallBlocks(DeviceTimeline):  # splits, several blocks and the gaps between them
        __slots__ = ()
        BLOCK = 4

    rng = np.random.default_rng(3)
    tl, placed = SmallBlocks(), []
    for op in range(400):
        ready, duration = float(rng.uniform(0, 60)), float(rng.choice([0.0, rng.exponential(1.0)]))
        start = tl.earliest_start(ready, duration)
        assert start == _earliest_start_by_scan(placed, ready, duration)
        tl.add(op, start, start + duration)
        placed.append((start, start + duration))
        # What add() keeps incrementally is what a full recount gives.
        assert all(b.max_gap == max(b.gaps) for b in tl.blocks)
    assert sorted(tl.ops) == list(range(400))


@pytest.mark.parametrize("block", [1, 2, 3, 64])
def test_device_timeline_fills_gaps_exactly_whatever_its_block_size(block):
    """Times on a decimal grid: ops that exactly fill a gap, where ``start - finish``
    and ``finish + duration <= start`` disagree in the last bit (0.6 - 0.5 < 0.1, yet
    0.5 + 0.1 <= 0.6). The answer is the plain scan's whatever the block size."""
    from fddps.algorithms.base import DeviceTimeline

    class Blocks(DeviceTimeline):
        __slots__ = ()
        BLOCK = block

    rng = np.random.default_rng(block)
    for _ in range(60):
        tl, placed = Blocks(), []
        for op in range(int(rng.integers(5, 60))):
            ready = round(float(rng.uniform(0, 40)), 1)
            duration = float(rng.choice([0.0, 0.1, 0.5, 1.4, round(float(rng.uniform(0, 3)), 1)]))
            start = tl.earliest_start(ready, duration)
            assert start == _earliest_start_by_scan(placed, ready, duration)
            tl.add(op, start, start + duration)
            placed.append((start, start + duration))


def test_lower_bounds_are_kept_per_graph_and_cluster_not_for_the_reversed_graph():
    from fddps.bounds import communication_lower_bound, lower_bound

    g = OpGraph(list("abc"), [2.0, 2.0, 1.0], [("a", "c", 4.0), ("b", "c", 4.0)])
    slow, fast = Cluster.homogeneous(2, bandwidth=1.0), Cluster.homogeneous(2, bandwidth=1e9)
    assert communication_lower_bound(g, slow) == 5.0
    assert communication_lower_bound(g, fast) == pytest.approx(3.0)  # another cluster: recomputed
    assert lower_bound(g, fast) == 3.0
    assert "_bounds" not in g.reversed().__dict__


@pytest.mark.parametrize("devices,memory_share,insertion",
                         [(2, None, True), (4, None, True), (8, None, False), (4, 0.3, True),
                          (3, 0.4, True), (4, 0.251, True)])
def test_the_uniform_link_list_pass_decides_as_the_general_one(devices, memory_share, insertion):
    """On identical links list_schedule takes its compiled pass (or, without numba, its
    inlined loop); both must place every op where, and when, the general loop (through
    PlacementState's methods) does, also where memory runs short and candidates are
    filtered (or the pass fails the same way: 4 devices at 0.251 of the bytes, seed 2)."""
    from fddps.algorithms import list_pass_jit
    from fddps.algorithms.base import (PlacementState, _list_schedule_any,
                                       _list_schedule_uniform, run_compiled)
    from fddps.errors import InfeasibleError
    from fddps.generators import training_graph

    loops = [_list_schedule_uniform, lambda st, p, ins: _list_schedule_any(st, p, ins, False)]
    if list_pass_jit.AVAILABLE:
        list_pass_jit.warm_up()  # loaded: graphs of any size get compiled tables
        loops.append(lambda st, p, ins: run_compiled(st, list_pass_jit.list_pass, p, ins))
    for seed in range(3):
        g = training_graph(300, seed=seed)
        memory = None
        if memory_share is not None:  # room for a share of the graph's bytes per device
            memory = float(g.memory.sum() + g.allocated.sum()) * memory_share
        c = Cluster.homogeneous(devices, bandwidth=5e9, latency=2e-5, memory=memory)
        priority = np.random.default_rng(seed).uniform(size=g.num_ops)
        outcomes = []
        for loop in loops:
            state = PlacementState(g, c)
            assert state.uniform_links
            try:
                loop(state, priority, insertion)
            except InfeasibleError as err:
                outcomes.append(("infeasible", str(err)))
                continue
            outcomes.append((state.device, state.start, state.finish, state.mem_used,
                             state.reserved, state.group_device,
                             [tl.ops for tl in state.timelines]))
            # The timelines the compiled pass rebuilds find the gaps the others do.
            queries = np.random.default_rng(seed).uniform(0, max(state.finish), (50, 2))
            outcomes[-1] += ([[tl.earliest_start(r, d * 1e-3) for r, d in queries.tolist()]
                              for tl in state.timelines],)
        assert all(o == outcomes[0] for o in outcomes[1:])


@pytest.mark.parametrize("devices,memory_share,options",
                         [(2, None, {}), (4, None, {"lookahead": False}),
                          (8, None, {"insertion": False}), (4, 0.3, {"prefer_parent": False}),
                          (3, 0.4, {}), (4, 0.2505, {})])
def test_fddps_compiled_list_pass_decides_as_its_python_loop(devices, memory_share, options):
    """FD-DPS's own list pass (Find_Slot's rules, the DCPL frontier) compiled must place
    every op where and when its Python loop does, with each rule switched off in turn,
    where memory runs short (3 devices at 0.4) and where it runs out (4 at 0.2505: the
    same error, seeds 1 and 2)."""
    from fddps.algorithms import list_pass_jit
    from fddps.algorithms.base import PlacementState
    from fddps.algorithms.fddps import FDDPS
    from fddps.errors import InfeasibleError
    from fddps.generators import training_graph

    if not list_pass_jit.AVAILABLE:
        pytest.skip("numba not importable or FDDPS_NO_JIT set: only the Python loop runs")
    assert list_pass_jit.use_compiled(list_pass_jit.MIN_OPS_TO_LOAD)
    assert list_pass_jit.warm_up() > 0
    assert list_pass_jit.use_compiled(1)  # once loaded, for every graph
    for seed in range(3):
        g = training_graph(300, seed=seed)
        memory = None
        if memory_share is not None:
            memory = float(g.memory.sum() + g.allocated.sum()) * memory_share
        c = Cluster.homogeneous(devices, bandwidth=5e9, latency=2e-5, memory=memory)
        outcomes = []
        for compiled in (False, True):
            state = PlacementState(g, c)
            assert state.compiled_tables is not None
            if not compiled:
                state.compiled_tables = None  # the Python loop
            try:
                stats = FDDPS(**options)._list_schedule(state)
            except InfeasibleError as err:
                outcomes.append(("infeasible", str(err)))
                continue
            outcomes.append((stats, state.device, state.start, state.finish, state.mem_used,
                             state.reserved, state.group_device,
                             [tl.ops for tl in state.timelines]))
        assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("policy", ["fifo", "tensorflow"])
def test_simulated_makespan_is_the_timelines(policy):
    """The makespan-only replay (what the order guard and place() use) equals
    simulate()'s, with and without an order, on clusters with and without charged links."""
    from fddps import get_algorithm
    from fddps.generators import training_graph
    from fddps.simulate import simulate, simulated_makespan

    g = training_graph(200, seed=3)
    free = Cluster.homogeneous(3, bandwidth=5e9, latency=2e-5)
    charged = Cluster(free.devices, bandwidth=1e9, latency=1e-4, transfer_compute=0.5)
    for cluster in (free, charged):
        s = get_algorithm("heft").schedule(g, cluster)
        for order in (None, s.order):
            assert simulated_makespan(g, cluster, s.device, order=order, policy=policy) == \
                simulate(g, cluster, s.device, order=order, policy=policy).makespan
