"""Replay a placement on a cluster and predict one step's timeline.

Two entry points:

- :func:`replay` times a placement *and* a per-device order: every op starts as
  soon as its inputs have arrived and the op before it on its device is done.
  Schedules are timed by it, which is why a schedule's makespan and the
  simulator's agree exactly.
- :func:`simulate` also works without an order: each device then runs, whenever
  it is free, the ready op that comes first in topological order (the
  first-in-first-out behaviour of TensorFlow's executor). It returns a
  :class:`Timeline` with busy time, transfer volume per link and peak memory.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .errors import GraphError, InvalidScheduleError


def _device_array(graph, cluster, placement):
    """Device index per op from a mapping of op name -> device, or a sequence."""
    if isinstance(placement, Mapping):
        missing = [name for name in graph.names if name not in placement]
        if missing:
            raise GraphError(f"the placement has no device for op {missing[0]!r}"
                             f" ({len(missing)} ops unplaced)")
        dev = [cluster.device_index(placement[name]) for name in graph.names]
    else:
        dev = [cluster.device_index(d) for d in placement]
        if len(dev) != graph.num_ops:
            raise GraphError(f"the placement has {len(dev)} entries for {graph.num_ops} ops")
    return np.asarray(dev, dtype=np.int64)


def _edge_comm(graph, cluster, device):
    """Transfer time of every edge under a placement (0 inside a device)."""
    s, d = device[graph.src], device[graph.dst]
    comm = cluster.latency[s, d] + graph.bytes * cluster.inv_bandwidth[s, d]
    return np.where(s == d, 0.0, comm)


def replay(graph, cluster, device, order, exec_time=None):
    """Start and finish time of every op under a placement and per-device order.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    device : array of int, shape (n,)
        Device index per op.
    order : sequence of arrays of int
        For each device, the ops it runs, first to last.
    exec_time : array (n, m), optional
        ``graph.exec_times(cluster)``, if already computed.

    Returns
    -------
    start, finish : arrays of float, shape (n,)

    Raises
    ------
    InvalidScheduleError
        If ``order`` does not list each op once on its own device, or if it
        contradicts the graph's dependencies (the step would deadlock).
    """
    n = graph.num_ops
    device = np.asarray(device, dtype=np.int64)
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    dur = et[np.arange(n), device]
    prev_on_device = np.full(n, -1, dtype=np.int64)
    seen = np.zeros(n, dtype=bool)
    for k, seq in enumerate(order):
        seq = np.asarray(seq, dtype=np.int64)
        if seq.size and np.any(device[seq] != k):
            bad = int(seq[device[seq] != k][0])
            raise InvalidScheduleError(f"op {graph.names[bad]!r} is ordered on device "
                                       f"{cluster.names[k]!r} but placed on {cluster.names[device[bad]]!r}")
        if np.any(seen[seq]) or len(np.unique(seq)) != seq.size:
            raise InvalidScheduleError(f"an op is listed twice in the order of device {cluster.names[k]!r}")
        seen[seq] = True
        prev_on_device[seq[1:]] = seq[:-1]
    if not seen.all():
        bad = int(np.flatnonzero(~seen)[0])
        raise InvalidScheduleError(f"op {graph.names[bad]!r} is missing from the order of its device")

    comm = _edge_comm(graph, cluster, device)
    # Kahn's algorithm over graph edges plus "previous op on the same device".
    indeg = np.diff(graph.pred_ptr) + (prev_on_device >= 0)
    next_on_device = np.full(n, -1, dtype=np.int64)
    has_prev = prev_on_device >= 0
    next_on_device[prev_on_device[has_prev]] = np.flatnonzero(has_prev)
    ready = np.zeros(n)
    start = np.zeros(n)
    finish = np.zeros(n)
    indeg_l, ready_l = indeg.tolist(), ready.tolist()
    succ_ptr, succ_idx, succ_eid = graph.succ_ptr.tolist(), graph.succ_idx.tolist(), graph.succ_eid.tolist()
    comm_l, dur_l, nxt = comm.tolist(), dur.tolist(), next_on_device.tolist()
    stack = [i for i in range(n) if indeg_l[i] == 0]
    done = 0
    start_l, finish_l = [0.0] * n, [0.0] * n
    while stack:
        i = stack.pop()
        done += 1
        s = ready_l[i]
        f = s + dur_l[i]
        start_l[i], finish_l[i] = s, f
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            t = f + comm_l[succ_eid[p]]
            if t > ready_l[j]:
                ready_l[j] = t
            indeg_l[j] -= 1
            if indeg_l[j] == 0:
                stack.append(j)
        j = nxt[i]
        if j >= 0:
            if f > ready_l[j]:
                ready_l[j] = f
            indeg_l[j] -= 1
            if indeg_l[j] == 0:
                stack.append(j)
    if done < n:
        stuck = int(np.flatnonzero(np.asarray(indeg_l) > 0)[0])
        raise InvalidScheduleError(
            f"the per-device order contradicts the graph's dependencies: op "
            f"{graph.names[stuck]!r} on {cluster.names[device[stuck]]!r} can never start")
    start[:] = start_l
    finish[:] = finish_l
    return start, finish


def fifo_order(graph, cluster, device, exec_time=None):
    """Per-device order a first-in-first-out executor would follow.

    Whenever a device is free it takes, among its ops whose inputs have
    arrived, the one earliest in the graph's topological order; if none has
    arrived, the next to arrive. An event simulation: each op waits in its
    device's heap of pending ops (by arrival), then of available ops (by
    topological rank), so the cost is ``O((n + e) log n)``.

    Returns
    -------
    list of arrays of int, one per device.
    """
    n, m = graph.num_ops, cluster.num_devices
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    device = np.asarray(device, dtype=np.int64)
    dur = et[np.arange(n), device].tolist()
    comm = _edge_comm(graph, cluster, device).tolist()
    rank = np.empty(n, dtype=np.int64)
    rank[graph.topo] = np.arange(n)
    rank = rank.tolist()
    dev = device.tolist()
    indeg = np.diff(graph.pred_ptr).tolist()
    ready = [0.0] * n
    free = [0.0] * m
    succ_ptr, succ_idx, succ_eid = graph.succ_ptr.tolist(), graph.succ_idx.tolist(), graph.succ_eid.tolist()
    pending = [[] for _ in range(m)]    # (arrival, rank, op): inputs not all there yet
    available = [[] for _ in range(m)]  # (rank, op): inputs there, waiting for the device
    events = []                         # (time, device): the device may start something
    for i in range(n):
        if indeg[i] == 0:
            heapq.heappush(pending[dev[i]], (0.0, rank[i], i))
    for d in range(m):
        if pending[d]:
            heapq.heappush(events, (0.0, d))
    order = [[] for _ in range(m)]
    while events:
        t, d = heapq.heappop(events)
        if t < free[d]:
            continue  # stale: the device got busy since
        waiting, avail = pending[d], available[d]
        while waiting and waiting[0][0] <= t:
            _, r, i = heapq.heappop(waiting)
            heapq.heappush(avail, (r, i))
        if not avail:
            if waiting:
                heapq.heappush(events, (waiting[0][0], d))
            continue
        _, i = heapq.heappop(avail)
        f = t + dur[i]
        free[d] = f
        order[d].append(i)
        heapq.heappush(events, (f, d))
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            a = f + comm[succ_eid[p]]
            if a > ready[j]:
                ready[j] = a
            indeg[j] -= 1
            if indeg[j] == 0:
                dj = dev[j]
                heapq.heappush(pending[dj], (ready[j], rank[j], j))
                heapq.heappush(events, (max(ready[j], free[dj]), dj))
    return [np.asarray(seq, dtype=np.int64) for seq in order]


@dataclass(frozen=True)
class Timeline:
    """A predicted step: what :func:`simulate` returns.

    Attributes
    ----------
    makespan : float
        Seconds from the first op's start to the last op's finish.
    ops : pandas.DataFrame
        One row per op: ``op``, ``device``, ``start``, ``finish``.
    busy : pandas.Series
        Seconds each device computes, by device name.
    transfers : pandas.DataFrame
        One row per link used: ``src``, ``dst``, ``bytes``, ``tensors``, ``seconds``.
    peak_memory : pandas.Series
        Highest bytes held at once on each device, by device name.
    """

    makespan: float
    ops: pd.DataFrame
    busy: pd.Series
    transfers: pd.DataFrame
    peak_memory: pd.Series

    @property
    def utilization(self) -> pd.Series:
        """Fraction of the makespan each device is busy."""
        return self.busy / self.makespan if self.makespan > 0 else self.busy * 0.0


def peak_memory(graph, cluster, device, start, finish, comm=None):
    """Highest bytes held at once on each device during a step.

    ``memory`` is held for the whole step; an op's ``transient`` bytes from its
    start until its last consumer on that device finishes; a tensor received
    from another device from its arrival until its consumer finishes.
    """
    m = cluster.num_devices
    peak = np.bincount(device, weights=graph.memory, minlength=m).astype(np.float64)
    comm = _edge_comm(graph, cluster, device) if comm is None else comm
    # End of life of each op's outputs on its own device: its consumers there.
    release = finish.copy()
    same = device[graph.src] == device[graph.dst]
    np.maximum.at(release, graph.src[same], finish[graph.dst[same]])
    cross = ~same & (graph.bytes > 0)
    t = np.concatenate([start, release, finish[graph.src[cross]] + comm[cross], finish[graph.dst[cross]]])
    dev = np.concatenate([device, device, device[graph.dst[cross]], device[graph.dst[cross]]])
    b = np.concatenate([graph.transient, -graph.transient, graph.bytes[cross], -graph.bytes[cross]])
    # Frees before allocations at the same instant.
    keys = np.lexsort((b, t, dev))
    dev, b = dev[keys], b[keys]
    for k in range(m):
        sel = b[dev == k]
        if sel.size:
            peak[k] += max(0.0, float(np.max(np.cumsum(sel))))
    return peak


def simulate(graph, cluster, placement, order=None):
    """Replay ``placement`` (and ``order``, if given) and return the step's timeline.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    placement : mapping of op name -> device name, or sequence of device names/indices
    order : sequence of sequences, optional
        Per device (in cluster order), the ops it runs, first to last, by op
        name or index. Without it, each device runs ready ops first-in-first-out
        (see :func:`fifo_order`).

    Returns
    -------
    Timeline

    Raises
    ------
    GraphError
        If the placement misses an op.
    ClusterError
        If it names an unknown device.
    InvalidScheduleError
        If ``order`` is inconsistent with the placement or the dependencies.

    Examples
    --------
    >>> from fddps import OpGraph, Cluster
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 1e6)])
    >>> c = Cluster.homogeneous(2, bandwidth=1e6)
    >>> simulate(g, c, {"a": "0", "b": "1"}).makespan
    3.0
    """
    device = _device_array(graph, cluster, placement)
    et = graph.exec_times(cluster)
    dur = et[np.arange(graph.num_ops), device]
    if np.any(np.isinf(dur)):
        bad = int(np.flatnonzero(np.isinf(dur))[0])
        raise InvalidScheduleError(f"op {graph.names[bad]!r} cannot run on device "
                                   f"{cluster.names[device[bad]]!r} (no cost for its type)")
    if order is None:
        order = fifo_order(graph, cluster, device, et)
    else:
        order = [np.asarray([graph.index[o] if o in graph.index else int(o) for o in seq],
                            dtype=np.int64) for seq in order]
    start, finish = replay(graph, cluster, device, order, et)
    comm = _edge_comm(graph, cluster, device)
    names = list(cluster.names)
    ops = pd.DataFrame({"op": list(graph.names), "device": [names[k] for k in device],
                        "start": start, "finish": finish})
    busy = pd.Series(np.bincount(device, weights=dur, minlength=len(names)), index=names, name="busy")
    cross = device[graph.src] != device[graph.dst]
    links = pd.DataFrame({"src": device[graph.src][cross], "dst": device[graph.dst][cross],
                          "bytes": graph.bytes[cross], "seconds": comm[cross]})
    transfers = (links.groupby(["src", "dst"]).agg(bytes=("bytes", "sum"), tensors=("bytes", "size"),
                                                   seconds=("seconds", "sum")).reset_index())
    transfers["src"] = [names[k] for k in transfers["src"]]
    transfers["dst"] = [names[k] for k in transfers["dst"]]
    peak = pd.Series(peak_memory(graph, cluster, device, start, finish, comm), index=names,
                     name="peak_memory")
    makespan = float(finish.max() - start.min()) if graph.num_ops else 0.0
    return Timeline(makespan, ops, busy, transfers, peak)
