"""fddps.tf.flops: the same FLOP counts as TensorFlow's registered statistics, node for node."""

import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.framework import ops as tf_ops  # noqa: E402

import slim_models  # noqa: E402
from fddps.tf.flops import FLOPS_RULES, node_flops  # noqa: E402
from fddps.tf.graphdef import analyse  # noqa: E402

v1 = tf.compat.v1


def _tensorflows_count(graph, node):
    try:
        return tf_ops.get_stats_for_node_def(graph, node, "flops").value
    except Exception:  # noqa: BLE001 - TF's statistics raise where they cannot count
        return None


def _assert_counts_equal_tensorflows(graph_def, fetches=None):
    """Every node's FLOPs in the analysis equal TensorFlow's statistic (known or not)."""
    analysis = analyse(graph_def, fetches=fetches)
    graph = analysis.graph
    table = analysis.table
    seen = set()
    for i, node in enumerate(analysis.graph_def.node):
        if node.op not in FLOPS_RULES or not analysis.analysed[i]:
            continue
        expected = _tensorflows_count(graph, node)
        assert bool(table["flops_known"][i]) == (expected is not None), node.name
        if expected is not None:
            assert table["flops"][i] == float(expected), (node.name, node.op)
            seen.add(node.op)
    return seen


def _every_rule_graph():
    """One graph with an op of every type that has a rule, gradients included, and
    the cases TensorFlow cannot count (unknown shapes, NCHW)."""
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [4, 8, 8, 3], name="x")
        w = v1.get_variable("w", [3, 3, 3, 6])
        y = tf.nn.conv2d(x, w, [1, 2, 2, 1], "SAME", name="conv")
        y = tf.nn.bias_add(y, v1.get_variable("b", [6]), name="bias")
        d = tf.nn.depthwise_conv2d(y, v1.get_variable("dw", [3, 3, 6, 1]), [1, 1, 1, 1], "SAME")
        p = tf.nn.max_pool2d(d, 2, 2, "VALID", name="maxpool")
        q = tf.nn.avg_pool2d(y, 2, 2, "VALID", name="avgpool")
        h = tf.reshape(p + q, [4, -1])
        z = tf.matmul(h, v1.get_variable("fc", [24, 5]), name="fc")
        logits = tf.nn.softmax(z, name="softmax")
        r = tf.math.reciprocal(logits + 1.0) - tf.math.rsqrt(tf.square(logits) + 1.0)
        r = tf.maximum(r, tf.minimum(r, tf.math.log(tf.abs(r) + 1.0))) * -r
        r = r / 2.0 + tf.pow(r, 2.0) + tf.math.squared_difference(r, 1.0)
        flags = tf.cast(r > 0, tf.float32) + tf.cast(r >= 0, tf.float32) + \
            tf.cast(r < 0, tf.float32) + tf.cast(r <= 0, tf.float32) + \
            tf.cast(tf.equal(r, 0), tf.float32) + tf.cast(tf.not_equal(r, 0), tf.float32)
        am = tf.cast(tf.argmax(r, 1) + tf.argmin(r, 1), tf.float32)
        bm = tf.matmul(tf.reshape(r, [1, 4, 5]), tf.ones([1, 5, 2]), adjoint_a=False)
        bt = tf.linalg.matmul(tf.ones([2, 3, 4]), tf.ones([2, 3, 4]), transpose_a=True)
        loss = (tf.reduce_mean(tf.raw_ops.Add(x=r, y=r)) + tf.reduce_sum(flags) + tf.nn.l2_loss(z)
                + tf.reduce_sum(am) + tf.reduce_sum(bm) + tf.reduce_sum(bt))
        counter = v1.Variable(0.0, trainable=False, use_resource=False, name="count")
        with tf.control_dependencies([v1.assign_add(counter, 1.0), v1.assign_sub(counter, 0.5)]):
            loss = tf.identity(loss, name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        # Counts TensorFlow refuses: an unknown batch, an NCHW pooling.
        u = v1.placeholder(tf.float32, [None, 5], name="u")
        tf.matmul(u, tf.ones([5, 2]), name="unknown_matmul")
        tf.add_n([u, u], name="unknown_addn")
        c = v1.placeholder(tf.float32, [1, 3, 8, 8], name="c")
        tf.raw_ops.MaxPool(input=c, ksize=[1, 1, 2, 2], strides=[1, 1, 2, 2], padding="VALID",
                           data_format="NCHW", name="nchw_pool")
        dil = tf.nn.dilation2d(x, tf.ones([2, 2, 3]), [1, 1, 1, 1], "SAME", "NHWC",
                               [1, 1, 1, 1], name="dilation")
        tf.nn.conv3d(tf.ones([1, 4, 4, 4, 2]), tf.ones([2, 2, 2, 2, 3]), [1] * 5, "SAME",
                     name="conv3d")
        with tf.control_dependencies([dil]):
            tf.add_n([x, x, x], name="addn_with_control_input")
    return g.as_graph_def()


def test_every_rule_counts_as_tensorflow_counts():
    seen = _assert_counts_equal_tensorflows(_every_rule_graph())
    missing = set(FLOPS_RULES) - seen - {"BatchMatMul", "BatchMatMulV3"}  # old/new spellings
    assert not missing, missing


def test_the_rules_are_tensorflows_registered_ones():
    registry = tf_ops._stats_registry
    registered = {key.split(",")[0] for key in registry.list() if key.endswith(",flops")}
    assert set(FLOPS_RULES) == registered


@pytest.mark.parametrize("name", ["inception_v3", "pnasnet_mobile"])
def test_a_network_step_counts_as_tensorflow_counts(name):
    m = slim_models.build_training_graph(name, 2, dataset="cifar10")
    seen = _assert_counts_equal_tensorflows(m.graph_def, [m.train_op.name, m.loss.name])
    assert {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "AddN"} <= seen


def test_unknown_shapes_and_unsupported_layouts_give_no_count():
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name="y", op="MatMul", input=["a", "b"])
    assert node_flops(node, (None, 4), {"a": (None, 16), "b": (16, 4)}.get) is None
    assert node_flops(node, (8, 4), {}.get) is None
    node = node_def_pb2.NodeDef(name="p", op="MaxPool", input=["a"])
    assert node_flops(node, (1, 2, 2, 3), {"a": (1, 4, 4, 3)}.get) is None  # no data_format
    node = node_def_pb2.NodeDef(name="s", op="Shape", input=["a"])
    assert node_flops(node, (4,), {"a": (1, 4, 4, 3)}.get) is None  # no rule
