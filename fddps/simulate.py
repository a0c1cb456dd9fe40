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

Transfers. A tensor sent from device ``s`` to ``d`` takes ``T = latency +
bytes / bandwidth`` (:class:`~fddps.cluster.Cluster`). Where the cluster says
the end devices move it themselves (``Cluster.transfer_compute[s, d] = c > 0``:
CPU devices talking gRPC serialise, copy and parse every tensor on the cores
that also compute), a transfer is two extra tasks: a *send* of ``c * T / 2`` on
``s`` right after the producer, and a *receive* of ``c * T / 2`` on ``d`` right
before the first op there that reads it; between them the tensor spends
``(1 - c) * T`` on the wire. It is sent once per (producer, receiving device),
as TensorFlow's rendezvous does, and the devices cannot compute meanwhile, so
many small transfers slow both ends down. With ``c = 0`` (GPUs, whose copy
engines move data) every edge simply arrives ``T`` after its producer finishes.
Where the cluster has a per-transfer CPU cost fitted on many transfers at
once (``Cluster.transfer_cpu``), :func:`simulate` replays twice: the second
time a transfer's ``c`` depends on how many transfers of its link were in
flight with it (:func:`amortised_shares`); :func:`replay`, which times
schedules, keeps the cluster's ``c``.

Shared hardware. On a cluster whose devices share cores
(:class:`~fddps.cluster.SharedCores`) or whose transfers share link resources
(:class:`~fddps.cluster.LinkResource`), the replay is an event simulation
(:func:`_run_shared`): ops of devices sharing ``C`` cores progress at
``min(1, C / threads asked)`` (processor sharing), and transfers crossing a
resource split its bandwidth equally, so neither is ever driven past its
capacity. The executor's choice of order (:func:`executor_order`) still
assumes contention-free durations; the order is then replayed exactly.

Transfer threads. Where a group of shared cores has ``transfer_threads``
(TensorFlow workers on one machine, whose gRPC threads encode and parse
tensors while the inter-op thread computes), a device's sends and receives
leave its queue of ops for a queue of their own, in the order the device
reached them, and run as one more thread on the group's cores
(:func:`_transfer_lanes`): a transfer costs a device nothing while a core is
idle, and slows every op of the group while none is.
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



class _Flow:
    """The step as the simulator runs it: the graph's ops, then one send and one
    receive task per compute-charged transfer (see the module docstring).

    Attributes: ``n`` real ops, ``total`` tasks, ``dev`` and ``dur`` per task,
    successors in CSR form (``succ_ptr``, ``succ_idx``, ``succ_delay``: what
    the edge adds between the finish of one task and the earliest start of the
    next), and per transfer ``t``: ``producer``, ``dst`` device, ``bytes``,
    ``seconds`` (its ``T``) and ``share`` (its ``c``; ``share=`` gives one
    per transfer instead of the cluster's, see :func:`amortised_shares`). Per graph edge:
    ``edge_seconds``, its transfer time under the placement (0 inside a
    device), and ``edge_transfer``, the transfer that carries it or -1.

    With ``wires=True`` (a cluster whose transfers share link resources) every
    transfer between devices is one, compute-charged or not (its send and
    receive then last 0 where ``c = 0``), and between its send and receive
    there is a *wire* task (indices ``wires``, device -1) that moves
    ``wire_bytes = (1 - c) * bytes`` after ``wire_latency = (1 - c) *
    latency``, at most at the pair's bandwidth ``wire_cap``, over the
    resources ``wire_path`` (indices into ``cluster.link_resources``).
    """

    def __init__(self, graph, cluster, device, dur, wires=False, share=None):
        n, m = graph.num_ops, cluster.num_devices
        self.n, self.m = n, m
        src, dst = graph.src, graph.dst
        s_dev, d_dev = device[src], device[dst]
        share_of_edge = cluster.transfer_compute[s_dev, d_dev]
        charged = (s_dev != d_dev) & ((share_of_edge > 0) | wires)
        comm = self.edge_seconds = _edge_comm(graph, cluster, device)
        self.edge_transfer = np.full(graph.num_edges, -1, dtype=np.int64)
        keys, inverse = np.unique(src[charged] * m + d_dev[charged], return_inverse=True)
        t_count = keys.size
        self.edge_transfer[charged] = inverse
        self.producer = keys // m
        self.dst = keys % m
        nbytes = np.zeros(t_count)
        np.maximum.at(nbytes, inverse, graph.bytes[charged])  # one tensor per producer and device
        s_t = device[self.producer]
        self.bytes = nbytes
        self.seconds = cluster.latency[s_t, self.dst] + nbytes * cluster.inv_bandwidth[s_t, self.dst]
        self.share = (cluster.transfer_share(s_t, self.dst, nbytes) if share is None
                      else np.asarray(share, dtype=float))
        self.total = n + (3 if wires else 2) * t_count
        sends, recvs = n + np.arange(t_count), n + t_count + np.arange(t_count)
        self.sends, self.recvs = sends, recvs
        half = self.share * self.seconds / 2
        plain = ~charged
        if wires:
            self.wires = n + 2 * t_count + np.arange(t_count)
            self.wire_latency = (1.0 - self.share) * cluster.latency[s_t, self.dst]
            self.wire_bytes = (1.0 - self.share) * nbytes
            self.wire_cap = cluster.bandwidth[s_t, self.dst]
            self.wire_path = [cluster.link_path[a][b] for a, b in zip(s_t.tolist(), self.dst.tolist())]
            self.dev = np.concatenate([device, s_t, self.dst, np.full(t_count, -1)])
            self.dur = np.concatenate([dur, half, half, np.zeros(t_count)])
            e_src = np.concatenate([src[plain], self.producer, sends, self.wires, recvs[inverse]])
            e_dst = np.concatenate([dst[plain], sends, self.wires, recvs, dst[charged]])
            e_delay = np.concatenate([comm[plain], np.zeros(3 * t_count + int(charged.sum()))])
        else:
            self.wires = np.zeros(0, dtype=np.int64)
            self.dev = np.concatenate([device, s_t, self.dst])
            self.dur = np.concatenate([dur, half, half])
            e_src = np.concatenate([src[plain], self.producer, sends, recvs[inverse]])
            e_dst = np.concatenate([dst[plain], sends, recvs, dst[charged]])
            e_delay = np.concatenate([comm[plain], np.zeros(t_count),
                                      (1.0 - self.share) * self.seconds, np.zeros(int(charged.sum()))])
        by_src = np.argsort(e_src, kind="stable")
        self.succ_ptr = np.searchsorted(e_src[by_src], np.arange(self.total + 1))
        self.succ_idx = e_dst[by_src]
        self.succ_delay = e_delay[by_src]
        self.indeg = np.bincount(e_dst, minlength=self.total)
        self._charged_edges = np.flatnonzero(charged)
        self._graph = graph

    def order_tasks(self, order):
        """Per device, the tasks in the order it runs them: ``order``'s ops, each
        send right after its producer, each receive right before the first op
        of the device that reads the tensor."""
        if self.total == self.n:
            return [np.asarray(seq, dtype=np.int64) for seq in order]
        pos = np.zeros(self.n)
        for seq in order:
            seq = np.asarray(seq, dtype=np.int64)
            pos[seq] = np.arange(seq.size)
        t_count = self.sends.size
        first_pos = np.full(t_count, np.inf)
        g = self._graph
        e = self._charged_edges
        np.minimum.at(first_pos, self.edge_transfer[e], pos[g.dst[e]])
        task = np.concatenate([np.arange(self.n), self.sends, self.recvs])
        # Sends (just after their producer) before receives (just before their
        # reader): at the same gap a receive may wait on a send, never the reverse.
        key = np.concatenate([pos, pos[self.producer] + 0.25, first_pos - 0.25])
        sub = np.concatenate([np.zeros(self.n), self.dst.astype(float), self.producer.astype(float)])
        dev = self.dev[:task.size]  # wires are on no device
        out = []
        for k in range(len(order)):
            sel = np.flatnonzero(dev == k)
            out.append(task[sel[np.lexsort((sub[sel], key[sel]))]])
        return out


def amortised_shares(flow, start, finish, cluster):
    """Per compute-charged transfer, its share of ``T`` with the concurrent transfers it overlaps.

    The link's per-transfer CPU cost was measured at the two ends of a range:
    a transfer alone (its whole ``T``, ``transfer_compute * T / 2`` at each end)
    and many at once (``transfer_cpu``: each one more costs only
    ``cpu_latency + bytes / cpu_bandwidth``, as gRPC overlaps their fixed
    costs). A transfer that shares its link with ``k - 1`` others in flight
    (from its send's start to its receive's end, same source and destination
    device) pays the many-at-once share plus ``1 / k`` of the difference:
    the alone cost at ``k = 1``, the marginal one as ``k`` grows.

    Why: on the real two-worker cluster a transfer alone costs the tasks
    250-290 us of CPU, several times the many-at-once fit (44-65 us), and a
    training step's transfers overlap a few at a time, not the 8-128 at once
    the fit measured. Replaying three runs' measured placements
    (``experiments.real_cluster --replay``), this put 51 / 36 / 29 rows
    within 15% of the measured speed-up, against 46 / 30 / 27 with the
    many-at-once cost alone. On a fresh run (twelve network-batch cells)
    the two tied, 50 and 51 of 66, but erred opposite ways: 14 of this
    model's 16 misses predict a spread slower than measured (ResNets' large
    transfers), where 13 of the many-at-once cost's 15 predicted it faster
    (the networks with thousands of small transfers), the error that makes
    a placement slower than one device. It is not the fit's curve for ``k`` transfers
    issued at once, which the many-at-once cost alone reproduces: 128 of
    them take 1.19x the fitted line here (the sends' CPU serialises them,
    so each overlaps fewer than 128).

    Parameters
    ----------
    flow : _Flow
        The flow a first replay ran, with the cluster's (many-at-once) shares.
    start, finish : arrays of float
        That replay's task times.
    cluster : Cluster

    Returns
    -------
    array of float, one share per transfer of ``flow``.
    """
    share = flow.share
    if flow.sends.size == 0:
        return share
    s_t = flow.dev[flow.sends]
    alone = cluster.transfer_compute[s_t, flow.dst]
    begin, end = start[flow.sends], finish[flow.recvs]
    in_flight = np.ones(flow.sends.size)
    channel = s_t * cluster.num_devices + flow.dst
    for c in np.unique(channel):
        sel = np.flatnonzero(channel == c)
        # transfers j with begin_j < end_i and end_j > begin_i (i itself included)
        in_flight[sel] = (np.searchsorted(np.sort(begin[sel]), end[sel], side="left")
                          - np.searchsorted(np.sort(end[sel]), begin[sel], side="right"))
    return share + (alone - share) / np.maximum(in_flight, 1.0)


def _on_transfer_threads(flow, cluster):
    """Per task of ``flow``: whether it is a send or receive of a device with a transfer
    thread (``Cluster.transfer_thread``)."""
    on = np.zeros(flow.total, dtype=bool)
    for tasks in (flow.sends, flow.recvs):
        on[tasks[cluster.transfer_thread[flow.dev[tasks]]]] = True
    return on


def _transfer_lanes(flow, order, cluster):
    """Per-device task ``order`` with the sends and receives of devices that have
    a transfer thread (``Cluster.transfer_thread``) moved to lanes of their own,
    appended after the devices' lanes, each in the order its device had them.

    Why: a TensorFlow worker's gRPC threads encode and parse the tensors it
    sends and receives while its inter-op thread computes. On two workers
    of one inter-op thread on a 2-core machine, traced steps of PNASNet-Mobile's
    strategies (batch 8, thousands of transfers) ran each worker's ops for
    122-170 ms against the 59-98 ms the cost model gives them: something took
    the cores from the ops while they ran, which a device queue, doing its
    transfers between its ops, cannot show. Replaying two runs' measured
    placements (``experiments.real_cluster --replay``), a transfer thread per
    worker on the machine's 2 cores put 52 of 66 and 5 of 6 rows within 15%
    of the measured speed-up, against 50 and 4 with the transfers in the queue.

    Returns
    -------
    list of arrays of int: the devices' lanes, then one lane per device with
    a transfer thread (possibly empty).
    """
    moved = _on_transfer_threads(flow, cluster)
    if not moved.any():
        return order
    lanes = [np.asarray(seq, dtype=np.int64) for seq in order]
    return [seq[~moved[seq]] for seq in lanes] + [seq[moved[seq]] for seq in lanes]


def _run(flow, order):
    """Start and finish of every task of ``flow`` under per-device ``order`` (of
    tasks), by Kahn's algorithm over the flow's edges plus "previous task on the
    same device". On a deadlock: ``(None, inputs each task still waits for)``."""
    n = flow.total
    prev_on_device = np.full(n, -1, dtype=np.int64)
    for seq in order:
        prev_on_device[seq[1:]] = seq[:-1]
    indeg = flow.indeg + (prev_on_device >= 0)
    next_on_device = np.full(n, -1, dtype=np.int64)
    has_prev = prev_on_device >= 0
    next_on_device[prev_on_device[has_prev]] = np.flatnonzero(has_prev)
    indeg_l, ready_l = indeg.tolist(), [0.0] * n
    succ_ptr, succ_idx = flow.succ_ptr.tolist(), flow.succ_idx.tolist()
    delay, dur_l, nxt = flow.succ_delay.tolist(), flow.dur.tolist(), next_on_device.tolist()
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
            t = f + delay[p]
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
        return None, np.asarray(indeg_l)
    return np.asarray(start_l), np.asarray(finish_l)

def _run_shared(flow, order, cluster, trace=None):
    """:func:`_run` on a cluster that shares cores or links: an event simulation.

    Tasks start as in :func:`_run` (inputs there, the task before them on their
    device done). What changes is how fast they progress:

    - A task on a device of a :class:`~fddps.cluster.SharedCores` group of
      ``C`` cores, while the group runs tasks wanting ``c_1 .. c_k`` threads
      (``threads`` of their devices), progresses at rate ``min(1, C / sum c_j)``
      (processor sharing: the cores are split in proportion to the threads
      asking, and a task never runs faster than alone). So the cores in use,
      ``sum c_j * rate``, never exceed ``C``. Kleinrock's processor-sharing
      queue; it is how an OS scheduler splits cores among more runnable
      threads than cores, and how TensorFlow's CPU devices of one process share
      one intra-op thread pool.
    - A send or receive on a transfer thread (:func:`_transfer_lanes`) is a
      task of its device's group wanting one thread.
    - A wire (a transfer on a cluster with link resources) first waits its
      latency, then moves its bytes at rate ``min(pair bandwidth, min over
      the resources r it crosses of B_r / n_r)``, ``n_r`` the wires moving
      bytes through ``r``: each resource's bandwidth is split equally among
      its transfers, so a resource never carries more than ``B_r``.
    - A wire crossing a first-in-first-out resource (``LinkResource.fifo``,
      a gRPC channel) waits until every such resource on its path is free
      and no wire that became ready before it waits for one of them; it then
      holds them for its whole latency and bytes (so ``n_r`` is 1 there).
      Small tensors queue behind large ones sent first: head-of-line blocking.

    Rates change only when a task starts or finishes, so the simulation jumps
    from event to event; a task alone finishes exactly ``duration`` (or
    ``latency + bytes / bandwidth``) after it starts, as in :func:`_run`.
    Wires that start or finish at one instant are re-rated once, after every
    event of that instant (the rates between would last no time): the parts
    of a data-parallel step move their tensors in lockstep, and re-rating
    every wire of a resource at each join and each finish made replaying
    them quadratic in the wires a resource carries at once (each re-rating
    also leaves a stale event on the heap).

    ``trace``, a list, receives ``(time, task, rate)`` whenever a task's rate
    is set (0 when it finishes): what the tests check capacities with.
    Returns ``(start, finish)`` per task, or on a deadlock ``(None, inputs
    each task still waits for)``.
    """
    n = flow.total
    prev_on_device = np.full(n, -1, dtype=np.int64)
    for seq in order:
        prev_on_device[seq[1:]] = seq[:-1]
    indeg = (flow.indeg + (prev_on_device >= 0)).tolist()
    next_on_device = np.full(n, -1, dtype=np.int64)
    has_prev = prev_on_device >= 0
    next_on_device[prev_on_device[has_prev]] = np.flatnonzero(has_prev)
    nxt = next_on_device.tolist()
    succ_ptr, succ_idx = flow.succ_ptr.tolist(), flow.succ_idx.tolist()
    delay, dur = flow.succ_delay.tolist(), flow.dur.tolist()
    dev = flow.dev.tolist()
    group = [int(cluster.core_group[d]) if d >= 0 else -1 for d in dev]
    threads = [float(cluster.threads[d]) if d >= 0 else 0.0 for d in dev]
    for i in np.flatnonzero(_on_transfer_threads(flow, cluster)).tolist():
        threads[i] = 1.0  # a gRPC thread, not the device's intra-op pool
    cores = cluster.group_cores
    members = [set() for _ in cores]
    wire_of = {}
    if flow.wires.size:
        for w, t in enumerate(flow.wires.tolist()):
            wire_of[t] = w
        w_lat, w_bytes = flow.wire_latency.tolist(), flow.wire_bytes.tolist()
        w_cap, w_path = flow.wire_cap.tolist(), flow.wire_path
    res_bw = cluster.resource_bandwidth.tolist()
    on_resource = [set() for _ in res_bw]
    fifo = cluster.resource_fifo.tolist()
    holder = [-1] * len(res_bw)  # the wire a FIFO resource carries now, or -1
    queued = []                  # wires waiting for FIFO resources, in the order they became ready
    fifo_path = {}
    if flow.wires.size:
        for t_ in flow.wires.tolist():
            held = tuple(r for r in w_path[wire_of[t_]] if fifo[r])
            if held:
                fifo_path[t_] = held
    ready = [0.0] * n
    start, finish = [0.0] * n, [0.0] * n
    remaining, rate, since, version = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    # (time, kind, seq, task, version); kinds: 0 done, 1 latency over, 2 start.
    events = []
    seq_no = 0

    def push(t, kind, i, ver=0):
        nonlocal seq_no
        seq_no += 1
        heapq.heappush(events, (t, kind, seq_no, i, ver))

    def set_rate(i, r, t):
        """Progress of ``i`` up to ``t`` at its old rate, then ``r`` from ``t``."""
        if rate[i] > 0:
            remaining[i] -= rate[i] * (t - since[i])
            if remaining[i] < 0:
                remaining[i] = 0.0
        since[i], rate[i] = t, r
        version[i] += 1
        push(t + remaining[i] / r, 0, i, version[i])
        if trace is not None:
            trace.append((t, i, r))

    def regroup(g, t):
        want = sum(threads[i] for i in members[g])
        r = min(1.0, cores[g] / want) if want > 0 else 1.0
        for i in members[g]:
            if rate[i] != r:
                set_rate(i, r, t)

    def rewire(wires, t):
        for i in wires:
            w = wire_of[i]
            r = w_cap[w]
            for res in w_path[w]:
                share = res_bw[res] / len(on_resource[res])
                if share < r:
                    r = share
            if rate[i] != r:
                set_rate(i, r, t)

    def admit(t):
        """Start the queued wires whose FIFO resources are free, oldest first; a
        resource an older waiting wire wants is not given to a younger one."""
        wanted = set()
        still = []
        for i in queued:
            held = fifo_path[i]
            if any(holder[r] >= 0 or r in wanted for r in held):
                wanted.update(held)
                still.append(i)
                continue
            for r in held:
                holder[r] = i
            start[i] = t
            push(t + w_lat[wire_of[i]], 1, i)
        queued[:] = still

    for i in range(n):
        if indeg[i] == 0:
            push(0.0, 2, i)
    done = 0
    # Wires whose share of a resource changed at time ``pending_t``, re-rated once all
    # events at that time are handled: when many wires start or end at one instant (the
    # parts of a data-parallel step run in lockstep), re-rating every wire of a resource
    # at each of them would set rates that last no time, each pushing an event.
    pending, pending_t, moving = set(), 0.0, set()
    while events or pending:
        if pending and (not events or events[0][0] > pending_t):
            rewire(sorted(pending & moving), pending_t)
            pending.clear()
            continue
        t, kind, _, i, ver = heapq.heappop(events)
        if kind == 2:                                   # start
            start[i] = t
            if i in fifo_path:
                queued.append(i)
                admit(t)
            elif i in wire_of:
                w = wire_of[i]
                push(t + w_lat[w], 1, i)
            elif group[i] >= 0 and dur[i] > 0:
                remaining[i], rate[i] = dur[i], 0.0
                members[group[i]].add(i)
                regroup(group[i], t)
            else:
                push(t + dur[i], 0, i, version[i])
            continue
        if kind == 1:                                   # a wire's latency is over
            w = wire_of[i]
            if w_bytes[w] <= 0 or not np.isfinite(w_cap[w]) and not w_path[w]:
                push(t, 0, i, version[i])
                continue
            remaining[i], rate[i] = w_bytes[w], 0.0
            moving.add(i)
            pending.add(i)
            for res in w_path[w]:
                on_resource[res].add(i)
                pending |= on_resource[res]
            pending_t = t
            continue
        if ver != version[i]:
            continue                                    # its rate changed since
        finish[i] = t
        done += 1
        if trace is not None and rate[i] > 0:
            trace.append((t, i, 0.0))
        rate[i] = 0.0
        moving.discard(i)
        g = group[i]
        if g >= 0 and i in members[g]:
            members[g].discard(i)
            regroup(g, t)
        elif i in wire_of and w_path[wire_of[i]]:
            for res in w_path[wire_of[i]]:
                on_resource[res].discard(i)
                pending |= on_resource[res]
            pending_t = t
            if i in fifo_path:
                for r in fifo_path[i]:
                    holder[r] = -1
                admit(t)
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            a = t + delay[p]
            if a > ready[j]:
                ready[j] = a
            indeg[j] -= 1
            if indeg[j] == 0:
                push(ready[j], 2, j)
        j = nxt[i]
        if j >= 0:
            if t > ready[j]:
                ready[j] = t
            indeg[j] -= 1
            if indeg[j] == 0:
                push(ready[j], 2, j)
    if done < n:
        return None, np.asarray(indeg)
    return np.asarray(start), np.asarray(finish)


def replay(graph, cluster, device, order, exec_time=None, trace=None):
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
    trace : list, optional
        On a cluster that shares cores or links, receives ``(time, task,
        rate)`` at every change of a task's progress rate (tasks past ``n``
        are sends, receives and wires; see :func:`_run_shared`).

    Returns
    -------
    start, finish : arrays of float, shape (n,)
        On a cluster that shares hardware an op may take longer than its
        execution time: it ran slowed down by ops of devices sharing its cores.

    Raises
    ------
    InvalidScheduleError
        If ``order`` does not list each op once on its own device, or if it
        contradicts the graph's dependencies (the step would deadlock).
    """
    start, finish, _ = _replay_flow(graph, cluster, device, order, exec_time, trace)
    return start[:graph.num_ops], finish[:graph.num_ops]


def _check_order(graph, cluster, device, order):
    """Raise :class:`InvalidScheduleError` unless ``order`` lists each op once, on its device."""
    seen = np.zeros(graph.num_ops, dtype=bool)
    for k, seq in enumerate(order):
        if seq.size and np.any(device[seq] != k):
            bad = int(seq[device[seq] != k][0])
            raise InvalidScheduleError(f"op {graph.names[bad]!r} is ordered on device "
                                       f"{cluster.names[k]!r} but placed on {cluster.names[device[bad]]!r}")
        if np.any(seen[seq]) or len(np.unique(seq)) != seq.size:
            raise InvalidScheduleError(f"an op is listed twice in the order of device {cluster.names[k]!r}")
        seen[seq] = True
    if not seen.all():
        bad = int(np.flatnonzero(~seen)[0])
        raise InvalidScheduleError(f"op {graph.names[bad]!r} is missing from the order of its device")


def _replay_flow(graph, cluster, device, order, exec_time=None, trace=None, task_order=False,
                 share=None):
    """:func:`replay`, returning the times of every task of the step's
    :class:`_Flow` (ops first, then sends, receives and wires) and the flow
    itself. On a cluster that shares hardware the tasks run in
    :func:`_run_shared` (``trace`` gets its rate changes)."""
    n = graph.num_ops
    device = np.asarray(device, dtype=np.int64)
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    dur = et[np.arange(n), device]
    order = [np.asarray(seq, dtype=np.int64) for seq in order]
    tasks = order if task_order else None
    if task_order:
        order = [seq[seq < n] for seq in order]
    _check_order(graph, cluster, device, order)
    if cluster.shares_hardware:
        flow = _Flow(graph, cluster, device, dur, wires=cluster.shares_links, share=share)
        lanes = _transfer_lanes(flow, tasks or flow.order_tasks(order), cluster)
        start, finish = _run_shared(flow, lanes, cluster, trace)
    else:
        flow = _Flow(graph, cluster, device, dur, share=share)
        start, finish = _run(flow, tasks or flow.order_tasks(order))
    if start is None:  # then `finish` holds the inputs each task still waits for
        stuck = int(np.flatnonzero(finish[:n] > 0)[0])
        raise InvalidScheduleError(
            f"the per-device order contradicts the graph's dependencies: op "
            f"{graph.names[stuck]!r} on {cluster.names[device[stuck]]!r} can never start")
    return start, finish, flow


#: Executor models :func:`executor_order` knows.
EXECUTOR_POLICIES = ("fifo", "tensorflow")


def _check_policy(policy):
    """Raise ValueError for a policy not in :data:`EXECUTOR_POLICIES`."""
    if policy not in EXECUTOR_POLICIES:
        raise ValueError(f"unknown executor policy {policy!r}; known: {', '.join(EXECUTOR_POLICIES)}")


def executor_policy(cluster) -> str:
    """The executor model :func:`fddps.place` predicts a written graph's step with.

    ``"tensorflow"`` where devices move tensors themselves (CPU devices over
    gRPC, ``Cluster.transfer_compute > 0``): the setting it was measured on
    (two TensorFlow workers of one inter-op thread each, where it predicted
    27 of 33 placements within 15% and a FIFO executor 15). ``"fifo"``
    elsewhere (GPUs: kernels launched by several inter-op threads, nothing
    measured here).

    Examples
    --------
    >>> from fddps import Cluster
    >>> executor_policy(Cluster.homogeneous(2)), executor_policy(
    ...     Cluster.homogeneous(2).replace(transfer_compute=1.0))
    ('fifo', 'tensorflow')
    """
    return "tensorflow" if np.any(cluster.transfer_compute > 0) else "fifo"


def fifo_order(graph, cluster, device, exec_time=None):
    """:func:`executor_order` with the ``"fifo"`` policy."""
    return executor_order(graph, cluster, device, exec_time, policy="fifo")


def executor_order(graph, cluster, device, exec_time=None, policy="fifo", tasks=False,
                   fixed_order=None, share=None):
    """Per-device order an executor that runs ready ops as they come would follow.

    Whenever a device is free it takes one of its ops whose inputs have
    arrived (if none has, the next to arrive), chosen by ``policy``:

    - ``"fifo"``: the one earliest in the graph's topological order. Sends and
      receives of compute-charged transfers (module docstring) go first
      whenever they are ready.
    - ``"tensorflow"``: as TensorFlow's executor with one inter-op thread
      does (``executor.cc``'s ``ScheduleReady`` and Eigen's thread pool): an op
      made ready by an op that just finished on the device runs next, the most
      recently readied first (depth first: successors run inline or go to the
      front of the thread's queue); an op made ready by a tensor arriving from
      another device is queued at the back by the receive callback, behind all
      local work, first come first served. A compute-charged send waits for
      the op the device starts next, then goes first: a gRPC worker serves
      ``RecvTensor`` on the same inter-op pool that runs the step
      (``grpc_worker_service.cc`` schedules it on ``compute_pool``), so a
      tensor leaves only once the op its producer handed the thread to is
      done. Traced on two workers (VGG-16, batch 32): a 1 MB gradient made
      at 324 ms reached the other worker at 348 ms, as the 24 ms filter
      gradient started beside it ended. Receives go first whenever ready.

    An event simulation: each task waits in its device's heap of pending
    tasks (by arrival), then of available ones (by the policy's key), so the
    cost is ``O((n + e) log n)``.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    device : array of int
        Device index per op.
    exec_time : array (n, m), optional
        ``graph.exec_times(cluster)``, if already computed.
    policy : ``"fifo"`` or ``"tensorflow"``
    tasks : bool
        Also list the sends and receives (task indices past ``n``, as
        :func:`replay`'s ``trace`` numbers them) where the executor runs them.
    fixed_order : sequence of arrays of int, optional
        Per device, the order its ops must run in (order edges): the executor
        then only decides where the sends and receives go.
    share : array of float, optional
        Per compute-charged transfer, the share of its time its end devices
        spend on it (:func:`amortised_shares`); default the cluster's.

    Returns
    -------
    list of arrays of int, one per device.

    Raises
    ------
    ValueError
        For an unknown policy.
    """
    _check_policy(policy)
    n, m = graph.num_ops, cluster.num_devices
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    device = np.asarray(device, dtype=np.int64)
    flow = _Flow(graph, cluster, device, et[np.arange(n), device], share=share)
    total = flow.total
    dur, dev = flow.dur.tolist(), flow.dev.tolist()
    # Sends and receives rank before every op.
    rank = np.full(total, -1, dtype=np.int64)
    rank[graph.topo] = np.arange(n)
    rank = rank.tolist()
    depth_first = policy == "tensorflow"
    # Sends that wait for the device's next op (only compute-charged ones: a copy
    # engine's transfer takes no executor thread).
    waits = [False] * total
    if depth_first:
        for t_idx in flow.sends[flow.share > 0].tolist():
            waits[t_idx] = True
    deferred = [[] for _ in range(m)]   # per device: sends waiting for its next op
    fixed = None if fixed_order is None else [np.asarray(seq, dtype=np.int64).tolist()
                                              for seq in fixed_order]
    head = [0] * m
    position = [0] * n
    for seq in fixed or []:
        for k, i in enumerate(seq):
            position[i] = k
    local = [True] * total   # whether the input that came last was made on the device
    indeg = flow.indeg.tolist()
    ready = [0.0] * total
    free = [0.0] * m
    succ_ptr, succ_idx = flow.succ_ptr.tolist(), flow.succ_idx.tolist()
    delay = flow.succ_delay.tolist()
    pending = [[] for _ in range(m)]    # (arrival, rank, task): inputs not all there yet
    available = [[] for _ in range(m)]  # (key, task): inputs there, waiting for the device
    readied = 0                         # counter, for the depth-first policy
    first = (-1,)

    def pick(d):
        """The task device ``d`` starts now, or -1: with a ``fixed`` order, only
        the next op of its order (or a transfer) may start."""
        avail = available[d]
        if not avail:
            return -1
        i = avail[0][1]
        if fixed is not None and i < n:
            if i != fixed[d][head[d]]:
                return -1
            head[d] += 1
        heapq.heappop(avail)
        return i

    def key(i, r):
        if r >= 0 and fixed is not None:
            return (1, position[i])  # the given order
        if r < 0 or not depth_first:
            return (r,)  # transfers first; then topological order
        # Readied locally: last readied first. By a remote tensor: at the back, in turn.
        return (1, -readied) if local[i] else (2, readied)

    events = []                         # (time, device): the device may start something
    for i in range(total):
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
            readied += 1
            if waits[i]:
                deferred[d].append(i)
            else:
                heapq.heappush(avail, (key(i, r), i))
        i = pick(d)
        if deferred[d]:
            # The sends go right after the op the device starts now (at once if none).
            for j in deferred[d]:
                heapq.heappush(avail, (first, j))
            deferred[d] = []
            if i < 0:
                i = pick(d)
        if i < 0:
            if waiting:
                heapq.heappush(events, (waiting[0][0], d))
            continue
        f = t + dur[i]
        free[d] = f
        if i < n or tasks:
            order[d].append(i)
        heapq.heappush(events, (f, d))
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            a = f + delay[p]
            if a >= ready[j]:
                ready[j] = a
                local[j] = dev[j] == d and i < n
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
        Seconds each device computes (ops, and sends and receives on devices
        that move tensors themselves), by device name; at full speed (on
        shared cores its ops may take longer).
    transfers : pandas.DataFrame
        One row per link used: ``src``, ``dst``, ``bytes``, ``tensors``, ``seconds``
        (per edge; per tensor and receiving device on compute-charged links).
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
    start until its last consumer on that device finishes, where a consumer
    whose outputs alias its input (:attr:`~fddps.OpGraph.aliases`: a
    same-device ``ReadVariableOp`` of a variable, an ``Identity``) allocates
    nothing and keeps the buffer until its own consumers finish. A tensor that ops
    of another device read is received there once (as TensorFlow's rendezvous
    does, and as :func:`simulate` sends it): held from its arrival until the
    last of its consumers there finishes. Its size is the largest edge from the
    producer to that device, capped at the producer's ``transient`` bytes (a
    copy of an output is no larger than the outputs; a graph without transient
    bytes models no activation memory on any device).

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    device : array of int, shape (n,)
    start, finish : arrays of float, shape (n,)
        Times of a replayed step (:func:`replay`, :class:`~fddps.Schedule`).
    comm : array of float, optional
        Transfer time per edge (default: from the cluster's links).

    Returns
    -------
    numpy.ndarray, shape (m,)
        Bytes per device.
    """
    m = cluster.num_devices
    peak = np.bincount(device, weights=graph.memory, minlength=m).astype(np.float64)
    comm = _edge_comm(graph, cluster, device) if comm is None else comm
    src, dst = graph.src, graph.dst
    same = device[src] == device[dst]
    # Until when an op needs the buffers it reads: its finish, or for an op
    # whose outputs alias its input, its own consumers' there (chains of aliases).
    hold = finish.copy()
    chained = graph.aliases[src] & same
    a, b = src[chained], dst[chained]
    while a.size:  # one pass per link of the longest chain of aliases
        longer = hold.copy()
        np.maximum.at(longer, a, hold[b])
        if np.array_equal(longer, hold):
            break
        hold = longer
    # End of life of each op's outputs on its own device: its consumers there.
    release = finish.copy()
    np.maximum.at(release, src[same], hold[dst[same]])
    # One received copy per (producer, receiving device).
    nbytes = np.minimum(graph.bytes, graph.transient[src])
    cross = np.flatnonzero(~same & (nbytes > 0))
    keys, inverse = np.unique(src[cross] * m + device[dst[cross]], return_inverse=True)
    size = np.zeros(keys.size)
    np.maximum.at(size, inverse, nbytes[cross])
    arrive = np.full(keys.size, np.inf)
    np.minimum.at(arrive, inverse, finish[src[cross]] + comm[cross])
    leave = np.full(keys.size, -np.inf)
    np.maximum.at(leave, inverse, hold[dst[cross]])
    t = np.concatenate([start, release, arrive, leave])
    dev = np.concatenate([device, device, keys % m, keys % m])
    own = graph.allocated
    b = np.concatenate([own, -own, size, -size])
    # Frees before allocations at the same instant.
    keys = np.lexsort((b, t, dev))
    dev, b = dev[keys], b[keys]
    bounds = np.searchsorted(dev, np.arange(m + 1))
    for k in range(m):
        sel = b[bounds[k]:bounds[k + 1]]
        if sel.size:
            peak[k] += max(0.0, float(np.max(np.cumsum(sel))))
    return peak


def _executor_replay(graph, cluster, device, order, et, policy, share=None):
    """:func:`simulate`'s replay: the executor's order (or ``order``), then the
    task times and the flow (``share``: per-transfer shares, as in :class:`_Flow`)."""
    # TensorFlow's executor decides where sends and receives run too (also when
    # order edges fix its ops' order): replay them there.
    task_order = policy == "tensorflow"
    if task_order:
        given = order
        order = executor_order(graph, cluster, device, et, policy, tasks=True, fixed_order=given,
                               share=share)
        ran = np.zeros(graph.num_ops, dtype=bool)
        for seq in order:
            ran[seq[seq < graph.num_ops]] = True
        if not ran.all():  # a given order the dependencies contradict: the executor got stuck
            stuck = int(np.flatnonzero(~ran)[0])
            raise InvalidScheduleError(
                f"the per-device order contradicts the graph's dependencies: op "
                f"{graph.names[stuck]!r} on {cluster.names[device[stuck]]!r} can never start")
    elif order is None:
        order = executor_order(graph, cluster, device, et, policy, share=share)
    return _replay_flow(graph, cluster, device, order, et, task_order=task_order, share=share)


def _replayed(graph, cluster, placement, order, policy, amortise_transfers):
    """:func:`simulate`'s replay: ``(device, start, finish, flow)`` (times of the ops and
    the tasks beyond them); raises as :func:`simulate` does."""
    _check_policy(policy)
    device = _device_array(graph, cluster, placement)
    et = graph.exec_times(cluster)
    dur = et[np.arange(graph.num_ops), device]
    if np.any(np.isinf(dur)):
        bad = int(np.flatnonzero(np.isinf(dur))[0])
        raise InvalidScheduleError(f"op {graph.names[bad]!r} cannot run on device "
                                   f"{cluster.names[device[bad]]!r} (no cost for its type)")
    if order is not None:
        order = [np.asarray([graph.index[o] if o in graph.index else int(o) for o in seq],
                            dtype=np.int64) for seq in order]
    if order is not None and policy == "tensorflow":
        _check_order(graph, cluster, device, order)
    start, finish, flow = _executor_replay(graph, cluster, device, order, et, policy)
    if amortise_transfers and cluster.transfer_cpu is not None and flow.sends.size:
        share = amortised_shares(flow, start, finish, cluster)
        start, finish, flow = _executor_replay(graph, cluster, device, order, et, policy, share)
    return device, start, finish, flow


def simulated_makespan(graph, cluster, placement, order=None, policy="fifo",
                       amortise_transfers=True) -> float:
    """``simulate(...).makespan`` without building the rest of the :class:`Timeline`
    (its tables and peak memory cost more than the replay on large graphs).

    Parameters, raises: as :func:`simulate`.

    Examples
    --------
    >>> from fddps import OpGraph, Cluster
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [("a", "b", 1e6)])
    >>> simulated_makespan(g, Cluster.homogeneous(2, bandwidth=1e6), {"a": "0", "b": "1"})
    3.0
    """
    _, start, finish, _ = _replayed(graph, cluster, placement, order, policy, amortise_transfers)
    n = graph.num_ops
    return float(finish[:n].max() - start[:n].min()) if n else 0.0


def simulate(graph, cluster, placement, order=None, policy="fifo", amortise_transfers=True):
    """Replay ``placement`` (and ``order``, if given) and return the step's timeline.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    placement : mapping of op name -> device name, or sequence of device names/indices
    order : sequence of sequences, optional
        Per device (in cluster order), the ops it runs, first to last, by op
        name or index. Without it, each device runs its ops as an executor
        would (:func:`executor_order`).
    policy : ``"fifo"`` or ``"tensorflow"``
        That executor's choice among ready ops (:func:`executor_order`). With
        an ``order`` (TensorFlow held to it by order edges), ``"tensorflow"``
        still sends a compute-charged tensor after the op that follows its
        producer, as its worker does.
    amortise_transfers : bool
        On a cluster with a fitted per-transfer CPU cost (``transfer_cpu``),
        replay twice: the second time each transfer's CPU cost depends on how
        many transfers of its link the first replay had in flight with it
        (:func:`amortised_shares`). False: every transfer pays the
        many-at-once cost, as the cluster gives it.

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
    device, start, finish, flow = _replayed(graph, cluster, placement, order, policy,
                                            amortise_transfers)
    n = graph.num_ops
    start, finish = start[:n], finish[:n]
    comm = flow.edge_seconds
    names = list(cluster.names)
    ops = pd.DataFrame({"op": list(graph.names), "device": [names[k] for k in device],
                        "start": start, "finish": finish})
    # Busy: computing ops, and sending and receiving where devices do that themselves.
    on_device = flow.dev >= 0  # wires are on no device
    busy = pd.Series(np.bincount(flow.dev[on_device], weights=flow.dur[on_device],
                                 minlength=len(names)), index=names, name="busy")
    cross = (device[graph.src] != device[graph.dst]) & (flow.edge_transfer < 0)
    links = pd.DataFrame({"src": np.concatenate([device[graph.src][cross], device[flow.producer]]),
                          "dst": np.concatenate([device[graph.dst][cross], flow.dst]),
                          "bytes": np.concatenate([graph.bytes[cross], flow.bytes]),
                          "seconds": np.concatenate([comm[cross], flow.seconds])})
    transfers = (links.groupby(["src", "dst"]).agg(bytes=("bytes", "sum"), tensors=("bytes", "size"),
                                                   seconds=("seconds", "sum")).reset_index())
    transfers["src"] = [names[k] for k in transfers["src"]]
    transfers["dst"] = [names[k] for k in transfers["dst"]]
    peak = pd.Series(peak_memory(graph, cluster, device, start, finish, comm), index=names,
                     name="peak_memory")
    makespan = float(finish.max() - start.min()) if graph.num_ops else 0.0
    return Timeline(makespan, ops, busy, transfers, peak)
