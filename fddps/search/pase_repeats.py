"""Vertices and edges alike up to their ops' names, costed once:
:func:`repeated_vertex_table`, :func:`repeated_edge_table`.

A network's repeated blocks (ResNet-50's bottlenecks, Inception-V3's modules)
give vertices whose ops have the same types, shapes, attributes, wiring and
configurations, and differ only in their names: 133 distinct vertices of 275 in
ResNet-50, 231 of 524 in Inception-V3 at 4 GPUs. Their vertex tables
(:func:`~fddps.search.pase_vertex_tables.vertex_table`) are the same arrays but
for the cost-model rows' names (``name``, ``profile_name``), which a cost model
with profiles may time differently. So the first vertex of each kind is costed
in full and the rows it added to the build's :class:`~.pase_vertex_tables.RowSink`
remembered; each later one adds the same rows again under its own ops' names and
values its configurations as the first does, read at its own rows: the same
floats as costing it in full, without its per-op work. Where the cost model
times rows by their other columns alone (no profile:
:meth:`costmodel.CostModel.times_read_names`), a repeat adds no rows and reads
the first's.

What the vertex table reads of vertex ``i`` (its key, :func:`vertex_key`): per op,
in vertex order, everything of :class:`~fddps.strategy.graph.OpInfo` but its
name, colocation group and, unless it has a kernel shape (whose part's shape
reads them), its attributes (the description reads them too, and is in the key);
its inputs as positions in the vertex (a producer outside the vertex, whose
tensor the vertex's term does not read, as -1), its control inputs likewise, and
its resolved description; per configuration, each op's split and devices. The
cluster and cost model are the build's. A vertex the table does not describe is not
remembered.

An edge's table (:func:`~fddps.search.pase_vertex_tables.edge_table`) is
remembered likewise, by both vertices' keys, which ops read which tensors across
(as positions in the two vertices), and which configurations give equal terms
(:func:`edge_key`); its rows are named after ops of either vertex.
"""

from __future__ import annotations

import numpy as np

_MARK = "/fddps_"  # every row name is an op of the vertex, then nothing or _MARK...


def _frozen(x):
    """``x`` as a hashable value equal for equal contents (dicts sorted by key, sequences
    as tuples, arrays by dtype, shape and bytes: never their abbreviated repr)."""
    t = type(x)
    if t is tuple or t is list:
        kinds = set(map(type, x))
        if kinds <= {int}:
            # (shapes: a tuple of plain ints stands for itself; the general form's entries
            # are tuples, so "ints" tells the two apart)
            return (t.__name__, "ints") + tuple(x)
        if kinds == {tuple} and all(set(map(type, v)) <= {int} for v in x):
            # (a tuple of shapes, the usual case: each shape as above, without recursion)
            return (t.__name__,) + tuple([("tuple", "ints") + v for v in x])
    if isinstance(x, dict):
        return ("dict",) + tuple(sorted(((repr(k), _frozen(v)) for k, v in x.items())))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_frozen(v) for v in x)
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, (set, frozenset)):
        return ("set",) + tuple(sorted(repr(_frozen(v)) for v in x))
    try:
        hash(x)
    except TypeError:
        return ("repr", type(x).__name__, repr(x))
    return (type(x).__name__, x)


def vertex_key(ctx, i):
    """A hashable key of what vertex ``i``'s table depends on besides its ops' names
    (module notes): equal keys, equal tables up to the rows' names.

    Parameters
    ----------
    ctx : fddps.search.pase_vertex_tables.Context
    i : int

    Returns
    -------
    tuple
    """
    vtx = ctx.vertices[i]
    pos = {n: j for j, n in enumerate(vtx)}
    ops = []
    for n in vtx:
        op = ctx.step.ops[n]
        ops.append((op.op_type, _frozen(op.input_shapes), _frozen(op.output_shapes),
                    _frozen(op.input_itemsizes), _frozen(op.output_itemsizes),
                    # (the attributes are read through the description and the kernel
                    # shape only; some carry op names, as a reason given in words)
                    _frozen(op.attrs) if op.kernel_shape is not None else None,
                    _frozen(op.const_values), op.flops, op.input_bytes,
                    op.output_bytes, op.param_bytes, _frozen(op.param_shape), op.kernel_shape,
                    tuple((pos[s], p) if s in pos else (-1, 0) for s, p in op.inputs),
                    tuple(pos.get(s, -1) for s in op.control_inputs),
                    repr(ctx.layouts.dims_of(n))))
    configs = tuple(tuple([c[n].key for n in vtx]) for _, c in ctx.configs[i])
    return tuple(ops), configs


def _names(chunk, owner_of):
    """A recorded name column: ``(codes, parts)``, row ``r``'s name ``parts[codes[r]]``,
    each ``(position of its op in the vertex, the rest)`` (None kept as None). Rows repeat
    few names (a part's slice in every configuration): each distinct one is split once.
    Raises KeyError for a name that is no op of the vertex's."""
    rows = chunk.tolist()
    index = {s: k for k, s in enumerate(dict.fromkeys(rows))}
    codes = np.fromiter(map(index.__getitem__, rows), dtype=np.int64, count=len(rows))
    parts = []
    for s in index:
        if s is None:
            parts.append(None)
        else:
            op, mark, rest = s.partition(_MARK)
            parts.append((owner_of[op], mark + rest))
    return codes, parts


def _renamed(names, ops, cache):
    """A name column for the ops ``ops``, from :func:`_names`' ``(codes, parts)``: each
    ``(position, rest)`` as that op's name and ``rest`` (one string object per distinct
    name, kept in ``cache``)."""
    codes, parts = names
    got = np.empty(len(parts), dtype=object)
    values = []
    for x in parts:
        if x is None:
            values.append(None)
        else:
            s = cache.get(x)
            if s is None:
                s = cache[x] = ops[x[0]] + x[1]
            values.append(s)
    got[:] = values
    return got[codes]


def _key_of_vertex(ctx, i):
    """:func:`vertex_key` of vertex ``i`` as a small integer, kept in ``ctx.repeats`` (the
    edges ask it again): equal integers for equal keys. (A key is a large tuple, hashed
    anew at each dict lookup: each is hashed once, here; the tables' keys hold the
    integer.)"""
    k = ("vertex key", i)
    got = ctx.repeats.get(k)
    if got is None:
        ids = ctx.repeats.setdefault("vertex key ids", {})
        got = ctx.repeats[k] = ids.setdefault(vertex_key(ctx, i), len(ids))
    return got


def edge_key(ctx, u, v, readers, ku, kv):
    """A hashable key of what edge ``(u, v)``'s table depends on besides its ops' names:
    both vertices' keys (:func:`vertex_key`: their ops and configurations; as numbered in
    ``ctx.repeats``), the readers and the tensors each reads as positions in ``u``'s ops
    then ``v``'s, and the keys of the configurations (``ku``, ``kv``: as
    :func:`repeated_edge_table`'s)."""
    ops = ctx.vertices[u] + ctx.vertices[v]
    pos = {n: j for j, n in enumerate(ops)}
    wiring = tuple((pos[n], tuple((pos[s], p) if s in pos else (-1, 0)
                                  for s, p in ctx.step.ops[n].inputs)) for n in readers)
    return (_key_of_vertex(ctx, u), _key_of_vertex(ctx, v), wiring, tuple(ku), tuple(kv))


def _costed_once(ctx, key, ops, compute):
    """``compute()`` (a table's ``value(costs)``, or None), or, for a ``key`` seen before,
    the first table's rows added again under ``ops``' names (by position: a row of the
    first's op ``j`` is named after ``ops[j]``) and its value read at them."""
    sink = ctx.sink
    got = ctx.repeats.get(key)
    if got is not None:
        value, base, chunks, names = got
        if not sink.named:  # (rows alike but for their names cost the same: the first's)
            return value
        if isinstance(names, tuple):  # the first's ops: its names split at its first repeat
            owner_of = {n: j for j, n in enumerate(names[1])}
            try:
                names = [(_names(c["name"], owner_of), _names(c["profile_name"], owner_of))
                         for c in chunks]
            except KeyError:  # a row named after none of the ops: not repeated
                names = None
            ctx.repeats[key] = (value, base, chunks, names)
        if names is None:
            return compute()
        start = sink.n
        cache = {}
        for columns, (name, profile) in zip(chunks, names):
            columns = dict(columns)
            columns["name"] = _renamed(name, ops, cache)
            columns["profile_name"] = _renamed(profile, ops, cache)
            sink.add_columns(columns)
        # The first table's rows from ``base``, ours from ``start``, in the same order: the
        # same arithmetic on our rows' costs (the same rows but for their names). Its rows
        # are its own (every row a table reads it added itself, contiguously).
        shift = start - base
        return lambda costs: value(costs[shift:])
    base, first = sink.n, sink.chunks()
    value = compute()
    if value is None:
        return None
    if not sink.named:
        ctx.repeats[key] = (value, None, None, None)
        return value
    # (most tables are never met again: their rows' names are split only when one is)
    ctx.repeats[key] = (value, base, sink.chunk_columns(first), ("ops", list(ops)))
    return value


def repeated_vertex_table(ctx, i, vertex_table):
    """``vertex_table(ctx, i)``, or the table of an earlier vertex with the same
    :func:`vertex_key` with its rows added again under vertex ``i``'s names.

    Parameters
    ----------
    ctx : fddps.search.pase_vertex_tables.Context
        Its ``repeats`` dict keeps the tables costed so far (for this build).
    i : int
    vertex_table : callable
        :func:`~fddps.search.pase_vertex_tables.vertex_table`.

    Returns
    -------
    callable or None
        ``value(costs) -> numpy.ndarray``, one entry per configuration (None: a record
        the arrays do not describe, as ``vertex_table``'s).
    """
    return _costed_once(ctx, ("vertex", _key_of_vertex(ctx, i)), ctx.vertices[i],
                        lambda: vertex_table(ctx, i))


def repeated_edge_table(ctx, u, v, readers, ku, kv, edge_table):
    """``edge_table(ctx, u, v, readers, ku, kv)``, or the table of an earlier edge with
    the same :func:`edge_key` with its rows added again under this edge's names.

    Parameters
    ----------
    ctx : fddps.search.pase_vertex_tables.Context
    u, v : int
    readers : list of str
        The ops reading across the pair, in step order.
    ku, kv : list of int
        Per configuration of ``u`` (``v``), a key: equal keys give equal terms.
    edge_table : callable
        :func:`~fddps.search.pase_vertex_tables.edge_table`.

    Returns
    -------
    callable or None
        ``value(costs) -> numpy.ndarray`` of shape ``(len(configs[u]), len(configs[v]))``
        (None: a record the arrays do not describe, as ``edge_table``'s).
    """
    return _costed_once(ctx, ("edge", edge_key(ctx, u, v, readers, ku, kv)),
                        ctx.vertices[u] + ctx.vertices[v],
                        lambda: edge_table(ctx, u, v, readers, ku, kv))


__all__ = ["edge_key", "repeated_edge_table", "repeated_vertex_table", "vertex_key"]
