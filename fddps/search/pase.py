"""The exact search for an additive cost: vertex elimination (``algorithm="pase"``).

The optimal-strategy paper (``optimal-strategy-vertex-elimination.md``; PaSE)
minimises ``sum_v t_V(v, c_v) + sum_(u,v) t_E((u, v), c_u, c_v)`` exactly by
eliminating vertices one at a time: eliminating ``v`` keeps, for every
combination of its remaining neighbours' configurations, only the best
configuration of ``v`` (its Algorithm 1; the paper's Algorithm 2, line 7,
should return true). That is min-sum variable elimination on numpy tables:
:func:`eliminate`.

What it runs on:

- the graph (:func:`~fddps.search.pase_vertices.coarsen`): every op of the
  step in one vertex (a layer with its gradients, variables and
  element-wise tail; shape and scalar ops join the vertex they serve), every
  tensor between two vertices an edge;
- the configurations (:func:`~fddps.search.pase_vertices.vertex_configs`):
  the paper's, a split factor for every dimension of the layer's iteration
  domain at once (product at most the device count; reduction dimensions give
  partial sums), plus the whole vertex on each device; parts on devices by a
  fixed rule;
- the cost (:mod:`~fddps.search.pase_tables`): ``t_V`` depends only on the
  vertex's own configuration; what a reader pays to convert its producer's
  layout (transfers, partial-sum reduces, slices, concatenations) is in the
  pair's ``t_E``; the tables' sum at any strategy is that strategy's
  additive cost (:func:`~fddps.search.pase_tables.additive_cost`).

Before any cost is computed, the elimination order is fixed and the size of
every table it will build is known from the graph and the configuration
counts (:func:`plan`): the paper's order (fewest unprocessed neighbours) and a
depth-first order are compared and the one with the smaller tables kept; a
table over ``max_table`` entries is refused at once, naming the vertex.

The additive cost is blind to overlap, so the DP's answer, a few runners-up
(the optimum with one of its most expensive choices forbidden) and the
baselines (data parallelism, FD-DPS's whole-op placement, one device) are
expanded and simulated; the fastest simulated step is returned and ``info``
says which (``returned``), with the DP's additive cost and its simulated step.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import defaultdict

import numpy as np

from ..strategy.strategy import OpConfig
from .base import SearchError, SearchResult, StrategySearch, positive, register_search
from .evaluate import StrategyEvaluator
from .factor_tables import broadcast
from .heap import reuse_freed_arrays
from .pase_tables import build_tables, tables_cost
from .pase_vertices import anchor, coarsen, vertex_configs, vertex_homes
from .space import resolved_dims
from .space import baseline_strategies, writable_strategy

ORDERS = ("best", "paper", "dfs")


def _neighbours(n, edges):
    out = [set() for _ in range(n)]
    for (u, v) in edges:
        if u != v:
            out[u].add(v)
            out[v].add(u)
    return out


def paper_order(n, edges) -> list:
    """The paper's order: repeatedly the vertex with the fewest unprocessed neighbours
    (neighbours gained by elimination included; ties: lowest index)."""
    import heapq

    nb = _neighbours(n, edges)
    done = [False] * n
    heap = [(len(nb[v]), v) for v in range(n)]
    heapq.heapify(heap)
    order = []
    while heap:
        deg, x = heapq.heappop(heap)
        if done[x] or deg != len(nb[x]):
            continue  # stale entry
        done[x] = True
        order.append(x)
        scope = nb[x]
        for v in scope:
            nb[v].discard(x)
            nb[v] |= scope - {v}
            heapq.heappush(heap, (len(nb[v]), v))
    return order


def dfs_order(n, edges) -> list:
    """A depth-first order: the reverse of a depth-first preorder from vertex 0 (the step's
    first), so that the last-discovered vertices (leaves of the search tree, the ends of
    chains) are eliminated first."""
    nb = [sorted(s) for s in _neighbours(n, edges)]
    seen, pre = [False] * n, []
    for root in range(n):
        if seen[root]:
            continue
        stack = [root]
        while stack:
            x = stack.pop()
            if seen[x]:
                continue
            seen[x] = True
            pre.append(x)
            stack.extend(v for v in reversed(nb[x]) if not seen[v])
    return pre[::-1]


def plan(sizes, edges, order):
    """The tables an elimination in ``order`` builds: ``(largest entries, its vertex, its
    scope size, total entries)``, from the configuration counts alone."""
    nb = _neighbours(len(sizes), edges)
    done = [False] * len(sizes)
    worst, who, scope_len, total = 0, None, 0, 0
    for x in order:
        scope = [v for v in nb[x] if not done[v]]
        entries = float(np.prod([float(sizes[v]) for v in scope])) * sizes[x]
        total += entries
        if entries > worst:
            worst, who, scope_len = entries, x, len(scope)
        done[x] = True
        for v in scope:
            nb[v] |= set(scope) - {v}
    return worst, who, scope_len, total


def eliminate(unary, pairwise, max_table=10**7, names=None, order=None, check_only=False):
    """Exact minimum of ``sum_v unary[v][c_v] + sum_(u,v) pairwise[u,v][c_u, c_v]``.

    Parameters
    ----------
    unary : list of 1-d arrays
        Per vertex, its cost per configuration.
    pairwise : dict of (u, v) -> 2-d array
        Per edge (any order, at most one per pair), costs indexed ``[c_u, c_v]``.
    max_table : int
        Largest table (entries) an elimination may build.
    names : list of str, optional
        Vertex names for the error message.
    order : list of int, optional
        The elimination order (default: the paper's, :func:`paper_order`).
    check_only : bool
        Only check the table sizes (returns None).

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
    sizes = [len(u) for u in unary]
    if order is None:
        order = paper_order(n, list(pairwise))
    worst, who, scope_len, _ = plan(sizes, list(pairwise), order)
    if worst > max_table:
        name = names[who] if names else who
        raise SearchError(f"vertex {name!r} would need a table of {int(worst)} entries "
                          f"({scope_len} unprocessed neighbours, {sizes[who]} configurations "
                          f"of its own; max_table={max_table})")
    if check_only:
        return None
    constant, choice, _ = _run(unary, pairwise, sizes, order)
    return constant, choice


def _arg_min(total):
    """``(argmin, min)`` of ``total`` along its last axis, the minimum read at the argmin
    (a gather instead of np.min's second pass over the table: the same values, as a sum
    started from zeros is never -0.0, the one value that ties with another, 0.0)."""
    arg = np.argmin(total, axis=-1)
    return arg, np.take_along_axis(total, np.expand_dims(arg, -1), axis=-1)[..., 0]


def _run(unary, pairwise, sizes, order, base=None, changed=None):
    """The elimination itself: ``(constant, choice, steps)``.

    ``steps`` records each step's ``(scope, argmin, reduced table, changed, the ids of
    the factors it summed, in order)``. Given
    the ``steps`` of a ``base`` run on the same graph and order whose tables differ
    only in vertex ``changed``'s unary, a step none of whose factors derive from that
    vertex's is taken from ``base`` (the same inputs: the same floats), so a runner-up
    re-eliminates only what the banned choice reaches.
    """
    n = len(unary)
    bucket = defaultdict(list)  # vertex -> factor ids mentioning it
    factors = {}
    for v in range(n):
        factors[v] = ((v,), np.asarray(unary[v], dtype=np.float64), v == changed)
        bucket[v].append(v)
    for fid, ((u, v), table) in enumerate(pairwise.items(), start=n):
        factors[fid] = ((u, v), np.asarray(table, dtype=np.float64), False)
        bucket[u].append(fid)
        bucket[v].append(fid)
    next_id = n + len(pairwise)
    trace, steps = [], []
    constant = 0.0
    for t, x in enumerate(order):
        fids = [f for f in dict.fromkeys(bucket.pop(x, ())) if f in factors]
        mine = [factors.pop(f) for f in fids]
        dirty = any(d for _, _, d in mine)
        if base is not None and not dirty:
            scope, arg, reduced = base[t][:3]
        else:
            scope = sorted({v for s, _, _ in mine for v in s} - {x})
            axes = scope + [x]
            total = np.zeros([sizes[v] for v in axes])
            for s, table, _ in mine:
                # (in place: the same sums, without a new table per factor)
                np.add(total, broadcast(table, s, axes, sizes), out=total)
            arg, reduced = _arg_min(total)
        steps.append((scope, arg, reduced, dirty, fids))
        trace.append((x, scope, arg))
        if scope:
            factors[next_id] = (tuple(scope), reduced, dirty)
            for v in scope:
                bucket[v].append(next_id)
            next_id += 1
        else:
            constant += float(reduced)
    choice = [0] * n
    for x, scope, arg in reversed(trace):
        choice[x] = int(arg[tuple(choice[v] for v in scope)]) if scope else int(arg)
    return constant, choice, steps


def _tree(steps, first_reduced):
    """``(produced, consumer, step_of)`` of a run's steps: the factor id each step makes,
    the step that sums each factor, the step that made each reduced factor."""
    produced, consumer, step_of = {}, {}, {}
    next_id = first_reduced
    for t, step in enumerate(steps):
        for f in step[4]:
            consumer[f] = t
        if step[0]:
            produced[t] = next_id
            step_of[next_id] = t
            next_id += 1
    return produced, consumer, step_of


def runner_up(unary, pairwise, sizes, order, steps, v, banned, tree=None, base_choice=None):
    """The choice ``_run(unary with banned[v] for unary[v], ..., base=steps, changed=v)``
    returns, re-eliminating only the steps ``v``'s unary reaches: the step that
    eliminates ``v`` and the steps that sum what each of them produces (a path in the
    elimination tree; ``_run`` walks every step to find them), up to the first whose
    reduced table comes out unchanged (every later step then sums what it summed
    before). The same factors are summed in the same order, so the same floats and
    the same argmins.

    Parameters
    ----------
    steps : list
        ``_run(unary, pairwise, sizes, order)[2]``.
    banned : numpy.ndarray
        ``v``'s new unary.
    tree : tuple, optional
        ``_tree(steps, len(unary) + len(pairwise))``, when the caller keeps it.
    base_choice : list of int, optional
        The choice of the run ``steps`` came from: only the choices the re-eliminated
        steps change, and those below them, are backtracked again.
    """
    n = len(unary)
    edges = list(pairwise.items())
    first_reduced = n + len(edges)
    produced, consumer, step_of = tree or _tree(steps, first_reduced)

    def factor(f):
        if f < n:
            return (f,), np.asarray(unary[f], dtype=np.float64)
        if f < first_reduced:
            (a, b), table = edges[f - n]
            return (a, b), np.asarray(table, dtype=np.float64)
        t = step_of[f]
        return tuple(steps[t][0]), steps[t][2]

    new_table, new_scope, new_arg = {}, {}, {}
    t = consumer.get(v)
    while t is not None:
        x = order[t]
        scope = steps[t][0]
        axes = scope + [x]
        total = np.zeros([sizes[w] for w in axes])
        for f in steps[t][4]:
            if f == v:
                s, table = (v,), np.asarray(banned, dtype=np.float64)
            elif f in new_table:
                s, table = new_scope[f], new_table[f]
            else:
                s, table = factor(f)
            np.add(total, broadcast(table, s, axes, sizes), out=total)
        new_arg[t], reduced = _arg_min(total)
        if not scope:
            break
        f = produced[t]
        if np.array_equal(reduced, steps[t][2]):
            break  # what it passes on is unchanged: so is every later step
        new_scope[f] = tuple(scope)
        new_table[f] = reduced
        t = consumer.get(f)
    if base_choice is None:
        choice = [0] * n
        for t in range(len(order) - 1, -1, -1):
            x, scope = order[t], steps[t][0]
            arg = new_arg.get(t, steps[t][1])
            choice[x] = int(arg[tuple(choice[w] for w in scope)]) if scope else int(arg)
        return choice
    # Backtracking from the base run's choice: a step whose argmin table and scope's
    # choices are the base run's chooses as the base run did.
    choice, moved = list(base_choice), set()
    for t in range(len(order) - 1, -1, -1):
        x, scope = order[t], steps[t][0]
        arg = new_arg.get(t)
        if arg is None:
            if not moved or not moved.intersection(scope):
                continue
            arg = steps[t][1]
        c = int(arg[tuple(choice[w] for w in scope)]) if scope else int(arg)
        if c != choice[x]:
            choice[x] = c
            moved.add(x)
    return choice


@contextlib.contextmanager
def _without_gc():
    """Python's cycle collector paused (as it was before, after): building the tables
    makes many small objects and few cycles, and each full collection walks every
    object the process holds (a TensorFlow graph's, the step's): 7-15% of the build on
    AlexNet and Inception-V3."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@register_search
class PaseSearch(StrategySearch):
    """Vertex elimination on every op of the step (see the module notes).

    Parameters
    ----------
    max_table : int
        The largest DP table allowed (default 10**7 entries), checked before costing.
    writable : bool
        Only configurations the GraphDef rewrite writes.
    progress : bool
        A progress bar while costing.
    time_budget : float, optional
        Seconds the set-up and costing may take; past them a :class:`SearchError`
        says how far it got (``auto`` then goes on without the DP).
    order : str
        ``"best"`` (default: the paper's or the depth-first order, whichever
        builds smaller tables), ``"paper"`` or ``"dfs"``.
    powers_of_two : bool
        Split factors powers of two only (a departure from the paper, which
        allows any factors with product at most the device count).
    retime : int
        Runners-up of the DP simulated beside its answer (0: the answer only).
    runner_up_tries : int or None
        The most bans tried while looking for ``retime`` distinct runners-up (default
        32; None: every vertex with a choice, as before). Each ban re-eliminates the
        path of the elimination tree it reaches, so trying every vertex is quadratic
        on deep graphs: on ResNet-50 and Inception-V3 (4 GPUs) every ban but one or
        two gave back the same strategy (all whole ops moved to another GPU), and
        trying them all took a third of the search. A departure from nothing in the
        paper (which has no runners-up).
    scalar_edges : bool
        Make pairs of vertices joined only by scalars and shape vectors edges too
        (default False: they are left out of the additive cost, a departure:
        :func:`~fddps.search.pase_tables.edges_between`).
    """

    name = "pase"
    options = dict(max_table=10**7, writable=False, progress=False, time_budget=None,
                   order="best", powers_of_two=False, retime=3, scalar_edges=False,
                   runner_up_tries=32)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_table = positive("max_table", self.max_table, integer=True, allow_none=False)
        self.time_budget = positive("time_budget", self.time_budget)
        if self.order not in ORDERS:
            raise SearchError(f"option 'order' must be one of {', '.join(ORDERS)}, "
                              f"got {self.order!r}")
        if not isinstance(self.retime, int) or self.retime < 0:
            raise SearchError(f"option 'retime' must be a non-negative integer, got {self.retime!r}")
        self.runner_up_tries = positive("runner_up_tries", self.runner_up_tries, integer=True)

    def _check_time(self, t0, what):
        if self.time_budget is not None and time.perf_counter() - t0 > self.time_budget:
            raise SearchError(f"pase: out of its time_budget ({self.time_budget:g} s) while "
                              f"costing {what}")

    def space(self, step, cluster, t0=None):
        """``(vertices, configs, order, plan info)``: the graph and configurations, and the
        elimination order, checked against ``max_table`` before any cost."""
        t0 = time.perf_counter() if t0 is None else t0
        devices = list(cluster.names)
        vertices = coarsen(step)
        dims_of = resolved_dims(step)
        homes = vertex_homes(step, devices)
        configs = []
        shared = {}  # vertex_configs' memo: equal configurations made once
        for i, vtx in enumerate(vertices):
            self._check_time(t0, f"the configurations of vertex {i + 1} of {len(vertices)} "
                                 f"({vtx[0]!r}, before any cost)")
            configs.append(vertex_configs(step, vtx, devices, dims_of=dims_of, homes=homes,
                                          writable=self.writable,
                                          powers_of_two=self.powers_of_two, memo=shared))
        from .pase_tables import edges_between

        vertex_of = {n: i for i, vtx in enumerate(vertices) for n in vtx}
        self.edges = edges_between(step, vertex_of, self.scalar_edges)  # (the tables' too)
        edges = list(self.edges)
        sizes = [len(c) for c in configs]
        candidates = {"paper": paper_order(len(vertices), edges),
                      "dfs": dfs_order(len(vertices), edges)}
        plans = {k: plan(sizes, edges, o) for k, o in candidates.items()}
        chosen = self.order if self.order != "best" else min(
            plans, key=lambda k: (plans[k][0], plans[k][3], k != "paper"))
        worst, who, scope_len, total = plans[chosen]
        self.names = [anchor(step, vtx, dims_of) or vtx[0] for vtx in vertices]
        if worst > self.max_table:
            others = ", ".join(f"{k}: {int(p[0])}" for k, p in plans.items())
            raise SearchError(
                f"vertex {self.names[who]!r} ({len(vertices[who])} ops) would need a table of "
                f"{int(worst)} entries "
                f"({scope_len} unprocessed neighbours, {sizes[who]} configurations of its own; "
                f"max_table={self.max_table}; largest table by order: {others})")
        info = dict(order=chosen, largest_table={k: int(p[0]) for k, p in plans.items()},
                    table_entries={k: int(p[3]) for k, p in plans.items()})
        self.dims_of = dims_of  # resolved once: the tables reuse it
        return vertices, configs, candidates[chosen], info

    def costs(self, step, cluster, cost_model):
        """``(vertices, configs, unary, pairwise)`` of the additive cost (module notes)."""
        reuse_freed_arrays()  # (the tables' temporaries: heap.py)
        with _without_gc():
            return self._costs(step, cluster, cost_model)

    def _costs(self, step, cluster, cost_model):
        t0 = time.perf_counter()
        vertices, configs, _, _ = self.space(step, cluster, t0)
        unary, pairwise = build_tables(step, cluster, cost_model, vertices, configs,
                                       check=lambda what: self._check_time(t0, what),
                                       scalar_edges=self.scalar_edges, dims_of=self.dims_of,
                                       edges=self.edges)
        return vertices, configs, unary, pairwise

    def fit(self, step, cluster, cost_model) -> SearchResult:
        reuse_freed_arrays()  # (the tables' temporaries: heap.py)
        with _without_gc():
            return self._fit(step, cluster, cost_model)

    def _fit(self, step, cluster, cost_model) -> SearchResult:
        t0 = time.perf_counter()
        devices = list(cluster.names)
        vertices, configs, order, plan_info = self.space(step, cluster, t0)
        t_space = time.perf_counter() - t0
        unary, pairwise = build_tables(step, cluster, cost_model, vertices, configs,
                                       check=lambda what: self._check_time(t0, what),
                                       scalar_edges=self.scalar_edges, dims_of=self.dims_of,
                                       edges=self.edges)
        t_costs = time.perf_counter() - t0 - t_space
        names = self.names
        t1 = time.perf_counter()
        eliminate(unary, pairwise, self.max_table, names, order, check_only=True)
        sizes = [len(u) for u in unary]
        cost, choice, steps = _run(unary, pairwise, sizes, order)
        t_dp = time.perf_counter() - t1
        # Runners-up: the optimum with one of its costliest split choices forbidden.
        answers = [choice]
        tree = _tree(steps, len(unary) + len(pairwise))
        ranked = sorted(range(len(vertices)), key=lambda v: -unary[v][choice[v]])
        tries = 0
        for v in ranked:
            if len(answers) > self.retime or (self.runner_up_tries is not None
                                              and tries >= self.runner_up_tries):
                break
            if len(configs[v]) < 2:
                continue
            tries += 1
            ban = unary[v].copy()
            ban[choice[v]] = np.inf
            alt = runner_up(unary, pairwise, sizes, order, steps, v, ban, tree, choice)
            if alt not in answers:
                answers.append(alt)
        t_search = time.perf_counter() - t0
        # Re-timing from here: the evaluator only expands and simulates the candidates.
        t2 = time.perf_counter()
        ev = StrategyEvaluator(step, cluster, cost_model)

        def strategy_of(ch, name):
            chosen = {n: OpConfig({}, (devices[0],)) for n in step.ops}
            for cfgs, c in zip(configs, ch):
                chosen.update(cfgs[c][1])
            s = ev.strategy(chosen, name=name)
            return writable_strategy(step, s) if self.writable else s

        timed = {}
        for j, ch in enumerate(answers):
            label = "pase" if j == 0 else f"pase runner-up {j}"
            s = strategy_of(ch, label)
            timed[label] = (ev.full(s), s, tables_cost(unary, pairwise, ch))
        for label, s in baseline_strategies(step, cluster, cost_model,
                                            writable=self.writable).items():
            timed[label] = (ev.full(s), s, None)
        t_retime = time.perf_counter() - t2
        best = min(timed, key=lambda k: (timed[k][0].cost, k != "pase"))
        score, strategy, _ = timed[best]
        strategy.name = best
        shape = defaultdict(int)
        for cfgs, c in zip(configs, choice):
            shape[cfgs[c][0].split("@")[0]] += 1
        info = dict(additive_cost=cost, returned=best,
                    simulated={k: v[0].makespan for k, v in timed.items()},
                    additive={k: v[2] for k, v in timed.items() if v[2] is not None},
                    pase_simulated=timed["pase"][0].makespan,
                    vertices=len(vertices), ops=len(step.ops),
                    edges=len(pairwise), configs_per_vertex=max(len(c) for c in configs),
                    configs_total=sum(len(c) for c in configs),
                    space_seconds=t_space, cost_seconds=t_costs, dp_seconds=t_dp,
                    search_seconds=t_search, retime_seconds=t_retime,
                    runner_up_tries=tries,
                    choices=dict(shape), cost=score.cost, **plan_info)
        return SearchResult(strategy, score.makespan, score.peak, score.fits, self.name,
                            time.perf_counter() - t0, info)


__all__ = ["PaseSearch", "dfs_order", "eliminate", "paper_order", "plan", "runner_up"]
