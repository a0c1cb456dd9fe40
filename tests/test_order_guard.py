"""place() predicts the step in TensorFlow's own order, and when that is slower than one
device, enforces the scheduled order or falls back to one device (enforce_order="auto").

The graph: on /cpu:0, ``x`` feeds a long chain of matmuls and a tiny ``s``; ``s``
starts another long chain, which the schedule runs on /cpu:1 beside the first.
The schedule runs ``s`` before the chain on /cpu:0; TensorFlow's executor
(modelled first in, first out: in topological order, where the chain comes
first) runs the chain first, so /cpu:1 idles and the step, plus a 1 ms link,
is slower than on one device.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from costmodel import DevicePreset, default_cost_model  # noqa: E402
from fddps import Cluster  # noqa: E402
from fddps.errors import FddpsError  # noqa: E402
from fddps.tf import make_cluster, place  # noqa: E402

v1 = tf.compat.v1
COST_MODEL = default_cost_model(cpu=DevicePreset(
    "test-cpu", "CPU", peak_flops=1e9, memory_bandwidth=10e9, memory=16 * 2**30,
    overhead=5e-6))
N = 128


def _two_chains(chain=3, pin="/cpu:0"):
    g = tf.Graph()
    with g.as_default():
        with tf.device(pin):
            a = v1.placeholder(tf.float32, [N, N], name="a")
            x = tf.matmul(a, a, name="x")
            s = tf.reduce_sum(x, axis=0, keepdims=True, name="s")
            h = x
            for k in range(chain):
                h = tf.matmul(h, x, name=f"long{k}")
        c = tf.tile(s, [N, 1], name="c_in")
        for k in range(chain):
            c = tf.matmul(c, c, name=f"other{k}")
        tf.add(h, c, name="out")
    return g


@pytest.fixture(scope="module")
def case():
    g = _two_chains()
    devices = make_cluster(["/cpu:0", "/cpu:1"], COST_MODEL).devices
    # A slow link (1 ms a transfer), so that waiting on it costs more than the
    # little the two chains overlap in TensorFlow's order.
    cluster = Cluster(devices, bandwidth=1e9, latency=1e-3)
    return g, cluster


def test_tensorflow_order_slower_than_one_device_is_left_alone_when_asked(case):
    g, cluster = case
    p = place(g, cluster, cost_model=COST_MODEL, enforce_order=False)
    single = place(g, cluster, cost_model=COST_MODEL, algorithm="single").makespan
    assert p.makespan < single < p.executor_makespan
    assert p.info["order_guard"] == "" and p.info["order_edges_added"] == 0
    assert len({d for d in p.devices.values()}) == 2
    assert "enforce_order=True makes it follow" in p.summary()


def test_auto_enforces_the_scheduled_order_with_fetches(case, tf_config):
    g, cluster = case
    p = place(g, cluster, cost_model=COST_MODEL, fetches=["out"])
    assert p.info["order_guard"] == "enforced order"
    assert p.info["tf_order_makespan"] > p.info["single_makespan"] > p.makespan
    assert p.executor_makespan == p.makespan and p.info["order_edges_added"] > 0
    # Each op waits for the op scheduled before it on its device.
    inputs = {n.name: {i.lstrip("^").split(":")[0] for i in n.input} for n in p.graph_def.node}
    names = p.schedule.graph.names
    for seq in p.schedule.order:
        for a, b in zip(seq.tolist(), seq.tolist()[1:]):
            assert names[a] in inputs[names[b]], (names[a], names[b])
    assert "order control edges make TensorFlow follow the scheduled order" in p.summary()
    # The ordered graph runs and computes what the original does.
    feed = {"a:0": np.random.RandomState(0).rand(N, N).astype(np.float32) / N}
    results = []
    for gd in (g.as_graph_def(), p.graph_def):
        run_graph = tf.Graph()
        with run_graph.as_default():
            v1.import_graph_def(gd, name="")
        with v1.Session(graph=run_graph, config=tf_config(2)) as sess:
            results.append(sess.run("out:0", feed))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5)


def test_auto_falls_back_to_one_device_without_fetches(case):
    g, cluster = case
    p = place(g, cluster, cost_model=COST_MODEL)
    assert p.info["order_guard"] == "single device"
    assert set(p.devices.values()) == {"/device:CPU:0"}
    assert p.makespan == pytest.approx(p.info["single_makespan"])
    assert p.executor_makespan == pytest.approx(p.makespan)
    assert "placed on /device:CPU:0 alone" in p.summary()


def test_auto_leaves_a_good_order_alone():
    # Nothing pinned, fast links: the schedule puts ``s`` with the other chain,
    # and TensorFlow's order is as fast as the schedule. (Devices with cores of
    # their own: sharing this process's cores, one device is as fast as two.)
    g = _two_chains(pin=None)
    devices = make_cluster(["/cpu:0", "/cpu:1"], COST_MODEL, share_cores=False)
    p = place(g, devices, cost_model=COST_MODEL, fetches=["out"])
    assert p.info["order_guard"] == "" and p.info["order_edges_added"] == 0
    single = place(g, devices, cost_model=COST_MODEL, algorithm="single").makespan
    assert p.executor_makespan < single
    assert len({d for d in p.devices.values()}) == 2


def test_enforce_order_value_is_checked(case):
    g, cluster = case
    with pytest.raises(FddpsError, match="enforce_order must be True, False or 'auto'"):
        place(g, cluster, cost_model=COST_MODEL, enforce_order="yes")


@pytest.mark.parametrize("small,transfer_compute,kept", [
    (0.05, 0.0, True),    # 1.05x faster: kept where the executor model is FIFO (GPUs)
    (0.05, 0.5, False),   # ... but not on CPU workers over gRPC, under SPREAD_MARGIN
    (0.5, 0.5, True),     # 1.5x faster: kept there too
])
def test_cpu_workers_keep_a_spread_only_when_clearly_faster(small, transfer_compute, kept):
    from fddps import OpGraph, Schedule
    from fddps.tf.schedule_place import SPREAD_MARGIN, order_guard

    # Two independent ops, one per device: the spread takes max(1, small), one device 1 + small.
    g = OpGraph(["big", "small"], [1.0, small], [])
    cluster = Cluster(Cluster.homogeneous(2).devices, transfer_compute=transfer_compute)
    spread = Schedule.from_order(g, cluster, np.array([0, 1]), [[0], [1]])
    assert SPREAD_MARGIN["tensorflow"] == pytest.approx(0.10)
    schedule, enforce, info = order_guard(g, cluster, spread, "auto", can_enforce=True)
    assert not enforce
    if kept:
        assert schedule is spread and info["order_guard"] == ""
    else:
        assert set(schedule.device.tolist()) == {0} and schedule.makespan == pytest.approx(1.05)
        assert info["order_guard"] == "single device"
        assert "only 1.05x faster than one device, under the 1.10x" in info["order_guard_reason"]
