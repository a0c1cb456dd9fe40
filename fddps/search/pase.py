"""The exact search for an additive cost: vertex elimination (``algorithm="pase"``).

The optimal-strategy paper (``optimal-strategy-vertex-elimination.md``; PaSE)
minimises ``sum_v t_V(v, c_v) + sum_(u,v) t_E((u, v), c_u, c_v)`` exactly by
eliminating vertices in order of fewest unprocessed neighbours: eliminating
``v`` keeps, for every combination of its remaining neighbours'
configurations, only the best configuration of ``v`` (its Algorithm 1; the
paper's Algorithm 2, line 7, should return true). That is min-sum variable
elimination, implemented here on numpy tables: :func:`eliminate`.

The graph it runs on (:func:`coarsen`): each forward op with its gradient ops
(``gradients/<op>_grad/...``) and the variables, slots and update its forward
op reads is one vertex; an element-wise op whose only producer it is the only
reader of is folded into that producer's vertex (Tofu's and the paper's
coarsening); ops that neither compute nor move bytes stay whole on the first
device. Each vertex takes one of a bounded set of configurations
(:func:`vertex_configs`): whole on each device; its ops split by sample over
the first ``p`` devices (data parallelism); or its convolutions and MatMuls
split by parameter and the rest by sample (``p`` a power of two up to the
number of devices). The paper bounds an op's configurations to split factors
whose product is at most the number of devices; here each op of a vertex
splits one dimension, so a vertex has ``k + 2 log2 k`` configurations on
``k`` devices (8 on 4, 14 on 8).

The costs come from the same cost model and expansion the simulator uses
(:class:`~fddps.search.evaluate.StrategyEvaluator`'s fragments): ``t_V`` is the
vertex's tasks' time on its busiest device plus the transfers inside it;
``t_E`` is the transfers between the two vertices' tasks (both directions, the
slowest link's sum). The DP's result is exact for that cost, which is blind to
overlap, so it is expanded and re-timed by the simulator; both are reported.

A vertex whose table would exceed ``max_table`` entries raises
:class:`~fddps.search.base.SearchError` naming the vertex and the size.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import numpy as np
from networkx.utils import UnionFind

from ..strategy.ops import NotDescribed, resolve
from ..strategy.strategy import PARAMETER_DIMS, OpConfig, sample_dim
from .base import SearchError, SearchResult, StrategySearch, positive, register_search
from .evaluate import StrategyEvaluator
from .space import decision_units, unit_splits, worth_deciding, writable_strategy

_GRAD = re.compile(r"^gradients(?:_\d+)?/(.*)_grad/")

#: Op types folded into their producer's vertex (same layout in and out).
ELEMENTWISE = {"Relu", "Relu6", "BiasAdd", "AddV2", "Add", "Mul", "Sub", "FusedBatchNormV3",
               "Identity", "Tanh", "Sigmoid", "Cast", "Neg"}


def coarsen(step) -> list:
    """Vertices of the DP: lists of op names (see the module notes), in step order.

    Groups of ops that neither compute, hold weights, nor are large splittable
    tensors are in no vertex (they stay whole on the first device).
    """
    unit_of = {}
    units = decision_units(step)
    for u in units:
        for n in u:
            unit_of[n] = u
    vertices = UnionFind(units)
    join = vertices.union

    readers = defaultdict(list)
    for name, op in step.ops.items():
        for src, _ in op.inputs:
            readers[src].append(name)
    for name, op in step.ops.items():
        m = _GRAD.match(name)
        if m and m.group(1) in step.ops:  # a gradient op joins its forward op
            join(unit_of[m.group(1)], unit_of[name])
    for name, op in step.ops.items():
        if op.tied and op.group is not None:  # variables join their first forward reader
            for r in readers[name]:
                if not step.ops[r].tied and not _GRAD.match(r):
                    join(unit_of[r], unit_of[name])
                    break
        if op.op_type in ELEMENTWISE and op.inputs and not _GRAD.match(name):
            src = op.inputs[0][0]
            if len(readers[src]) == 1 and worth_deciding(step.ops[src]):
                join(unit_of[src], unit_of[name])
    groups = defaultdict(list)
    for u in units:
        groups[vertices[u]].extend(u)
    position = {n: i for i, n in enumerate(step.ops)}
    out = [sorted(g, key=position.get) for g in groups.values()
           if any(worth_deciding(step.ops[n]) for n in g)]
    return sorted(out, key=lambda g: position[g[0]])


def vertex_configs(step, vertex, devices, writable=False) -> list:
    """The bounded configurations of a vertex: ``(label, {op: OpConfig})`` per choice.

    Whole on each device; for each power of two ``p`` up to ``len(devices)``,
    by sample over ``devices[:p]`` and by parameter (convolutions, MatMuls;
    the rest by sample). In the split choices, tied ops (variables, their
    reads and updates) and ops that cannot split that way stay whole on the
    first device. Choices that split no op of the vertex, and duplicates, are
    left out.
    """
    k = len(devices)
    out = [(f"whole@{d}", {n: OpConfig({}, (d,)) for n in vertex}) for d in devices]
    batch = step.batch_size
    seen = set()
    p = 2
    while p <= k:
        devs = tuple(devices[:p])
        for kind in ("sample", "parameter"):
            cfgs = {}
            for n in vertex:
                op = step.ops[n]
                cfg = OpConfig({}, (devices[0],))
                try:
                    dims = resolve(op)
                except NotDescribed:
                    dims = None
                if dims is not None and not op.tied:
                    d = PARAMETER_DIMS.get(op.op_type) if kind == "parameter" else None
                    if d is None or d not in dims.extent:
                        d = sample_dim(dims, batch)
                    if d is not None and dims.extent[d] >= p and \
                            {d: p} in unit_splits(step, (n,), k, writable=writable):
                        cfg = OpConfig({d: p}, devs)
                cfgs[n] = cfg
            key = tuple((tuple(sorted(c.split.items())), c.devices) for c in cfgs.values())
            if key not in seen and any(c.num_parts > 1 for c in cfgs.values()):
                seen.add(key)
                out.append((f"{kind}x{p}", cfgs))
        p *= 2
    return out


def eliminate(unary, pairwise, max_table=10**7, names=None):
    """Exact minimum of ``sum_v unary[v][c_v] + sum_(u,v) pairwise[u,v][c_u, c_v]``.

    Parameters
    ----------
    unary : list of 1-d arrays
        Per vertex, its cost per configuration.
    pairwise : dict of (u, v) -> 2-d array
        Per edge (u < v or any order, at most one per pair), costs indexed
        ``[c_u, c_v]``.
    max_table : int
        Largest table (entries) an elimination may build.
    names : list of str, optional
        Vertex names for the error message.

    Returns
    -------
    (cost, choice) : float, list of int (a configuration index per vertex)

    Raises
    ------
    SearchError
        Naming the vertex and its table's size when a table would exceed ``max_table``.

    Example
    -------
    >>> cost, choice = eliminate([np.array([0., 5.]), np.array([3., 0.])],
    ...                          {(0, 1): np.array([[0., 9.], [9., 0.]])})
    >>> float(cost), choice
    (3.0, [0, 0])
    """
    n = len(unary)
    factors = [((v,), np.asarray(unary[v], dtype=np.float64)) for v in range(n)]
    for (u, v), table in pairwise.items():
        factors.append(((u, v), np.asarray(table, dtype=np.float64)))
    sizes = [len(u) for u in unary]
    neighbours = [set() for _ in range(n)]
    for (u, v) in pairwise:
        neighbours[u].add(v)
        neighbours[v].add(u)
    left = set(range(n))
    trace = []  # (vertex, scope, argmin table)
    while left:
        x = min(left, key=lambda v: (len(neighbours[v] & left), v))
        mine = [f for f in factors if x in f[0]]
        factors = [f for f in factors if x not in f[0]]
        scope = sorted({v for s, _ in mine for v in s} - {x})
        entries = int(np.prod([sizes[v] for v in scope], dtype=np.int64)) * sizes[x]
        if entries > max_table:
            who = names[x] if names else x
            raise SearchError(f"vertex {who!r} would need a table of {entries} entries "
                              f"({len(scope)} unprocessed neighbours, {sizes[x]} configurations "
                              f"each side; max_table={max_table})")
        axes = scope + [x]
        total = np.zeros([sizes[v] for v in axes])
        for s, table in mine:
            perm = sorted(range(len(s)), key=lambda i: axes.index(s[i]))
            t = np.transpose(table, perm)
            shape = [1] * len(axes)
            for i in perm:
                shape[axes.index(s[i])] = sizes[s[i]]
            total = total + t.reshape(shape)
        trace.append((x, scope, np.argmin(total, axis=-1)))
        factors.append((tuple(scope), np.min(total, axis=-1)))
        for v in scope:
            neighbours[v] |= set(scope) - {v}
        left.discard(x)
    cost = float(sum(t.sum() if t.ndim == 0 else float(t) for s, t in factors if not s))
    choice = [0] * n
    for x, scope, arg in reversed(trace):
        choice[x] = int(arg[tuple(choice[v] for v in scope)]) if scope else int(arg)
    return cost, choice


@register_search
class PaseSearch(StrategySearch):
    """Vertex elimination on the coarsened step (see the module notes).

    Parameters
    ----------
    max_table : int
        The largest DP table allowed (default 10**7 entries).
    writable : bool
        Only configurations the GraphDef rewrite writes.
    progress : bool
        A progress bar over the vertices while costing them.
    time_budget : float, optional
        Seconds the costing may take; past them a :class:`SearchError` says
        how far it got (``auto`` then goes on without the DP).
    """

    name = "pase"
    options = dict(max_table=10**7, writable=False, progress=False, time_budget=None)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_table = positive("max_table", self.max_table, integer=True, allow_none=False)
        self.time_budget = positive("time_budget", self.time_budget)

    def _check_time(self, t0, what):
        if self.time_budget is not None and time.perf_counter() - t0 > self.time_budget:
            raise SearchError(f"pase: out of its time_budget ({self.time_budget:g} s) while "
                              f"costing {what}")

    def costs(self, step, cluster, cost_model):
        """``(vertices, configs, unary, pairwise)`` of the additive cost (module notes)."""
        from tqdm.auto import tqdm

        t0 = time.perf_counter()  # the budget counts the set-up too: seconds on a big step
        devices = list(cluster.names)
        ev = StrategyEvaluator(step, cluster, cost_model)
        vertices = coarsen(step)
        vertex_of = {n: i for i, vtx in enumerate(vertices) for n in vtx}
        configs = []
        for i, vtx in enumerate(vertices):
            configs.append(vertex_configs(step, vtx, devices, self.writable))
            self._check_time(t0, f"the configurations of vertex {i + 1} of {len(vertices)} "
                                 f"({vtx[0]!r}, before any cost)")
        base = {n: OpConfig({}, (devices[0],)) for n in step.ops}
        lat, inv_bw = cluster.latency, cluster.inv_bandwidth
        dev_index = cluster.index
        column = {d.name: ev.types.index(d.type) for d in cluster.devices}  # cost column

        def seconds_by_link(edges):
            load = defaultdict(float)
            for (a, b), nbytes in edges:
                if a != b:
                    i, j = dev_index[a], dev_index[b]
                    load[i, j] += lat[i, j] + nbytes * inv_bw[i, j]
            return max(load.values(), default=0.0)

        def owner(task, cfg_map):
            """(op, device) of a task of the expansion (a part, its statistics, or a whole op)."""
            if "/fddps_part_" in task:
                op, rest = task.split("/fddps_part_")
                return op, cfg_map[op].devices[int(rest.split("/")[0])]
            return task, cfg_map[task].devices[0]

        def records(names, cfg_map, costed=True):
            """Busy seconds per device of ``names``' tasks; edges ((op, dev), (op, dev), bytes)."""
            frags = ev._build(names, cfg_map, costed)
            busy, edges = defaultdict(float), []
            for n in names:
                for r in frags[n]:
                    if r[0] in ("T", "C"):  # a task, or a slice or concatenation it pays for
                        if costed:
                            busy[r[2]] += float(r[3][0][column[r[2]]])
                    elif r[0] == "E":
                        edges.append((owner(r[1], cfg_map), owner(r[2], cfg_map), r[3]))
                    elif r[0] == "R":  # a reduce request: it runs on the reader's device, inputs arrive there
                        _, key, consumer, overlapping, costs = r
                        if costed:
                            busy[key[3]] += float(costs[0][column[key[3]]])
                        dst = owner(consumer, cfg_map)
                        edges.extend((owner(src, cfg_map), dst, b) for src, _, b in overlapping)
            return busy, edges

        def between(edges, ends):
            return seconds_by_link([((a[1], b[1]), nbytes) for a, b, nbytes in edges
                                    if {vertex_of.get(a[0]), vertex_of.get(b[0])} == ends])

        unary = []
        bar = tqdm(total=len(vertices), desc="pase costs", disable=not self.progress)
        for i, vtx in enumerate(vertices):
            row = []
            for _, cfgs in configs[i]:
                cfg_map = dict(base)
                cfg_map.update(cfgs)
                busy, edges = records(vtx, cfg_map)
                row.append(max(busy.values(), default=0.0) + between(edges, {i}))
            unary.append(np.array(row))
            bar.update(1)
            self._check_time(t0, f"vertex {i + 1} of {len(vertices)} ({vtx[0]!r})")
        bar.close()
        # Edges between vertices: the readers' fragments under both configurations.
        readers = defaultdict(set)
        for n, op in step.ops.items():
            v = vertex_of.get(n)
            for src in [p for p, _ in op.inputs] + list(op.control_inputs):
                u = vertex_of.get(src)
                if v is not None and u is not None and u != v:
                    readers[tuple(sorted((u, v)))].add(n)
        position = {n: i for i, n in enumerate(step.ops)}
        pairwise = {}
        for e, ((u, v), reading) in enumerate(readers.items()):
            self._check_time(t0, f"edge {e + 1} of {len(readers)} between vertices")
            table = np.zeros((len(configs[u]), len(configs[v])))
            reading = sorted(reading, key=position.get)
            for a, (_, cu) in enumerate(configs[u]):
                for b, (_, cv) in enumerate(configs[v]):
                    cfg_map = dict(base)
                    cfg_map.update(cu)
                    cfg_map.update(cv)
                    table[a, b] = between(records(reading, cfg_map, costed=False)[1], {u, v})
            pairwise[u, v] = table
        return vertices, configs, unary, pairwise

    def fit(self, step, cluster, cost_model) -> SearchResult:
        t0 = time.perf_counter()
        devices = list(cluster.names)
        vertices, configs, unary, pairwise = self.costs(step, cluster, cost_model)
        t_costs = time.perf_counter() - t0
        names = [vtx[0] for vtx in vertices]
        cost, choice = eliminate(unary, pairwise, self.max_table, names)
        chosen = {n: OpConfig({}, (devices[0],)) for n in step.ops}
        for vtx, cfgs, c in zip(vertices, configs, choice):
            chosen.update(cfgs[c][1])
        ev = StrategyEvaluator(step, cluster, cost_model)
        strategy = ev.strategy(chosen, name="pase")
        if self.writable:
            strategy = writable_strategy(step, strategy)
        score = ev.full(strategy)
        shape = defaultdict(int)
        for cfgs, c in zip(configs, choice):
            shape[cfgs[c][0].split("@")[0]] += 1
        info = dict(additive_cost=cost, vertices=len(vertices),
                    configs_per_vertex=max(len(c) for c in configs),
                    cost_seconds=t_costs, choices=dict(shape), cost=score.cost)
        return SearchResult(strategy, score.makespan, score.peak, score.fits, self.name,
                            time.perf_counter() - t0, info)
