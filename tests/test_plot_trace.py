"""fddps.plot (critical path, Gantt chart) and fddps.trace (Chrome trace) on hand-made schedules."""

from __future__ import annotations

import io
import json

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from fddps import Cluster, OpGraph, Schedule, schedule  # noqa: E402
from fddps import plot  # noqa: E402
from fddps.generators import training_graph  # noqa: E402
from fddps.plot import critical_path, plot_schedule  # noqa: E402
from fddps.trace import to_chrome_trace  # noqa: E402


@pytest.fixture
def two_device_schedule():
    """a -> b (1 MB) and a -> c; b, d on device 1; c, e on device 0; d waits for its device.

    Device 0: a [0,1], c [1,3], e [3,4]. Device 1: b [2,5] (1 s transfer), d [5,6].
    """
    g = OpGraph(["a", "b", "c", "d", "e"], [1.0, 3.0, 2.0, 1.0, 1.0],
                [("a", "b", 1e6), ("a", "c"), ("a", "d"), ("c", "e")])
    c = Cluster.homogeneous(2, bandwidth=1e6, latency=0.0, names=["gpu0", "gpu1"])
    device = [0, 1, 0, 1, 0]
    order = [[0, 2, 4], [1, 3]]
    return Schedule.from_order(g, c, device, order, algorithm="hand")


def test_critical_path_follows_data_transfer_and_device_waits(two_device_schedule):
    s = two_device_schedule
    np.testing.assert_allclose(s.start, [0, 2, 1, 5, 3])
    path = critical_path(s)
    # d starts when b frees device 1 (not when a's output arrives); b waits for a's transfer.
    assert [s.graph.names[i] for i in path] == ["a", "b", "d"]
    assert s.finish[path[-1]] == s.makespan
    assert s.start[path[0]] == 0.0


def test_critical_path_of_a_chain_is_the_chain():
    g = OpGraph(list("pqrs"), [1.0, 2.0, 3.0, 0.5], [("p", "q"), ("q", "r"), ("r", "s")])
    s = schedule(g, Cluster.homogeneous(3))
    assert critical_path(s) == [0, 1, 2, 3]
    dur = (s.finish - s.start)[critical_path(s)].sum()
    assert dur == pytest.approx(s.makespan)


def _by_gid(ax, gid):
    return [c for c in ax.collections if c.get_gid() == gid]


def test_plot_schedule_draws_lanes_critical_path_and_transfers(two_device_schedule):
    s = two_device_schedule
    ax = plot_schedule(s, transfers=True)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu1"]
    # The critical path a -> b -> d: one thin line per op, above its bar, and one hop between devices.
    (path,) = _by_gid(ax, "critical_path")
    segs = path.get_segments()
    assert [tuple(np.round(seg[:, 0], 6)) for seg in segs] == [(0, 1), (2, 5), (5, 6)]
    bars_top = {k: k + plot._BAR_TOP for k in (0, 1)}
    assert all(seg[0, 1] < bars_top[round(seg[0, 1])] for seg in segs)  # above the bars, not on them
    (hops,) = _by_gid(ax, "critical_path_hops")
    assert len(hops.get_segments()) == 1  # a (gpu0) -> b (gpu1)
    # Transfers a->b and a->d go into gpu1's strip under its bars, from a's finish to arrival.
    (tr,) = _by_gid(ax, "transfers")
    t = tr.get_segments()
    assert len(t) == 2 and all(seg[0, 1] > 1 + plot._BAR_TOP + plot._BAR_HEIGHT for seg in t)
    assert sorted(tuple(np.round(seg[:, 0], 6)) for seg in t) == [(1, 1), (1, 2)]
    assert "step 6 s" in ax.get_title() and "on 2 of 2 devices" in ax.get_title()
    ax2 = plot_schedule(s, critical_path=False)
    assert not _by_gid(ax2, "critical_path") and not _by_gid(ax2, "transfers")


def test_legend_lists_op_types_by_total_time_not_count():
    """40 cheap Relus and 30 Identities outnumber 2 Conv2Ds; the Conv2Ds cost the most time."""
    types = ["Conv2D"] * 2 + ["Relu"] * 40 + ["Identity"] * 30 + ["MatMul"] * 3
    times = [5.0] * 2 + [0.01] * 40 + [0.05] * 30 + [1.0] * 3
    g = OpGraph([f"op{i}" for i in range(len(types))], times, [], op_types=types)
    s = schedule(g, Cluster.homogeneous(2))
    labels, totals = plot.op_time_by_type(s, max_op_types=2)
    assert list(totals.index) == ["Conv2D", "MatMul", "other", plot._NO_WORK_LABEL]
    assert totals["Conv2D"] == pytest.approx(10.0) and totals["other"] == pytest.approx(0.4)
    assert totals.sum() == pytest.approx(sum(times))
    assert (labels[2:42] == "other").all() and (labels[42:72] == plot._NO_WORK_LABEL).all()
    ax = plot_schedule(s, max_op_types=2)
    legend = [t.get_text().split("  ")[0] for t in ax.get_legend().get_texts()]
    # Plumbing that computes nothing comes last, with its count, not a share of the time.
    assert legend[:4] == ["Conv2D", "MatMul", "other", f"{plot._NO_WORK_LABEL}: 30 ops"]
    assert legend[4].startswith("critical path")
    shares = [t.get_text() for t in ax.get_legend().get_texts()][:3]
    assert shares[0].endswith(f"({10 / 13.4:.0%})")  # of the 13.4 s that do work


def test_idle_devices_get_no_lane_and_long_names_are_shortened():
    g = OpGraph(["a", "b"], [1.0, 2.0], [("a", "b")])
    names = [f"/job:worker/replica:0/task:{t}/device:GPU:{i}" for t in (0, 1) for i in (0, 1)]
    c = Cluster.homogeneous(4, names=names)
    s = Schedule.from_order(g, c, [2, 2], [[], [], [0, 1], []], algorithm="hand")
    ax = plot_schedule(s)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["task 1 GPU:0"]
    assert "on 1 of 4 devices (3 idle, not drawn)" in ax.get_title()
    ax = plot_schedule(s, idle_lanes=True)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "task 0 GPU:0", "task 0 GPU:1", "task 1 GPU:0", "task 1 GPU:1"]
    assert plot.device_labels(["/device:CPU:0", "/device:CPU:1"]) == ["CPU:0", "CPU:1"]
    fig = plot.plot_overview(s)
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["task 1 GPU:0"]


def test_utilization_is_a_fraction_and_adds_up_to_each_devices_busy_time():
    g = training_graph(300, seed=4)
    s = schedule(g, Cluster.homogeneous(3, bandwidth=1e9, latency=1e-5), algorithm="heft")
    dur = s.finish - s.start
    for bins in (1, 7, 200):
        edges, busy = plot.utilization(s, bins=bins)
        assert busy.shape == (3, bins) and edges[0] == 0 and edges[-1] == pytest.approx(s.makespan)
        assert (busy >= 0).all() and (busy <= 1).all()
        per_device = (busy * np.diff(edges)).sum(axis=1)
        np.testing.assert_allclose(per_device, [dur[s.device == k].sum() for k in range(3)],
                                   rtol=1e-9)
        # Each bin's busy fraction is the overlap of the device's ops with it, bin by bin.
        k = int(s.device[0])
        on = s.device == k
        for b in (0, bins // 2, bins - 1):
            lo, hi = edges[b], edges[b + 1]
            overlap = np.clip(np.minimum(s.finish[on], hi) - np.maximum(s.start[on], lo), 0, None)
            assert busy[k, b] == pytest.approx(overlap.sum() / (hi - lo), abs=1e-9)
    # The device an op alone runs on is fully busy in the bins inside it.
    one = schedule(OpGraph(["a"], [2.0], []), Cluster.homogeneous(2))
    _, busy = plot.utilization(one, bins=4)
    assert busy[one.device[0]].tolist() == [1.0] * 4 and busy.sum() == 4.0
    with pytest.raises(ValueError, match="bins >= 1"):
        plot.utilization(s, bins=0)


def test_plot_utilization_and_overview(two_device_schedule):
    s = two_device_schedule
    ax = plot_schedule(s, kind="utilization", bins=6)
    fills = _by_gid(ax, "utilization")
    assert fills and [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu1"]
    assert sorted(t.get_text() for t in ax.texts) == ["67% busy", "67% busy"]  # 4 s of 6 each
    with pytest.raises(ValueError, match="unknown kind 'pie'"):
        plot_schedule(s, kind="pie")
    fig = plot.plot_overview(s)
    assert len(fig.axes) == 2 and _by_gid(fig.axes[0], "critical_path") and _by_gid(fig.axes[1],
                                                                                     "utilization")


def test_chrome_trace_has_ops_devices_and_transfers(two_device_schedule, tmp_path):
    s = two_device_schedule
    path = tmp_path / "trace.json"
    trace = to_chrome_trace(s, path)
    assert json.loads(path.read_text()) == trace
    events = trace["traceEvents"]
    ops = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(ops) == {"a", "b", "c", "d", "e"}
    assert ops["b"]["ts"] == 2e6 and ops["b"]["dur"] == 3e6 and ops["b"]["tid"] == 1
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {0: "gpu0", 1: "gpu1"}
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 2
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert max(e["args"]["bytes"] for e in starts) == 1e6
    buf = io.StringIO()
    to_chrome_trace(s, buf, transfers=False)
    assert not [e for e in json.loads(buf.getvalue())["traceEvents"] if e["ph"] in "sf"]
