"""Measure before committing: place(..., verify=...) times its finalists and returns the
fastest measured (fddps.tf.verify).

The choosing is tested with stub timings (``verify_timer``), never with wall-clock
thresholds: which finalist is returned, that the one-device graph is never beaten by a
finalist measured slower, that a Keras model's weights and optimizer state are restored
bit for bit, that a graph which cannot be fed is reported, and that the input GraphDef
is untouched.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import fddps  # noqa: E402
from costmodel import DevicePreset, default_cost_model  # noqa: E402
from fddps.errors import FddpsError  # noqa: E402
from fddps.tf import local_cpu_devices, make_cluster  # noqa: E402
from fddps.tf.verify import (MIN_ROUNDS, ONE_DEVICE, describe,  # noqa: E402
                             distinct_finalists, interleave, sign_test, verify_finalists)

# Four, as tests/test_keras.py asks for (whichever module starts TensorFlow fixes them); two used.
DEVICES = local_cpu_devices(4)[:2]
CPUS = ["/device:CPU:0", "/device:CPU:1"]

#: A fixed CPU preset, so that the placements do not depend on this machine.
COST_MODEL = default_cost_model(cpu=DevicePreset(
    "test-cpu", "CPU", peak_flops=1e9, memory_bandwidth=10e9, memory=16 * 2**30,
    overhead=5e-6))


def _own_cores(devices):
    """Devices as if each had cores of its own: the schedule spreads the step."""
    return make_cluster(devices, COST_MODEL, share_cores=False)


def _graph(batch=16, shape=None):
    """Four independent matmuls feeding one loss: FD-DPS spreads them over two devices."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape or [batch, 64], name="x")
        ws = [tf.compat.v1.get_variable(f"w{i}", [64, 64]) for i in range(4)]
        y = tf.add_n([tf.matmul(x, w) for w in ws])
        loss = tf.reduce_mean(tf.square(y), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.compat.v1.global_variables_initializer()
    return g.as_graph_def(), ["train", "loss"]


def _stub(times, seen=None):
    """A timer that does not run the step: ``times[label]`` seconds (1.0 if not named)."""
    def timer(label, run):
        if seen is not None:
            seen.append(label)
        return times.get(label, 1.0)

    return timer


# -- the rules, without TensorFlow -------------------------------------------------------
def test_interleaving_rotates_the_order_and_stops_when_one_is_clearly_best():
    calls = []
    runs = [lambda k=k: calls.append(k) for k in range(3)]

    def timer(label, run):
        run()
        return {"a": 1.0, "b": 2.0, "c": 1.5}[label]

    got = interleave(runs, ["a", "b", "c"], min_rounds=3, max_rounds=10, timer=timer)
    # b (every step slower than a's slowest) is dropped after round 3; a's slowest
    # then beats c's median: stop.
    assert got["rounds"] == 3 and got["stopped"] == "clearly best"
    assert calls[:3] == [0, 1, 2] and calls[3:6] == [1, 2, 0] and calls[6:9] == [2, 0, 1]
    assert got["times"] == [[1.0] * 3, [2.0] * 3, [1.5] * 3]


def test_interleaving_runs_on_while_no_finalist_is_clearly_best_until_the_budget():
    now = [0.0]

    def clock():
        return now[0]

    def timer(label, run):
        now[0] += 1.0
        return 1.0 + 0.5 * (len(clock_steps) % 2)

    clock_steps = []
    runs = [lambda: clock_steps.append(1)] * 2
    got = interleave(runs, ["a", "b"], min_rounds=3, max_rounds=50, budget=9.5, start=0.0,
                     timer=lambda label, run: (run(), timer(label, run))[1], clock=clock)
    # Both alternate 1.0 and 1.5 s: neither is clearly best; 2 s of clock per round.
    assert got["stopped"] == "budget" and got["rounds"] == 5


def test_the_measured_fastest_is_returned_and_failures_are_left_out():
    def prepare(k):
        if k == 2:
            raise RuntimeError("no kernel for op 'x' on device 7\nmore")
        return lambda: None

    finalists = [("chosen", 1.0), (ONE_DEVICE, 2.0), ("broken", 0.5), ("runner-up", 1.1)]
    record = verify_finalists(finalists, prepare, timer=_stub(
        {"chosen": 0.3, ONE_DEVICE: 0.2, "runner-up": 0.1}), budget=1.0)
    assert record["returned"] == "runner-up" and record["returned_index"] == 3
    assert record["predicted_best"] == "chosen" and record["reason"] == ""
    rows = {r["label"]: r for r in record["finalists"]}
    assert rows["broken"]["error"] == "RuntimeError: no kernel for op 'x' on device 7"
    assert rows["broken"]["steps"] == 0 and np.isnan(rows["broken"]["measured"])
    assert rows["runner-up"]["returned"] and rows["runner-up"]["measured"] == 0.1
    assert sum(r["returned"] for r in record["finalists"]) == 1


def test_a_spread_with_the_lower_median_must_also_win_the_rounds():
    # The spread's median is lower and its slowest step beats the one-device median, but it
    # won only 3 of 5 rounds: not enough to tell from noise, so the one-device graph is
    # returned, and the record says why.
    def timer_for():
        steps = {"spread": iter([0.9] * 30), ONE_DEVICE: iter([1.0, 0.85] * 2 + [1.0] * 30)}
        return lambda label, run: next(steps[label])

    finalists, prepare = [("spread", 0.5), (ONE_DEVICE, 1.0)], lambda k: (lambda: None)
    record = verify_finalists(finalists, prepare, timer=timer_for(), max_rounds=5)
    rows = {r["label"]: r for r in record["finalists"]}
    assert rows["spread"]["measured"] < rows[ONE_DEVICE]["measured"]
    assert record["returned"] == ONE_DEVICE and rows[ONE_DEVICE]["returned"]
    assert record["not_proven"] == ("spread had the lowest median but was faster than one "
                                    "device in 3 of 5 rounds (sign test p = 0.5 > 0.1)")
    # Given the rounds, it wins the rest; the rounds do not stop early (its slowest step
    # beat the other's median from round 5) until the test passes: 7 of 9, p = 0.09.
    record = verify_finalists(finalists, prepare, timer=timer_for(), budget=1e9)
    assert record["returned"] == "spread" and record["not_proven"] == ""
    assert record["stopped"] == "clearly best" and record["rounds"] == 9
    assert sign_test([0.9] * 9, [1.0, 0.85] * 2 + [1.0] * 5)[:2] == (7, 9)
    assert sign_test([1.0] * 3, [1.0] * 3) == (0, 0, 1.0)  # ties tell nothing


def test_runners_up_are_built_only_while_the_budget_lasts():
    # Building a finalist takes 2 s, the budget is 1.5 s: the chosen placement and the
    # one-device graph are built all the same; the runner-up, whose turn comes after
    # the budget is spent, is not (and says so).
    now, built = [0.0], []

    def prepare(k):
        now[0] += 2.0
        built.append(k)
        return lambda: None

    finalists = [("chosen", 1.0), ("runner-up", 1.1), (ONE_DEVICE, 2.0)]
    record = verify_finalists(finalists, prepare, budget=1.5, clock=lambda: now[0],
                              timer=_stub({"chosen": 0.5, ONE_DEVICE: 1.0, "runner-up": 0.1}))
    rows = {r["label"]: r for r in record["finalists"]}
    assert built == [0, 2] and rows["runner-up"]["skipped"] and rows["runner-up"]["steps"] == 0
    assert record["returned"] == "chosen" and not rows["chosen"]["skipped"]
    assert rows[ONE_DEVICE]["steps"] == rows["chosen"]["steps"] >= MIN_ROUNDS
    lines = "\n".join(describe(record))
    assert "runner-up" in lines and "not timed: the budget was spent building the others" in lines


def test_distinct_finalists_keep_the_one_device_graph():
    class P:
        def __init__(self, key):
            self.graph_def = tf.compat.v1.GraphDef()
            self.graph_def.node.add(name=key)

    a, b, one = P("a"), P("b"), P("one")
    got = distinct_finalists([("x", a), ("x", b), ("dup", P("a")), ("c", P("c")),
                              (ONE_DEVICE, one)], 3)
    assert [label for label, _ in got] == ["x", "x (2)", ONE_DEVICE]
    # The chosen placement is the one-device graph: one finalist, called what it is.
    got = distinct_finalists([("fddps", one), (ONE_DEVICE, P("one"))], 4)
    assert [label for label, _ in got] == [ONE_DEVICE]


@pytest.mark.parametrize("kw,match", [
    (dict(verify=1), "verify must be None.*got 1"),
    (dict(verify=-2), "verify must be None.*got -2"),
    (dict(verify="yes"), "verify must be None.*got 'yes'"),
    (dict(verify=True, verify_budget=0), "verify_budget must be a positive number.*got 0"),
    (dict(verify=True, verify_budget="2"), "verify_budget must be a positive number"),
    (dict(verify=True, verify_timer=3), "verify_timer must be a callable"),
])
def test_bad_verify_options_are_named(kw, match):
    graph_def, fetches = _graph()
    with pytest.raises(FddpsError, match=match):
        fddps.place(graph_def, CPUS, cost_model=COST_MODEL, fetches=fetches, **kw)


# -- placed GraphDefs ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def spread():
    """The graph, and its placement without verification (FD-DPS spreads it)."""
    graph_def, fetches = _graph()
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches)
    assert len(set(p.schedule.device.tolist())) == 2
    return graph_def, fetches, p


def test_the_finalist_measured_fastest_is_returned_not_the_predicted_best(spread):
    graph_def, fetches, unverified = spread
    before = graph_def.SerializeToString()
    seen = []
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches,
                    verify=True, verify_timer=_stub({"fddps, order enforced": 0.5}, seen))
    record = p.info["verified"]
    labels = [r["label"] for r in record["finalists"]]
    assert labels[:3] == ["fddps", ONE_DEVICE, "fddps, order enforced"]
    assert record["predicted_best"] == "fddps" and record["returned"] == "fddps, order enforced"
    assert record["reason"] == "" and record["rounds"] >= MIN_ROUNDS
    assert p.info["order_edges_added"] > 0 and unverified.info["order_edges_added"] == 0
    # The same schedule as the unverified placement, written with order edges.
    assert p.devices == unverified.devices
    # Every finalist was timed in every round until one was clearly best: rotating order.
    assert seen[:len(labels)] == labels and seen[len(labels)] == labels[1]
    text = p.summary()
    assert "verified on the devices" in text and "<- returned" in text
    assert "returned fddps, order enforced (the predicted best was fddps)" in text
    info = p.info
    stages = (info["read_seconds"] + info["decide_seconds"] + info["write_seconds"]
              + info["verify_seconds"])
    assert stages == pytest.approx(info["place_seconds"], rel=1e-6)
    assert graph_def.SerializeToString() == before  # the input GraphDef is untouched


def test_never_slower_than_the_one_device_graph(spread):
    graph_def, fetches, _ = spread
    # Every spread finalist is measured slower than one device: one device is returned,
    # whatever was predicted.
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches,
                    verify=3, verify_timer=_stub({ONE_DEVICE: 1.0, "fddps": 1.2}, None))
    record = p.info["verified"]
    assert len(record["finalists"]) == 3 and record["returned"] == ONE_DEVICE
    assert len(set(p.schedule.device.tolist())) == 1 and len(set(p.devices.values())) == 1
    one = next(r for r in record["finalists"] if r["label"] == ONE_DEVICE)
    assert all(one["measured"] <= r["measured"] for r in record["finalists"])
    assert "all on one device: measured faster" in p.summary()


def test_verification_runs_the_placed_graphs_for_real(spread):
    graph_def, fetches, _ = spread
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches,
                    verify=2, verify_budget=0.5)
    record = p.info["verified"]
    assert record["reason"] == "" and len(record["finalists"]) == 2
    for row in record["finalists"]:
        assert row["error"] == "" and row["steps"] >= MIN_ROUNDS and row["measured"] > 0
    assert record["returned"] in {"fddps", ONE_DEVICE}


def test_a_graph_that_cannot_be_fed_returns_the_predicted_best_and_says_why():
    graph_def, fetches = _graph(shape=[None, 64])
    want = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches)
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches,
                    verify=True)
    reason = p.info["verified"]["reason"]
    assert "placeholder 'x' has shape (None, 64)" in reason and "feed_dict" in reason
    assert p.graph_def.SerializeToString(deterministic=True) == \
        want.graph_def.SerializeToString(deterministic=True)
    assert "not verified on the devices: placeholder 'x'" in p.summary()
    # Fed with a value of the wrong shape, every finalist fails to run: said, not raised.
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, fetches=fetches,
                    verify=True, feed_dict={"x": np.zeros((2, 3), np.float32)})
    record = p.info["verified"]
    assert record["reason"].startswith("no finalist could run: fddps: ")
    assert all(r["error"] for r in record["finalists"])
    assert "could not run" in p.summary()
    # Without fetches, what a step runs is unknown.
    p = fddps.place(graph_def, _own_cores(CPUS), cost_model=COST_MODEL, verify=True)
    assert "no fetches given" in p.info["verified"]["reason"]


# -- Keras models and tf.function steps -----------------------------------------------------
def _cnn():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.Dropout(0.25),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)], name="cnn")


def _state(model):
    """Every variable of the model and its optimizer (slots, iteration counter), copied."""
    return {v.path: np.array(v.numpy(), copy=True)
            for v in list(model.variables) + list(model.optimizer.variables)}


def test_keras_verification_leaves_weights_and_optimizer_state_bit_identical():
    rng = np.random.RandomState(0)
    x, y = rng.randn(4, 8, 8, 3).astype(np.float32), rng.randint(0, 5, 4).astype(np.int32)
    model = _cnn()
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.train_on_batch(x, y)  # slots and the iteration counter away from their initial values
    before = _state(model)
    assert int(model.optimizer.iterations.numpy()) == 1
    p = fddps.place(model, _own_cores(DEVICES), (x, y), cost_model=COST_MODEL)  # verify: default
    record = p.info["verified"]
    assert record["reason"] == "" and len(record["finalists"]) >= 2
    assert all(r["error"] == "" and r["steps"] >= MIN_ROUNDS for r in record["finalists"])
    after = _state(model)
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert after[name].dtype == value.dtype and np.array_equal(after[name], value), name
    assert "verified on the devices" in p.summary()
    # The returned step trains the model from where it was.
    p.train_step(x, y)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_tf_function_step_verification_restores_its_variables():
    w = tf.Variable(np.random.RandomState(1).randn(16, 16).astype(np.float32))
    count = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(x):
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2) + tf.reduce_sum(tf.matmul(x, w * 2.0))
        w.assign_sub(0.01 * tf.matmul(x, x, transpose_a=True))
        count.assign_add(1)
        return loss

    x = np.ones((16, 16), np.float32)
    want = w.numpy().copy()
    p = fddps.place(step, _own_cores(DEVICES), (x,), cost_model=COST_MODEL, verify=2,
                    verify_timer=_stub({}))
    record = p.info["verified"]
    assert record["reason"] == "" and len(record["finalists"]) == 2
    assert all(r["first_step"] > 0 for r in record["finalists"])  # each ran (twice at least)
    assert np.array_equal(w.numpy(), want) and int(count.numpy()) == 0
    with pytest.raises(FddpsError, match="feed_dict= is for verifying a GraphDef"):
        fddps.place(step, DEVICES, (x,), cost_model=COST_MODEL, feed_dict={"x": x})
