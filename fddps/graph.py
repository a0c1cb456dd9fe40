"""The op graph: operators with costs and memory, edges with the bytes they carry.

An :class:`OpGraph` is immutable and stored as flat numpy arrays (compressed
sparse rows for predecessors and successors), so a 100k-op training graph costs a
few megabytes and every algorithm walks it without building per-op objects.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from .errors import ClusterError, GraphError

#: ``device_types`` value of a graph whose costs hold on every device type.
ANY_TYPE = "*"

#: Op types whose output, on their own device, is their first input's buffer:
#: TensorFlow forwards it instead of copying (a ``ReadVariableOp`` returns the
#: resource variable's storage; ``Identity`` and ``StopGradient`` their input;
#: ``Reshape``, ``Squeeze``, ``ExpandDims`` it with a new shape). Such an op
#: allocates nothing where it runs, but keeps that buffer alive until its own
#: consumers there finish; a device that reads its output remotely still
#: receives a copy.
ALIAS_OP_TYPES = frozenset({"ReadVariableOp", "Identity", "StopGradient", "PreventGradient",
                            "EnsureShape", "Reshape", "Squeeze", "ExpandDims"})


def _as_float_array(values, n, what, names, default=0.0):
    if values is None:
        return np.full(n, default, dtype=np.float64)
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise GraphError(f"{what} must have one value per op ({n}), got shape {arr.shape}")
    bad = np.flatnonzero(~(arr >= 0) | np.isinf(arr))
    if bad.size:
        i = int(bad[0])
        raise GraphError(f"op {names[i]!r} has an invalid {what} {float(arr[i])!r} (must be finite and >= 0)")
    return arr


def _csr(keys, n):
    """Row pointers and a stable permutation grouping edge ids by ``keys``."""
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, order


class OpGraph:
    """A directed acyclic graph of operators.

    Parameters
    ----------
    names : sequence of hashable
        One unique name per op (kept as given: networkx node keys, TensorFlow op
        names, STG task ids).
    cost : array-like, shape (n,) or (n, T)
        Execution time in seconds on a device of speed 1. With shape ``(n, T)``
        column ``t`` is the time on devices of type ``device_types[t]``; ``inf``
        means the op cannot run on that type (no kernel).
    edges : sequence of (src, dst) or (src, dst, bytes)
        Dependencies by op name. Control edges carry 0 bytes. Parallel edges are
        merged and their bytes summed.
    memory : array-like, shape (n,), optional
        Persistent bytes the op keeps on its device for the whole step
        (parameters, optimizer slots). Default 0.
    transient : array-like, shape (n,), optional
        Bytes of the op's outputs and temporaries. Default 0. Held from the
        op's start until its last consumer on the device finishes; a schedule
        must keep every device's replayed peak within its memory
        (:meth:`fddps.Schedule.peak_memory`).
    aliases : sequence of bool, optional
        Ops whose outputs share their input's buffer on their device
        (:data:`ALIAS_OP_TYPES`): they allocate nothing there (their
        :attr:`allocated` bytes are 0) and keep their inputs' buffers until
        their own consumers there finish; a copy another device receives is
        still ``transient`` bytes. Default: the ops whose ``op_types`` entry
        is in :data:`ALIAS_OP_TYPES`.
    device_types : sequence of str, optional
        Column labels of a 2-D ``cost``. Default: one column valid on any type.
    op_types : sequence of str, optional
        Operator type per op (``"Conv2D"``); used by intra-op splitting and reports.
    colocation : sequence of hashable or None, optional
        Group key per op; ops with the same key must share a device.
    pinned : mapping of op name to device name, optional
        Ops that must run on the named device.
    split_candidates : sequence of fddps.strategy.fddps_splits.SplitCandidate, optional
        Ops that FD-DPS may split into parts (intra-op parallelism); the
        TensorFlow adapter fills this from tensor shapes.

    Raises
    ------
    GraphError
        On duplicate names, an edge naming an unknown op, a self-loop or cycle
        (an op on it is named), or a negative, NaN or infinite cost or memory.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0, 2.0, 1.0], [("a", "b", 1e6), ("a", "c")])
    >>> g.num_ops, g.num_edges
    (3, 2)
    >>> [g.names[i] for i in g.successors(0)]
    ['b', 'c']
    """

    def __init__(self, names: Sequence[Hashable], cost, edges=(), *, memory=None,
                 transient=None, device_types=None, op_types=None, colocation=None,
                 pinned: Mapping | None = None, split_candidates=(), aliases=None):
        self.names = tuple(names)
        n = len(self.names)
        self.index = {name: i for i, name in enumerate(self.names)}
        if len(self.index) != n:
            seen = set()
            dup = next(x for x in self.names if x in seen or seen.add(x))
            raise GraphError(f"op name {dup!r} appears more than once")

        try:
            cost = np.asarray(cost, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise GraphError(f"cost must be numbers, one per op (shape (n,)) or one per op "
                             f"and device type (shape (n, T)): {err}") from None
        if cost.ndim == 1:
            if cost.shape[0] != n:
                raise GraphError(f"cost has {cost.shape[0]} values for {n} ops: give one "
                                 f"execution time per op (ops {list(self.names[:5])}"
                                 f"{' ...' if n > 5 else ''})")
            cost = cost.reshape(n, 1) if n else np.zeros((0, 1))
        if cost.ndim != 2 or cost.shape[0] != n:
            raise GraphError(f"cost must have shape (n,) or (n, T) with n={n}, got {cost.shape}")
        if device_types is None:
            if cost.shape[1] != 1:
                raise GraphError("a cost table with several columns needs device_types")
            device_types = (ANY_TYPE,)
        self.device_types = tuple(device_types)
        if len(self.device_types) != cost.shape[1]:
            raise GraphError(f"{cost.shape[1]} cost columns but {len(self.device_types)} device types")
        bad = np.argwhere(np.isnan(cost) | (cost < 0))
        if bad.size:
            i, t = map(int, bad[0])
            raise GraphError(f"op {self.names[i]!r} has an invalid cost {float(cost[i, t])!r}"
                             f" on device type {self.device_types[t]!r} (must be >= 0)")
        self.cost = cost
        self.memory = _as_float_array(memory, n, "memory", self.names)
        self.transient = _as_float_array(transient, n, "transient memory", self.names)
        self.op_types = tuple(op_types) if op_types is not None else ("",) * n
        if len(self.op_types) != n:
            raise GraphError(f"op_types must have one entry per op ({n})")
        if aliases is None:
            aliases = [t in ALIAS_OP_TYPES for t in self.op_types]
        self.aliases = np.asarray(aliases, dtype=bool).reshape(-1)
        if self.aliases.shape != (n,):
            raise GraphError(f"aliases must have one entry per op ({n}), got {len(self.aliases)}")

        # Colocation: group ids 0..G-1 in first-appearance order, -1 for none.
        self.colocation = np.full(n, -1, dtype=np.int64)
        if colocation is not None:
            keys = {}
            for i, key in enumerate(colocation):
                if key is not None:
                    self.colocation[i] = keys.setdefault(key, len(keys))
        self.pinned = {}
        for name, device in (pinned or {}).items():
            if name not in self.index:
                raise GraphError(f"pinned op {name!r} is not in the graph")
            self.pinned[self.index[name]] = device

        self.split_candidates = tuple(split_candidates)
        for cand in self.split_candidates:
            if cand.op not in self.index:
                raise GraphError(f"split candidate {cand.op!r} is not an op of the graph")
        self._build_edges(edges)
        self.topo = self._topological_order()
        for arr in (self.cost, self.memory, self.transient, self.aliases, self.colocation,
                    self.src, self.dst, self.bytes, self.topo):
            arr.setflags(write=False)

    # -- construction helpers -------------------------------------------------
    def _build_edges(self, edges):
        n = len(self.names)
        index = self.index
        src, dst, nbytes = [], [], []
        for edge in edges:
            try:
                if len(edge) == 2:
                    (u, v), b = edge, 0.0
                else:
                    u, v, b = edge
                src.append(index[u])
                dst.append(index[v])
            except (KeyError, TypeError, ValueError):
                if not isinstance(edge, (tuple, list)) or len(edge) not in (2, 3):
                    raise GraphError(f"an edge must be (src, dst) or (src, dst, bytes), "
                                     f"got {edge!r}") from None
                end = u if u not in index else v
                raise GraphError(f"edge {u!r} -> {v!r} names unknown op {end!r}") from None
            nbytes.append(0.0 if b is None else b)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        try:
            nbytes = np.asarray(nbytes, dtype=np.float64)
        except (TypeError, ValueError):
            raise GraphError("edge byte counts must be numbers") from None
        bad = np.flatnonzero(~(nbytes >= 0) | np.isinf(nbytes))
        if bad.size:
            e = int(bad[0])
            raise GraphError(f"edge {self.names[src[e]]!r} -> {self.names[dst[e]]!r} carries an "
                             f"invalid byte count {float(nbytes[e])!r}")
        loops = np.flatnonzero(src == dst)
        if loops.size:
            raise GraphError(f"op {self.names[src[loops[0]]]!r} has an edge to itself (a cycle)")
        # Merge parallel edges, summing their bytes, keeping first-seen order.
        keys, first, inverse = np.unique(src * max(n, 1) + dst, return_index=True, return_inverse=True)
        merged = np.bincount(inverse, weights=nbytes, minlength=len(keys))
        order = np.argsort(first, kind="stable")
        self.src = src[first[order]]
        self.dst = dst[first[order]]
        self.bytes = merged[order]
        self.succ_ptr, self.succ_eid = _csr(self.src, n)
        self.pred_ptr, self.pred_eid = _csr(self.dst, n)
        self.succ_idx = self.dst[self.succ_eid]
        self.pred_idx = self.src[self.pred_eid]
        for arr in (self.succ_ptr, self.succ_eid, self.pred_ptr, self.pred_eid,
                    self.succ_idx, self.pred_idx):
            arr.setflags(write=False)

    def _topological_order(self):
        n = len(self.names)
        indeg = np.diff(self.pred_ptr).tolist()
        succ_ptr, succ_idx = self.succ_ptr.tolist(), self.succ_idx.tolist()
        stack = [i for i in range(n - 1, -1, -1) if indeg[i] == 0]
        order = []
        while stack:
            i = stack.pop()
            order.append(i)
            for j in succ_idx[succ_ptr[i]:succ_ptr[i + 1]]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    stack.append(j)
        if len(order) < n:
            # Walk predecessors inside the unsorted remainder until one repeats:
            # that op lies on a cycle.
            left = {i for i in range(n) if indeg[i] > 0}
            i, seen = next(iter(sorted(left))), []
            while i not in seen:
                seen.append(i)
                i = next(p for p in self.predecessors(i) if p in left)
            cycle = seen[seen.index(i):]
            path = " -> ".join(repr(self.names[k]) for k in reversed(cycle[:6]))
            raise GraphError(f"the graph has a cycle through op {self.names[i]!r} ({path} ...)")
        return np.asarray(order, dtype=np.int64)

    # -- queries ---------------------------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    def __len__(self):
        return len(self.names)

    @property
    def allocated(self) -> np.ndarray:
        """Transient bytes each op allocates on its own device: 0 for :attr:`aliases`."""
        return np.where(self.aliases, 0.0, self.transient)

    def __repr__(self):
        return (f"OpGraph({self.num_ops} ops, {self.num_edges} edges, "
                f"device types {list(self.device_types)})")

    def predecessors(self, i: int) -> np.ndarray:
        """Indices of the ops ``i`` depends on."""
        return self.pred_idx[self.pred_ptr[i]:self.pred_ptr[i + 1]]

    def successors(self, i: int) -> np.ndarray:
        """Indices of the ops that depend on ``i``."""
        return self.succ_idx[self.succ_ptr[i]:self.succ_ptr[i + 1]]

    def input_pairs(self) -> tuple:
        """Per op, its inputs as a tuple of ``(producer, bytes)`` pairs (Python ints and floats).

        Built once per graph and kept (schedulers build a state per pass; a
        20,000-op graph's pairs take tens of milliseconds each time).

        Examples
        --------
        >>> OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 8.0)]).input_pairs()
        ((), ((0, 8.0),))
        """
        pairs = self.__dict__.get("_input_pairs")
        if pairs is None:
            ptr = self.pred_ptr.tolist()
            idx = self.pred_idx.tolist()
            nbytes = self.bytes[self.pred_eid].tolist()
            pairs = self._input_pairs = tuple(tuple(zip(idx[ptr[i]:ptr[i + 1]], nbytes[ptr[i]:ptr[i + 1]]))
                                              for i in range(len(self.names)))
        return pairs

    def exec_times(self, cluster) -> np.ndarray:
        """Execution time of every op on every device of ``cluster``.

        Returns an array of shape ``(num_ops, num_devices)``: the op's cost for
        the device's type divided by the device's speed; ``inf`` where the op
        cannot run on that device type.

        Raises
        ------
        ClusterError
            If a device's type has no cost column in this graph.
        """
        if self.device_types == (ANY_TYPE,):
            cols = np.zeros(cluster.num_devices, dtype=np.int64)
        else:
            where = {t: k for k, t in enumerate(self.device_types)}
            missing = [d for d in cluster.devices if d.type not in where]
            if missing:
                raise ClusterError(
                    f"device {missing[0].name!r} has type {missing[0].type!r}, but the graph "
                    f"has costs only for {list(self.device_types)}")
            cols = np.array([where[d.type] for d in cluster.devices], dtype=np.int64)
        speed = np.array([d.speed for d in cluster.devices], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            et = self.cost[:, cols] / speed
        return np.where(np.isnan(et), np.inf, et)

    def reversed(self) -> "OpGraph":
        """The same ops with every edge turned around (shares the arrays; O(1)).

        Used by backward scheduling passes: a schedule of the reversed graph,
        read backwards in time, is a schedule of the original.
        """
        rev = object.__new__(OpGraph)
        rev.__dict__.update(self.__dict__)
        rev.__dict__.pop("_input_pairs", None)  # the inputs of the reversed graph differ
        rev.__dict__.pop("_bounds", None)       # and so may its bounds, rounded
        rev.src, rev.dst = self.dst, self.src
        rev.succ_ptr, rev.succ_eid, rev.succ_idx = self.pred_ptr, self.pred_eid, self.pred_idx
        rev.pred_ptr, rev.pred_eid, rev.pred_idx = self.succ_ptr, self.succ_eid, self.succ_idx
        rev.topo = self.topo[::-1]
        return rev

    # -- networkx interop -----------------------------------------------------------
    @classmethod
    def from_networkx(cls, g, *, cost="cost", memory="memory", bytes="bytes"):
        """Build an OpGraph from a networkx ``DiGraph``.

        Node attributes: ``cost`` (seconds on a speed-1 device, or a dict
        ``{device_type: seconds}``; required), ``memory`` (bytes, default 0),
        and optionally ``transient``, ``op_type``, ``colocation``, ``device``
        (pinned device). Edge attribute ``bytes`` (default 0).

        Raises
        ------
        GraphError
            If a node has no cost, or the graph is not a DAG (an op on a cycle is named).

        Examples
        --------
        >>> import networkx as nx
        >>> g = nx.DiGraph()
        >>> g.add_node("x", cost=1.0); g.add_node("y", cost=2.0, memory=4)
        >>> g.add_edge("x", "y", bytes=8)
        >>> OpGraph.from_networkx(g).cost.ravel().tolist()
        [1.0, 2.0]
        """
        if not g.is_directed():
            raise GraphError("the networkx graph must be directed (a DiGraph)")
        names = list(g.nodes)
        costs = []
        for name in names:
            if cost not in g.nodes[name]:
                raise GraphError(f"op {name!r} has no {cost!r} attribute")
            costs.append(g.nodes[name][cost])
        if any(isinstance(c, Mapping) for c in costs):
            types = sorted({t for c in costs if isinstance(c, Mapping) for t in c})
            table = np.full((len(names), len(types)), np.inf)
            for i, c in enumerate(costs):
                for k, t in enumerate(types):
                    table[i, k] = c.get(t, np.inf) if isinstance(c, Mapping) else c
            cost_arr, device_types = table, types
        else:
            cost_arr, device_types = costs, None
        attr = lambda key, default: [g.nodes[v].get(key, default) for v in names]  # noqa: E731
        pinned = {v: g.nodes[v]["device"] for v in names if g.nodes[v].get("device") is not None}
        edges = [(u, v, d.get(bytes, 0.0)) for u, v, d in g.edges(data=True)]
        return cls(names, cost_arr, edges, memory=attr(memory, 0.0),
                   transient=attr("transient", 0.0), device_types=device_types,
                   op_types=attr("op_type", ""), colocation=attr("colocation", None),
                   pinned=pinned)

    def to_networkx(self):
        """The graph as a networkx ``DiGraph`` with the attributes ``from_networkx`` reads."""
        import networkx as nx

        g = nx.DiGraph()
        groups = self.colocation.tolist()
        for i, name in enumerate(self.names):
            if self.device_types == (ANY_TYPE,):
                c = float(self.cost[i, 0])
            else:
                c = {t: float(self.cost[i, k]) for k, t in enumerate(self.device_types)}
            attrs = dict(cost=c, memory=float(self.memory[i]))
            if self.transient[i]:
                attrs["transient"] = float(self.transient[i])
            if self.op_types[i]:
                attrs["op_type"] = self.op_types[i]
            if groups[i] >= 0:
                attrs["colocation"] = groups[i]
            if i in self.pinned:
                attrs["device"] = self.pinned[i]
            g.add_node(name, **attrs)
        for u, v, b in zip(self.src.tolist(), self.dst.tolist(), self.bytes.tolist()):
            g.add_edge(self.names[u], self.names[v], bytes=b)
        return g
