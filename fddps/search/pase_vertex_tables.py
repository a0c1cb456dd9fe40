"""The DP's tables as arrays: every configuration of a vertex (:func:`vertex_table`) and every
pair of configurations of an edge (:func:`edge_table`) costed at once.

A vertex's term (:mod:`~fddps.search.pase_tables`) is what its own ops cost
under one of its configurations: every part's task (or, for batch norm split
along its statistics, the passes over the part and its statistics tasks), what
each op pays to read a tensor of another op of the same vertex (the pieces it
moves between devices, the slice, concatenation or partial-sum reduce it
assembles them with), and the statistics each part sends to the parts of its
channels. An edge's term is what the readers across the pair pay to read the
other vertex's tensors, the same kinds of records. Expanding them record by
record for every configuration (:func:`~fddps.search.pase_tables.term_items`)
took most of the search.

Here each op's distinct configurations over its vertex's are grouped
(:class:`_OpGroups`), their parts' boxes (:func:`fddps.strategy.strategy.parts`'
bounds) are arrays, and the tasks' cost-model rows (FLOPs by the part's share
of the iteration domain, bytes from its tensors' boxes) are computed for every
configuration and part at once. A feed (a reader's parts against a producer's
pieces, :class:`_Pieces`) is intersected for every part and piece at once, for
every pair of reader and producer configurations it meets: the vertex's own
configurations (producer and reader under the same one) or an edge's pairs.
The elements a part shares with a piece are a product of 1-D overlaps, read
from small tables of the distinct intervals on each half of the axes
(:func:`_elements`) rather than intersecting every (pair, part, piece) box axis
by axis (:func:`_feed_geometry_cells`, kept as the tests' reference): on
AlexNet at 8 GPUs that was ~45% of the search (8,755 pairs of configurations x
8 parts x 8 pieces per big edge). Transfers are kept as the cells that move
(no dense (pair, part, piece) arrays). Every row of the whole build goes to the
cost model in one call per device type (:class:`RowSink`).

The values are the same floats as the record-by-record costing: the rows have
the fields :func:`~fddps.strategy.expand.op_records` gives them (computed by
the same arithmetic: extents multiplied as integers, or as floats below 2**53,
where both are exact), and each configuration's busiest device and busiest
link are accumulated in the records' own order (a configuration without a
record at some position adds zero, which is exact). A vertex or edge this path
does not describe (a tensor of unknown shape, axes not all described) returns
``None``; the caller then costs it the older way.
"""

from __future__ import annotations

import functools
import hashlib
import warnings

import numpy as np
import pandas as pd

from ..strategy.expand import SHAPE_ONLY_OPS, SYNC_BATCH_NORM
from ..strategy.kernel_shape import part_kernel_shape
from ..strategy.ops import SLICE_VIEW_ALIGNMENT, HaloAxis
from ..strategy.strategy import _part_boxes
from .pase_repeats import _frozen

_ROW_COLUMNS = ["name", "op_type", "flops", "input_bytes", "output_bytes", "param_bytes",
                "profile_name", "kernel_shape"]


class RowSink:
    """Cost-model rows of a whole build, costed together: blocks of rows given as arrays
    (a vertex's tasks), and single rows given as dicts (slices, concatenations, reduces:
    kept once per distinct fields).

    :meth:`costs` calls the cost model once per device type for every row added since
    the last call; ids stay valid across calls.
    """

    def __init__(self, cluster, cost_model):
        devices = cluster.devices
        self.types = list(dict.fromkeys(d.type for d in devices))
        self.type_of = np.array([self.types.index(d.type) for d in devices])
        self.cost_model = cost_model
        self.columns = {c: [] for c in _ROW_COLUMNS}
        self.n = 0
        self.single = {}
        self._columns_of = {}  # _repeated's columns
        self.costed = np.zeros((0, len(devices)))
        # Whether a row's time can depend on its names (a profile): where it cannot, rows
        # alike but for their names are costed once (:meth:`costs`) and a vertex like an
        # earlier one reads the earlier one's rows (pase_repeats). A cost model that does
        # not say is taken to read them.
        reads = getattr(cost_model, "times_read_names", None)
        self.named = reads is None or any(reads(t) for t in self.types)

    def add_block(self, name, op_type, flops, input_bytes, output_bytes, param_bytes,
                  profile_name, kernel_shape=None) -> int:
        """Append rows (arrays of equal length, or scalars repeated); the first one's id."""
        m = len(flops)
        base = self.n
        for c, x in zip(_ROW_COLUMNS, (name, op_type, flops, input_bytes, output_bytes,
                                       param_bytes, profile_name, kernel_shape)):
            if not isinstance(x, np.ndarray) and np.ndim(x) == 0:
                x = self._repeated(x, m)
            self.columns[c].append(np.asarray(x))
        self.n += m
        return base

    def _repeated(self, x, m) -> np.ndarray:
        """A read-only column of ``m`` copies of the scalar ``x`` (object for a string or
        None, else float64), one per distinct ``(x, m)``: blocks repeat few of them (zero
        parameter bytes, no profile name), and columns are never written to."""
        text = x is None or isinstance(x, str)
        if not text and x != x:  # (NaN: its bits are not in its repr)
            return np.full(m, x, dtype=np.float64)
        key = (type(x), x if text else repr(x), m)  # (a number's repr tells -0.0 from 0.0)
        got = self._columns_of.get(key)
        if got is None:
            got = np.full(m, x, dtype=object if text else np.float64)
            got.setflags(write=False)
            self._columns_of[key] = got
        return got

    def add_row(self, spec) -> int:
        """A dict row's id (one per distinct fields)."""
        key = tuple(spec.get(c) for c in _ROW_COLUMNS)
        got = self.single.get(key)
        if got is None:
            got = self.single[key] = self.add_block(*[np.array([v], dtype=object) if
                                                      isinstance(v, str) or v is None else
                                                      np.array([v], dtype=np.float64)
                                                      for v in key])
        return got

    def chunks(self) -> int:
        """How many blocks of rows were added so far (an argument of :meth:`chunk_columns`)."""
        return len(self.columns["name"])

    def chunk_columns(self, first) -> list:
        """The blocks added since :meth:`chunks` gave ``first``: per block, a dict of
        column -> array (the arrays added, not copies: not to be written to)."""
        return [{c: self.columns[c][k] for c in _ROW_COLUMNS}
                for k in range(first, len(self.columns["name"]))]

    def add_columns(self, columns) -> int:
        """Append a block given as :meth:`chunk_columns` gives one; its first row's id."""
        base = self.n
        for c in _ROW_COLUMNS:
            self.columns[c].append(columns[c])
        self.n += len(columns["name"])
        return base

    def costs(self) -> np.ndarray:
        """``(rows, devices)``: each row's seconds on each device of the cluster."""
        done = len(self.costed)
        if self.n > done:
            table = pd.DataFrame({c: (np.concatenate(self.columns[c]) if self.columns[c] else [])
                                  for c in _ROW_COLUMNS})
            table = table.iloc[done:].reset_index(drop=True) if done else table
            back = None
            if not self.named:
                table, back = _distinct_rows_of(table)
            with warnings.catch_warnings():
                from costmodel import ProfileCoverageWarning

                warnings.simplefilter("ignore", ProfileCoverageWarning)
                cost = np.column_stack([np.asarray(self.cost_model.op_times(table, t),
                                                   dtype=np.float64) for t in self.types])
            if back is not None:
                cost = cost[back]
            self.costed = np.concatenate([self.costed, cost[:, self.type_of]])
        return self.costed


#: The columns a name-blind cost model times a row by (:meth:`RowSink.costs`).
_TIMED_COLUMNS = [c for c in _ROW_COLUMNS if c not in ("name", "profile_name")]


def _distinct_rows_of(table):
    """``(distinct, back)``: the rows of ``table`` distinct in every column but the names
    (the first of each, in order of first appearance), and each row's index among them
    (``table`` row ``r`` is ``distinct`` row ``back[r]`` but for its names). A DP build's
    rows repeat a few thousand distinct ones (Inception-V3 at 4 GPUs: 188k rows, 5.6k
    distinct; AlexNet at 8: 60k, 7.6k)."""
    codes = None
    for c in _TIMED_COLUMNS:
        # (column by column, the pair of codes factorised again as one integer: a few
        # hash passes, where tuples of the six fields took ten times as long)
        own, uniq = pd.factorize(table[c].to_numpy(), use_na_sentinel=False)
        codes = own if codes is None else pd.factorize(codes * len(uniq) + own)[0]
    back, first = _first_appearance(codes)
    return table.iloc[first].reset_index(drop=True), back


@functools.lru_cache(maxsize=8192)
def _boxes_array(extents: tuple, factors: tuple) -> np.ndarray:
    """``(parts, dims, 2)`` of :func:`~fddps.strategy.strategy._part_boxes` (read-only)."""
    out = np.asarray(_part_boxes(extents, factors), dtype=np.int64).reshape(
        -1, len(extents), 2)
    out.setflags(write=False)
    return out


class _Undescribed(Exception):
    """A record this module does not describe (the vertex is costed record by record)."""


class _OpGroups:
    """One op's distinct configurations over a vertex's, and their parts as arrays."""

    _SHARED = ("gid", "reps", "nparts", "P", "split", "lo", "hi", "dev", "valid",
               "stats_split", "letter", "memo")

    def __init__(self, step, layouts, index, name, cfgs, shared=None):
        self.op = step.ops[name]
        self.name = name
        dims = self.dims = layouts.dims_of(name)
        # The configurations' OpConfig objects repeat (vertex_configs shares one among
        # the ops and factor tuples that split alike): each distinct object keyed once,
        # then the groups numbered by first appearance as keying every entry would.
        ids = tuple(map(id, cfgs))  # (the objects live in the build's configs: ids distinct)
        # Ops given the very same objects in every configuration (a layer's element-wise
        # ops) group them alike: grouped once.
        grouped = shared.get(("ids", ids)) if shared is not None else None
        if grouped is None:
            obj = dict(zip(ids, cfgs))  # in order of first appearance
            key_of, reps, group = {}, [], {}
            for i, cfg in obj.items():
                k = cfg.key
                g = key_of.get(k)
                if g is None:
                    g = key_of[k] = len(reps)
                    reps.append(cfg)
                group[i] = g
            gid = np.fromiter(map(group.__getitem__, ids), dtype=np.int64, count=len(ids))
            grouped = (key_of, reps, gid)
            if shared is not None:
                shared["ids", ids] = grouped
        key_of, reps, gid = grouped
        # Ops of one domain (letters, extents, statistics) configured alike in every
        # configuration (a layer's element-wise ops) share their arrays (read-only).
        key = None
        if shared is not None:
            key = (None if dims is None else (tuple(dims.dims), tuple(
                int(dims.extent[d]) for d in dims.dims), tuple(sorted(dims.stats))),
                tuple(key_of), gid.tobytes())
            if key in shared:
                for a, x in zip(self._SHARED, shared[key]):
                    setattr(self, a, x)
                return
        self._build(index, dims, list(key_of), reps, gid)
        if key is not None:
            shared[key] = tuple(getattr(self, a) for a in self._SHARED)

    def _build(self, index, dims, keys, reps, gid):
        """The arrays of the groups ``reps`` (keyed ``keys``: split items and devices)."""
        self.gid = gid
        self.reps = reps
        nparts = [c.num_parts for c in reps]
        self.nparts = np.asarray(nparts)
        P = self.P = max(nparts)
        self.split = self.nparts > 1
        letters = dims.dims if dims is not None else ()
        D = len(letters)
        # Part boxes of the iteration domain (split configurations) and devices: each
        # distinct split's boxes and each distinct device tuple's row built once, then
        # gathered for every group at once.
        stats = dims.stats if dims is not None else frozenset()
        splits, devs = {}, {}
        sid, did = [], []
        for items, devices in keys:
            sid.append(splits.setdefault(items, len(splits)))
            did.append(devs.setdefault(devices, len(devs)))
        dev_rows = np.zeros((len(devs), P), dtype=np.int64)
        for devices, r in devs.items():
            dev_rows[r, :len(devices)] = [index[d] for d in devices]
        self.dev = dev_rows[np.asarray(did, dtype=np.int64)]
        lo_rows = np.zeros((len(splits), P, D), dtype=np.int64)
        hi_rows = np.ones((len(splits), P, D), dtype=np.int64)
        stats_rows = np.zeros(len(splits), dtype=bool)
        extents = tuple(int(dims.extent[d]) for d in letters)
        for items, r in splits.items():
            if items:  # a split configuration (factors of 1 are never kept)
                split = dict(items)
                b = _boxes_array(extents, tuple([int(split.get(d, 1)) for d in letters]))
                lo_rows[r, :len(b)] = b[:, :, 0]
                hi_rows[r, :len(b)] = b[:, :, 1]
                stats_rows[r] = any(split.get(d, 1) > 1 for d in stats)
        sid = np.asarray(sid, dtype=np.int64)
        self.lo, self.hi, self.stats_split = lo_rows[sid], hi_rows[sid], stats_rows[sid]
        self.valid = np.arange(P)[None, :] < self.nparts[:, None]
        self.letter = {d: i for i, d in enumerate(letters)}
        # What is computed from these arrays alone (tensor boxes, pieces), kept for every
        # op sharing them.
        self.memo = {}

    def tensor_box(self, spec, shape):
        """``(lo, hi)`` of shape ``(K, P, rank)``: the box of a tensor with axes ``spec``
        that each part reads or writes (:func:`~fddps.strategy.expand._tensor_box`);
        whole configurations read it whole (``(0, s or 1)``, as ``op_records``)."""
        shape = tuple(shape or ())
        if any(s is None for s in shape):
            raise _Undescribed(f"{self.name}: a tensor of unknown shape {shape}")
        # (a function of the shared arrays, the axes and the shape: kept for every op
        # sharing the arrays; read-only, as every caller only reads them)
        key = ("box", spec, shape)
        try:
            got = self.memo.get(key)
        except TypeError:  # an axis description that is not hashable: not kept
            key, got = None, None
        if got is None:
            got = self._tensor_box(spec, shape)
            for a in got:
                a.setflags(write=False)
            if key is not None:
                self.memo[key] = got
        return got

    def _tensor_box(self, spec, shape):
        """:meth:`tensor_box` computed (``shape`` a tuple of ints)."""
        K, P = self.valid.shape
        r = len(shape)
        lo = np.zeros((K, P, r), dtype=np.int64)
        hi = np.empty((K, P, r), dtype=np.int64)
        axes = spec if isinstance(spec, tuple) and not (spec and spec[0] == "shape") else None
        for a, s in enumerate(shape):
            # Split configurations: _tensor_box's (0, s) for an axis no letter indexes
            # (zip stops at the shorter of axes and shape).
            d = axes[a] if axes is not None and a < len(axes) else None
            if axes is not None and a >= len(axes):
                lo, hi = lo[:, :, :a], hi[:, :, :a]
                break
            if d is None:
                hi[:, :, a] = s
            elif isinstance(d, HaloAxis):
                # The rows each distinct range of the dimension reads (the parts' only).
                i = self.letter[d.dim]
                real = self.valid & self.split[:, None]
                pairs = np.stack([self.lo[:, :, i][real], self.hi[:, :, i][real]], axis=-1)
                uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
                rows = np.array([d.rows(int(x), int(y)) for x, y in uniq.tolist()],
                                dtype=np.int64).reshape(-1, 2)
                got = rows[np.asarray(inverse).reshape(-1)]
                lo[:, :, a], hi[:, :, a] = 0, 1
                lo[:, :, a][real], hi[:, :, a][real] = got[:, 0], got[:, 1]
            else:
                i = self.letter[d]
                lo[:, :, a], hi[:, :, a] = self.lo[:, :, i], self.hi[:, :, i]
        whole = ~self.split
        if whole.any():
            lo[whole] = 0
            hi[whole] = [s or 1 for s in shape][:lo.shape[2]]
        return lo, hi


def _box_bytes(lo, hi, itemsize):
    """``float(prod(extents)) * itemsize`` per box (``_box_bytes`` of expand)."""
    return np.prod(hi - lo, axis=-1).astype(np.float64) * itemsize


def _passes(sink, mask, names, steps, elements, size):
    """Rows of a chain of passes (:data:`~fddps.strategy.expand.SYNC_BATCH_NORM`) of the
    parts in ``mask`` (``(K, P)``): per step, an id array ``(K, P)`` (-1 outside ``mask``)."""
    out = []
    m = int(mask.sum())
    for (kind, reads, writes), name in zip(steps, names):
        ids = np.full(mask.shape, -1, dtype=np.int64)
        base = sink.add_block(np.broadcast_to(name, mask.shape)[mask], kind,
                              (elements * reads)[mask], (size * reads)[mask],
                              (size * writes)[mask], 0.0, None)
        ids[mask] = base + np.arange(m)
        out.append(ids)
    return out


class Context:
    """What the tables of one build share: each op's configurations over its vertex's
    (:class:`_OpGroups`), each tensor's pieces (:class:`_Pieces`), each op's reads, and
    the rows (:class:`RowSink`).

    Parameters
    ----------
    step, cluster, cost_model
    layouts : pase_tables._Layouts
    configs : list of list of (label, {op: OpConfig})
    vertex_of : dict of op -> vertex
    vertices : list of list of str
    """

    def __init__(self, step, cluster, cost_model, layouts, configs, vertex_of, vertices):
        self.step, self.cluster, self.layouts = step, cluster, layouts
        self.vertices = vertices
        self.configs, self.vertex_of = configs, vertex_of
        self.index = cluster.index
        self.lat = np.asarray(cluster.latency, dtype=np.float64)
        self.inv = np.asarray(cluster.inv_bandwidth, dtype=np.float64)
        self.ndev = len(cluster.devices)
        self.sink = RowSink(cluster, cost_model)
        self._groups, self._pieces, self._reads, self._shared = {}, {}, {}, {}
        self.feeds = {}  # _feed's memo: geometry by content (see _feed)
        self.kernel_shapes = {}  # _kernel_shapes' memo: part shapes by extents
        self.repeats = {}  # pase_repeats' memo: vertices costed, by their key

    def groups(self, n):
        if n not in self._groups:
            self._groups[n] = _OpGroups(self.step, self.layouts, self.index, n,
                                        [c[n] for _, c in self.configs[self.vertex_of[n]]],
                                        self._shared)
        return self._groups[n]

    def pieces(self, src, port):
        if (src, port) not in self._pieces:
            self._pieces[src, port] = _shared_pieces(self.groups(src), port, self.ndev)
        return self._pieces[src, port]

    def reads(self, n):
        """``(ins, outs, consumer)``: the boxes of the tensors each part of ``n`` reads and
        writes (``(lo, hi)`` of shape ``(K, P, rank)``), and the task each of its feeds is
        recorded against (the part, or its first statistics task; None where the sink
        keeps no names)."""
        if n not in self._reads:
            og = self.groups(n)
            op, dims, split = og.op, og.dims, og.split
            if split.any():
                ins = [og.tensor_box(m, s) for m, s in zip(dims.inputs, op.input_shapes)]
                outs = [og.tensor_box(m, s) for m, s in zip(dims.outputs, op.output_shapes)]
            else:
                ins = [og.tensor_box(None, s) for s in op.input_shapes]
                outs = []
            if split.any() and len(ins) < len(op.inputs) or any(
                    ins[k][0].shape[2] != len(tuple(op.input_shapes[k] or ()))
                    for k in range(min(len(ins), len(op.inputs)))):
                raise _Undescribed(f"{n}: a tensor's axes not all described")
            consumer = None  # (a consumer's name is only ever a row's name)
            if self.sink.named:
                part_names = np.array([f"{n}/fddps_part_{j}" for j in range(og.P)],
                                      dtype=object)
                consumer = np.where(split[:, None], part_names[None, :], n)
                if og.stats_split.any():
                    last = "/pass_0" if op.op_type in SYNC_BATCH_NORM else ""
                    first = np.array([f"{t}/stats{last}" for t in part_names], dtype=object)
                    consumer = np.where(og.stats_split[:, None], first[None, :], consumer)
            self._reads[n] = (ins, outs, consumer)
        return self._reads[n]


def vertex_table(ctx, i):
    """The terms of vertex ``i`` for each of its configurations, to be valued once
    ``ctx.sink`` has costed its rows: a callable ``value(costs) -> numpy.ndarray`` (one
    entry per configuration), or ``None`` when a record is of a kind not described here.
    """
    try:
        return _vertex_table(ctx, i)
    except _Undescribed:
        return None


def _kernel_shapes(op, dims, og, ins, outs, keep, memo=None):
    """The kernel shape of each kept (configuration, part) cell's task, as :func:`op_records`
    gives it: the op's own where it is whole, the part's (:func:`part_kernel_shape`) where
    it is split; None throughout for an op without one (not an FP32 convolution or MatMul).

    A part that splits a spatial (halo) dimension has none (None, as
    :func:`part_kernel_shape` gives it); another's depends only on the op's type and
    attributes and its boxes' extents, so :func:`part_kernel_shape` is called once per
    distinct such key, with one of its cells' boxes; ``memo`` (a dict kept for one build)
    keeps them across ops (a convolution and its gradients, repeated layers).

    Takes the op's :class:`_OpGroups` ``og`` and its boxes ``ins``/``outs`` (as
    :meth:`Context.reads`), ``keep`` a ``(K, P)`` mask; returns an object array of the
    kept cells' shapes (C order) or None; raises nothing of its own."""
    if op.kernel_shape is None:
        return None
    shapes = np.full(og.valid.shape, op.kernel_shape, dtype=object)
    cells = keep & og.split[:, None]
    # A part that splits a spatial (halo) dimension has no shape (part_kernel_shape's
    # None): set here, so that only the other parts are keyed and shaped (on AlexNet
    # about half of a convolution's).
    for d in dims.halo:
        k = og.letter[d]
        halo = cells & ((og.lo[:, :, k] != 0) | (og.hi[:, :, k] != dims.extent[d]))
        shapes[halo] = None
        cells &= ~halo
    if cells.any():
        a, b = np.nonzero(cells)
        cols = [hi[a, b] - lo[a, b] for lo, hi in list(ins) + list(outs)]
        cols = [c.reshape(len(a), -1).astype(np.int64) for c in cols]
        key = np.concatenate(cols + [np.zeros((len(a), 0), dtype=np.int64)], axis=1)
        # (the columns' widths in the key: two ops' rows compare only laid out alike)
        head = (op.op_type, _frozen(op.attrs), len(ins), tuple(c.shape[1] for c in cols))
        own = (memo if memo is not None else {}).setdefault(head, {})
        rows = list(map(tuple, key.tolist()))
        new = {}  # the keys not in the memo yet: their first cell
        for c, row in enumerate(rows):
            if row not in own and row not in new:
                new[row] = c
        if new:
            # The new keys' boxes as lists, gathered at once (not element by element).
            first = np.fromiter(new.values(), dtype=np.int64, count=len(new))
            x, y = a[first], b[first]
            boxes = [(lo[x, y].tolist(), hi[x, y].tolist())
                     for lo, hi in [(og.lo, og.hi)] + list(ins) + list(outs)]
            for c, row in enumerate(new):
                box = [tuple(zip(lo[c], hi[c])) for lo, hi in boxes]
                own[row] = part_kernel_shape(op, dims, dict(zip(dims.dims, box[0])),
                                             box[1:1 + len(ins)], box[1 + len(ins):])
        picked = np.empty(len(rows), dtype=object)
        picked[:] = [own[row] for row in rows]
        shapes[a, b] = picked
    return shapes[keep]


def _vertex_table(ctx, i):
    sink = ctx.sink
    lat, inv, ndev = ctx.lat, ctx.inv, ctx.ndev
    vtx = ctx.vertices[i]
    C = len(ctx.configs[i])
    everyone = np.arange(C)
    inside = set(vtx)
    moves = []  # transfers (item, source, destination, seconds), in record order
    steps = []  # (row id per configuration, -1: none; device per configuration), in order
    groups_of, pieces_of = ctx.groups, ctx.pieces

    for n in vtx:
        og = groups_of(n)
        op, dims = og.op, og.dims
        K, P = og.valid.shape
        gid = og.gid
        split = og.split
        shape_only = op.op_type in SHAPE_ONLY_OPS
        ins, outs, consumer = ctx.reads(n)  # the boxes each part reads and writes
        # The parts' own tasks.
        named = sink.named or og.stats_split.any()  # (the passes' names: made as before)
        if named:
            part_names = np.array([f"{n}/fddps_part_{j}" for j in range(P)], dtype=object)
            names = np.where(split[:, None], part_names[None, :], n)
        sync = SYNC_BATCH_NORM.get(op.op_type)
        stats_split = og.stats_split
        plain = split & ~(stats_split & (sync is not None and sync["part"] is not None))
        task_ids = np.full((K, P), -1, dtype=np.int64)
        if (plain | ~split).any():
            extent = [dims.extent[d] for d in dims.dims] if dims is not None else []
            share = None
            for i, e in enumerate(extent):
                x = (og.hi[:, :, i] - og.lo[:, :, i]) / e
                share = x if share is None else share * x
            if share is None:
                share = np.ones((K, P))
            inb = np.zeros((K, P))
            for (lo, hi), item in zip(ins, op.input_itemsizes):
                inb = inb + _box_bytes(lo, hi, item)
            outb = np.zeros((K, P))
            for (lo, hi), item in zip(outs, op.output_itemsizes):
                outb = outb + _box_bytes(lo, hi, item)
            flops = np.where(split[:, None], op.flops * share, op.flops)
            param = np.where(split[:, None], op.param_bytes * share, op.param_bytes)
            inb = np.where(split[:, None], inb, op.input_bytes)
            outb = np.where(split[:, None], outb, op.output_bytes)
            keep = (plain | ~split)[:, None] & og.valid
            base = sink.add_block(names[keep] if named else None, op.op_type, flops[keep],
                                  inb[keep], outb[keep], param[keep], n if named else None,
                                  _kernel_shapes(op, dims, og, ins, outs, keep, ctx.kernel_shapes))
            task_ids[keep] = base + np.arange(int(keep.sum()))
        part_rows = [task_ids]
        stats_rows = []
        if stats_split.any():
            lo0, hi0 = ins[0]
            elements = _box_bytes(lo0, hi0, 1)
            size = elements * op.input_itemsizes[0]
            mask = stats_split[:, None] & og.valid
            if sync is not None and sync["part"] is not None:
                chain = sync["part"]
                pass_names = [np.array([f"{t}/pass_{k}" for t in part_names], dtype=object)
                              for k in range(len(chain) - 1)] + [part_names]
                ids = _passes(sink, mask, [pn[None, :] for pn in pass_names], chain,
                              elements, size)
                # A configuration's part rows in order: the task itself, or the passes.
                part_rows = [np.where(mask, ids[0], task_ids)] + ids[1:]
            stat_names = np.array([f"{t}/stats" for t in part_names], dtype=object)
            if sync is not None:
                chain = sync["stats"]
                pass_names = [np.array([f"{t}/pass_{k}" for t in stat_names], dtype=object)
                              for k in range(len(chain) - 1)] + [stat_names]
                stats_rows = _passes(sink, mask, [pn[None, :] for pn in pass_names], chain,
                                     elements, size)
            else:
                stats_rows = [np.full((K, P), -1, dtype=np.int64)]
                base = sink.add_block(np.broadcast_to(stat_names[None, :], (K, P))[mask], "Sum",
                                      (2 * elements)[mask], size[mask], 0.0, 0.0, None)
                stats_rows[0][mask] = base + np.arange(int(mask.sum()))
        # Per part, in op_records' order: its task(s), its statistics, then its feeds
        # (from the vertex's own ops: every part and piece of one input at once).
        feed_rows, links = [], []
        for k, (src, port) in enumerate(op.inputs):
            if shape_only or src not in inside or k >= len(ins):
                continue
            rows, link = _feed(pieces_of(src, port), ins[k], og, consumer, lat, inv, sink,
                               f"{src}/fddps_reduce_{port}", memo=ctx.feeds)
            feed_rows.append(rows)
            links.append(link)
        _add_links(moves, links)
        own = [ids[gid] for ids in part_rows + stats_rows]
        _part_steps(steps, own + feed_rows, len(own), og.valid[gid], og.dev[gid])
        if stats_split.any():
            _stats_links(og, gid, dims, moves, lat, inv, everyone)

    return _valuer(steps, moves, C, ndev)


def _part_steps(steps, rows, masked, valid, dev):
    """Append to ``steps`` one op's rows part by part, as ``op_records`` gives them: for
    each part ``j``, each of ``rows`` (``(C, P)`` row ids, -1: none) whose column ``j``
    has a row, in order; the first ``masked`` of them only where the part exists
    (``valid``, ``(C, P)``), the rest as they are. One block ``(rows, devices)`` of shape
    ``(steps, C)`` each (what :func:`_valuer` sums), for all the op's parts at once."""
    raw = np.stack(rows)  # (m, C, P)
    m, C, P = raw.shape
    present = (raw >= 0).any(axis=1)  # (m, P): the steps op_records has
    if masked:
        raw[:masked] = np.where(valid[None], raw[:masked], -1)
    sel = present.T.reshape(-1)  # part-major, then row by row: record order
    if sel.any():
        steps.append((raw.transpose(2, 0, 1).reshape(P * m, C)[sel],
                      np.repeat(dev.T, m, axis=0)[sel]))


def _add_links(moves, links):
    """Append a reader's transfers (one :func:`_feed`'s link per input, None: none) to
    ``moves`` in record order (part, then input, then piece), so that each link's
    seconds add up as the records' do (:func:`_valuer`)."""
    links = [(k, x) for k, x in enumerate(links) if x is not None]
    if not links:
        return
    if len(links) == 1:
        where, src, dst, secs, P, Q = links[0][1]
        moves.append((_div(where, P * Q), src, dst, secs))
        return
    # Several inputs: their cells merged by (item and part, input, piece).
    Qmax = max(x[5] for _, x in links)
    key = []
    for k, (_, x) in enumerate(links):
        cell, piece = _divmod(x[0], x[5])  # ((item, part), piece)
        key.append(cell * (len(links) * Qmax) + k * Qmax + piece)
    key = np.concatenate(key)
    order = np.argsort(key, kind="stable")
    item = np.concatenate([_div(x[0], x[4] * x[5]) for _, x in links])[order]
    src, dst, secs = [np.concatenate([x[f] for _, x in links])[order] for f in (1, 2, 3)]
    moves.append((item, src, dst, secs))


def _sums(index, weights, n):
    """``out[i]``: the sum of ``weights`` at ``index == i``, added in their order from 0.0
    (as ``np.add.at`` into zeros, in one pass: ``np.bincount``)."""
    return np.bincount(index, weights=weights, minlength=n)


#: From this many row ids on, :func:`_valuer` keeps a table's rows and devices narrowed.
_NARROWED_CELLS = 1 << 14


def _valuer(steps, moves, C, ndev):
    """``value(costs)``: per configuration (pair), its busiest device's seconds (``steps``'
    rows summed in order) plus its busiest link's (``moves``' seconds summed in order)."""
    if moves:
        index = np.concatenate([(item * ndev + src) * ndev + dst for item, src, dst, _ in moves])
        load = _sums(index, np.concatenate([m[3] for m in moves]), C * ndev * ndev)
    else:
        load = np.zeros(C * ndev * ndev)
    link = load.reshape(C, -1).max(axis=1)
    rows = dev = None
    if steps:
        # (each step a row of C ids, or a block of such rows: _part_steps'). Kept until
        # the sink is costed, with every other table's: in the narrowest integers that
        # hold them (AlexNet at 8 GPUs: 58 MB of int64 kept, fresh pages to fault in).
        rows = np.concatenate([r.reshape(-1, C) for r, _ in steps])
        dev = np.concatenate([d.reshape(-1, C) for _, d in steps])
        if rows.size >= _NARROWED_CELLS:  # (small tables: not worth the two passes)
            rows = rows.astype(np.int32) if rows.max(initial=0) < 2 ** 31 else rows
            dev = dev.astype(np.int16) if ndev < 2 ** 15 else dev

    def value(costs):
        # Each device's seconds summed in step order from 0; a step with no row adds an
        # exact 0.
        busy = np.zeros((C, ndev))
        if rows is not None:
            sec = np.where(rows >= 0, costs[np.maximum(rows, 0), dev], 0.0)
            busy = _sums((np.arange(C) * ndev + dev).reshape(-1), sec.reshape(-1),
                         C * ndev).reshape(C, ndev)
        return busy.max(axis=1) + link

    return value


class _Pieces:
    """A producer's output ``port`` per its distinct configuration over the vertex's: the
    pieces a reader may read (``op_layout``'s entries, one per distinct box unless they
    hold partial sums), as arrays ``(K, P, ...)`` indexed by the producer's parts."""

    def __init__(self, og, port, ndev):
        op, dims = og.op, og.dims
        shape = op.output_shapes[port] if port < len(op.output_shapes) else None
        spec = dims.outputs[port] if dims is not None and port < len(dims.outputs) else None
        self.lo, self.hi = og.tensor_box(spec, shape)
        if self.lo.shape[2] != len(tuple(shape or ())):
            raise _Undescribed(f"{og.name}: output {port}'s axes not all described")
        self.itemsize = op.output_itemsizes[port] if port < len(op.output_itemsizes) else 0
        K, P = og.valid.shape
        red = dims.reduction if dims is not None else frozenset()
        self.partial = np.array([bool(s) and any(c.split.get(d, 1) > 1 for d in red)
                                 for s, c in zip(og.split.tolist(), og.reps)], dtype=bool)
        # Parts holding one box hold the same values: the first of them is the piece, held
        # wherever any of them is.
        same = np.all((self.lo[:, :, None, :] == self.lo[:, None, :, :]) &
                      (self.hi[:, :, None, :] == self.hi[:, None, :, :]), axis=-1)
        same &= og.valid[:, :, None] & og.valid[:, None, :]
        same |= self.partial[:, None, None] & np.eye(P, dtype=bool)[None]
        same &= ~self.partial[:, None, None] | np.eye(P, dtype=bool)[None]
        first = np.argmax(same, axis=2)  # (K, P): the first part with each part's box
        self.piece = og.valid & (first == np.arange(P)[None, :])
        self.held = np.zeros((K, P, ndev), dtype=bool)
        kk, pp = np.nonzero(og.valid)
        self.held[kk, first[kk, pp], og.dev[kk, pp]] = True
        self.first_dev = og.dev
        self.gid = og.gid
        self.K, self.P = K, P


def _shared_pieces(og, port, ndev):
    """``_Pieces(og, port, ndev)``, one object for every op whose groups share ``og``'s
    arrays and whose output ``port`` has the same axes, shape, item size and reduction
    dimensions (all the pieces read of the op)."""
    op, dims = og.op, og.dims
    key = ("pieces", port, ndev,
           op.output_shapes[port] if port < len(op.output_shapes) else None,
           dims.outputs[port] if dims is not None and port < len(dims.outputs) else None,
           op.output_itemsizes[port] if port < len(op.output_itemsizes) else 0,
           dims.reduction if dims is not None else frozenset())
    try:
        got = og.memo.get(key)
    except TypeError:  # not hashable: not shared
        return _Pieces(og, port, ndev)
    if got is None:
        got = og.memo[key] = _Pieces(og, port, ndev)
    return got


def _digest(*arrays) -> bytes:
    """A digest of arrays' dtypes, shapes and contents (equal digests: equal arrays)."""
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.digest()


def _feed(pc, inbox, og, consumer, lat, inv, sink, reduce_name, gid=None, sg=None, memo=None):
    """Records of every part's read of one tensor of the vertex, for every configuration
    at once (as :func:`~fddps.strategy.expand.op_records`' ``feed``): the row each part
    pays, ``(C, P)`` ids (-1: none), and its transfers (:func:`_feed_geometry`'s link
    over the items: their cells in record order; None: no transfer at all). Items with
    the same reader and producer configurations are costed once.

    ``memo`` (a dict kept for one build, with one ``lat`` and ``inv``): feeds whose
    arrays are equal (the same boxes, devices and groups: the same layer shapes in
    another module, an element-wise op reading like its neighbour) share their
    geometry (intersections, transfers, which row each part pays); only the rows,
    which carry the reader's names, are added again. The same floats either way. A
    geometry or item list with a long transfer list is not kept (:func:`_worth_keeping`)."""
    gid = og.gid if gid is None else gid  # the reader's group per item (configuration, pair)
    sg = pc.gid if sg is None else sg  # the producer's
    # Each pair of reader and producer configurations is costed once (np.unique's sorted
    # pairs and inverse, from a mask over every pair of groups: no sort).
    combo = gid * pc.K + sg
    present = np.zeros(len(og.reps) * pc.K, dtype=bool)
    present[combo] = True
    uniq = np.flatnonzero(present)
    back = (np.cumsum(present) - 1)[combo]
    geometry = None
    if memo is not None:
        # (the reader's statistics split too: which of its parts' rows are one
        # record depends on their names, :func:`_distinct_rows`)
        key = (_own_digest(pc, "lo", "hi", "piece", "held", "first_dev", "partial",
                           extra=(pc.itemsize, pc.K, pc.P)),
               _own_digest(og, "valid", "dev", "stats_split"), _inbox_digest(memo, inbox),
               uniq.tobytes())
        geometry = memo.get(key)
    if geometry is None:
        geometry = _feed_geometry(pc, inbox, og, lat, inv, uniq // pc.K, uniq % pc.K,
                                  memo=memo)
        if memo is not None and _worth_keeping(geometry[1]):
            memo[key] = geometry
    rows, link = _feed_rows(geometry, consumer, sink, reduce_name)
    if link is not None:
        if memo is None:
            link = _link_items(link, back, len(uniq))
        else:  # (the items' transfers too, for feeds met again with the same items)
            got = memo.get((key, back.tobytes()))
            if got is None:
                got = _link_items(link, back, len(uniq))
                if _worth_keeping(got):
                    memo[key, back.tobytes()] = got
            link = got
    return rows[back], link


#: The most transfers (cells) a feed's geometry or items may have to be kept in the memo.
_KEPT_LINK_CELLS = 1 << 14


def _worth_keeping(link):
    """Whether a feed's ``link`` (None or :func:`_feed_geometry`'s) is small enough to keep
    in the build's memo. The memo holds what it keeps until the build ends, and a long
    transfer list (a big edge's: up to ~10**5 cells of 32 bytes) is fresh memory paged in
    for nothing when it is not met again, which the long ones were not on the six networks
    and AlexNet (the short ones are, often: an element-wise op reads like its neighbour)."""
    return link is None or len(link[0]) <= _KEPT_LINK_CELLS


def _link_items(link, back, combos):
    """A geometry's link (cells of ``combos`` items) for the items ``back`` names: item
    ``i`` gets the cells of item ``back[i]``, in order."""
    where, src, dst, secs, P, Q = link
    if len(back) == combos and np.array_equal(back, np.arange(combos)):
        return link
    cells = P * Q
    starts = np.searchsorted(_div(where, cells), np.arange(combos + 1))
    counts = np.diff(starts)[back]
    item = np.repeat(np.arange(len(back)), counts)
    first = np.repeat(starts[:-1][back] - (np.cumsum(counts) - counts), counts)
    cell = first + np.arange(len(item))
    return (item * cells + _divmod(where[cell], cells)[1], src[cell], dst[cell], secs[cell], P, Q)


def _own_digest(obj, *names, extra=()):
    """:func:`_digest` of ``obj``'s arrays ``names`` (and ``extra``), kept on ``obj``."""
    # (an op's groups keep it in the memo they share with the ops sharing their arrays)
    keep = obj.memo if isinstance(obj, _OpGroups) else obj.__dict__
    got = keep.get(("digest", names))
    if got is None:
        got = keep["digest", names] = _digest(*[getattr(obj, n) for n in names],
                                              np.asarray(extra, dtype=np.int64))
    return got


def _inbox_digest(memo, inbox):
    """:func:`_digest` of a reader's box arrays (kept in ``memo`` by the arrays' identity:
    they live in the build's Context as long as the memo does)."""
    k = ("inbox", id(inbox[0]), id(inbox[1]))
    got = memo.get(k)
    if got is None:
        got = memo[k] = _digest(*inbox)
    return got


def _feed_rows(geometry, consumer, sink, reduce_name):
    """The rows of a feed's geometry (:func:`_feed_geometry`) added to ``sink`` under the
    reader's names: ``(rows, link)``."""
    shape, link, some, inverse, g, pi, kd, sz, flops, in_bytes, op_type = geometry
    rows = np.full(shape, -1, dtype=np.int64)
    if some is not None and consumer is None:  # (a name-blind sink: no names)
        rows[some] = sink.add_block(None, op_type, flops, in_bytes, sz, 0.0, None) + inverse
    elif some is not None:
        cons = consumer[g, pi]
        name = np.full(len(kd), reduce_name, dtype=object)
        for k, suffix in ((0, "/fddps_concat"), (1, "/fddps_slice")):
            # (each distinct reader task's name made once: rows repeat few of them)
            at = np.flatnonzero(kd == k)
            if len(at):
                made = {}
                name[at] = [made[c] if c in made else made.setdefault(c, f"{c}{suffix}")
                            for c in cons[at].tolist()]
        base = sink.add_block(name, op_type, flops, in_bytes, sz, 0.0, None)
        rows[some] = base + inverse
    return rows, link


def _interval_ids(lo, hi, keep, axes, memo=None):
    """Per (group, part) of ``(K, P, rank)`` boxes, an id of its intervals on ``axes``
    (equal ids: equal intervals; boxes not in ``keep`` all get the id of ``(0, 0)``, an
    empty interval), and the distinct intervals: ``(ids, lo, hi)``, those ``(n, len(axes))``.
    The ids number the distinct intervals in the lexicographic order of their lows then
    highs, axis by axis. ``memo`` (a dict kept for one build): the answers by the boxes'
    contents (many ops' boxes are equal arrays, not the same ones)."""
    K, P, _ = lo.shape
    a = len(axes)
    both = np.where(keep[:, :, None], np.concatenate([lo[:, :, axes], hi[:, :, axes]], axis=2),
                    0).reshape(K * P, 2 * a)
    key = None
    if memo is not None:
        key = ("intervals", K, P, a, both.tobytes())
        got = memo.get(key)
        if got is not None:
            return got
    low, high = int(both.min(initial=0)), int(both.max(initial=0))
    span = high - low + 1
    if span ** (2 * a) < 2 ** 62:
        # One integer per box, its digits (base ``span``) the box's lows then highs: its
        # order is the lexicographic one, and np.unique sorts one column (no lexsort).
        code = (both - low) @ (span ** np.arange(2 * a - 1, -1, -1, dtype=np.int64))
        _, first, ids = np.unique(code, return_index=True, return_inverse=True)
    else:
        order = np.lexsort(both.T[::-1])
        ranked = both[order].T
        new = np.ones(K * P, dtype=bool)
        new[1:] = np.any(ranked[:, 1:] != ranked[:, :-1], axis=0)
        ids = np.empty(K * P, dtype=np.int64)
        ids[order] = np.cumsum(new) - 1
        first = order[new]
    got = (ids.reshape(K, P), both[first, :a], both[first, a:])
    if key is not None:
        memo[key] = got
    return got


def _intervals_of(owner, lo, hi, keep, axes, memo=None):
    """:func:`_interval_ids`, kept on ``owner`` (an :class:`_OpGroups` or
    :class:`_Pieces`, which outlives the arrays' use) per arrays and axes."""
    cache = owner.__dict__.setdefault("_intervals", {})
    key = (id(lo), id(hi), id(keep), tuple(axes))
    got = cache.get(key)
    if got is None or got[0] is not lo or got[1] is not hi or got[2] is not keep:
        got = cache[key] = (lo, hi, keep, _interval_ids(lo, hi, keep, axes, memo))
    return got[3]


def _overlap_table(rlo, rhi, qlo, qhi):
    """``(len(rlo), len(qlo))``: the elements each reader box shares with each piece on
    these axes, the float product of the intersection's integer extents (0: empty)."""
    out = np.ones((len(rlo), len(qlo)))
    for a in range(rlo.shape[1]):
        e = np.minimum(rhi[:, None, a], qhi[None, :, a]) - np.maximum(rlo[:, None, a],
                                                                      qlo[None, :, a])
        out = out * np.maximum(e, 0)
    return out


#: From this many cells on, :func:`_elements` multiplies its two tables before gathering.
_PAIRED_CELLS = 1 << 15


def _elements(pc, inbox, og, gid, sg, memo=None):
    """``(C, P, Q)``: the elements part ``p`` of item ``c``'s reader group (``gid[c]``)
    shares with piece ``q`` of its producer group (``sg[c]``); 0 where they do not meet
    or either does not exist (an invalid part, a part that is no piece).

    The intersection's size is a product over the axes of 1-D overlaps, taken from two
    tables (:func:`_overlap_table`), one per half of the axes, of the distinct intervals
    there (few: a part's interval on an axis is one of its split's), so a cell costs two
    table reads and a multiplication instead of four operations per axis. Where nearly
    every pair of groups is an item, the tables' rows are spread over all pairs of groups
    at once (a column gather per half) and the items picked from them; with many cells,
    the halves' product is taken per distinct pair of ids first. ``memo`` (a dict
    kept for one build, or None) keeps the distinct intervals by the boxes' contents
    (:func:`_interval_ids`)."""
    in_lo, in_hi = inbox
    K, P, r = in_lo.shape
    Kp, Q = pc.piece.shape
    C = len(gid)
    cross = 2 * C >= K * Kp
    halves = [list(range(r))[:(r + 1) // 2], list(range(r))[(r + 1) // 2:]] if r else [[]]
    tables = []  # per half: the reader's ids, the pieces' ids, the overlap table
    for axes in halves:
        if not axes and r:
            continue
        if axes:
            rid, rlo, rhi = _intervals_of(og, in_lo, in_hi, og.valid, axes, memo)
            qid, qlo, qhi = _intervals_of(pc, pc.lo, pc.hi, pc.piece, axes, memo)
            tables.append((rid, qid, _overlap_table(rlo, rhi, qlo, qhi)))
        else:  # rank 0: one element wherever both exist
            tables.append((np.where(og.valid, 0, 1), np.where(pc.piece, 0, 1),
                           np.array([[1.0, 0.0], [0.0, 0.0]])))
    if len(tables) == 2 and C * P * Q >= _PAIRED_CELLS:
        # Many cells: the two tables' product taken once per distinct pair of a reader's
        # ids and of a piece's (few), then one gather per cell instead of two and a
        # product (the same two factors multiplied: the same floats).
        (rid1, qid1, t1), (rid2, qid2, t2) = tables
        ru, rid = np.unique(rid1 * t2.shape[0] + rid2, return_inverse=True)
        qu, qid = np.unique(qid1 * t2.shape[1] + qid2, return_inverse=True)
        table = (t1[ru // t2.shape[0]][:, qu // t2.shape[1]] *
                 t2[ru % t2.shape[0]][:, qu % t2.shape[1]])
        tables = [(rid.reshape(K, P), qid.reshape(Kp, Q), table)]
    el = None
    for rid, qid, table in tables:
        if cross:
            part = np.take(table[rid.reshape(-1)], qid.reshape(-1), axis=1)
            part = part.reshape(K, P, Kp, Q).transpose(0, 2, 1, 3)  # (group, group, p, q)
            if el is None:
                el = part
            else:  # one pass: the product laid out (group, group, p, q)
                el = np.multiply(el, part, out=np.empty((K, Kp, P, Q)))
        else:
            idx = (rid * table.shape[1])[gid][:, :, None] + qid[sg][:, None, :]
            part = table.reshape(-1).take(idx)
            el = part if el is None else np.multiply(el, part, out=el)
    if cross:
        el = np.ascontiguousarray(el).reshape(K * Kp, P, Q)
        if C != K * Kp:
            el = el[gid * Kp + sg]
    return el


def _feed_geometry(pc, inbox, og, lat, inv, gid, sg, memo=None):
    """What a feed's records are, for one item per pair of groups ``(gid[i], sg[i])``,
    without the reader's names: ``(shape, link, some, inverse, g, pi, kind, size, flops,
    input bytes, op type)`` (``some`` None: no row). ``link``: the transfers, ``(where,
    source device, destination device, seconds, P, Q)``, ``where`` each one's cell
    ``(item * P + part) * Q + piece`` in record order (None: none).

    The cells' elements come from :func:`_elements`; the rest is computed only for the
    cells where a part meets a piece (its transfer), for the parts (the row each pays),
    and for the parts meeting a single piece (whether it reads it whole or as a view).
    Every partial product of a box's integer extents is an integer at most the box's
    size, exact as a float below 2**53 in any order: the same floats as expand's
    ``float(math.prod(...))``. A reader box past 2**53 elements takes
    :func:`_feed_geometry_cells`. ``memo``: as :func:`_elements`'."""
    in_lo, in_hi = inbox
    K, P, r = in_lo.shape
    Q = pc.lo.shape[1]
    if r and _largest_box(inbox, memo) >= 2.0 ** 53:
        return _feed_geometry_cells(pc, inbox, og, lat, inv, gid, sg)
    item = pc.itemsize
    el = _elements(pc, inbox, og, gid, sg, memo=memo)
    # The cells where a part meets a piece, as a (C, P, Q) mask (C order: record order),
    # and their transfers: a part reads a piece from its own device where that holds
    # the piece, else from the piece's first device. (Masks of one byte a cell rather
    # than index arrays of eight: a feed has up to ~10**6 cells.)
    hit = el > 0
    dev = og.dev[gid]  # (C, P): each part's device, the transfers' destination
    ndev = pc.held.shape[2]
    link = None
    if item > 0:  # (no bytes, no transfer: every cell has elements)
        # The cells whose part's device does not hold their piece (a row of pieces per
        # producer group and device: one gather per part), then their transfers' fields.
        far = _remote_rows(pc).take(sg[:, None] * ndev + dev, axis=0)  # (C, P, Q)
        where = np.flatnonzero(np.logical_and(hit, far, out=far))
        if len(where):
            cp, qi = _divmod(where, Q)  # (item, part), piece
            s = pc.first_dev.reshape(-1)[sg[_div(cp, P)] * Q + qi]
            d = dev.reshape(-1)[cp]
            pair = s * ndev + d
            secs = lat.reshape(-1)[pair] + el.reshape(-1)[where] * item * inv.reshape(-1)[pair]
            keep = secs > 0
            if not keep.all():
                where, s, d, secs = where[keep], s[keep], d[keep], secs[keep]
            if len(where):
                link = (where, s, d, secs, P, Q)
    count, one = _pieces_met(hit)
    V = og.valid[gid]
    kind = np.where(pc.partial[sg][:, None], 2,
                    np.where(count > 1, 0, np.where(count == 1, 1, -1)))
    kind = np.where(V, kind, -1)
    # A part reading one piece pays no slice where it reads the whole piece, or a view.
    single = np.flatnonzero(kind == 1)
    if len(single):
        sc, sp = np.divmod(single, P)
        s1, q1, g1 = sg[sc], one.reshape(-1)[single], gid[sc]
        plo, phi = pc.lo[s1, q1], pc.hi[s1, q1]  # (n, r)
        L, H = in_lo[g1, sp], in_hi[g1, sp]
        jlo, jhi = np.maximum(plo, L), np.minimum(phi, H)
        free = np.all((jlo == plo) & (jhi == phi), axis=-1)
        if r >= 2:
            pext, jext = phi - plo, jhi - jlo
            view = np.all((jlo[:, 1:] == plo[:, 1:]) & (jext[:, 1:] == pext[:, 1:]), axis=-1)
            view &= np.prod(pext[:, 1:], axis=-1) * item % SLICE_VIEW_ALIGNMENT == 0
            free |= view
        kind.reshape(-1)[single[free]] = -1
    some = kind >= 0
    if not some.any():
        return (V.shape, link, None, None, None, None, None, None, None, None, None)
    g, ci, pi, inverse = _distinct_rows(kind, some, gid, sg, one, count, pc, og, inbox)
    kd = kind[ci, pi]
    gi, si, oi = gid[ci], sg[ci], one[ci, pi]
    sz = np.prod(in_hi[gi, pi] - in_lo[gi, pi], axis=-1).astype(np.float64) * item
    piece = np.prod(pc.hi[si, oi] - pc.lo[si, oi], axis=-1).astype(np.float64) * item
    return (V.shape, link, some, inverse, g[ci, pi], pi, kd, sz,
            *_row_costs(kd, sz, count[ci, pi], piece, item))


def _largest_box(inbox, memo=None):
    """The most elements of a reader's boxes (a float product of their extents); kept in
    ``memo`` by the arrays' identity, as :func:`_inbox_digest`."""
    in_lo, in_hi = inbox
    k = ("largest", id(in_lo), id(in_hi))
    got = memo.get(k) if memo is not None else None
    if got is None:
        got = np.prod((in_hi - in_lo).astype(np.float64), axis=-1).max(initial=0.0)
        if memo is not None:
            memo[k] = got
    return got


def _divmod(x, n):
    """``np.divmod(x, n)`` of non-negative integers ``x``: by shifts where ``n`` is a power
    of two (the usual part counts; the same integers, several times faster)."""
    if n & (n - 1) == 0:
        return x >> (n.bit_length() - 1), x & (n - 1)
    return np.divmod(x, n)


def _div(x, n):
    """``x // n`` of non-negative integers ``x``: by a shift where ``n`` is a power of two
    (as :func:`_divmod`)."""
    if n & (n - 1) == 0:
        return x >> (n.bit_length() - 1)
    return x // n


def _remote_rows(pc):
    """``(K * devices, P)``: per producer group and device (row ``group * devices +
    device``), whether a part on that device reads each piece over a link (the device
    holds no copy of it: :func:`_feed_geometry`'s transfers); kept on ``pc``."""
    got = pc.__dict__.get("_remote_rows")
    if got is None:
        ndev = pc.held.shape[2]
        remote = (pc.first_dev[:, :, None] != np.arange(ndev)) & ~pc.held  # (K, P, devices)
        got = pc.__dict__["_remote_rows"] = np.ascontiguousarray(
            remote.transpose(0, 2, 1)).reshape(-1, remote.shape[1])
    return got


def _pieces_met(hit):
    """``(count, one)`` of a ``(C, P, Q)`` boolean mask of the pieces each part meets: how
    many, and the first of them (0 where none, as ``argmax``), ``(C, P)`` integers.

    Reductions over a last axis of a few elements cost numpy a loop per part; where
    ``Q`` is 2, 4 or 8 (the usual part counts), each part's ``Q`` booleans (bytes of 0
    or 1) are read as one little-endian integer instead: its set bits are the pieces met,
    the lowest one the first (~10x faster on AlexNet's largest feeds at 8 GPUs)."""
    Q = hit.shape[2]
    if Q in (2, 4, 8) and hasattr(np, "bitwise_count") and hit.flags.c_contiguous:
        word = hit.view(np.dtype(f"<u{Q}"))[..., 0]
        count = np.bitwise_count(word).astype(np.int64)
        # (the lowest set bit, isolated, less one: as many ones as the bits below it,
        # eight per piece before the first met)
        lowest = word & (~word + np.array(1, dtype=word.dtype))
        one = np.bitwise_count(lowest - np.array(1, dtype=word.dtype)).astype(np.int64) >> 3
        one[count == 0] = 0
        return count, one
    return hit.sum(axis=2), hit.argmax(axis=2)


def _pieces_read(cp, qi, shape):
    """``(count, one)`` of shape ``shape`` (items, parts): how many pieces each part reads,
    and the first of them (0 where none, as ``argmax``), from the cells where a part
    meets a piece (``cp``: item * parts + part, ``qi``: piece; in C order)."""
    n = shape[0] * shape[1]
    count = np.bincount(cp, minlength=n)
    one = np.zeros(n, dtype=np.int64)
    if len(cp):
        first = np.flatnonzero(np.concatenate([[True], cp[1:] != cp[:-1]]))
        one[cp[first]] = qi[first]
    return count.reshape(shape), one.reshape(shape)


def _distinct_rows(kind, some, gid, sg, one, count, pc, og, inbox):
    """One row per distinct record the cells in ``some`` pay: the configurations' group
    per cell, the first cell of each row (item, part) and each cell's row.

    Cells share a row where their records are equal field by field: the same kind, the
    same reader name (given by the part's index and whether its configuration splits the
    op and its statistics: :meth:`Context.reads`' consumer), the same reader box size, and
    the same count of partial sums (a reduce) or size of the piece sliced (a slice). Keyed
    by sizes rather than by which configuration or piece it is, a feed's rows shrink
    several-fold (AlexNet at 8 GPUs: 132k to 20k), and so does the cost-model call."""
    K, P = og.valid.shape
    in_lo, in_hi = inbox
    # The sizes as the rows compute them (integer products of the extents): equal codes,
    # equal fields.
    size = _size_codes(og, in_lo, in_hi)
    naming = og.split.astype(np.int64) + 2 * og.stats_split  # 0 to 3
    reader = (size * 4 + naming[:, None]) * P + np.arange(P)
    piece = _size_codes(pc, pc.lo, pc.hi)
    x = np.where(kind == 2, count, np.where(kind == 1, piece[sg[:, None], one], 0))
    X = max(int(piece.max(initial=0)), int(count.max(initial=0))) + 1
    code = (kind * (int(reader.max()) + 1) + reader[gid]) * X + x
    # Rows numbered in order of first appearance; a row's number does not change its value.
    inverse, at = _first_appearance(code[some])
    ci, pi = np.nonzero(some)
    g = np.broadcast_to(gid[:, None], kind.shape)
    return g, ci[at], pi[at], inverse


def _first_appearance(codes):
    """``(inverse, at)``: each code's number, the distinct codes numbered in order of first
    appearance, and the position of each one's first appearance (ascending)."""
    if len(codes) > 4096:
        # (hashing: about twice as fast as np.unique's sort on the large feeds)
        inverse, _ = pd.factorize(codes)
        return inverse, np.flatnonzero(np.diff(np.maximum.accumulate(inverse), prepend=-1) > 0)
    # (few codes: a sort costs less than pandas' call)
    _, first, sorted_ids = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(first), dtype=np.intp)
    rank[order] = np.arange(len(first))
    return rank[sorted_ids], first[order]


def _size_codes(owner, lo, hi):
    """``(K, P)``: each box's rank among the distinct sizes (integer products of the
    extents) of the ``(K, P, rank)`` boxes ``lo``, ``hi``; kept on ``owner`` (an
    :class:`_OpGroups` or :class:`_Pieces`, which outlives the arrays' use) per arrays."""
    cache = owner.__dict__.setdefault("_sizes", {})
    key = (id(lo), id(hi))
    got = cache.get(key)
    if got is None or got[0] is not lo or got[1] is not hi:
        _, code = np.unique(np.prod(hi - lo, axis=-1), return_inverse=True)
        got = cache[key] = (lo, hi, np.asarray(code).reshape(lo.shape[:2]))
    return got[2]


#: A feed row's op type by its kind (0, 1, 2: :func:`_row_costs`).
_ROW_TYPES = np.array(["ConcatV2", "Slice", "AddN"], dtype=object)


def _row_costs(kd, sz, count, piece, item):
    """Per row (kind ``kd``: 2 sums ``count`` partial results of ``sz`` bytes, 0
    concatenates, 1 slices a ``piece``-byte piece): its flops, input bytes and op type."""
    cnt = count.astype(np.float64)
    op_type = _ROW_TYPES[kd]
    flops = np.where(kd == 2, sz / max(item, 1) * (cnt - 1), 0.0)
    in_bytes = np.where(kd == 2, sz * cnt, np.where(kd == 0, sz, piece))
    return flops, in_bytes, op_type


def _feed_geometry_cells(pc, inbox, og, lat, inv, gid, sg):
    """:func:`_feed_geometry` cell by cell: every (item, part, piece) where both exist
    gathered and intersected axis by axis. The reference the tests compare the
    table-driven geometry with, and its fallback where a box is too large for exact
    float products in any order (2**53 elements)."""
    C = len(gid)
    in_lo, in_hi = inbox
    L, H = in_lo[gid], in_hi[gid]  # (C, P, r)
    V = og.valid[gid]
    D = og.dev[gid]
    PL, PH = pc.lo[sg], pc.hi[sg]  # (C, Q, r)
    Q, P, r = PL.shape[1], V.shape[1], L.shape[2]
    # Each valid part's box against each piece, axis by axis, for the (item, part, piece)
    # cells where both exist only (in C order: record order): the intersection's elements
    # as a float product of its integer extents (exact below 2**53, as expand's
    # float(math.prod(...))).
    ci, pi, qi = np.nonzero(pc.piece[sg][:, None, :] & V[:, :, None])
    si = sg[ci]
    ok = np.ones(len(ci), dtype=bool)
    elements = np.ones(len(ci))
    for a in range(r):
        e = (np.minimum(pc.hi[si, qi, a], H[ci, pi, a]) -
             np.maximum(pc.lo[si, qi, a], L[ci, pi, a]))
        ok &= e > 0
        # (1.0 times the first extent is that extent: the same floats as from ones)
        elements = e.astype(np.float64) if a == 0 else elements * e
    ci, pi, qi, si, elements = ci[ok], pi[ok], qi[ok], si[ok], elements[ok]
    item = pc.itemsize
    nbytes = elements * item
    dst = D[ci, pi]
    src = np.where(pc.held[si, qi, dst], dst, pc.first_dev[si, qi])
    move = (src != dst) & (nbytes > 0)
    link = None
    if move.any():
        s, d = src[move], dst[move]
        secs = lat[s, d] + nbytes[move] * inv[s, d]
        keep = secs > 0
        if keep.any():
            where = (ci[move] * P + pi[move]) * Q + qi[move]
            link = (where[keep], s[keep], d[keep], secs[keep], P, Q)
    count, one = _pieces_read(ci * P + pi, qi, (C, P))
    # The row paid: a reduce of partial sums, a concatenation of several pieces, or a
    # slice of one (none when it is the whole piece, or a view).
    partial = np.broadcast_to(pc.partial[sg][:, None], V.shape)
    kind = np.where(partial, 2, np.where(count > 1, 0, np.where(count == 1, 1, -1)))
    kind = np.where(V, kind, -1)
    size = np.prod(H - L, axis=-1).astype(np.float64) * item
    plo, phi = PL[np.arange(C)[:, None], one], PH[np.arange(C)[:, None], one]  # (C, P, r)
    jlo, jhi = np.maximum(plo, L), np.minimum(phi, H)  # the first piece's intersection
    whole_piece = np.all((jlo == plo) & (jhi == phi), axis=-1)
    pext, jext = phi - plo, jhi - jlo
    if r >= 2:
        view = np.all((jlo[..., 1:] == plo[..., 1:]) & (jext[..., 1:] == pext[..., 1:]), axis=-1)
        view &= np.prod(pext[..., 1:], axis=-1) * item % SLICE_VIEW_ALIGNMENT == 0
    else:
        view = np.zeros(V.shape, dtype=bool)
    kind = np.where((kind == 1) & (whole_piece | view), -1, kind)
    some = kind >= 0
    if some.any():
        g, ci, pi, inverse = _distinct_rows(kind, some, gid, sg, one, count, pc, og, inbox)
        kd = kind[ci, pi]
        sz = size[ci, pi]
        piece = np.prod(pext[ci, pi], axis=-1).astype(np.float64) * item
        return (V.shape, link, some, inverse, g[ci, pi], pi, kd, sz,
                *_row_costs(kd, sz, count[ci, pi], piece, item))
    return (V.shape, link, None, None, None, None, None, None, None, None, None)


def edge_table(ctx, u, v, readers, ku, kv):
    """The term of edge ``(u, v)`` for every pair of their configurations (as
    :func:`~fddps.search.pase_edges.edge_table`, from the same arrays as the vertex
    tables): a callable ``value(costs) -> numpy.ndarray`` of shape
    ``(len(configs[u]), len(configs[v]))``, or None when a record is not described here.

    Parameters
    ----------
    readers : list of str
        The ops reading across the pair, in step order.
    ku, kv : list of int
        Per configuration of ``u`` (``v``), a key: equal keys give equal terms.
    """
    try:
        return _edge_table(ctx, u, v, readers, ku, kv)
    except _Undescribed:
        return None


def _edge_table(ctx, u, v, readers, ku, kv):
    step, vertex_of, sink = ctx.step, ctx.vertex_of, ctx.sink
    rep = {}
    for side, keys in ((u, ku), (v, kv)):
        first = {}
        for a, k in enumerate(keys):
            first.setdefault(k, a)
        rep[side] = np.asarray([first[k] for k in range(len(first))], dtype=np.int64)
    nu, nv = len(rep[u]), len(rep[v])
    npairs = nu * nv
    pair_cfg = {u: rep[u][np.repeat(np.arange(nu), nv)], v: rep[v][np.tile(np.arange(nv), nu)]}
    moves = []  # transfers (pair, source, destination, seconds), in record order
    steps = []
    for n in readers:
        op = step.ops[n]
        mine = vertex_of[n]
        other = v if mine == u else u
        if op.op_type in SHAPE_ONLY_OPS:
            continue
        across = [(k, src, port) for k, (src, port) in enumerate(op.inputs)
                  if vertex_of[src] == other]
        if not across:
            continue
        og = ctx.groups(n)
        gid = og.gid[pair_cfg[mine]]
        ins, _, consumer = ctx.reads(n)
        feed_rows, links = [], []
        for k, src, port in across:
            if k >= len(ins):
                continue
            pc = ctx.pieces(src, port)
            rows, link = _feed(pc, ins[k], og, consumer, ctx.lat, ctx.inv, sink,
                               f"{src}/fddps_reduce_{port}", gid, pc.gid[pair_cfg[other]],
                               memo=ctx.feeds)
            feed_rows.append(rows)
            links.append(link)
        _add_links(moves, links)
        if feed_rows:
            _part_steps(steps, feed_rows, 0, None, og.dev[gid])
    value = _valuer(steps, moves, npairs, ctx.ndev)
    ku, kv = np.asarray(ku), np.asarray(kv)

    def table(costs):
        return value(costs).reshape(nu, nv)[ku][:, kv]

    return table


def _stats_links(og, gid, dims, moves, lat, inv, everyone):
    """The statistics each part sends to the other parts of its channels (``op_records``'
    last records), in its order: part ``p`` to part ``q``, ``q`` fastest."""
    channels = [og.letter[d] for d in dims.dims if d not in dims.stats]
    K, P = og.valid.shape
    for p in range(P):
        for q in range(P):
            if p == q:
                continue
            same = og.stats_split & og.valid[:, p] & og.valid[:, q]
            for i in channels:
                same &= (og.lo[:, p, i] == og.lo[:, q, i]) & (og.hi[:, p, i] == og.hi[:, q, i])
            a, b = og.dev[:, p], og.dev[:, q]
            move = same & (a != b)
            if not move[gid].any():
                continue
            ext = np.ones(K, dtype=np.int64)
            for i in channels:
                ext = ext * (og.hi[:, p, i] - og.lo[:, p, i])
            nbytes = 2 * 4 * ext.astype(np.float64)
            w = np.where(move, lat[a, b] + nbytes * inv[a, b], 0.0)
            moves.append((everyone, a[gid], b[gid], w[gid]))


__all__ = ["Context", "RowSink", "edge_table", "vertex_table"]
