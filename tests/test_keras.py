"""Keras models and tf.function steps placed by fddps and run placed (fddps.tf.functions).

Each placed step runs in TF2 eager mode on the step's own variables; after a
few steps the weights and losses must equal those of unplaced training, and
every op the runtime reports must have run where it was placed.

TF2 eager fixes its CPU devices when its runtime starts, so this module asks
for 4 logical CPU devices when pytest imports it (before any test runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import fddps  # noqa: E402
from costmodel import DevicePreset, default_cost_model  # noqa: E402
from fddps.errors import ClusterError, FddpsError  # noqa: E402
from fddps.tf import StepPlacement, local_cpu_devices, make_cluster  # noqa: E402

DEVICES = local_cpu_devices(4)
ROOT = Path(__file__).resolve().parents[1]

#: A fixed CPU preset, so that the placements do not depend on this machine.
COST_MODEL = default_cost_model(cpu=DevicePreset(
    "test-cpu", "CPU", peak_flops=1e9, memory_bandwidth=10e9, memory=16 * 2**30,
    overhead=5e-6))


def _own_cores(devices):
    """The devices as if each had cores of its own: sharing this process's
    cores, the schedule would keep the step on one device, and these tests are
    about a step spread over several."""
    return make_cluster(devices, COST_MODEL, share_cores=False)


def _cnn(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        # No bias before batch norm: its gradient is 0 up to rounding, which
        # Adam would scale up to a full step, different in any other sum order.
        keras.layers.Conv2D(8, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, padding="same"), keras.layers.Dropout(0.25),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)], name="cnn")


def _batches(n=3, batch=4, seed=0):
    rng = np.random.RandomState(seed)
    return (rng.randn(n, batch, 8, 8, 3).astype(np.float32),
            rng.randint(0, 5, (n, batch)).astype(np.int32))


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _check_ran_where_placed(p, min_devices):
    assert p.ran_on, "no partition graph of the placed step was reported"
    assert p.moved_ops() == []
    used = {d for d in p.ran_on.values()}
    assert len(used) >= min_devices, f"ops ran on {used} only"


@pytest.mark.parametrize("n_devices", [2, 4])
def test_keras_model_trains_placed_as_unplaced(n_devices, tmp_path):
    xs, ys = _batches()
    ref = _cnn()
    ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=_loss())
    model = _cnn()
    # verify=False: this test is about a step spread over the devices, which on
    # logical CPUs sharing this machine's cores may measure slower than one device.
    p = fddps.place(model, _own_cores(DEVICES[:n_devices]), loss=_loss(),
                    optimizer=keras.optimizers.SGD(0.1, momentum=0.9), batch=(xs[0], ys[0]),
                    cost_model=COST_MODEL, verify=False)
    assert isinstance(p, StepPlacement) and p.model is model
    assert p.info["step"] == "keras" and len(set(p.devices.values())) >= 2
    for x, y in zip(xs, ys):
        got = p.train_step(x, y)
        want = ref.train_on_batch(x, y, return_dict=True)
        assert float(got["loss"]) == pytest.approx(want["loss"], rel=1e-5)
    for a, b, w in zip(model.get_weights(), ref.get_weights(), model.weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=w.path)
    _check_ran_where_placed(p, 2)
    # The weights are the model's own: saved and loaded as usual.
    path = str(tmp_path / "cnn.weights.h5")
    model.save_weights(path)
    fresh = _cnn(seed=1)
    fresh.load_weights(path)
    for a, b in zip(fresh.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_keras_model_needs_only_a_batch():
    xs, ys = _batches(n=2)
    ref, model = _cnn(), _cnn()
    for m in (ref, model):
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss=_loss(), metrics=["accuracy"])
    p = fddps.place(model, DEVICES, (xs[0], ys[0]), cost_model=COST_MODEL, split=False)
    assert "Keras model 'cnn'" in p.summary()
    for x, y in zip(xs, ys):
        got = p(x, y)
        want = ref.train_on_batch(x, y, return_dict=True)
        assert set(got) == set(want) == {"loss", "accuracy"}
        for k in want:
            assert float(got[k]) == pytest.approx(want[k], rel=1e-5)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(FddpsError, match=r"x of the placed step has shape \[2, 8, 8, 3\]"):
        p.train_step(xs[0][:2], ys[0][:2])


def _function_step():
    """A user's tf.function step on its own variables: conv, dense, momentum SGD."""
    rng = np.random.RandomState(3)
    w1 = tf.Variable(rng.randn(3, 3, 3, 8).astype(np.float32) * 0.3, name="w1")
    w2 = tf.Variable(rng.randn(8, 5).astype(np.float32) * 0.3, name="w2")
    b2 = tf.Variable(np.zeros(5, np.float32), name="b2")
    params = [w1, w2, b2]
    velocity = [tf.Variable(tf.zeros_like(v), name=f"v_{k}") for k, v in enumerate(params)]

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME"))
            h = tf.reduce_mean(h, axis=[1, 2])
            logits = tf.matmul(h, w2) + b2
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for v, m, g in zip(params, velocity, tape.gradient(loss, params)):
            m.assign(0.9 * m + g)
            v.assign_sub(0.1 * m)
        return {"loss": loss, "logits": logits}

    return step, params + velocity


# enforce_order=False, not "auto": on logical CPUs the order guard keeps a spread only
# when it is predicted at least 10% faster than one device (SPREAD_MARGIN).
@pytest.mark.parametrize("n_devices,enforce_order", [(2, False), (3, True)])
def test_tf_function_step_trains_placed_as_unplaced(n_devices, enforce_order):
    xs, ys = _batches()
    ref_step, ref_vars = _function_step()
    step, variables = _function_step()
    p = fddps.place(step, _own_cores(DEVICES[:n_devices]), (xs[0], ys[0]), cost_model=COST_MODEL,
                    enforce_order=enforce_order, verify=False)  # a spread step, as above
    assert p.info["step"] == "tf.function"
    if enforce_order is True:
        assert p.info["order_edges_added"] > 0
        # No op waits on a captured variable's placeholder (fed by tensor, never run).
        feeds = {n.name for n in p.graph_def.node if n.op == "Placeholder"}
        assert not [(n.name, i) for n in p.graph_def.node for i in n.input
                    if i.startswith("^") and i[1:] in feeds]
    for x, y in zip(xs, ys):
        got, want = p.train_step(x, y), ref_step(x, y)
        assert set(got) == {"loss", "logits"}
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-6)
    for v, r in zip(variables, ref_vars):
        np.testing.assert_allclose(v.numpy(), r.numpy(), rtol=1e-5, atol=1e-6, err_msg=v.name)
    _check_ran_where_placed(p, 2)


class _SignFlip(keras.layers.Layer):
    """A layer without weights whose call branches (a functional ``If`` op)."""

    def call(self, x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: x, lambda: -x)


def test_keras_layer_fddps_cannot_read_is_named():
    # A recurrent layer (its loop is a While op reading the layer's weights).
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4, name="encoder"),
                              keras.layers.Dense(5)], name="rnn")
    x, y = np.zeros((4, 5, 3), np.float32), np.zeros(4, np.int32)
    with pytest.raises(FddpsError, match=r"layer 'encoder' \(LSTM\).*While"):
        fddps.place(model, DEVICES[:2], loss=_loss(), optimizer="sgd", batch=(x, y),
                    cost_model=COST_MODEL)
    # A layer without weights, found by its name scope.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), _SignFlip(name="flip"),
                              keras.layers.Dense(5)])
    x = np.ones((4, 4), np.float32)
    with pytest.raises(FddpsError, match=r"layer 'flip' \(_SignFlip\).*If\)"):
        fddps.place(model, DEVICES[:2], loss=_loss(), optimizer="sgd", batch=(x, y),
                    cost_model=COST_MODEL)


def test_keras_missing_options_are_named():
    xs, ys = _batches(n=1)
    batch = (xs[0], ys[0])
    for kwargs, option in ((dict(optimizer="sgd", batch=batch), "loss="),
                           (dict(loss=_loss(), batch=batch), "optimizer="),
                           (dict(loss=_loss(), optimizer="sgd"), "batch=")):
        with pytest.raises(FddpsError, match=option):
            fddps.place(_cnn(), DEVICES[:2], cost_model=COST_MODEL, **kwargs)
    with pytest.raises(FddpsError, match="example_inputs"):
        fddps.place(_function_step()[0], DEVICES[:2], cost_model=COST_MODEL)
    with pytest.raises(FddpsError, match="batch= is for a Keras model"):
        fddps.place(_function_step()[0], DEVICES[:2], batch=batch, cost_model=COST_MODEL)


def test_variable_on_a_device_not_given_is_named():
    xs, ys = _batches(n=1)
    step, _ = _function_step()  # variables on /device:CPU:0
    with pytest.raises(ClusterError, match=r"variable 'w1:0' lives on .*CPU:0, which is none"):
        fddps.place(step, DEVICES[1:3], (xs[0], ys[0]), cost_model=COST_MODEL)


def test_local_cpu_devices_after_start():
    assert local_cpu_devices(2) == DEVICES[:2]
    with pytest.raises(ClusterError, match="already started with 4 CPU"):
        local_cpu_devices(5)
    with pytest.raises(ClusterError, match="integer >= 1"):
        local_cpu_devices(0)


# The cluster changes this process's eager context for good (and its workers
# stop after the test), so it runs in a fresh Python process.
_CLUSTER_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import keras
    sys.path.insert(0, {tests!r})
    import fddps
    from fddps import Cluster
    from fddps.tf import local_cluster
    from fddps.tf.devices import make_cluster
    import test_keras as t

    xs, ys = t._batches()
    with local_cluster(2) as c:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(c.cluster_spec))
        tasks = make_cluster(c.devices, t.COST_MODEL)
        # Contention-free links, so that this small step is spread over both tasks.
        free = Cluster(tasks.devices, bandwidth=tasks.bandwidth, latency=tasks.latency)

        ref = t._cnn()
        ref.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=t._loss())
        ref_step, ref_vars = t._function_step()
        with tf.device(c.devices[0]):  # the variables live on task 0
            model = t._cnn()
            opt = keras.optimizers.SGD(0.1, momentum=0.9)
            step, variables = t._function_step()
        # verify=False: spread over both tasks, as this test checks (not the fastest).
        pk = fddps.place(model, free, loss=t._loss(), optimizer=opt, batch=(xs[0], ys[0]),
                         cost_model=t.COST_MODEL, verify=False)
        pf = fddps.place(step, free, (xs[0], ys[0]), cost_model=t.COST_MODEL, verify=False)
        for x, y in zip(xs, ys):
            got, want = pk.train_step(x, y), ref.train_on_batch(x, y, return_dict=True)
            np.testing.assert_allclose(float(got["loss"]), want["loss"], rtol=1e-5)
            got, want = pf.train_step(x, y), ref_step(x, y)
            np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        for a, b in zip(model.get_weights(), ref.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        for v, r in zip(variables, ref_vars):
            np.testing.assert_allclose(v.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)
        for p in (pk, pf):
            assert p.moved_ops() == [], p.moved_ops()
            tasks_ran = {{tf.DeviceSpec.from_string(d).task for d in p.ran_on.values()}}
            assert tasks_ran == {{0, 1}}, tasks_ran
            print("ran on", len(p.ran_on), "nodes, tasks", sorted(tasks_ran))

        # Eager assignments to a variable on a worker task reach it by another
        # route than the placed function's parts: without waiting for them the
        # step could run first (a Keras loss was halved by a late metric reset).
        with tf.device(c.devices[0]):
            count = tf.Variable(0.0)

        @tf.function
        def counting(x):
            count.assign_add(1.0)
            return count.read_value() + 0.0 * tf.reduce_sum(tf.matmul(x[0, 0], tf.transpose(x[0, 0])))

        pc = fddps.place(counting, free, (xs[0],), cost_model=t.COST_MODEL)
        seen = []
        for _ in range(100):
            count.assign(tf.zeros([]))
            seen.append(float(pc.train_step(xs[0])))
        assert seen == [1.0] * len(seen), seen
    print("CLUSTER-OK")
""")


@pytest.mark.slow
def test_keras_and_tf_function_steps_on_local_cluster():
    script = _CLUSTER_SCRIPT.format(tests=str(ROOT / "tests"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, cwd=str(ROOT), env=env)
    assert run.returncode == 0 and "CLUSTER-OK" in run.stdout, run.stdout[-3000:] + run.stderr[-5000:]


@pytest.mark.slow
def test_keras_step_experiment_smoke(tmp_path, capsys):
    from experiments import keras_step

    out = tmp_path / "keras_step.csv"
    assert keras_step.main(["--devices", "2", "--batch", "4", "--steps", "1",
                            "--out", str(out)]) == 0
    import pandas as pd

    df = pd.read_csv(out)
    assert list(df["run"]) == ["keras train_on_batch", "placed on 1", "placed on 2",
                               "tf.function placed on 1", "tf.function placed on 2"]
    assert (df["moved_ops"] == 0).all() and (df["max_weight_diff"].iloc[:3] < 1e-4).all()
    assert df["step_ms"].gt(0).all() and df["nodes"].iloc[1:3].gt(100).all()
    assert df.x_one_device.iloc[1] == df.x_one_device.iloc[3] == 1.0
    # place()'s default verifies TF2 steps: each placement says what it returned or why not.
    assert df.verified.iloc[1:].astype(bool).all()
    assert "logical CPU devices" in capsys.readouterr().out
    assert "x_one_device" in out.with_suffix(".md").read_text()


def test_place_passes_a_strategy_on_to_a_keras_step():
    # fddps.place(model, ..., strategy=...) used to drop the strategy silently and search.
    x, y = _batches(1)
    p = fddps.place(_cnn(), DEVICES[:2], COST_MODEL, batch=(x[0], y[0]), optimizer="sgd",
                    loss=_loss(), strategy="data_parallel", verify=False)
    assert p.info["algorithm"] == "strategy" and p.info["strategy"] == "data parallel"
    with pytest.raises(FddpsError, match="strategy='model_parallel'"):
        fddps.place(_cnn(), DEVICES[:2], COST_MODEL, batch=(x[0], y[0]), optimizer="sgd",
                    loss=_loss(), strategy="model_parallel")
