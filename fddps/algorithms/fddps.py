"""FD-DPS: dynamic-critical-path list scheduling (Mathematics 10(24) 4788, 2022).

The paper's Algorithms 1-3 are images missing from its text; this module follows
the reconstruction in DESIGN.md and, where the paper is unclear, the algorithm
it descends from: Kwok & Ahmad's Dynamic Critical Path (DCP), IEEE TPDS 7(5), 1996.

Definitions, for an op ``o`` not yet placed (paper formulas 6-10):

- ``ET(o)``: its mean execution time over the devices it may run on (the
  estimate HEFT uses; the paper leaves it open). Placed ops use their real time.
- ``w(p, o)``: the transfer time of the edge; for an edge with an unplaced end,
  the mean over pairs of distinct devices.
- ``EST(o) = max over parents p of finish(p) + w(p, o)``: an unplaced op pays
  the full transfer from every parent.
- ``blevel(o) = ET(o) + max over children c of (w(o, c) + blevel(c))``.
- ``DCPL``: the length of the longest path through the partial schedule.
- ``LST(o) = DCPL - blevel(o)``; slack ``LST - EST``; ``Score = 1 / (slack + eps)``;
  critical when the slack is 0.

Why a heap suffices (DESIGN.md, "Making it fast"). A list scheduler only picks
ready ops (every parent placed), and every descendant of a ready op is still
unplaced, so its ``blevel`` is the static one computed at the start and its
``EST`` is fixed once its last parent is placed. Its slack is therefore
``DCPL - (EST + blevel)``: the ready op with the largest ``EST + blevel`` has
the highest Score, and is critical whenever any ready op is. Sort_Node
(Algorithm 1: critical ops first, then highest Score; ties by larger
``blevel``, then topological order) is a pop from a heap keyed on
``EST + blevel``. DCPL itself is the maximum over the frontier edges ``(p, c)``
with ``p`` placed and ``c`` not of ``finish(p) + w(p, c) + blevel(c)`` (and over
unplaced entry ops and placed finishes), kept in a lazy max-heap. Each edge is
pushed once, so the search is ``O((n + e) log(n + e) + n * devices * indegree)``.

Find_Slot (Algorithm 2). For each device ``v`` that can run ``o`` and has memory
for it, the earliest start ``s(o, v)`` is the first idle gap after the inputs
arrive (a parent on ``v`` sends nothing). Formula 11 admits ``v`` when ``o``
fits there without lengthening the critical path:
``s(o, v) + ET(o, v) + (blevel(o) - ET(o)) <= DCPL``. Ops go only into idle
gaps, never pushing a placed op later (HEFT's insertion policy): DCP lets the
op push its successor up to that successor's LST, which would mean re-timing
placed ops; gaps keep every placed time final. Among admitted devices, in
the paper's order of preference:

1. a device that holds a parent of ``o`` (saves a transfer); among several, the
   earliest finish;
2. the device where ``o`` and its critical child (the child with the highest
   Score, i.e. the largest ``w(o, c) + blevel(c)``) can both be done soonest,
   ``finish(o, v) + ET(c, v)`` (formula 12; with equal start times this is the
   paper's ``ET(o, v) + ET(c, v)``);
3. the earliest start (for ops without children).

4. When no device is admitted, the paper takes "the device running the
   lowest-priority work"; we read this as DCP does: the device where ``o``
   finishes earliest, which lengthens the critical path least.

On links whose devices move tensors themselves (``Cluster.transfer_compute``,
CPU tasks over gRPC), an op's time on a device includes receiving the inputs
not yet there (:meth:`PlacementState.duration_row`), so spreading small ops
over such devices costs what it costs them.

Then (our addition, not the paper's) forward-backward passes refine the list
schedule (:mod:`fddps.algorithms.justify`); ``improve=False`` turns them off.
Finally, if running everything on the best single device is faster than the
list schedule (possible when transfers dominate), that schedule is returned.
Intra-op splitting (the paper's lines 2-6) lives in
:mod:`fddps.algorithms.split_step` (what a split is: :mod:`fddps.strategy.fddps_splits`):
when the graph carries split candidates, the ops the cost model says are worth
it are split, the split graph is scheduled as above, and it is kept only if its
step is shorter than the unsplit graph's. ``Schedule.info["splits"]`` lists the
decisions (:func:`fddps.strategy.fddps_splits.decisions_table` makes the
paper's Table 6).
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..bounds import communication_lower_bound
from ..errors import ClusterError, InfeasibleError
from ..schedule import Schedule
from ..paths import bottom_levels
from . import list_pass_jit
from .base import PlacementState, Scheduler, register, run_compiled
from .justify import DEFAULT_MIN_GAIN, check_min_gain, forward_backward_improve
from .local_search import move_search
from .single import best_single_device
from .split_step import schedule_with_splits


@register
class FDDPS(Scheduler):
    """FD-DPS dynamic-critical-path scheduler.

    Parameters
    ----------
    insertion : bool
        Let ops fill idle gaps between placed ops (default True).
    lookahead : bool
        Use the critical-child rule (2) of Find_Slot (default True).
    prefer_parent : bool
        Use the parent-device rule (1) of Find_Slot (default True).
    single_device_guard : bool
        Return the best single-device schedule when it is faster, and on a
        cluster of several hosts the best schedule on one host's devices
        (default True).
    improve : bool
        Refine the list schedule by forward-backward passes
        (:mod:`fddps.algorithms.justify`; not in the paper, default True).
        ``improve=False`` is the paper's algorithm alone.
    improve_budget : int or None
        Op placements the refinement may spend; a forward-backward pass costs
        two per op. Default ``None``: :data:`~fddps.algorithms.justify.DEFAULT_MAX_PASSES`
        (20) passes, at most :data:`~fddps.algorithms.justify.DEFAULT_MAX_PLACEMENTS`
        (200,000) placements (:func:`~fddps.algorithms.justify.default_budget`):
        the refinement places at most 40 times as many ops as the list pass,
        and above 50,000 ops makes one pass. It usually ends long before: see
        ``improve_min_gain``.
    improve_min_gain : float
        On graphs over :data:`~fddps.algorithms.justify.SMALL_GRAPH_OPS` ops,
        the first refinement pass that shortens the step by less than this
        fraction of it ends the refinement (default
        :data:`~fddps.algorithms.justify.DEFAULT_MIN_GAIN`, 0.1%); 0 refines
        until passes stall, with restarts, as on small graphs.
    restarts, seed
        Perturbed restarts of the refinement, and their random seed. Graphs
        over :data:`~fddps.algorithms.justify.PATIENT_GRAPH_OPS` (300) ops end
        the restarts after two in a row that gain nothing.
    local_search : bool or None
        Finish with a descent that moves single ops between devices, each move
        scored by replaying the step (:mod:`fddps.algorithms.local_search`; not
        in the paper), from the schedule and from the best single-device one.
        Default ``None``: as ``improve``, so ``improve=False`` stays the
        paper's algorithm alone. It is what keeps ``fddps`` near the optimum when
        transfers dominate (README, "Exact schedules").
    local_search_max_ops : int
        Graphs with more ops skip the local search (default 300): each move
        costs a replay of the whole step.
    split : bool
        Split the graph's :attr:`~fddps.OpGraph.split_candidates` where the
        cost model says it pays (:mod:`fddps.algorithms.split_step`), and keep the split graph
        when its schedule is faster (default True). ``split=False`` is the
        paper's D-DPS(-F).
    """

    name = "fddps"

    def __init__(self, insertion=True, lookahead=True, prefer_parent=True,
                 single_device_guard=True, improve=True, improve_budget=None,
                 improve_min_gain=DEFAULT_MIN_GAIN, restarts=10, seed=0, split=True,
                 local_search=None, local_search_max_ops=300):
        self.local_search = local_search
        self.local_search_max_ops = local_search_max_ops
        self.insertion = insertion
        self.lookahead = lookahead
        self.prefer_parent = prefer_parent
        self.single_device_guard = single_device_guard
        self.improve = improve
        self.improve_budget = improve_budget
        self.improve_min_gain = check_min_gain(improve_min_gain, "fddps: improve_min_gain")
        self.restarts = restarts
        self.seed = seed
        self.split = split

    def _schedule(self, graph, cluster) -> Schedule:
        return schedule_with_splits(self._schedule_whole_ops, graph, cluster, enabled=self.split)

    def _schedule_whole_ops(self, graph, cluster) -> Schedule:
        t0 = time.perf_counter()
        state = PlacementState(graph, cluster)
        stats = self._list_schedule(state)
        result = state.to_schedule(self.name)
        stats["list_schedule_makespan"] = result.makespan
        # Wall seconds, for reports only: the refinement's budget is counted in passes.
        stats["list_schedule_seconds"] = time.perf_counter() - t0
        if self.improve and graph.num_ops:
            t0 = time.perf_counter()
            better, improve_stats = forward_backward_improve(
                graph, cluster, result.start, result.finish, result.makespan,
                budget=self.improve_budget, min_gain=self.improve_min_gain,
                restarts=self.restarts, seed=self.seed,
                exec_time=state.et)
            stats.update(improve_stats)
            if better is not None:
                candidate = better.to_schedule(self.name)
                if candidate.makespan < result.makespan:
                    result = candidate
            stats["improve_seconds"] = time.perf_counter() - t0
        single = None
        local_search = self.improve if self.local_search is None else self.local_search
        if (self.single_device_guard or local_search) and cluster.num_devices > 1:
            k, single_time = best_single_device(state)
            if k is not None:
                device = np.full(graph.num_ops, k, dtype=np.int64)
                order = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
                order[k] = graph.topo
                single = Schedule.from_order(graph, cluster, device, order, self.name,
                                             exec_time=state.et)
        spread = result  # the list schedule: a start of the local search below too
        if self.single_device_guard and single is not None and single.makespan < result.makespan:
            stats["single_device_fallback"] = True
            result = single
        if self.single_device_guard:
            one_host = self._best_one_host(graph, cluster, state.et)
            if one_host is not None and one_host[0].makespan < result.makespan * (1 - 1e-9):
                stats["single_host_fallback"] = one_host[1]
                result = one_host[0]
        replays = self._local_search_replays(graph)
        # Only where transfers cost something (what the moves trade against),
        # and the schedule is not already at the bound.
        if (local_search and replays and cluster.num_devices > 1
                and np.any(cluster.mean_transfer_time(graph.bytes) > 0)
                and result.makespan > communication_lower_bound(graph, cluster) * (1 + 1e-9)):
            # From the best schedule so far, everything on one device (where
            # high-communication optima usually lie near) and the list schedule.
            stats["local_search_replays"] = stats["local_search_moves"] = 0
            starts = [result] + [s for s in (single, spread) if s is not None and s is not result]
            for start in starts:
                found, ls_stats = move_search(start, state.allowed, max_replays=replays,
                                              exec_time=state.et)
                for key, value in ls_stats.items():
                    stats[key] += value
                if found.makespan < result.makespan * (1 - 1e-9):
                    result = found
                    stats["local_search_improved"] = True
        result.info.update(stats)
        return result

    def _best_one_host(self, graph, cluster, exec_time):
        """The fastest schedule that keeps the step on one host's devices, or None.

        On a cluster of several hosts, transfers between them cross slow links
        and shared network interfaces; a list schedule that starts spreading
        ops over them may end slower than one host alone, yet faster than one
        device, so neither the schedule nor the single-device guard finds
        what one host gives. Each host with two or more devices is scheduled
        alone (hosts identical to one tried already are skipped unless ops are
        pinned; a host that cannot take the pinned ops or the memory is
        skipped). Returns ``(schedule on the whole cluster, host)``.
        """
        hosts = {}
        for k, d in enumerate(cluster.devices):
            hosts.setdefault(d.host, []).append(k)
        if len(hosts) < 2:
            return None
        best, seen = None, set()
        for host, members in hosts.items():
            kind = tuple((cluster.devices[k].type, cluster.devices[k].speed,
                          cluster.devices[k].memory) for k in members)
            if len(members) < 2 or (kind in seen and not graph.pinned):
                continue
            seen.add(kind)
            try:
                alone = self._schedule_whole_ops(graph, cluster.subset([cluster.names[k]
                                                                        for k in members]))
            except (ClusterError, InfeasibleError):
                continue
            device = np.asarray(members, dtype=np.int64)[alone.device]
            order = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
            for j, k in enumerate(members):
                order[k] = alone.order[j]
            full = Schedule.from_order(graph, cluster, device, order, self.name,
                                       info=dict(alone.info), exec_time=exec_time)
            if best is None or full.makespan < best[0].makespan:
                best = (full, host)
        return best

    def _local_search_replays(self, graph) -> int:
        """Replays the move search may spend from each start: about 1e5 op-or-edge
        visits, at most 1,000, none on graphs over ``local_search_max_ops``."""
        if graph.num_ops > self.local_search_max_ops:
            return 0
        return min(1000, 100_000 // max(graph.num_ops + graph.num_edges, 1))

    def _find_slot(self, state: PlacementState, i: int, child: int, latest_finish: float):
        """Device and start time for op ``i`` (the paper's Find_Slot, Algorithm 2).

        ``child`` is the critical child (-1: none or look-ahead off);
        ``latest_finish`` the finish formula 11 admits (``DCPL - tail``).
        Rules as in the module docstring. Rules 2 and 3 minimise keys no
        smaller than the inputs' arrival on the device (plus run times), so
        devices are visited by that bound and the search stops once the bound
        cannot beat the best admitted device.
        """
        row = state.duration_row(i)
        devices = state.candidates(i)
        readies = state.ready_times(i, devices)
        timelines, insertion = state.timelines, self.insertion
        slots = {}

        def slot(k, ready):
            if k not in slots:
                start = timelines[k].earliest_start(ready, row[k], insertion)
                slots[k] = (start, start + row[k])
            return slots[k]

        if self.prefer_parent:  # rule 1: an admitted parent's device, earliest finish first
            parents = {state.device[p] for p, _ in state.inputs[i]}
            best = None
            for k, ready in zip(devices, readies):
                if k in parents:
                    start, finish = slot(k, ready)
                    if finish <= latest_finish and (best is None or finish < best[0]):
                        best = (finish, k, start)
            if best is not None:
                return best[1], best[2]
        child_row = state.et_rows[child] if child >= 0 else None
        bounds = sorted((ready + row[k] + child_row[k] if child >= 0 else ready, k, ready)
                        for k, ready in zip(devices, readies))
        best = fallback = None
        for bound, k, ready in bounds:
            if best is not None and bound > best[0][0]:
                break
            start, finish = slot(k, ready)
            if fallback is None or finish < fallback[0]:
                fallback = (finish, k, start)  # rule 4, when no device is admitted
            if finish > latest_finish:
                continue  # formula 11: would lengthen the critical path
            # Rule 2 (critical child) or, for ops without children, rule 3 (earliest start).
            key = (finish + child_row[k], finish) if child >= 0 else (start, finish)
            if best is None or key < best[0]:
                best = (key, k, start)
        chosen = best if best is not None else fallback
        return chosen[1], chosen[2]

    def _list_schedule(self, state: PlacementState) -> dict:
        g = state.graph
        n = g.num_ops
        et_est = state.mean_exec_time()
        comm_est = state.mean_edge_comm()
        blevel_arr = bottom_levels(g, et_est, comm_est)
        tail = blevel_arr - et_est  # longest path after the op finishes
        rank = np.empty(n, dtype=np.int64)
        rank[g.topo] = np.arange(n)

        result = run_compiled(state, list_pass_jit.fddps_list_pass, blevel_arr, tail, rank,
                              comm_est[g.succ_eid], self.lookahead, self.prefer_parent,
                              self.insertion)
        if result is not None:
            return {"critical_picks": result[-1],
                    "dcpl_estimate": float(blevel_arr.max(initial=0.0))}
        blevel, tail, rank = blevel_arr.tolist(), tail.tolist(), rank.tolist()
        succ_ptr, succ_idx = g.succ_ptr.tolist(), g.succ_idx.tolist()
        succ_comm = comm_est[g.succ_eid].tolist()
        # Critical child: the child with the highest Score, i.e. the largest w + blevel.
        crit_child = [-1] * n
        for i in range(n):
            best = -1.0
            for p in range(succ_ptr[i], succ_ptr[i + 1]):
                v = succ_comm[p] + blevel[succ_idx[p]]
                if v > best:
                    best, crit_child[i] = v, succ_idx[p]

        waiting = np.diff(g.pred_ptr).tolist()  # unplaced parents per op
        est = [0.0] * n
        placed = [False] * n
        ready = []   # (-(EST + blevel), -blevel, rank, op)
        frontier = []  # (-(path length through a frontier edge), op at its unplaced end)
        for i in range(n):
            if waiting[i] == 0:
                heapq.heappush(ready, (-blevel[i], -blevel[i], rank[i], i))
                heapq.heappush(frontier, (-blevel[i], i))
        max_finish = 0.0
        tol = 1e-9 * (max(blevel) if n else 0.0)
        critical_picks = 0

        while ready:
            neg_key, _, _, i = heapq.heappop(ready)
            while frontier and placed[frontier[0][1]]:
                heapq.heappop(frontier)
            dcpl = max(max_finish, -frontier[0][0] if frontier else 0.0)
            if -neg_key >= dcpl - tol:
                critical_picks += 1

            c = crit_child[i] if self.lookahead else -1
            k, s = self._find_slot(state, i, c, dcpl + tol - tail[i])
            state.place(i, k, s)
            placed[i] = True
            f = state.finish[i]
            if f > max_finish:
                max_finish = f
            for p in range(succ_ptr[i], succ_ptr[i + 1]):
                j = succ_idx[p]
                arrival = f + succ_comm[p]
                if arrival > est[j]:
                    est[j] = arrival
                heapq.heappush(frontier, (-(arrival + blevel[j]), j))
                waiting[j] -= 1
                if waiting[j] == 0:
                    heapq.heappush(ready, (-(est[j] + blevel[j]), -blevel[j], rank[j], j))
        return {"critical_picks": critical_picks, "dcpl_estimate": float(blevel_arr.max(initial=0.0))}
