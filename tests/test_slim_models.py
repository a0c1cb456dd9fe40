"""Tests of slim_models: the six training graphs build, run one step on CPU,
match their reference parameter counts, and are deterministic.

Kept small for a 2-core machine: CIFAR size (32x32, 10 classes), batch 2.
ImageNet-size checks build only the forward pass and run nothing. NASNet-A
Large's one-step check uses 6 cells instead of 18 (same cell machinery); the
full-size step is measured by ``experiments/model_table.py``.
"""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import slim_models  # noqa: E402
from slim_models import nasnet  # noqa: E402

v1 = tf.compat.v1


def _session(graph, grappler=True):
    cfg = v1.ConfigProto(intra_op_parallelism_threads=2,
                         inter_op_parallelism_threads=2)
    if not grappler:
        # Grappler's first pass over a 20-40k-node graph costs more than the
        # step itself on 2 cores; the step's kernels are the same.
        cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    return v1.Session(graph=graph, config=cfg)


def test_interface():
    assert slim_models.MODELS == ("vgg16", "inception_v3", "resnet50",
                                  "resnet200", "pnasnet_mobile",
                                  "nasnet_large")
    assert slim_models.dataset_preset("cifar10") == (32, 10)
    assert slim_models.dataset_preset("imagenet") == (None, 1000)
    assert slim_models.dataset_preset("imagenet", "nasnet_large") == (331, 1000)
    with pytest.raises(ValueError):
        slim_models.build_training_graph("lenet", 2)

    m = slim_models.build_training_graph("vgg16", batch_size=2,
                                         dataset="cifar10", seed=0)
    assert (m.name, m.batch_size, m.image_size, m.num_classes) == (
        "vgg16", 2, 32, 10)
    assert isinstance(m.graph, tf.Graph)
    assert m.graph is not v1.get_default_graph()
    assert isinstance(m.graph_def, v1.GraphDef)
    assert m.images.shape.as_list() == [2, 32, 32, 3]
    assert m.images.dtype == tf.float32
    assert m.labels.shape.as_list() == [2]
    assert m.loss.shape.ndims == 0
    assert isinstance(m.train_op, tf.Operation)
    assert isinstance(m.init_op, tf.Operation)
    assert m.feed_dict() == {}
    # Resource variables only, and a MomentumOptimizer step.
    ops = {n.op for n in m.graph_def.node}
    assert "VarHandleOp" in ops and "ResourceApplyMomentum" in ops
    assert not ops & {"VariableV2", "Variable", "ApplyMomentum"}
    names = {n.name for n in m.graph_def.node}
    assert {m.images.op.name, m.labels.op.name, m.train_op.name} <= names
    size = slim_models.graph_size(m.graph_def)
    assert size["nodes"] == len(m.graph_def.node)
    assert size["edges"] == size["data_edges"] + size["control_edges"]
    step = slim_models.step_graph_def(m)
    assert 0 < len(step.node) < len(m.graph_def.node)


# Counts pinned down exactly by the layer shapes (see the model modules):
# Keras' trainable counts for VGG16, InceptionV3 and NASNetLarge (keras
# 3.15.1), torchvision's for ResNet-50.
EXACT = {"vgg16": 138_357_544, "inception_v3": 23_817_352,
         "resnet50": 25_557_032, "nasnet_large": 88_753_150}


@pytest.mark.parametrize("name,options", [
    ("vgg16", {}),
    ("inception_v3", {"aux_head": False}),
    ("resnet50", {}),
    pytest.param("resnet200", {}, marks=pytest.mark.slow),
    pytest.param("pnasnet_mobile", {"aux_head": False},
                 marks=pytest.mark.slow),
    pytest.param("nasnet_large", {"aux_head": False},
                 marks=pytest.mark.slow),
])
def test_imagenet_parameter_count_within_2_percent(name, options):
    """Build-only (forward pass, nothing run) at ImageNet size."""
    count = slim_models.model_parameter_count(name, **options)
    ref = slim_models.SPECS[name].reference_params
    assert abs(count - ref) <= 0.02 * ref, (name, count, ref)
    if name in EXACT:
        assert count == EXACT[name]


def test_inception_aux_head_parameters():
    # 23,817,352 without the head (checked above) + 3,325,800 for it.
    assert slim_models.model_parameter_count("inception_v3") == 27_143_152


# One step at CIFAR size, batch 2. NASNet-A Large with 6 cells (2 per stack)
# keeps the test short; everything else is the full network. The three big
# graphs run without Grappler (see _session).
ONE_STEP = [
    ("vgg16", {}),
    ("inception_v3", {}),
    ("resnet50", {}),
    pytest.param("resnet200", {}, marks=pytest.mark.slow),
    pytest.param("pnasnet_mobile", {}, marks=pytest.mark.slow),
    pytest.param("nasnet_large", {"num_cells": 6}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,options", ONE_STEP)
def test_one_training_step_on_cpu(name, options):
    m = slim_models.build_training_graph(name, batch_size=2,
                                         dataset="cifar10", seed=0,
                                         **options)
    assert m.logits.shape.as_list() == [2, 10]
    big = name in ("resnet200", "pnasnet_mobile", "nasnet_large")
    with _session(m.graph, grappler=not big) as sess:
        sess.run(m.init_op)
        before = sess.run(m.global_step)
        _, loss = sess.run([m.train_op, m.loss])
        assert np.isfinite(loss) and loss > 0
        assert sess.run(m.global_step) == before + 1


def test_loss_decreases_on_fixed_batch():
    m = slim_models.build_training_graph("vgg16", batch_size=2,
                                         dataset="cifar10", seed=0)
    with _session(m.graph) as sess:
        sess.run(m.init_op)
        first_images = sess.run(m.images)
        losses = [sess.run([m.train_op, m.loss])[1] for _ in range(4)]
        # The batch is the same tensor values on every step.
        np.testing.assert_array_equal(first_images, sess.run(m.images))
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


def test_same_arguments_same_graph_def_and_values():
    kwargs = dict(batch_size=2, dataset="cifar10", seed=3, num_cells=3)
    a = slim_models.build_training_graph("pnasnet_mobile", **kwargs)
    b = slim_models.build_training_graph("pnasnet_mobile", **kwargs)
    assert (a.graph_def.SerializeToString(deterministic=True)
            == b.graph_def.SerializeToString(deterministic=True))
    results = []
    for m in (a, b):
        with _session(m.graph, grappler=False) as sess:
            sess.run(m.init_op)
            images, labels = sess.run([m.images, m.labels])
            loss = sess.run(m.loss)
            results.append((images, labels, loss))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2]
    assert 0 <= results[0][1].min() and results[0][1].max() < 10


def test_seed_changes_data():
    a = slim_models.build_training_graph("vgg16", 2, dataset="cifar10", seed=0)
    b = slim_models.build_training_graph("vgg16", 2, dataset="cifar10", seed=1)
    with _session(a.graph) as sa, _session(b.graph) as sb:
        assert not np.array_equal(sa.run(a.images), sb.run(b.images))


def test_nasnet_cell_wiring():
    """The cell specs are TF-Slim's, and the reductions land where Slim's
    rule puts them."""
    assert nasnet.calc_reduction_layers(18, 2) == [6, 12]
    assert nasnet.calc_reduction_layers(9, 2) == [3, 6]
    for ops, used, idx in (nasnet.NASNET_A_NORMAL, nasnet.NASNET_A_REDUCTION,
                           nasnet.PNASNET_5):
        assert len(ops) == len(idx) == 10 and len(used) == 7
        # Combination k may only read states built before it.
        assert all(i < 2 + k // 2 for k, i in enumerate(idx))
