"""Forward-backward improvement: iterative justification of a list schedule.

Not part of the FD-DPS paper: a post-pass fddps adds (``FDDPS(improve=True)``)
because a single list-scheduling pass leaves idle time that a few cheap passes
recover. The technique is Li & Willis's iterative forward-backward scheduling
(EJOR 56, 1992), known in project scheduling as double justification (Valls,
Ballestin & Quintanilla, EJOR 165, 2005):

1. *Backward pass*: list-schedule the reversed graph, taking ops in order of
   decreasing finish time in the current schedule: every op is pushed as late
   as it can go.
2. *Forward pass*: list-schedule the graph, taking ops in order of increasing
   start time in the backward schedule (read forwards): every op is pulled as
   early as it can go.

Each pass sends every op to the device where it finishes first (insertion into
idle gaps allowed, transfers and memory respected), so the constraints are
those of every other algorithm here. The best schedule seen is kept, so the
result is never worse than the input. When passes stop improving, the search
restarts from the input with its finish times perturbed at random (seeded), a
fixed number of times. Work is bounded by a budget of op placements, and
stops early once the makespan reaches :func:`fddps.lower_bound`.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..bounds import lower_bound
from .base import PlacementState


def priority_list_schedule(graph, cluster, priority, exec_time=None, insertion=True) -> PlacementState:
    """List-schedule ``graph``: ready ops by ascending ``priority``, each where it finishes first.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    priority : array of float, shape (n,)
        Smaller goes first among ready ops; ties by op index.
    exec_time : array (n, m), optional
        ``graph.exec_times(cluster)``, if already computed.
    insertion : bool
        Allow idle gaps between placed ops to be filled.

    Returns
    -------
    PlacementState
        With every op placed (``device``, ``start``, ``finish``, ``timelines``).

    Raises
    ------
    InfeasibleError
        If an op fits on no device (memory).
    """
    state = PlacementState(graph, cluster, exec_time)
    waiting = np.diff(graph.pred_ptr).tolist()
    succ_ptr, succ_idx = graph.succ_ptr.tolist(), graph.succ_idx.tolist()
    key = np.asarray(priority, dtype=np.float64).tolist()
    ready = [(key[i], i) for i in range(graph.num_ops) if waiting[i] == 0]
    heapq.heapify(ready)
    rows, timelines = state.et_rows, state.timelines
    while ready:
        _, i = heapq.heappop(ready)
        row = rows[i]
        devices = state.candidates(i)
        # A device cannot finish the op before its inputs arrive plus its run
        # time: visit devices by that bound and stop once it cannot win.
        bounds = sorted((r + row[k], k, r) for k, r in zip(devices, state.ready_times(i, devices)))
        best_f = best_s = best_k = None
        for bound, k, r in bounds:
            if best_f is not None and bound >= best_f:
                break
            s = timelines[k].earliest_start(r, row[k], insertion)
            f = s + row[k]
            if best_f is None or f < best_f:
                best_f, best_s, best_k = f, s, k
        state.place(i, best_k, best_s)
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (key[j], j))
    return state


def forward_backward_improve(graph, cluster, start, finish, makespan, *, budget=200_000,
                             restarts=10, max_stale=2, noise=0.1, seed=0, exec_time=None):
    """Improve a schedule by forward-backward passes; return the best state found, or None.

    Parameters
    ----------
    graph, cluster
    start, finish : arrays of float
        Times of the schedule to improve.
    makespan : float
        Its makespan.
    budget : int
        At most this many op placements in all (a forward-backward pass costs
        ``2 * num_ops``); at least one pass is made.
    restarts : int
        Perturbed restarts after the first descent stalls.
    max_stale : int
        Passes without improvement before a descent ends.
    noise : float
        Restart perturbation: finish times get uniform noise up to ``noise * makespan``.
    seed : int

    Returns
    -------
    (PlacementState or None, dict)
        The best forward pass's state if it beat ``makespan`` (else None), and
        statistics: passes made, improvements, whether the lower bound was reached.
    """
    n = graph.num_ops
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    bound = lower_bound(graph, cluster)
    tol = 1e-9 * max(makespan, 1e-300)
    reverse = graph.reversed()
    rng = np.random.default_rng(seed)
    max_passes = max(1, budget // max(2 * n, 1))
    best, best_state = makespan, None
    stats = {"improve_passes": 0, "improvements": 0, "lower_bound_reached": makespan <= bound + tol}
    base_finish = np.asarray(finish, dtype=np.float64)
    for attempt in range(restarts + 1):
        finish_now = base_finish if attempt == 0 else (
            base_finish + rng.uniform(0.0, noise * best, n))
        stale = 0
        while stale < max_stale and stats["improve_passes"] < max_passes:
            if best <= bound + tol:
                stats["lower_bound_reached"] = True
                return best_state, stats
            backward = priority_list_schedule(reverse, cluster, -finish_now, et)
            forward = priority_list_schedule(graph, cluster, -np.asarray(backward.finish), et)
            stats["improve_passes"] += 1
            finish_now = np.asarray(forward.finish)
            span = float(finish_now.max(initial=0.0))
            if span < best - tol:
                best, best_state, stale = span, forward, 0
                stats["improvements"] += 1
            else:
                stale += 1
        if stats["improve_passes"] >= max_passes:
            break
    stats["lower_bound_reached"] = best <= bound + tol
    return best_state, stats
