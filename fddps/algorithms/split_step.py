"""FD-DPS's split step: which ops to split, and the faster of the whole and the split schedule.

The paper's Algorithm 3, lines 2-6: before placing, split compute-heavy ops on
or near the critical path into parts when the cost model says it pays. What a
split is (rules, candidates, decisions, the op-graph rewrite) is the strategy
layer's, :mod:`fddps.strategy.fddps_splits`; this module holds the parts that
need a scheduler's machinery (mean costs and levels of
:class:`~fddps.algorithms.base.PlacementState`, a scheduler to call), so that
the strategy layer stays below the algorithms:

- :func:`path_slack`: each op's slack off the critical path, from mean costs;
- :func:`plan_splits`: which of a graph's split candidates to split, into how
  many parts;
- :func:`schedule_with_splits`: schedule the graph whole and split with a
  scheduler's own search, keep the faster (FD-DPS and FastT use it).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InfeasibleError
from ..graph import OpGraph
from ..strategy.fddps_splits import SplitDecision, apply_splits
from ..paths import bottom_levels, top_levels
from .base import mean_exec_time, memory_overflow


def path_slack(graph: OpGraph, cluster):
    """Each op's slack off the critical path, as FD-DPS's split step measures it.

    From mean costs (an op's mean time over the devices that can run it, an
    edge's mean transfer between distinct devices): ``slack = length -
    (top level + bottom level)``, 0 on the critical path.

    Returns
    -------
    (slack, length, mean_time) : numpy.ndarray, float, numpy.ndarray
        Per op (graph order) its slack and mean time; the critical path's length.

    Example
    -------
    >>> from fddps.cluster import Cluster
    >>> g = OpGraph(["a", "b", "c"], [[2.0], [1.0], [2.0]], [("a", "c", 0.0), ("b", "c", 0.0)])
    >>> slack, length, _ = path_slack(g, Cluster.homogeneous(2))
    >>> slack.tolist(), length
    ([0.0, 1.0, 0.0], 4.0)
    """
    # Times only: no memory check, so a step too big for the cluster whole still has slack.
    et_mean = mean_exec_time(graph.exec_times(cluster))
    comm = cluster.mean_transfer_time(graph.bytes)
    blevel = bottom_levels(graph, et_mean, comm)
    tlevel = top_levels(graph, et_mean, comm)
    length = float(blevel.max(initial=0.0))
    return length - (tlevel + blevel), length, et_mean


def plan_splits(graph: OpGraph, cluster, *, critical_slack: float = 0.1,
                min_gain: float = 0.05, max_parts: int | None = None) -> list[SplitDecision]:
    """Which of ``graph.split_candidates`` to split, and into how many parts.

    A candidate is considered when it lies on or near the critical path (its
    slack, from mean costs as in FD-DPS, at most ``critical_slack`` of the
    critical path's length: splitting an op off the critical path cannot
    shorten the step) and is not pinned. A candidate in a colocation group may
    be split: the group binds its combine op, which keeps the op's name, and the
    parts go anywhere. For ``k = 2 .. max_parts`` (default: the number of
    devices that can run it) the split's estimated time is: slicing the inputs,
    the largest part (its :meth:`~fddps.strategy.fddps_splits.SplitCandidate.part_cost`
    relative to the whole op's, times ``ET``: the cost model at the part's
    shape, per-op overhead included), moving a part of every
    sliced input and the whole of every other data input (``whole_bytes``) to
    another device and its output back, and combining; the best ``k`` is taken
    when it beats the whole op by ``min_gain`` of its time. An op with several
    candidates (one per rule: batch or channels) gets at most one decision, the
    rule with the largest estimated gain.

    Returns
    -------
    list of SplitDecision, in the order of the candidates, at most one per op.
    """
    candidates = getattr(graph, "split_candidates", ())
    if not candidates or cluster.num_devices < 2:
        return []
    slack, length, et_mean = path_slack(graph, cluster)
    runnable_devices = np.isfinite(graph.exec_times(cluster)).sum(axis=1).tolist()
    decisions = {}  # op -> best decision so far
    for cand in candidates:
        i = graph.index[cand.op]
        # A colocated op may split: its combine op keeps its name and group (the
        # adapter offers only ops whose computation is not tied to the group).
        if slack[i] > critical_slack * length or i in graph.pinned:
            continue
        runnable = runnable_devices[i]
        k_max = min(runnable, cand.size, max_parts or runnable)
        whole = float(et_mean[i])
        slice_time = _mean(cand.slice_cost) if cand.sliced else 0.0
        combine_time = _mean(cand.combine_cost)
        best = None
        for k in range(2, k_max + 1):
            largest = -(-cand.size // k)
            moved = sum(b for _, b in cand.sliced) * largest / cand.size + cand.whole_bytes
            back = cand.output_bytes * (largest / cand.size if cand.rule.combine == "concat" else 1.0)
            estimate = (slice_time + whole * _part_ratio(cand, largest, graph.cost[i]) + combine_time
                        + float(cluster.mean_transfer_time(moved + back)))
            if best is None or estimate < best[0]:
                best = (estimate, k)
        if best and best[0] < whole * (1 - min_gain):
            gain = whole - best[0]
            if cand.op not in decisions or gain > decisions[cand.op].estimated_gain:
                decisions[cand.op] = SplitDecision(cand, best[1], gain)
    return list(decisions.values())


def _mean(values) -> float:
    """``float(numpy.mean(values))``; of one value without numpy's overhead (every
    split candidate asks, on a cluster of one device type), ``x + 0.0`` as numpy's
    sum makes it (a zero's sign included)."""
    if len(values) == 1:
        return float(values[0]) + 0.0
    return float(np.mean(values))


def _part_ratio(cand, extent, whole) -> float:
    """A part's cost over the whole op's, averaged over the device types that run it
    (``extent / size`` where the whole op costs nothing)."""
    whole = np.asarray(whole, dtype=np.float64)
    if len(whole) == 1:  # one device type: the same tests and division, on floats
        w = float(whole[0])
        if not (math.isfinite(w) and w > 0):
            return extent / cand.size
        return _mean((float(cand.part_cost(extent, whole)[0]) / w,))
    runs = np.isfinite(whole) & (whole > 0)
    if not runs.any():
        return extent / cand.size
    return float(np.mean(cand.part_cost(extent, whole)[runs] / whole[runs]))


def schedule_with_splits(schedule_whole, graph: OpGraph, cluster, enabled=True, **plan_options):
    """Schedule ``graph`` whole and split; return the faster schedule.

    ``schedule_whole(graph, cluster) -> Schedule`` is the algorithm's own
    search. When :func:`plan_splits` (given ``plan_options``) decides some
    splits, the split graph is scheduled too and kept only if its predicted
    step is shorter, so splitting never makes a schedule worse; with
    ``enabled=False`` only the whole graph is scheduled. The result's
    ``info`` gains ``splits`` (the decisions kept, possibly none),
    ``splits_planned`` and, when split, ``unsplit_makespan``; when both
    schedules were made and fit memory, ``split_alternative``: ``("without
    splits", the whole graph's schedule)`` when the split one was kept,
    ``("with splits", the split one)`` when it was not (a runner-up that
    :func:`fddps.tf.place` with ``verify`` times on the devices).
    """
    def rank(schedule):  # schedules within memory first, then the faster
        return (memory_overflow(schedule) is not None, schedule.makespan)

    result = schedule_whole(graph, cluster)
    decisions = plan_splits(graph, cluster, **plan_options) if enabled else []
    if decisions:
        try:
            split_result = schedule_whole(apply_splits(graph, decisions), cluster)
        except InfeasibleError:  # the split graph's memory does not fit; the whole one did
            split_result = None
        if split_result is not None:
            whole_rank, split_rank = rank(result), rank(split_result)
            split_result.info.update(splits=decisions, unsplit_makespan=result.makespan)
            if split_rank < whole_rank:
                if not whole_rank[0]:
                    split_result.info["split_alternative"] = ("without splits", result)
                result = split_result
            elif not split_rank[0]:
                result.info["split_alternative"] = ("with splits", split_result)
    result.info.setdefault("splits", [])
    result.info["splits_planned"] = len(decisions)
    return result
