"""Place a TensorFlow training graph on devices: :func:`place` and :class:`Placement`.

``place(graph_def, devices)`` reads the GraphDef (:func:`read_graph_def`),
schedules it with an fddps algorithm on a cluster of the given TensorFlow
devices, and writes a new GraphDef whose every node carries the device chosen
for it. Names, inputs and attributes are unchanged, so the placed graph
computes exactly what the original does, and is fetched by the same names.
When the algorithm splits ops (FD-DPS's intra-op parallelism,
:mod:`fddps.algorithms.split_step`), each split op ``X`` becomes slice, part
and combine nodes (:mod:`fddps.tf.split_rewrite`): ``X`` is then the combine
node, which produces the same tensor, so consumers and fetches are still
unchanged.

Example
-------
>>> import tensorflow as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     a = tf.random.normal([64, 64], seed=1, name="a")
...     b = tf.matmul(a, a, name="b")
...     c = tf.matmul(a, tf.transpose(a), name="c")
...     d = tf.add(b, c, name="d")
>>> p = place(g, ["/cpu:0", "/cpu:1"])
>>> [n.name for n in p.graph_def.node] == [n.name for n in g.as_graph_def().node]
True
>>> {n.device for n in p.graph_def.node} <= {"/device:CPU:0", "/device:CPU:1"}
True
>>> p.makespan > 0
True
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ..cluster import Cluster
from ..errors import ClusterError, FddpsError, GraphError, InfeasibleError
from ..graph import OpGraph
from ..simulate import peak_memory, simulate
from .devices import check_cluster, device_matches, make_cluster
from .fetches import record_fetches
from .graphdef import (CONTROL_FLOW_OPS, MERGE_OPS, SWITCH_OPS, GraphAnalysis, _parse_input,
                       _tf, analyse)
from .split_candidates import split_candidates
from .split_rewrite import rewrite_splits, split_node_names


def _default_cost_model():
    try:
        from costmodel import default_cost_model
    except ImportError as e:  # pragma: no cover - costmodel ships with fddps
        raise FddpsError("no cost_model given and costmodel.default_cost_model is not "
                         f"importable ({e}); pass cost_model=...") from None
    return default_cost_model()


def _check_times(times, n, device_type, names):
    arr = np.asarray(times, dtype=np.float64)
    if arr.shape != (n,):
        raise FddpsError(f"cost_model.op_times(..., {device_type!r}) returned shape {arr.shape}, "
                         f"expected ({n},)")
    bad = np.flatnonzero(np.isnan(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise FddpsError(f"cost_model.op_times gave op {names[i]!r} an invalid time {arr[i]!r} "
                         f"on {device_type!r}")
    return arr


def _step_nodes(analysis: GraphAnalysis, fetches) -> np.ndarray:
    """Mask of the nodes one ``session.run(fetches)`` executes: the fetches' ancestors.

    Every input edge counts, ``NextIteration -> Merge`` back edges included (a
    loop body runs whole).
    """
    names = analysis.table["name"].tolist()
    position = {name: i for i, name in enumerate(names)}
    if isinstance(fetches, str):
        fetches = [fetches]
    roots = []
    for f in fetches:
        if not isinstance(f, str):
            f = getattr(f, "name", f)
        if not isinstance(f, str):
            raise GraphError(f"fetches must be op or tensor names, got {f!r}")
        name, _ = _parse_input(f)
        if name not in position:
            raise GraphError(f"fetch {f!r} names no node of the graph")
        roots.append(position[name])
    n = len(names)
    preds = [[] for _ in range(n)]
    for s, d in zip(analysis.edges["src"].tolist(), analysis.edges["dst"].tolist()):
        preds[d].append(s)
    keep = np.zeros(n, dtype=bool)
    stack = list(roots)
    keep[roots] = True
    while stack:
        for p in preds[stack.pop()]:
            if not keep[p]:
                keep[p] = True
                stack.append(p)
    return keep


def read_graph_def(graph_def, cost_model, cluster, override=False, *, unknown_dim=1,
                   fetches=None, splits=True):
    """A TensorFlow graph as an :class:`~fddps.graph.OpGraph` for ``cluster``.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path
        See :func:`fddps.tf.graphdef.load_graph`.
    cost_model : object
        ``op_times(ops, device_type) -> seconds`` per op table row (one call per
        device type of the cluster) and ``memory(ops) -> (persistent, transient)``.
    cluster : Cluster or list of str
        Devices named by TensorFlow device strings and typed by TensorFlow
        device type (as :func:`fddps.tf.devices.make_cluster` builds them), or
        device strings to build it from.
    override : bool
        If False (default), ops with a requested device keep it (pinned to the
        first cluster device it matches); if True, requested devices are ignored.
    unknown_dim : int
        Size assumed for a dimension TensorFlow cannot infer.
    fetches : list of str, optional
        Op or tensor names one training step runs (``["train_op", "loss"]``):
        only their ancestors become ops of the OpGraph. Default: every node.
    splits : bool
        Attach the ops that intra-op splitting may split
        (:func:`fddps.tf.split_candidates.split_candidates`) as the OpGraph's
        ``split_candidates`` (default True).

    Returns
    -------
    (OpGraph, dict)
        The op graph (op ``i`` is the ``i``-th node of the step, in GraphDef
        order; costs ``inf`` on device types without a matching kernel; the
        ``NextIteration -> Merge`` back edges of loops dropped, which makes it a
        DAG) and facts about the reading (``info``): ``analysis``, ``nodes``,
        ``step_nodes`` (mask), ``back_edges_dropped``, ``colocation_groups``,
        ``loop_frames``, ``pinned``, ``shapes_unknown``, ``flops_unknown``,
        ``kernels_unchecked`` (device types this TensorFlow build cannot check),
        ``split_candidates`` (number, one per op and rule) and
        ``split_skipped`` (``{reason: count}`` of the op-rule pairs left whole).

    Raises
    ------
    GraphError
        If the input is not a GraphDef TensorFlow can import, has no nodes, or a
        fetch is unknown.
    ClusterError
        If an op requests a device that matches no device of the cluster (and
        ``override`` is False), or requests a malformed one; or a cluster device
        is not a TensorFlow device of its type.
    InfeasibleError
        If an op has no kernel on any device type of the cluster (the op, its
        type and the device types are named).
    """
    if isinstance(cluster, Cluster):
        check_cluster(cluster)
    else:
        cluster = make_cluster(cluster, cost_model)
    analysis = analyse(graph_def, unknown_dim)
    table = analysis.table
    n_all = len(table)
    if n_all == 0:
        raise GraphError("graph_def has no nodes: there is nothing to place")
    keep = np.ones(n_all, dtype=bool) if fetches is None else _step_nodes(analysis, fetches)
    idx = np.flatnonzero(keep)
    ops = table.iloc[idx].reset_index(drop=True)
    names = ops["name"].tolist()
    n = len(names)
    # A part of a split op (``X/fddps_part_j``, as the strategy and split
    # rewrites name it) scales X's measurement, if X was profiled.
    part_of = ops["name"].str.extract(r"^(.*)/fddps_part_\d+$", expand=False)
    if part_of.notna().any():
        ops["profile_name"] = part_of

    types = []
    for d in cluster.devices:
        if d.type not in types:
            types.append(d.type)
    cost = np.empty((n, len(types)))
    for t, dtype in enumerate(types):
        times = _check_times(cost_model.op_times(ops, dtype), n, dtype, names)
        runnable = np.fromiter((analysis.can_run(i, dtype) for i in idx.tolist()), bool, n)
        cost[:, t] = np.where(runnable, times, np.inf)
    if n:
        nowhere = np.flatnonzero(np.isinf(cost).all(axis=1))
        if nowhere.size:
            i = int(nowhere[0])
            kinds = analysis.kernel_types[int(idx[i])]
            raise InfeasibleError(
                f"op {names[i]!r} ({ops['op_type'][i]}) has no kernel for any device type given "
                f"({types}); TensorFlow registers it for {sorted(kinds or [])}"
                + (f" ({nowhere.size - 1} more ops alike)" if nowhere.size > 1 else ""))
    persistent, transient = cost_model.memory(ops)

    e = analysis.edges
    local = np.full(n_all, -1, dtype=np.int64)
    local[idx] = np.arange(n)
    sel = (~e["back_edge"].to_numpy()) & keep[e["src"].to_numpy()] & keep[e["dst"].to_numpy()]
    src = local[e["src"].to_numpy()[sel]]
    dst = local[e["dst"].to_numpy()[sel]]
    edges = list(zip([names[i] for i in src.tolist()], [names[j] for j in dst.tolist()],
                     e["bytes"].to_numpy()[sel].tolist()))

    pinned, resolved = {}, {}
    if not override:
        requested = ops["requested_device"].tolist()
        for i, req in enumerate(requested):
            if not req:
                continue
            try:
                _tf().DeviceSpec.from_string(req)
            except ValueError as err:
                raise ClusterError(f"op {names[i]!r} requests malformed device {req!r}: {err}") from None
            matches = [d for d in cluster.names if device_matches(req, d)]
            if not matches:
                raise ClusterError(f"op {names[i]!r} requests device {req!r}, which matches none of "
                                   f"the given devices {list(cluster.names)}; pass override=True "
                                   "to let fddps place it")
            pinned[names[i]] = matches[0]
            if len(matches) > 1:
                resolved[names[i]] = (req, matches[0])

    candidates, skipped = [], {}
    if splits:
        candidates, skipped = split_candidates(analysis, cost_model, types, cluster.num_devices,
                                               step_nodes=keep, pinned=pinned)
    try:
        graph = OpGraph(names, cost, edges, memory=persistent, transient=transient,
                        device_types=types, op_types=ops["op_type"].tolist(),
                        colocation=ops["colocation_group"].tolist(), pinned=pinned,
                        split_candidates=candidates)
    except GraphError as err:
        raise GraphError(f"the GraphDef does not form an op graph fddps can schedule: {err}") from None
    groups = ops["colocation_group"].dropna()
    info = {
        "analysis": analysis,
        "nodes": n_all,
        "step_nodes": keep,
        "ops": n,
        "edges": graph.num_edges,
        "control_edges": int(((e["port"].to_numpy() < 0) & sel).sum()),
        "back_edges_dropped": int((e["back_edge"].to_numpy() & keep[e["src"].to_numpy()]).sum()),
        "colocation_groups": int(groups.nunique()),
        "largest_group": int(groups.value_counts().max()) if len(groups) else 0,
        "loop_frames": sorted({f for f in ops["loop_frame"] if f}),
        "pinned": len(pinned),
        "pins_ambiguous": resolved,
        "shapes_unknown": int((~ops["shapes_known"]).sum()),
        "flops_unknown": int((~ops["flops_known"]).sum()),
        "kernels_unchecked": sorted(set(types) - analysis.checked_types),
        "device_types": types,
        "split_candidates": len(candidates),
        "split_skipped": skipped,
    }
    return graph, info


def _cond_branch_nodes(analysis):
    """Mask of nodes inside a ``tf.cond`` branch: reachable from a Switch before a Merge.

    Such nodes may be dead (not run) in a step; an order edge from one would
    make its consumer dead too.
    """
    n = len(analysis.table)
    op_types = analysis.table["op_type"].tolist()
    succ, _, _ = _forward_graph(analysis)
    tainted = np.zeros(n, dtype=bool)
    stack = [i for i in range(n) if op_types[i] in SWITCH_OPS]
    while stack:
        i = stack.pop()
        for j in succ[i]:
            if not tainted[j] and op_types[j] not in MERGE_OPS:
                tainted[j] = True
                stack.append(j)
    return tainted


def _forward_graph(analysis):
    """Successor lists over the forward edges and a topological order of all nodes."""
    n = len(analysis.table)
    e = analysis.edges
    fwd = ~e["back_edge"].to_numpy()
    succ = [[] for _ in range(n)]
    preds = [[] for _ in range(n)]
    indeg = [0] * n
    for s, d in zip(e["src"].to_numpy()[fwd].tolist(), e["dst"].to_numpy()[fwd].tolist()):
        succ[s].append(d)
        preds[d].append(s)
        indeg[d] += 1
    order = [i for i in range(n) if indeg[i] == 0]
    head = 0
    while head < len(order):
        for j in succ[order[head]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
        head += 1
    return succ, preds, order


def _needed_off_step(analysis, keep):
    """Step nodes that nodes outside the step need without the step's work.

    An initializer (``w/Assign``) reads the variable handle ``w``, a step node
    without inputs; running the initializer must not run the step, so ``w``
    must get no order edge. Nodes outside the step that hang off real step work
    (unused gradient branches) cannot run without the step anyway and protect nothing.
    """
    n = len(keep)
    if keep.all():
        return np.zeros(n, dtype=bool)
    succ, preds, order = _forward_graph(analysis)
    work = np.zeros(n, dtype=bool)  # depends on a step node that has inputs
    for i in order:
        work[i] = (keep[i] and bool(preds[i])) or any(work[p] for p in preds[i])
    independent = [name for name, k, w in zip(analysis.table["name"], keep, work) if not k and not w]
    if not independent:
        return np.zeros(n, dtype=bool)
    return _step_nodes(analysis, independent) & keep


def _write_devices(analysis, device_of, splits=(), split_device=None):
    """A copy of the GraphDef with the splits written in and every node's device set.

    ``device_of``: device string of each original node (by position; a split
    op's is its combine's). ``splits``: decisions for
    :func:`fddps.tf.split_rewrite.rewrite_splits`, whose new nodes (appended)
    get ``split_device(name)``.
    """
    tf = _tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(analysis.graph_def)
    if splits:
        rewrite_splits(out, analysis, splits, split_device)
    for node, dev in zip(out.node, device_of):
        node.device = dev
    return out


def _add_order_edges(out, analysis, keep, schedule):
    """Add a ``^a`` input to each op ``b`` scheduled right after ``a`` on its device.

    Returns the number of edges added. Ops in loop frames, control flow and
    ``tf.cond`` branches are left out, and so are step ops that nodes outside
    the step need (see :func:`place`); ops the splits added (never in those)
    take part. No edge is added where ``b`` already reads ``a``.
    """
    table = analysis.table
    n_all = len(table)
    eligible = ((table["loop_frame"] == "").to_numpy()
                & ~table["op_type"].isin(CONTROL_FLOW_OPS).to_numpy()
                & ~_cond_branch_nodes(analysis))
    shared = _needed_off_step(analysis, keep)
    position = {node.name: k for k, node in enumerate(out.node)}
    names = schedule.graph.names
    added = 0
    for seq in schedule.order:
        chain = [position[names[i]] for i in seq.tolist()]
        chain = [k for k in chain if k >= n_all or eligible[k]]
        for a, b in zip(chain, chain[1:]):
            if b < n_all and shared[b]:
                continue
            node_b, name_a = out.node[b], out.node[a].name
            if any(_parse_input(s)[0] == name_a for s in node_b.input):
                continue
            node_b.input.append("^" + name_a)
            added += 1
    return added


def _assign_off_step(analysis, keep, step_device, cluster, override):
    """Devices of the nodes a step does not run (initializers, savers): their group's,
    their requested one, or their first input's, else the first device."""
    table = analysis.table
    n = len(table)
    device = np.full(n, -1, dtype=np.int64)
    device[keep] = step_device
    group_dev = {}
    groups = table["colocation_group"].tolist()
    for i in np.flatnonzero(keep).tolist():
        if groups[i] is not None:
            group_dev.setdefault(groups[i], device[i])
    _, preds, queue = _forward_graph(analysis)  # topological: inputs are placed first
    requested = table["requested_device"].tolist()
    for i in queue:
        if device[i] >= 0:
            continue
        g = groups[i]
        if g is not None and g in group_dev:
            device[i] = group_dev[g]
        else:
            k = -1
            if requested[i] and not override:
                matches = [kk for kk, d in enumerate(cluster.names) if device_matches(requested[i], d)]
                k = matches[0] if matches else -1
            if k < 0:
                placed = [device[p] for p in preds[i] if device[p] >= 0]
                k = placed[0] if placed else 0
            device[i] = k
            if g is not None:
                group_dev[g] = k
    return device


def _order_guard(graph, cluster, schedule, enforce_order, can_enforce):
    """Whether to enforce the schedule's order, or fall back to one device (``enforce_order="auto"``).

    TensorFlow's executor picks each device's order itself; predicted that way
    (:func:`fddps.simulate`, FIFO) the step may be slower than on the best
    single device. Then the scheduled order is enforced when it can be
    (``can_enforce``: fetches given) and the scheduled step beats one device;
    otherwise the whole graph goes on the best single device
    (:class:`~fddps.algorithms.single.SingleDevice`), if one can hold it.

    Returns ``(schedule, enforce, info)``: the schedule to write (the
    single-device one after a fallback), whether to add order edges, and
    ``order_guard`` ("" when nothing was done, "enforced order" or "single
    device"), ``tf_order_makespan`` and ``single_makespan`` (seconds; NaN when
    not computed or no single device can hold the graph).
    """
    from ..algorithms import get_algorithm

    info = {"order_guard": "", "tf_order_makespan": float("nan"),
            "single_makespan": float("nan")}
    if enforce_order != "auto":
        return schedule, bool(enforce_order), info
    tf_order = float(simulate(schedule.graph, cluster, schedule.device).makespan)
    info["tf_order_makespan"] = tf_order
    if tf_order <= schedule.makespan * (1 + 1e-9):
        return schedule, False, info
    try:
        single = get_algorithm("single").schedule(graph, cluster)
    except InfeasibleError:  # no device holds the whole graph: nothing to compare with
        single = None
    if single is not None:
        info["single_makespan"] = float(single.makespan)
    if single is None or tf_order <= single.makespan * (1 + 1e-9):
        return schedule, False, info
    if can_enforce and schedule.makespan < single.makespan:
        info["order_guard"] = "enforced order"
        return schedule, True, info
    info["order_guard"] = "single device"
    info["order_guard_reason"] = ("the scheduled order is no faster than one device either"
                                  if can_enforce else "without fetches no order can be enforced")
    return single, False, info


def place(graph_def, devices, cost_model=None, algorithm="fddps", memory=None, *,
          override=False, fetches=None, enforce_order="auto", unknown_dim=1, session_config=None,
          topology="auto", strategy=None, **options):
    """Place and order a TensorFlow graph on devices so one step finishes soonest.

    Parameters
    ----------
    graph_def : GraphDef, tf.Graph, bytes or path; or keras.Model or tf.function
        The training graph (never modified). A Keras model or a ``tf.function``
        training step is traced, placed and returned runnable
        (:func:`fddps.tf.functions.place_step`): ``place(model, devices,
        loss=..., optimizer=..., batch=(x, y))`` or ``place(step_fn, devices,
        example_inputs)``.
    devices : list of str, or Cluster
        TensorFlow device strings (``"/device:CPU:0"``,
        ``"/job:worker/replica:0/task:1/device:GPU:0"``, ``"/cpu:1"``), or a
        :class:`~fddps.cluster.Cluster` whose device names are such strings.
    cost_model : CostModel, optional
        Default ``costmodel.default_cost_model()`` (analytic roofline presets).
    algorithm : str
        A name from :func:`fddps.available_algorithms` (default ``"fddps"``), or a
        strategy search from :func:`fddps.search.available_searches`: ``"auto"``
        (the fastest predicted of one device, data parallelism, whole-op
        placement, the DP and FlexFlow's MCMC that fits, within ``time_budget``
        seconds), ``"flexflow"``, ``"pase"`` or ``"fddps_space"`` (FD-DPS whose split
        step chooses among every configuration of the critical ops and whose
        scheduler places the parts); ``options`` then go to the search
        (:mod:`fddps.search`) and ``override``/``enforce_order`` are not used.
        ``"tofu"`` runs Tofu's recursive partitioning of every op
        (:class:`fddps.search.tofu.Tofu`, ``options`` passed to it), written as a
        strategy (:func:`fddps.tf.strategy_rewrite.place_strategy`); it raises
        :class:`InfeasibleError` when its plan's simulated peak exceeds a
        device's capacity.
    memory : float or mapping, optional
        Device capacity in bytes, for all devices or by device string or type;
        see :mod:`fddps.tf.devices` for the defaults.
    override : bool
        Let fddps move ops whose device the graph already requests (default:
        they stay where requested).
    fetches : list of str, optional
        The op or tensor names a training step runs (``["train_op", "loss"]``).
        Then only what they need is scheduled (and timed in ``makespan``); the
        other nodes (initializers, savers) are still kept, and put with their
        colocation group, their requested device or their first input. Default:
        every node is scheduled as if the step ran them all.
    enforce_order : bool or "auto"
        ``True``: make TensorFlow follow the scheduled order on each device, as FastT does:
        add a control input from each op to the op scheduled next on its device.
        Needs ``fetches`` (order edges between step and non-step ops would
        make every step re-run an initializer); step ops that other nodes also
        need (an initializer's input) get no order edge into them, so running
        the initializers never runs the step. Ops in ``tf.while_loop`` frames
        and ``tf.cond`` branches are left out (an edge there could cross a
        frame or spread a branch's deadness). Running the placed graph with a
        subset of ``fetches`` also runs the ops scheduled before them.
        ``"auto"`` (default): leave the order to TensorFlow unless the step,
        predicted in the order TensorFlow picks itself (:attr:`Placement.executor_makespan`),
        would be slower than the best single device; then enforce the
        scheduled order if ``fetches`` are given (and the scheduled step beats
        one device), else place everything on the best single device.
        :meth:`Placement.summary` says which was done (``info["order_guard"]``).
        ``False``: never add order edges nor fall back.
    unknown_dim : int
        Size assumed for dimensions TensorFlow cannot infer (see :func:`op_table`).
    session_config : tf.compat.v1.ConfigProto, optional
        The config the placed graph will run with: its intra-op threads are what
        one op of a local CPU device uses. Several CPU devices of this process
        share its cores (:func:`fddps.tf.devices.local_cpu_sharing`); the
        prediction slows their concurrent ops down accordingly.
    topology : ``"auto"``, None or a topology preset
        Link resources transfers share (:func:`fddps.tf.make_cluster`;
        default one network interface per host).
    strategy : fddps.strategy.Strategy, optional
        Run this parallelization strategy instead of searching a placement
        (:func:`fddps.tf.strategy_rewrite.place_strategy`; e.g.
        ``fddps.data_parallel(graph_def, devices, fetches)``); ``algorithm``,
        ``override``, ``enforce_order`` and ``options`` are then not used.
    **options
        Passed to the algorithm (e.g. ``insertion=False`` for FD-DPS). FD-DPS
        and FastT split ops where the cost model says it pays (intra-op
        parallelism; see :attr:`Placement.splits` and :mod:`fddps.tf.split_rewrite`);
        ``split=False`` keeps every op whole (the paper's D-DPS(-F)).

    Returns
    -------
    Placement

    Raises
    ------
    GraphError
        For input that is not a GraphDef (bytes, wrong type, unknown op), or an unknown fetch.
    ClusterError
        For an empty device list, a malformed or unknown device string, or an op
        requesting a device not in the list (each named).
    InfeasibleError
        If the graph cannot fit in the devices' memory, or an op has no kernel on
        any given device (named).
    UnknownAlgorithmError
        For an unknown ``algorithm``.
    """
    from ..algorithms import get_algorithm
    from ..search import available_searches

    if callable(graph_def):  # a Keras model or a tf.function step: fddps.tf.functions
        from .functions import place_step

        if cost_model is not None and not hasattr(cost_model, "op_times"):
            # place(step_fn, devices, example_inputs): a step's third argument is its inputs
            if "example_inputs" in options:
                raise FddpsError("example_inputs given twice (third argument and keyword)")
            options["example_inputs"], cost_model = cost_model, None
        return place_step(graph_def, devices, cost_model=cost_model, algorithm=algorithm,
                          memory=memory, override=override, fetches=fetches,
                          enforce_order=enforce_order, unknown_dim=unknown_dim, **options)
    if strategy is None and algorithm == "tofu":
        return _place_tofu(graph_def, devices, cost_model, memory, fetches, unknown_dim, options)
    if strategy is None and algorithm in available_searches():
        from .search_place import place_searched

        return place_searched(graph_def, devices, algorithm,
                              _default_cost_model() if cost_model is None else cost_model,
                              memory, fetches=fetches, unknown_dim=unknown_dim, **options)
    if strategy is not None:
        from .strategy_rewrite import place_strategy

        return place_strategy(graph_def, devices, strategy,
                              _default_cost_model() if cost_model is None else cost_model,
                              memory, fetches=fetches, unknown_dim=unknown_dim)
    t0 = time.perf_counter()
    if enforce_order not in (True, False, "auto"):
        raise FddpsError(f"enforce_order must be True, False or 'auto', got {enforce_order!r}")
    if enforce_order is True and fetches is None:
        raise FddpsError("enforce_order=True needs fetches=[...] (the ops a training step runs): "
                         "order edges from ops outside the step would make every step re-run them")
    scheduler = get_algorithm(algorithm, **options)
    cost_model = _default_cost_model() if cost_model is None else cost_model
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory, session_config=session_config,
                           topology=topology)
    graph, info = read_graph_def(analysis, cost_model, cluster, override, fetches=fetches)
    t_read = time.perf_counter()
    schedule = scheduler.schedule(graph, cluster)
    schedule, enforce_order, guard = _order_guard(graph, cluster, schedule, enforce_order,
                                                  fetches is not None)
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
    device = _assign_off_step(analysis, keep, step_device, cluster, override)

    def split_device(name):
        return cluster.names[int(schedule.device[split_graph.index[name]])]

    out = _write_devices(analysis, [cluster.names[k] for k in device.tolist()], decisions,
                         split_device)
    order_edges = _add_order_edges(out, analysis, keep, schedule) if enforce_order else 0
    if fetches:
        record_fetches(out, fetches)  # so `fddps simulate` of the file predicts this step
    # Without order edges TensorFlow's executor picks the order on each device:
    # predict that step too (a first-in-first-out executor), which may be slower.
    if enforce_order:
        executor = schedule.makespan
    elif not guard["order_guard"] and np.isfinite(guard["tf_order_makespan"]):
        executor = guard["tf_order_makespan"]  # the guard predicted this schedule already
    else:
        executor = float(simulate(split_graph, cluster, schedule.device).makespan)
    info.update(order_edges_added=order_edges, read_seconds=t_read - t0,
                executor_makespan=executor, **guard,
                place_seconds=time.perf_counter() - t0, algorithm=algorithm,
                cost_model=repr(cost_model), splits=len(decisions),
                split_nodes_added=len(out.node) - len(analysis.graph_def.node))
    return Placement(out, schedule, cluster, analysis.table, info)


def _place_tofu(graph_def, devices, cost_model, memory, fetches, unknown_dim, options):
    """:func:`place` with ``algorithm="tofu"``: search the plan, check its peak, write it."""
    from ..search.tofu import Tofu
    from .strategy_graph import step_graph
    from .strategy_rewrite import place_strategy

    cost_model = _default_cost_model() if cost_model is None else cost_model
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    plan = Tofu(**options).search(step_graph(analysis, fetches), cluster, cost_model)
    placement = place_strategy(analysis, cluster, plan.strategy, cost_model, memory,
                               fetches=fetches, unknown_dim=unknown_dim)
    placement.info.update(algorithm="tofu", search_seconds=plan.search_seconds,
                          comm_bytes=plan.comm_bytes, tofu_plan=plan)
    return placement


class Placement:
    """The answer of :func:`place`.

    Attributes
    ----------
    graph_def : GraphDef
        The placed graph: every node of the input, same names, inputs and
        attributes, with ``device`` set (plus order control inputs when
        ``enforce_order`` was used). A split op is its combine node; the
        slice, part and constant nodes of the splits follow the input's nodes.
    schedule : Schedule
        Where and when each scheduled op runs (op ``i`` is the ``i``-th scheduled
        node in GraphDef order; with splits, the op graph with the slice and
        part ops appended, named as their GraphDef nodes).
    cluster : Cluster
    ops : pandas.DataFrame
        The op table of the input graph (:func:`fddps.tf.op_table`).
    info : dict
        Facts about reading and scheduling (see :func:`read_graph_def`), plus
        ``place_seconds`` (wall time of :func:`place`) and ``order_edges_added``.
    """

    def __init__(self, graph_def, schedule, cluster, ops, info):
        self.graph_def = graph_def
        self.schedule = schedule
        self.cluster = cluster
        self.ops = ops
        self.info = info

    @property
    def makespan(self) -> float:
        """Predicted step time in seconds (not ms), in the scheduled order."""
        return self.schedule.makespan

    @property
    def executor_makespan(self) -> float:
        """Predicted seconds of one step when TensorFlow orders each device's ops
        itself (:func:`fddps.simulate` with a first-in-first-out executor); the
        scheduled :attr:`makespan` when ``enforce_order=True`` fixed the order."""
        return float(self.info.get("executor_makespan", self.schedule.makespan))

    @property
    def splits(self) -> pd.DataFrame:
        """The ops split, one row per op (:func:`fddps.strategy.fddps_splits.decisions_table`,
        like the paper's Table 6); empty when none was."""
        from ..strategy.fddps_splits import decisions_table

        return decisions_table(self.schedule.info.get("splits") or [])

    @property
    def sharded_variables(self) -> dict:
        """Variables written as shards (a strategy split them by their own dimensions):
        name -> :class:`~fddps.tf.variable_shards.ShardedVariable` (each shard's
        name, device and slice); empty when none was. Read their whole values with
        :func:`fddps.tf.variable_shards.gather_variables`."""
        return dict(self.info.get("sharded_variables") or {})

    @property
    def devices(self) -> dict:
        """Node name -> device string, for every node of the GraphDef."""
        return {node.name: node.device for node in self.graph_def.node}

    @property
    def memory(self) -> pd.Series:
        """Sum of persistent + transient bytes of each device's ops, by device: what
        holding every output all step would take (the constraint is
        :attr:`peak_memory`)."""
        return pd.Series(self.schedule.device_memory(), index=list(self.cluster.names),
                         name="memory")

    @property
    def peak_memory(self) -> pd.Series:
        """Predicted highest bytes held at once on each device (outputs freed after use)."""
        s = self.schedule
        peak = peak_memory(s.graph, s.cluster, s.device, s.start, s.finish)
        return pd.Series(peak, index=list(self.cluster.names), name="peak_memory")

    def to_dataframe(self) -> pd.DataFrame:
        """One row per scheduled op: the schedule's columns (``op``, ``device``,
        ``start``, ``finish``, ``duration``, ``op_type``), the op table's
        ``flops``, ``output_bytes``, ``param_bytes``, ``colocation_group``,
        ``requested_device`` (NaN for the slice and part ops of splits) and
        ``split_of`` (the op a slice, part or combine op comes from, else None);
        sorted by start time."""
        df = self.schedule.to_dataframe()
        cols = ["name", "flops", "output_bytes", "param_bytes", "colocation_group",
                "requested_device"]
        extra = self.ops[cols].rename(columns={"name": "op"})
        df = df.merge(extra, on="op", how="left", sort=False)
        origin = {}
        for d in self.schedule.info.get("splits") or []:
            op = d.candidate.op
            origin[op] = op
            origin.update((name, op) for name in split_node_names(d))
        df["split_of"] = [origin.get(op) for op in df["op"]]
        return df

    def summary(self) -> str:
        """A short text report: step time (ms, or s when a second or longer), the devices
        used of those given, per-device load and peak memory (MB), transfers (MB)."""
        s, c, info = self.schedule, self.cluster, self.info
        g = s.graph
        scale, unit = (1e3, "ms") if s.makespan < 1 else (1.0, "s")
        et = g.exec_times(c)
        dur = et[np.arange(g.num_ops), s.device]
        busy = np.bincount(s.device, weights=dur, minlength=c.num_devices)
        counts = np.bincount(s.device, minlength=c.num_devices)
        # A written strategy's graph has parts and slices: one device runs the original step.
        best_single = info.get("single_device_step")
        if best_single is None:
            single = et.sum(axis=0)
            best_single = (float(np.min(single[np.isfinite(single)])) if np.isfinite(single).any()
                           else np.inf)
        cross = s.device[g.src] != s.device[g.dst]
        mem = self.peak_memory.to_numpy()
        written = (f" (the rewrite's {g.num_ops} nodes of the step; the task graph the searches "
                   f"score: {info['expansion_makespan'] * scale:.4g} {unit})"
                   if "expansion_makespan" in info else "")
        used = int((counts > 0).sum())
        lines = [
            f"fddps placement ({info.get('algorithm', s.algorithm)}): {info['ops']} of "
            f"{info['nodes']} nodes scheduled on {used} of the {c.num_devices} devices given"
            + (" (all on one device: spreading the step was predicted slower)"
               if used == 1 and c.num_devices > 1 else "") + written,
            f"predicted step time {s.makespan * scale:.4g} {unit}"
            + (f"; best single device {best_single * scale:.4g} {unit} "
               f"(speedup {best_single / s.makespan:.2f}x)"
               if s.makespan > 0 and np.isfinite(best_single) else ""),
        ]
        bound = s.info.get("lower_bound")
        if s.info.get("optimal"):
            lines.append("optimal (proven)")
        elif bound and bound > 0:
            lines.append(f"within {s.makespan / bound - 1:.1%} of optimal (lower bound "
                         f"{bound * scale:.4g} {unit})")
        sharing = c.sharing_summary()
        if sharing:
            # The single-device step is the same model's: one device alone gets
            # all of its cores and links; devices sharing them slow each other.
            lines.append("shared hardware (the prediction slows down ops and transfers that "
                         "share it; a device alone runs at full speed):")
            lines += [f"  {line}" for line in sharing]
        executor = self.executor_makespan
        guard = info.get("order_guard", "")
        if guard:
            tf_order, single = info["tf_order_makespan"], info["single_makespan"]
            lines.append(
                f"in the order TensorFlow picks itself (FIFO executor model) the step would take "
                f"{tf_order * scale:.4g} {unit}, slower than one device ({single * scale:.4g} {unit}): "
                + ("order control edges make TensorFlow follow the scheduled order "
                   "(enforce_order='auto')" if guard == "enforced order" else
                   f"placed on {c.names[int(s.device[0])] if g.num_ops else '?'} alone "
                   f"(enforce_order='auto'; {info.get('order_guard_reason', '')})"))
        tf_peak = None
        if not guard and abs(executor - s.makespan) > s.makespan * 0.01:
            # The placed file runs in TensorFlow's order: its peaks are that order's
            # (what `fddps simulate` of the file reports).
            tf_peak = simulate(g, c, s.device).peak_memory.to_numpy()
        if guard:
            pass
        elif abs(executor - s.makespan) > s.makespan * 0.01:
            # What the placed file runs (and `fddps simulate` of it predicts).
            lines.append(
                f"in the order TensorFlow picks itself (FIFO executor model; what the placed "
                f"graph runs) {executor * scale:.4g} {unit}"
                + (", slower than the best single device" if executor > best_single else "")
                + "; enforce_order=True makes it follow the scheduled order")
        peak_head = f"{'peak MB':>10}" + (f" {'TF order MB':>11}" if tf_peak is not None else "")
        lines += [
            f"{'device':<48} {'ops':>6} {'busy ' + unit:>10} {'util':>6} {peak_head} "
            f"{'capacity MB':>12}",
        ]
        for k, d in enumerate(c.devices):
            util = busy[k] / s.makespan if s.makespan > 0 else 0.0
            peaks = f"{mem[k] / 1e6:>10.4g}" + (f" {tf_peak[k] / 1e6:>11.4g}"
                                                  if tf_peak is not None else "")
            lines.append(f"{d.name:<48} {counts[k]:>6} {busy[k] * scale:>10.4g} {util:>6.0%} "
                         f"{peaks} {d.memory / 1e6:>12.4g}")
        if tf_peak is not None:
            lines.append("peak MB: in the scheduled order; TF order MB: in TensorFlow's own order "
                         "(what the placed graph runs)")
        lines.append(f"transfers: {int(cross.sum())} edges, {g.bytes[cross].sum() / 1e6:.4g} MB "
                     "between devices")
        if "colocation_groups" in info:  # a placement's; a strategy's has no such facts
            lines.append(f"colocation groups {info['colocation_groups']} (largest {info['largest_group']} "
                         f"ops), pinned ops {info['pinned']}, loop frames {len(info['loop_frames'])}, "
                         f"ops with unknown shapes {info['shapes_unknown']}")
        if "search_info" in info:
            from ..search.auto import describe_search

            lines.append(describe_search(info))
        if info.get("kernels_unchecked"):
            lines.append(f"kernels not checked for {info['kernels_unchecked']} (this TensorFlow "
                         "build does not register them)")
        if info.get("splits"):
            table = self.splits
            kinds = ", ".join(f"{n} {t} on {d}" for (t, d), n in
                              table.groupby(["op_type", "dim"]).size().items())
            lines.append(f"intra-op splits: {info['splits']} ops ({kinds}) into "
                         f"{int(table['parts'].sum())} parts; {info['split_nodes_added']} nodes "
                         f"added; predicted step without splits "
                         f"{s.info.get('unsplit_makespan', float('nan')) * scale:.4g} {unit}")
        if info.get("order_edges_added"):
            lines.append(f"order control edges added: {info['order_edges_added']}")
        lines.append(f"place() took {info['place_seconds']:.3g} s"
                     + (f" (reading {info['read_seconds']:.3g} s)" if "read_seconds" in info else ""))
        return "\n".join(lines)

    def __repr__(self):
        used = len(set(self.schedule.device.tolist()))
        return (f"Placement({self.info['nodes']} nodes on {used} of {self.cluster.num_devices} "
                f"devices, predicted step {self.makespan:.4g} s)")

    def plot(self, path=None, ax=None, critical_path=True, transfers=False, dpi=120):
        """Gantt chart of the schedule (see :func:`fddps.plot.plot_schedule`).

        Parameters
        ----------
        path : str or Path, optional
            Save the chart there (PNG, SVG, PDF: by the suffix).
        ax : matplotlib Axes, optional
            Draw into it (else a new figure).
        critical_path, transfers : bool
            As for :func:`fddps.plot.plot_schedule`.
        dpi : int
            Resolution of a saved raster image.

        Returns
        -------
        matplotlib.figure.Figure
            The chart's figure; in a notebook it shows as the cell's output.
        """
        from ..plot import plot_schedule

        ax = plot_schedule(self.schedule, ax=ax, critical_path=critical_path, transfers=transfers)
        fig = ax.figure
        if path is not None:
            from pathlib import Path

            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=dpi, bbox_inches="tight")
        return fig

    def to_chrome_trace(self, path, transfers=True) -> dict:
        """Write the schedule as a Chrome trace JSON file (see :func:`fddps.trace.to_chrome_trace`)."""
        from ..trace import to_chrome_trace

        return to_chrome_trace(self.schedule, path, transfers=transfers)
