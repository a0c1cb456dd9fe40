"""What the strategy layer knows about a training step's ops: :class:`OpInfo`, :class:`StepGraph`.

TensorFlow-free: the TensorFlow adapter (:func:`fddps.tf.strategy_graph.step_graph`)
fills these from a GraphDef; tests may build them by hand.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class OpInfo:
    """One op of a step, with the facts splitting needs.

    Attributes
    ----------
    name, op_type : str
    inputs : tuple of (str, int)
        Producer op name and output port of each data input, in order.
    control_inputs : tuple of str
    input_shapes, output_shapes : tuple of tuple of int (None for an unknown shape or dim)
    input_itemsizes, output_itemsizes : tuple of int
        Bytes per element (0 for resource handles).
    attrs : dict
        The attributes descriptions test (``data_format``, ``transpose_a``, ...).
    const_values : dict of int -> tuple of int
        Static values of small integer inputs (axes, shapes, paddings).
    flops, input_bytes, output_bytes, param_bytes : float
        The whole op's row of the op table (its cost when it runs whole).
    param_shape : tuple of int, optional
        The variable's shape, for a variable op.
    group : str or None
        Colocation group; ``tied`` says whether the op itself is bound to it
        (a resource input or a ``_class`` attribute).
    kernel_shape : str or None
        The whole op's kernel shape as the GPU presets' kernel model reads it (the op
        table's ``kernel_shape``: an FP32 convolution's or MatMul's batch, channels,
        filter, stride, padding / M, N, K); None for other ops. A part's own:
        :func:`fddps.strategy.kernel_shape.part_kernel_shape`.
    """

    name: str
    op_type: str
    inputs: tuple = ()
    control_inputs: tuple = ()
    input_shapes: tuple = ()
    output_shapes: tuple = ()
    input_itemsizes: tuple = ()
    output_itemsizes: tuple = ()
    attrs: dict = field(default_factory=dict)
    const_values: dict = field(default_factory=dict)
    flops: float = 0.0
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    param_bytes: float = 0.0
    param_shape: tuple | None = None
    group: str | None = None
    tied: bool = False
    kernel_shape: str | None = None


class StepGraph:
    """The ops of one training step, by name, in a topological order.

    Parameters
    ----------
    ops : iterable of OpInfo
        Any order; inputs must name ops of the step.

    Raises
    ------
    ValueError
        If an input names an op that is not in the step, or the ops form a cycle.
    """

    def __init__(self, ops):
        ops = list(ops)
        by_name = {op.name: op for op in ops}
        indeg = {op.name: 0 for op in ops}
        users = {op.name: [] for op in ops}
        for op in ops:
            for src in [p for p, _ in op.inputs] + list(op.control_inputs):
                if src not in by_name:
                    raise ValueError(f"op {op.name!r} has input {src!r}, which is not in the step")
                indeg[op.name] += 1
                users[src].append(op.name)
        ready = [op.name for op in reversed(ops) if indeg[op.name] == 0]
        order = []
        while ready:
            name = ready.pop()
            order.append(name)
            for u in users[name]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    ready.append(u)
        if len(order) != len(ops):
            left = next(n for n, d in indeg.items() if d > 0)
            raise ValueError(f"the step's ops form a cycle through {left!r}")
        self.ops = {name: by_name[name] for name in order}

    def __len__(self):
        return len(self.ops)

    def __repr__(self):
        return f"StepGraph({len(self.ops)} ops)"

    @property
    def batch_size(self) -> int | None:
        """The sample count: the most common first-axis extent of convolution and MatMul inputs."""
        sizes = Counter(op.input_shapes[0][0] for op in self.ops.values()
                        if op.op_type in ("Conv2D", "DepthwiseConv2dNative", "MatMul")
                        and op.input_shapes and op.input_shapes[0] and op.input_shapes[0][0])
        return sizes.most_common(1)[0][0] if sizes else None

    def op_type_counts(self) -> Counter:
        return Counter(op.op_type for op in self.ops.values())


def tensor_bytes(shape, itemsize) -> float:
    """Bytes of a tensor of ``shape`` (a box's extents)."""
    return float(np.prod(shape, dtype=np.float64)) * itemsize if shape is not None else 0.0
