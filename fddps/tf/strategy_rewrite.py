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

``Mean`` parts split along a reduced axis compute ``Sum`` of their box divided
by the whole count, so that the partial results add up to the mean.

Batch norm split by sample, height or width reduces its statistics across
the parts (:func:`_write_batch_norm`). A sliding-window op (convolution,
pool, their gradients) split by height or width reads its rows plus a halo
and computes its part with ``VALID`` padding on the haloed slice, padded
explicitly where the part touches the border (:func:`_write_windowed`), so
that every part computes exactly the whole op's rows. A variable split along
its own dimensions (with its reads, optimizer slots and update) becomes one
shard variable per part, ``V/part_j``, on the part's device; every other user
of its handle is written per shard under its own name
(:mod:`fddps.tf.variable_shards`).

Step nodes lose their ``_class`` colocation attribute (a split op's name now
stands for an ``IdentityN``; devices are explicit); other nodes are copied as
they are. The user's GraphDef is never modified.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..simulate import executor_policy, simulate
from ..strategy.expand import _tensor_box as _box
from ..strategy.ops import HaloAxis, NotDescribed, resolve
from ..strategy.strategy import StrategyError, parts, validate
from .graphdef import _parse_input, _tf, analyse, const_node
from .strategy_graph import step_graph
from .variable_shards import (check_sharded_group, handle_blockers, retarget, sharded_table,
                              write_handle_users, write_shard_users, write_shards)

#: Op types the rewrite splits only with their variable (:mod:`fddps.tf.variable_shards`).
NOT_REWRITTEN = frozenset({"VarHandleOp", "ReadVariableOp", "ResourceApplyMomentum",
                           "ResourceApplyGradientDescent", "ResourceApplyAdam"})


def _tensor(name, port):
    return name if port == 0 else f"{name}:{port}"


class _Writer:
    def __init__(self, out, graph):
        self.out, self.graph = out, graph
        self.entries = {}  # (op, port) -> (list of (tensor, box, device), partial)
        self.whole = {}    # (op, port, device) -> tensor holding the whole value there
        self.home = {}     # whole op -> its device
        self.cache = {}

    def add(self, node):
        self.out.node.append(node)  # a copy: finish the node before adding it

    def const(self, name, value, dtype, device):
        if name not in self.cache:
            self.add(const_node(name, value, dtype, device))
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

    def materialize(self, op, port, device=None):
        """The whole value of a split op's output ``port``, assembled on ``device``
        (default: its first part's), where it is read: only the other devices'
        parts cross to it, as the strategy's expansion charges."""
        entries, partial = self.entries[op, port]
        device = device or entries[0][2]
        key = (op, port, device)
        if key not in self.whole:
            dtype = self.dtype(op, port)
            by_box = {}
            for t, box, d in entries:
                by_box.setdefault(box, []).append((d != device, t))
            n = sum(k[:2] == (op, port) for k in self.whole)
            base = f"{op}/fddps_whole_{port}" + (f"_{n}" if n else "")
            # Partial sums are added; of replicas, a local one is read if any.
            tiles = [(box, self.add_n([t for _, t in ts], device, dtype, f"{base}/sum_{i}")
                      if partial else min(ts)[1]) for i, (box, ts) in enumerate(by_box.items())]
            self.whole[key] = self.assemble(tiles, device, dtype, base)
        return self.whole[key]

    def read(self, op, port, box, device, shape):
        """A tensor holding ``box`` of output ``port`` of ``op``, for a reader on ``device``."""
        # Slices run where their data is, so that only the box crosses a link
        # (as the strategy's expansion charges): sliced on the reader's device,
        # a 9 MB filter of which a channel part reads half crossed whole.
        full = tuple((0, s) for s in (shape or ()))
        if (op, port) not in self.entries:  # a whole op: its own tensor
            return self.slice(_tensor(op, port), full, box, self.home.get(op) or device,
                              self.dtype(op, port), op)
        entries, partial = self.entries[op, port]
        exact = [(t, d) for t, b, d in entries if b == box]
        if exact and not partial:
            return next((t for t, d in exact if d == device), exact[0][0])
        if exact and partial and all(b == box or not _overlaps(b, box) for _, b, _ in entries):
            return self.add_n([t for t, _ in exact], device, self.dtype(op, port),
                              f"{op}/fddps_sum_{port}_{len(self.cache)}")
        if not partial:
            inside = [(d != device, t, b, d) for t, b, d in entries
                      if all(a0 <= a and b1 >= b_ for (a0, b1), (a, b_) in zip(b, box))]
            if inside:  # a part holding the box, a local one if any
                _, t, b, d = min(inside, key=lambda e: e[0])
                return self.slice(t, b, box, d, self.dtype(op, port), f"{op}/fddps_part")
            if box != full:
                tiled = self.tiles(op, port, entries, box, device)
                if tiled is not None:
                    return tiled
        return self.slice(self.materialize(op, port, device), full, box, device,
                          self.dtype(op, port), op)

    def tiles(self, op, port, entries, box, device):
        """``box`` of a split output from the parts it overlaps (a halo read): each piece
        sliced on its part's device, so that only the piece moves, then concatenated
        on ``device``; None if the parts do not tile ``box``."""
        key = ("tiles", op, port, box, device)
        if key not in self.cache:
            source = {}
            for t, b, d in entries:  # replicas: read one, a local one if any
                if b not in source or (d == device and source[b][1] != device):
                    source[b] = (t, d)
            dtype, pieces = self.dtype(op, port), []
            for b, (t, d) in source.items():
                inter = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(b, box))
                if all(x1 > x0 for x0, x1 in inter):
                    pieces.append((inter, self.slice(t, b, inter, d, dtype, f"{op}/fddps_part")))
            volume = sum(np.prod([x1 - x0 for x0, x1 in inter]) for inter, _ in pieces)
            if volume != np.prod([x1 - x0 for x0, x1 in box]):
                return None
            self.cache[key] = self.assemble(pieces, device, dtype,
                                            f"{op}/fddps_halo_{port}_{len(self.cache)}")
        return self.cache[key]


def _overlaps(a, b):
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b))




def _node(name, op, inputs, device, dtype=None, **attrs):
    """A NodeDef: ``T`` = ``dtype``; other attributes as bool, int, float, str or dtype."""
    tf = _tf()
    node = tf.compat.v1.NodeDef(name=name, op=op, device=device)
    node.input.extend(inputs)
    if dtype is not None:
        node.attr["T"].type = dtype.as_datatype_enum
    for key, value in attrs.items():
        if isinstance(value, bool):
            node.attr[key].b = value
        elif isinstance(value, int):
            node.attr[key].i = value
        elif isinstance(value, float):
            node.attr[key].f = value
        elif isinstance(value, str):
            node.attr[key].s = value.encode()
        else:
            node.attr[key].type = value.as_datatype_enum
    return node


def _sum_nhw(w, name, x, device, dtype, axes=(0, 1, 2)):
    """Per-channel sum over the sample, height and width axes (``axes``: where they are,
    NHWC's by default)."""
    tf = _tf()
    axes = w.const(f"{name}/axes", list(axes), tf.int32, device)
    w.add(_node(name, "Sum", [x, axes], device, dtype, Tidx=tf.int32, keep_dims=False))
    return name


def _divided(w, name, x, divisor, device, dtype):
    """``x / divisor``. Divisors are counts (integers, exact in any float type), never
    their reciprocals: a reciprocal rounded to float32 stays rounded when the graph is
    widened (:func:`fddps.tf.float64.as_float64`), and the rewrite would then differ
    from the original by float32 rounding even in float64."""
    w.add(_node(name, "RealDiv", [x, w.const(f"{name}/divisor", divisor, dtype, device)],
                device, dtype))
    return name


def _write_batch_norm(w, name, op, cfg, dims, tf_op, node_def):
    """Batch norm split by sample, height or width (and channel): statistics reduced
    across the parts, in either layout (NHWC, NCHW: sums over the layout's n, h, w axes).

    Forward: the mean is the sum of the parts' sums over N = n*h*w; the
    variance likewise from the parts' sums of squared deviations from that
    mean (two passes, as the fused kernel); each part then normalises with
    ``FusedBatchNormV3(is_training=False)`` at those statistics. Outputs 1-4
    are what the training kernel returns: the mean, the variance with
    Bessel's correction, the mean, the biased variance. Backward: each part
    forms x-hat, the sums of dy and dy * x-hat are reduced across the parts
    (they are ``offset_backprop`` and ``scale_backprop``), and
    ``dx = scale * rsqrt(var + eps) * (dy - sum(dy)/N - x-hat * sum(dy*x-hat)/N)``.
    Returns per output the part entries ``[(tensor, box, device)]`` and the part names.
    """
    tf = _tf()
    grad = op.op_type == "FusedBatchNormGradV3"
    layout = dims.inputs[0]  # x's axes: "nhwc" or "nchw"
    count = float(np.prod([dims.extent[d] for d in "nhw"]))
    nhw = tuple(layout.index(d) for d in "nhw")  # the axes the statistics sum over
    dtype = tf_op.inputs[0].dtype
    eps = float(node_def.attr["epsilon"].f)
    all_parts = parts(op, cfg, dims)
    groups = {}
    for p in all_parts:
        groups.setdefault(p.box["c"], []).append(p)
    outs = [[] for _ in op.output_shapes]
    names = []
    for cg, members in groups.items():
        home = members[0].device
        base = f"{name}/fddps_stats_{cg[0]}"
        chan = ((cg[0], cg[1]),)

        def read(k, p, box):
            src, port = op.inputs[k]
            return w.read(src, port, box, p.device, op.input_shapes[k])

        def box_of(p):
            return tuple(p.box[d] for d in layout)

        def bc(vec):
            """A per-channel vector shaped to broadcast against x: NCHW's channels are
            not the last axis, so ``[C]`` becomes ``[C, 1, 1]`` there."""
            if layout[-1] == "c":
                return vec
            key = ("bc", vec, home)
            if key not in w.cache:
                out = f"{base}/bc/{vec.replace(':', '_')}"  # vec may be an output port
                shape = [-1] + [1] * (len(layout) - 1 - layout.index("c"))
                w.add(_node(out, "Reshape", [vec, w.const(f"{out}/shape", shape, tf.int32, home)],
                            home, dtype, Tshape=tf.int32))
                w.cache[key] = out
            return w.cache[key]

        empty = [w.const(f"{base}/empty_{k}", np.zeros(s if s and None not in s else (0,)),
                         tf_op.outputs[k].dtype, home)
                 for k, s in enumerate(op.output_shapes) if not isinstance(dims.outputs[k], tuple)]
        if not grad:
            sums = [_sum_nhw(w, f"{name}/fddps_part_{p.index}/sum", read(0, p, box_of(p)), p.device,
                             dtype, nhw) for p in members]
            w.add(_node(f"{base}/sum", "AddN", sums, home, dtype, N=len(sums)))
            mean = _divided(w, f"{base}/mean", f"{base}/sum", count, home, dtype)
            sq = []
            for p in members:
                pre = f"{name}/fddps_part_{p.index}"
                w.add(_node(f"{pre}/dev", "Sub", [read(0, p, box_of(p)), bc(mean)], p.device,
                            dtype))
                w.add(_node(f"{pre}/sq", "Square", [f"{pre}/dev"], p.device, dtype))
                sq.append(_sum_nhw(w, f"{pre}/sqsum", f"{pre}/sq", p.device, dtype, nhw))
            w.add(_node(f"{base}/sqsum", "AddN", sq, home, dtype, N=len(sq)))
            var = _divided(w, f"{base}/var", f"{base}/sqsum", count, home, dtype)
            unbiased = _divided(w, f"{base}/var_unbiased", f"{base}/sqsum", max(count - 1.0, 1.0),
                               home, dtype)
            for p in members:
                pname = f"{name}/fddps_part_{p.index}"
                part = _tf().compat.v1.NodeDef()
                part.CopyFrom(node_def)
                part.name, part.device = pname, p.device
                part.attr.pop("_class", None)
                part.attr["is_training"].b = False
                del part.input[:]
                part.input.extend([read(0, p, box_of(p)), read(1, p, chan), read(2, p, chan),
                                   mean, var])
                w.add(part)
                names.append(pname)
                outs[0].append((pname, box_of(p), p.device))
            stats = [mean, unbiased, mean, var]
        else:
            mean, var = read(3, members[0], chan), read(4, members[0], chan)
            w.add(_node(f"{base}/var_eps", "AddV2",
                        [var, w.const(f"{base}/eps", eps, dtype, home)], home, dtype))
            w.add(_node(f"{base}/inv", "Rsqrt", [f"{base}/var_eps"], home, dtype))
            inv = f"{base}/inv"
            xhat, dsum, dxsum = {}, [], []
            for p in members:
                pre = f"{name}/fddps_part_{p.index}"
                dy = read(0, p, box_of(p))
                w.add(_node(f"{pre}/centred", "Sub", [read(1, p, box_of(p)), bc(mean)], p.device,
                            dtype))
                w.add(_node(f"{pre}/xhat", "Mul", [f"{pre}/centred", bc(inv)], p.device, dtype))
                w.add(_node(f"{pre}/dy_xhat", "Mul", [dy, f"{pre}/xhat"], p.device, dtype))
                xhat[p.index] = f"{pre}/xhat"
                dsum.append(_sum_nhw(w, f"{pre}/dy_sum", dy, p.device, dtype, nhw))
                dxsum.append(_sum_nhw(w, f"{pre}/dy_xhat_sum", f"{pre}/dy_xhat", p.device, dtype,
                                      nhw))
            w.add(_node(f"{base}/offset_grad", "AddN", dsum, home, dtype, N=len(dsum)))
            w.add(_node(f"{base}/scale_grad", "AddN", dxsum, home, dtype, N=len(dxsum)))
            mean_dy = _divided(w, f"{base}/mean_dy", f"{base}/offset_grad", count, home, dtype)
            mean_dyx = _divided(w, f"{base}/mean_dy_xhat", f"{base}/scale_grad", count, home,
                               dtype)
            w.add(_node(f"{base}/gain", "Mul", [read(2, members[0], chan), inv], home, dtype))
            for p in members:
                pre = f"{name}/fddps_part_{p.index}"
                dy = read(0, p, box_of(p))
                w.add(_node(f"{pre}/dy_centred", "Sub", [dy, bc(mean_dy)], p.device, dtype))
                w.add(_node(f"{pre}/xhat_term", "Mul", [xhat[p.index], bc(mean_dyx)], p.device,
                            dtype))
                w.add(_node(f"{pre}/inner", "Sub", [f"{pre}/dy_centred", f"{pre}/xhat_term"],
                            p.device, dtype))
                w.add(_node(pre, "Mul", [f"{pre}/inner", bc(f"{base}/gain")], p.device, dtype))
                names.append(pre)
                outs[0].append((pre, box_of(p), p.device))
            stats = [f"{base}/scale_grad", f"{base}/offset_grad"]
        for k, t in enumerate(stats, start=1):
            outs[k].append((t, chan, home))
        for k, t in zip([k for k in range(len(op.output_shapes))
                         if not isinstance(dims.outputs[k], tuple)], empty):
            outs[k].append((t, (), home))
    return outs, names


def _pad(w, name, x, pads, device, dtype, value=None):
    """``x`` padded by ``pads`` (``[before, after]`` per axis) with zeros or ``value``."""
    if not any(a or b for a, b in pads):
        return x
    tf = _tf()
    inputs = [x, w.const(f"{name}/paddings", pads, tf.int32, device)]
    if value is not None:
        inputs.append(w.const(f"{name}/value", value, dtype, device))
    w.add(_node(name, "PadV2" if value is not None else "Pad", inputs, device, dtype,
                Tpaddings=tf.int32))
    return name


def _count_scale(halos, windows, layout):
    """Per window of a padded average pool: ``(kernel area, real (unpadded) area)``, the
    area shaped to broadcast against the pool's output, whose axes are ``layout``
    (``[1, rows, cols, 1]`` for NHWC, ``[1, 1, rows, cols]`` for NCHW); None when every
    window lies inside the input. Both are integers, so the rescaling is exact in any
    float type (:func:`_rescaled`)."""
    hh, hw = halos["h"], halos["w"]
    ch, cw = hh.counts(*windows["h"]), hw.counts(*windows["w"])
    if (ch == hh.kernel).all() and (cw == hw.kernel).all():
        return None
    real = np.outer(ch, cw).astype(float)
    return float(hh.kernel * hw.kernel), real.reshape(
        [real.shape[0] if a == "h" else real.shape[1] if a == "w" else 1 for a in layout])


def _rescaled(w, name, x, scale, device, dtype):
    """``x * kernel area / real area`` (``scale`` from :func:`_count_scale`): a window
    averaged over the kernel's area, as a ``VALID`` part computes it, made an average
    over its real cells, as ``SAME`` padding computes it."""
    area, real = scale
    w.add(_node(f"{name}/by_area", "Mul", [x, w.const(f"{name}/area", area, dtype, device)],
                device, dtype))
    return _divided(w, name, f"{name}/by_area", real, device, dtype)


def _write_windowed(w, name, op, cfg, dims, tf_op, node_def, controls):
    """A sliding-window op split by height or width: each part computes exactly its rows.

    Per part and spatial dimension (:class:`fddps.strategy.ops.Halo`): the
    windows it computes with (its own rows; for a backprop, the windows
    touching its rows), the input rows those windows read (its rows plus a
    halo from the neighbouring parts, :meth:`_Writer.read`), and the padding
    rows beyond the input's border, added explicitly (``Pad``; ``PadV2``
    with -inf for a max pool). The part then runs the op with ``VALID``
    padding. An average pool's windows that overlap padding are rescaled to
    their real row count (SAME divides by it). A backprop computes the
    gradient of the rows its windows read and keeps its own rows (``Slice``,
    zeros ``Pad`` for rows no window touches). Returns per output the part
    entries ``[(tensor, box, device)]`` and the part names.
    """
    tf = _tf()
    backward = dims.description.halo == "backward"
    dtype = tf_op.outputs[0].dtype
    lowest = -np.inf if op.op_type.startswith("MaxPool") else None
    outs, names = [[] for _ in op.output_shapes], []
    for p in parts(op, cfg, dims):
        pname = f"{name}/fddps_part_{p.index}"
        windows = {d: h.windows(*p.box[d]) for d, h in dims.halo.items()}
        reads = {d: h.reads(*p.box[d]) for d, h in dims.halo.items()}
        out_box = _box(dims.outputs[0], op.output_shapes[0], p.box)
        names.append(pname)
        if any(b <= a for a, b in windows.values()):  # no window touches these rows
            w.add(const_node(pname, np.zeros([b - a for a, b in out_box]), dtype, p.device))
            outs[0].append((pname, out_box, p.device))
            continue
        # The box the part computes: its own, or (backward) every row its windows read.
        region = tuple(reads[a] if a in dims.halo and backward else r
                       for a, r in zip(dims.outputs[0], out_box))
        node = tf.compat.v1.NodeDef()
        node.CopyFrom(node_def)
        node.name = f"{pname}/window" if backward or op.op_type == "AvgPool" else pname
        node.device = p.device
        for key in ("_class", "_output_shapes", "explicit_paddings"):
            node.attr.pop(key, None)
        node.attr["padding"].s = b"VALID"
        del node.input[:]
        for k, ((src, port), axes) in enumerate(zip(op.inputs, dims.inputs)):
            shape = op.input_shapes[k]
            if isinstance(axes, tuple) and axes and axes[0] == "shape":
                node.input.append(w.const(f"{pname}/shape_{k}", [b - a for a, b in region],
                                          tf_op.inputs[k].dtype, p.device))
                continue
            box = tuple((a.halo.clip(*reads[a.dim])[0] if a.reads else windows[a.dim])
                        if isinstance(a, HaloAxis) else r
                        for a, r in zip(axes, _box(axes, shape, p.box)))
            t = w.read(src, port, box, p.device, shape)
            pads = [list(a.halo.clip(*reads[a.dim])[1]) if isinstance(a, HaloAxis) and a.reads
                    else [0, 0] for a in axes]
            t = _pad(w, f"{pname}/pad_{k}", t, pads, p.device, dtype, lowest)
            if op.op_type == "AvgPoolGrad":  # each window's gradient / its real count
                scale = _count_scale(dims.halo, windows, dims.outputs[0])
                t = t if scale is None else _rescaled(w, f"{pname}/grad_scaled", t, scale,
                                                      p.device, dtype)
            node.input.append(t)
        node.input.extend(controls)
        w.add(node)
        result = node.name
        if op.op_type == "AvgPool":
            scale = _count_scale(dims.halo, windows, dims.outputs[0])
            if scale is None:
                w.add(_node(pname, "Identity", [result], p.device, dtype))
            else:
                _rescaled(w, pname, result, scale, p.device, dtype)
        elif backward:  # keep the part's rows of the region; zeros where no window reached
            keep = tuple((max(a, r0), min(b, r1)) for (a, b), (r0, r1) in zip(out_box, region))
            cropped = w.slice(result, region, keep, p.device, dtype, pname)
            pads = [[k0 - a, b - k1] for (a, b), (k0, k1) in zip(out_box, keep)]
            if _pad(w, pname, cropped, pads, p.device, dtype) != pname:
                w.add(_node(pname, "Identity", [cropped], p.device, dtype))
        outs[0].append((pname, out_box, p.device))
    return outs, names


def rewrite_strategy(graph_def, strategy, fetches, devices=None, return_shards=False, *,
                     step=None):
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

    return_shards : bool
        Also return the variables written as shards (:mod:`fddps.tf.variable_shards`).
    step : StepGraph, optional
        The step graph of ``graph_def`` and ``fetches``
        (:func:`~fddps.tf.strategy_graph.step_graph`) when the caller has it; built
        here otherwise.

    Returns
    -------
    GraphDef, or (GraphDef, dict of str -> ShardedVariable) with ``return_shards``

    Raises
    ------
    StrategyError
        If the strategy does not validate, or splits an op the rewrite cannot
        split yet (see the module notes), or splits a variable one of whose
        handle's users cannot be written per shard (named).
    """
    tf = _tf()
    analysis = analyse(graph_def)
    if step is None:
        step = step_graph(analysis, fetches)
    validate(strategy, step, devices or strategy.devices())
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(analysis.graph_def.versions)
    out.library.CopyFrom(analysis.graph_def.library)
    by_name = {n.name: n for n in analysis.graph_def.node}
    split_vars = _split_variables(analysis, step, strategy)
    handle_users = []  # nodes outside the step using a split variable's handle
    for node in analysis.graph_def.node:
        if node.name not in step.ops:
            if any(_parse_input(s)[0] in split_vars and not s.startswith("^") for s in node.input):
                handle_users.append(node)
            else:
                out.node.add().CopyFrom(node)
    w = _Writer(out, analysis.graph)
    w.shards, w.names = {}, set(by_name)
    w.home = {n.name: (strategy.config(n.name).devices[0] if n.name in step.ops else n.device)
              for n in analysis.graph_def.node}
    tasks = {}
    for name, op in step.ops.items():
        cfg = strategy.config(name)
        original = by_name[name]
        if cfg.num_parts == 1 and any(src in split_vars for src, _ in op.inputs):
            raise StrategyError(f"op {name!r} ({op.op_type}) is whole but reads variable "
                                f"{next(s for s, _ in op.inputs if s in split_vars)!r}, which "
                                "the strategy splits")
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
        if name in split_vars or any(src in split_vars for src, _ in op.inputs):
            dims = resolve(op)
            all_parts = parts(op, cfg, dims)
            controls = [f"^{t}" for c in op.control_inputs for t in tasks[c]]
            if op.op_type == "VarHandleOp":
                tasks[name] = write_shards(w, name, all_parts, lambda p: _box(
                    dims.outputs[0], op.param_shape, p.box), original)
                continue  # the whole variable is gone: its handle's users use the shards
            outs, names = write_shard_users(w, name, op, all_parts, original, controls)
            tasks[name] = names
            _write_whole(w, name, op, outs, names, cfg, analysis.graph)
            continue
        if op.op_type in NOT_REWRITTEN:
            raise StrategyError(f"op {name!r} ({op.op_type}) is split but its variable is not: "
                                "split the variable's whole colocation group (its reads, slots "
                                "and update) alike, or keep them whole")
        try:
            dims = resolve(op)
        except NotDescribed as why:  # validate() has caught this; keep the message if not
            raise StrategyError(f"op {name!r} ({op.op_type}) cannot be split: {why}") from None
        partial = any(cfg.split.get(d, 1) > 1 for d in dims.reduction)
        names, outs = [], [[] for _ in op.output_shapes]
        tf_op = analysis.graph.get_operation_by_name(name)
        stats_split = any(cfg.split.get(d, 1) > 1 for d in dims.stats)
        halo_split = any(cfg.split.get(d, 1) > 1 for d in dims.halo)
        if stats_split:
            outs, names = _write_batch_norm(w, name, op, cfg, dims, tf_op, original)
        elif halo_split:
            outs, names = _write_windowed(w, name, op, cfg, dims, tf_op, original,
                                          [f"^{t}" for c in op.control_inputs for t in tasks[c]])
        for p in ([] if stats_split or halo_split else parts(op, cfg, dims)):
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
                # Sum of the part's box over the whole count: partials add to the mean.
                node.name, node.op = f"{pname}/sum", "Sum"
                w.add(node)
                count = float(np.prod([dims.extent[d] for d in dims.reduction]))
                _divided(w, pname, node.name, count, p.device, tf_op.outputs[0].dtype)
            else:
                w.add(node)
            names.append(pname)
            for k, box in enumerate(out_boxes):
                outs[k].append((_tensor(pname, k), box, p.device))
        tasks[name] = names
        _write_whole(w, name, op, outs, names, cfg, analysis.graph, partial)
    write_handle_users(w, handle_users)
    retarget(out, {v: tasks[v] for v in split_vars})
    if return_shards:
        return out, sharded_table(w, analysis.graph)
    return out


def _write_whole(w, name, op, outs, names, cfg, graph, partial=False):
    """``X``: the whole outputs of split op ``X`` (an ``IdentityN``), for fetches, control
    inputs and whole readers; a ``NoOp`` after every part for an op without outputs."""
    tf = _tf()
    for k in range(len(op.output_shapes)):
        w.entries[name, k] = (outs[k], partial)
    if not op.output_shapes:
        node = tf.compat.v1.NodeDef(name=name, op="NoOp", device=cfg.devices[0])
        node.input.extend(f"^{t}" for t in names)
        w.add(node)
        return
    ident = tf.compat.v1.NodeDef(name=name, op="IdentityN", device=cfg.devices[0])
    ident.input.extend(w.materialize(name, k) for k in range(len(op.output_shapes)))
    ident.attr["T"].list.type.extend(t.dtype.as_datatype_enum
                                     for t in graph.get_operation_by_name(name).outputs)
    w.add(ident)


def _split_variables(analysis, step, strategy) -> set:
    """The variables ``strategy`` splits, each checked writable (a clear error if not)."""
    out = {n for n, op in step.ops.items()
           if op.op_type == "VarHandleOp" and strategy.config(n).num_parts > 1}
    if out:
        blockers = handle_blockers(analysis.graph_def, set(step.ops))
        for name in out:
            check_sharded_group(step, strategy, name, blockers)
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
                   unknown_dim=1, step=None, read_cache=None):
    """:func:`fddps.tf.place` with a given strategy: the rewritten graph and its predicted step.

    The :class:`~fddps.tf.placement.Placement`'s ``graph_def`` is
    :func:`rewrite_strategy`'s, and its schedule (``makespan``,
    ``peak_memory``) is that GraphDef's own step, every node costed where the
    rewrite put it and run in the order TensorFlow's executor picks on each
    device (:func:`fddps.simulate.executor_policy`'s model, whose step is
    ``executor_makespan``): what TensorFlow runs, including the slices, concatenations, statistics and
    sums the rewrite adds between parts. The strategy's task graph
    (:func:`fddps.strategy.expand`, what the searches score) approximates
    those (a slice is paid on its reader's device, a part's tasks run in
    another order); its step is ``info["expansion_makespan"]``, and
    ``info["single_device_step"]`` is the original step on the best single
    device. ``step``: the step graph of ``graph_def`` and ``fetches``
    (:func:`~fddps.tf.strategy_graph.step_graph`) when the caller has it
    already (a search writing several candidates); built here otherwise.
    ``read_cache``: a dict shared by the candidates one call writes (same
    ``graph_def``, devices, cost model and ``fetches``): a rewritten GraphDef
    byte-identical to one already read (two strategies that write the same
    graph, e.g. FD-DPS's whole-op placement that keeps everything on one
    device, and the one-device baseline) is not analysed again.

    Raises
    ------
    StrategyError
        If the strategy does not fit the graph or the devices, or cannot be
        written yet (see :func:`rewrite_strategy`).
    """
    import time

    from ..strategy.expand import expand
    from .devices import make_cluster
    from .placement import Placement

    t0 = time.perf_counter()
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    if step is None:
        step = step_graph(analysis, fetches)
    expansion = expand(step, strategy, cluster, cost_model)
    g = expansion.graph
    # The original step on one device, for summary(): its ops' costs, summed.
    rows = analysis.table[analysis.table["name"].isin(step.ops)]
    with warnings.catch_warnings():  # the expansion named the op types that fall back
        from costmodel import ProfileCoverageWarning

        warnings.simplefilter("ignore", ProfileCoverageWarning)
        per_type = {t: float(np.sum(cost_model.op_times(rows, t)))
                    for t in {d.type for d in cluster.devices}}
    out, shards = rewrite_strategy(analysis, strategy,
                                   fetches or [n.name for n in analysis.graph_def.node],
                                   list(cluster.names), return_shards=True, step=step)
    schedule = _written_step(out, strategy, cluster, cost_model, fetches, unknown_dim,
                             analysis=analysis, read_cache=read_cache)
    info = {"analysis": analysis, "strategy": strategy.name, "tasks": g.num_ops,
            "ops": len(step), "nodes": len(analysis.graph_def.node),
            "ops_split": sum(len(t) > 1 for t in expansion.tasks.values()),
            "executor_makespan": float(simulate(schedule.graph, cluster, schedule.device,
                                                policy=executor_policy(cluster)).makespan),
            "algorithm": "strategy",
            "expansion_makespan": expansion.simulate(cluster).makespan,
            "sharded_variables": shards,
            "single_device_step": min(per_type[d.type] / d.speed for d in cluster.devices),
            "single_device": min(cluster.devices, key=lambda d: per_type[d.type] / d.speed).name,
            "place_seconds": time.perf_counter() - t0}
    return Placement(out, schedule, cluster, analysis.table, info)


def _same_nodes(a, b) -> bool:
    """Whether two GraphDefs have the same nodes (names, op types, inputs) in the same order.

    The order matters: the executor's order breaks ties by it (a whole-op
    rewrite that lists the same nodes in another order predicts another step).
    """
    return len(a.node) == len(b.node) and all(
        x.name == y.name and x.op == y.op and list(x.input) == list(y.input)
        for x, y in zip(a.node, b.node))


def _written_step(graph_def, strategy, cluster, cost_model, fetches, unknown_dim=1, *,
                  analysis=None, read_cache=None):
    """The step of a rewritten GraphDef as placed: its nodes in TensorFlow's executor order.

    Every node of the step is costed by ``cost_model`` on the device the
    rewrite gave it (a node without one runs on the strategy's default
    device); parts scale their op's profiled time (``profile_name``, set by
    :func:`fddps.tf.read.read_graph_def`). A rewrite that only set devices
    (a whole-op strategy: the same nodes and edges as ``analysis``'s graph)
    is read from ``analysis`` rather than analysed again; one byte-identical
    to a GraphDef read before into ``read_cache`` (a dict), from there.
    """
    from ..schedule import Schedule
    from ..simulate import executor_order
    from .devices import normalize_device
    from .read import read_graph_def

    source = (analysis if analysis is not None and _same_nodes(graph_def, analysis.graph_def)
              else graph_def)
    key = (graph_def.SerializeToString(deterministic=True)
           if read_cache is not None and source is graph_def else None)
    if key is not None and key in read_cache:
        graph = read_cache[key]
    else:
        graph, _ = read_graph_def(source, cost_model, cluster, unknown_dim=unknown_dim,
                                  fetches=fetches, splits=False)
        if key is not None:
            read_cache[key] = graph
    node_device = {n.name: n.device for n in graph_def.node}
    default = cluster.device_index(normalize_device(strategy.default_device))
    device = np.array([cluster.device_index(normalize_device(node_device[name]))
                       if node_device.get(name) else default for name in graph.names],
                      dtype=np.int64)
    return Schedule.from_order(graph, cluster, device,
                               executor_order(graph, cluster, device, policy=executor_policy(cluster)),
                               algorithm="strategy", info={"strategy": strategy, "splits": []})
