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
  other parts of its channels before any of them normalises; the passes over
  the part that synchronised batch norm makes, as the rewrite writes it
  (:data:`SYNC_BATCH_NORM`), are tasks of their own, each costed by the cost
  model at the part's shape;
- a task that reads a piece of a producer part's box (other than a view:
  a cut of the first axis) pays for the slice, and one that reads several
  parts' pieces for their concatenation, each costed by the cost model
  (``Slice``, ``ConcatV2``), as the rewrite writes them;
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

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..graph import ALIAS_OP_TYPES, OpGraph
from .kernel_shape import part_kernel_shape
from .ops import SHAPE_ONLY_OPS, HaloAxis, NotDescribed, first_axis_view, resolve
from .strategy import parts, validate

#: Batch norm split along its statistics dimensions, as :mod:`fddps.tf.strategy_rewrite`
#: writes it (synchronised batch norm): the element-wise passes over each part, as
#: ``(op type, inputs read, output written)`` in units of the part's first input,
#: before the per-channel sums are exchanged (``"stats"``) and after (``"part"``;
#: None: the op itself, at the part's shape). The forward pass sums the part,
#: then its squared deviations from the mean (two passes, as TensorFlow's own
#: kernel, for the same variance); the gradient is written element-wise.
SYNC_BATCH_NORM = {
    "FusedBatchNormV3": {
        "stats": (("Sum", 1, 0), ("Sub", 1, 1), ("Square", 1, 1), ("Sum", 1, 0)),
        "part": None},
    "FusedBatchNormGradV3": {
        "stats": (("Sub", 1, 1), ("Mul", 1, 1), ("Mul", 2, 1), ("Sum", 1, 0), ("Sum", 1, 0)),
        "part": (("Sub", 1, 1), ("Mul", 1, 1), ("Sub", 2, 1), ("Mul", 1, 1))},
}


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
    # math.prod of the (integer) extents: the same float as tensor_bytes' numpy product
    # below 2**53 elements, without numpy's per-call overhead (the DP calls this ~10^5 times).
    return float(math.prod(b - a for a, b in box)) * itemsize


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


def part_of_task(task: str) -> str:
    """The part (or whole op) a task belongs to: ``X/fddps_part_0`` for itself, its
    statistics ``X/fddps_part_0/stats`` and their passes (``.../pass_k``).

    >>> part_of_task("X/fddps_part_1/stats/pass_2"), part_of_task("X")
    ('X/fddps_part_1', 'X')
    """
    return re.sub(r"(/stats)?(/pass_\d+)?$", "", task)


def add_edge(edges, pieces, record) -> None:
    """Append an ``E`` record's edge ``(src, dst, bytes)`` to ``edges`` and, if it
    names the piece it carries, ``(edge index, box)`` to ``pieces`` (for
    :func:`distinct_pieces`)."""
    if len(record) > 4:
        pieces.append((len(edges), record[4]))
    edges.append(record[1:4])


def distinct_pieces(edges, pieces, device) -> list:
    """``edges`` with each producer's distinct pieces to one device charged together.

    The rewrite sends each distinct piece (box) of a producer task's output that
    a device reads as a tensor of its own (sliced on the producer's device), and
    the simulator sends one tensor per producer and device, sized by its largest
    edge. So when a device reads several distinct pieces of one producer (a
    filter's halves, by a convolution's part and by its input gradient's), every
    edge of that group carries the sum of the pieces' bytes.

    Parameters
    ----------
    edges : list of (src, dst, bytes)
    pieces : list of (edge index, box)
        The edges that carry a piece, and which.
    device : mapping of task -> device

    Returns
    -------
    list of (src, dst, bytes)

    Examples
    --------
    >>> e = [("w", "a", 4.0), ("w", "b", 4.0), ("w", "c", 4.0)]
    >>> distinct_pieces(e, [(0, "left"), (1, "right"), (2, "left")], {"a": 1, "b": 1, "c": 2})
    [('w', 'a', 8.0), ('w', 'b', 8.0), ('w', 'c', 4.0)]
    """
    groups = {}
    for i, box in pieces:
        src, dst, nbytes = edges[i]
        if nbytes > 0:
            group = groups.setdefault((src, device[dst]), ({}, []))
            group[0].setdefault(box, nbytes)
            group[1].append(i)
    out = list(edges)
    for sizes, members in groups.values():
        if len(sizes) > 1:
            total = float(sum(sizes.values()))
            for i in members:
                out[i] = (out[i][0], out[i][1], total)
    return out


def shared_task(task: str) -> bool:
    """Whether a task is a reduce of partial sums (an ``R`` record's, :func:`op_records`)."""
    return "/fddps_reduce_" in task


def op_layout(op, cfg, dims):
    """Where op ``op``'s outputs live under configuration ``cfg``.

    ``dims`` is :func:`~fddps.strategy.ops.resolve`'s description of ``op``
    (``None`` for an op without one: it is then whole).

    Returns
    -------
    (parts, tasks, outputs)
        Its :class:`~fddps.strategy.strategy.Part` list, their task names
        (``op.name`` itself when whole) and per output port ``(entries,
        itemsize, partial)``: ``entries`` the ``(task, device, box)`` holding
        each piece, ``partial`` whether the pieces are partial sums (a
        reduction dimension split).
    """
    op_parts = parts(op, cfg, dims) if dims is not None else parts(op, cfg)
    split = cfg.num_parts > 1
    names = [part_task(op.name, p.index) if split else op.name for p in op_parts]
    partial = split and any(cfg.split.get(d, 1) > 1 for d in dims.reduction)
    outputs = []
    for k, shape in enumerate(op.output_shapes):
        whole = tuple((0, s or 1) for s in (shape or ()))
        entries = [(t, p.device, _tensor_box(dims.outputs[k], shape, p.box) if split else whole)
                   for p, t in zip(op_parts, names)]
        itemsize = op.output_itemsizes[k] if k < len(op.output_itemsizes) else 0
        outputs.append((entries, itemsize, partial))
    return op_parts, names, outputs


def op_records(op, cfg, dims, layout, source, control_tasks, apart=False) -> list:
    """The task-graph records expanding one op, in :func:`expand`'s order.

    Parameters
    ----------
    op : OpInfo
    cfg : OpConfig
    dims : resolved description or None (as :func:`op_layout`)
    layout : tuple
        ``op_layout(op, cfg, dims)``.
    source : callable
        ``source(src, port)``: the producer's ``(entries, itemsize, partial)``.
    control_tasks : callable
        ``control_tasks(src)``: the task names of a control input.
    apart : bool
        As :func:`expand`'s.

    Returns
    -------
    list of records:
        ``("T", task, device, row)``: a task and its cost-model row;
        ``("E", src_task, dst_task, bytes[, box])``: an edge (``box``: the piece of
        ``src_task``'s output it carries; :func:`distinct_pieces`);
        ``("R", key, consumer, [(task, device, bytes)], row)``: ``consumer`` reads
        partial sums through a reduce task on device ``key[3]``, one per
        distinct ``key`` (the first record of a key creates it, fed by the
        listed pieces);
        ``("G", task)``: ``task`` assembles its first input from several pieces
        (a buffer of its own: :func:`task_aliases`);
        ``("C", task, device, row)``: ``task`` also spends what ``row`` costs on
        ``device`` (slicing a piece out of a part, concatenating pieces).
    """
    op_parts, names_j, _ = layout
    split = cfg.num_parts > 1
    stats_split = split and any(cfg.split.get(d, 1) > 1 for d in dims.stats)
    whole_in = [tuple((0, s or 1) for s in (shape or ())) for shape in op.input_shapes]
    recs = []

    def task(name, dev, op_type, flops, in_bytes, out_bytes, param_bytes=0.0, profile_name=None,
             kernel_shape=None):
        recs.append(("T", name, dev, dict(name=name, op_type=op_type, flops=flops,
                                          input_bytes=in_bytes, output_bytes=out_bytes,
                                          param_bytes=param_bytes, profile_name=profile_name,
                                          kernel_shape=kernel_shape)))

    def feed(src, port, box, consumer, dev):
        """Records bringing ``box`` of tensor (src, port) to task ``consumer`` on ``dev``;
        the number of pieces it is assembled from (1 for a sum of partial sums)."""
        entries, itemsize, partial = source(src, port)
        if not partial:
            # Parts holding the same box hold the same values (replicas, as batch
            # norm's statistics after their exchange): read one, a local one if any.
            held = {}
            for t, pdev, pbox in entries:
                if pbox not in held or (pdev == dev and held[pbox][1] != dev):
                    held[pbox] = (t, pdev)
            pieces = []
            for pbox, (t, pdev) in held.items():
                inter = _intersect(pbox, box)
                if inter is not None:
                    local = pdev == dev and not apart
                    recs.append(("E", t, consumer, 0.0 if local else _box_bytes(inter, itemsize),
                                 inter))
                    pieces.append((pbox, inter))
            # The rewrite slices a piece out of a part (unless the slice is a view) and
            # concatenates several: the reader pays for them (they run on the piece's
            # device and the reader's; a slice shared by two readers is paid twice).
            size = _box_bytes(box, itemsize)
            if len(pieces) > 1:
                recs.append(("C", consumer, dev, dict(
                    name=f"{consumer}/fddps_concat", op_type="ConcatV2", flops=0.0,
                    input_bytes=size, output_bytes=size, param_bytes=0.0)))
            elif pieces and pieces[0][1] != pieces[0][0]:
                (pbox, inter), = pieces
                if not first_axis_view([b - a for a, b in pbox],
                                       [a - a0 for (a, _), (a0, _) in zip(inter, pbox)],
                                       [b - a for a, b in inter], itemsize):
                    recs.append(("C", consumer, dev, dict(
                        name=f"{consumer}/fddps_slice", op_type="Slice", flops=0.0,
                        input_bytes=_box_bytes(pbox, itemsize), output_bytes=size,
                        param_bytes=0.0)))
            return len(pieces)
        overlapping = [(t, d, _intersect(b, box)) for t, d, b in entries]
        overlapping = [(t, d, 0.0 if d == dev and not apart else _box_bytes(b, itemsize))
                       for t, d, b in overlapping if b is not None]
        size = _box_bytes(box, itemsize)
        key = (src, port, box, dev) + ((consumer,) if apart else ())
        recs.append(("R", key, consumer, overlapping,
                     dict(name=f"{src}/fddps_reduce_{port}", op_type="AddN",
                          flops=size / max(itemsize, 1) * (len(overlapping) - 1),
                          input_bytes=size * len(overlapping), output_bytes=size,
                          param_bytes=0.0)))
        return 1

    sync = SYNC_BATCH_NORM.get(op.op_type) if stats_split else None

    def passes(name, dev, which, box):
        """Tasks ``name/pass_k``... then ``name`` for ``sync[which]``, chained; the first."""
        elements = _box_bytes(box, 1)
        size = elements * op.input_itemsizes[0]
        steps = sync[which]
        names = [f"{name}/pass_{k}" for k in range(len(steps) - 1)] + [name]
        for k, ((kind, reads, writes), n) in enumerate(zip(steps, names)):
            task(n, dev, kind, elements * reads, size * reads, size * writes)
            if k:
                recs.append(("E", names[k - 1], n, 0.0))
        return names[0]

    firsts = {}  # part task -> its first task (a chain of passes, or itself)
    for p, t in zip(op_parts, names_j):
        firsts[t] = t
        if split:
            share = np.prod([(b - a) / dims.extent[d] for d, (a, b) in p.box.items()])
            in_boxes = [_tensor_box(m, s, p.box) for m, s in zip(dims.inputs, op.input_shapes)]
            out_boxes = [_tensor_box(m, s, p.box) for m, s in zip(dims.outputs, op.output_shapes)]
            if sync is not None and sync["part"] is not None:
                firsts[t] = passes(t, p.device, "part", in_boxes[0])
            else:
                task(t, p.device, op.op_type, op.flops * share,
                     sum(_box_bytes(b, i) for b, i in zip(in_boxes, op.input_itemsizes)),
                     sum(_box_bytes(b, i) for b, i in zip(out_boxes, op.output_itemsizes)),
                     op.param_bytes * share, profile_name=op.name,
                     kernel_shape=part_kernel_shape(op, dims, p.box, in_boxes, out_boxes))
        else:
            in_boxes = whole_in
            task(t, p.device, op.op_type, op.flops, op.input_bytes, op.output_bytes,
                 op.param_bytes, profile_name=op.name, kernel_shape=op.kernel_shape)
        target = t
        if stats_split:  # the statistics first, exchanged, then the part itself
            target = f"{t}/stats"
            if sync is not None:
                target = passes(target, p.device, "stats", in_boxes[0])
            else:
                task(target, p.device, "Sum", 2 * _box_bytes(in_boxes[0], 1),
                     _box_bytes(in_boxes[0], op.input_itemsizes[0]), 0.0)
            recs.append(("E", f"{t}/stats", firsts[t], 0.0))
        for k, (src, port) in enumerate(op.inputs):
            if op.op_type in SHAPE_ONLY_OPS:  # ordered after its input, reads no bytes
                recs.extend(("E", s, target, 0.0) for s, _, _ in source(src, port)[0])
                continue
            if feed(src, port, in_boxes[k], target, p.device) > 1 and k == 0:
                recs.append(("G", target))  # assembles its input from pieces: a new buffer
        for src in op.control_inputs:
            recs.extend(("E", s, target, 0.0) for s in control_tasks(src))
    if stats_split:
        channels = [d for d in dims.dims if d not in dims.stats]
        for p, t in zip(op_parts, names_j):
            for q, other in zip(op_parts, names_j):
                if q is p or any(p.box[d] != q.box[d] for d in channels):
                    continue
                nbytes = 0.0 if p.device == q.device and not apart else 2 * 4 * float(np.prod(
                    [b - a for d, (a, b) in p.box.items() if d in channels]))
                recs.append(("E", f"{t}/stats", firsts[other], nbytes))
    return recs


def expand(step, strategy, cluster, cost_model, apart=False, dims_of=None) -> Expansion:
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
    dims_of : dict, optional
        ``{op: resolve(op) or None}`` (None where :func:`~fddps.strategy.ops.resolve`
        raises ``NotDescribed``) where the caller has it: a search expanding many
        strategies of one step resolves its ops once, not once per expansion.

    Raises
    ------
    StrategyError
        If the strategy does not validate (:func:`fddps.strategy.strategy.validate`).
    """
    validate(strategy, step, cluster.names)
    rows, names, device, edges, extra, pieces = [], [], {}, [], [], []
    tasks, layouts, reduces, gathers = {}, {}, {}, set()

    def add_task(name, dev, row):
        names.append(name)
        device[name] = dev
        rows.append(dict(row, name=name))

    for name, op in step.ops.items():
        cfg = strategy.config(name)
        if dims_of is not None:
            dims = dims_of[name]
        else:
            try:
                dims = resolve(op)
            except NotDescribed:
                dims = None
        layouts[name] = op_layout(op, cfg, dims)
        tasks[name] = layouts[name][1]
        for rec in op_records(op, cfg, dims, layouts[name], lambda src, port: layouts[src][2][port],
                              tasks.get, apart):
            kind = rec[0]
            if kind == "T":
                add_task(rec[1], rec[2], rec[3])
            elif kind == "E":
                add_edge(edges, pieces, rec)
            elif kind == "G":
                gathers.add(rec[1])
            elif kind == "C":
                extra.append((rec[1], rec[3]))
            else:  # a reduce of partial sums: created by its key's first reader
                _, key, consumer, overlapping, row = rec
                if key not in reduces:
                    reduces[key] = f"{key[0]}/fddps_reduce_{key[1]}_{len(reduces)}"
                    add_task(reduces[key], key[3], row)
                    edges.extend((t, reduces[key], nbytes) for t, _, nbytes in overlapping)
                edges.append((reduces[key], consumer, 0.0))
    edges = distinct_pieces(edges, pieces, device)
    table = pd.DataFrame(rows)
    types = list(dict.fromkeys(d.type for d in cluster.devices))
    # Tasks and the slices and concatenations they pay for, costed in one call (one
    # coverage warning per expansion, not two).
    every = pd.concat([table, pd.DataFrame([row for _, row in extra])], ignore_index=True)
    every_cost = np.column_stack([np.asarray(cost_model.op_times(every, t), dtype=np.float64)
                                  for t in types])
    cost = every_cost[:len(table)].copy()
    if extra:
        position = {n: i for i, n in enumerate(names)}
        np.add.at(cost, [position[task] for task, _ in extra], every_cost[len(table):])
    persistent, transient = cost_model.memory(table)
    graph = OpGraph(names, cost, edges, memory=persistent, transient=transient,
                    device_types=types, op_types=table["op_type"].tolist(), pinned=device,
                    aliases=task_aliases(table["op_type"], names, gathers))
    return Expansion(graph, device, tasks, table)


def simulate_strategy(step, strategy, cluster, cost_model):
    """Expand ``strategy`` and simulate it: the step's :class:`~fddps.simulate.Timeline`."""
    return expand(step, strategy, cluster, cost_model).simulate(cluster)
