"""The DP's edge tables, costed for every pair of configurations at once: :func:`edge_table`.

An edge's term (:mod:`~fddps.search.pase_tables`) is what the readers across
the pair pay to get their inputs from the other vertex: for each part of a
reader and each input it reads across, the pieces of the producer's output
its box meets (a transfer each, unless held on the reader's device), then a
concatenation of several pieces, a slice of one (unless a view), or, when the
producer holds partial sums, a reduce. Costing these records op by op
(:func:`~fddps.search.pase_tables.term_items`, expanding every reader once per
pair of configurations) took 96% of the search. Here the same records are
derived once per reader configuration (its parts' boxes, devices and task
names, from :func:`~fddps.strategy.expand.op_records` itself) and once per
producer layout (its pieces), and every pair of configurations is then costed
together with numpy: box intersections, locality, piece counts, the rows
paid for, and the link loads.

The values are the same floats as the record-by-record costing: each pair's
busiest device and busiest link are accumulated in the records' own order
(adding zero where a pair has no record is exact), and rows are costed by the
cost model (row by row, cached by their fields). Edges whose records this
path does not describe (a box that meets none of a producer's pieces, boxes
of unequal rank) return ``None``, and the caller costs them record by record.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from ..strategy.expand import SHAPE_ONLY_OPS
from ..strategy.ops import first_axis_view

_ROW_COLUMNS = ["name", "op_type", "flops", "input_bytes", "output_bytes", "param_bytes",
                "profile_name", "kernel_shape"]
#: A box larger than any tensor (the probe's piece: it meets every box whole).
_BIG = ((-(2 ** 62), 2 ** 62),) * 16
_PROBE = "\x00pase_probe_"


class RowCosts:
    """Cost-model seconds per device type of cost-model rows, cached by their fields; and
    what the edges of one build share: each reader configuration's feeds, each row's
    fields."""

    def __init__(self, cluster, cost_model):
        devices = cluster.devices
        self.types = list(dict.fromkeys(d.type for d in devices))
        self.type_of = np.array([self.types.index(d.type) for d in devices])
        self.cost_model = cost_model
        self.cache = {}
        self.feeds = {}  # (reader, its configuration) -> _reader_positions
        self.rows = {}  # (kind, feed, piece or count) -> _row's fields (None: no row)

    def __call__(self, rows) -> np.ndarray:
        """``(len(rows), devices)``: each row's seconds on each device of the cluster."""
        key = [tuple(r.get(c) for c in _ROW_COLUMNS) for r in rows]
        new = [r for r, k in zip(rows, key) if k not in self.cache]
        if new:
            seen = {}
            for r in new:
                seen.setdefault(tuple(r.get(c) for c in _ROW_COLUMNS), r)
            table = pd.DataFrame(list(seen.values()), columns=_ROW_COLUMNS)
            with warnings.catch_warnings():
                from costmodel import ProfileCoverageWarning

                warnings.simplefilter("ignore", ProfileCoverageWarning)
                cost = np.column_stack([np.asarray(self.cost_model.op_times(table, t),
                                                   dtype=np.float64) for t in self.types])
            for k, c in zip(seen, cost):
                self.cache[k] = c
        per_type = np.array([self.cache[k] for k in key]).reshape(len(rows), len(self.types))
        return per_type[:, self.type_of]


def _task_device(layout, task):
    if "/fddps_part_" in task:
        j = int(task.split("/fddps_part_", 1)[1].split("/", 1)[0])
        return layout[0][j].device
    return layout[0][0].device


def _reader_positions(step, layouts, name, cfg, across):
    """The feeds of reader ``name`` under ``cfg`` from producers in ``across``, in record
    order: ``[(src, port, target task, box, device)]``; None where a feed meets no piece."""
    from ..strategy.expand import op_records

    op = step.ops[name]
    lay = layouts.get(name, cfg)
    calls = []

    def source(src, port):
        if src not in across:
            return ([], 0, False)
        calls.append((src, port))
        return ([(f"{_PROBE}{len(calls) - 1}", None, _BIG)], 1, False)

    recs = op_records(op, cfg, layouts.dims_of(name), lay, source, lambda src: [])
    if op.op_type in SHAPE_ONLY_OPS:
        return []
    found = {}
    for r in recs:
        if r[0] == "E" and len(r) > 4 and r[1].startswith(_PROBE):
            found[int(r[1][len(_PROBE):])] = (r[2], r[4])
    if len(found) != len(calls):
        return None
    out = []
    for i, (src, port) in enumerate(calls):
        target, box = found[i]
        out.append((src, port, target, tuple(box), _task_device(lay, target)))
    return out


def edge_table(step, cluster, layouts, configs, vertex_of, u, v, readers, ku, kv, row_costs):
    """The edge term of ``(u, v)`` for every pair of their configurations (module notes).

    Parameters
    ----------
    layouts : pase_tables._Layouts
    configs : list of list of (label, {op: OpConfig})
    readers : list of str
        The ops reading across the pair, in step order (``edges_between``).
    ku, kv : list of int
        Per configuration of ``u`` (``v``), a key: equal keys give equal terms.
    row_costs : RowCosts

    Returns
    -------
    numpy.ndarray of shape (len(configs[u]), len(configs[v])), or None when the edge's
    records are not all of the kinds described here.
    """
    index = cluster.index
    lat, inv = np.asarray(cluster.latency, dtype=np.float64), np.asarray(cluster.inv_bandwidth,
                                                                         dtype=np.float64)
    ndev = len(cluster.devices)
    rep = {}
    for side, keys in ((u, ku), (v, kv)):
        first = {}
        for a, k in enumerate(keys):
            first.setdefault(k, a)
        rep[side] = [first[k] for k in range(len(first))]
    nu, nv = len(rep[u]), len(rep[v])
    npairs = nu * nv
    pair_key = {u: np.repeat(np.arange(nu), nv), v: np.tile(np.arange(nv), nu)}
    everyone = np.arange(npairs)

    busy = np.zeros((npairs, ndev))
    load = np.zeros((npairs, ndev, ndev))
    row_steps = []  # (row index per pair or -1, device per pair), in record order
    row_specs, row_of = [], {}

    def row_id(spec):
        k = tuple(spec.get(c) for c in _ROW_COLUMNS)
        if k not in row_of:
            row_of[k] = len(row_specs)
            row_specs.append(spec)
        return row_of[k]

    for n in readers:
        mine = vertex_of[n]
        other = v if mine == u else u
        across = {m for m in [p for p, _ in step.ops[n].inputs] if vertex_of[m] == other}
        if not across or step.ops[n].op_type in SHAPE_ONLY_OPS:
            continue
        # The reader's distinct configurations (over its side's keys) and their feeds.
        cfg_id, cfg_pos = {}, []
        reader_cfg = []
        for a in rep[mine]:
            cfg = configs[mine][a][1][n]
            k = cfg.key
            if k not in cfg_id:
                # Feeds from every other vertex, derived once per reader configuration
                # for all the edges it reads across; this edge's kept (record order).
                pos = row_costs.feeds.get((n, k))
                if pos is None and (n, k) not in row_costs.feeds:
                    outside = {m for m, _ in step.ops[n].inputs if vertex_of[m] != mine}
                    pos = row_costs.feeds[n, k] = _reader_positions(step, layouts, n, cfg,
                                                                    outside)
                if pos is None:
                    return None
                pos = [x for x in pos if x[0] in across]
                cfg_id[k] = len(cfg_pos)
                cfg_pos.append(pos)
            reader_cfg.append(cfg_id[k])
        rc = np.asarray(reader_cfg)[pair_key[mine]]  # reader configuration per pair
        # Producer layouts per tensor read across, over the other side's keys.
        tensors = list(dict.fromkeys((s, p) for pos in cfg_pos for s, p, *_ in pos))
        lay_specs, lay_id = [], {}
        tensor_lay = np.zeros((len(tensors), len(rep[other])), dtype=np.int64)
        for t, (src, port) in enumerate(tensors):
            for i, a in enumerate(rep[other]):
                cfg = configs[other][a][1][src]
                k = (src, port) + cfg.key
                if k not in lay_id:
                    entries, itemsize, partial = layouts.get(src, cfg)[2][port]
                    groups = {}  # box -> (first holder's device, holders)
                    if partial:
                        groups = [(box, index[d], {index[d]}) for _, d, box in entries]
                    else:
                        for _, d, box in entries:
                            g = groups.setdefault(box, (index[d], set()))
                            g[1].add(index[d])
                        groups = [(box, first, held) for box, (first, held) in groups.items()]
                    lay_id[k] = len(lay_specs)
                    lay_specs.append((groups, itemsize, partial, src, port))
                tensor_lay[t, i] = lay_id[k]
        lay_of = tensor_lay[:, pair_key[other]]  # (tensor, pair) -> layout
        ngroups = max(len(s[0]) for s in lay_specs)
        # Every box of a tensor has its rank (else: costed record by record); boxes of
        # lower rank are padded with (0, 1) axes, which change no intersection or size.
        tensor_of = {t: i for i, t in enumerate(tensors)}
        rank_of, itemsize_of = {}, {}
        for groups, itemsize, _, src, port in lay_specs:
            for box, _, _ in groups:
                if rank_of.setdefault((src, port), len(box)) != len(box):
                    return None
            if itemsize_of.setdefault((src, port), itemsize) != itemsize:
                return None
        for p in cfg_pos:
            for src, port, _, box, _ in p:
                if rank_of.get((src, port), len(box)) != len(box):
                    return None
        rank = max([len(pos[3]) for p in cfg_pos for pos in p] + list(rank_of.values()) + [0])
        nl = len(lay_specs)
        # Layout tables, padded: group boxes, first holders, holders, validity.
        g_lo = np.zeros((nl, ngroups, rank), dtype=np.int64)
        g_hi = np.ones((nl, ngroups, rank), dtype=np.int64)
        g_first = np.zeros((nl, ngroups), dtype=np.int64)
        g_held = np.zeros((nl, ngroups, ndev), dtype=bool)
        g_ok = np.zeros((nl, ngroups), dtype=bool)
        g_id = np.full((nl, ngroups), -1, dtype=np.int64)
        boxes, box_id = [], {}
        l_item = np.array([s[1] for s in lay_specs], dtype=np.float64)
        l_partial = np.array([s[2] for s in lay_specs], dtype=bool)
        for li, (groups, _, _, _, _) in enumerate(lay_specs):
            for g, (box, first, held) in enumerate(groups):
                r = len(box)
                g_lo[li, g, :r] = [a for a, _ in box]
                g_hi[li, g, :r] = [b for _, b in box]
                g_first[li, g] = first
                g_held[li, g, list(held)] = True
                g_ok[li, g] = True
                if box not in box_id:
                    box_id[box] = len(boxes)
                    boxes.append(box)
                g_id[li, g] = box_id[box]
        npos = max(len(p) for p in cfg_pos)
        for i in range(npos):
            # Position i of every reader configuration: its tensor, box, device, target.
            has = np.array([i < len(p) for p in cfg_pos])
            p_t = np.array([tensor_of[p[i][:2]] if i < len(p) else 0 for p in cfg_pos])
            p_dev = np.array([index[p[i][4]] if i < len(p) else 0 for p in cfg_pos])
            p_lo = np.zeros((len(cfg_pos), rank), dtype=np.int64)
            p_hi = np.ones((len(cfg_pos), rank), dtype=np.int64)
            for c, p in enumerate(cfg_pos):
                if i < len(p):
                    r = len(p[i][3])
                    p_lo[c, :r] = [a for a, _ in p[i][3]]
                    p_hi[c, :r] = [b for _, b in p[i][3]]
            valid = has[rc]
            if not valid.any():
                continue
            dev = p_dev[rc]
            lay = lay_of[p_t[rc], everyone]
            lo, hi = p_lo[rc], p_hi[rc]
            item = l_item[lay]
            partial = l_partial[lay]
            count = np.zeros(npairs, dtype=np.int64)
            one_g = np.full(npairs, -1, dtype=np.int64)  # the first piece's group
            for g in range(ngroups):
                ok = valid & g_ok[lay, g]
                ilo = np.maximum(g_lo[lay, g], lo)
                ihi = np.minimum(g_hi[lay, g], hi)
                ok &= np.all(ihi > ilo, axis=1)
                if not ok.any():
                    continue
                nbytes = np.prod(ihi - ilo, axis=1).astype(np.float64) * item
                local = g_held[lay, g, dev]
                src_dev = np.where(local, dev, g_first[lay, g])
                move = ok & (src_dev != dev) & (nbytes > 0)
                if move.any():
                    w = np.where(move, lat[src_dev, dev] + nbytes * inv[src_dev, dev], 0.0)
                    load[everyone, src_dev, dev] += w
                one_g = np.where(ok & (count == 0), g, one_g)
                count += ok
            # The rows paid: a reduce (partial sums), a concatenation, or a slice; one
            # code per distinct row, built once.
            kind = np.where(partial, 2, np.where(count > 1, 0, np.where(count == 1, 1, -1)))
            kind = np.where(valid, kind, -1)
            piece_box = g_id[lay, np.maximum(one_g, 0)]
            x = np.where(kind == 2, count, np.where(kind == 1, piece_box, 0))
            span = max(len(boxes), ngroups) + 1
            code = (kind * len(cfg_pos) + rc) * span + x
            rows = np.full(npairs, -1, dtype=np.int64)
            some = kind >= 0
            if some.any():
                uniq, inverse = np.unique(code[some], return_inverse=True)
                ids = np.empty(len(uniq), dtype=np.int64)
                for j, cd in enumerate(uniq.tolist()):
                    rest, xx = divmod(cd, span)
                    kk, c = divmod(rest, len(cfg_pos))
                    feed = cfg_pos[c][i]
                    memo = (kk, feed[:4], boxes[xx] if kk == 1 else xx)
                    if memo not in row_costs.rows:
                        row_costs.rows[memo] = _row(kk, feed, xx, boxes,
                                                    itemsize_of[feed[:2]])
                    spec = row_costs.rows[memo]
                    ids[j] = -1 if spec is None else row_id(spec)
                rows[some] = ids[inverse]
            row_steps.append((rows, dev))
    if row_specs:
        costs = row_costs(row_specs)
        for rows, dev in row_steps:
            has = rows >= 0
            busy[everyone, dev] += np.where(has, costs[np.maximum(rows, 0), dev], 0.0)
    value = busy.max(axis=1) + load.reshape(npairs, -1).max(axis=1)
    table = value.reshape(nu, nv)
    return table[np.asarray(ku)][:, np.asarray(kv)]


def _row(kind, position, x, boxes, itemsize):
    """The row a feed at ``position`` pays: a reduce of ``x`` partial sums (kind 2), a
    concatenation (0), a slice of piece ``boxes[x]`` (1; none when it is the whole piece
    or a view); None for none. The same fields as :func:`~fddps.strategy.expand.op_records`'."""
    src, port, consumer, box, _ = position
    size = float(math.prod(b - a for a, b in box)) * itemsize
    if kind == 2:
        return dict(name=f"{src}/fddps_reduce_{port}", op_type="AddN",
                    flops=size / max(itemsize, 1) * (x - 1),
                    input_bytes=size * x, output_bytes=size, param_bytes=0.0)
    if kind == 0:
        return dict(name=f"{consumer}/fddps_concat", op_type="ConcatV2", flops=0.0,
                    input_bytes=size, output_bytes=size, param_bytes=0.0)
    pbox = boxes[x]
    inter = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(pbox, box))
    if inter == pbox or first_axis_view([b - a for a, b in pbox],
                                        [a - a0 for (a, _), (a0, _) in zip(inter, pbox)],
                                        [b - a for a, b in inter], itemsize):
        return None
    return dict(name=f"{consumer}/fddps_slice", op_type="Slice", flops=0.0,
                input_bytes=float(math.prod(b - a for a, b in pbox)) * itemsize,
                output_bytes=size, param_bytes=0.0)
