"""Local search over device assignments, scored by the replay.

Not in the FD-DPS paper: a post-pass ``fddps`` adds (``FDDPS(local_search=True)``)
because list schedulers place greedily and cannot take a placement back. When
transfers cost more than the ops (high communication-to-computation ratio),
the greedy pass spreads entry ops and their descendants over every free
device at time 0, and every later edge pays a transfer; the optimum keeps
most ops together and moves off only what runs beside them cheaply. Moving
single ops between devices, each move judged by replaying the whole step,
walks from either placement towards the other.

The search: from a schedule, for each op in order of start time, try moving
it (with its colocation group) to each other device it may run on, keeping
every device's order by the current start times (the moved op slots in where
it started; :meth:`Schedule.from_start_times`), and replay. A move is kept
when it lowers ``(makespan, sum of finish times)`` and the step's peak memory
fits (:func:`~fddps.algorithms.base.memory_overflow`); the second term lets
the search cross plateaus where unloading the busiest device does not yet
shorten the step. Sweeps repeat until one keeps no move or the budget of
replays is spent. Empty devices interchangeable with one already tried are
skipped (:func:`fddps.bounds.identical_device_classes`).

This is a first-improvement descent in the move neighbourhood of the
local-search schedulers of the DAG-scheduling literature (e.g. Wu, Shu and Gu,
"Efficient local search far away from the optima", 2001).
"""

from __future__ import annotations

import numpy as np

from ..bounds import identical_device_classes
from ..schedule import Schedule
from .base import memory_overflow


def move_search(schedule: Schedule, allowed, *, max_replays: int = 2000, exec_time=None,
                tol: float = 1e-9):
    """Improve ``schedule`` by moving single ops (or colocation groups) between devices.

    Parameters
    ----------
    schedule : Schedule
        The starting point (its placement, and its start times as the order).
    allowed : list of list of int
        Per op, the devices it may run on (:attr:`PlacementState.allowed`).
    max_replays : int
        At most this many candidate schedules are replayed.
    exec_time : array (n, m), optional
    tol : float
        Relative improvement below which a move is not taken.

    Returns
    -------
    (Schedule, dict)
        The best schedule found (``schedule`` itself if no move helped) and
        statistics: ``local_search_replays``, ``local_search_moves``.

    Examples
    --------
    >>> from fddps import OpGraph, Cluster, Schedule
    >>> g = OpGraph(list("abc"), [1.0, 1.0, 1.0], [("a", "b", 10.0), ("a", "c", 10.0)])
    >>> c = Cluster.homogeneous(2, bandwidth=1.0)
    >>> spread = Schedule.from_order(g, c, [0, 0, 1], [[0, 1], [2]])
    >>> best, stats = move_search(spread, [[0, 1]] * 3)
    >>> spread.makespan, best.makespan
    (12.0, 3.0)
    """
    graph, cluster = schedule.graph, schedule.cluster
    n, m = graph.num_ops, cluster.num_devices
    stats = {"local_search_replays": 0, "local_search_moves": 0}
    if n == 0 or m == 1:
        return schedule, stats
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    classes = identical_device_classes(graph, cluster, et, allowed, keep_singletons=True)
    class_of = np.empty(m, dtype=np.int64)
    for c, members in enumerate(classes):
        class_of[members] = c
    groups = graph.colocation
    members_of = {}
    for i, g in enumerate(groups.tolist()):
        if g >= 0:
            members_of.setdefault(g, []).append(i)
    check_memory = bool(np.isfinite(cluster.memory).any())
    succ = [graph.successors(i).tolist() for i in range(n)]
    pred = [graph.predecessors(i).tolist() for i in range(n)]

    def score(s):
        return (s.makespan, float(s.finish.sum()))

    # Candidates are scored by a plain-Python replay where links spend no device
    # time (the same times as Schedule's replay); a kept move is replayed by it.
    lean = not np.any(cluster.transfer_compute > 0)
    if lean:
        dur_rows = et.tolist()
        comm = edge_transfer_table(graph, cluster)
        rank = np.empty(n, dtype=np.int64)
        rank[graph.topo] = np.arange(n)
        rank = rank.tolist()

    def quick_score(device, hint):
        if not lean:
            return score(Schedule.from_start_times(graph, cluster, device, hint, exec_time=et))
        dev = device.tolist()
        hint = hint.tolist()
        keys = sorted(range(n), key=lambda i: (dev[i], hint[i], rank[i]))
        order = [[] for _ in range(m)]
        for i in keys:
            order[dev[i]].append(i)
        times = replay_table(graph, dev, order, dur_rows, comm)
        if times is None:
            return None
        return (max(times[1]), float(sum(times[1])))

    best = schedule
    best_score = score(best)
    improved = True
    while improved and stats["local_search_replays"] < max_replays:
        improved = False
        for i in np.argsort(best.start, kind="stable").tolist():
            if stats["local_search_replays"] >= max_replays:
                break
            here = int(best.device[i])
            same = best.device == here
            kids = [j for j in succ[i] if same[j]]
            parents = [j for j in pred[i] if same[j]]
            # The op alone, with its children there, or with its parents there:
            # a cluster joined by costly edges moves together or not at all.
            mover_sets = [[i]] + [[i] + js for js in (kids, parents) if js]
            busy = np.bincount(best.device, minlength=m) > 0
            moved = False
            for ops in mover_sets:
                movers = sorted({j for op in ops for j in (members_of.get(int(groups[op]), [op])
                                                          if groups[op] >= 0 else [op])})
                targets = set.intersection(*(set(allowed[j]) for j in movers))
                tried_empty = set()
                for k in sorted(targets):
                    if k == here or stats["local_search_replays"] >= max_replays:
                        continue
                    if not busy[k]:
                        if class_of[k] in tried_empty:
                            continue  # an empty twin of a device already tried
                        tried_empty.add(class_of[k])
                    device = best.device.copy()
                    device[movers] = k
                    stats["local_search_replays"] += 1
                    cand_score = quick_score(device, best.start)
                    if cand_score is None:
                        continue
                    if (cand_score[0] < best_score[0] * (1 - tol)
                            or (cand_score[0] <= best_score[0] * (1 + tol)
                                and cand_score[1] < best_score[1] * (1 - tol))):
                        candidate = Schedule.from_start_times(graph, cluster, device, best.start,
                                                              best.algorithm, exec_time=et)
                        cand_score = score(candidate)
                        if check_memory and memory_overflow(candidate) is not None:
                            continue
                        best, best_score, improved, moved = candidate, cand_score, True, True
                        stats["local_search_moves"] += 1
                        break
                if moved:
                    break
    return best, stats


def edge_transfer_table(graph, cluster) -> np.ndarray:
    """Transfer time of every edge: shape ``(e,)`` when every link is alike (the time
    between any two distinct devices), else ``(e, m, m)`` (0 on the diagonal)."""
    m = cluster.num_devices
    if m == 1:
        return np.zeros(graph.num_edges)
    off = ~np.eye(m, dtype=bool)
    lat, inv = cluster.latency[off], cluster.inv_bandwidth[off]
    if np.all(lat == lat[0]) and np.all(inv == inv[0]):
        return lat[0] + graph.bytes * inv[0]
    t = cluster.latency[None] + graph.bytes[:, None, None] * cluster.inv_bandwidth[None]
    t[:, ~off] = 0.0
    return t


def replay_table(graph, device, order, dur, comm):
    """Start and finish of every op under a placement and per-device order, as
    :func:`fddps.simulate.replay` times them on links that spend no device time,
    from tables: ``dur`` ``(n, m)`` and ``comm`` from :func:`edge_transfer_table`
    (integer tables give integer times). Plain Python, for the many small replays
    of a search. Returns ``(start, finish)`` lists, or ``None`` if the orders deadlock.
    """
    n = graph.num_ops
    prev = [-1] * n
    nxt = [-1] * n
    for seq in order:
        seq = list(seq)
        for a, b in zip(seq, seq[1:]):
            prev[b], nxt[a] = a, b
    waiting = np.diff(graph.pred_ptr).tolist()
    for i in range(n):
        waiting[i] += prev[i] >= 0
    device = [int(d) for d in device]
    start, end = [0] * n, [0] * n
    stack = [i for i in range(n) if waiting[i] == 0]
    sp, si, se = graph.succ_ptr.tolist(), graph.succ_idx.tolist(), graph.succ_eid.tolist()
    uniform = comm.ndim == 1
    comm_l = comm.tolist()
    done = 0
    while stack:
        i = stack.pop()
        done += 1
        di = device[i]
        end[i] = start[i] + dur[i][di]
        for q in range(sp[i], sp[i + 1]):
            j, e = si[q], se[q]
            dj = device[j]
            w = 0 if di == dj else comm_l[e] if uniform else comm_l[e][di][dj]
            if end[i] + w > start[j]:
                start[j] = end[i] + w
            waiting[j] -= 1
            if waiting[j] == 0:
                stack.append(j)
        j = nxt[i]
        if j >= 0:
            if end[i] > start[j]:
                start[j] = end[i]
            waiting[j] -= 1
            if waiting[j] == 0:
                stack.append(j)
    return (start, end) if done == n else None
