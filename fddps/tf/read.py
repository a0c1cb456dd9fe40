"""Read: an analysed TensorFlow graph as the op graph a scheduler places.

:func:`read_graph_def` turns a :class:`~fddps.tf.graphdef.GraphAnalysis` (or
anything :func:`~fddps.tf.graphdef.analyse` reads) into an
:class:`~fddps.graph.OpGraph` for a cluster: the step's ops costed by a cost
model on each device type, their edges, memory, colocation groups, pins and
the ops intra-op splitting may split.
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..errors import ClusterError, FddpsError, GraphError, InfeasibleError
from ..graph import OpGraph
from .devices import check_cluster, device_matches, make_cluster
from .graphdef import analyse
from .split_candidates import split_candidates
from .structure import analysed_step
from .tfimport import _tf


def default_cost_model_or_error(cost_model=None):
    """``cost_model``, or ``costmodel.default_cost_model()`` when it is None."""
    if cost_model is not None:
        return cost_model
    try:
        from costmodel import default_cost_model
    except ImportError as e:  # pragma: no cover - costmodel ships with fddps
        raise FddpsError("no cost_model given and costmodel.default_cost_model is not "
                         f"importable ({e}); pass cost_model=...") from None
    return default_cost_model()


def cpu_preset_facts(cost_model, cluster) -> dict:
    """What ``place()`` says about the CPU preset it used: ``cpu_calibration`` (the path of
    the calibration ``costmodel.default_cost_model`` loaded, or None) and ``cpu_preset_note``
    (a line for ``summary()``, or None when the cluster has no CPU device, the model has a
    CPU profile, or the model is the user's own and its preset uncalibrated)."""
    meta = getattr(cost_model, "meta", None) or {}
    path = meta.get("cpu_calibration")
    note = None
    types = {d.type for d in getattr(cluster, "devices", ())}
    preset = getattr(cost_model, "devices", {}).get("CPU")
    if "CPU" in types and "CPU" not in (getattr(cost_model, "compute", None) or {}):
        if path:
            note = f"CPU preset: calibrated on this machine ({path})"
        elif meta.get("kind") == "analytic default":
            note = "analytic CPU preset; run `fddps calibrate` to fit it to this machine"
        elif getattr(preset, "efficiency_curves", ()):
            note = "CPU preset: calibrated (" + ("a `fddps calibrate` file"
                                                if meta.get("kind") == "cpu calibration"
                                                else "the cost model given") + ")"
    return {"cpu_calibration": path, "cpu_preset_note": note}


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
    keep = analysed_step(analysis, fetches)
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
