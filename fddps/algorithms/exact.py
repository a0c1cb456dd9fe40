"""Exact scheduling with a constraint solver (OR-Tools CP-SAT).

For graphs small enough (tens of ops), ``algorithm="exact"`` finds a schedule
of minimum makespan and *proves* it minimal, or returns the best schedule found
within ``time_limit`` together with the solver's lower bound. It answers the
question every heuristic leaves open: how far from the best is this?

The model (one CP-SAT model per call):

- per op ``i`` a start ``s_i`` and end ``e_i``; per device ``k`` it may run on
  (:attr:`PlacementState.allowed`: kernels, pins and colocation exactly as the
  list schedulers read them) a literal ``x_ik`` and an optional interval
  ``[s_i, e_i)`` of length ``ET(i, k)`` present iff ``x_ik``; exactly one
  ``x_ik`` per op; members of a colocation group share their literals;
- no overlap of the present intervals on each device (a zero-length op cannot
  sit inside another op either: a device runs its ops one after another);
- per edge ``(p, c)`` of ``b`` bytes: ``s_c >= e_p``, plus the transfer
  ``latency(a, b) + bytes / bandwidth(a, b)`` when ``p`` is on ``a`` and ``c``
  on ``b != a`` (one literal "same device" per edge when all links are alike,
  one constraint per device pair otherwise);
- memory: per device, the summed reservation of its ops within its capacity
  (see *Memory* below);
- minimise the makespan ``max e_i``.

Times are integers for the solver: ticks of ``2**-40`` times an upper bound on
the makespan, rounded *down* (execution and transfer times alike). The
rounded problem is a relaxation of the real one, so the solver's bound is a
valid lower bound; the returned schedule is the solver's placement and
per-device order replayed in exact arithmetic (:meth:`Schedule.from_order`),
which can exceed the solver's value by at most one tick per op and edge on a
path (relative ``~1e-11`` on these graphs). ``info["optimal"]`` means proven
optimal to that resolution.

Memory. The project's constraint is the replayed peak per device
(:meth:`Schedule.peak_memory`). The solver first reserves persistent bytes per
device (a relaxation: the peak is at least that); when the replayed schedule's
peak fits, which is the usual case, its optimality is optimality under the
real constraint. When it overflows, the solver runs again reserving ``memory +
transient`` of each op for the whole step (the conservative reservation the
list schedulers fall back to, :func:`reserving_transient`); the returned
schedule then passes :meth:`Schedule.validate` but is proven optimal only for
that reservation: ``info["optimal"]`` is then true only if it meets the first
run's lower bound, and ``info["memory_model"]`` says which reservation held.
Bytes are rounded up and capacities down to whole bytes.

Links that spend device time (``Cluster.transfer_compute > 0``: CPU tasks over
gRPC) are refused with a :class:`~fddps.errors.ClusterError`: there a
transfer adds send and receive tasks to the devices (:mod:`fddps.simulate`),
which this model does not have. So are clusters whose devices share cores
or links (the simulator's contention model).

Warm start: the best schedule of the heuristics in ``warm_start`` (by default
``fddps``, ``heft``, ``etf``) is given to the solver as a hint and as an upper
bound, and is returned if the solver finds nothing better, so ``exact`` is
never worse than them. Identical devices (same type, speed, memory, links, and
no op told apart by a pin) are interchangeable; the model only admits the
labelling where, among such devices, the first one holds the lowest-numbered
op, the second the lowest-numbered of the rest, and so on.

Reproducible: the solver runs with a fixed seed and ``workers`` threads
(a deterministic search for ``workers=1``, and with more by interleaved
search), so a run that proves optimality returns the same schedule every time.
``time_limit`` is wall-clock seconds, so a run it stops can stop at a different
point on a busier machine; ``deterministic_limit`` (the solver's own work
measure) stops the same input at the same point on any machine. On this
2-core shared machine one unit of it took about 14 wall seconds.

Reach, as measured (README, "Exact schedules"): see the table there.

Example
-------
>>> from fddps import OpGraph, Cluster, schedule
>>> g = OpGraph(list("abcd"), [2.0, 1.0, 1.0, 1.0],
...             [("a", "b", 1e9), ("a", "c", 1e9), ("b", "d", 1e9), ("c", "d", 1e9)])
>>> s = schedule(g, Cluster.homogeneous(2, bandwidth=1e9), "exact", time_limit=5)
>>> s.makespan, s.info["optimal"]
(5.0, True)
"""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import time

import numpy as np

from ..bounds import communication_lower_bound, identical_device_classes
from ..errors import ClusterError, InfeasibleError
from ..schedule import Schedule
from .local_search import edge_transfer_table, replay_table
from .base import (PlacementState, Scheduler, get_algorithm, memory_overflow, register,
                   _RESERVE_TRANSIENT)

#: Solver ticks per upper bound on the makespan (see the module docstring).
TICKS = 2 ** 40

#: What each stage of :meth:`Exact._schedule` holds within a device's capacity.
MEMORY_MODELS = {
    "persistent": "persistent bytes (the replayed peak fits)",
    "peak": "replayed peak: persistent, transient until the last local reader, received copies",
    "reserve": "memory + transient bytes of every op reserved for the whole step",
}

#: Heuristics whose best schedule warm-starts the solver by default.
WARM_START = ("fddps", "heft", "etf")


def _check_positive(name, value, integer=False):
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value) == int(value)
    if not ok or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ValueError(f"exact: option {name} must be {kind}, got {value!r}")


@register
class Exact(Scheduler):
    """Minimum-makespan schedules by constraint programming (OR-Tools CP-SAT).

    Parameters
    ----------
    time_limit : float
        Solver budget in wall-clock seconds (> 0; default 10). The best
        schedule found is returned when it runs out; ``info["optimal"]`` says
        whether it was proven optimal.
    deterministic_limit : float or None
        Also stop after this much of the solver's deterministic time (> 0), a
        budget that does not depend on the machine's speed or load.
    workers : int
        Solver threads (default 1; results are reproducible for any value).
    max_ops : int
        Graphs with more ops are refused (default 120): the model grows with
        ops x devices and edges x device pairs, and a proof on larger graphs
        is out of reach in any reasonable limit.
    seed : int
        The solver's random seed.
    warm_start : sequence of str
        Algorithms whose best schedule seeds the solver (default ``fddps``,
        ``heft``, ``etf``); ``()`` for none.

    ``Schedule.info`` gets ``lower_bound`` (seconds; the solver's bound),
    ``optimal`` (bool, proven), ``status`` (the solver's: ``OPTIMAL``,
    ``FEASIBLE``, ``UNKNOWN``), ``warm_start`` (the heuristic that seeded it
    and its makespan), ``memory_model`` and ``solver_seconds``.

    Raises
    ------
    ValueError
        On a non-positive ``time_limit``, ``workers`` or ``max_ops``, or a
        graph with more than ``max_ops`` ops (the message names both).
    ClusterError
        On a cluster whose links spend device time (``transfer_compute > 0``),
        or whose devices share cores or links (:class:`~fddps.cluster.SharedCores`,
        :class:`~fddps.cluster.LinkResource`).
    InfeasibleError
        If no placement fits the memory (as the other schedulers).
    """

    name = "exact"

    def __init__(self, time_limit=10.0, workers=1, max_ops=120, seed=0, warm_start=WARM_START,
                 deterministic_limit=None):
        self.time_limit = time_limit
        self.deterministic_limit = deterministic_limit
        self.workers = workers
        self.max_ops = max_ops
        self.seed = seed
        self.warm_start = warm_start

    def _check(self, graph, cluster):
        _check_positive("time_limit", self.time_limit)
        if self.deterministic_limit is not None:
            _check_positive("deterministic_limit", self.deterministic_limit)
        _check_positive("workers", self.workers, integer=True)
        _check_positive("max_ops", self.max_ops, integer=True)
        unknown = [a for a in self.warm_start if a == self.name]
        if isinstance(self.warm_start, str) or unknown:
            raise ValueError(f"exact: warm_start must be a sequence of other algorithms' names, "
                             f"got {self.warm_start!r}")
        if graph.num_ops > self.max_ops:
            raise ValueError(
                f"exact: the graph has {graph.num_ops} ops, more than max_ops={self.max_ops}; "
                f"the solver would not prove anything in a useful time. Use a heuristic "
                f"(fddps) or raise max_ops knowingly")
        if np.any(cluster.transfer_compute > 0):
            k, l = map(int, np.argwhere(cluster.transfer_compute > 0)[0])
            raise ClusterError(
                f"exact: the link {cluster.names[k]!r} -> {cluster.names[l]!r} spends device "
                f"time on transfers (transfer_compute > 0), which the exact model does not "
                f"have; schedule this cluster with a heuristic (fddps)")
        if cluster.shares_hardware:
            shared = "; ".join(cluster.sharing_summary())
            raise ClusterError(
                f"exact: devices of this cluster share cores or links ({shared}), which the "
                f"exact model does not have (it gives each op and transfer its full speed); "
                f"schedule this cluster with a heuristic (fddps)")

    def _schedule(self, graph, cluster) -> Schedule:
        self._check(graph, cluster)
        if solver_needs_child_process():
            return _run_isolated(self, graph, cluster)
        t0 = time.perf_counter()
        heuristics = self._heuristic_schedules(graph, cluster)
        # Each stage's model is a relaxation of the real memory rule except the
        # last, so its bound holds; a stage's schedule is kept once its peak fits.
        stages = ["persistent", "peak", "reserve"]
        if _RESERVE_TRANSIENT.get():
            stages = ["reserve"]
        elif not np.isfinite(cluster.memory).any() or not graph.transient.any():
            stages = ["persistent"]
        bound, result = 0.0, None
        for stage in stages:
            try:
                result = _solve(graph, cluster, heuristics, stage, self)
            except InfeasibleError:
                if stage == stages[-1]:
                    raise
                continue
            if stage != "reserve":
                bound = max(bound, result.info["lower_bound"])
            if memory_overflow(result) is None:
                break
        result.info["memory_model"] = MEMORY_MODELS[stage]
        if stage == "reserve" and len(stages) > 1:
            result.info["lower_bound"] = min(bound, result.makespan)
            result.info["optimal"] = bool(result.makespan <= bound * (1 + 1e-9))
        result.info["solver_seconds"] = time.perf_counter() - t0
        result.algorithm = self.name
        return result

    def _heuristic_schedules(self, graph, cluster):
        """Name -> schedule of each warm-start heuristic that finds one within memory."""
        out = {}
        for name in self.warm_start:
            try:
                out[name] = get_algorithm(name).schedule(graph, cluster)
            except InfeasibleError:
                continue
        return out


def _solve(graph, cluster, heuristics, memory_model, options) -> Schedule:
    """One CP-SAT run under one of :data:`MEMORY_MODELS`; the best schedule found
    (see the module docstring)."""
    cp_model = _import_cp_model()

    reserve_transient = memory_model == "reserve"
    state = PlacementState(graph, cluster, reserve_transient=reserve_transient)
    n, m = graph.num_ops, cluster.num_devices
    et = state.et
    allowed = state.allowed
    topo_rank = np.empty(n, dtype=np.int64)
    topo_rank[graph.topo] = np.arange(n)
    need = np.asarray(state.need, dtype=np.float64)
    capacity = cluster.memory

    def fits(s):
        if not np.isfinite(capacity).any():
            return True
        used = np.bincount(s.device, weights=need, minlength=m)
        return bool(np.all(used <= capacity))

    # Heuristic schedules that satisfy this model's memory rule seed the solver.
    candidates = sorted(((s.makespan, name, s) for name, s in heuristics.items()),
                        key=lambda t: (t[0], t[1]))
    seeds = [(mk, name, s) for mk, name, s in candidates if fits(s)]
    upper = seeds[0][0] if seeds else _serial_bound(graph, cluster, et, allowed)
    if n == 0 or upper <= 0:
        if seeds:
            best = seeds[0][2]
            return _finish(best, 0.0, True, "OPTIMAL", seeds[0][1], seeds[0][0])
    unit = max(upper, 1e-300) / TICKS
    dur = np.where(np.isfinite(et), np.floor(et / unit), 0).astype(np.int64)
    comm = np.floor(edge_transfer_table(graph, cluster) / unit).astype(np.int64)  # (e,) or (e, m, m)
    uniform = comm.ndim == 1
    horizon = int(_serial_ticks(dur, allowed, comm)) + 1
    if seeds:
        horizon = min(horizon, TICKS + 1)

    model = cp_model.CpModel()
    start = [model.NewIntVar(0, horizon, f"s{i}") for i in range(n)]
    end = [model.NewIntVar(0, horizon, f"e{i}") for i in range(n)]
    x = [dict() for _ in range(n)]
    on_device = [[] for _ in range(m)]
    group_lit = {}
    for i in range(n):
        g = state.group[i]
        for k in allowed[i]:
            if g >= 0 and (g, k) in group_lit:
                lit = group_lit[(g, k)]
            else:
                lit = model.NewBoolVar(f"x{i}_{k}")
                if g >= 0:
                    group_lit[(g, k)] = lit
            x[i][k] = lit
            iv = model.NewOptionalIntervalVar(start[i], int(dur[i, k]), end[i], lit, f"iv{i}_{k}")
            on_device[k].append((i, iv))
        model.AddExactlyOne(x[i].values())
    for k in range(m):
        if len(on_device[k]) > 1:
            model.AddNoOverlap([iv for _, iv in on_device[k]])
        # CP-SAT lets a zero-length interval sit inside another; a device cannot.
        for z, _ in on_device[k]:
            if dur[z, k] > 0:
                continue
            for j, _ in on_device[k]:
                if j == z or dur[j, k] == 0:
                    continue
                before = model.NewBoolVar(f"b{z}_{j}_{k}")
                model.Add(start[z] <= start[j]).OnlyEnforceIf([before, x[z][k], x[j][k]])
                model.Add(start[z] >= end[j]).OnlyEnforceIf([before.Not(), x[z][k], x[j][k]])

    # Precedence, with the transfer when the ends sit on different devices.
    for e in range(graph.num_edges):
        p, c = int(graph.src[e]), int(graph.dst[e])
        model.Add(start[c] >= end[p])
        if uniform:
            w = int(comm[e])
            if w == 0:
                continue
            same = model.NewBoolVar(f"same{e}")
            for k, xp in x[p].items():
                xc = x[c].get(k)
                if xc is None:
                    model.AddBoolOr([same.Not(), xp.Not()])
                else:
                    model.AddBoolOr([xc]).OnlyEnforceIf([same, xp])
                    model.AddBoolOr([same, xp.Not(), xc.Not()])
            model.Add(start[c] >= end[p] + w).OnlyEnforceIf(same.Not())
        else:
            for a, xp in x[p].items():
                for b, xc in x[c].items():
                    w = int(comm[e, a, b])
                    if a != b and w > 0:
                        model.Add(start[c] >= end[p] + w).OnlyEnforceIf([xp, xc])

    # Memory: the reservation of a device's ops within its capacity.
    for k in range(m):
        if not np.isfinite(capacity[k]):
            continue
        terms = [(int(math.ceil(need[i])), x[i][k]) for i, _ in on_device[k] if need[i] > 0]
        # A colocation group's literal appears once per member: its need adds up.
        if terms and sum(w for w, _ in terms) > capacity[k]:
            model.Add(sum(w * lit for w, lit in terms) <= int(math.floor(capacity[k])))

    if memory_model == "peak":
        _add_peak_memory(model, graph, cluster, x, start, end, horizon, comm, unit)

    classes = identical_device_classes(graph, cluster, et, allowed, state.capacity)
    for cls in classes:
        for t in range(len(cls) - 1):
            prev, cur = cls[t], cls[t + 1]
            for j in range(n):
                if cur not in x[j]:
                    continue
                earlier = [x[i][prev] for i in range(j) if prev in x[i]]
                if earlier:
                    model.AddBoolOr(earlier).OnlyEnforceIf(x[j][cur])
                else:
                    model.Add(x[j][cur] == 0)

    makespan = model.NewIntVar(0, horizon, "makespan")
    # The communication-aware bound, less a margin for the ticks' rounding, helps
    # the solver's own bound (it is weak on work-bound instances).
    known = int(communication_lower_bound(graph, cluster) / unit) - 2 * (n + graph.num_edges) - 2
    if 0 < known <= horizon:
        model.Add(makespan >= known)
    sinks = [i for i in range(n) if graph.succ_ptr[i + 1] == graph.succ_ptr[i]]
    model.AddMaxEquality(makespan, [end[i] for i in sinks])
    model.Minimize(makespan)

    warm_name, warm_makespan = None, None
    if seeds:
        warm_makespan, warm_name, hint = seeds[0]
        device = _canonical_devices(hint.device, classes)
        order = [[] for _ in range(m)]
        for k_old, seq in enumerate(hint.order):
            for i in seq.tolist():
                order[device[i]].append(i)
        hs, he = replay_table(graph, device, order, dur, comm)
        span = int(max(he[i] for i in sinks))
        model.Add(makespan <= span)
        hinted = set()  # a colocation group's literals are shared: hint them once
        for i in range(n):
            model.AddHint(start[i], hs[i])
            model.AddHint(end[i], he[i])
            for k, lit in x[i].items():
                if lit.Index() not in hinted:
                    hinted.add(lit.Index())
                    model.AddHint(lit, int(device[i] == k))
        model.AddHint(makespan, span)

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = int(options.seed)
    prm.num_workers = int(options.workers)
    if options.workers > 1:
        prm.interleave_search = True
    prm.max_time_in_seconds = float(options.time_limit)
    if options.deterministic_limit is not None:
        prm.max_deterministic_time = float(options.deterministic_limit)
    status = solver.Solve(model)
    status_name = solver.StatusName(status)
    if status == cp_model.MODEL_INVALID:  # a bug here, not the user's input
        raise RuntimeError(f"exact: CP-SAT rejected the model: {model.Validate()}")
    if status == cp_model.INFEASIBLE and not seeds:
        raise InfeasibleError(
            f"exact: no schedule keeps every device's memory ({MEMORY_MODELS[memory_model]}) "
            "within its capacity (proven by the solver)")
    bound = 0.0 if status == cp_model.INFEASIBLE else max(0.0, solver.BestObjectiveBound() * unit)
    best = seeds[0][2] if seeds else None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        device = np.array([next(k for k, lit in x[i].items() if solver.Value(lit))
                           for i in range(n)], dtype=np.int64)
        s_val = [solver.Value(start[i]) for i in range(n)]
        order = []
        for k in range(m):
            ops = [i for i in range(n) if device[i] == k]
            # At one instant a zero-length op goes first: it was placed before the other.
            ops.sort(key=lambda i: (s_val[i], dur[i, k] > 0, topo_rank[i]))
            order.append(ops)
        found = Schedule.from_order(graph, cluster, device, order, exec_time=et)
        if best is None or found.makespan <= best.makespan:
            best = found
    elif best is None:
        raise InfeasibleError(f"exact: the solver found no schedule within time_limit="
                              f"{options.time_limit} (status {status_name}) and no warm-start "
                              f"heuristic found one either")
    return _finish(best, min(bound, best.makespan), status == cp_model.OPTIMAL, status_name,
                   warm_name, warm_makespan)


# -- running CP-SAT ------------------------------------------------------------------
# OR-Tools and TensorFlow each carry their own protobuf and absl: once TensorFlow
# was imported first, CP-SAT crashes the process (a segmentation fault in Solve,
# or in printing a model; google/or-tools#3230, "nothing we can do about it").
# Imported the other way round they coexist. So the solver runs in this process
# when OR-Tools was loaded before TensorFlow (or TensorFlow not at all), and
# otherwise in a child Python that imports OR-Tools first (:func:`_run_isolated`).
_TF_LOADED_FIRST = None  # decided when this module first imports OR-Tools


def _import_cp_model():
    global _TF_LOADED_FIRST
    if _TF_LOADED_FIRST is None:
        _TF_LOADED_FIRST = ("tensorflow" in sys.modules
                            and "ortools.sat.python.cp_model" not in sys.modules)
    from ortools.sat.python import cp_model
    return cp_model


def solver_needs_child_process() -> bool:
    """Whether CP-SAT must run in a child process here (TensorFlow was imported
    before OR-Tools, which then crashes in this one)."""
    _import_cp_model()
    return bool(_TF_LOADED_FIRST)


_CHILD = r"""
import pickle, sys
from ortools.sat.python import cp_model  # before anything imports TensorFlow
sys.path[:0] = pickle.load(sys.stdin.buffer)
from fddps.algorithms.base import reserving_transient
scheduler, graph, cluster, reserve = pickle.load(sys.stdin.buffer)
with reserving_transient(reserve):
    try:
        out = (scheduler._schedule(graph, cluster), None)
    except Exception as e:  # the parent raises it
        out = (None, e)
pickle.dump(out, sys.stdout.buffer)
"""


def _run_isolated(scheduler, graph, cluster) -> Schedule:
    """``scheduler._schedule(graph, cluster)`` in a child Python that imports
    OR-Tools before anything else; its schedule (or exception) comes back pickled.

    Raises
    ------
    RuntimeError
        If the child process dies (its error output is in the message).
    """
    payload = pickle.dumps(sys.path) + pickle.dumps(
        (scheduler, graph, cluster, _RESERVE_TRANSIENT.get()))
    run = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True)
    if run.returncode != 0:
        raise RuntimeError(f"exact: the CP-SAT child process failed (exit status "
                           f"{run.returncode}): {run.stderr.decode(errors='replace')[-2000:]}")
    schedule, error = pickle.loads(run.stdout)
    if error is not None:
        raise error
    # The child's schedule holds copies: give back the caller's own graph and cluster.
    return Schedule(graph, cluster, schedule.device, schedule.order, schedule.start,
                    schedule.finish, schedule.algorithm, schedule.info)


def _finish(schedule, bound, optimal, status, warm_name, warm_makespan) -> Schedule:
    """A fresh schedule (same placement and times) carrying the solver's facts in ``info``."""
    out = Schedule(schedule.graph, schedule.cluster, schedule.device, schedule.order,
                   schedule.start, schedule.finish, "exact",
                   {"lower_bound": float(bound), "optimal": bool(optimal), "status": status,
                    "warm_start": warm_name, "warm_start_makespan": warm_makespan})
    return out


def _serial_bound(graph, cluster, et, allowed) -> float:
    """Makespan of some schedule, when no heuristic gave one: every op at its slowest
    allowed device time, every edge at its slowest transfer, one after another."""
    slow = sum(max(et[i, k] for k in allowed[i]) for i in range(graph.num_ops))
    m = cluster.num_devices
    if m > 1:
        off = ~np.eye(m, dtype=bool)
        slow += float(np.sum(cluster.latency[off].max() + graph.bytes * cluster.inv_bandwidth[off].max()))
    return float(slow)


def _serial_ticks(dur, allowed, comm) -> int:
    """Horizon in ticks: no left-justified schedule ends later."""
    total = sum(int(max(dur[i, k] for k in allowed[i])) for i in range(dur.shape[0]))
    if comm.size:
        total += int(comm.sum() if comm.ndim == 1 else comm.max(axis=(1, 2)).sum())
    return total


def _canonical_devices(device, classes) -> np.ndarray:
    """Relabel ``device`` within each class of identical devices so the class's
    devices hold ops in increasing order of their lowest-numbered op (the
    labelling the model's symmetry breaking admits)."""
    device = np.asarray(device, dtype=np.int64).copy()
    for cls in classes:
        first = {}
        for i, k in enumerate(device.tolist()):
            if k in cls and k not in first:
                first[k] = i
        used = sorted(first, key=first.get)
        mapping = {old: new for old, new in zip(used, cls)}
        sel = np.isin(device, cls)
        device[sel] = [mapping[k] for k in device[sel].tolist()]
    return device


def _add_peak_memory(model, graph, cluster, x, start, end, horizon, comm, unit):
    """Per device of finite capacity, a cumulative constraint over the step that
    holds what :func:`fddps.simulate.peak_memory` counts: persistent bytes all
    step, an op's transient bytes from its start until its last reader on that
    device ends, and one received copy per (producer, receiving device), of the
    largest edge there capped at the producer's transient bytes, from its first
    arrival until its last reader there ends. Release and arrival times are the
    solver's to choose within those limits; holding longer only costs it, so at
    an optimum they are the ones the replay sees."""
    n, m = graph.num_ops, cluster.num_devices
    capacity = cluster.memory
    per_device = [([], []) for _ in range(m)]   # (intervals, demands)

    def hold(k, interval, demand):
        per_device[k][0].append(interval)
        per_device[k][1].append(demand)

    whole = lambda lit, name: model.NewOptionalFixedSizeIntervalVar(0, horizon, lit, name)
    succ = [graph.successors(i).tolist() for i in range(n)]
    eid = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(graph.src, graph.dst))}
    transient, own = graph.transient, graph.allocated
    for i in range(n):
        for k, lit in x[i].items():
            if np.isfinite(capacity[k]) and graph.memory[i] > 0:
                hold(k, whole(lit, f"mem{i}_{k}"), int(math.ceil(graph.memory[i])))
        if transient[i] <= 0:
            continue
        if own[i] > 0:  # an alias allocates nothing (its input's longer life is not modelled: a relaxation)
            t_i = int(math.ceil(own[i]))
            release = model.NewIntVar(0, horizon, f"rel{i}")
            model.Add(release >= end[i])
            for j in succ[i]:
                for k, lit in x[i].items():
                    if k in x[j]:
                        model.Add(release >= end[j]).OnlyEnforceIf([lit, x[j][k]])
            size = model.NewIntVar(0, horizon, f"live{i}")
            model.Add(size == release - start[i])
            for k, lit in x[i].items():
                if np.isfinite(capacity[k]):
                    iv = model.NewOptionalIntervalVar(start[i], size, release, lit, f"tr{i}_{k}")
                    hold(k, iv, t_i)
        # Received copies of this op's outputs on each other device.
        readers = [(j, min(graph.bytes[eid[(i, j)]], transient[i])) for j in succ[i]]
        readers = [(j, b) for j, b in readers if b > 0]
        for k in range(m):
            on_k = [(j, b) for j, b in readers if k in x[j]]
            if not on_k or not np.isfinite(capacity[k]):
                continue
            there = model.NewBoolVar(f"copy{i}_{k}")
            copy_size = model.NewIntVar(0, int(math.ceil(max(b for _, b in on_k))), f"csz{i}_{k}")
            arrive = model.NewIntVar(0, horizon, f"carr{i}_{k}")
            leave = model.NewIntVar(0, horizon, f"clv{i}_{k}")
            here = x[i].get(k)
            for j, b in on_k:
                xj = x[j][k]
                away = [xj] + ([here.Not()] if here is not None else [])
                model.AddBoolOr([there, *[lit.Not() for lit in away]])
                model.Add(copy_size >= int(math.ceil(b))).OnlyEnforceIf(away)
                model.Add(leave >= end[j]).OnlyEnforceIf(away)
                e = eid[(i, j)]
                for a, xa in x[i].items():
                    if a == k:
                        continue
                    w = int(comm[e] if comm.ndim == 1 else comm[e, a, k])
                    model.Add(arrive <= end[i] + w).OnlyEnforceIf([xj, xa])
            model.Add(arrive <= leave)
            span = model.NewIntVar(0, horizon, f"clen{i}_{k}")
            model.Add(span == leave - arrive)
            hold(k, model.NewOptionalIntervalVar(arrive, span, leave, there, f"cp{i}_{k}"), copy_size)
    for k in range(m):
        intervals, demands = per_device[k]
        if intervals:
            model.AddCumulative(intervals, demands, int(math.floor(capacity[k])))
