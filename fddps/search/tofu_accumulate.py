"""Gradient sums as running sums: a step rewrite for Tofu's RNN setting (ours, stated as such).

TensorFlow sums the gradients of a tensor used ``n`` times with one ``AddN``
of ``n`` inputs, so all ``n`` stay held until the last one is computed. An
unrolled LSTM's kernel is read once per time step: its 20 per-step weight
gradients (each the kernel's size) are all held at once, for every layer
(RNN-10-8K: 200 tensors of 2.1 GB, 420 GB on one GPU, 52 GB per GPU even split
8 ways). Tofu's MXNet aggregates gradients in place (Tofu, Section 7.2, notes
that TensorFlow's lack of in-place aggregation hurts large RNNs), so each
per-step gradient is added as it arrives and freed.

:func:`running_gradient_sums` rewrites every ``AddN`` under a ``gradients``
scope with more than two inputs as a chain of ``AddV2`` ops adding the
inputs in the order the step produces them (their topological position);
the last add keeps the ``AddN``'s name, so its consumers are unchanged. The
arithmetic is the same sum in another order. This is a simulation-side
rewrite of the step (:class:`~fddps.strategy.graph.StepGraph`): plans of the
rewritten step are scored, not written back to TensorFlow.

Example
-------
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> s = [OpInfo(f"g{i}", "Const", output_shapes=((4,),), output_itemsizes=(4,)) for i in range(3)]
>>> s.append(OpInfo("gradients/AddN", "AddN", inputs=tuple((f"g{i}", 0) for i in range(3)),
...                 input_shapes=((4,),) * 3, output_shapes=((4,),), input_itemsizes=(4,) * 3,
...                 output_itemsizes=(4,)))
>>> [(n, op.op_type, op.inputs) for n, op in running_gradient_sums(StepGraph(s)).ops.items()
...  if op.op_type != "Const"]  # doctest: +NORMALIZE_WHITESPACE
[('gradients/AddN/running_sum_1', 'AddV2', (('g0', 0), ('g1', 0))),
 ('gradients/AddN', 'AddV2', (('gradients/AddN/running_sum_1', 0), ('g2', 0)))]
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from ..strategy.graph import StepGraph

_GRADIENTS = re.compile(r"^gradients(?:_\d+)?/")


def running_gradient_sums(step: StepGraph) -> StepGraph:
    """``step`` with each gradient ``AddN`` of more than two inputs as a chain of adds.

    Parameters
    ----------
    step : StepGraph

    Returns
    -------
    StepGraph
        A new step (``step`` is not changed); the same step when nothing matches.
    """
    pos = {n: i for i, n in enumerate(step.ops)}
    out, changed = [], False
    for name, op in step.ops.items():
        if op.op_type != "AddN" or len(op.inputs) <= 2 or not _GRADIENTS.match(name) \
                or not op.output_shapes or op.output_shapes[0] is None:
            out.append(op)
            continue
        changed = True
        shape = op.output_shapes[0]
        item = op.output_itemsizes[0] if op.output_itemsizes else 4
        nbytes = float(math.prod(s or 1 for s in shape)) * item
        elements = nbytes / item if item else 0.0
        inputs = sorted(op.inputs, key=lambda e: pos[e[0]])
        acc = inputs[0]
        for j, nxt in enumerate(inputs[1:], start=1):
            last = j == len(inputs) - 1
            add_name = name if last else f"{name}/running_sum_{j}"
            out.append(replace(op, name=add_name, op_type="AddV2", inputs=(acc, nxt),
                               control_inputs=op.control_inputs if j == 1 else (),
                               input_shapes=(shape, shape), output_shapes=(shape,),
                               input_itemsizes=(item, item), output_itemsizes=(item,),
                               attrs={}, const_values={}, flops=elements,
                               input_bytes=2 * nbytes, output_bytes=nbytes))
            acc = (add_name, 0)
    return StepGraph(out) if changed else step


__all__ = ["running_gradient_sums"]
