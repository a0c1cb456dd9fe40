"""A GraphDef computed in float64: :func:`as_float64`, to check a rewrite exactly.

A strategy's rewrite changes the order of float sums (partial sums over
channel parts, batch-norm statistics and gradients summed over sample
parts). In float32 a training step of a batch-norm network at a small batch
amplifies such rounding without bound: one float32 ulp at the input moves
some momentum slots of ResNet-50 by ten times their size, because a ReLU
whose input is within rounding of zero switches and changes its gradient by
a whole term. There, comparing the rewrite with the original in float32
cannot tell a correct rewrite from a slightly wrong one.

In float64 the same step's rounding is about 1e-16 instead of 6e-8: the
chance that a ReLU input lies within rounding of zero shrinks by nine orders
of magnitude, and the step is smooth again. So the original and its rewrite,
both converted by :func:`as_float64`, must agree to many more digits than any
mistake (a wrong halo, a missing part, a statistic over the wrong rows) could
hide in. The conversion is the same for both graphs and is itself tested
against TensorFlow's float32 kernels.

What changes: every ``DT_FLOAT`` in a node's attributes (``T``, ``dtype``,
``DstT``, type lists) becomes ``DT_DOUBLE``, and float ``Const`` values are
widened. ``FusedBatchNormV3`` / ``FusedBatchNormGradV3`` (and their V2
forms), which have no float64 kernel, become the same arithmetic written
with element-wise ops and reductions, behind an ``IdentityN`` of the op's
name, so every consumer, control input and fetch still finds its tensor.
Their reserve spaces carry the batch mean and the biased batch variance, as
the CPU kernels' do. This arithmetic is written here on its own, not shared
with the rewrite's synchronised batch norm
(:func:`fddps.tf.strategy_rewrite._write_batch_norm`): a check should not
reuse what it checks.

Example
-------
>>> import numpy as np
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.constant(np.arange(24.0).reshape(2, 2, 2, 3), tf.float32, name="x")
...     y = tf.raw_ops.FusedBatchNormV3(x=x, scale=tf.ones([3]), offset=tf.zeros([3]),
...                                     mean=tf.zeros([0]), variance=tf.zeros([0]),
...                                     is_training=True, name="bn")
>>> gd = as_float64(g.as_graph_def())
>>> with tf.compat.v1.Session(graph=tf.Graph()) as sess:
...     _ = tf.graph_util.import_graph_def(gd, name="")
...     out = sess.run("bn:0")
>>> out.dtype, round(float(out.std()), 3)
(dtype('float64'), 1.0)
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .graphdef import _tf, const_node, load_graph

#: Op types without a float64 CPU kernel that :func:`as_float64` writes out.
BATCH_NORMS = ("FusedBatchNormV3", "FusedBatchNormV2", "FusedBatchNorm")
BATCH_NORM_GRADS = ("FusedBatchNormGradV3", "FusedBatchNormGradV2", "FusedBatchNormGrad")


def as_float64(graph_def):
    """``graph_def`` with every float32 tensor computed in float64.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path
        As :func:`fddps.tf.load_graph` reads it. Not modified.

    Returns
    -------
    tf.compat.v1.GraphDef
        Same node names, devices and edges; float32 attributes and constants
        widened; fused batch norms (forward and gradient) written as
        element-wise ops and reductions behind an ``IdentityN`` named as the
        op.

    Raises
    ------
    GraphError
        A fused batch norm in a layout other than NHWC or NCHW, or one whose
        ``exponential_avg_factor`` is not 1 in training (the node is named);
        input that is not a graph.
    """
    tf = _tf()
    if not isinstance(graph_def, tf.compat.v1.GraphDef):
        graph_def, _ = load_graph(graph_def)
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        new = tf.compat.v1.NodeDef()
        new.CopyFrom(node)
        _widen(new)
        if node.op in BATCH_NORMS:
            out.node.extend(_BatchNormWriter(new).forward())
        elif node.op in BATCH_NORM_GRADS:
            out.node.extend(_BatchNormWriter(new).backward())
        else:
            out.node.append(new)
    return out


def _widen(node):
    """Every DT_FLOAT of ``node``'s attributes and float constant values, in place."""
    tf = _tf()
    f32, f64 = tf.float32.as_datatype_enum, tf.float64.as_datatype_enum
    for key, value in node.attr.items():
        kind = value.WhichOneof("value")
        if kind == "type" and value.type == f32:
            value.type = f64
        elif kind == "list" and value.list.type:
            types = [f64 if t == f32 else t for t in value.list.type]
            del value.list.type[:]
            value.list.type.extend(types)
        elif kind == "tensor" and value.tensor.dtype == f32:
            array = tf.make_ndarray(value.tensor).astype(np.float64)
            value.tensor.CopyFrom(tf.make_tensor_proto(array, tf.float64, array.shape))


class _BatchNormWriter:
    """The nodes replacing one fused batch norm (forward or gradient) by its arithmetic."""

    def __init__(self, node):
        self.node = node
        self.nodes = []
        fmt = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
        if fmt not in ("NHWC", "NCHW"):
            raise GraphError(f"{node.name}: as_float64 writes {node.op} in NHWC or NCHW only, "
                             f"not {fmt}")
        self.nchw = fmt == "NCHW"
        self.axes = [0, 2, 3] if self.nchw else [0, 1, 2]
        self.eps = node.attr["epsilon"].f if "epsilon" in node.attr else 1e-4
        self.training = node.attr["is_training"].b if "is_training" in node.attr else True
        self.controls = [i for i in node.input if i.startswith("^")]
        self.data = [i for i in node.input if not i.startswith("^")]

    # -- node builders ---------------------------------------------------------------
    def _add(self, suffix, op, inputs, typed=True, **attrs):
        """A node ``op`` of ``inputs``; ``typed``: its ``T`` is float64 (``Cast`` has none)."""
        tf = _tf()
        n = tf.compat.v1.NodeDef(name=f"{self.node.name}/fddps_f64/{suffix}", op=op,
                                 device=self.node.device)
        n.input.extend(list(inputs) + self.controls)
        if typed:
            n.attr["T"].type = tf.float64.as_datatype_enum
        for key, value in attrs.items():
            if isinstance(value, bool):
                n.attr[key].b = value
            else:
                n.attr[key].type = value.as_datatype_enum
        self.nodes.append(n)
        return n.name

    def _const(self, suffix, value, dtype=None):
        node = const_node(f"{self.node.name}/fddps_f64/{suffix}", value,
                          dtype or _tf().float64, self.node.device)
        self.nodes.append(node)
        return node.name

    def _binary(self, suffix, op, a, b):
        return self._add(suffix, op, [a, b])

    def _channel_sum(self, suffix, x):
        tf = _tf()
        axes = self._const(f"{suffix}/axes", self.axes, tf.int32)
        return self._add(suffix, "Sum", [x, axes], Tidx=tf.int32, keep_dims=False)

    def _per_channel(self, suffix, vec):
        """A per-channel vector shaped to broadcast against x (``[C, 1, 1]`` in NCHW)."""
        if not self.nchw:
            return vec
        tf = _tf()
        shape = self._const(f"{suffix}/shape", [-1, 1, 1], tf.int32)
        return self._add(suffix, "Reshape", [vec, shape], Tshape=tf.int32)

    def _count(self, x, vec):
        """Elements per channel, as a float64 scalar: size(x) / size(vec)."""
        tf = _tf()
        sizes = [self._add(f"count/size_{k}", "Size", [t], out_type=tf.int32)
                 for k, t in enumerate((x, vec))]
        floats = [self._add(f"count/float_{k}", "Cast", [s], typed=False, SrcT=tf.int32,
                            DstT=tf.float64, Truncate=False) for k, s in enumerate(sizes)]
        return self._binary("count", "RealDiv", *floats)

    def _identity_n(self, outputs):
        tf = _tf()
        n = tf.compat.v1.NodeDef(name=self.node.name, op="IdentityN", device=self.node.device)
        n.input.extend(outputs + self.controls)
        n.attr["T"].list.type.extend([tf.float64.as_datatype_enum] * len(outputs))
        self.nodes.append(n)
        return self.nodes

    def _empty(self, k):
        return self._const(f"empty_{k}", np.zeros((0,)))

    # -- the two ops -----------------------------------------------------------------
    def forward(self):
        """``FusedBatchNorm*(x, scale, offset, mean, variance)``: y, the batch (or given)
        mean, the Bessel-corrected variance, then mean and biased variance (reserve
        spaces), and for V3 an empty third reserve space."""
        x, scale, offset, mean_in, var_in = self.data[:5]
        factor = self.node.attr["exponential_avg_factor"].f \
            if "exponential_avg_factor" in self.node.attr else 1.0
        if self.training:
            if factor != 1.0:
                raise GraphError(f"{self.node.name}: as_float64 writes training batch norms with "
                                 f"exponential_avg_factor 1 only, not {factor}")
            n = self._count(x, scale)
            mean = self._binary("mean", "RealDiv", self._channel_sum("sum", x), n)
            centred = self._binary("centred", "Sub", x, self._per_channel("mean_bc", mean))
            sq = self._add("square", "Square", [centred])
            sqsum = self._channel_sum("sqsum", sq)
            var = self._binary("var", "RealDiv", sqsum, n)
            one = self._const("one", 1.0)
            less = self._binary("count_less_one", "Maximum",
                                self._binary("count_minus_one", "Sub", n, one), one)
            unbiased = self._binary("var_unbiased", "RealDiv", sqsum, less)
            stats = [mean, unbiased, mean, var]
        else:
            mean, var = mean_in, var_in
            centred = self._binary("centred", "Sub", x, self._per_channel("mean_bc", mean))
            stats = [mean_in, var_in, mean_in, var_in]
        inv = self._add("inv", "Rsqrt", [self._binary("var_eps", "AddV2", var,
                                                      self._const("eps", self.eps))])
        gain = self._per_channel("gain_bc", self._binary("gain", "Mul", scale, inv))
        y = self._binary("y", "AddV2", self._binary("scaled", "Mul", centred, gain),
                         self._per_channel("offset_bc", offset))
        outputs = [y] + stats
        if self.node.op == "FusedBatchNormV3":
            outputs.append(self._empty(5))
        return self._identity_n(outputs)

    def backward(self):
        """``FusedBatchNormGrad*(dy, x, scale, reserve_1, reserve_2[, reserve_3])``:
        dx, scale's and offset's gradients, two empty reserve spaces."""
        dy, x, scale, mean, var = self.data[:5]
        inv = self._add("inv", "Rsqrt", [self._binary("var_eps", "AddV2", var,
                                                      self._const("eps", self.eps))])
        centred = self._binary("centred", "Sub", x, self._per_channel("mean_bc", mean))
        xhat = self._binary("xhat", "Mul", centred, self._per_channel("inv_bc", inv))
        dy_sum = self._channel_sum("dy_sum", dy)
        dy_xhat_sum = self._channel_sum("dy_xhat_sum", self._binary("dy_xhat", "Mul", dy, xhat))
        gain = self._per_channel("gain_bc", self._binary("gain", "Mul", scale, inv))
        if self.training:
            n = self._count(x, scale)
            mean_dy = self._binary("mean_dy", "RealDiv", dy_sum, n)
            mean_dy_xhat = self._binary("mean_dy_xhat", "RealDiv", dy_xhat_sum, n)
            inner = self._binary("dy_centred", "Sub", dy, self._per_channel("mean_dy_bc", mean_dy))
            inner = self._binary("inner", "Sub", inner, self._binary(
                "xhat_term", "Mul", xhat, self._per_channel("mean_dy_xhat_bc", mean_dy_xhat)))
            dx = self._binary("dx", "Mul", inner, gain)
        else:
            dx = self._binary("dx", "Mul", dy, gain)
        return self._identity_n([dx, dy_xhat_sum, dy_sum, self._empty(3), self._empty(4)])
