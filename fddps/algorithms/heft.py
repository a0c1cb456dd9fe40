"""HEFT: Heterogeneous Earliest Finish Time list scheduling.

Source: H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-effective and
low-complexity task scheduling for heterogeneous computing", IEEE Transactions
on Parallel and Distributed Systems 13(3):260-274, 2002, Section 4.1.

The algorithm, as in the paper:

1. Upward rank (paper eq. 3): ``rank_u(i) = w(i) + max over successors j of
   (c(i, j) + rank_u(j))``, where ``w(i)`` is the op's mean execution time over
   the devices (eq. 1) and ``c(i, j)`` the edge's mean communication cost (eq. 2:
   mean latency plus bytes times mean inverse bandwidth over pairs of distinct
   devices; :meth:`PlacementState.mean_edge_comm`).
2. Ops in decreasing ``rank_u``.
3. Each op goes to the device where it finishes earliest, using the
   insertion-based policy: it may fill an idle gap between ops already placed on
   that device if it fits there after its inputs arrive (eq. 4-5).

Where we had to interpret:

- Ties in ``rank_u`` (the paper does not say) are broken by topological
  position, so a parent always comes before its child even when a zero-cost op
  and a zero-byte edge make their ranks equal. Ties in finish time go to the
  lower device index.
- ``w(i)`` averages over the devices the op may run on (finite cost); an op
  with no kernel on some device type simply has fewer devices to average over.
- Memory: the paper has none. Devices without room for the op (its
  reservation for the whole step, as :class:`PlacementState` keeps it) are
  skipped, as are devices other than the op's pinned or colocated one; if no
  device has room, :class:`~fddps.errors.InfeasibleError` is raised naming the op.
- The returned :class:`~fddps.schedule.Schedule` keeps HEFT's placement and
  per-device order and replays it, so times can only move earlier than HEFT's
  own estimate (never later).

Example (the paper's Fig. 2 graph gives makespan 80; see tests/test_baselines.py)::

    >>> from fddps import OpGraph, Cluster, schedule
    >>> g = OpGraph(["a", "b", "c"], [2.0, 1.0, 1.0], [("a", "b", 0.0), ("a", "c", 0.0)])
    >>> schedule(g, Cluster.homogeneous(2), "heft").makespan
    3.0
"""

from __future__ import annotations

import numpy as np

from ..paths import bottom_levels
from .base import PlacementState, Scheduler, register


def upward_rank(state: PlacementState) -> np.ndarray:
    """HEFT's ``rank_u`` of every op: mean execution time plus the longest mean-cost path below it."""
    return bottom_levels(state.graph, state.mean_exec_time(), state.mean_edge_comm())


def topological_position(graph) -> np.ndarray:
    """Position of every op in ``graph.topo`` (a tie-breaker that respects dependencies)."""
    pos = np.empty(graph.num_ops, dtype=np.int64)
    pos[graph.topo] = np.arange(graph.num_ops)
    return pos


def earliest_finish_device(state: PlacementState, i: int, insertion: bool = True):
    """The device where op ``i`` finishes first, and its start there: ``(device, start)``.

    Considers only :meth:`PlacementState.candidates` (runnable, pinned or
    colocated, memory left); ties go to the lower device index.

    Raises
    ------
    InfeasibleError
        If no device has room for the op.
    """
    row = state.duration_row(i)
    timelines = state.timelines
    best_f, best_k, best_s = float("inf"), -1, 0.0
    for k in state.candidates(i):
        s = timelines[k].earliest_start(state.ready_time(i, k), row[k], insertion)
        f = s + row[k]
        if f < best_f:
            best_f, best_k, best_s = f, k, s
    return best_k, best_s


@register
class HEFT(Scheduler):
    """HEFT list scheduler (Topcuoglu, Hariri and Wu, 2002).

    Parameters
    ----------
    insertion : bool
        Let an op fill an idle gap between ops already on a device (the paper's
        insertion-based policy; default True). With False an op can only go
        after the last op of a device.
    """

    name = "heft"

    def __init__(self, insertion=True):
        self.insertion = insertion

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        rank = upward_rank(state)
        order = np.lexsort((topological_position(graph), -rank))
        for i in order.tolist():
            k, s = earliest_finish_device(state, i, self.insertion)
            state.place(i, k, s)
        return state.to_schedule(self.name, {"planned_makespan": max(state.finish, default=0.0)})
