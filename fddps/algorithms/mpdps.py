"""MP-DPS: computing-power-aware op merging, then path-prediction list scheduling.

Source: Y. Zeng, Y. Ding, D. Ou, J. Zhang, Y. Ren, Y. Zhang, "MP-DPS: adaptive
distributed training for deep learning based on node merging and path
prediction", CCF Transactions on High Performance Computing, 2022,
doi:10.1007/s42514-022-00098-9 (reference [21] of the FD-DPS paper).

Only the abstract and the FD-DPS paper's summary of it were available to us.
They say: (1) a cost model of computation, communication and memory (here: the
graph's cost table and the cluster's links, as for every fddps algorithm);
(2) "a node merging method with heterogeneous computing power awareness to
reduce the search space"; (3) "a graph search algorithm based on path
prediction ... which is based on predicting the optimal placement of critical
operator node on the path", ordering by predicted path cost. Everything below
that is more specific than that is our reading, chosen from the published
algorithms those phrases name, and is stated so it can be checked.

Merging (``merge_ops``). Ops are merged into *units* that are always placed
whole (every member on one device):

- Chains: an op whose only parent has it as its only child joins the parent's
  unit (contracting such edges never creates a cycle).
- Small units: a unit whose mean execution time is smaller than the mean
  transfer time of its heaviest edge (moving it away from a neighbour costs
  more than it can ever compute -- the classic grain-size argument) joins its
  only predecessor unit or its only successor unit (the one it exchanges more
  bytes with when it has both); joining the only neighbour on one side cannot
  create a cycle either. Ties go to the predecessor.
- Computing-power awareness: a unit may grow only up to ``T* / granularity``
  seconds of mean work, where ``T* = 1 / sum_k (1 / W_k)`` is the step time if
  the whole graph were spread perfectly over the devices in proportion to their
  speed (``W_k``: the whole graph's time on device ``k``), and, when devices
  have finite memory, only up to ``smallest capacity / granularity`` bytes. So
  units stay small enough for the slowest device to take its share without
  becoming the bottleneck, whatever the mix of devices.
- Only ops with the same constraints merge (same colocation group or none, same
  devices allowed), so a unit's constraints are its members'.

Path prediction: the Optimistic Cost Table of PEFT (H. Arabnejad, J. G.
Barbosa, "List scheduling algorithm for heterogeneous systems by an optimistic
cost table", IEEE TPDS 25(3), 2014), computed on the unit graph:
``OCT(u, k) = max over successor units v of min over devices w of
(OCT(v, w) + ET(v, w) + c(u, v) [w != k])``, 0 for exit units -- the predicted
length of the rest of the critical path if ``u`` runs on ``k`` and every later
unit on its best device. ``ET(v, w)`` is the sum of the members' times on
``w``; ``c(u, v)`` the largest mean transfer time of an edge from ``u`` to ``v``
(transfers of different tensors overlap in fddps's link model).

Scheduling: ready units (every predecessor unit placed) in decreasing
``rank_oct(u)`` = mean of ``OCT(u, k)`` over the devices ``u`` may use (ties:
topological position); each goes to the device minimising the predicted
finish of the whole path, ``EFT(u, k) + OCT(u, k)`` (ties: earlier EFT, lower
device index), among devices that can hold the unit's memory. On a device the
members go in topological order, each at its earliest start after its inputs
arrive, into an idle gap between placed ops if one fits (HEFT's insertion, as
PEFT does); ``EFT(u, k)`` is the last member's finish. If no device can hold
a whole unit, its members are placed one by one by the same rule.

The result is an ordinary per-op :class:`~fddps.schedule.Schedule`, replayed
from MP-DPS's placement and per-device order.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import GraphError
from .base import PlacementState, Scheduler, register
from .heft import topological_position


def merge_ops(state: PlacementState, granularity: float = 16.0, chains: bool = True,
              small: bool = True) -> np.ndarray:
    """Unit id of every op after MP-DPS's computing-power-aware merging.

    Parameters
    ----------
    state : PlacementState
        Fresh state of the graph on the cluster (costs, constraints, memory).
    granularity : float
        Units are capped at ``1 / granularity`` of the balanced step time
        ``T*`` (and of the smallest device memory): larger means smaller units.
    chains, small : bool
        Apply the chain rule and the small-unit rule (see the module docstring).

    Returns
    -------
    array of int, shape (n,)
        Unit ids ``0 .. U-1``, numbered in topological order of the units.
    """
    g = state.graph
    n, m = state.n, state.m
    if not granularity > 0:
        raise ValueError(f"granularity must be > 0, got {granularity!r}")
    work = state.mean_exec_time()
    finite = np.where(np.isfinite(state.et), state.et, 0.0)
    per_device = finite.sum(axis=0)
    balanced = 1.0 / np.sum(1.0 / per_device) if n and np.all(per_device > 0) else 0.0
    work_cap = balanced / granularity
    mem_cap = float(np.min(state.cluster.memory)) / granularity
    need = state.need
    work_l = work.tolist()

    # Ops may share a unit only if they share constraints.
    keys: dict = {}
    key = [keys.setdefault((state.group[i], tuple(state.allowed[i]) if len(state.allowed[i]) < m
                            else None), len(keys)) for i in range(n)]

    parent = list(range(n))  # union-find over ops; a root stands for its unit
    unit_work = list(work_l)
    unit_need = list(need)

    def find(i):
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:
            parent[i], i = root, parent[i]
        return root

    def fits(a, b):
        return unit_work[a] + unit_work[b] <= work_cap and unit_need[a] + unit_need[b] <= mem_cap

    def union(into, other):
        parent[other] = into
        unit_work[into] += unit_work[other]
        unit_need[into] += unit_need[other]

    pred_ptr, pred_idx = g.pred_ptr.tolist(), g.pred_idx.tolist()
    succ_ptr = g.succ_ptr.tolist()
    if chains:
        for v in g.topo.tolist():
            if pred_ptr[v + 1] - pred_ptr[v] == 1:
                u = pred_idx[pred_ptr[v]]
                if succ_ptr[u + 1] - succ_ptr[u] == 1 and key[u] == key[v]:
                    ru = find(u)
                    if fits(ru, v):
                        union(ru, v)

    if small and m > 1:
        comm = state.mean_edge_comm()
        root = np.fromiter((find(i) for i in range(n)), dtype=np.int64, count=n)
        su, sv = root[g.src], root[g.dst]
        cross = su != sv
        preds: dict[int, dict[int, float]] = {}
        succs: dict[int, dict[int, float]] = {}
        for a, b, c in zip(su[cross].tolist(), sv[cross].tolist(), comm[cross].tolist()):
            d = succs.setdefault(a, {})
            if c > d.get(b, -1.0):
                d[b] = c
                preds.setdefault(b, {})[a] = c
        heads = sorted(set(root.tolist()), key=topological_position(g).__getitem__)
        empty: dict = {}
        for u in heads:
            if find(u) != u:
                continue
            pu, su_ = preds.get(u, empty), succs.get(u, empty)
            heaviest = max(max(pu.values(), default=0.0), max(su_.values(), default=0.0))
            if not (unit_work[u] < heaviest or unit_work[u] == 0.0):
                continue
            options = []
            if len(pu) == 1:
                (a, c), = pu.items()
                options.append((c, 1, a))
            if len(su_) == 1:
                (b, c), = su_.items()
                options.append((c, 0, b))
            for _, _, target in sorted(options, reverse=True):
                if key[target] == key[u] and fits(target, u):
                    _absorb(target, u, preds, succs)
                    union(target, u)
                    break

    root = np.fromiter((find(i) for i in range(n)), dtype=np.int64, count=n)
    # Number units in topological order of the unit graph.
    _, unit = np.unique(root, return_inverse=True)
    return _renumber_topologically(g, unit.astype(np.int64))


def _absorb(into, other, preds, succs):
    """Merge unit ``other``'s edges into ``into``'s in the unit adjacency maps."""
    empty: dict = {}
    for side, opposite in ((preds, succs), (succs, preds)):
        mine = side.setdefault(into, {})
        for x, c in side.pop(other, empty).items():
            back = opposite[x]
            back.pop(other, None)  # already gone if x is ``into`` seen from the other side
            if x == into:
                continue
            if c > mine.get(x, -1.0):
                mine[x] = c
                back[into] = c
        mine.pop(other, None)


def _renumber_topologically(g, unit):
    """Relabel ``unit`` so that every unit edge goes from a lower to a higher id.

    Raises
    ------
    GraphError
        If the unit graph has a cycle (a merging bug, never the user's graph).
    """
    n_units = int(unit.max()) + 1 if unit.size else 0
    us, ud = unit[g.src], unit[g.dst]
    keep = us != ud
    pairs = np.unique(np.stack([us[keep], ud[keep]], axis=1), axis=0) if keep.any() \
        else np.zeros((0, 2), dtype=np.int64)
    indeg = np.bincount(pairs[:, 1], minlength=n_units).tolist()
    order = np.argsort(pairs[:, 0], kind="stable")
    ptr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n_units), out=ptr[1:])
    ptr, nxt = ptr.tolist(), pairs[order, 1].tolist()
    # Kahn's algorithm, taking units in order of their first op's topological position.
    first = np.full(n_units, np.iinfo(np.int64).max)
    np.minimum.at(first, unit, topological_position(g))
    heap = [(int(first[u]), u) for u in range(n_units) if indeg[u] == 0]
    heapq.heapify(heap)
    first = first.tolist()
    new_id = [-1] * n_units
    count = 0
    while heap:
        _, u = heapq.heappop(heap)
        new_id[u] = count
        count += 1
        for v in nxt[ptr[u]:ptr[u + 1]]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (first[v], v))
    if count < n_units:  # pragma: no cover - the merge rules cannot create cycles
        raise GraphError("MP-DPS op merging produced a cyclic unit graph")
    return np.asarray(new_id, dtype=np.int64)[unit]


def optimistic_cost_table(unit_et, src, dst, comm) -> np.ndarray:
    """PEFT's Optimistic Cost Table on a DAG of units numbered topologically.

    Parameters
    ----------
    unit_et : array (U, m)
        Execution time of each unit on each device (``inf``: not allowed).
    src, dst, comm : arrays (E,)
        Unit edges (``src < dst``) and their transfer time between distinct devices.

    Returns
    -------
    array (U, m)
        ``OCT[u, k]``: the optimistic time from ``u``'s finish on ``k`` to the end.
    """
    n_units, m = unit_et.shape
    oct_ = np.zeros((n_units, m))
    if src.size == 0:
        return oct_
    # Height: longest hop count to an exit; an edge's successor is always lower.
    order = np.argsort(src, kind="stable")
    ptr = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_units), out=ptr[1:])
    ptr_l, nxt = ptr.tolist(), dst[order].tolist()
    height = [0] * n_units
    for u in range(n_units - 1, -1, -1):
        h = 0
        for v in nxt[ptr_l[u]:ptr_l[u + 1]]:
            if height[v] + 1 > h:
                h = height[v] + 1
        height[u] = h
    height = np.asarray(height)
    edge_height = height[src]
    by_height = np.argsort(edge_height, kind="stable")
    bounds = np.searchsorted(edge_height[by_height], np.arange(1, height.max() + 2))
    for h in range(1, height.max() + 1):
        sel = by_height[bounds[h - 1]:bounds[h]]
        if sel.size == 0:
            continue
        v = dst[sel]
        path = oct_[v] + unit_et[v]
        best = np.minimum(path, path.min(axis=1, keepdims=True) + comm[sel, None])
        np.maximum.at(oct_, src[sel], best)
    return oct_


@register
class MPDPS(Scheduler):
    """MP-DPS: merged units placed by predicted path cost (see the module docstring).

    Parameters
    ----------
    granularity : float
        Cap on a unit's size as a fraction ``1 / granularity`` of the balanced
        step time (and of the smallest device memory). Default 16.
    merge : bool
        Merge ops into units (default True); False schedules single ops.
    insertion : bool
        Let single-op units use idle gaps between placed ops (default True).
    """

    name = "mpdps"

    def __init__(self, granularity=16.0, merge=True, insertion=True):
        self.granularity = granularity
        self.merge = merge
        self.insertion = insertion

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        n, m = state.n, state.m
        if self.merge:
            unit = merge_ops(state, self.granularity)
        else:
            unit = np.empty(n, dtype=np.int64)
            unit[graph.topo] = np.arange(n)
        n_units = int(unit.max()) + 1 if n else 0

        # Members of each unit in topological order.
        by_unit = np.lexsort((topological_position(graph), unit))
        bounds = np.searchsorted(unit[by_unit], np.arange(n_units + 1)).tolist()
        by_unit = by_unit.tolist()
        members = [by_unit[bounds[u]:bounds[u + 1]] for u in range(n_units)]

        # Unit costs: disallowed devices (pins, kernels) are inf.
        et = state.et.copy()
        for i, devs in enumerate(state.allowed):
            if len(devs) < m:
                mask = np.ones(m, dtype=bool)
                mask[devs] = False
                et[i, mask] = np.inf
        unit_et = np.zeros((n_units, m))
        np.add.at(unit_et, unit, et)
        us, ud = unit[graph.src], unit[graph.dst]
        keep = us != ud
        comm = state.mean_edge_comm()[keep]
        us, ud = us[keep], ud[keep]
        if us.size:
            pair = us * n_units + ud
            uniq, inv = np.unique(pair, return_inverse=True)
            pair_comm = np.zeros(uniq.size)
            np.maximum.at(pair_comm, inv, comm)
            us, ud, comm = uniq // n_units, uniq % n_units, pair_comm
        oct_ = optimistic_cost_table(unit_et, us, ud, comm)
        allowed = np.isfinite(unit_et)
        rank_oct = np.where(allowed, oct_, 0.0).sum(axis=1) / np.maximum(allowed.sum(axis=1), 1)

        unit_pred_count = np.bincount(ud, minlength=n_units).tolist()
        order = np.argsort(us, kind="stable")
        ptr = np.zeros(n_units + 1, dtype=np.int64)
        np.cumsum(np.bincount(us, minlength=n_units), out=ptr[1:])
        ptr, nxt = ptr.tolist(), ud[order].tolist()

        oct_rows = oct_.tolist()
        rank_l = rank_oct.tolist()
        ready = [(-rank_l[u], u) for u in range(n_units) if unit_pred_count[u] == 0]
        heapq.heapify(ready)
        dissolved = 0
        while ready:
            _, u = heapq.heappop(ready)
            if not self._place_unit(state, members[u], oct_rows[u]):
                dissolved += 1
                for i in members[u]:
                    k, s = self._best_device_op(state, i, oct_rows[u])
                    state.place(i, k, s)
            for v in nxt[ptr[u]:ptr[u + 1]]:
                unit_pred_count[v] -= 1
                if unit_pred_count[v] == 0:
                    heapq.heappush(ready, (-rank_l[v], v))
        info = {"units": n_units, "dissolved_units": dissolved,
                "planned_makespan": max(state.finish, default=0.0)}
        return state.to_schedule(self.name, info)

    def _best_device_op(self, state, i, oct_row):
        """Device and start minimising ``EFT + OCT`` for a single op (insertion allowed)."""
        row = state.duration_row(i)
        best = None
        for k in state.candidates(i):
            s = state.timelines[k].earliest_start(state.ready_time(i, k), row[k], self.insertion)
            f = s + row[k]
            key = (f + oct_row[k], f)
            if best is None or key < best[0]:
                best = (key, k, s)
        return best[1], best[2]

    def _place_unit(self, state, ops, oct_row):
        """Place a whole unit on its best device; False if no device can hold it."""
        devs = self._unit_devices(state, ops)
        if not devs:
            return False
        best = None
        if len(ops) == 1:
            i = ops[0]
            row = state.duration_row(i)
            for k in devs:
                s = state.timelines[k].earliest_start(state.ready_time(i, k), row[k], self.insertion)
                f = s + row[k]
                key = (f + oct_row[k], f)
                if best is None or key < best[0]:
                    best = (key, k, [s])
        else:
            for k in devs:
                starts, f = self._trial(state, ops, k)
                key = (f + oct_row[k], f)
                if best is None or key < best[0]:
                    best = (key, k, starts)
        _, k, starts = best
        for i, s in zip(ops, starts):
            state.place(i, k, s)
        return True

    @staticmethod
    def _unit_devices(state, ops):
        """Devices that may take every member of ``ops`` and hold their memory now."""
        first = ops[0]
        g = state.group[first]
        if g >= 0 and state.group_device[g] >= 0:
            return [state.group_device[g]]
        need = state.group_need[g] if g >= 0 else sum(state.need[i] for i in ops)
        return [k for k in state.allowed[first] if state.mem_used[k] + need <= state.capacity[k]]

    def _trial(self, state, ops, k):
        """Start times of the members of a unit on device ``k``, and the unit's finish there.

        Members go in topological order, each at its earliest start after its
        inputs arrive that overlaps neither the device's ops nor the members
        already tried (into an idle gap with ``insertion``). Nothing is placed.
        """
        timeline = state.timelines[k]
        local = {}
        dev, fin, lat, inv = state.device, state.finish, state.latency, state.inv_bw
        starts, tried, finish = [], [], 0.0
        for i in ops:
            t = 0.0
            for p, b in state.inputs[i]:
                a = local.get(p)
                if a is None:
                    d = dev[p]
                    a = fin[p] if d == k else fin[p] + lat[d][k] + b * inv[d][k]
                if a > t:
                    t = a
            dur = state.duration_row(i)[k]
            while True:
                s = timeline.earliest_start(t, dur, self.insertion)
                # No start before the end of a member it would overlap can work:
                # every earlier start collides with the device's own ops.
                clash = max((b for a, b in tried if a < s + dur and b > s), default=None)
                if clash is None:
                    break
                t = clash
            if not self.insertion:
                t = max(s, max((b for _, b in tried), default=0.0))
                s = t
            starts.append(s)
            tried.append((s, s + dur))
            local[i] = s + dur
            finish = max(finish, s + dur)
        return starts, finish
