"""The DP's additive cost and its tables: :func:`build_tables`, :func:`additive_cost`.

The additive cost of a strategy is a sum of *terms*, one per vertex and one
per pair of vertices joined by a tensor. Every record of the strategy's
expansion (:func:`fddps.strategy.expand.op_records`: the tasks, the edges,
the partial-sum reduces and the slices and concatenations a reader pays for)
belongs to exactly one term:

- a part's task (its own time, a function of its own configuration only)
  and a record between two ops of one vertex: that vertex's term;
- what a reader pays to get a tensor from another vertex (the bytes of the
  pieces it reads, the reduce of partial sums it reads through, the slice or
  concatenation it assembles them with): the term of the pair, since it
  depends on the producer's layout and the reader's configuration together.

A term's value is its busiest device's seconds (the cost model's time of its
tasks, reduces, slices and concatenations there) plus its busiest link's
seconds (latency plus bytes over bandwidth of each message of its records
that crosses that link). A reduce of partial sums that two readers of
different vertices share in the expansion is counted in each reader's pair:
the price of additivity.

:func:`build_tables` fills ``unary[v][c]`` and ``pairwise[u, v][c_u, c_v]``
with these terms; :func:`additive_cost` computes the same sum for one given
strategy from its whole expansion at once (the independent check:
``tests/test_pase.py``). Costing is vectorised: each vertex's table is costed
for all its configurations at once, its rows in one cost-model call per device
type for the whole build (:mod:`~fddps.search.pase_vertex_tables`), and each
edge's table for all pairs of configurations at once
(:mod:`~fddps.search.pase_edges`), and a vertex alike an earlier one but for its
ops' names takes that one's table, its rows added again under its own names
(:mod:`~fddps.search.pase_repeats`); all give the same floats as costing each
configuration's (pair's) records, which ``build_tables(vectorised=False)`` still
does (the reference the tests compare them with).
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pandas as pd

from ..strategy.expand import op_layout, op_records
from ..strategy.ops import NotDescribed, resolve
from .pase_edges import RowCosts, edge_table
from .pase_repeats import repeated_edge_table, repeated_vertex_table
from .pase_vertex_tables import Context, vertex_table
from .pase_vertex_tables import edge_table as array_edge_table

_ROW_COLUMNS = ["name", "op_type", "flops", "input_bytes", "output_bytes", "param_bytes",
                "profile_name", "kernel_shape"]


class _Layouts:
    """op_layout per (op, configuration), cached; task -> device of every layout seen."""

    def __init__(self, step, dims=None):
        self.step = step
        self.dims = dict(dims or {})
        self.cache = {}
        self.device = {}

    def dims_of(self, name):
        if name not in self.dims:
            try:
                self.dims[name] = resolve(self.step.ops[name])
            except NotDescribed:
                self.dims[name] = None
        return self.dims[name]

    def get(self, name, cfg):
        key = (name,) + cfg.key
        lay = self.cache.get(key)
        if lay is None:
            lay = self.cache[key] = op_layout(self.step.ops[name], cfg, self.dims_of(name))
        return lay


def _owner(task):
    """The op a task of the expansion belongs to (a part, its statistics, their passes)."""
    return task.split("/fddps_part_", 1)[0]


def _task_device(layout, task):
    """The device of a task of an op with ``layout`` (its part's)."""
    if "/fddps_part_" in task:
        j = int(task.split("/fddps_part_", 1)[1].split("/", 1)[0])
        return layout[0][j].device
    return layout[0][0].device


_EMPTY = ([], 0, False)


def term_items(step, layouts, names, configs, vertex_of, keep=None, reads=None):
    """Records of ``names`` under ``configs``, sorted into terms.

    Parameters
    ----------
    keep : set of frozenset, optional
        Only these terms are returned.
    reads : callable, optional
        ``reads(name) -> set of vertices``: the producers' vertices whose tensors
        ``name``'s records are wanted for (the others are skipped: faster, and
        their records would not be kept).

    Returns
    -------
    dict of term -> (rows, links)
        ``term`` a frozenset of one or two vertices; ``rows`` a list of
        ``(device, cost-model row)``; ``links`` a list of ``(src device, dst
        device, bytes)``.
    """
    out = defaultdict(lambda: ([], []))
    for name in names:
        op, cfg = step.ops[name], configs[name]
        lay = layouts.get(name, cfg)
        wanted = reads(name) if reads is not None else None
        src_layouts = {}

        def source(src, port):
            if wanted is not None and vertex_of[src] not in wanted:
                return _EMPTY
            if src not in src_layouts:
                src_layouts[src] = layouts.get(src, configs[src])
            return src_layouts[src][2][port]

        def control(src):
            if wanted is not None and vertex_of[src] not in wanted:
                return []
            return layouts.get(src, configs[src])[1]

        here = vertex_of[name]
        last_src = name
        for r in op_records(op, cfg, layouts.dims_of(name), lay, source, control):
            kind = r[0]
            if kind == "T":
                term = frozenset((here,))
                if keep is None or term in keep:
                    out[term][0].append((r[2], r[3]))
            elif kind == "E":
                src_op = _owner(r[1])
                last_src = src_op
                if r[3] > 0:
                    term = frozenset((vertex_of[src_op], here))
                    if keep is None or term in keep:
                        sdev = _task_device(layouts.get(src_op, configs[src_op]), r[1])
                        ddev = _task_device(lay, r[2])
                        if sdev != ddev:
                            out[term][1].append((sdev, ddev, r[3]))
            elif kind == "C":
                term = frozenset((vertex_of[last_src], here))
                if keep is None or term in keep:
                    out[term][0].append((r[2], r[3]))
            elif kind == "R":
                _, key, consumer, overlapping, row = r
                term = frozenset((vertex_of[key[0]], here))
                if keep is None or term in keep:
                    out[term][0].append((key[3], row))
                    out[term][1].extend((d, key[3], b) for _, d, b in overlapping
                                        if b > 0 and d != key[3])
    return out


class _Batch:
    """Terms waiting for one batched costing: rows, their devices, links."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.index = cluster.index
        self.rows = []
        self.row_term, self.row_dev = [], []
        self.link_seconds = []  # per term: its busiest link's seconds
        lat, inv = cluster.latency, cluster.inv_bandwidth
        self._lat, self._inv = lat, inv

    def add(self, rows, links) -> int:
        term = len(self.link_seconds)
        for dev, row in rows:
            self.rows.append(row)
            self.row_term.append(term)
            self.row_dev.append(self.index[dev])
        load = defaultdict(float)
        for a, b, nbytes in links:
            i, j = self.index[a], self.index[b]
            load[i, j] += self._lat[i, j] + nbytes * self._inv[i, j]
        self.link_seconds.append(max(load.values(), default=0.0))
        return term

    def values(self, cost_model) -> np.ndarray:
        """Every term's value: busiest device's seconds plus busiest link's."""
        n = len(self.link_seconds)
        devices = self.cluster.devices
        types = list(dict.fromkeys(d.type for d in devices))
        type_of = np.array([types.index(d.type) for d in devices])
        busy = np.zeros((n, len(devices)))
        if self.rows:
            table = pd.DataFrame(self.rows, columns=_ROW_COLUMNS)
            with warnings.catch_warnings():
                from costmodel import ProfileCoverageWarning

                warnings.simplefilter("ignore", ProfileCoverageWarning)
                cost = np.column_stack([np.asarray(cost_model.op_times(table, t), dtype=np.float64)
                                        for t in types])
            dev = np.asarray(self.row_dev)
            np.add.at(busy, (np.asarray(self.row_term), dev), cost[np.arange(len(dev)), type_of[dev]])
        return busy.max(axis=1) + np.asarray(self.link_seconds)


def edges_between(step, vertex_of, scalar_edges=False) -> dict:
    """``{(u, v): ops reading across}`` for every pair of vertices joined by a tensor
    (``u < v``); the readers in both directions, in step order.

    A pair joined only by control inputs (no bytes: all-zero terms) is no edge.
    Unless ``scalar_edges``, neither is a pair joined only by scalars and shape
    vectors (at most :data:`~fddps.search.pase_vertices.SCALAR` elements: a
    latency at most, left out of the additive cost; the simulation keeps them):
    the weight decay's sum reads every layer's ``L2Loss``, which would join
    every layer to one vertex and make the tables as large as the network is
    deep.
    """
    from .pase_vertices import SCALAR, _elements

    out = defaultdict(list)
    for name, op in step.ops.items():
        v = vertex_of[name]
        for src, port in op.inputs:
            u = vertex_of[src]
            if u != v and (scalar_edges or _elements(step.ops[src], port) > SCALAR):
                key = (min(u, v), max(u, v))
                if name not in out[key]:
                    out[key].append(name)
    # Every reader across an edge, scalars and control inputs included.
    for name, op in step.ops.items():
        v = vertex_of[name]
        for src in [p for p, _ in op.inputs] + list(op.control_inputs):
            key = (min(vertex_of[src], v), max(vertex_of[src], v))
            if key in out and name not in out[key]:
                out[key].append(name)
    position = {n: i for i, n in enumerate(step.ops)}
    return {k: sorted(r, key=position.get) for k, r in out.items()}


def build_tables(step, cluster, cost_model, vertices, configs, check=None, scalar_edges=False,
                 vectorised=True, dims_of=None, edges=None):
    """``(unary, pairwise)`` of the additive cost (module notes).

    Parameters
    ----------
    vertices : list of list of str
    configs : list of list of (label, {op: OpConfig})
        Per vertex, its configurations.
    check : callable, optional
        ``check(what)`` is called between vertices and edges (a time budget).
    scalar_edges : bool
        As :func:`edges_between`'s.
    vectorised : bool
        Cost each vertex's table for all its configurations at once
        (:func:`~fddps.search.pase_vertex_tables.vertex_table`) and each edge's for all
        pairs of configurations at once (:func:`~fddps.search.pase_edges.edge_table`):
        the same values; False costs every configuration and pair record by record
        (the reference the tests compare it with).
    dims_of : dict of op -> resolved description or None, optional
        :func:`~fddps.strategy.ops.resolve` of the ops, where the caller has it.
    edges : dict, optional
        :func:`edges_between` of these vertices (and ``scalar_edges``), where the caller
        has it.

    Returns
    -------
    unary : list of numpy.ndarray
    pairwise : dict of (u, v) -> numpy.ndarray, ``u < v``, indexed ``[c_u, c_v]``
    """
    vertex_of = {n: i for i, vtx in enumerate(vertices) for n in vtx}
    layouts = _Layouts(step, dims_of)
    batch = _Batch(cluster)
    ctx = Context(step, cluster, cost_model, layouts, configs, vertex_of, vertices) \
        if vectorised else None
    unary_terms = []
    for i, vtx in enumerate(vertices):
        if vectorised:
            # (a vertex like an earlier one but for its ops' names: its rows added again)
            value = repeated_vertex_table(ctx, i, vertex_table)
            if value is not None:
                unary_terms.append(value)
                if check:
                    check(f"vertex {i + 1} of {len(vertices)} ({vtx[0]!r})")
                continue
        keep = {frozenset((i,))}
        row = []
        # An op's records in its vertex's term depend on its own configuration and those
        # of the ops of its vertex it reads: each distinct combination expanded once, the
        # term the concatenation of its ops' records in vertex order (as one call gives).
        reads = {n: [n] + [s for s in dict.fromkeys([p for p, _ in step.ops[n].inputs] +
                                                    list(step.ops[n].control_inputs))
                           if vertex_of[s] == i] for n in vtx}
        per_op = {}
        for _, cfgs in configs[i]:
            given = _Configs(cfgs, vertex_of, configs)
            rows, links = [], []
            for n in vtx:
                key = (n,) + tuple(given[m].key for m in reads[n])
                got = per_op.get(key)
                if got is None:
                    items = term_items(step, layouts, [n], given, vertex_of, keep,
                                       reads=lambda _, own={i}: own)
                    got = per_op[key] = items.get(frozenset((i,)), ([], []))
                rows.extend(got[0])
                links.extend(got[1])
            row.append(batch.add(rows, links))
        unary_terms.append(row)
        if check:
            check(f"vertex {i + 1} of {len(vertices)} ({vtx[0]!r})")
    pair_terms, pair_tables = {}, {}
    row_costs = RowCosts(cluster, cost_model)
    if edges is None:
        edges = edges_between(step, vertex_of, scalar_edges)
    for e, ((u, v), readers) in enumerate(edges.items()):
        term = frozenset((u, v))
        keep = {term}
        # The term depends on u's configuration only through the configurations of the
        # ops of u that read v or that v reads (and likewise for v): cost each distinct
        # pair of those once.
        touch_u = _touching(step, readers, vertex_of, u)
        touch_v = _touching(step, readers, vertex_of, v)
        ku = _distinct(configs[u], touch_u)
        kv = _distinct(configs[v], touch_v)
        if vectorised:
            table = repeated_edge_table(ctx, u, v, readers, ku, kv, array_edge_table)
            if table is None:  # not described by the arrays: the older vectorised path
                table = edge_table(step, cluster, layouts, configs, vertex_of, u, v, readers,
                                   ku, kv, row_costs)
            if table is not None:
                pair_tables[u, v] = table
                if check:
                    check(f"edge {e + 1} of {len(edges)} between vertices")
                continue
        cache, per_reader = {}, {}
        sides = {u: {v}, v: {u}}

        def other(n, sides=sides):
            return sides[vertex_of[n]]

        # What each reader's records depend on: its own configuration and those of the
        # producers across the pair it reads.
        crossing = {n: [n] + [s for s in dict.fromkeys(
            [p for p, _ in step.ops[n].inputs] + list(step.ops[n].control_inputs))
            if vertex_of[s] in other(n)] for n in readers}
        index = np.zeros((len(configs[u]), len(configs[v])), dtype=np.int64)
        for a, (_, cu) in enumerate(configs[u]):
            for b, (_, cv) in enumerate(configs[v]):
                key = (ku[a], kv[b])
                if key not in cache:
                    merged = _Configs(dict(cu), vertex_of, configs)
                    merged.update(cv)
                    rows, links = [], []
                    for n in readers:
                        rkey = (n,) + tuple(merged[m].key for m in crossing[n])
                        got = per_reader.get(rkey)
                        if got is None:
                            items = term_items(step, layouts, [n], merged, vertex_of, keep,
                                               reads=other)
                            got = per_reader[rkey] = items.get(term, ([], []))
                        rows.extend(got[0])
                        links.extend(got[1])
                    cache[key] = batch.add(rows, links)
                index[a, b] = cache[key]
        pair_terms[u, v] = index
        if check:
            check(f"edge {e + 1} of {len(edges)} between vertices")
    values = batch.values(cost_model)
    costs = ctx.sink.costs() if ctx is not None else None
    unary = [r(costs) if callable(r) else values[np.asarray(r, dtype=np.int64)]
             for r in unary_terms]
    pairwise = {}
    for k in edges:
        t = pair_tables[k] if k in pair_tables else values[pair_terms[k]]
        pairwise[k] = t(costs) if callable(t) else t
    return unary, pairwise


def _touching(step, readers, vertex_of, w) -> list:
    """Ops of vertex ``w`` whose configuration a pair's records read: its readers and the
    producers the other side's readers read."""
    out = []
    for n in readers:
        if vertex_of[n] == w:
            out.append(n)
        op = step.ops[n]
        for src in [p for p, _ in op.inputs] + list(op.control_inputs):
            if vertex_of[src] == w:
                out.append(src)
    return list(dict.fromkeys(out))


def _distinct(configs, names) -> list:
    """Per configuration, a key of the configurations of ``names`` (equal keys: equal terms)."""
    keys, by_id, out = {}, {}, []
    for _, cfgs in configs:
        # The OpConfig objects repeat across configurations (vertex_configs shares them;
        # they live in ``configs`` meanwhile): each distinct combination keyed once.
        objs = tuple([id(cfgs[n]) for n in names])
        got = by_id.get(objs)
        if got is None:
            key = tuple(cfgs[n].key for n in names)
            got = by_id[objs] = keys.setdefault(key, len(keys))
        out.append(got)
    return out


class _Configs(dict):
    """A configuration map for :func:`term_items`: the given ops', every other op whole on
    the first device of its vertex's first configuration (its records are not kept)."""

    def __init__(self, given, vertex_of, configs):
        super().__init__(given)
        self._vertex_of, self._configs = vertex_of, configs

    def __missing__(self, name):
        return self._configs[self._vertex_of[name]][0][1][name]


def additive_cost(step, cluster, cost_model, vertices, strategy, scalar_edges=False):
    """The additive cost of a whole ``strategy`` (module notes), from its full expansion:
    the terms of the vertices and of the pairs :func:`edges_between` makes edges.

    Returns
    -------
    (total, terms) : float, dict of frozenset -> float
    """
    vertex_of = {n: i for i, vtx in enumerate(vertices) for n in vtx}
    configs = {n: strategy.config(n) for n in step.ops}
    layouts = _Layouts(step)
    items = term_items(step, layouts, list(step.ops), configs, vertex_of)
    edges = {frozenset(e) for e in edges_between(step, vertex_of, scalar_edges)}
    batch = _Batch(cluster)
    order = [t for t in items if len(t) == 1 or t in edges]
    for term in order:
        batch.add(*items[term])
    values = batch.values(cost_model)
    terms = dict(zip(order, values.tolist()))
    return float(sum(terms.values())), terms


def tables_cost(unary, pairwise, choice) -> float:
    """``sum_v unary[v][c_v] + sum_(u,v) pairwise[u, v][c_u, c_v]`` at ``choice``."""
    return float(sum(unary[v][c] for v, c in enumerate(choice)) +
                 sum(t[choice[u], choice[v]] for (u, v), t in pairwise.items()))


__all__ = ["additive_cost", "build_tables", "edges_between", "tables_cost", "term_items"]
