"""Models nobody here wrote, placed exactly: keras.applications and a transformer block.

Each placed step, run once in float64, must equal Keras's own ``train_on_batch``
on an identical model to float64 rounding (1e-9), and every op must run where
it was placed. The whole family (ResNet50, MobileNetV2, DenseNet121,
EfficientNetB0 too, each with HEFT, FD-DPS and data parallelism) is
``python -m experiments.keras_applications`` (minutes per model here); the
suite runs its two cheapest models, one with Dropout and one with
LayerNormalization and attention. Also: the ops TensorFlow fuses are placed
together (the BiasAdds it moved before), and devices that do not exist, empty
device lists and wrong input shapes are named.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import fddps  # noqa: E402
from experiments import keras_applications as ka  # noqa: E402
from fddps.errors import ClusterError, FddpsError  # noqa: E402
from fddps.tf import local_cpu_devices, make_cluster  # noqa: E402
from fddps.tf.colocation import fusion_groups  # noqa: E402

DEVICES = local_cpu_devices(2)

#: (model, placement) pairs the suite runs; ``experiments.keras_applications`` runs all.
CASES = [("attention (LayerNormalization)", "heft"),
         ("attention (LayerNormalization)", "fddps"),
         ("attention (LayerNormalization)", "data_parallel"),
         ("MobileNet (Dropout)", "heft")]


@pytest.fixture(scope="module")
def float64():
    # Both: Keras fixes its global dtype policy at floatx the first time a layer asks for it
    # (after an earlier test built a model, set_floatx alone left some layers float32).
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)


@pytest.fixture(scope="module")
def cases(float64):
    """Each model's Keras reference step, computed once and shared by its placements."""
    cost_model = ka.test_cost_model()
    return {name: ka.Case(name, DEVICES, cost_model) for name in dict.fromkeys(n for n, _ in CASES)}


@pytest.mark.parametrize("model,placement", CASES)
def test_placed_step_equals_keras_in_float64(cases, model, placement):
    case = cases[model]
    p, _ = case.place(placement)
    assert len(set(p.devices.values()) - {""}) == 2, "the placement does not spread the step"
    got = case.compare(p)
    assert not [w.path for w in p.model.weights if w.dtype in ("float32", "float16")]
    assert got["devices_used"] == 2
    assert got["moved_ops"] == 0, p.moved_ops()[:5]
    assert got["loss_diff"] < 1e-9 * max(1.0, abs(case.want_loss))
    assert got["max_weight_diff"] < 1e-9


def _conv_net(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)], name="convs")


def test_ops_tensorflow_fuses_are_placed_together_and_run_there():
    """Grappler fuses Conv2D + BiasAdd in float32 into one kernel
    on the Conv2D's device: placed apart, the BiasAdd ran elsewhere than placed. Each
    fusion found is now one colocation group, placed and run on one device."""
    x = np.random.RandomState(0).randn(4, 8, 8, 3).astype(np.float32)
    y = np.arange(4, dtype=np.int32) % 5
    model = _conv_net()
    cluster = make_cluster(DEVICES, ka.test_cost_model(), share_cores=False)
    p = fddps.place(model, cluster, loss=keras.losses.SparseCategoricalCrossentropy(True),
                    optimizer=keras.optimizers.SGD(0.1), batch=(x, y), algorithm="heft",
                    cost_model=ka.test_cost_model())
    groups = fusion_groups(p.graph_def)
    kinds = {tuple(p.ops.set_index("name").loc[g, "op_type"]) for g in groups}
    assert ("Conv2D", "BiasAdd") in kinds  # Grappler's remapper
    assert ("Conv2DBackpropFilter", "BiasAddGrad") in kinds  # oneDNN, after partitioning
    for group in groups:
        assert len({p.devices[name] for name in group}) == 1, group
    p.train_step(x, y)
    assert p.moved_ops() == []


def test_device_lists_name_what_is_wrong():
    model = _conv_net()
    x, y = np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int32)
    kw = dict(loss=keras.losses.SparseCategoricalCrossentropy(True), optimizer="sgd",
              batch=(x, y), algorithm="heft")
    with pytest.raises(ClusterError, match="the device list is empty"):
        fddps.place(model, [], **kw)
    with pytest.raises(ClusterError, match=r"'/device:CPU:5' names no device.*CPU:1"):
        fddps.place(model, ["/device:CPU:0", "/device:CPU:5"], **kw)
    with pytest.raises(ClusterError, match="'/device:GPU:0' names no device"):
        fddps.place(model, ["/device:GPU:0"], **kw)

    @tf.function
    def step(a):
        return a * 2.0

    with pytest.raises(ClusterError, match="'/device:CPU:9' names no device"):
        fddps.place(step, ["/device:CPU:9"], (x,))


def test_a_wrong_input_shape_names_the_input_and_both_shapes():
    model = _conv_net()
    x, y = np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int32)
    p = fddps.place(model, DEVICES[:1], loss=keras.losses.SparseCategoricalCrossentropy(True),
                    optimizer="sgd", batch=(x, y))
    with pytest.raises(FddpsError, match=r"x of the placed step has shape \[2, 9, 9, 3\], "
                                         r"but the step was placed for shape \[2, 8, 8, 3\]"):
        p.train_step(np.zeros((2, 9, 9, 3), np.float32), y)
    with pytest.raises(FddpsError, match=r"y of the placed step has shape \[3\]"):
        p.train_step(x, np.zeros(3, np.int32))
