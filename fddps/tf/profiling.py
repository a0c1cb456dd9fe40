"""Profile a TensorFlow graph: per-op times on real devices, mapped back to GraphDef names.

:func:`profile` runs the graph's step (its fetches, e.g. a training op) for
``warmup`` untimed steps, then ``steps`` times with
``RunOptions(trace_level=FULL_TRACE)``, interleaved with as many untraced steps
whose wall time is kept (tracing slows a step down). Each op's time is its
``NodeExecStats`` end minus start (``all_end_rel_nanos``; proto3 drops zero
fields), averaged over the steps by :func:`costmodel.iterated_mean` (robust to
a step disturbed by another process), as the paper's Definition 3 asks.

What runs is not the GraphDef: Grappler folds constants, prunes identities and
no-ops, fuses ``Conv2D + BiasAdd + Relu`` into one ``_FusedConv2D`` named after
the last op, and oneDNN renames kernels (``_MklNativeConv2D``). The profile
maps timings back to GraphDef names using the executed partition graphs
(``RunOptions.output_partition_graphs``):

- a timed node whose name is a GraphDef op: **timed** (its executed type kept);
- the GraphDef ops a fused node absorbed (found by walking up the GraphDef from
  the fused node to its executed inputs): **fused**, each with a share of the
  fused node's time proportional to its roofline estimate
  (:class:`costmodel.DevicePreset`);
- a timed node Grappler created (``ConstantFolding/x-matshapes-1``,
  ``ArithmeticOptimizer/AddOpsRewrite_x``): its time goes to the GraphDef op its
  name derives from, when one does; otherwise its name is listed as *unmapped*;
- a GraphDef op of the step that never ran (folded, pruned): **pruned**, 0 s;
- a GraphDef op that ran but was not timed is left out of the profile, so the
  cost model estimates it and counts it as a fallback;
- the runtime's cross-device plumbing (``_Send``/``_Recv``,
  ``GroupCrossDeviceControlEdges_*``), when a placed graph is profiled, is
  counted in ``meta["comm_nodes"]`` and ``meta["comm_seconds"]``, not mapped.

Example
-------
>>> import slim_models                                        # doctest: +SKIP
>>> m = slim_models.build_training_graph("resnet50", batch_size=8)   # doctest: +SKIP
>>> p = profile(m, steps=5)                                   # doctest: +SKIP
>>> print(p.report())                                         # doctest: +SKIP
>>> cm = costmodel.fit_cost_model(p.join(fddps.tf.op_table(m.graph_def)),
...                               graph=p.meta["graph"])      # doctest: +SKIP
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import numpy as np
import pandas as pd

from ..errors import GraphError
from .graphdef import _tf

#: Name scopes Grappler's optimizers give the nodes they create.
GRAPPLER_SCOPES = ("ConstantFolding", "ArithmeticOptimizer", "LayoutOptimizer", "Remapper",
                   "DependencyOptimizer", "LoopOptimizer", "MemoryOptimizer", "AutoMixedPrecision",
                   "ScopedAllocatorOptimizer", "PinToHostOptimizer", "ImplementationSelector",
                   "CommonSubgraphElimination", "ShapeOptimizer", "AutoParallel", "Mkl")
#: Step-stats pseudo nodes that are no op of any graph.
_PSEUDO_NODES = frozenset({"_SOURCE", "_SINK"})
#: What a worker's trace records for each tensor it fetched over gRPC, in a device
#: entry of its own: how long the call was outstanding, not time the device spent.
_RPC_NODES = frozenset({"RecvTensor"})
#: Op types the runtime adds to move tensors between devices.
_COMM_TYPES = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv"})


def _op_name(fetch) -> str:
    """GraphDef node name of a fetch (tf.Operation, tf.Tensor or a name like 'x:0' / '^x')."""
    name = getattr(fetch, "name", fetch)
    if not isinstance(name, str):
        raise GraphError(f"cannot read a fetch {fetch!r}: give ops, tensors or their names")
    return name.lstrip("^").split(":")[0]


def _input_name(s: str) -> str:
    return s.lstrip("^").split(":")[0]


def step_ops(graph_def, fetches) -> list:
    """Names of the GraphDef ops one run of ``fetches`` needs (their fan-in, control inputs too).

    Raises
    ------
    GraphError
        If a fetch names no op of the GraphDef.
    """
    inputs = {n.name: [_input_name(i) for i in n.input] for n in graph_def.node}
    order = {n.name: k for k, n in enumerate(graph_def.node)}
    stack = []
    for f in fetches:
        name = _op_name(f)
        if name not in inputs:
            raise GraphError(f"fetch {name!r} is not an op of the graph")
        stack.append(name)
    seen = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(i for i in inputs.get(name, ()) if i not in seen)
    return sorted(seen, key=order.get)


def grappler_origin(name: str, known) -> str | None:
    """The GraphDef op a Grappler-created node name derives from, if any.

    Strips optimizer scopes (:data:`GRAPPLER_SCOPES`) from the front, then tries
    the name cut at its last ``-`` or ``_`` repeatedly (``x/ShapeN-matshapes-1`` ->
    ``x/ShapeN``), and also each rewrite's own prefix (``AddOpsRewrite_x`` -> ``x``).

    Examples
    --------
    >>> grappler_origin("ConstantFolding/g/Conv2D_grad/ShapeN-matshapes-1", {"g/Conv2D_grad/ShapeN"})
    'g/Conv2D_grad/ShapeN'
    >>> grappler_origin("ArithmeticOptimizer/AddOpsRewrite_add_3", {"add_3"})
    'add_3'
    >>> grappler_origin("net/Pad/_0__cf__0", {"net/Pad"})
    'net/Pad'
    >>> grappler_origin("ConstantFolding/unrelated", {"x"}) is None
    True
    """
    parts = name.split("/")
    if len(parts) > 1 and re.fullmatch(r"_\d+__cf__\d+", parts[-1]):
        parts = parts[:-1]  # a constant folded out of op "scope/x": "scope/x/_0__cf__0"
    stripped = False
    while parts and (parts[0] in GRAPPLER_SCOPES or parts[0].endswith("Optimizer")):
        parts, stripped = parts[1:], True
    if not parts:
        return None
    candidates = ["/".join(parts)]
    if stripped:
        head, rest = parts[0], parts[1:]
        m = re.match(r"^[A-Za-z]+_(.+)$", head)  # "AddOpsRewrite_add_3" -> "add_3"
        if m:
            candidates.append("/".join([m.group(1), *rest]))
    for cand in candidates:
        while cand:
            if cand in known:
                return cand
            cut = max(cand.rfind("-"), cand.rfind("_"))
            if cut <= cand.rfind("/"):
                break
            cand = cand[:cut]
    return None


def _is_comm(ns) -> bool:
    """Whether a timed node is TensorFlow's cross-device plumbing, not an op of the graph."""
    return (_node_type(ns) in _COMM_TYPES or ns.node_name.startswith("GroupCrossDeviceControlEdges")
            or ns.timeline_label.startswith(("[_Send", "[_Recv")))


def _uses_nanos(step_stats) -> bool:
    """Whether the trace's times are in nanoseconds (newer runtimes) or only microseconds."""
    return any(ns.all_end_rel_nanos for d in step_stats.dev_stats for ns in d.node_stats)


def _node_seconds(ns, use_nanos: bool) -> float:
    if use_nanos:
        return ns.all_end_rel_nanos * 1e-9
    return ns.all_end_rel_micros * 1e-6


def _node_type(ns) -> str:
    """Executed op type from a timeline label ``"name = Type(inputs)"``."""
    label = ns.timeline_label
    if "=" in label:
        return label.split("=", 1)[1].strip().split("(", 1)[0].strip()
    return ""


def _node_memory(ns, tracked: bool = False) -> float:
    """Bytes the node allocated for its outputs and temporaries, NaN if nothing was reported.

    With allocations ``tracked`` (a traced step records ``memory`` for the nodes
    that allocate), the bytes its allocators handed out while it ran: 0 for a
    node whose output is a buffer that already existed (a ``ReadVariableOp``
    returns its variable's storage, ``Identity`` its input, an element-wise op
    may overwrite its input), though ``output`` still describes that buffer.
    Otherwise its outputs' requested bytes plus its temporary memory.
    """
    if tracked:
        return float(sum(m.total_bytes for m in ns.memory))
    out = [o.tensor_description.allocation_description.requested_bytes for o in ns.output]
    temp = ns.memory_stats.temp_memory_size if ns.HasField("memory_stats") else 0
    if not out and not temp:
        return float("nan")
    return float(sum(out) + temp)


def device_busy(run_metadata) -> pd.DataFrame:
    """Seconds each device spent on the graph's ops and on cross-device plumbing in one traced step.

    Sums each timed node's end minus start, per device of
    ``run_metadata.step_stats`` (a step run with ``trace_level=FULL_TRACE``):
    ``op_seconds`` for the graph's ops, ``comm_seconds`` for ``_Send``/``_Recv``
    and ``GroupCrossDeviceControlEdges_*``. On a cluster both workers' devices
    are there, so what a placement's ops took on each can be set beside what
    the cost model predicted for them. A worker's ``RecvTensor`` records (how
    long each gRPC fetch was outstanding, waiting included) are neither.

    Parameters
    ----------
    run_metadata : tf.compat.v1.RunMetadata

    Returns
    -------
    pandas.DataFrame
        One row per device that ran a timed node: ``device`` (as TensorFlow names
        it), ``op_seconds``, ``comm_seconds``, ``ops`` (timed op nodes).

    Raises
    ------
    GraphError
        If the metadata holds no step stats (the step was not traced).

    Examples
    --------
    >>> import tensorflow as tf                                 # doctest: +SKIP
    >>> rm = tf.compat.v1.RunMetadata()                         # doctest: +SKIP
    >>> sess.run(fetch, options=tf.compat.v1.RunOptions(trace_level=3),
    ...          run_metadata=rm)                               # doctest: +SKIP
    >>> device_busy(rm)                                         # doctest: +SKIP
    """
    stats = run_metadata.step_stats.dev_stats
    if not stats:
        raise GraphError("the run metadata has no step stats: run the step with "
                         "RunOptions(trace_level=FULL_TRACE)")
    use_nanos = _uses_nanos(run_metadata.step_stats)
    rows = {}
    for dev in stats:
        row = rows.setdefault(dev.device, dict(device=dev.device, op_seconds=0.0,
                                               comm_seconds=0.0, ops=0))
        for ns in dev.node_stats:
            if ns.node_name in _PSEUDO_NODES or ns.node_name in _RPC_NODES:
                continue
            sec = _node_seconds(ns, use_nanos)
            if _is_comm(ns):
                row["comm_seconds"] += sec
            else:
                row["op_seconds"] += sec
                row["ops"] += 1
    return pd.DataFrame([r for r in rows.values() if r["ops"] or r["comm_seconds"]],
                        columns=["device", "op_seconds", "comm_seconds", "ops"])


def _fused_members(root, executed_inputs, graph_inputs, executed, step_set, max_depth=6):
    """GraphDef ops absorbed by the executed node ``root``: its untimed ancestors
    up to (not including) the nodes the fused node reads."""
    stop = set(executed_inputs)
    members, frontier = [], [(root, 0)]
    seen = {root}
    while frontier:
        name, depth = frontier.pop()
        if depth >= max_depth:
            continue
        for i in graph_inputs.get(name, ()):
            if i in seen or i in stop or i in executed or i not in step_set:
                continue
            seen.add(i)
            members.append(i)
            frontier.append((i, depth + 1))
    return members


def profile(model=None, *, graph=None, fetches=None, init=None, steps: int = 10, warmup: int = 3,
            session_config=None, target: str = "", inter_op_threads: int | None = 1,
            intra_op_threads: int | None = None, preset=None, progress: bool = True,
            meta: dict | None = None):
    """Time every op of a graph's step on the devices it runs on.

    Parameters
    ----------
    model : object, optional
        Anything with ``.graph``, ``.train_op`` and ``.init_op`` (what
        ``slim_models.build_training_graph`` returns); or give ``graph``,
        ``fetches`` and ``init``.
    graph : tf.Graph
    fetches : op, tensor, name or a list of them
        What one step runs (default ``model.train_op``).
    init : op or list, optional
        Run once before the warm-up (default ``model.init_op``).
    steps : int
        Traced steps (and as many untraced steps, timed by the wall clock).
    warmup : int
        Untimed steps first (allocator, oneDNN primitive caches, Grappler).
    session_config : tf.compat.v1.ConfigProto, optional
        Used as is. Otherwise a config with ``inter_op_threads`` /
        ``intra_op_threads``: the default, one inter-op thread, runs one op at a
        time on the device, as the scheduler's device model assumes, so that
        the sum of op times is the step's compute.
    target : str
        Session target (``"grpc://..."`` of a ``local_cluster``), default in-process.
    preset : costmodel.DevicePreset, optional
        Splits a fused node's time among the GraphDef ops it absorbed (by their
        roofline estimates); default ``costmodel.presets["cpu"]`` for CPU
        devices and ``presets["p100"]`` for GPUs.
    progress : bool
        Show a tqdm progress bar.
    meta : dict, optional
        Added to the profile's ``meta`` (e.g. the model name and batch size).

    Returns
    -------
    costmodel.Profile

    Raises
    ------
    GraphError
        If no graph or fetches are given, a fetch is not in the graph, or a step
        fails (TensorFlow's message is kept).
    ValueError
        If ``steps < 1`` or ``warmup < 0``.
    """
    import costmodel
    from tqdm.auto import tqdm

    from .graphdef import op_table

    tf = _tf()
    tf1 = tf.compat.v1
    if steps < 1 or warmup < 0:
        raise ValueError(f"profile needs steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    graph = graph if graph is not None else getattr(model, "graph", None)
    fetches = fetches if fetches is not None else getattr(model, "train_op", None)
    init = init if init is not None else getattr(model, "init_op", None)
    if graph is None or fetches is None:
        raise GraphError("profile needs a graph and fetches (or a model with .graph and .train_op)")
    fetch_list = list(fetches) if isinstance(fetches, (list, tuple)) else [fetches]
    graph_def = graph.as_graph_def()
    step_names = step_ops(graph_def, fetch_list)
    step_set = set(step_names)
    graph_inputs = {n.name: [_input_name(i) for i in n.input if not i.startswith("^")]
                    for n in graph_def.node}
    gd_type = {n.name: n.op for n in graph_def.node}

    if session_config is None:
        session_config = tf1.ConfigProto(inter_op_parallelism_threads=inter_op_threads or 0,
                                         intra_op_parallelism_threads=intra_op_threads or 0)
    traced = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True)
    per_step = []          # per traced step: {name: seconds}
    comm_names, comm_seconds = set(), []
    memory = defaultdict(list)
    executed_type, node_device, partition = {}, {}, {}
    walls = []
    bar = tqdm(total=warmup + 2 * steps, desc="profiling", unit="step", disable=not progress,
               leave=False)
    try:
        with tf1.Session(target, graph=graph, config=session_config) as sess:
            if init is not None:
                sess.run(init)
            for _ in range(warmup):
                sess.run(fetch_list)
                bar.update()
            for s in range(steps):
                t0 = time.perf_counter()
                sess.run(fetch_list)
                walls.append((s, False, time.perf_counter() - t0, np.nan, np.nan, np.nan, 0))
                bar.update()
                rm = tf1.RunMetadata()
                t0 = time.perf_counter()
                sess.run(fetch_list, options=traced, run_metadata=rm)
                wall = time.perf_counter() - t0
                bar.update()
                if not partition:
                    for pg in rm.partition_graphs:
                        for node in pg.node:
                            partition[node.name] = node
                use_nanos = _uses_nanos(rm.step_stats)
                times = defaultdict(float)
                spans, idle = [], 0.0
                comm_step = 0.0
                tracked = any(len(ns.memory) for dev in rm.step_stats.dev_stats
                              for ns in dev.node_stats)
                for dev in rm.step_stats.dev_stats:
                    starts, ends, busy = [], [], 0.0
                    for ns in dev.node_stats:
                        if ns.node_name in _PSEUDO_NODES:
                            continue
                        sec = _node_seconds(ns, use_nanos)
                        if _is_comm(ns):
                            comm_names.add(ns.node_name)
                            comm_step += sec
                            continue
                        times[ns.node_name] += sec
                        start = ns.all_start_nanos * 1e-9 if use_nanos else ns.all_start_micros * 1e-6
                        if start > 0:  # proto3 drops a zero start: such a node has no time base
                            starts.append(start)
                            ends.append(start + sec)
                            busy += sec
                        executed_type.setdefault(ns.node_name, _node_type(ns))
                        node_device.setdefault(ns.node_name, dev.device)
                        memory[ns.node_name].append(_node_memory(ns, tracked))
                    if starts:
                        spans.append(max(ends) - min(starts))
                        idle += spans[-1] - busy
                per_step.append(times)
                comm_seconds.append(comm_step)
                span = max(spans) if spans else float("nan")
                walls.append((s, True, wall, span, idle, float(sum(times.values())), len(times)))
    except tf.errors.OpError as e:
        raise GraphError(f"a profiled step failed: {e.message.splitlines()[0]}") from None
    finally:
        bar.close()

    # -- map executed names to GraphDef names ------------------------------------------
    timed_names = sorted(set().union(*per_step))
    known = set(gd_type)
    target_of, unmapped = {}, []
    for name in timed_names:
        if name in known:
            target_of[name] = name
        else:
            origin = grappler_origin(name, known)
            if origin is not None:
                target_of[name] = origin
            else:
                unmapped.append(name)
    for name, node in partition.items():  # executed types from the partition graphs
        executed_type[name] = node.op
    samples = defaultdict(lambda: np.zeros(steps))
    for s, times in enumerate(per_step):
        for name, sec in times.items():
            if name in target_of:
                samples[target_of[name]][s] += sec
    position = {n: k for k, n in enumerate(step_names)}
    mapped = sorted(samples, key=lambda n: position.get(n, len(step_names)))
    mean, std, kept = costmodel.iterated_mean(np.array([samples[n] for n in mapped]).reshape(len(mapped), steps))
    seconds = dict(zip(mapped, mean))

    # -- fused nodes: split their time over the GraphDef ops they absorbed --------------
    executed = set(partition) | set(timed_names)
    table = None
    fused_share, fused_into = {}, {}
    for name in mapped:
        node = partition.get(name)
        etype = executed_type.get(name, "")
        if node is None or gd_type.get(name) == etype or not (
                etype.startswith("_Fused") or etype.startswith("_MklFused") or "fused_ops" in node.attr):
            continue
        members = _fused_members(name, [_input_name(i) for i in node.input if not i.startswith("^")],
                                 graph_inputs, executed, step_set)
        if not members:
            continue
        if table is None:
            table = op_table(graph_def).set_index("name")
            if preset is None:
                dev = max(set(node_device.values()), key=list(node_device.values()).count)
                dtype = costmodel.parse_device(dev).type if dev else "CPU"
                preset = costmodel.presets["p100" if dtype == "GPU" else "cpu"]
        group = [name, *members]
        est = preset.op_times(table.loc[group].reset_index())
        share = est / est.sum()
        for member, frac in zip(group, share):
            fused_share[member] = (seconds[name] * frac, name)
    for member, (sec, root) in fused_share.items():
        if member == root:
            seconds[root] = sec
        else:
            fused_into[member] = root
            seconds[member] = sec

    sources = defaultdict(list)  # GraphDef name -> executed names timed for it
    for src, tgt in target_of.items():
        sources[tgt].append(src)
    rows = []
    kept_of = dict(zip(mapped, kept))
    std_of = dict(zip(mapped, std))
    for name in step_names:
        if name in fused_into:
            status, sec, root = "fused", seconds[name], fused_into[name]
        elif name in samples:
            status, sec, root = "timed", seconds[name], ""
        elif partition and name not in partition:
            status, sec, root = "pruned", 0.0, ""
        else:
            continue  # ran (or no partition graph to tell) but not timed: the model estimates it
        mem = [m for src in sources.get(name, ()) for m in memory[src] if np.isfinite(m)]
        rows.append({"name": name, "op_type": gd_type[name],
                     "executed_type": executed_type.get(name, ""), "status": status,
                     "seconds": float(sec), "std": float(std_of.get(name, 0.0)),
                     "samples": int(kept_of.get(name, 0)), "fused_into": root,
                     "device": node_device.get(name) or node_device.get(root) or next(
                         (node_device[src] for src in sources.get(name, ()) if src in node_device), ""),
                     "transient_bytes": float(np.max(mem)) if mem else float("nan")})
    ops = pd.DataFrame(rows, columns=["name", "op_type", "executed_type", "status", "seconds", "std",
                                      "samples", "fused_into", "device", "transient_bytes"])
    devices = [d for d in ops["device"] if d]
    device = max(set(devices), key=devices.count) if devices else ""
    fingerprint = costmodel.graph_fingerprint(
        pd.DataFrame({"name": list(gd_type), "op_type": list(gd_type.values())}))
    info = {"device": device, "device_type": costmodel.parse_device(device).type if device else "CPU",
            "devices": sorted(set(devices)), "graph": fingerprint, "num_graph_ops": len(gd_type),
            "num_step_ops": len(step_names), "steps": steps, "warmup": warmup,
            "inter_op_threads": session_config.inter_op_parallelism_threads,
            "intra_op_threads": session_config.intra_op_parallelism_threads,
            "target": target, "tensorflow": tf.__version__,
            "comm_nodes": len(comm_names),
            "comm_seconds": float(np.median(comm_seconds)) if comm_seconds else 0.0,
            "not_timed": [n for n in step_names if n in partition and n not in samples
                          and n not in fused_into]}
    info.update(meta or {})
    steps_df = pd.DataFrame(walls, columns=["step", "traced", "wall_seconds", "span_seconds",
                                            "idle_seconds", "op_seconds", "timed_nodes"])
    return costmodel.Profile(ops, steps_df, unmapped, info)
