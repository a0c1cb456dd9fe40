"""The result of scheduling: where each op runs, in what order, and when."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import InvalidScheduleError
from .simulate import _edge_comm, peak_memory, replay

#: Relative tolerance of :meth:`Schedule.validate` on times.
TIME_RTOL = 1e-9


class Schedule:
    """A placement and per-device order of an :class:`OpGraph` on a :class:`Cluster`.

    Build one with :meth:`from_order`: the start and finish times are not taken
    from the algorithm but replayed (:func:`fddps.simulate.replay`), so every
    op starts as early as its inputs and its device allow, and ``makespan``
    equals what :func:`fddps.simulate` predicts for the same placement and order.

    Attributes
    ----------
    graph, cluster
    device : array of int, shape (n,)
        Device index per op.
    order : tuple of arrays of int
        Per device, its ops first to last.
    start, finish : arrays of float, shape (n,)
    algorithm : str
    info : dict
        Algorithm-specific facts (search time, ops split, ...).
    """

    def __init__(self, graph, cluster, device, order, start, finish, algorithm="", info=None):
        self.graph = graph
        self.cluster = cluster
        self.device = np.asarray(device, dtype=np.int64)
        self.order = tuple(np.asarray(seq, dtype=np.int64) for seq in order)
        self.start = np.asarray(start, dtype=np.float64)
        self.finish = np.asarray(finish, dtype=np.float64)
        self.algorithm = algorithm
        self.info = dict(info or {})

    @classmethod
    def from_order(cls, graph, cluster, device, order, algorithm="", info=None, exec_time=None):
        """Time a placement and per-device order by replaying it (see :func:`replay`)."""
        start, finish = replay(graph, cluster, device, order, exec_time)
        return cls(graph, cluster, device, order, start, finish, algorithm, info)

    @classmethod
    def from_start_times(cls, graph, cluster, device, start_hint, algorithm="", info=None,
                         exec_time=None):
        """Order each device's ops by ``start_hint`` (ties: topological order), then replay."""
        device = np.asarray(device, dtype=np.int64)
        rank = np.empty(graph.num_ops, dtype=np.int64)
        rank[graph.topo] = np.arange(graph.num_ops)
        keys = np.lexsort((rank, np.asarray(start_hint, dtype=np.float64), device))
        bounds = np.searchsorted(device[keys], np.arange(cluster.num_devices + 1))
        order = [keys[bounds[k]:bounds[k + 1]] for k in range(cluster.num_devices)]
        return cls.from_order(graph, cluster, device, order, algorithm, info, exec_time)

    # -- answers ---------------------------------------------------------------
    @property
    def makespan(self) -> float:
        """Seconds from the step's start to its last op's finish."""
        return float(self.finish.max()) if self.finish.size else 0.0

    @property
    def placement(self) -> dict:
        """Op name -> device name."""
        names = self.cluster.names
        return {op: names[k] for op, k in zip(self.graph.names, self.device.tolist())}

    def peak_memory(self) -> np.ndarray:
        """Highest bytes each device holds at once during the step (the memory constraint).

        Persistent bytes all step, each op's transient bytes from its start to
        its last local consumer's finish, received copies of remote inputs
        (:func:`fddps.simulate.peak_memory`). Array of shape ``(m,)``.
        """
        return peak_memory(self.graph, self.cluster, self.device, self.start, self.finish)

    def device_memory(self) -> np.ndarray:
        """Sum of ``memory + allocated`` of each device's ops, in bytes.

        What holding every op's memory for the whole step would take: the
        schedulers' conservative reservation when the persistent-only one
        overflows (:meth:`fddps.algorithms.base.Scheduler.schedule`). It bounds
        the peak from above except for received copies; the constraint itself
        is :meth:`peak_memory`.
        """
        need = self.graph.memory + self.graph.allocated
        return np.bincount(self.device, weights=need, minlength=self.cluster.num_devices)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per op: ``op``, ``device``, ``start``, ``finish``, ``duration``, ``op_type``.

        Sorted by start time.
        """
        names = self.cluster.names
        df = pd.DataFrame({
            "op": list(self.graph.names),
            "device": [names[k] for k in self.device.tolist()],
            "start": self.start,
            "finish": self.finish,
            "duration": self.finish - self.start,
            "op_type": list(self.graph.op_types),
        })
        return df.sort_values(["start", "device"], kind="stable").reset_index(drop=True)

    def __repr__(self):
        return (f"Schedule({self.algorithm or 'unnamed'}: {self.graph.num_ops} ops on "
                f"{self.cluster.num_devices} devices, makespan {self.makespan:.6g} s)")

    # -- checking --------------------------------------------------------------
    def validate(self) -> "Schedule":
        """Check every constraint; return ``self`` when all hold.

        Checks: each op on a device that can run it (finite cost, its pinned
        device, the device of its colocation group); finish = start + execution
        time (at least that on cores shared with other devices); no two ops
        overlap on a device and the order matches the start times; each op
        starts after every input has arrived (producer's finish plus transfer
        time); on a cluster sharing cores or links, the times equal those of
        the exact replay (:func:`fddps.simulate.replay`); no device's peak
        memory (:meth:`peak_memory`) exceeds its capacity.

        Raises
        ------
        InvalidScheduleError
            Naming the first op, edge or device that breaks a constraint.
        """
        g, c = self.graph, self.cluster
        n, names = g.num_ops, g.names
        if self.device.shape != (n,) or self.start.shape != (n,) or self.finish.shape != (n,):
            raise InvalidScheduleError("device, start and finish need one entry per op")
        if n == 0:
            return self
        if self.device.min() < 0 or self.device.max() >= c.num_devices:
            raise InvalidScheduleError("an op is placed on a device index outside the cluster")
        et = g.exec_times(c)
        dur = et[np.arange(n), self.device]
        if np.any(np.isinf(dur)):
            i = int(np.flatnonzero(np.isinf(dur))[0])
            raise InvalidScheduleError(f"op {names[i]!r} cannot run on {c.names[self.device[i]]!r}")
        for i, dev in g.pinned.items():
            if c.names[self.device[i]] != dev:
                raise InvalidScheduleError(f"op {names[i]!r} is pinned to {dev!r} but placed on "
                                           f"{c.names[self.device[i]]!r}")
        grouped = g.colocation >= 0
        if grouped.any():
            grp, dev = g.colocation[grouped], self.device[grouped]
            first = np.full(grp.max() + 1, -1)
            first[grp[::-1]] = dev[::-1]
            bad = np.flatnonzero(first[grp] != dev)
            if bad.size:
                i = int(np.flatnonzero(grouped)[bad[0]])
                raise InvalidScheduleError(f"op {names[i]!r} is split from its colocation group")
        scale = max(self.makespan, 1e-300)
        tol = TIME_RTOL * scale
        if np.any(self.start < -tol):
            i = int(np.argmin(self.start))
            raise InvalidScheduleError(f"op {names[i]!r} starts before time 0")
        # On shared cores an op may run slowed down (never faster than alone).
        slowed = c.core_group[self.device] >= 0
        err = self.finish - self.start - dur
        err[slowed] = np.minimum(err[slowed], 0.0)
        bad = np.flatnonzero(np.abs(err) > tol + TIME_RTOL * dur)
        if bad.size:
            i = int(bad[0])
            raise InvalidScheduleError(f"op {names[i]!r} runs {self.finish[i] - self.start[i]!r} s "
                                       f"but takes {dur[i]!r} s on its device")
        seen = np.zeros(n, dtype=bool)
        for k, seq in enumerate(self.order):
            if seq.size == 0:
                continue
            if np.any(self.device[seq] != k) or np.any(seen[seq]):
                raise InvalidScheduleError(f"the order of device {c.names[k]!r} lists an op "
                                           "placed elsewhere or twice")
            seen[seq] = True
            gap = self.start[seq[1:]] - self.finish[seq[:-1]]
            if np.any(gap < -tol):
                j = int(np.flatnonzero(gap < -tol)[0])
                raise InvalidScheduleError(
                    f"ops {names[seq[j]]!r} and {names[seq[j + 1]]!r} overlap on {c.names[k]!r}")
        if not seen.all():
            i = int(np.flatnonzero(~seen)[0])
            raise InvalidScheduleError(f"op {names[i]!r} is in no device's order")
        arrival = self.finish[g.src] + _edge_comm(g, c, self.device)
        late = np.flatnonzero(self.start[g.dst] < arrival - tol)
        if late.size:
            e = int(late[0])
            u, v = names[g.src[e]], names[g.dst[e]]
            raise InvalidScheduleError(f"op {v!r} starts at {self.start[g.dst[e]]!r} before its input "
                                       f"from {u!r} arrives at {arrival[e]!r}")
        if c.shares_hardware:
            # Contention: the times must be the exact replay's (which keeps every
            # shared group of cores and link resource within its capacity).
            start, finish = replay(g, c, self.device, self.order, et)
            off = np.flatnonzero((np.abs(start - self.start) > tol) | (np.abs(finish - self.finish) > tol))
            if off.size:
                i = int(off[0])
                raise InvalidScheduleError(
                    f"op {names[i]!r} runs {self.start[i]!r}..{self.finish[i]!r} but replaying the "
                    f"order with shared cores and links gives {start[i]!r}..{finish[i]!r}")
        peak = self.peak_memory()
        over = np.flatnonzero(peak > c.memory * (1 + 1e-12))
        if over.size:
            k = int(over[0])
            raise InvalidScheduleError(f"device {c.names[k]!r} holds {peak[k]:.6g} bytes at its peak, "
                                       f"over its capacity of {c.memory[k]:.6g}")
        return self
