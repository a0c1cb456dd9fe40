"""Read a TensorFlow GraphDef as the strategy layer's :class:`~fddps.strategy.graph.StepGraph`.

Example
-------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.ones([8, 16], name="x")
...     y = tf.nn.relu(tf.matmul(x, tf.ones([16, 4])), name="y")
>>> step = step_graph(g, fetches=["y"])
>>> step.ops["y"].input_shapes, step.batch_size
(((8, 4),), 8)
"""

from __future__ import annotations

import numpy as np

from ..strategy.graph import OpInfo, StepGraph
from .graphdef import VARIABLE_OPS, _parse_input, _tf, analyse
from .static_values import node_attrs, shape_input_value
from .structure import analysed_step
from .variable_shards import handle_blockers

#: Attributes op descriptions test.
DESCRIBED_ATTRS = ("data_format", "transpose_a", "transpose_b", "is_training", "keep_dims",
                   "padding", "axis", "batch_dims", "begin_mask", "end_mask", "ellipsis_mask",
                   "new_axis_mask", "shrink_axis_mask", "adj_x", "adj_y")

#: Integer-list attributes of sliding windows (their halos: :class:`fddps.strategy.ops.Halo`).
WINDOW_ATTRS = ("strides", "ksize", "dilations", "explicit_paddings")


def _window_attrs(node) -> dict:
    return {k: tuple(node.attr[k].list.i) for k in WINDOW_ATTRS
            if k in node.attr and node.attr[k].WhichOneof("value") == "list"}

#: Integer inputs whose static value is read (axes, shapes, paddings), at most this many elements.
MAX_CONST_ELEMENTS = 16


def _shape(t, unknown_dim):
    """Static shape, an unknown dimension read as ``unknown_dim`` (as :func:`analyse` does):
    a tensor of unknown extent (``Unique``'s output in a sparse gradient) then has bytes,
    and no description splits an axis it cannot size."""
    if t.shape.rank is None:
        return None
    return tuple(unknown_dim if d is None else d for d in t.shape.as_list())


def _itemsize(dtype):
    base = dtype.base_dtype
    return 0 if base.name in ("resource", "variant", "string") else base.size


def step_graph(graph_def, fetches=None, unknown_dim: int = 1) -> StepGraph:
    """The ops one step runs (the fetches' ancestors; every node without ``fetches``).

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes, path or GraphAnalysis
    fetches : list of str, optional
    unknown_dim : int
        As for :func:`fddps.tf.graphdef.op_table`.

    Returns
    -------
    StepGraph
    """
    analysis = analyse(graph_def, unknown_dim)
    table = analysis.table
    keep = analysed_step(analysis, fetches)
    graph = analysis.graph
    ops = []
    names = {analysis.graph_def.node[i].name for i in np.flatnonzero(keep).tolist()}
    blockers = handle_blockers(analysis.graph_def, names)
    # The table's columns read once (a row read through pandas costs ~100 us).
    column = {c: table[c].tolist() for c in ("flops", "input_bytes", "output_bytes",
                                             "param_bytes", "colocation_group")}
    kernel_shapes = (table["kernel_shape"].tolist() if "kernel_shape" in table.columns
                     else [None] * len(table))
    for i in np.flatnonzero(keep).tolist():
        node = analysis.graph_def.node[i]
        op = graph.get_operation_by_name(node.name)
        data, control = [], []
        for s in node.input:
            name, port = _parse_input(s)
            (control if port < 0 else data).append(name if port < 0 else (name, port))
        consts = {}
        for k, t in enumerate(op.inputs):
            if t.dtype.base_dtype in (_tf().int32, _tf().int64) and t.shape.rank is not None \
                    and (t.shape.num_elements() or 0) <= MAX_CONST_ELEMENTS:
                value = shape_input_value(op, k)
                if value is not None:
                    consts[k] = tuple(value)
        param_shape = None
        if node.op in VARIABLE_OPS and "shape" in node.attr:
            param_shape = tuple(d.size for d in node.attr["shape"].shape.dim)
        tied = ("_class" in node.attr or node.op in VARIABLE_OPS
                or any(t.dtype.base_dtype.name == "resource" or t.dtype._is_ref_dtype
                       for t in op.inputs))
        ops.append(OpInfo(
            name=node.name, op_type=node.op, inputs=tuple(data), control_inputs=tuple(control),
            input_shapes=tuple(_shape(t, unknown_dim) for t in op.inputs),
            output_shapes=tuple(_shape(t, unknown_dim) for t in op.outputs),
            input_itemsizes=tuple(_itemsize(t.dtype) for t in op.inputs),
            output_itemsizes=tuple(_itemsize(t.dtype) for t in op.outputs),
            attrs={**node_attrs(node, DESCRIBED_ATTRS), **_window_attrs(node),
                   **({"unshardable": blockers[node.name]} if node.name in blockers else {})},
            const_values=consts,
            flops=float(column["flops"][i]), input_bytes=float(column["input_bytes"][i]),
            output_bytes=float(column["output_bytes"][i]),
            param_bytes=float(column["param_bytes"][i]), param_shape=param_shape,
            group=column["colocation_group"][i], tied=bool(tied),
            kernel_shape=kernel_shapes[i]))
    # Control inputs from outside the step (none when fetches cover them) are dropped.
    names = {op.name for op in ops}
    for op in ops:
        op.control_inputs = tuple(c for c in op.control_inputs if c in names)
    return StepGraph(ops)
