"""fddps.plot (critical path, Gantt chart) and fddps.trace (Chrome trace) on hand-made schedules."""

from __future__ import annotations

import io
import json

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from fddps import Cluster, OpGraph, Schedule, schedule  # noqa: E402
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


def test_plot_schedule_draws_lanes_critical_path_and_transfers(two_device_schedule):
    s = two_device_schedule
    ax = plot_schedule(s, transfers=True)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0", "gpu1"]
    red = [c for c in ax.collections
           if len(c.get_edgecolor()) and tuple(c.get_edgecolor()[0][:3]) == (1.0, 0.0, 0.0)]
    assert sum(len(c.get_paths()) for c in red) == 3  # a, b, d outlined
    lines = [c for c in ax.collections if type(c).__name__ == "LineCollection"]
    assert len(lines) == 1 and len(lines[0].get_segments()) == 2  # a->b and a->d cross devices
    assert "makespan 6" in ax.get_title()
    ax2 = plot_schedule(s, critical_path=False)
    assert not [c for c in ax2.collections
                if len(c.get_edgecolor()) and tuple(c.get_edgecolor()[0][:3]) == (1.0, 0.0, 0.0)]


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
