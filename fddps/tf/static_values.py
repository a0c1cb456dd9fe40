"""Static values read from a TensorFlow graph: node attributes, shape-vector inputs.

What the readers of a graph (:mod:`fddps.tf.graphdef`, the split and strategy
rewrites) need to know without running it.
"""

from __future__ import annotations

import numpy as np

from .tfimport import _tf

#: Op types whose output is a shape vector TensorFlow computes from a tensor's shape.
SHAPE_OPS = frozenset({"Shape", "ShapeN"})


def node_attrs(node_def, keys) -> dict:
    """The attributes ``keys`` of a NodeDef as Python values (bytes -> str, bool, int, float).

    Attributes the node does not set are left out (a rule then takes its default).
    """
    out = {}
    for key in keys:
        if key not in node_def.attr:
            continue
        a = node_def.attr[key]
        kind = a.WhichOneof("value")
        if kind == "s":
            out[key] = a.s.decode()
        elif kind in ("b", "i", "f"):
            out[key] = getattr(a, kind)
    return out


def shape_input_value(op, index):
    """The static value of ``op``'s shape-vector input ``index`` as a list of ints, or None.

    Uses TensorFlow's constant folding (``tf.get_static_value``), and, for a
    ``Shape``/``ShapeN`` producer (what ``tf.gradients`` emits), the fully
    known static shape of the tensor it measures; a ``ConcatOffset`` (the
    ``ConcatV2`` gradient's slice begins) or ``FloorMod`` of static inputs, computed.
    """
    tensor = op.inputs[index]
    value = _tf().get_static_value(tensor)
    if value is not None:
        return [int(v) for v in np.ravel(value)]
    producer = tensor.op
    if producer.type in SHAPE_OPS:
        shape = producer.inputs[tensor.value_index].shape
        if shape.is_fully_defined():
            return [int(d) for d in shape.as_list()]
    if producer.type == "ConcatOffset":
        return _concat_offset(producer, tensor.value_index)
    if producer.type == "FloorMod":  # the ConcatV2 gradient's axis % rank
        a, b = shape_input_value(producer, 0), shape_input_value(producer, 1)
        if a is not None and b is not None and len(b) in (1, len(a)) and all(b):
            return [x % m for x, m in zip(a, b if len(b) == len(a) else b * len(a))]
    return None


def _concat_offset(op, k):
    """Output ``k`` of a ``ConcatOffset`` (the ``ConcatV2`` gradient's slice begins) from its
    static axis and shapes: input ``k``'s offset along the axis, 0 elsewhere; None if
    any of them is not static."""
    axis = shape_input_value(op, 0)
    shapes = [shape_input_value(op, j) for j in range(1, k + 2)]
    if axis is None or any(s is None for s in shapes):
        return None
    rank = len(shapes[-1])
    offset = [0] * rank
    offset[axis[0] % rank] = sum(s[axis[0] % rank] for s in shapes[:-1])
    return offset
