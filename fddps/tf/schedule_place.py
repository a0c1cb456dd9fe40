"""Decide and write with a scheduler: an algorithm's placement and order, as a placed GraphDef.

:func:`place_scheduled` is :func:`fddps.tf.place`'s path for the schedulers
(FD-DPS and the baselines): the analysed graph as an op graph for the cluster
(:func:`fddps.tf.read.read_graph_def`), the scheduler's schedule, the order
guard (:func:`order_guard`), and the placed GraphDef (:mod:`fddps.tf.write`).
When the algorithm splits ops (FD-DPS's intra-op parallelism,
:mod:`fddps.algorithms.split_step`), each split op ``X`` becomes slice, part
and combine nodes (:mod:`fddps.tf.split_rewrite`): ``X`` is then the combine
node, which produces the same tensor, so consumers and fetches are still
unchanged.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import FddpsError, InfeasibleError
from ..simulate import executor_policy, simulated_makespan
from .devices import make_cluster
from .fetches import record_fetches
from .placement import Placement
from .read import read_graph_def
from .verify import ONE_DEVICE, distinct_finalists
from .write import add_order_edges, assign_off_step, write_devices


#: How much faster than one device a spread must be predicted, per executor
#: model, for the order guard to keep it. On CPU workers over gRPC ("tensorflow")
#: identical graphs measured up to 8% apart, and a VGG-16 spread predicted 1.02x
#: faster ran at 0.91x one worker (experiments.real_cluster, 2026-11-26): a spread
#: the model does not predict clearly faster is not worth the risk there.
SPREAD_MARGIN = {"tensorflow": 0.10, "fifo": 0.0}


def order_guard(graph, cluster, schedule, enforce_order, can_enforce):
    """Whether to enforce the schedule's order, or fall back to one device (``enforce_order="auto"``).

    TensorFlow's executor picks each device's order itself; predicted that way
    (:func:`fddps.simulate` with :func:`~fddps.simulate.executor_policy`'s
    executor: on CPU workers TensorFlow's, depth first, a worker's sends behind
    the op it starts next) the step may be slower than on the best
    single device, or, on CPU workers, less than :data:`SPREAD_MARGIN` faster.
    Then the scheduled order is enforced when it can be
    (``can_enforce``: fetches given), the scheduled step, predicted as
    TensorFlow runs it held to that order, beats one device, and the devices
    are not CPU workers over gRPC (where order edges measured far slower than
    predicted);
    otherwise the whole graph goes on the best single device
    (:class:`~fddps.algorithms.single.SingleDevice`), if one can hold it.

    Returns ``(schedule, enforce, info)``: the schedule to write (the
    single-device one after a fallback), whether to add order edges, and
    ``order_guard`` ("" when nothing was done, "enforced order" or "single
    device"), ``tf_order_makespan``, ``single_makespan`` and, when it came to
    that, ``enforced_order_makespan`` (seconds; NaN when not computed or no
    single device can hold the graph), and ``order_guard_reason``.
    """
    from ..algorithms import get_algorithm

    info = {"order_guard": "", "tf_order_makespan": float("nan"),
            "single_makespan": float("nan")}
    if enforce_order != "auto":
        return schedule, bool(enforce_order), info
    policy = executor_policy(cluster)
    margin = SPREAD_MARGIN[policy]
    tf_order = simulated_makespan(schedule.graph, cluster, schedule.device, policy=policy)
    info["tf_order_makespan"] = tf_order
    if _devices_used(schedule) == 1 or (margin == 0 and tf_order <= schedule.makespan * (1 + 1e-9)):
        return schedule, False, info
    try:
        single = get_algorithm("single").schedule(graph, cluster)
    except InfeasibleError:  # no device holds the whole graph: nothing to compare with
        single = None
    if single is not None:
        info["single_makespan"] = float(single.makespan)
    if single is None or tf_order * (1 + margin) <= single.makespan * (1 + 1e-9):
        return schedule, False, info
    # Held to the scheduled order, a worker still serves its sends on the thread
    # that runs the step (simulate with the order and the "tensorflow" executor).
    enforced = simulated_makespan(schedule.graph, cluster, schedule.device, order=schedule.order,
                                  policy=policy)
    info["enforced_order_makespan"] = enforced
    # On CPU workers over gRPC (the "tensorflow" executor model) order edges measured
    # far slower than predicted: VGG-16's spreads on two workers, held to FD-DPS's and
    # HEFT's orders, ran at 0.77-0.82x one worker where 1.12-1.21x was predicted
    # (experiments.real_cluster, 2026-11-26). There the guard falls back to one device.
    trusted = policy != "tensorflow"
    if can_enforce and trusted and enforced < single.makespan:
        info["order_guard"] = "enforced order"
        return schedule, True, info
    info["order_guard"] = "single device"
    if tf_order < single.makespan:
        reason = (f"predicted only {single.makespan / tf_order:.2f}x faster than one device, "
                  f"under the {1 + margin:.2f}x a spread needs with the {policy} executor model")
    elif not can_enforce:
        reason = "without fetches no order can be enforced"
    elif enforced >= single.makespan:
        reason = "the scheduled order is no faster than one device either"
    else:
        reason = "order edges on CPU workers measured slower than predicted"
    info["order_guard_reason"] = reason
    return single, False, info


def place_scheduled(analysis, devices, scheduler, cost_model, memory=None, *, override=False,
                    fetches=None, enforce_order="auto", session_config=None, topology="auto",
                    finalists=0):
    """Schedule an analysed graph with ``scheduler`` and write it placed; a :class:`Placement`.

    Parameters are :func:`fddps.tf.place`'s (``analysis`` from
    :func:`fddps.tf.graphdef.analyse`, ``scheduler`` an algorithm instance from
    :func:`fddps.get_algorithm`). ``info`` gains ``cost_seconds`` (building the
    op graph: the cluster, every op's cost, the split candidates) and
    ``decide_seconds`` (the schedule and the order guard).

    ``finalists``: when > 0, the placement's ``finalists`` holds up to that
    many distinct placements to time (``place(..., verify=...)``), best
    predicted first: this one; the best one-device graph; the scheduled order
    enforced or left to TensorFlow (whichever this one is not); the schedule
    with or without its splits (whichever this one is not). They come from
    the schedules already made (the best single device is one sum), never
    from reading the graph again.
    """
    t0 = time.perf_counter()
    algorithm = scheduler.name
    cluster = make_cluster(devices, cost_model, memory, session_config=session_config,
                           topology=topology)
    graph, info = read_graph_def(analysis, cost_model, cluster, override, fetches=fetches)
    t_read = time.perf_counter()
    scheduled = scheduler.schedule(graph, cluster)
    schedule, enforce_order, guard = order_guard(graph, cluster, scheduled, enforce_order,
                                                 fetches is not None)
    t_decided = time.perf_counter()

    def write(schedule, enforce_order, guard, info):
        """The :class:`Placement` of ``schedule``, with order edges when ``enforce_order``."""
        decisions = list(schedule.info.get("splits") or [])
        split_graph = schedule.graph
        if decisions:
            missing = [name for name in graph.names if name not in split_graph.index]
            if missing:
                raise FddpsError(f"algorithm {algorithm!r} split the graph but dropped op "
                                 f"{missing[0]!r}; the TensorFlow writer cannot place it")
            step_device = schedule.device[[split_graph.index[name] for name in graph.names]]
        elif split_graph.num_ops != graph.num_ops:
            raise FddpsError(f"algorithm {algorithm!r} changed the graph ({graph.num_ops} -> "
                             f"{split_graph.num_ops} ops) without reporting splits; the "
                             "TensorFlow writer cannot place it")
        else:
            step_device = schedule.device
        keep = info["step_nodes"]
        device = assign_off_step(analysis, keep, step_device, cluster, override)

        def split_device(name):
            return cluster.names[int(schedule.device[split_graph.index[name]])]

        out = write_devices(analysis, [cluster.names[k] for k in device.tolist()], decisions,
                            split_device)
        order_edges = add_order_edges(out, analysis, keep, schedule) if enforce_order else 0
        if fetches:
            record_fetches(out, fetches)  # so `fddps simulate` of the file predicts this step
        # Without order edges TensorFlow's executor picks the order on each device:
        # predict that step too, which may be slower.
        if enforce_order:
            executor = guard.get("enforced_order_makespan") or simulated_makespan(
                split_graph, cluster, schedule.device, order=schedule.order,
                policy=executor_policy(cluster))
        elif not guard["order_guard"] and np.isfinite(guard["tf_order_makespan"]):
            executor = guard["tf_order_makespan"]  # the guard predicted this schedule already
        else:
            executor = simulated_makespan(split_graph, cluster, schedule.device,
                                          policy=executor_policy(cluster))
        info.update(order_edges_added=order_edges, cost_seconds=t_read - t0,
                    decide_seconds=t_decided - t_read,
                    executor_makespan=executor, **guard,
                    place_seconds=time.perf_counter() - t0, algorithm=algorithm,
                    cost_model=repr(cost_model), splits=len(decisions),
                    split_nodes_added=len(out.node) - len(analysis.graph_def.node))
        return Placement(out, schedule, cluster, analysis.table, info)

    if finalists <= 0:
        return write(schedule, enforce_order, guard, info)
    base = dict(info)  # each finalist's info starts from what reading the graph found
    placement = write(schedule, enforce_order, guard, info)
    unguarded = {"order_guard": "", "tf_order_makespan": float("nan"),
                 "single_makespan": float("nan")}
    candidates = [(_label(algorithm, placement), placement)]

    def add(label, schedule, enforce):
        if len(candidates) < 2 * finalists:
            candidates.append((label, write(schedule, enforce, unguarded, dict(base))))

    from ..algorithms import get_algorithm

    try:
        single = get_algorithm("single").schedule(graph, cluster)
    except InfeasibleError:  # no device holds the whole step: no one-device finalist
        single = None
    if single is not None:
        add(ONE_DEVICE, single, False)
    # With and without the order guard: the schedule in the order TensorFlow picks
    # itself and in the scheduled order (order edges need fetches).
    spread = _devices_used(scheduled) > 1
    if spread and schedule is not scheduled:  # the guard fell back to one device
        add(f"{algorithm}, TensorFlow's order", scheduled, False)
        if fetches is not None:
            add(f"{algorithm}, order enforced", scheduled, True)
    elif spread and fetches is not None:
        add(f"{algorithm}, " + ("TensorFlow's order" if enforce_order else "order enforced"),
            scheduled, not enforce_order)
    alternative = scheduled.info.get("split_alternative")
    if alternative is not None and _devices_used(alternative[1]) > 1:
        enforced = bool(enforce_order) and schedule is scheduled
        add(f"{algorithm} {alternative[0]}" + (", order enforced" if enforced else ""),
            alternative[1], enforced)
    placement.finalists = distinct_finalists(candidates, finalists)
    return placement


def _devices_used(schedule) -> int:
    return len(set(schedule.device.tolist()))


def _label(algorithm, placement) -> str:
    """What to call a scheduler's own placement among the finalists."""
    info = placement.info
    edges = ", order enforced" if info.get("order_edges_added") else ""
    if _devices_used(placement.schedule) == 1:
        return ONE_DEVICE + edges
    return algorithm + edges
