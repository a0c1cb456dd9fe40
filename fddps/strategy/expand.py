"""Expand a strategy into the task graph the simulator runs: :func:`expand`.

Each op becomes its parts (``X/fddps_part_j``; a whole op keeps its name ``X``),
on the devices its configuration names. What moves between them depends on
both ends' layouts:

- an op that reads only shapes (:data:`~fddps.strategy.ops.SHAPE_ONLY_OPS`)
  receives no bytes;
- an edge from a producer part to a consumer part carries only the bytes of
  the intersection of the producer part's box of the tensor with the box the
  consumer part reads, and nothing when they share a device (equal layouts
  on the same devices move nothing);
- a part of a sliding-window op split by height or width reads its rows
  plus a halo (:class:`~fddps.strategy.ops.Halo`): the halo rows held by a
  neighbouring part on another device are that edge's bytes, the rows the
  part's device already holds cost nothing;
- a tensor whose producer split a reduction dimension holds partial sums:
  each consumer (box, device) gets a reduce task (``AddN``) on its device
  that receives every partial's overlap. Weight gradients of sample-split
  ops thus reach a whole update as a reduce to its device, and a
  parameter-split update as a reduce-scatter (the per-link volume of an
  all-reduce's first half; reading the sharded variable back whole is the
  all-gather);
- an op split along a dimension that needs statistics (batch norm by sample)
  gets a statistics task per part, which sends its per-channel sums to the
  other parts of its channels before any of them normalises;
- a part's time is the cost model's at the part's own shape (FLOPs scaled by
  its share of the iteration domain, bytes from its boxes), its transient
  memory its outputs, its persistent memory its share of a variable (and of
  each optimizer slot, a variable of its own); a part that reads a variable
  part on its device (``ReadVariableOp``, ``Identity``) allocates nothing
  (:attr:`fddps.OpGraph.aliases`) unless it gathers its input from pieces.

Example
-------
>>> from costmodel import default_cost_model
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> from fddps.strategy.strategy import OpConfig, Strategy
>>> g = StepGraph([OpInfo("x", "Const", output_shapes=((4, 8),), output_itemsizes=(4,),
...                       output_bytes=128.0),
...                OpInfo("y", "Relu", inputs=(("x", 0),), input_shapes=((4, 8),),
...                       output_shapes=((4, 8),), input_itemsizes=(4,), output_itemsizes=(4,))])
>>> devs = ["/device:GPU:0", "/device:GPU:1"]
>>> s = Strategy({"y": OpConfig({"n": 2}, devs)}, default_device=devs[0])
>>> ex = expand(g, s, default_cost_model().cluster(devs), default_cost_model())
>>> sorted(ex.graph.names), float(ex.graph.bytes.sum())
(['x', 'y/fddps_part_0', 'y/fddps_part_1'], 64.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..graph import ALIAS_OP_TYPES, OpGraph
from .graph import tensor_bytes
from .ops import SHAPE_ONLY_OPS, HaloAxis, NotDescribed, resolve
from .strategy import parts, validate


@dataclass
class Expansion:
    """A strategy's task graph.

    Attributes
    ----------
    graph : OpGraph
        The tasks (parts, reduce and statistics tasks), pinned to their devices.
    placement : dict of task name -> device name
    tasks : dict of op name -> list of task names (its parts)
    rows : pandas.DataFrame
        The cost model's input per task (``op_type``, ``flops``, bytes).
    """

    graph: OpGraph
    placement: dict
    tasks: dict
    rows: pd.DataFrame

    def simulate(self, cluster):
        """The step's :class:`~fddps.simulate.Timeline` (makespan, per-device peak memory)."""
        from ..simulate import simulate

        return simulate(self.graph, cluster, self.placement)


def part_task(op: str, j: int) -> str:
    return f"{op}/fddps_part_{j}"


def _box_bytes(box, itemsize):
    return tensor_bytes([b - a for a, b in box], itemsize)


def _intersect(a, b):
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(x1 > x0 for x0, x1 in out) or not out else None


def _tensor_box(axes, shape, box):
    """Box of a tensor (axis ranges) that a part with iteration ``box`` reads or writes.

    A halo axis (:class:`~fddps.strategy.ops.HaloAxis`) reads the part's rows
    mapped through its window: its own rows plus the halo rows of its
    neighbours, which :func:`expand`'s edges then charge as transfers from
    the parts holding them.
    """
    if not isinstance(axes, tuple) or (axes and axes[0] == "shape"):
        return tuple((0, s) for s in (shape or ()))
    return tuple((0, s) if d is None else d.rows(*box[d.dim]) if isinstance(d, HaloAxis)
                 else box[d] for d, s in zip(axes, shape or ()))


def task_aliases(op_types, names, gathers):
    """Per task, whether its outputs alias its input (:data:`fddps.graph.ALIAS_OP_TYPES`):
    not for a task in ``gathers``, which assembles its first input from several
    pieces (a read of a split variable kept whole) into a buffer of its own."""
    return [t in ALIAS_OP_TYPES and n not in gathers for t, n in zip(op_types, names)]


def expand(step, strategy, cluster, cost_model, apart=False) -> Expansion:
    """The task graph of ``strategy`` on ``cluster``, costed by ``cost_model``.

    Parameters
    ----------
    step : StepGraph
    strategy : Strategy
    cluster : Cluster
        Devices named as in the strategy, typed for the cost model
        (``cost_model.cluster(names)`` builds one).
    cost_model : CostModel
        ``op_times(rows, device_type)`` and ``memory(rows)``.
    apart : bool
        Every edge carries its bytes as if its ends were on different devices,
        and each consumer part gets its own reduce task: the task graph for a
        scheduler that places the tasks itself (it zeroes the edges it keeps
        on one device; :mod:`fddps.search.fddps_space`). Default False: the
        strategy's own devices decide what moves.

    Raises
    ------
    StrategyError
        If the strategy does not validate (:func:`fddps.strategy.strategy.validate`).
    """
    validate(strategy, step, cluster.names)
    rows, names, device, edges = [], [], {}, []
    tasks, layouts, reduces, gathers = {}, {}, {}, set()

    def add_task(name, dev, op_type, flops, in_bytes, out_bytes, param_bytes=0.0):
        names.append(name)
        device[name] = dev
        rows.append(dict(name=name, op_type=op_type, flops=flops, input_bytes=in_bytes,
                         output_bytes=out_bytes, param_bytes=param_bytes))

    def feed(src, port, box, consumer, dev):
        """Edges bringing ``box`` of tensor (src, port) to task ``consumer`` on ``dev``."""
        entries, itemsize, partial = layouts[src, port]
        if not partial:
            # Parts holding the same box hold the same values (replicas, as batch
            # norm's statistics after their exchange): read one, a local one if any.
            source = {}
            for task, pdev, pbox in entries:
                if pbox not in source or (pdev == dev and source[pbox][1] != dev):
                    source[pbox] = (task, pdev)
            for pbox, (task, pdev) in source.items():
                inter = _intersect(pbox, box)
                if inter is not None:
                    local = pdev == dev and not apart
                    edges.append((task, consumer, 0.0 if local else _box_bytes(inter, itemsize)))
            return
        key = (src, port, box, consumer if apart else dev)
        if key not in reduces:
            name = f"{src}/fddps_reduce_{port}_{len(reduces)}"
            overlapping = [(t, d, _intersect(b, box)) for t, d, b in entries]
            overlapping = [(t, d, b) for t, d, b in overlapping if b is not None]
            size = _box_bytes(box, itemsize)
            add_task(name, dev, "AddN", size / max(itemsize, 1) * (len(overlapping) - 1),
                     size * len(overlapping), size)
            for t, d, b in overlapping:
                edges.append((t, name, 0.0 if d == dev and not apart else _box_bytes(b, itemsize)))
            reduces[key] = name
        edges.append((reduces[key], consumer, 0.0))

    for name, op in step.ops.items():
        cfg = strategy.config(name)
        try:
            dims = resolve(op)
        except NotDescribed:
            dims = None
        op_parts = parts(op, cfg, dims) if dims is not None else parts(op, cfg)
        split = cfg.num_parts > 1
        in_shapes, out_shapes = op.input_shapes, op.output_shapes
        whole_in = [tuple((0, s or 1) for s in (shape or ())) for shape in in_shapes]
        whole_out = [tuple((0, s or 1) for s in (shape or ())) for shape in out_shapes]
        names_j = [part_task(name, p.index) if split else name for p in op_parts]
        tasks[name] = names_j
        partial = split and any(cfg.split.get(d, 1) > 1 for d in dims.reduction)
        stats_split = split and any(cfg.split.get(d, 1) > 1 for d in dims.stats)
        out_entries = [[] for _ in out_shapes]
        for p, task in zip(op_parts, names_j):
            if split:
                share = np.prod([(b - a) / dims.extent[d] for d, (a, b) in p.box.items()])
                in_boxes = [_tensor_box(m, s, p.box) for m, s in zip(dims.inputs, in_shapes)]
                out_boxes = [_tensor_box(m, s, p.box) for m, s in zip(dims.outputs, out_shapes)]
                add_task(task, p.device, op.op_type, op.flops * share,
                         sum(_box_bytes(b, i) for b, i in zip(in_boxes, op.input_itemsizes)),
                         sum(_box_bytes(b, i) for b, i in zip(out_boxes, op.output_itemsizes)),
                         op.param_bytes * share)
            else:
                in_boxes, out_boxes = whole_in, whole_out
                add_task(task, p.device, op.op_type, op.flops, op.input_bytes, op.output_bytes,
                         op.param_bytes)
            target = task
            if stats_split:  # the statistics first, exchanged, then the part itself
                target = f"{task}/stats"
                add_task(target, p.device, "Sum", 2 * _box_bytes(in_boxes[0], 1),
                         _box_bytes(in_boxes[0], op.input_itemsizes[0]), 0.0)
                edges.append((target, task, 0.0))
            for k, (src, port) in enumerate(op.inputs):
                if op.op_type in SHAPE_ONLY_OPS:  # ordered after its input, reads no bytes
                    edges.extend((t, target, 0.0) for t, _, _ in layouts[src, port][0])
                    continue
                before = len(edges)
                feed(src, port, in_boxes[k], target, p.device)
                if k == 0 and len(edges) - before > 1:
                    gathers.add(target)  # assembles its input from pieces: a new buffer
            for src in op.control_inputs:
                edges.extend((t, target, 0.0) for t in tasks[src])
            for k, box in enumerate(out_boxes):
                out_entries[k].append((task, p.device, box))
        if stats_split:
            channels = [d for d in dims.dims if d not in dims.stats]
            for p, task in zip(op_parts, names_j):
                for q, other in zip(op_parts, names_j):
                    if q is p or any(p.box[d] != q.box[d] for d in channels):
                        continue
                    nbytes = 0.0 if p.device == q.device and not apart else 2 * 4 * float(np.prod(
                        [b - a for d, (a, b) in p.box.items() if d in channels]))
                    edges.append((f"{task}/stats", other, nbytes))
        for k in range(len(out_shapes)):
            layouts[name, k] = (out_entries[k], op.output_itemsizes[k] if k < len(op.output_itemsizes)
                                else 0, partial)
    table = pd.DataFrame(rows)
    types = list(dict.fromkeys(d.type for d in cluster.devices))
    cost = np.column_stack([np.asarray(cost_model.op_times(table, t), dtype=np.float64)
                            for t in types])
    persistent, transient = cost_model.memory(table)
    graph = OpGraph(names, cost, edges, memory=persistent, transient=transient,
                    device_types=types, op_types=table["op_type"].tolist(), pinned=device,
                    aliases=task_aliases(table["op_type"], names, gathers))
    return Expansion(graph, device, tasks, table)


def simulate_strategy(step, strategy, cluster, cost_model):
    """Expand ``strategy`` and simulate it: the step's :class:`~fddps.simulate.Timeline`."""
    return expand(step, strategy, cluster, cost_model).simulate(cluster)
