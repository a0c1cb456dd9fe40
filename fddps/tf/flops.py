"""FLOP counts of TensorFlow ops from static shapes already read: :func:`node_flops`.

TensorFlow registers a ``"flops"`` statistic for 46 op types
(``tensorflow/python/profiler/internal/flops_registry.py`` and ``nn_ops.py``).
Each looks its tensors up in a ``tf.Graph`` by name, builds a ``TensorShape``
per tensor and goes through a deprecation wrapper: on VGG-16's training step
that was a fifth of reading the graph. :data:`FLOPS_RULES` gives the same
counts from the shapes :func:`fddps.tf.graphdef.analyse` has already read,
formula for formula, quirks included (so placements do not move):

- a shape that is not fully known, or a control input where a tensor is
  expected, gives no count (TensorFlow raises);
- convolution, pooling and their gradients count only in NHWC (NCHW raises);
- ``AddN`` counts every input of the NodeDef, control inputs too;
- ``BatchMatMul*`` reads ``transpose_a`` (the ops' attribute is ``adj_x``,
  so it is always False);
- ``Conv2DBackprop*`` divide, so their counts are floats.

A test compares every node of real training steps with TensorFlow's own.

Example
-------
>>> from tensorflow.core.framework import node_def_pb2
>>> node = node_def_pb2.NodeDef(name="y", op="MatMul", input=["a", "b"])
>>> shapes = {"a": (8, 16), "b": (16, 4)}
>>> node_flops(node, (8, 4), shapes.get)
1024
"""

from __future__ import annotations

import math


def _known(dims):
    """Whether ``dims`` (a tuple with None for unknown dims, or None) is fully known."""
    return dims is not None and all(d is not None for d in dims)


class _Unknown(Exception):
    """A shape the count needs is not fully known (TensorFlow's ``assert_is_fully_defined``)."""


def _shape(dims):
    if not _known(dims):
        raise _Unknown
    return dims


def _nhwc(node):
    attr = node.attr.get("data_format")
    if attr is None or attr.s != b"NHWC":
        raise _Unknown  # TensorFlow counts convolutions and pooling in NHWC only


def _ints(node, name):
    attr = node.attr.get(name)
    return [] if attr is None else list(attr.list.i)


def _flag(node, name):
    attr = node.attr.get(name)
    return False if attr is None else attr.b


def _unary(per_element=1):
    return lambda node, out, inp: math.prod(_shape(inp(0))) * per_element


def _elementwise(per_element=1):
    return lambda node, out, inp: math.prod(_shape(out)) * per_element


def _reduction(reduce_flops=1, finalize_flops=0):
    def count(node, out, inp):
        n_in = math.prod(_shape(inp(0)))
        return n_in * reduce_flops + math.prod(_shape(out)) * (finalize_flops - reduce_flops)
    return count


def _l2_loss(node, out, inp):
    return math.prod(_shape(inp(0))) * 3 - 1


def _pool(node, out, inp):
    _nhwc(node)
    return math.prod(_ints(node, "ksize")) * math.prod(_shape(out))


def _avg_pool_grad(node, out, inp):
    _nhwc(node)
    return math.prod(_ints(node, "ksize")) * math.prod(_shape(inp(1))) * 2


def _max_pool_grad(node, out, inp):
    _nhwc(node)
    orig_out = math.prod(_shape(inp(1)))
    return math.prod(_ints(node, "ksize")) * orig_out + orig_out


def _conv_backprop(image, kernel):
    """Conv2DBackpropInput (image = its output, kernel = input 1) and
    Conv2DBackpropFilter (image = input 0, kernel = its output)."""
    def count(node, out, inp):
        _nhwc(node)
        image_dims = _shape(out if image == "out" else inp(image))
        kernel_dims = _shape(out if kernel == "out" else inp(kernel))
        strides = _ints(node, "strides")
        if len(strides) < 3 or not image_dims:
            raise _Unknown  # TensorFlow raises an IndexError
        return (2 * math.prod(image_dims) * math.prod(kernel_dims)
                / (image_dims[-1] * strides[1] * strides[2]))
    return count


def _add_n(node, out, inp):
    if not node.input:
        return 0
    return math.prod(_shape(inp(0))) * (len(node.input) - 1)


def _matmul(rows_axis, inner_axis):
    """MatMul (axes 0, 1 of ``a``) and BatchMatMul* (its last two): ``a``'s inner
    dimension, at ``rows_axis`` where ``transpose_a`` is set, times the output's size."""
    def count(node, out, inp):
        a = _shape(inp(0))
        if len(a) < 2:
            raise _Unknown
        k = a[rows_axis] if _flag(node, "transpose_a") else a[inner_axis]
        return k * math.prod(_shape(out)) * 2
    return count


def _conv(window_dims, with_depth):
    """Conv2D/Conv3D (window dims of the filter, then its input depth) and
    DepthwiseConv2dNative/Dilation2D (window only)."""
    def count(node, out, inp):
        _shape(inp(0))
        f = _shape(inp(1))
        if len(f) < window_dims + with_depth:
            raise _Unknown
        return math.prod(_shape(out)) * math.prod(f[:window_dims + with_depth]) * 2
    return count


def _bias_add(node, out, inp):
    return math.prod(_shape(inp(0)))


# op type -> count(node, output dims, input(k) -> dims of the node's k-th input)
FLOPS_RULES = {
    **dict.fromkeys(["Reciprocal", "Square", "Log", "Neg", "AssignSub", "AssignAdd"], _unary()),
    "Rsqrt": _unary(2),
    "Softmax": _unary(5),
    "L2Loss": _l2_loss,
    **dict.fromkeys(["Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Pow",
                     "GreaterEqual", "Greater", "LessEqual", "Less", "Equal", "NotEqual"],
                    _elementwise()),
    "RsqrtGrad": _elementwise(4),
    "SquaredDifference": _elementwise(2),
    "Mean": _reduction(1, 1),
    **dict.fromkeys(["Sum", "ArgMax", "ArgMin", "BiasAddGrad"], _reduction(1, 0)),
    "AvgPool": _pool,
    "MaxPool": _pool,
    "AvgPoolGrad": _avg_pool_grad,
    "MaxPoolGrad": _max_pool_grad,
    "Conv2DBackpropInput": _conv_backprop("out", 1),
    "Conv2DBackpropFilter": _conv_backprop(0, "out"),
    "AddN": _add_n,
    "MatMul": _matmul(0, 1),
    **dict.fromkeys(["BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"], _matmul(-2, -1)),
    "Conv2D": _conv(2, 1),  # NHWC or not: TensorFlow does not check
    "Conv3D": _conv(3, 1),
    "DepthwiseConv2dNative": _conv(2, 0),
    "Dilation2D": _conv(2, 0),
    "BiasAdd": _bias_add,
}


def node_flops(node, out_dims, input_dims):
    """TensorFlow's ``"flops"`` statistic of ``node``, from static shapes.

    Parameters
    ----------
    node : NodeDef
        The op (its type, attributes and input strings).
    out_dims : tuple or None
        Dims of the node's output 0 (None for an unknown dim), or None for an
        unknown rank.
    input_dims : callable
        ``input_dims(s)``: the dims, as ``out_dims``, of the tensor the input
        string ``s`` (``"x"``, ``"x:1"``) names; None where unknown.

    Returns
    -------
    int, float or None
        The count, or None where TensorFlow's statistic would raise (a shape
        not fully known, a layout it does not count) or the op type has no
        rule in :data:`FLOPS_RULES`.
    """
    rule = FLOPS_RULES.get(node.op)
    if rule is None:
        return None

    def inp(k):
        if k >= len(node.input) or node.input[k].startswith("^"):
            return None
        return input_dims(node.input[k])

    try:
        return rule(node, out_dims, inp)
    except (_Unknown, ZeroDivisionError):  # TensorFlow raises (a zero extent or stride divides)
        return None
