"""One level of Tofu's search as a min-sum problem over coarse groups, and its solvers.

A level (:class:`LevelProblem`) has DP nodes ``t = 0 .. n-1`` (Tofu's coarse
groups, in forward order), each with ``size[t]`` joint choices (its members'
partition choices, enumerated by brute force inside the group as in Tofu's
Section 5.1), a cost per joint choice (``unary[t]``: the group's internal
edges and its edges to ops outside the search) and a cost matrix per pair of
groups an edge joins (``pairs[(a, b)]``, ``a < b``, shape ``size[a] x
size[b]``: the bytes the edges between them move per pair of choices). A
solution is one choice per node; its cost is the sum of the unary costs and
of the pair costs it selects.

Solvers:

- :func:`eliminate` -- exact. Dynamic programming by eliminating groups one
  at a time, always the one whose neighbours have the fewest joint choices
  (for a tie, the one with the fewest neighbours): a group is replaced by a
  cost table over its neighbours, the least cost of its choices given theirs.
  On a chain (Tofu's linear graph) every group has at most two neighbours
  when eliminated from an end, so this is the chain DP of Tofu's Section 5.1
  (Jia et al., ICML 2018); a fork-join block (residual block, the groups of
  an LSTM layer coalesced over time steps, which form a cycle) reduces by
  series eliminations (two neighbours: their table becomes a pair cost) and
  parallel merges (pair costs of one pair add), so it never builds a table
  over more than two groups either. Any graph is solved exactly; a group
  with ``m`` neighbours costs a table of the product of their choices, and
  when the cheapest next elimination would exceed ``max_table`` entries the
  solver gives up (:class:`TooWide`) rather than prune.
- :func:`frontier_beam` -- the earlier solver: groups in forward order, a
  state per joint choice of the groups on the frontier, the ``beam``
  cheapest kept (exact only when no state was dropped). An option beyond
  what Tofu's paper proves (``Tofu(beam=...)``).
- :func:`brute_force` -- every joint choice; for tests on small graphs.

Example
-------
>>> import numpy as np
>>> p = LevelProblem([2, 2, 2], [np.zeros(2)] * 3,
...                  {(0, 1): np.array([[0., 5.], [5., 0.]]),
...                   (1, 2): np.array([[0., 1.], [1., 0.]]),
...                   (0, 2): np.array([[3., 0.], [0., 3.]])})
>>> cost, choice = eliminate(p)
>>> cost, cost == brute_force(p)[0], p.cost(choice) == cost
(1.0, True, True)
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from .factor_tables import broadcast


class TooWide(Exception):
    """The exact elimination would build a table over ``max_table`` entries."""


@dataclass
class LevelProblem:
    """A min-sum problem over DP nodes (see the module notes).

    Attributes
    ----------
    size : list of int
        Joint choices per node.
    unary : list of numpy.ndarray
        Cost per joint choice of each node.
    pairs : dict
        ``(a, b)`` with ``a < b`` -> ``size[a] x size[b]`` cost matrix.
    """

    size: list
    unary: list
    pairs: dict = field(default_factory=dict)

    def __post_init__(self):
        self.size = [int(s) for s in self.size]
        if len(self.unary) != len(self.size):
            raise ValueError(f"{len(self.unary)} unary cost vectors for {len(self.size)} nodes")
        for t, (s, u) in enumerate(zip(self.size, self.unary)):
            if s < 1 or np.shape(u) != (s,):
                raise ValueError(f"node {t}: unary costs of shape {np.shape(u)} for {s} choices")
        for (a, b), m in self.pairs.items():
            if not a < b or np.shape(m) != (self.size[a], self.size[b]):
                raise ValueError(f"pair {(a, b)}: matrix of shape {np.shape(m)}, expected "
                                 f"{(self.size[a], self.size[b])} with a < b")

    def add_pair(self, a, b, matrix):
        """Add ``matrix`` (rows: ``a``'s choices) to the cost of the pair ``a, b``."""
        if a == b:
            raise ValueError(f"a pair needs two nodes, got {a} twice")
        if a > b:
            a, b, matrix = b, a, matrix.T
        if (a, b) in self.pairs:
            self.pairs[a, b] = self.pairs[a, b] + matrix
        else:
            self.pairs[a, b] = np.array(matrix, dtype=np.float64)

    def cost(self, choice) -> float:
        """The cost of one choice per node."""
        total = sum(float(u[c]) for u, c in zip(self.unary, choice))
        return total + sum(float(m[choice[a], choice[b]]) for (a, b), m in self.pairs.items())


def eliminate(problem: LevelProblem, max_table: int = 1 << 22):
    """The least cost and a choice per node reaching it, exactly (module notes).

    Parameters
    ----------
    problem : LevelProblem
    max_table : int
        Largest table (entries, the eliminated node's choices included) one
        elimination may build.

    Returns
    -------
    (float, list of int)

    Raises
    ------
    TooWide
        When every node left would need a table over ``max_table`` entries.
    """
    n = len(problem.size)
    size = problem.size
    factors = {}  # id -> (scope tuple, array with one axis per scope node)
    touching = [set() for _ in range(n)]
    neighbours = [set() for _ in range(n)]
    for t in range(n):
        factors[len(factors)] = ((t,), np.asarray(problem.unary[t], dtype=np.float64))
        touching[t].add(len(factors) - 1)
    for (a, b), m in problem.pairs.items():
        fid = len(factors)
        factors[fid] = ((a, b), np.asarray(m, dtype=np.float64))
        touching[a].add(fid)
        touching[b].add(fid)
        neighbours[a].add(b)
        neighbours[b].add(a)
    next_id = len(factors)

    def price(t):
        table = size[t]
        for u in neighbours[t]:
            table *= size[u]
        return (table, len(neighbours[t]), t)

    heap = [price(t) for t in range(n)]
    heapq.heapify(heap)
    done = [False] * n
    order = []  # (node, scope of its table, argmin table)
    constant = 0.0
    while heap:
        key = heapq.heappop(heap)
        t = key[2]
        if done[t]:
            continue
        now = price(t)
        if now != key:  # stale: its neighbourhood changed since it was pushed
            heapq.heappush(heap, now)
            continue
        if now[0] > max_table:
            raise TooWide(f"the next elimination (group {t}, {len(neighbours[t])} neighbours) "
                          f"needs a table of {now[0]} entries, over max_table={max_table}")
        scope = tuple(sorted(neighbours[t]))
        axes = scope + (t,)
        shape = [size[u] for u in axes]
        total = np.zeros(shape)
        for fid in touching[t]:
            fscope, arr = factors.pop(fid)
            total = total + broadcast(arr, fscope, axes, size)
            for u in fscope:
                if u != t:
                    touching[u].discard(fid)
        arg = np.argmin(total, axis=-1)
        best = np.take_along_axis(total, arg[..., None], axis=-1)[..., 0]
        order.append((t, scope, arg))
        done[t] = True
        for u in scope:
            neighbours[u].discard(t)
            neighbours[u].update(v for v in scope if v != u)
        if scope:
            factors[next_id] = (scope, best)
            for u in scope:
                touching[u].add(next_id)
            next_id += 1
            for u in scope:
                heapq.heappush(heap, price(u))
        else:
            constant += float(best)
    choice = [0] * n
    for t, scope, arg in reversed(order):
        choice[t] = int(arg[tuple(choice[u] for u in scope)]) if scope else int(arg)
    return constant, choice


def frontier_beam(problem: LevelProblem, beam: int):
    """Groups in index order; per step the ``beam`` cheapest frontier states.

    Returns
    -------
    (float, list of int, bool)
        Least cost found, the choice reaching it, and whether no state was
        dropped (then the cost is the least).
    """
    n = len(problem.size)
    later = [[] for _ in range(n)]  # per node: (earlier node, matrix rows=earlier)
    last_use = list(range(n))
    for (a, b), m in problem.pairs.items():
        later[b].append((a, m))
        last_use[a] = max(last_use[a], b)
    frontier = []
    state = np.zeros((1, 0), dtype=np.int64)
    cost = np.zeros(1)
    history, exact = [], True
    for t in range(n):
        total = cost[:, None] + np.asarray(problem.unary[t])[None, :]
        column = {f: j for j, f in enumerate(frontier)}
        for e, m in later[t]:
            total = total + m[state[:, column[e]], :]
        n_states, n_combos = total.shape
        par = np.repeat(np.arange(n_states), n_combos)
        com = np.tile(np.arange(n_combos), n_states)
        tot = total.ravel()
        new_frontier = [f for f in frontier if last_use[f] > t] + ([t] if last_use[t] > t else [])
        # A candidate's new state: its parent's state on the nodes that stay, and
        # its own choice if it stays; keep the cheapest per state.
        proj = np.ascontiguousarray(state[:, [column[f] for f in new_frontier if f != t]])
        ids = {}
        pid = np.fromiter((ids.setdefault(row.tobytes(), len(ids)) for row in proj),
                          dtype=np.int64, count=n_states)
        stays = t in new_frontier
        code = pid[par] * n_combos + com if stays else pid[par]
        order = np.lexsort((tot, code))
        first = np.ones(order.size, dtype=bool)
        first[1:] = code[order][1:] != code[order][:-1]
        sel = order[first]
        if sel.size > beam:
            exact = False
            sel = sel[np.argsort(tot[sel], kind="stable")[:beam]]
        history.append((par[sel], com[sel]))
        state = np.column_stack([proj[par[sel]]] + ([com[sel]] if stays else []))
        cost, frontier = tot[sel], new_frontier
    best = int(np.argmin(cost))
    total_cost = float(cost[best])
    choice = [0] * n
    for t in range(n - 1, -1, -1):
        parents, coms = history[t]
        choice[t] = int(coms[best])
        best = int(parents[best])
    return total_cost, choice, exact


def brute_force(problem: LevelProblem, limit: int = 1 << 20):
    """Every joint choice (at most ``limit``): the least cost and its choice."""
    count = int(np.prod(problem.size, dtype=np.float64))
    if count > limit:
        raise ValueError(f"{count} joint choices, over the limit of {limit}")
    best, arg = np.inf, None
    for choice in itertools.product(*[range(s) for s in problem.size]):
        c = problem.cost(choice)
        if c < best:
            best, arg = c, list(choice)
    return best, arg


__all__ = ["LevelProblem", "TooWide", "brute_force", "eliminate", "frontier_beam"]
