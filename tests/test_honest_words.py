"""What a user reads is true: devices used of those given, units, saved charts, clear errors."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import fddps  # noqa: E402
from fddps.errors import GraphError  # noqa: E402

tf = pytest.importorskip("tensorflow")


def test_wrong_length_costs_are_named():
    with pytest.raises(GraphError, match=r"cost has 2 values for 3 ops: give one execution time "
                                         r"per op \(ops \['a', 'b', 'c'\]\)"):
        fddps.OpGraph(["a", "b", "c"], cost=[1.0, 2.0])
    with pytest.raises(GraphError, match="cost must be numbers"):
        fddps.OpGraph(["a"], cost=["fast"])


@pytest.mark.parametrize("kw,message", [
    (dict(batch_size=-4), "batch_size must be a positive integer, got -4"),
    (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
    (dict(batch_size=2, image_size=0), "image_size must be a positive integer, got 0"),
])
def test_slim_models_name_a_bad_size(kw, message):
    slim_models = pytest.importorskip("slim_models")
    with pytest.raises(ValueError, match=message):
        slim_models.build_training_graph("resnet50", **kw)


@pytest.fixture(scope="module")
def one_device_placement():
    """A graph placed on one of the two devices given."""
    g = tf.Graph()
    with g.as_default():
        x = tf.random.stateless_normal([4, 4], seed=[1, 2], name="x")
        tf.nn.relu(tf.matmul(x, x), name="out")
    return fddps.place(g, ["/device:GPU:0", "/device:GPU:1"], algorithm="single", fetches=["out"])


def test_summary_repr_and_chart_count_the_devices_used(one_device_placement, tmp_path):
    p = one_device_placement
    assert len(set(p.schedule.device.tolist())) == 1
    assert "scheduled on 1 of the 2 devices given" in p.summary()
    assert "predicted step time" in p.summary() and " ms" in p.summary()
    assert "on 1 of 2 devices" in repr(p) and repr(p).endswith(" s)")
    path = tmp_path / "charts" / "gantt.png"
    fig = p.plot(path)
    assert isinstance(fig, matplotlib.figure.Figure) and path.stat().st_size > 1000
    title = fig.axes[0].get_title()
    assert "on 1 of 2 devices (1 idle, not drawn)" in title and title.endswith(" µs")
