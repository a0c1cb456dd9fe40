"""Baechi's memory-constrained list schedulers: m-ETF and m-TOPO.

Source: B. Jeon, L. Cai, P. Srivastava, J. Jiang, X. Ke, Y. Meng, C. Xie,
I. Gupta, "Baechi: fast device placement of machine learning graphs", ACM
Symposium on Cloud Computing (SoCC) 2020, Section 3, and its public
implementation (github.com/beomyeol/baechi, ``placer/m_etf.py``,
``placer/m_topo.py``), read to settle details the paper leaves open. m-ETF
descends from ETF (J.-J. Hwang, Y.-C. Chow, F. D. Anger, C.-Y. Lee, SIAM J.
Computing 18(2), 1989), as described by Kwok and Ahmad (ACM Computing Surveys
31(4), 1999).

m-ETF (``etf``)
    Repeatedly, among the *ready* ops (every parent placed) and the devices
    that can still hold them, pick the (op, device) pair with the earliest
    start time, where the start on device ``k`` is ``max(ready(op, k),
    free(k))``: ``ready`` is when the op's inputs have arrived on ``k`` (no
    transfer from a parent on ``k``) and ``free`` the finish of the last op on
    ``k`` (ETF does not insert into gaps). Ties: the op with the larger static
    b-level (longest path of mean execution times to an exit, no transfers;
    ETF's tie rule), then the earlier topological position (Baechi's rule), then
    the lower device index. A device is skipped for an op once it lacks the
    memory for it.

    Baechi's implementation runs this as an event simulation (a device becomes
    free, picks the ready op it can start soonest); the picks form a
    non-decreasing sequence of start times either way, so the static form
    above chooses the same pairs up to ties.

m-TOPO (``topo``)
    Ops in topological order fill the devices one after another: each device
    takes ops until the next one would exceed the per-device budget, then the
    next device starts. The budget is Baechi's ``uniform`` one, ``total memory
    needed / devices + largest op's need``, capped by each device's capacity.
    Each device runs its ops first-in-first-out in topological order
    (:func:`fddps.simulate.fifo_order`, what TensorFlow's executor does with
    the placement m-TOPO outputs).

Where we had to interpret:

- Memory: Baechi's m-ETF tracks allocations and frees output memory when the
  last consumer finishes. fddps schedulers reserve an op's bytes for the whole
  step (persistent bytes first, ``memory + transient`` if the replayed peak
  then overflows: :meth:`Scheduler.schedule`). With a reservation, "a device
  can hold the op" only gets harder as placement proceeds, which the efficient
  selection below relies on.
- Colocation groups: as Baechi with ``colocation=True``, the first op of a
  group reserves the whole group's memory and fixes the device of the rest.
- m-TOPO with device constraints Baechi does not have: an op pinned or
  colocated elsewhere, or with no kernel on the current device, goes to the
  first device it may use with room (the fill pointer stays); when no device
  is left within its budget, an op goes to the first device with capacity left
  (the budget is a balance target, capacity the hard limit). If nothing fits,
  :class:`~fddps.errors.InfeasibleError` names the op.

Efficiency of m-ETF. A naive step scans every ready op on every device:
``O(n^2 m)`` in all. Here each device keeps two heaps of its candidate ops:
``waiting`` keyed by ``ready(op, k)`` (inputs not yet there when the device
becomes free) and ``arrived`` keyed by the tie-break priority (inputs there
by ``free(k)``, so all of them would start at ``free(k)``). An op enters the
heaps of the devices it may use when its last parent is placed (its ready
times are final then); when a device's ``free`` time grows, ops move from
``waiting`` to ``arrived``. A device's best pair is the top of ``arrived`` if
any, else the top of ``waiting``; a step compares the ``m`` device bests.
Placed ops and ops a device can no longer hold are dropped lazily when they
reach a top. Total: ``O(e m + n m log n)``.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import InfeasibleError
from ..simulate import fifo_order
from ..schedule import Schedule
from ..paths import bottom_levels
from .base import PlacementState, Scheduler, register
from .heft import topological_position


def static_levels(state: PlacementState) -> np.ndarray:
    """Static b-level of every op: the longest path of mean execution times to an exit."""
    return bottom_levels(state.graph, state.mean_exec_time(), np.zeros(state.graph.num_edges))


@register
class METF(Scheduler):
    """Baechi's memory-constrained Earliest Task First (m-ETF) scheduler."""

    name = "etf"

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        n, m = state.n, state.m
        # Tie-break priority of each op as one integer, smaller first: larger
        # static level, then earlier topological position.
        prio = np.empty(n, dtype=np.int64)
        prio[np.lexsort((topological_position(graph), -static_levels(state)))] = np.arange(n)
        prio = prio.tolist()

        group, group_device = state.group, state.group_device
        mem_used, capacity = state.mem_used, state.capacity
        placed = [False] * n
        free = [0.0] * m
        waiting = [[] for _ in range(m)]  # (ready time, priority, op)
        arrived = [[] for _ in range(m)]  # (priority, op)
        live = [0] * n                     # devices whose heaps still hold the op

        def usable(i, k):
            g = group[i]
            if g >= 0 and group_device[g] >= 0:
                return group_device[g] == k  # memory was reserved with the group
            return mem_used[k] + state.memory_needed(i) <= capacity[k]

        def drop(i):
            live[i] -= 1
            if live[i] == 0 and not placed[i]:
                make_ready(i)  # candidates() raises InfeasibleError naming the op if none is left

        def make_ready(i):
            devs = state.candidates(i)
            live[i] = len(devs)
            for k in devs:
                r = state.ready_time(i, k)
                if r <= free[k]:
                    heapq.heappush(arrived[k], (prio[i], i))
                else:
                    heapq.heappush(waiting[k], (r, prio[i], i))

        def best_on(k):
            """Best (start, priority, op) on device k, dropping stale entries; None if empty."""
            a, w = arrived[k], waiting[k]
            while a:
                i = a[0][1]
                if placed[i]:
                    heapq.heappop(a)
                elif not usable(i, k):
                    heapq.heappop(a)
                    drop(i)
                else:
                    return (free[k], a[0][0], i)
            while w:
                i = w[0][2]
                if placed[i]:
                    heapq.heappop(w)
                elif not usable(i, k):
                    heapq.heappop(w)
                    drop(i)
                else:
                    return w[0]
            return None

        indeg = np.diff(graph.pred_ptr).tolist()
        succ_ptr, succ_idx = graph.succ_ptr.tolist(), graph.succ_idx.tolist()
        for i in graph.topo.tolist():
            if indeg[i] == 0:
                make_ready(i)

        for _ in range(n):
            best, best_k = None, -1
            for k in range(m):
                cand = best_on(k)
                if cand is not None and (best is None or cand < best):
                    best, best_k = cand, k
            if best is None:  # pragma: no cover - every unplaced op is on some heap
                raise InfeasibleError("m-ETF ran out of schedulable ops before placing every op")
            start, _, i = best
            k = best_k
            state.place(i, k, start)
            placed[i] = True
            free[k] = state.finish[i]
            # Ops whose inputs are on k by the new free time all start then.
            w, a, fk = waiting[k], arrived[k], free[k]
            while w and w[0][0] <= fk:
                _, p, j = heapq.heappop(w)
                heapq.heappush(a, (p, j))
            for q in range(succ_ptr[i], succ_ptr[i + 1]):
                j = succ_idx[q]
                indeg[j] -= 1
                if indeg[j] == 0:
                    make_ready(j)
        return state.to_schedule(self.name, {"planned_makespan": max(free)})


@register
class MTOPO(Scheduler):
    """Baechi's memory-constrained topological placement (m-TOPO)."""

    name = "topo"

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        n, m = state.n, state.m
        need = state.need
        # Baechi's uniform budget: an even share of the memory plus the largest op.
        unit = [state.group_need[g] if g >= 0 else need[i] for i, g in enumerate(state.group)]
        share = sum(need) / m + (max(unit) if n else 0.0)
        budget = [min(share, c) for c in state.capacity]
        mem_used = state.mem_used

        group, group_device = state.group, state.group_device
        current = 0
        for i in graph.topo.tolist():
            devs = state.candidates(i)  # raises InfeasibleError if nothing can hold it
            extra = state.memory_needed(i)
            g = group[i]
            # Only ops free to go anywhere follow the fill pointer.
            follows = len(state.allowed[i]) == m and (g < 0 or group_device[g] < 0)
            chosen = -1
            if follows:
                while current < m and not (current in devs and mem_used[current] + extra <= budget[current]):
                    current += 1
                if current < m:
                    chosen = current
            if chosen < 0:
                within = [k for k in devs if mem_used[k] + extra <= budget[k]]
                chosen = within[0] if within else devs[0]
            # Times come from the FIFO replay below; appending keeps the timeline cheap.
            state.place(i, chosen, state.timelines[chosen].free_at)

        device = np.asarray(state.device, dtype=np.int64)
        order = fifo_order(graph, cluster, device, state.et)
        return Schedule.from_order(graph, cluster, device, order, self.name,
                                   {"budget_bytes": share}, exec_time=state.et)
