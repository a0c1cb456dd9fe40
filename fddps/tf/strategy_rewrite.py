"""Write a strategy into a GraphDef that runs it: :func:`rewrite_strategy`.

For every op of the step (the fetches' ancestors), in topological order:

- a whole op keeps its NodeDef and name, on its configuration's device;
- a split op ``X`` becomes its parts ``X/fddps_part_j`` (copies of ``X``'s
  NodeDef, same op and attributes) on their devices, each reading the box of
  every input its part of the iteration domain needs
  (:mod:`fddps.strategy.ops`); a shape-vector input becomes a ``Const``
  ``X/fddps_part_j/shape_i`` holding the part's own shape; ``X``'s control
  inputs go to every part;
- ``X`` itself becomes an ``IdentityN`` of the whole outputs
  (``X/fddps_whole_k``: a ``ConcatV2`` tree of the parts, ``AddN`` of partial
  sums), so fetches, control inputs and consumers that need the whole tensor
  are unchanged. TensorFlow runs only what a fetch needs, so a whole tensor
  no consumer reads is never assembled.

What a part reads, by the producer's layout: a producer part holding exactly
the box (the same one on the part's device if there is one) is read directly,
with no concatenate-then-slice between consecutive ops of matching layouts; a
box inside one producer part is sliced out of it; partial sums of the box are
added (``AddN`` on the reader's device); otherwise the whole tensor is
assembled once and sliced (``Slice``, cached per box and device).

``Mean`` parts split along a reduced axis compute ``Sum`` of their box times
``1 / count`` of the whole, so that the partial results add up to the mean.

Not yet written (a clear :class:`~fddps.strategy.StrategyError` names the
op): batch norm split along its statistics dimensions (sample, height,
width), and split variables (``VarHandleOp``, ``ReadVariableOp``, optimizer
updates): variables stay whole on their devices.

Step nodes lose their ``_class`` colocation attribute (a split op's name now
stands for an ``IdentityN``; devices are explicit); other nodes are copied as
they are. The user's GraphDef is never modified.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..strategy.ops import NotDescribed, resolve
from ..strategy.strategy import StrategyError, parts, validate
from .graphdef import _parse_input, _tf, analyse
from .split_rewrite import _const
from .strategy_graph import step_graph

#: Op types the rewrite cannot split yet (variables stay whole on their devices).
NOT_REWRITTEN = frozenset({"VarHandleOp", "ReadVariableOp", "ResourceApplyMomentum"})


def _tensor(name, port):
    return name if port == 0 else f"{name}:{port}"


class _Writer:
    def __init__(self, out, graph):
        self.out, self.graph = out, graph
        self.entries = {}  # (op, port) -> (list of (tensor, box, device), partial)
        self.whole = {}    # (op, port) -> tensor holding the whole value
        self.cache = {}

    def add(self, node):
        self.out.node.append(node)  # a copy: finish the node before adding it

    def const(self, name, value, dtype, device):
        if name not in self.cache:
            self.add(_const(name, value, dtype, device))
            self.cache[name] = name
        return name

    def dtype(self, op, port):
        return self.graph.get_operation_by_name(op).outputs[port].dtype

    def slice(self, tensor, full, box, device, dtype, base):
        """``box`` of ``tensor`` (whose box is ``full``) on ``device``."""
        if box == full:
            return tensor
        key = (tensor, box, device)
        if key not in self.cache:
            tf = _tf()
            name = f"{base}/fddps_slice_{len(self.cache)}"
            begin = [a - f0 for (a, _), (f0, _) in zip(box, full)]
            size = [b - a for a, b in box]
            node = tf.compat.v1.NodeDef(name=name, op="Slice", device=device)
            node.input.extend([tensor, self.const(f"{name}/begin", begin, tf.int32, device),
                               self.const(f"{name}/size", size, tf.int32, device)])
            node.attr["T"].type = dtype.as_datatype_enum
            node.attr["Index"].type = tf.int32.as_datatype_enum
            self.add(node)
            self.cache[key] = name
        return self.cache[key]

    def add_n(self, tensors, device, dtype, name):
        if len(tensors) == 1:
            return tensors[0]
        if name not in self.cache:
            node = _tf().compat.v1.NodeDef(name=name, op="AddN", device=device)
            node.input.extend(tensors)
            node.attr["N"].i = len(tensors)
            node.attr["T"].type = dtype.as_datatype_enum
            self.add(node)
            self.cache[name] = name
        return name

    def assemble(self, boxes, device, dtype, base):
        """One tensor from ``[(box, tensor)]`` tiling a box: a tree of ``ConcatV2``."""
        if len(boxes) == 1:
            return boxes[0][1]
        axis = next(a for a in range(len(boxes[0][0])) if len({b[a] for b, _ in boxes}) > 1)
        groups = {}
        for box, t in boxes:
            groups.setdefault(box[axis], []).append((box, t))
        pieces = [self.assemble(groups[r], device, dtype, f"{base}_{r[0]}")
                  for r in sorted(groups)]
        tf = _tf()
        name = f"{base}/concat_{axis}"
        node = tf.compat.v1.NodeDef(name=name, op="ConcatV2", device=device)
        node.input.extend(pieces + [self.const(f"{name}/axis", axis, tf.int32, device)])
        node.attr["N"].i = len(pieces)
        node.attr["T"].type = dtype.as_datatype_enum
        node.attr["Tidx"].type = tf.int32.as_datatype_enum
        self.add(node)
        return name

    def materialize(self, op, port):
        """The whole value of a split op's output ``port``."""
        key = (op, port)
        if key not in self.whole:
            entries, partial = self.entries[key]
            dtype = self.dtype(op, port)
            device = entries[0][2]
            by_box = {}
            for t, box, _ in entries:
                by_box.setdefault(box, []).append(t)
            base = f"{op}/fddps_whole_{port}"
            tiles = [(box, self.add_n(ts, device, dtype, f"{base}/sum_{i}") if partial else ts[0])
                     for i, (box, ts) in enumerate(by_box.items())]
            self.whole[key] = self.assemble(tiles, device, dtype, base)
        return self.whole[key]

    def read(self, op, port, box, device, shape):
        """A tensor holding ``box`` of output ``port`` of ``op``, for a reader on ``device``."""
        full = tuple((0, s) for s in (shape or ()))
        if (op, port) not in self.entries:  # a whole op: its own tensor
            return self.slice(_tensor(op, port), full, box, device, self.dtype(op, port), op)
        entries, partial = self.entries[op, port]
        exact = [(t, d) for t, b, d in entries if b == box]
        if exact and not partial:
            return next((t for t, d in exact if d == device), exact[0][0])
        if exact and partial and all(b == box or not _overlaps(b, box) for _, b, _ in entries):
            return self.add_n([t for t, _ in exact], device, self.dtype(op, port),
                              f"{op}/fddps_sum_{port}_{len(self.cache)}")
        if not partial:
            inside = [(t, b) for t, b, d in entries
                      if all(a0 <= a and b1 >= b_ for (a0, b1), (a, b_) in zip(b, box))]
            if inside:
                t, b = inside[0]
                return self.slice(t, b, box, device, self.dtype(op, port), f"{op}/fddps_part")
        return self.slice(self.materialize(op, port), full, box, device, self.dtype(op, port), op)


def _overlaps(a, b):
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b))


def _box(axes, shape, pbox):
    if not isinstance(axes, tuple) or (axes and axes[0] == "shape"):
        return tuple((0, s) for s in (shape or ()))
    return tuple(pbox[d] if d is not None else (0, s) for d, s in zip(axes, shape))


def rewrite_strategy(graph_def, strategy, fetches, devices=None):
    """A GraphDef that runs ``strategy``: the same loss and updates as ``graph_def``.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path
        Never modified.
    strategy : fddps.strategy.Strategy
    fetches : list of str
        What one step runs (``["train_op", "total_loss"]``); the rewrite covers
        their ancestors, every other node is copied unchanged.
    devices : list of str, optional
        The cluster the strategy must fit (default: the devices it names).

    Returns
    -------
    GraphDef

    Raises
    ------
    StrategyError
        If the strategy does not validate, or splits an op the rewrite cannot
        split yet (see the module notes).
    """
    tf = _tf()
    analysis = analyse(graph_def)
    step = step_graph(analysis, fetches)
    validate(strategy, step, devices or strategy.devices())
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(analysis.graph_def.versions)
    out.library.CopyFrom(analysis.graph_def.library)
    by_name = {n.name: n for n in analysis.graph_def.node}
    for node in analysis.graph_def.node:
        if node.name not in step.ops:
            out.node.add().CopyFrom(node)
    w = _Writer(out, analysis.graph)
    tasks = {}
    for name, op in step.ops.items():
        cfg = strategy.config(name)
        original = by_name[name]
        if cfg.num_parts == 1:
            node = tf.compat.v1.NodeDef()
            node.CopyFrom(original)
            node.device = cfg.devices[0]
            node.attr.pop("_class", None)
            del node.input[:]
            for k, (src, port) in enumerate(op.inputs):
                shape = op.input_shapes[k]
                node.input.append(w.read(src, port, tuple((0, s) for s in (shape or ())),
                                         cfg.devices[0], shape))
            node.input.extend(f"^{t}" for c in op.control_inputs for t in tasks[c])
            w.add(node)
            tasks[name] = [name]
            continue
        if op.op_type in NOT_REWRITTEN:
            raise StrategyError(f"op {name!r} ({op.op_type}): split variables are not written "
                                "into GraphDefs yet; keep variables, their reads and updates whole")
        try:
            dims = resolve(op)
        except NotDescribed as why:  # validate() has caught this; keep the message if not
            raise StrategyError(f"op {name!r} ({op.op_type}) cannot be split: {why}") from None
        if any(cfg.split.get(d, 1) > 1 for d in dims.stats):
            raise StrategyError(f"op {name!r} ({op.op_type}): splitting its statistics "
                                f"dimensions ({', '.join(sorted(dims.stats))}) is not written "
                                "into GraphDefs yet")
        partial = any(cfg.split.get(d, 1) > 1 for d in dims.reduction)
        names, outs = [], [[] for _ in op.output_shapes]
        tf_op = analysis.graph.get_operation_by_name(name)
        for p in parts(op, cfg, dims):
            pname = f"{name}/fddps_part_{p.index}"
            node = tf.compat.v1.NodeDef()
            node.CopyFrom(original)
            node.name, node.device = pname, p.device
            node.attr.pop("_class", None)
            node.attr.pop("_output_shapes", None)
            del node.input[:]
            out_boxes = [_box(m, s, p.box) for m, s in zip(dims.outputs, op.output_shapes)]
            for k, ((src, port), axes) in enumerate(zip(op.inputs, dims.inputs)):
                shape = op.input_shapes[k]
                if isinstance(axes, tuple) and axes and axes[0] == "shape":
                    value = [b - a for a, b in out_boxes[axes[1]]]
                    node.input.append(w.const(f"{pname}/shape_{k}", value,
                                              tf_op.inputs[k].dtype, p.device))
                    continue
                node.input.append(w.read(src, port, _box(axes, shape, p.box), p.device, shape))
            if op.op_type == "Slice":  # an explicit size on a split axis: take the part's extent
                size = [-1 if isinstance(axes_d, str) else s for axes_d, s in
                        zip(dims.inputs[0], op.const_values[2])]
                node.input[2] = w.const(f"{pname}/size", size, tf_op.inputs[2].dtype, p.device)
            node.input.extend(f"^{t}" for c in op.control_inputs for t in tasks[c])
            if op.op_type == "Mean" and partial:
                # Sum of the part's box, scaled by the whole count: partials add to the mean.
                node.name, node.op = f"{pname}/sum", "Sum"
                w.add(node)
                count = np.prod([dims.extent[d] for d in dims.reduction])
                dtype = tf_op.outputs[0].dtype
                scale = tf.compat.v1.NodeDef(name=pname, op="Mul", device=p.device)
                scale.input.extend([node.name, w.const(f"{pname}/scale", 1.0 / count, dtype,
                                                       p.device)])
                scale.attr["T"].type = dtype.as_datatype_enum
                w.add(scale)
            else:
                w.add(node)
            names.append(pname)
            for k, box in enumerate(out_boxes):
                outs[k].append((_tensor(pname, k), box, p.device))
        tasks[name] = names
        for k in range(len(op.output_shapes)):
            w.entries[name, k] = (outs[k], partial)
        # X: the whole outputs, for fetches, control inputs and whole readers.
        ident = tf.compat.v1.NodeDef(name=name, op="IdentityN", device=cfg.devices[0])
        ident.input.extend(w.materialize(name, k) for k in range(len(op.output_shapes)))
        ident.attr["T"].list.type.extend(t.dtype.as_datatype_enum for t in tf_op.outputs)
        w.add(ident)
    return out


def data_parallel(graph_def, devices, fetches=None):
    """The data-parallel :class:`~fddps.strategy.Strategy` of a TensorFlow graph.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes, path, or a StepGraph
    devices : list of str
        TensorFlow device strings (normalised: ``/cpu:1`` -> ``/device:CPU:1``).
    fetches : list of str, optional
        What one step runs (default: every node).

    Returns
    -------
    Strategy
        See :func:`fddps.strategy.data_parallel`.
    """
    from ..strategy.graph import StepGraph
    from ..strategy.strategy import data_parallel as _data_parallel
    from .devices import normalize_device

    step = graph_def if isinstance(graph_def, StepGraph) else step_graph(graph_def, fetches)
    return _data_parallel(step, [normalize_device(d) for d in devices])


def place_strategy(graph_def, devices, strategy, cost_model, memory=None, *, fetches=None,
                   unknown_dim=1):
    """:func:`fddps.tf.place` with a given strategy: the rewritten graph and its predicted step.

    The strategy is expanded into its task graph (:func:`fddps.strategy.expand`)
    and simulated with a first-in-first-out executor on each device, which
    gives the :class:`~fddps.tf.place.Placement`'s schedule (``makespan``,
    ``peak_memory``); its ``graph_def`` is :func:`rewrite_strategy`'s.

    Raises
    ------
    StrategyError
        If the strategy does not fit the graph or the devices, or cannot be
        written yet (see :func:`rewrite_strategy`).
    """
    import time

    from ..schedule import Schedule
    from ..simulate import executor_order
    from ..strategy.expand import expand
    from .devices import make_cluster
    from .place import Placement

    t0 = time.perf_counter()
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    step = step_graph(analysis, fetches)
    expansion = expand(step, strategy, cluster, cost_model)
    g = expansion.graph
    device = np.array([cluster.index[expansion.placement[n]] for n in g.names], dtype=np.int64)
    order = executor_order(g, cluster, device)
    schedule = Schedule.from_order(g, cluster, device, order, algorithm="strategy",
                                   info={"strategy": strategy, "splits": []})
    out = rewrite_strategy(analysis, strategy, fetches or [n.name for n in analysis.graph_def.node],
                           list(cluster.names))
    info = {"analysis": analysis, "strategy": strategy.name, "tasks": g.num_ops,
            "ops_split": sum(len(t) > 1 for t in expansion.tasks.values()),
            "executor_makespan": schedule.makespan, "algorithm": "strategy",
            "place_seconds": time.perf_counter() - t0}
    return Placement(out, schedule, cluster, analysis.table, info)
