"""A place() call analyses its graph once (fddps.tf.graphdef.analyse) and imports it into
TensorFlow once: for a GraphDef (a scheduler and a strategy search), and for a Keras
model (traced, then read as a graph). Counted by wrapping the functions, not timed.

Every module of fddps that holds ``analyse`` gets the counting wrapper, so a stage
that calls it again on the raw graph (instead of passing the analysis on, which
``analyse`` returns as is) is counted wherever it sits.

TF2 eager fixes its CPU devices when its runtime starts: like tests/test_keras.py,
this module asks for 4 logical CPU devices when pytest imports it.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import fddps  # noqa: E402
from fddps.tf import graphdef, local_cpu_devices  # noqa: E402

DEVICES = local_cpu_devices(4)[:2]


@pytest.fixture
def counts(monkeypatch):
    """What ``analyse`` read: ``analysed`` (the bytes of each graph it read, in
    order; an analysis passed on is counted in ``passed_on``), ``load_graph``
    (TensorFlow's import of a graph read: ``graphdef._import``), and ``import_graph_def`` (other imports of a graph
    byte-identical to one analysed: a placed graph carries its devices and is
    not counted)."""
    seen = {"analysed": [], "passed_on": 0, "load_graph": 0, "import_graph_def": 0}
    real_analyse, real_load = graphdef.analyse, graphdef._import
    real_import = tf.graph_util.import_graph_def

    def analyse(graph_like, *args, **kwargs):
        if isinstance(graph_like, graphdef.GraphAnalysis):
            seen["passed_on"] += 1
            return real_analyse(graph_like, *args, **kwargs)
        result = real_analyse(graph_like, *args, **kwargs)
        seen["analysed"].append(_bytes(result.graph_def))
        return result

    def load_graph(graph_def, *args, **kwargs):
        seen["load_graph"] += 1
        return real_load(graph_def, *args, **kwargs)

    def import_graph_def(graph_def, *args, **kwargs):
        data = _bytes(graph_def)
        if data in seen["analysed"]:
            seen["import_graph_def"] += 1
            seen.setdefault("imported", []).append(seen["analysed"].index(data))
        return real_import(graph_def, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("fddps") and getattr(module, "analyse", None) is real_analyse:
            monkeypatch.setattr(module, "analyse", analyse)
    monkeypatch.setattr(graphdef, "_import", load_graph)
    monkeypatch.setattr(tf.graph_util, "import_graph_def", import_graph_def)
    return seen


def _bytes(graph_def):
    return graph_def.SerializeToString(deterministic=True)


def _graph():
    g = tf.Graph()
    with g.as_default():
        x = tf.random.normal([16, 8, 8, 4], seed=1, name="x")
        w = tf.compat.v1.get_variable("w", [3, 3, 4, 8])
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"), name="conv")
        loss = tf.reduce_mean(tf.square(y), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return g.as_graph_def(), [train.name, loss.name]


def _assert_once(seen, only=True):
    """The input graph (the first analysed) was analysed and imported once; with
    ``only``, nothing else was analysed either."""
    analysed = seen["analysed"]
    assert analysed and analysed.count(analysed[0]) == 1, seen
    assert seen["import_graph_def"] == 0, seen
    if only:
        assert len(analysed) == 1 and seen["load_graph"] == 1, seen


def test_a_graph_def_is_analysed_once_by_a_scheduler(counts):
    graph_def, fetches = _graph()
    p = fddps.place(graph_def, DEVICES, fetches=fetches)
    _assert_once(counts)
    assert p.makespan > 0


def test_a_graph_def_is_analysed_once_by_a_search(counts):
    graph_def, fetches = _graph()
    p = fddps.place(graph_def, DEVICES, algorithm="auto", fetches=fetches, time_budget=2.0)
    # FD-DPS's own placement and the search's step graphs got the analysis, not the
    # graph. What else was analysed are the candidates' rewritten GraphDefs (other
    # node order, devices set, ``_class`` dropped; the data-parallel one has more
    # nodes), read to predict the step each writes: each once, though two
    # candidates write the same graph here (FD-DPS keeps this small step on one
    # device, as the one-device baseline does).
    assert counts["passed_on"] >= 2, counts
    _assert_once(counts, only=False)
    assert len(set(counts["analysed"])) == len(counts["analysed"]) >= 3, counts
    assert p.makespan > 0


def test_a_keras_model_is_analysed_once(counts):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)),
                              keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    x = np.random.default_rng(0).random((4, 8, 8, 3), dtype=np.float32)
    y = np.arange(4) % 3
    # Verifying builds and times the finalists from what was decided (the stub
    # timer runs nothing): still one analysis.
    p = fddps.place(model, DEVICES, batch=(x, y), optimizer="sgd",
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    verify=True, verify_timer=lambda label, run: 1.0)
    _assert_once(counts)
    assert p.makespan > 0
