"""What every scheduling algorithm shares: the interface and the placement state.

An algorithm is a :class:`Scheduler` subclass, configured in ``__init__`` and
run by :meth:`Scheduler.schedule`, registered by name with :func:`register`.
Most are list schedulers: they repeatedly pick an op and a device and call
:meth:`PlacementState.place`, which keeps per-device busy intervals (for
insertion into idle gaps), memory in use, and the devices of colocation groups.

Memory. The constraint is the replayed step's peak on each device
(:meth:`fddps.Schedule.peak_memory`: persistent bytes, transient bytes while
live, received copies). :meth:`Scheduler.schedule` first lets the algorithm
reserve only persistent bytes, then checks the peak of its schedule; where a
device overflows it schedules again reserving ``memory + transient`` of every
op for the whole step (:func:`reserving_transient`), and refuses with
:class:`~fddps.errors.InfeasibleError` if even that schedule's peak overflows
(or it makes none): the error names the smallest per-device peak the
attempts reached, and its device.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import time
from bisect import bisect_left, bisect_right
from math import ulp

import numpy as np

from ..errors import InfeasibleError, UnknownAlgorithmError
from ..bounds import communication_lower_bound, lower_bound
# bottom_levels and top_levels lived here before fddps.paths (below the schedulers and
# fddps.bounds) took them: still importable from here.
from ..paths import allowed_devices, bottom_levels, top_levels  # noqa: F401
from ..schedule import Schedule
from . import list_pass_jit

_REGISTRY: dict[str, type] = {}

#: Relative margin for rounding in :meth:`PlacementState.candidates`' shortcut: a
#: device's bytes in use, summed op by op, exceed their share of the total summed
#: the same way by at most (ops x 2**-53) of it, far under this for any graph.
_MEMORY_SLACK = 1e-9

#: Whether a :class:`PlacementState` built now reserves transient bytes too.
_RESERVE_TRANSIENT = contextvars.ContextVar("fddps_reserve_transient", default=True)


@contextlib.contextmanager
def reserving_transient(flag: bool):
    """Within the block, :class:`PlacementState` reserves ``memory + transient``
    per op (``True``, also the default outside any block) or ``memory`` only."""
    token = _RESERVE_TRANSIENT.set(bool(flag))
    try:
        yield
    finally:
        _RESERVE_TRANSIENT.reset(token)


def memory_overflow(schedule):
    """``(device index, peak bytes, capacity)`` of the device whose replayed peak
    exceeds its capacity the most, or ``None`` when every device's fits."""
    capacity = schedule.cluster.memory
    if schedule.graph.num_ops == 0 or np.isinf(capacity).all():
        return None
    peak = schedule.peak_memory()
    excess = peak - capacity * (1 + 1e-12)
    k = int(np.argmax(excess))
    return (k, float(peak[k]), float(capacity[k])) if excess[k] > 0 else None


def _no_schedule_fits(attempts, cluster, failure=""):
    """The :class:`InfeasibleError` of schedules that all overflow: it names the
    smallest per-device peak reached (of the attempt whose worst device
    overflows least) and its device, then every attempt."""
    attempts = sorted(attempts, key=lambda a: a[2] - a[3])
    named = [(how, cluster.names[k], peak, capacity) for how, k, peak, capacity in attempts]
    how, device, peak, capacity = named[0]
    tried = "; ".join(f"reserving {h} bytes, {d!r} peaks at {p:.6g} bytes (capacity {c:.6g})"
                      for h, d, p, c in named)
    return InfeasibleError(
        f"no schedule fits in memory: the smallest per-device peak reached is {peak:.6g} bytes "
        f"on {device!r}, over its capacity of {capacity:.6g} by {peak - capacity:.6g} (schedule "
        f"reserving {how} bytes; peaks include received copies of remote inputs). Tried: "
        f"{tried}{failure}", peak, capacity, device=device, attempts=named)


def register(cls):
    """Class decorator: make a :class:`Scheduler` available under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name")
    _REGISTRY[cls.name] = cls
    return cls


def available_algorithms() -> list[str]:
    """Names of the registered algorithms, sorted."""
    return sorted(_REGISTRY)


def get_algorithm(name: str, **options) -> "Scheduler":
    """A configured instance of the algorithm registered as ``name``.

    Raises
    ------
    UnknownAlgorithmError
        If no algorithm has that name; the message lists the known ones.
    """
    try:
        cls = _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; known algorithms: "
                                    f"{', '.join(available_algorithms())}") from None
    return cls(**options)


def parse_algorithm(spec: str) -> tuple[str, dict]:
    """Split ``"name:key=value,key=value"`` into a name and its options.

    Values are read as Python literals where they parse (``False``, ``3``,
    ``0.5``), else kept as strings. Used by the experiments and the command line.

    Examples
    --------
    >>> parse_algorithm("fddps:improve=False,restarts=3")
    ('fddps', {'improve': False, 'restarts': 3})
    """
    import ast

    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"algorithm option {item!r} in {spec!r} is not key=value")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return name.strip(), options


class Scheduler:
    """Interface of a scheduling algorithm.

    Subclasses set ``name``, take their options as keyword arguments of
    ``__init__`` (stored as attributes, nothing else), and implement
    :meth:`_schedule`. :meth:`schedule` enforces the memory constraint (see
    the module docstring) and adds the search time and ``memory_reservation``
    (``"persistent"`` or ``"memory + transient"``) to ``info``.
    """

    name = ""

    def __init__(self, **options):
        if options:
            raise TypeError(f"{type(self).__name__} got unknown options {sorted(options)}")

    def __repr__(self):
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        args = ", ".join(f"{k}={v!r}" for k, v in params.items())
        return f"{type(self).__name__}({args})"

    def schedule(self, graph, cluster) -> Schedule:
        """Place ``graph`` on ``cluster``; return a timed :class:`Schedule`.

        Every device's replayed peak memory (:meth:`Schedule.peak_memory`)
        is within its capacity: the algorithm runs reserving persistent bytes
        only and, if a device's peak overflows, again reserving ``memory +
        transient`` of every op for the whole step.

        Raises
        ------
        InfeasibleError
            If the graph cannot fit in the cluster's memory (naming the
            smallest per-device peak the attempts reached, its device and
            capacity, in ``device``, ``needed``, ``available`` and
            ``attempts``; or the op that fits nowhere), or an op can run on
            no device.
        """
        t0 = time.perf_counter()
        with reserving_transient(False):
            result = self._schedule(graph, cluster)
        result.info["memory_reservation"] = "persistent"
        over = memory_overflow(result)
        if over is not None:
            attempts = [("persistent", *over)]  # (reservation, device, peak, capacity)
            failure = ""
            with reserving_transient(True):
                try:
                    result = self._schedule(graph, cluster)
                except InfeasibleError as err:
                    failure = f"; reserving memory + transient bytes made no schedule: {err}"
                else:
                    result.info["memory_reservation"] = "memory + transient"
                    over = memory_overflow(result)
                    if over is not None:
                        attempts.append(("memory + transient", *over))
            if failure or over is not None:
                raise _no_schedule_fits(attempts, cluster, failure)
        result.info.setdefault("search_seconds", time.perf_counter() - t0)
        result.algorithm = self.name
        _add_lower_bound(result)
        return result

    def _schedule(self, graph, cluster) -> Schedule:  # pragma: no cover - interface
        raise NotImplementedError


#: Above this many ops, schedules get the plain :func:`fddps.lower_bound` (linear
#: time) instead of the communication-aware one (a Python loop over edges x
#: device classes: ~1.5 s at 20k ops on 4 devices here, ~30% of the list pass).
COMM_BOUND_MAX_OPS = 5000


def _add_lower_bound(result):
    """Put the best makespan bound known into ``result.info["lower_bound"]``: the
    algorithm's own (the exact solver's) or :func:`fddps.bounds.communication_lower_bound`
    (:func:`fddps.lower_bound` above :data:`COMM_BOUND_MAX_OPS` ops), whichever is
    larger, rounded up where every op and transfer time is a whole number (then
    so is every makespan); and ``info["optimal"] = True`` where the makespan meets it."""
    g, c = result.graph, result.cluster
    bound = (communication_lower_bound(g, c) if g.num_ops <= COMM_BOUND_MAX_OPS
             else lower_bound(g, c))
    own = result.info.get("lower_bound")
    bound = max(bound, own if own is not None else 0.0)
    # With whole-number op and transfer times (STG) every makespan is a whole
    # number, so the optimum is at least the bound rounded up.
    if g.num_ops <= COMM_BOUND_MAX_OPS:
        et = g.exec_times(c)
        finite = et[np.isfinite(et)]
        comm = (c.latency[None] + g.bytes[:, None, None] * c.inv_bandwidth[None]
                if g.num_edges else et[:0])
        if np.all(finite == np.round(finite)) and np.all(comm == np.round(comm)):
            bound = float(np.ceil(bound - 1e-6))
    bound = min(bound, result.makespan)
    result.info["lower_bound"] = bound
    if result.makespan <= bound * (1 + 1e-9):
        result.info["optimal"] = True


class _Block:
    """A run of consecutive busy intervals and the largest idle gap before any of them."""

    __slots__ = ("starts", "finishes", "ops", "gaps", "max_gap")

    def __init__(self, starts, finishes, ops, gaps):
        self.starts, self.finishes, self.ops, self.gaps = starts, finishes, ops, gaps
        self.max_gap = max(gaps) if gaps else 0.0


class DeviceTimeline:
    """Busy intervals of one device, sorted, for insertion-based slot finding.

    Intervals are kept in blocks of at most ``2 * BLOCK`` that record the
    largest idle gap in front of any of their intervals, so a search for a gap
    long enough skips whole blocks: an op that fits nowhere no longer walks past
    every small gap on the device (the search stays exact).
    """

    BLOCK = 64
    __slots__ = ("blocks", "firsts", "free_at", "count")

    def __init__(self):
        self.blocks: list[_Block] = []
        self.firsts: list[float] = []  # start of each block's first interval
        self.free_at = 0.0             # finish of the last interval
        self.count = 0

    @classmethod
    def from_sorted(cls, starts, finishes, ops) -> "DeviceTimeline":
        """A timeline of the intervals ``starts[j]``-``finishes[j]`` of ``ops[j]`` (arrays,
        sorted and not overlapping), as :meth:`add` one by one would record them."""
        tl = cls()
        n = len(ops)
        if not n:
            return tl
        gaps = np.empty(n)
        gaps[0] = starts[0]
        np.subtract(starts[1:], finishes[:-1], out=gaps[1:])
        starts, finishes, ops, gaps = (a.tolist() for a in (starts, finishes, ops, gaps))
        for lo in range(0, n, cls.BLOCK):
            hi = lo + cls.BLOCK
            tl.blocks.append(_Block(starts[lo:hi], finishes[lo:hi], ops[lo:hi], gaps[lo:hi]))
            tl.firsts.append(starts[lo])
        tl.free_at, tl.count = finishes[-1], n
        return tl

    @property
    def ops(self) -> list[int]:
        """The device's ops, first to last."""
        return [op for b in self.blocks for op in b.ops]

    def earliest_start(self, ready: float, duration: float, insertion: bool = True) -> float:
        """Earliest start >= ``ready`` of an op lasting ``duration``.

        With ``insertion`` the op may go into an idle gap between ops already
        placed (HEFT's insertion policy); without, only after the last one. It
        fits a gap from ``t`` to an op's start ``s`` when ``t + duration <= s``;
        the recorded gaps ``s - t`` only rule blocks out, with a margin of a few
        units in the last place: the two tests can disagree in the last bit
        (an op that exactly fills a gap), and a margin-free pruning made the
        answer depend on where the blocks happen to split.
        """
        free_at = self.free_at
        if ready >= free_at or not insertion or not self.blocks:
            return ready if ready >= free_at else free_at
        # Every start and finish is at most free_at: their roundings are within its ulp.
        least_gap = duration - 2.0 * ulp(free_at)
        blocks = self.blocks
        b = bisect_right(self.firsts, ready) - 1
        if b < 0:
            b = 0
        block = blocks[b]
        # Within the block holding `ready`: the gap around it, then the later
        # ones (whole gaps, so none fits unless the block's largest does).
        t = ready
        starts, finishes = block.starts, block.finishes
        k = bisect_right(finishes, ready)
        if k < len(starts):
            if t + duration <= starts[k]:
                return t
            if block.max_gap < least_gap:
                t = finishes[-1]
                if block is blocks[-1]:
                    return t  # the device's last op: no later gap
            else:
                for k in range(k, len(starts)):
                    if t + duration <= starts[k]:
                        return t
                    if finishes[k] > t:
                        t = finishes[k]
        # Later blocks start after `ready`: only the gap in front of their first
        # interval depends on t; the others are skipped unless long enough.
        for b in range(b + 1, len(blocks)):
            block = blocks[b]
            if t + duration <= block.starts[0]:
                return t
            if block.max_gap >= least_gap:
                starts, finishes = block.starts, block.finishes
                for k in range(1, len(starts)):
                    if finishes[k - 1] + duration <= starts[k]:
                        return finishes[k - 1]
            t = block.finishes[-1]
        return t

    def add(self, op: int, start: float, finish: float):
        """Record that ``op`` runs on this device from ``start`` to ``finish``."""
        self.count += 1
        if finish >= self.free_at and (not self.blocks or start >= self.free_at):
            gap = start - self.free_at if self.blocks else start
            self.free_at = finish
            if self.blocks and len(self.blocks[-1].ops) < 2 * self.BLOCK:
                block = self.blocks[-1]
                block.starts.append(start)
                block.finishes.append(finish)
                block.ops.append(op)
                block.gaps.append(gap)
                if gap > block.max_gap:
                    block.max_gap = gap
            else:
                self.blocks.append(_Block([start], [finish], [op], [gap]))
                self.firsts.append(start)
            return
        b = max(bisect_right(self.firsts, start) - 1, 0)
        block = self.blocks[b]
        # Before any op of positive length starting at the same instant, after
        # the zero-length ones there (placed earlier, maybe their parents).
        k = bisect_left(block.starts, start)
        while k < len(block.starts) and block.starts[k] == start and block.finishes[k] == start:
            k += 1
        prev_finish = (block.finishes[k - 1] if k else
                       self.blocks[b - 1].finishes[-1] if b else 0.0)
        # The op splits the gap in front of interval k (or of the next block's
        # first): a block's largest gap is searched again only if that was it.
        gap = start - prev_finish
        block.starts.insert(k, start)
        block.finishes.insert(k, finish)
        block.ops.insert(k, op)
        block.gaps.insert(k, gap)
        if k + 1 < len(block.starts):
            split, block.gaps[k + 1] = block.gaps[k + 1], block.starts[k + 1] - finish
            block.max_gap = (max(block.max_gap, gap, block.gaps[k + 1])
                             if split < block.max_gap else max(block.gaps))
        else:
            if gap > block.max_gap:
                block.max_gap = gap
            if b + 1 < len(self.blocks):
                nxt = self.blocks[b + 1]
                split, nxt.gaps[0] = nxt.gaps[0], nxt.starts[0] - finish
                nxt.max_gap = (max(nxt.max_gap, nxt.gaps[0]) if split < nxt.max_gap
                               else max(nxt.gaps))
        if k == 0:
            self.firsts[b] = start
        if len(block.ops) > 2 * self.BLOCK:
            h = self.BLOCK
            tail = _Block(block.starts[h:], block.finishes[h:], block.ops[h:], block.gaps[h:])
            head = _Block(block.starts[:h], block.finishes[:h], block.ops[:h], block.gaps[:h])
            self.blocks[b:b + 1] = [head, tail]
            self.firsts[b:b + 1] = [head.starts[0], tail.starts[0]]


class PlacementState:
    """Partial placement built up by a list scheduler.

    Holds the execution-time table, the device, start and finish of placed ops,
    each device's :class:`DeviceTimeline`, memory in use, and the device chosen
    for each colocation group. Constraints (runnable device, pinned device,
    colocation, memory) are enforced by :meth:`candidates`.

    Memory is a reservation held for the whole step: ``need`` per op is its
    persistent ``memory``, plus its ``transient`` bytes when
    ``reserve_transient`` is true (default: as set by
    :func:`reserving_transient`, true outside :meth:`Scheduler.schedule`).

    Raises (on construction)
    ------------------------
    InfeasibleError
        If the total memory needed exceeds the cluster's, or an op can run on
        no device of the cluster.
    ClusterError
        If an op is pinned to a device the cluster does not have.
    """

    def __init__(self, graph, cluster, exec_time=None, reserve_transient=None):
        self.graph = graph
        self.cluster = cluster
        n, m = graph.num_ops, cluster.num_devices
        self.n, self.m = n, m
        self.et = graph.exec_times(cluster) if exec_time is None else exec_time
        # Shared cores: charge each device its share of them (Cluster.slowdown),
        # as if every device of its group were busy; the replay is exact.
        durations = self.et * cluster.slowdown if cluster.shares_cores else self.et
        self.et_rows = durations.tolist()
        self.latency = cluster.latency.tolist()
        self.inv_bw = cluster.inv_bandwidth.tolist()
        off = ~np.eye(m, dtype=bool)
        # With one latency and bandwidth on every link, a remote input arrives at
        # the same time on every device but its own (see ready_times).
        # Links whose end devices spend a share of each transfer themselves
        # (Cluster.transfer_compute; CPU tasks over gRPC): see duration_row.
        self.charged = bool(cluster.transfer_compute.any())
        self.share = cluster.transfer_compute.tolist()
        # A fitted per-transfer CPU cost makes the share depend on the bytes.
        self.transfer_share = cluster.transfer_share if cluster.transfer_cpu is not None else None
        # Shared link resources (network interfaces, PCIe uplinks): transfers
        # queue on them, one after another (see ready_time).
        self.links = cluster.shares_links
        self.link_path = cluster.link_path
        self.uniform_links = bool(m > 1 and not self.charged and not self.links
                                  and np.ptp(cluster.latency[off]) == 0
                                  and np.ptp(cluster.inv_bandwidth[off]) == 0)
        self._link = ((float(cluster.latency[off][0]), float(cluster.inv_bandwidth[off][0]))
                      if self.uniform_links else None)
        self.capacity = cluster.memory.tolist()
        # What every device surely has room for while the bytes reserved on all
        # devices together stay under it (see candidates).
        self._roomy = float(cluster.memory.min()) * (1 - _MEMORY_SLACK) if m else 0.0
        if reserve_transient is None:
            reserve_transient = _RESERVE_TRANSIENT.get()
        self.reserve_transient = bool(reserve_transient)
        need = graph.memory + graph.allocated if reserve_transient else graph.memory.copy()
        self.need = need.tolist()
        groups = graph.colocation
        self.group = groups.tolist()
        n_groups = int(groups.max()) + 1 if n and groups.max() >= 0 else 0
        self.group_need = np.bincount(groups[groups >= 0], weights=need[groups >= 0],
                                      minlength=n_groups).tolist()
        self.allowed = self._allowed_devices()
        # Inputs of each op, as (producer, bytes) pairs.
        self.inputs = graph.input_pairs()
        self._check_memory(need)
        # The compiled list pass's tables (list_pass_jit), shared by fresh() states.
        self.compiled_tables = (self._compiled_tables(durations, need)
                                if self.uniform_links and list_pass_jit.use_compiled(n)
                                else None)
        self._reset()

    def _reset(self):
        """Nothing placed: what :meth:`place` changes, set as it is before the first op."""
        n, m = self.n, self.m
        self.device = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.timelines = [DeviceTimeline() for _ in range(m)]
        self.received = {}  # (producer, device) -> when its tensor is there
        self.link_free = [0.0] * len(self.cluster.link_resources)
        self.arrived = {}   # (producer, device) -> when its tensor got there over shared links
        self.mem_used = [0.0] * m
        self.reserved = 0.0  # bytes reserved on all devices together
        self.group_device = [-1] * len(self.group_need)

    def fresh(self, graph=None) -> "PlacementState":
        """An empty state with this one's cluster, execution times, memory
        reservation and constraint tables (computed once, shared), for ``graph``:
        this state's graph (default) or one with the same ops, such as its
        :meth:`~fddps.OpGraph.reversed` (a forward-backward pass makes two states a
        pass; building each from scratch costs ~10 ms at 20,000 ops).
        """
        graph = self.graph if graph is None else graph
        if graph.names is not self.graph.names and graph.names != self.graph.names:
            raise ValueError("fresh(): the graph must have the same ops as this state's")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.graph, new.inputs = graph, graph.input_pairs()
        new._reset()
        return new

    def _compiled_tables(self, durations, need):
        """What :func:`list_pass_jit.list_pass` needs of this state, as arrays."""
        allowed = np.ones((self.n, self.m), dtype=np.bool_)
        for i, devs in enumerate(self.allowed):
            if len(devs) != self.m:  # distinct device indices: fewer than all of them
                allowed[i] = False
                allowed[i, devs] = True
        lat, inv = self._link
        return dict(durations=np.ascontiguousarray(durations, dtype=np.float64), allowed=allowed,
                    lat=lat, inv=inv, group=np.asarray(self.group, dtype=np.int64),
                    group_need=np.asarray(self.group_need, dtype=np.float64),
                    need=np.asarray(self.need, dtype=np.float64),
                    capacity=np.asarray(self.capacity, dtype=np.float64),
                    roomy=self._roomy, slack=1 + _MEMORY_SLACK)

    # -- feasibility --------------------------------------------------------------
    def _allowed_devices(self):
        """Per op, the devices it may run on ignoring memory (:func:`fddps.paths.allowed_devices`)."""
        return allowed_devices(self.graph, self.cluster, self.et)

    def _check_memory(self, need):
        total, capacity = float(need.sum()), float(self.cluster.memory.sum())
        if total > capacity:
            what = "persistent + transient" if self.reserve_transient else "persistent"
            raise InfeasibleError(
                f"the graph needs {total:.6g} bytes of device memory ({what}) but the cluster "
                f"has {capacity:.6g} in all", needed=total, available=capacity)
        biggest = float(self.cluster.memory.max())
        # What placing each op first reserves: its group's bytes, or its own.
        groups = self.graph.colocation
        units = np.where(groups >= 0, np.asarray(self.group_need + [0.0])[groups], need)
        over = np.flatnonzero(units > biggest)
        if over.size:
            i = int(over[0])
            unit = float(units[i])
            what = "colocation group of op" if groups[i] >= 0 else "op"
            raise InfeasibleError(
                f"the {what} {self.graph.names[i]!r} needs {unit:.6g} bytes but the largest "
                f"device has {biggest:.6g}", needed=unit, available=biggest)

    def memory_needed(self, i: int) -> float:
        """Bytes placing op ``i`` now would reserve (its whole group's on first placement)."""
        g = self.group[i]
        if g < 0:
            return self.need[i]
        return 0.0 if self.group_device[g] >= 0 else self.group_need[g]

    def candidates(self, i: int) -> list[int]:
        """Devices op ``i`` may go to now: runnable, pinned or colocated, with memory left.

        The list returned is not to be modified (it may be ``allowed[i]`` itself).

        Raises
        ------
        InfeasibleError
            If no device has room left (the greedy placement ran out of memory).
        """
        g = self.group[i]
        if g >= 0 and self.group_device[g] >= 0:
            return [self.group_device[g]]
        need = self.memory_needed(i)
        # No device holds more than all reserved bytes: while those and `need` fit
        # the smallest device (with a margin for the sums' rounding), every device
        # passes the test below, which need not be made (nor a new list).
        if need + self.reserved * (1 + _MEMORY_SLACK) <= self._roomy:
            return self.allowed[i]
        devs = [k for k in self.allowed[i] if self.mem_used[k] + need <= self.capacity[k]]
        if not devs:
            free = {self.cluster.names[k]: self.capacity[k] - self.mem_used[k] for k in self.allowed[i]}
            raise InfeasibleError(
                f"op {self.graph.names[i]!r} needs {need:.6g} bytes but no device it can run on "
                f"has that much left (free bytes: {free})", needed=need,
                available=max(free.values()))
        return devs

    # -- times ----------------------------------------------------------------------
    def transfer(self, nbytes: float, src: int, dst: int) -> float:
        if src == dst:
            return 0.0
        return self.latency[src][dst] + nbytes * self.inv_bw[src][dst]

    def ready_time(self, i: int, k: int) -> float:
        """When every input of op ``i`` (all placed) has arrived on device ``k``.

        On a link whose devices spend a share ``c`` of a transfer themselves,
        the input is ready for them after ``(1 - c) * T`` on the wire; the
        rest is in :meth:`duration_row`. A tensor already received on ``k``
        for another op is there when that op received it.
        """
        t = 0.0
        dev, fin = self.device, self.finish
        charged, received = self.charged, self.received
        links, arrived = self.links, self.arrived
        for p, b in self.inputs[i]:
            d = dev[p]
            if d == k:
                a = fin[p]
            elif charged and (p, k) in received:
                a = received[(p, k)]
            elif links and (p, k) in arrived:
                a = arrived[(p, k)]
            else:
                a = self._arrival(p, b, d, k)
            if a > t:
                t = a
        return t

    def _arrival(self, p: int, nbytes: float, d: int, k: int) -> float:
        """When the output of ``p`` (on ``d``) would reach ``k`` if sent now: its
        wire time after the producer's finish and, over shared link resources,
        after the transfers already queued on every resource of its path."""
        wire = self.latency[d][k] + nbytes * self.inv_bw[d][k]
        if self.charged:
            wire *= 1.0 - self._share(d, k, nbytes)
        t0 = self.finish[p]
        if self.links:
            free = self.link_free
            for r in self.link_path[d][k]:
                if free[r] > t0:
                    t0 = free[r]
        return t0 + wire

    def duration_row(self, i: int) -> list:
        """How long op ``i`` would occupy each device, all its inputs placed.

        Its execution time, plus, on links where devices move tensors
        themselves (``Cluster.transfer_compute`` ``c > 0``), ``c * T`` for each
        remote input not yet received on that device: the receive and (charged
        here too, as the sender's share is not known before its consumers are
        placed) the send. Without such links this is ``et_rows[i]`` itself.
        """
        row = self.et_rows[i]
        if not self.charged or not self.inputs[i]:
            return row
        row = list(row)
        dev, lat, inv, share, received = self.device, self.latency, self.inv_bw, self.share, self.received
        for p, b in self.inputs[i]:
            d = dev[p]
            if d < 0:
                continue  # not placed yet (MP-DPS trying a unit): charged when it is
            for k in range(self.m):
                if k != d and share[d][k] > 0 and (p, k) not in received:
                    row[k] += self._share(d, k, b) * (lat[d][k] + b * inv[d][k])
        return row

    def _share(self, d: int, k: int, nbytes: float) -> float:
        """The share of a transfer of ``nbytes`` from ``d`` to ``k`` its end devices spend
        (:meth:`fddps.Cluster.transfer_share`; the link's own without a per-transfer CPU cost)."""
        if self.transfer_share is None:
            return self.share[d][k]
        return float(self.transfer_share(d, k, nbytes))

    def ready_times(self, i: int, devices) -> list[float]:
        """:meth:`ready_time` of op ``i`` on each of ``devices``.

        With uniform links this costs ``O(indegree + devices)`` instead of
        ``O(indegree * devices)``: a device waits for its own parents' finish
        and for the latest remote arrival from any *other* device, which is the
        largest or, on the device holding the largest, the second largest
        per-device maximum.
        """
        inputs = self.inputs[i]
        if not self.uniform_links or not inputs:
            return [self.ready_time(i, k) for k in devices]
        lat, inv = self._link
        dev, fin = self.device, self.finish
        if len(inputs) == 1:  # most ops: its producer's finish there, its arrival elsewhere
            (p, b), = inputs
            d, f = dev[p], fin[p]
            a = f + lat + b * inv
            return [f if k == d else a for k in devices]
        local, first_dev, first, second = _latest_arrivals(inputs, dev, fin, lat, inv)
        out = []
        for k in devices:
            r = second if k == first_dev else first
            own = local.get(k, 0.0)
            out.append(own if own > r else r)
        return out

    def earliest_start(self, i: int, k: int, insertion: bool = True) -> float:
        """Earliest start of op ``i`` on device ``k`` given its inputs and the device's gaps."""
        return self.timelines[k].earliest_start(self.ready_time(i, k), self.duration_row(i)[k],
                                                insertion)

    def place(self, i: int, k: int, start: float, duration: float | None = None):
        """Put op ``i`` on device ``k`` from ``start``; reserve its memory.

        ``duration``: ``duration_row(i)[k]`` where the caller has it already (it
        is the same until ``i`` is placed; with charged links it costs a walk
        over ``i``'s inputs).
        """
        if duration is None:
            duration = self.duration_row(i)[k]
        f = start + duration
        if self.links:
            for p, b in self.inputs[i]:
                d = self.device[p]
                if d >= 0 and d != k and (p, k) not in self.arrived and self.link_path[d][k]:
                    a = self.arrived[(p, k)] = self._arrival(p, b, d, k)
                    for r in self.link_path[d][k]:
                        self.link_free[r] = a
        if self.charged:
            receiving = duration - self.et_rows[i][k]
            for p, _ in self.inputs[i]:
                if self.device[p] != k and (p, k) not in self.received:
                    self.received[(p, k)] = start + receiving
        self.device[i] = k
        self.start[i] = start
        self.finish[i] = f
        self.timelines[k].add(i, start, f)
        need = self.memory_needed(i)
        self.mem_used[k] += need
        self.reserved += need
        g = self.group[i]
        if g >= 0 and self.group_device[g] < 0:
            self.group_device[g] = k

    # -- estimates for unplaced ops ----------------------------------------------------
    def mean_exec_time(self) -> np.ndarray:
        """Per op, the mean execution time over the devices it may run on (HEFT's estimate)."""
        return mean_exec_time(self.et)

    def mean_edge_comm(self) -> np.ndarray:
        """Per edge, the mean transfer time over distinct device pairs."""
        return self.cluster.mean_transfer_time(self.graph.bytes)

    def to_schedule(self, algorithm: str, info=None) -> Schedule:
        order = [tl.ops for tl in self.timelines]
        return Schedule.from_order(self.graph, self.cluster, self.device, order, algorithm, info,
                                   exec_time=self.et)


def _latest_arrivals(inputs, device, finish, lat, inv):
    """An op's inputs ``(producer, bytes)``, all placed, over identical links (latency
    ``lat``, seconds per byte ``inv``): ``(local, first_dev, first, second)``, ``local``
    the latest finish of a parent per device holding one, ``first`` the latest arrival of
    any parent on another device than its own (``first_dev`` the device of that parent),
    ``second`` the latest from any other device. The inputs are on device ``k`` at
    ``max(local.get(k, 0), second if k == first_dev else first)``."""
    local, remote = {}, {}
    for p, b in inputs:
        d, f = device[p], finish[p]
        if f > local.get(d, -1.0):
            local[d] = f
        a = f + lat + b * inv
        if a > remote.get(d, -1.0):
            remote[d] = a
    first_dev, first, second = -1, 0.0, 0.0
    for d, a in remote.items():
        if a > first:
            first_dev, first, second = d, a, first
        elif a > second:
            second = a
    return local, first_dev, first, second


def mean_exec_time(exec_time: np.ndarray) -> np.ndarray:
    """Per op (row of ``exec_time``, ``(n, m)``), the mean over its finite entries: the
    mean execution time over the devices it may run on (HEFT's estimate); 0 where none.

    >>> mean_exec_time(np.array([[1.0, 3.0], [2.0, np.inf]])).tolist()
    [2.0, 2.0]
    """
    et = np.where(np.isfinite(exec_time), exec_time, np.nan)
    with np.errstate(all="ignore"):
        mean = np.nanmean(et, axis=1) if et.shape[0] else np.zeros(0)
    return np.nan_to_num(mean)


def list_schedule(state: PlacementState, priority, insertion: bool = True,
                  minimize: str = "finish") -> PlacementState:
    """Place every op: ready ops by ascending ``priority``, each on its best device.

    Parameters
    ----------
    state : PlacementState
        Empty placement state of the graph and cluster; filled in and returned.
    priority : array of float, shape (n,)
        Smaller goes first among ready ops (ties: op index).
    insertion : bool
        Allow ops into idle gaps between placed ops.
    minimize : ``"finish"`` or ``"start"``
        The device where the op finishes first (HEFT, ETF-like passes), or
        starts first, ties by finish (FastT).

    Returns
    -------
    PlacementState

    Raises
    ------
    InfeasibleError
        If an op fits on no device (memory).
    """
    if minimize not in ("finish", "start"):
        raise ValueError(f"minimize must be 'finish' or 'start', got {minimize!r}")
    by_start = minimize == "start"
    if not by_start and state.uniform_links:
        if run_compiled(state, list_pass_jit.list_pass, priority, insertion) is not None:
            return state
        return _list_schedule_uniform(state, priority, insertion)
    return _list_schedule_any(state, priority, insertion, by_start)


def _ready_heap(graph, priority):
    """Inputs left per op, successor lists, priorities as Python lists, and the heap of
    the ops ready at the start ``(priority, op)``: what both list-pass loops begin with."""
    waiting = np.diff(graph.pred_ptr).tolist()
    succ_ptr, succ_idx = graph.succ_ptr.tolist(), graph.succ_idx.tolist()
    key = np.asarray(priority, dtype=np.float64).tolist()
    ready = [(key[i], i) for i in range(graph.num_ops) if waiting[i] == 0]
    heapq.heapify(ready)
    return waiting, succ_ptr, succ_idx, key, ready


def _list_schedule_any(state, priority, insertion, by_start):
    """:func:`list_schedule` on any cluster, through :class:`PlacementState`'s methods."""
    waiting, succ_ptr, succ_idx, key, ready = _ready_heap(state.graph, priority)
    timelines = state.timelines
    # Without charged links an op's duration row is its execution-time row.
    rows = None if state.charged else state.et_rows
    candidates, ready_times, place = state.candidates, state.ready_times, state.place
    pop, push = heapq.heappop, heapq.heappush
    while ready:
        _, i = pop(ready)
        row = rows[i] if rows is not None else state.duration_row(i)
        devices = candidates(i)
        if len(devices) == 1:  # pinned, colocated or runnable on one device only
            k = devices[0]
            s = timelines[k].earliest_start(ready_times(i, devices)[0], row[k], insertion)
        elif by_start:
            k, s = _earliest_start_device(timelines, devices, ready_times(i, devices), row,
                                          insertion)
        else:
            k, s = _earliest_finish_device(timelines, devices, ready_times(i, devices), row,
                                           insertion)
        place(i, k, s, row[k])
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[p]
            waiting[j] -= 1
            if waiting[j] == 0:
                push(ready, (key[j], j))
    return state


def run_compiled(state, compiled_pass, *args):
    """Fill the empty ``state`` by ``compiled_pass`` (:func:`list_pass_jit.list_pass` or
    :func:`~list_pass_jit.fddps_list_pass`, given ``args`` after its arrays); what the
    pass returned, or None where ``state`` has no compiled tables or ops placed already.

    Raises
    ------
    InfeasibleError
        As :meth:`PlacementState.candidates` does, where the pass found no room for an op.
    """
    if state.compiled_tables is None or any(tl.count for tl in state.timelines):
        return None
    g = state.graph
    arrays = dict(state.compiled_tables, pred_ptr=g.pred_ptr, pred_idx=g.pred_idx,
                  pred_bytes=np.ascontiguousarray(g.bytes[g.pred_eid], dtype=np.float64),
                  succ_ptr=g.succ_ptr, succ_idx=g.succ_idx)
    group_device = np.asarray(state.group_device, dtype=np.int64)
    mem_used = np.asarray(state.mem_used, dtype=np.float64)
    result = compiled_pass(arrays, *args, group_device, mem_used, state.reserved)
    failed, reserved, device, start, finish, (starts, finishes, ops, counts) = result[:6]
    state.device, state.start, state.finish = device.tolist(), start.tolist(), finish.tolist()
    state.mem_used, state.group_device = mem_used.tolist(), group_device.tolist()
    state.timelines = [DeviceTimeline.from_sorted(starts[k, :c], finishes[k, :c], ops[k, :c])
                       for k, c in enumerate(counts.tolist())]
    state.reserved = reserved
    if failed >= 0:
        state.candidates(failed)  # raises InfeasibleError naming the op, as the Python loop does
        raise RuntimeError(f"the compiled list pass found no room for op {failed} where "
                           f"PlacementState.candidates finds some")
    return result


def _list_schedule_uniform(state, priority, insertion):
    """:func:`list_schedule` minimising finish times where every link has one latency and
    bandwidth and no transfer is charged to a device (``state.uniform_links``).

    The same decisions as :func:`_list_schedule_any`, with the per-op work of
    :meth:`PlacementState.candidates`, :meth:`~PlacementState.ready_times`,
    :func:`_earliest_finish_device` and :meth:`~PlacementState.place` written
    into the loop: on such clusters (every preset of identical GPUs) the list
    pass is most of ``place()``'s decision, and the calls cost ~20% of it
    (Inception-V3, 4 P100s). Where memory runs short it asks
    :meth:`~PlacementState.candidates` itself, which raises as usual.
    """
    waiting, succ_ptr, succ_idx, key, ready = _ready_heap(state.graph, priority)
    timelines, rows, inputs_of = state.timelines, state.et_rows, state.inputs
    lat, inv = state._link
    device, start, finish = state.device, state.start, state.finish
    group, group_device, group_need = state.group, state.group_device, state.group_need
    need_of, allowed, mem_used = state.need, state.allowed, state.mem_used
    roomy, slack = state._roomy, 1 + _MEMORY_SLACK
    pop, push = heapq.heappop, heapq.heappush
    reserved = state.reserved
    while ready:
        _, i = pop(ready)
        row = rows[i]
        # Devices it may go to (PlacementState.candidates' common cases).
        g = group[i]
        if g >= 0 and group_device[g] >= 0:
            devices, need = (group_device[g],), 0.0
        else:
            need = need_of[i] if g < 0 else group_need[g]
            if need + reserved * slack <= roomy:
                devices = allowed[i]
            else:
                state.reserved = reserved
                devices = state.candidates(i)
        # When its inputs are on each device (PlacementState.ready_times): a
        # parent's finish on its own device, its arrival on every other one.
        inputs = inputs_of[i]
        local = None
        if not inputs:
            first_dev, first, second = -1, 0.0, 0.0
        elif len(inputs) == 1:
            (p, b), = inputs
            first_dev, second = device[p], finish[p]
            first = second + lat + b * inv
        else:
            local, first_dev, first, second = _latest_arrivals(inputs, device, finish, lat, inv)
        # The device where it finishes first (_earliest_finish_device).
        if len(devices) == 1:
            k = devices[0]
            r = second if k == first_dev else first
            if local is not None and local.get(k, 0.0) > r:
                r = local[k]
            s = timelines[k].earliest_start(r, row[k], insertion)
        else:
            bounds = []
            for k in devices:
                r = second if k == first_dev else first
                if local is not None and local.get(k, 0.0) > r:
                    r = local[k]
                bounds.append((r + row[k], k, r))
            bounds.sort()
            best_k, s, best_f = -1, 0.0, 0.0
            for bound, k, r in bounds:
                if best_k >= 0 and bound >= best_f:
                    break
                tl = timelines[k]
                if r >= tl.free_at:
                    t = r
                elif not insertion or not tl.blocks:
                    t = tl.free_at
                else:
                    t = tl.earliest_start(r, row[k], True)
                if best_k < 0 or t + row[k] < best_f:
                    best_k, s, best_f = k, t, t + row[k]
            k = best_k
        # Place it (PlacementState.place without link queues or charged transfers).
        f = s + row[k]
        device[i], start[i], finish[i] = k, s, f
        timelines[k].add(i, s, f)
        mem_used[k] += need
        reserved += need
        if g >= 0 and group_device[g] < 0:
            group_device[g] = k
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            waiting[j] -= 1
            if waiting[j] == 0:
                push(ready, (key[j], j))
    state.reserved = reserved
    return state


# An op cannot start before its inputs arrive, nor finish before that plus its
# run time: both helpers visit devices by that bound and stop once it cannot win.

def _earliest_finish_device(timelines, devices, readies, row, insertion):
    """``(device, start)`` where an op finishes first (ties: the first by bound, then
    device); ``readies[j]`` is when its inputs are on ``devices[j]``, ``row[k]`` its
    duration on device ``k``."""
    best_k, best_s, best_f = -1, 0.0, 0.0
    for bound, k, r in sorted([(r + row[k], k, r) for k, r in zip(devices, readies)]):
        # A device whose bound only ties the best cannot beat it (a tie keeps the
        # first): on identical devices most tie.
        if best_k >= 0 and bound >= best_f:
            break
        # DeviceTimeline.earliest_start's first test, inline: most ops are ready
        # after the device's last op, and the call costs more than the test.
        tl = timelines[k]
        if r >= tl.free_at:
            s = r
        elif not insertion or not tl.blocks:
            s = tl.free_at
        else:
            s = tl.earliest_start(r, row[k], True)
        f = s + row[k]
        if best_k < 0 or f < best_f:
            best_k, best_s, best_f = k, s, f
    return best_k, best_s


def _earliest_start_device(timelines, devices, readies, row, insertion):
    """``(device, start)`` where an op starts first, ties by finish (FastT); as
    :func:`_earliest_finish_device` otherwise."""
    best = None
    for bound, k, r in sorted(zip(readies, devices, readies)):
        if best is not None and bound > best[0][0]:
            break
        s = timelines[k].earliest_start(r, row[k], insertion)
        choice = ((s, s + row[k]), k, s)
        if best is None or choice[0] < best[0]:
            best = choice
    return best[1], best[2]
