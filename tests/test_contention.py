"""Shared hardware: devices that share cores, transfers that share links (issue 17).

The simulator's contention model (fddps.simulate._run_shared), the schedulers'
approximation of it (every schedule still validates against the exact
replay), the topology presets, the defaults fddps.tf builds for local CPU
devices and hosts, the fetches a placed file records, and one measurement on
4 CPU devices of this process.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fddps
from fddps import Cluster, Device, OpGraph
from fddps.cluster import LinkResource, SharedCores
from fddps.errors import ClusterError
from fddps.generators import training_graph
from fddps.simulate import _replay_flow, executor_order, replay
from fddps.topology import TOPOLOGIES, link_resources
import test_properties  # noqa: E402 - its problems and its checks of a schedule
from test_properties import problems


# -- the model on hand-checked cases ---------------------------------------------------------
def fork(n_branches=2, cost=1.0, nbytes=0.0):
    """``a`` feeding ``n_branches`` independent ops."""
    names = ["a"] + [f"b{k}" for k in range(n_branches)]
    return OpGraph(names, [cost] * len(names), [("a", f"b{k}", nbytes) for k in range(n_branches)])


def test_ops_on_shared_cores_split_them():
    g = fork(2)
    c = Cluster.homogeneous(2, names=["x", "y"])
    placement = {"a": "x", "b0": "x", "b1": "y"}
    assert fddps.simulate(g, c, placement).makespan == 2.0
    # Each op wants both cores: two at once each run at half speed.
    both = c.with_sharing([SharedCores(("x", "y"), cores=2)])
    t = fddps.simulate(g, both, placement)
    assert t.makespan == 3.0
    assert t.ops.set_index("op").loc["b1", "finish"] == 3.0
    # One thread each on two cores: no slow-down.
    one = c.with_sharing([SharedCores(("x", "y"), cores=2, threads=1)])
    assert fddps.simulate(g, one, placement).makespan == 2.0
    # Three devices of one thread each on two cores: 2/3 speed while all three run.
    g3 = fork(3)
    c3 = Cluster.homogeneous(3, names=["x", "y", "z"]).with_sharing(
        [SharedCores(("x", "y", "z"), cores=2, threads=1)])
    assert fddps.simulate(g3, c3, {"a": "x", "b0": "x", "b1": "y", "b2": "z"}).makespan == \
        pytest.approx(1 + 1.5)


def test_transfers_through_one_nic_share_its_bandwidth():
    # a0 -> b0 and a1 -> b1 both cross from host 0 to host 1: 1 MB each over a
    # 1 MB/s NIC, at most 1 MB/s per pair.
    g = OpGraph(["a0", "a1", "b0", "b1"], [1.0] * 4, [("a0", "b0", 1e6), ("a1", "b1", 1e6)])
    free = Cluster.multi_host(2, 2, intra_bandwidth=1e9, inter_bandwidth=1e6)
    placement = [0, 1, 2, 3]
    assert fddps.simulate(g, free, placement).makespan == 3.0
    nic = TOPOLOGIES["10gbe"].__class__("test", nic_bandwidth=1e6)
    shared = free.with_sharing(link_resources=link_resources(free.devices, nic))
    t = fddps.simulate(g, shared, placement)
    assert t.makespan == pytest.approx(4.0)  # both at 0.5 MB/s
    # One transfer alone is as fast as without the NIC.
    assert fddps.simulate(g, shared, [0, 0, 2, 3]).makespan == pytest.approx(
        fddps.simulate(g, free, [0, 0, 2, 3]).makespan)
    # Inside a host nothing is shared.
    assert fddps.simulate(g, shared, [0, 1, 1, 0]).makespan == \
        fddps.simulate(g, free, [0, 1, 1, 0]).makespan


def test_wires_that_start_at_one_instant_are_rated_once():
    # ``a`` on host 0 feeds four ops on host 1: four 1 MB wires start together through
    # one 1 MB/s NIC. Each is given its quarter of the NIC once (not once per wire that
    # joins at that instant: such rates last no time, and re-rating every wire of a
    # resource at each join made data parallelism on 64 GPUs quadratic), and all four
    # finish together, 4 s later.
    n = 4
    g = fork(n, nbytes=1e6)
    free = Cluster.multi_host(2, n, intra_bandwidth=1e9, inter_bandwidth=1e6)
    nic = TOPOLOGIES["10gbe"].__class__("test", nic_bandwidth=1e6)
    shared = free.with_sharing(link_resources=link_resources(free.devices, nic))
    device = np.array([0] + [n + k for k in range(n)])
    order = [np.array([0])] + [np.array([], dtype=np.int64)] * (n - 1) + \
        [np.array([k + 1]) for k in range(n)]
    trace = []
    start, finish, _ = _replay_flow(g, shared, device, order, trace=trace)
    t0 = min(t for t, _, r in trace if r > 0)
    joined = [r for t, _, r in trace if t == t0]
    assert joined == [pytest.approx(1e6 / n)] * n
    t1 = max(t for t, _, _ in trace)
    assert t1 - t0 == pytest.approx(n * 1.0)
    assert [r for t, _, r in trace if t == t1] == [0.0] * n
    assert len(trace) == 2 * n
    assert finish[1:n + 1].tolist() == pytest.approx([t1 + 1.0] * n)  # the four readers


def test_a_fifo_channel_ships_one_tensor_at_a_time_in_the_order_they_became_ready():
    # Task A (devices x, z) sends to task B (y, w) over 1 MB/s: a0 (done at 1 s)
    # 2 MB to b0, a1 (done at 1.5 s) 0.1 MB to b1.
    def step(a1_seconds):
        return OpGraph(["a0", "a1", "b0", "b1"], [1.0, a1_seconds, 0.5, 0.5],
                       [("a0", "b0", 2e6), ("a1", "b1", 1e5)])

    placement = {"a0": "x", "a1": "z", "b0": "y", "b1": "w"}
    c = Cluster.homogeneous(4, names=["x", "z", "y", "w"], bandwidth=1e6)
    pairs = frozenset({("x", "y"), ("x", "w"), ("z", "y"), ("z", "w")})

    def starts(cluster, a1_seconds=1.5):
        ops = fddps.simulate(step(a1_seconds), cluster, placement).ops.set_index("op")
        return ops.loc["b0", "start"], ops.loc["b1", "start"]

    assert starts(c) == pytest.approx((3.0, 1.6))  # contention-free
    # Shared equally: the small tensor moves at half speed beside the large one.
    assert starts(c.with_sharing(link_resources=[LinkResource("nic", 1e6, pairs)])) == \
        pytest.approx((3.1, 1.7))
    # First in, first out: it waits until the 2 MB are through, then takes 0.1 s.
    channel = c.with_sharing(link_resources=[LinkResource("channel", 1e6, pairs, fifo=True)])
    assert starts(channel) == pytest.approx((3.0, 3.1))
    # By readiness: ready first (at 0.5 s), the small one goes first.
    assert starts(channel, a1_seconds=0.5) == pytest.approx((3.0, 0.6))
    assert "one at a time, first in first out" in channel.sharing_summary()[0]


def test_cluster_checks_shared_groups_and_resources():
    c = Cluster.homogeneous(2, names=["x", "y"])
    with pytest.raises(ClusterError, match="'x' is in two groups"):
        c.with_sharing([SharedCores(("x",), 2), SharedCores(("x", "y"), 2)])
    with pytest.raises(ClusterError, match="unknown device 'z'"):
        c.with_sharing([SharedCores(("x", "z"), 2)])
    with pytest.raises(ClusterError, match="cores > 0"):
        c.with_sharing([SharedCores(("x", "y"), 0)])
    with pytest.raises(ClusterError, match="'nic' needs a bandwidth > 0"):
        c.with_sharing(link_resources=[LinkResource("nic", 0.0, frozenset({("x", "y")}))])
    with pytest.raises(ClusterError, match="unknown topology part 'ethernet'.*10gbe"):
        Cluster.multi_host(2, 1, intra_bandwidth=1, inter_bandwidth=1, topology="ethernet")
    shared = c.with_sharing([SharedCores(("x", "y"), cores=4, threads=(4, 2))])
    assert shared.slowdown.tolist() == [1.5, 1.5] and shared.shares_cores
    assert "2 devices share 4 cores" in shared.sharing_summary()[0]


def test_topology_presets_route_transfers():
    devs = [Device(f"h{h}g{i}", "GPU", host=str(h)) for h in range(2) for i in range(4)]
    c = Cluster(devs, bandwidth=1e9).with_sharing(link_resources=link_resources(devs, "pcie3+10gbe"))
    names = [r.name for r in c.link_resources]

    def path(a, b):
        return {names[r] for r in c.link_path[c.device_index(a)][c.device_index(b)]}

    # Behind one PCIe switch: only the two GPUs' own links.
    assert path("h0g0", "h0g1") == {"h0g0 PCIe out", "h0g1 PCIe in"}
    # Across switches: their uplinks too.
    assert path("h0g0", "h0g2") == {"h0g0 PCIe out", "host 0 PCIe switch 0 up",
                                    "host 0 PCIe switch 1 down", "h0g2 PCIe in"}
    # Across hosts: and both network interfaces.
    assert {"host 0 NIC out", "host 1 NIC in"} <= path("h0g0", "h1g3")
    assert not {"host 0 NIC out", "host 1 NIC in"} & path("h0g0", "h0g3")
    nv = Cluster(devs, bandwidth=1e9).with_sharing(link_resources=link_resources(devs, "nvlink+infiniband"))
    assert not any(nv.link_path[0][1]) and len(nv.link_path[0][4]) == 2
    for part in TOPOLOGIES.values():
        assert part.source


# -- properties: every schedule validates; no capacity is ever exceeded -------------------------
@st.composite
def shared_problems(draw):
    graph, cluster = draw(problems())
    m = cluster.num_devices
    names = list(cluster.names)
    groups = []
    if m >= 2 and draw(st.booleans()):
        members = draw(st.lists(st.sampled_from(names), min_size=2, max_size=m, unique=True))
        threads = tuple(draw(st.sampled_from([1, 2, 4])) for _ in members)
        groups.append(SharedCores(tuple(members), cores=draw(st.sampled_from([1, 2, 3, 4])),
                                  threads=threads))
    resources = []
    if m >= 2 and draw(st.booleans()):
        for r in range(draw(st.integers(1, 3))):
            pairs = draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)),
                                  min_size=1, max_size=m * m))
            resources.append(LinkResource(f"r{r}", draw(st.sampled_from([1e5, 1e6, 1e8])),
                                          frozenset(p for p in pairs if p[0] != p[1]),
                                          fifo=draw(st.booleans())))
    if not groups and not resources:
        groups.append(SharedCores(tuple(names), cores=1, threads=1))
    return graph, cluster.with_sharing(groups, resources)


def check_capacities(graph, cluster, device, order):
    """Replay with a trace; assert no group of cores or link resource is ever
    over capacity, and every task gets exactly its work done."""
    trace = []
    start, finish, flow = _replay_flow(graph, cluster, device, order, trace=trace)
    wire_index = {int(t): w for w, t in enumerate(flow.wires.tolist())}
    work = flow.dur.copy()
    for t, w in wire_index.items():
        work[t] = flow.wire_bytes[w]
    done = np.zeros(flow.total)
    rate, since = {}, {}
    trace.sort(key=lambda e: e[0])
    k = 0
    while k < len(trace):
        t = trace[k][0]
        while k < len(trace) and trace[k][0] == t:
            _, i, r = trace[k]
            if i in rate:
                done[i] += rate[i] * (t - since[i])
            rate[i], since[i] = r, t
            k += 1
        for g, cores in enumerate(cluster.group_cores):
            used = sum(cluster.threads[flow.dev[i]] * r for i, r in rate.items()
                       if flow.dev[i] >= 0 and cluster.core_group[flow.dev[i]] == g)
            assert used <= cores * (1 + 1e-9), f"{used} threads on {cores} cores at t={t}"
        for res, bw in enumerate(cluster.resource_bandwidth):
            carried = sum(r for i, r in rate.items()
                          if i in wire_index and res in flow.wire_path[wire_index[i]])
            assert carried <= bw * (1 + 1e-9), f"{carried} B/s through a {bw} B/s resource at t={t}"
    # A first-in-first-out resource carries one wire at a time, in the order the
    # wires became ready (their sends finished).
    for res in np.flatnonzero(cluster.resource_fifo):
        on = [t for t, w in wire_index.items() if res in flow.wire_path[w]]
        ready = {t: finish[flow.sends[wire_index[t]]] for t in on}
        by_start = sorted(on, key=lambda t: (start[t], finish[t]))
        for a, b in zip(by_start, by_start[1:]):
            assert finish[a] <= start[b] + 1e-9, "two wires at once on a FIFO resource"
            assert ready[a] <= ready[b] + 1e-9, "a FIFO resource let a later wire overtake"
    traced = [i for i in rate]
    # Work is integrated from differences of absolute times, each exact only to
    # one ulp of the clock: a 4e-10 s wire at t = 8 s carries ~1e-6 relative
    # error from rounding alone. Allow a few ulps of the clock at the task's
    # fastest rate.
    top_rate = {}
    for _, i, r in trace:
        top_rate[i] = max(top_rate.get(i, 0.0), r)
    ulp = np.spacing(max(1.0, float(finish.max())))
    slack = np.array([8 * ulp * top_rate[i] for i in traced])
    assert (np.abs(done[traced] - work[traced]) <= 1e-6 * np.abs(work[traced]) + 1e-9 + slack).all(), \
        list(zip(done[traced], work[traced]))
    assert (finish - start >= flow.dur - 1e-9 * max(1.0, finish.max())).all()
    return finish[:graph.num_ops].max() if graph.num_ops else 0.0


@pytest.mark.parametrize("algorithm", test_properties.ALGORITHMS)  # "exact" refuses sharing
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_problems())
def test_schedules_on_shared_hardware_validate_and_respect_capacities(algorithm, problem):
    # Everything test_properties asks of a schedule (validates, replays to its
    # makespan, no bound beats it, peaks fit), now on shared hardware ...
    test_properties.test_every_algorithm_returns_a_valid_schedule.hypothesis.inner_test(algorithm, problem)
    graph, cluster = problem
    if graph.num_ops == 0 or (algorithm == "single" and not np.isinf(cluster.memory).all()):
        return  # "single" may refuse a problem under memory limits
    s = fddps.schedule(graph, cluster, algorithm=algorithm)
    # ... and no group of cores or link resource is ever over capacity.
    assert check_capacities(graph, cluster, s.device, s.order) == pytest.approx(s.makespan)


@settings(max_examples=60, deadline=None)
@given(shared_problems(), st.data())
def test_any_placement_replays_within_capacities(problem, data):
    graph, cluster = problem
    if graph.num_ops == 0:
        return
    et = graph.exec_times(cluster)
    device = np.array([data.draw(st.sampled_from(np.flatnonzero(np.isfinite(et[i])).tolist()))
                       for i in range(graph.num_ops)])
    order = executor_order(graph, cluster, device, et)
    makespan = check_capacities(graph, cluster, device, order)
    # Sharing never makes a step faster than the same order contention-free.
    free = Cluster(cluster.devices, bandwidth=cluster.bandwidth, latency=cluster.latency,
                   transfer_compute=cluster.transfer_compute)
    assert makespan >= replay(graph, free, device, order)[1].max() * (1 - 1e-9) - 1e-12


def test_cores_to_spare_change_nothing():
    graph = training_graph(60, seed=1)
    c = Cluster.homogeneous(3, bandwidth=1e9, latency=1e-4)
    roomy = c.with_sharing([SharedCores(tuple(c.names), cores=3, threads=1)])
    for algorithm in ("heft", "fddps"):
        a = fddps.schedule(graph, c, algorithm=algorithm)
        b = fddps.schedule(graph, roomy, algorithm=algorithm).validate()
        assert b.makespan == pytest.approx(a.makespan, rel=1e-12)


# -- fddps.tf: the defaults, the placed file, and one measurement ---------------------------------
tf = pytest.importorskip("tensorflow")
import costmodel  # noqa: E402
from fddps.tf import make_cluster, place  # noqa: E402
from fddps.tf.devices import local_cpu_sharing, usable_cores  # noqa: E402
from fddps.tf.fetches import FETCH_ATTR, recorded_fetches  # noqa: E402

#: A CPU preset pinned for the tests (never this machine's).
TEST_CPU = costmodel.DevicePreset("test-cpu", "CPU", peak_flops=50e9, memory_bandwidth=20e9,
                                  memory=8 * 2**30, overhead=5e-6)
CPUS = [f"/device:CPU:{k}" for k in range(4)]


def test_make_cluster_shares_this_process_cores_and_gives_hosts_a_nic():
    cm = costmodel.default_cost_model(cpu=TEST_CPU)
    c = make_cluster(CPUS, cm)
    assert c.shares_cores and not c.shares_links
    (grp,) = c.shared_cores
    assert grp.cores == usable_cores() == len(os.sched_getaffinity(0))
    assert c.threads.tolist() == [usable_cores()] * 4 and c.slowdown.tolist() == [4.0] * 4
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    one = make_cluster(CPUS, cm, session_config=config)
    assert one.threads.tolist() == [1.0] * 4
    assert not make_cluster(CPUS, cm, share_cores=False).shares_hardware
    assert local_cpu_sharing(make_cluster(CPUS[:1], cm).devices) == []
    # Tasks of a cluster are other processes: no group; their gRPC transfers are
    # CPU time already (transfer_compute 1), so no NIC either.
    workers = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(2)]
    assert not make_cluster(workers, cm).shares_hardware
    gpus = [f"/job:worker/replica:0/task:{h}/device:GPU:{i}" for h in range(2) for i in range(2)]
    g = make_cluster(gpus, cm)
    assert g.shares_links and not g.shares_cores
    assert sorted(r.name.split()[-1] for r in g.link_resources) == ["in", "in", "out", "out"]
    assert g.link_resources[0].bandwidth == cm.link(gpus[0], gpus[2])[1]
    assert not make_cluster(gpus, cm, topology=None).shares_hardware
    assert len(make_cluster(gpus, cm, topology="pcie3+100gbe").link_resources) > 4
    # A given cluster keeps its sharing, under the normalised names.
    kept = make_cluster(Cluster.homogeneous(2, names=["/cpu:0", "/cpu:1"]).with_sharing(
        [SharedCores(("/cpu:0", "/cpu:1"), cores=3)]), cm)
    assert kept.shared_cores[0].devices == ("/device:CPU:0", "/device:CPU:1")


def test_placed_file_carries_its_step_so_simulate_agrees(cnn_graph, tmp_path, capsys):
    from fddps.cli import main

    gpus = [f"/job:worker/replica:0/task:{h}/device:GPU:{i}" for h in range(2) for i in range(2)]
    p = place(cnn_graph.graph_def, gpus, fetches=["train", "loss"])
    assert sorted(recorded_fetches(p.graph_def)) == ["loss", "train"]
    assert "NIC out" in p.summary()
    path = tmp_path / "placed.pb"
    path.write_bytes(p.graph_def.SerializeToString())
    capsys.readouterr()
    assert main(["simulate", str(path)]) == 0
    text = capsys.readouterr().out
    predicted = float(text.split("predicted step time ")[1].split(" ms")[0]) / 1e3
    assert predicted == pytest.approx(p.executor_makespan, rel=1e-3)
    # Without the record, the file's every node (initializers too) would be timed.
    bare = tf.compat.v1.GraphDef()
    bare.CopyFrom(p.graph_def)
    for node in bare.node:
        if FETCH_ATTR in node.attr:
            del node.attr[FETCH_ATTR]
    path.write_bytes(bare.SerializeToString())
    assert main(["simulate", str(path)]) == 0
    whole = float(capsys.readouterr().out.split("predicted step time ")[1].split(" ms")[0]) / 1e3
    assert whole > predicted * 1.01


def _branches_graph(spread, branches=4, size=256, depth=4):
    """``branches`` independent chains of matmuls joined by a sum; branch k on
    CPU:k when ``spread``, else everything on CPU:0."""
    g = tf.Graph()
    with g.as_default():
        outs = []
        for k in range(branches):
            with tf.device(f"/device:CPU:{k if spread else 0}"):
                h = tf.random.stateless_normal([size, size], seed=[k, 1], name=f"x{k}")
                w = tf.random.stateless_normal([size, size], seed=[k, 2], name=f"w{k}") * 0.05
                for d in range(depth):
                    h = tf.nn.relu(tf.matmul(h, w), name=f"b{k}_l{d}")
                outs.append(h)
        with tf.device("/device:CPU:0"):
            tf.add_n(outs, name="out")
    return g


def _predicted(graph_def, cluster, cm):
    from fddps.tf import read_graph_def
    from fddps.tf.devices import normalize_device

    graph, _ = read_graph_def(graph_def, cm, cluster, fetches=["out"])
    devices = {n.name: normalize_device(n.device) for n in graph_def.node}
    return fddps.simulate(graph, cluster, {name: devices[name] for name in graph.names}).makespan


@pytest.mark.slow
def test_devices_of_one_process_predict_no_speedup_where_none_is_measured(tf_config):
    """Measure, in one run, one step all on CPU:0 and one spread over CPU:0-3
    (alternating, medians), and predict both: sharing this process's cores, the
    model must predict the measured ratio (no speed-up), where the model of
    devices with cores of their own predicts one."""
    cm = costmodel.default_cost_model(cpu=TEST_CPU)
    graphs = {spread: _branches_graph(spread) for spread in (False, True)}
    defs = {spread: g.as_graph_def() for spread, g in graphs.items()}
    shared = make_cluster(CPUS, cm)
    own = make_cluster(CPUS, cm, share_cores=False)
    predicted = _predicted(defs[False], shared, cm) / _predicted(defs[True], shared, cm)
    predicted_own = _predicted(defs[False], own, cm) / _predicted(defs[True], own, cm)
    sessions = {spread: tf.compat.v1.Session(graph=g, config=tf_config(4))
                for spread, g in graphs.items()}
    times = {False: [], True: []}
    try:
        for rep in range(18):
            for spread in (False, True) if rep % 2 else (True, False):
                out = graphs[spread].get_tensor_by_name("out:0")
                t0 = time.perf_counter()
                sessions[spread].run(out)
                if rep >= 3:  # warm-up
                    times[spread].append(time.perf_counter() - t0)
    finally:
        for s in sessions.values():
            s.close()
    measured = float(np.median(times[False]) / np.median(times[True]))
    print(f"one device / four devices: measured {measured:.2f}, predicted {predicted:.2f} "
          f"(cores shared), {predicted_own:.2f} (cores of their own)")
    assert measured < 1.5, "four CPU devices of one process should add no cores"
    assert predicted == pytest.approx(measured, rel=0.35)
    assert predicted < 1.1 and predicted_own > 1.5 * measured


def test_lower_bounds_count_shared_cores_once():
    # Four devices on 2 cores whose ops want both: together no faster than one
    # device, so the work bound is the whole work (4 ops of 1 s), not a quarter.
    from fddps.bounds import communication_lower_bound, lower_bound, sustained_speed

    g = fddps.OpGraph(list("abcd"), cost=[1.0] * 4)
    c = fddps.Cluster.homogeneous(4, names=list("wxyz"))
    shared = c.with_sharing([SharedCores(tuple("wxyz"), cores=2, threads=2)])
    assert sustained_speed(c) == 4.0 and sustained_speed(shared) == 1.0
    assert lower_bound(g, c) == pytest.approx(1.0)
    assert lower_bound(g, shared) == pytest.approx(4.0)
    assert communication_lower_bound(g, shared) == pytest.approx(4.0)
    s = fddps.schedule(g, shared)
    assert s.makespan >= s.info["lower_bound"] - 1e-9 and s.info["lower_bound"] == pytest.approx(4.0)
