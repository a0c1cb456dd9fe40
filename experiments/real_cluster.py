"""Measured step time of placed graphs on a real 2-worker TensorFlow cluster on this machine.

The one end-to-end speed measurement a 2-core machine allows: two
``tf.distribute.Server`` processes on 127.0.0.1 (:func:`fddps.tf.local_cluster`,
one thread each, so each is one core), joined by gRPC. For each model (at a small
batch, CIFAR-10 size):

1. the cost model is profiled on this machine (unless ``--no-profile``): per-op
   times of the model's step on worker 0 (:func:`fddps.tf.profiling.profile`,
   ``--profile-steps`` traced steps) and the link between the two workers
   (:func:`fddps.tf.comm_bench.measure_transfers`), fitted by
   :func:`costmodel.fit_cost_model` on top of ``default_cost_model(cpu=cpu_preset(1))``;
   without profiling, that analytic one-core CPU preset and the
   ``grpc-loopback`` link preset are used;
2. every algorithm places the model with :func:`fddps.place` on the two
   workers (``"single"``: the whole graph on one worker, the baseline);
3. the placed GraphDefs run on the cluster, each in its own session:
   ``--warmup`` steps each, then ``--steps`` rounds in which every placement
   runs one timed step (the order rotating per round, so that the machine's
   drift hits all alike); the median wall time (``Session.run`` of train op
   and loss from this client process) is reported beside the simulator's
   prediction;
4. with ``--verify``, step 2 is ``place(..., verify=True)``: each algorithm's
   finalists (:mod:`fddps.tf.verify`) are timed on the cluster first and the
   fastest measured is the one run in step 3 (column ``verified``; each
   finalist's predicted and measured step in ``verify_detail``).

Both workers share this machine with the client and anything else running;
compare the algorithms with each other and with ``single`` inside one run.

Writes ``experiments/results/real_cluster.csv``, ``real_cluster.png`` and the page
``real_cluster.md`` (beside ``--out``).

Usage::

    python -m experiments.real_cluster                        # Inception-V3 and ResNet-50, batch 8 (~8 min)
    python -m experiments.real_cluster --models resnet50 --batch 2 --steps 2 --algorithms fddps
    python -m experiments.real_cluster --enforce-order        # make TF follow the scheduled order
    python -m experiments.real_cluster --strategies data_parallel --trace   # + each worker's op seconds
    python -m experiments.real_cluster --models resnet50 --batch 32 --strategies head_data_parallel
    python -m experiments.real_cluster --models vgg16 --algorithms fddps auto --verify  # measure first
    python -m experiments.real_cluster --models vgg16 --algorithms fddps heft --verify-also fddps
        # what the model proposes and what verification returns, in one run

The page ends with :func:`agreement`: per network, the share of placements whose
predicted speed-up over one worker is within 15% of the measured one, Kendall's tau
between the two orders, and whether the placements predicted faster measured so.
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from . import common
from .common import DEFAULT_ALGORITHMS, label

DEFAULT_MODELS = ("inception_v3", "resnet50")
#: ``--quick``'s concurrent-transfer measurement (sizes, counts): 4 cells where the
#: full one has 12, at most 32 transfers at once (the full: 128), enough for
#: :func:`~fddps.tf.comm_bench.fit_transfer_cpu`'s line through two sizes.
QUICK_CONCURRENT = ((16384, 1 << 20), (8, 32))
#: The suffix of ``verify_also`` rows: the algorithm placed with ``verify=True``.
VERIFIED = "+verify"
#: Predictions :func:`agreement` scores against the measured step.
PREDICTIONS = {"predicted": "place()'s schedule",
               "predicted_executor": "place()'s prediction of the step TF runs",
               "predicted_tf_order": "TensorFlow's executor order",
               "predicted_tf_order_transfer_cpu": "TF order, concurrent-transfer CPU cost",
               "predicted_many_at_once": "the same, each transfer at the many-at-once cost "
                                         "(not amortised over the transfers in flight)",
               "predicted_channels": "TF order, that cost, FIFO gRPC channels",
               "predicted_transfer_threads": "place()'s prediction, each worker's sends and "
                                             "receives on a thread of its own sharing the "
                                             "machine's cores with the ops"}
#: Strategies run with ``place(..., strategy=...)``: those of the strategy layer
#: (``fddps.strategy``) and ``head_data_parallel``, written here for the networks of
#: :data:`TAIL_SCOPES`.
STRATEGIES = ("data_parallel", "parameter_split", "mixed", "head_data_parallel")

#: Per network, the scopes :func:`head_data_parallel` keeps whole on the last worker:
#: the layers whose weights outweigh their activations at CIFAR size, and the loss.
_LOSS_SCOPES = ("softmax_cross_entropy_with_logits", "cross_entropy")
TAIL_SCOPES = {
    "resnet50": ("block4", "pool5", "logits", "SpatialSqueeze") + _LOSS_SCOPES,
    "resnet200": ("block4", "postnorm", "pool5", "logits", "SpatialSqueeze") + _LOSS_SCOPES,
    "vgg16": ("flatten", "fc6", "Relu", "dropout6", "fc7", "Relu_1", "dropout7", "fc8")
    + _LOSS_SCOPES,
}


def _scope(name: str) -> str:
    """The layer an op belongs to: its name's second component, for a gradient op that
    of its forward op (``gradients/resnet_v1_50/pool5_grad/...``: ``pool5``)."""
    parts = name.split("/")
    if parts[0] == "gradients":
        parts = parts[1:]
    return parts[1].removesuffix("_grad") if len(parts) > 1 else ""


def head_data_parallel(step, devices, scopes):
    """Data parallelism for a network's head, its weight-heavy tail whole on one device.

    Krizhevsky's "one weird trick" (data parallel where activations dominate, one
    copy of the layers whose weights dominate), the whole-op flavour of
    ``fddps.strategy.mixed``: the ops of the layers named by ``scopes`` (an op's
    :func:`_scope`, or its colocation group's: the forward ops, their gradients,
    variables and updates), and every whole op fed by them and by no variable
    elsewhere (a tail weight's decay and its gradient's sum, which go where their
    first tail input is), run whole; the rest as :func:`fddps.strategy.data_parallel`.

    Parameters
    ----------
    step : StepGraph
    devices : sequence of str
    scopes : sequence of str, or mapping of str -> int
        The tail's layers, all on ``devices[-1]``; or each with the index of its device.

    Raises
    ------
    ValueError
        When no op of the step is in ``scopes``.
    """
    from fddps.strategy import OpConfig, Strategy, data_parallel

    if not isinstance(scopes, dict):
        scopes = dict.fromkeys(scopes, len(devices) - 1)
    configs = dict(data_parallel(step, devices).configs)
    home = {}  # tail op -> device index
    for n, op in step.ops.items():
        # A variable's ops go by the variable's layer (its decay's read is in loss/...).
        scope = _scope(op.group) if op.group is not None else ""
        scope = scope if scope in scopes else _scope(n)
        if scope in scopes:
            home[n] = scopes[scope]
    if not home:
        raise ValueError(f"head_data_parallel: no op of the step is in scopes {list(scopes)}")
    groups = {}
    for n, op in step.ops.items():
        if op.group is not None:
            groups.setdefault(op.group, []).append(n)
    grew = True
    while grew:
        size = len(home)
        for n, op in step.ops.items():
            sources = [s for s, _ in op.inputs]
            fed = [s for s in sources if s in home]
            if (n not in home and configs[n].num_parts == 1 and fed
                    and not any(step.ops[s].tied and s not in home for s in sources)):
                home[n] = home[fed[0]]
        for members in groups.values():  # a colocation group runs in one place
            placed = [m for m in members if m in home]
            if placed and len(placed) < len(members) and all(
                    m in home or configs[m].num_parts == 1 for m in members):
                home.update(dict.fromkeys(members, home[placed[0]]))
        grew = len(home) > size
    for n, k in home.items():
        configs[n] = OpConfig({}, (devices[k],))
    return Strategy(configs, devices[0], name="head data parallel")


def _strategy(name, m, devices, fetches):
    """The named strategy (:data:`STRATEGIES`) for model ``m``'s step on ``devices``."""
    from fddps import strategy as strategies
    from fddps.tf.strategy_graph import step_graph

    step = step_graph(m.graph_def, fetches)
    if name == "head_data_parallel":
        return head_data_parallel(step, list(devices), TAIL_SCOPES[m.name])
    return getattr(strategies, name)(step, list(devices))


def profiled_cost_model(model, cluster, *, steps=5, warmup=2, sizes=None, repeats=5, progress=True,
                        transfer_cpu=False, concurrent=None, link_history=None):
    """A cost model fitted on this machine: op times on worker 0, the link between the workers.

    Returns
    -------
    (CostModel, dict)
        The model and facts about the profile (coverage, fitted link, seconds taken).

    ``concurrent``: the (sizes, counts) of the concurrent-transfer measurement
    that fits the per-transfer CPU cost; default
    :data:`~fddps.tf.comm_bench.CONCURRENT_SIZES` x
    :data:`~fddps.tf.comm_bench.CONCURRENT_COUNTS`.

    ``link_history``: a folder shared by the cells of a run. This cell's transfer
    measurements are added to the ones already there, and the link (and the
    concurrent transfers' CPU cost) is fitted on all of them, so that the fit's rounds
    are spread over the run instead of taken in one cell's minute (see
    :func:`pooled_transfers`). ``facts["link_cells"]``: how many cells' measurements
    the fit pooled.
    """
    import costmodel
    from fddps.tf import op_table
    from fddps.tf.comm_bench import (DEFAULT_SIZES, CONCURRENT_COUNTS, CONCURRENT_SIZES,
                                     fit_transfer_cpu, measure_transfers)
    from fddps.tf.profiling import profile

    t0 = time.perf_counter()
    base = costmodel.default_cost_model(cpu=costmodel.cpu_preset(1),
                                        links={"cross_host:*": "grpc-loopback"})
    prof = profile(model, fetches=[model.train_op, model.loss], steps=steps, warmup=warmup,
                   target=cluster.target, progress=progress,
                   meta={"model": model.name, "batch": model.batch_size})
    t1 = time.perf_counter()
    transfers = measure_transfers(cluster.devices, sizes or DEFAULT_SIZES, repeats=repeats,
                                  target=cluster.target, progress=progress)
    # Many transfers at once: what one more costs the two tasks (Cluster.transfer_cpu).
    concurrent_sizes, concurrent_counts = concurrent or (CONCURRENT_SIZES, CONCURRENT_COUNTS)
    concurrent = measure_transfers(cluster.devices, concurrent_sizes, counts=concurrent_counts,
                                   repeats=repeats, target=cluster.target, progress=progress)
    link_cells = 1
    if link_history is not None:
        transfers, concurrent, link_cells = pooled_transfers(link_history, transfers, concurrent,
                                                             cluster.devices)
    cpu = fit_transfer_cpu(concurrent)
    t2 = time.perf_counter()
    # With the CPU cost of concurrent transfers in the model (transfer_cpu=True), FD-DPS
    # once spread Inception-V3 over both workers and measured 0.72x: the order guard
    # then predicted with a FIFO executor. The TensorFlow executor model (sends behind
    # the op after their producer) predicts such spreads slower, and place() falls back.
    cm = costmodel.fit_cost_model(prof.join(op_table(model.graph_def)), transfers=transfers,
                                  base=base, graph=prof.meta["graph"],
                                  transfer_cpu=cpu if transfer_cpu else None)
    lat, bw = cm.link(cluster.devices[0], cluster.devices[1])
    facts = dict(cost_model="profiled", profile_coverage=float(prof.coverage),
                 profile_step_seconds=prof.step_time(),
                 profile_op_seconds=float(prof.ops["seconds"].sum()),
                 profile_gap_seconds=prof.dispatch_seconds,
                 link_latency=lat, link_bandwidth=bw, profile_seconds=t1 - t0,
                 placed_with_transfer_cpu=cm.transfer_cpu(*cluster.devices[:2]) is not None,
                 comm_bench_seconds=t2 - t1, link_cells=link_cells,
                 # One figure for both directions: the worse (slower) of the two.
                 cpu_transfer_latency=float(cpu.cpu_latency.max()),
                 cpu_transfer_bandwidth=float(cpu.cpu_bandwidth.min()))
    return cm, facts


def pooled_transfers(folder, transfers, concurrent, devices):
    """This cell's transfer measurements added to ``folder``'s, and all of them returned.

    A link fitted on one cell's 5 rounds moves with the minute it is taken in:
    over nine cells of three runs the fitted task 0 -> 1 latency ranged from 291
    to 669 us and the bandwidth from 0.58 to 1.26 GB/s, while the same
    placements' measured speed-ups moved by 6% (docs: "The same cells in three
    fresh clusters"). The rows are kept in ``folder/transfers.csv`` and
    ``folder/concurrent.csv`` with a ``cell`` column; devices are renamed by
    their index in ``devices`` (every cell's cluster has the same two tasks).
    Measured (docs: "A link fit pooled over the run"): on a machine that slowed
    during the run, the pooled fit lagged it and each cell's own fit did better,
    so this is off by default.

    Parameters
    ----------
    folder : str or Path
        Created if missing.
    transfers, concurrent : pandas.DataFrame
        :func:`~fddps.tf.comm_bench.measure_transfers`'s rows, one at a time
        and concurrent.
    devices : sequence of str
        This cell's devices, in task order.

    Returns
    -------
    (pandas.DataFrame, pandas.DataFrame, int)
        All cells' one-at-a-time and concurrent rows (in this cell's device
        names) and the number of cells.

    Raises
    ------
    SystemExit
        If the folder's rows name devices this cell does not have.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = {d: k for k, d in enumerate(devices)}
    out = []
    for name, rows in (("transfers", transfers), ("concurrent", concurrent)):
        path = folder / f"{name}.csv"
        earlier = pd.read_csv(path) if path.exists() else pd.DataFrame()
        cell = int(earlier["cell"].max()) + 1 if len(earlier) else 0
        mine = rows.assign(cell=cell, src=rows.src.map(index), dst=rows.dst.map(index))
        both = pd.concat([earlier, mine], ignore_index=True)
        if not both[["src", "dst"]].isin(range(len(devices))).all().all():
            raise SystemExit(f"{path} names devices this cluster does not have: "
                             f"{sorted(set(both.src) | set(both.dst))} for {list(devices)}")
        both.to_csv(path, index=False)
        both = both.assign(src=both.src.map(dict(enumerate(devices))),
                           dst=both.dst.map(dict(enumerate(devices))))
        out.append(both)
    return out[0], out[1], int(out[0]["cell"].nunique())


def analytic_cost_model():
    """The analytic fallback: one core of this machine's CPU, the ``grpc-loopback`` link preset."""
    import costmodel

    cm = costmodel.default_cost_model(cpu=costmodel.cpu_preset(1),
                                      links={"cross_host:*": "grpc-loopback"})
    link = costmodel.presets.links["grpc-loopback"]
    return cm, dict(cost_model="analytic cpu_preset(1) + grpc-loopback", profile_coverage=np.nan,
                    profile_step_seconds=np.nan, profile_op_seconds=np.nan,
                    profile_gap_seconds=np.nan, link_latency=link.latency,
                    link_bandwidth=link.bandwidth, profile_seconds=0.0, comm_bench_seconds=0.0,
                    cpu_transfer_latency=np.nan, cpu_transfer_bandwidth=np.nan,
                    placed_with_transfer_cpu=False)


def measure_steps(graph_defs, fetches, init, target, *, steps=10, warmup=3, config=None,
                  trace=False):
    """Run several (placed) GraphDefs of one step on ``target``, their steps interleaved.

    :func:`fddps.tf.verify.measure_graphs` (what ``place(..., verify=...)``
    times finalists with): each graph in its own isolated session, ``init``,
    a first step (graph partitioning, Grappler), ``warmup - 1`` more; then
    ``steps`` rounds in which every graph runs one timed step, the order
    rotating from round to round, so that whatever the machine does meanwhile
    (other processes, allocator and cache warm-up, clock changes) falls on all
    of them alike. Timing them one after another instead measured identical
    graphs 1.0-1.4x apart on this 2-core machine.

    With ``trace``, each graph then runs one more step, traced, and its dict
    gets ``busy``: what each device spent on ops and on transfers in it
    (:func:`fddps.tf.profiling.device_busy`).

    Returns
    -------
    list of dict
        Per graph: ``median``, ``min``, ``max`` step seconds, ``first_step``
        seconds, ``loss`` (``fetches[1]``) of its last step, ``devices_ran``
        (devices in the executed partition graphs).
    """
    from fddps.tf.verify import measure_graphs

    out = measure_graphs(graph_defs, fetches, init, target, steps=steps, warmup=warmup,
                         config=config, trace=trace)
    for o in out:
        last = o.pop("last")
        o["loss"] = float(last[1]) if last is not None and len(last) > 1 else np.nan
    return out


def _tf_order(schedule, cluster, enforced, amortise_transfers=True) -> float:
    """The schedule's step as TensorFlow's executor runs it on ``cluster``: in its own
    order, or in the scheduled one when order edges enforce it; NaN without that cluster."""
    from fddps import simulate

    if cluster is None:
        return np.nan
    return simulate(schedule.graph, cluster, schedule.device,
                    order=schedule.order if enforced else None, policy="tensorflow",
                    amortise_transfers=amortise_transfers).makespan


def replay(saved) -> pd.DataFrame:
    """The measured rows of ``--save-schedules`` files, predicted again by this simulator.

    Each saved placement keeps its measured step and what it was predicted from
    (``graph``, ``device``, ``order``, ``cluster``, ``cpu_cluster``): the prediction
    columns that come from the simulator (``predicted_executor``, ``predicted_tf_order``,
    ``predicted_tf_order_transfer_cpu``, ``predicted_many_at_once``, ``predicted_channels``,
    ``predicted_transfer_threads``)
    are recomputed, so a change to the executor or transfer model is scored against
    steps already measured, without the cluster. The placements themselves are not made again: what ``place()``
    would now choose needs a fresh run.

    Parameters
    ----------
    saved : iterable of dict
        The entries of one or more ``--save-schedules`` files.

    Returns
    -------
    pandas.DataFrame
        The saved rows, their prediction columns recomputed.
    """
    rows = []
    for r in saved:
        row = dict(r["row"])
        graph, device, cluster, cpu = r["graph"], r["device"], r["cluster"], r["cpu_cluster"]
        enforced = bool(row.get("order_edges", 0))
        schedule = SimpleNamespace(graph=graph, device=device, order=r["order"])
        tf_order = _tf_order(schedule, cluster, enforced)  # what place() now predicts
        row.update(predicted_executor=tf_order, predicted_tf_order=tf_order,
                   predicted_tf_order_transfer_cpu=_tf_order(schedule, cpu, enforced),
                   predicted_many_at_once=_tf_order(schedule, cpu, enforced, False),
                   predicted_channels=_tf_order(schedule, _with_channels(cpu), enforced),
                   predicted_transfer_threads=_tf_order(schedule, _with_transfer_threads(cluster),
                                                        enforced))
        rows.append(row)
    return pd.DataFrame(rows)


def _with_transfer_threads(cluster):
    """``cluster`` with its workers' CPU devices sharing this machine's cores, one thread
    each (the workers' inter-op threads), and sending and receiving on a thread of their
    own beside them (``SharedCores.transfer_threads``: the workers' gRPC threads)."""
    from fddps.cluster import SharedCores
    from fddps.tf.devices import usable_cores

    cpus = tuple(d.name for d in cluster.devices if d.type == "CPU")
    return cluster.with_sharing([SharedCores(cpus, cores=usable_cores(), threads=1.0,
                                             name="cores of this machine",
                                             transfer_threads=True)])


def _with_channels(cluster):
    """``cluster`` with a first-in-first-out gRPC channel per pair of workers (None: None)."""
    from fddps.tf.devices import grpc_channels

    if cluster is None:
        return None
    return cluster.with_sharing(link_resources=list(cluster.link_resources) + grpc_channels(cluster))


def run(models=DEFAULT_MODELS, algorithms=("single",) + DEFAULT_ALGORITHMS, *, batch=8, steps=10,
        warmup=3, profile=True, profile_steps=5, comm_sizes=None, comm_repeats=5,
        comm_concurrent=None, enforce_order="auto", progress=True, strategies=(),
        place_transfer_cpu=True, trace=False, save_schedules=None, verify=False,
        verify_budget=None, verify_also=(), link_history=None):
    """Place and run every model with every algorithm on a fresh 2-worker local cluster.

    ``algorithms`` are :func:`fddps.place` algorithms (placements and the
    strategy searches, e.g. ``"auto"``, ``"flexflow"``); ``strategies`` names
    :data:`STRATEGIES` run as given (``place(..., strategy=...)``), in rows
    named ``strategy:<name>``. ``place_transfer_cpu`` (default True): place with the
    concurrent-transfer CPU cost in the cost model (``transfer_cpu``); False: ``T / 2``
    per end. ``enforce_order``: :func:`fddps.place`'s (default ``"auto"``, its own). ``trace``:
    one more traced step per placement, so that what each worker's ops took
    (``measured_ops_w0``, ``_w1``; transfers' nodes ``measured_comm_w0``,
    ``_w1``) stands beside what the cost model gave them (``predicted_ops_w0``,
    ``_w1``): how much of the prediction's error is the kernels'.
    ``verify``: place every algorithm and strategy with ``place(..., verify=True)`` (its
    finalists timed on the cluster, within ``verify_budget`` seconds; the fastest measured
    returned), the row's ``verified`` saying which finalist was returned (or why none was
    timed), ``verify_seconds``, ``verify_finalists`` and ``verify_measured`` (the
    verification's own median of the returned finalist); the row's ``predicted`` and
    ``measured`` are then the returned placement's. Without it ``verified`` is "".
    ``link_history``: a folder whose transfer measurements every cell adds to and
    fits its link on (:func:`pooled_transfers`).
    ``verify_also``: algorithms placed a second time with verification, in rows named
    ``<algorithm>+verify`` (so one run has both what the model proposes and what
    verification returns).
    ``save_schedules``: a path (``.pkl.gz``) to keep, per placement run, its
    row and what it was predicted from (``graph``, ``device``, ``order``,
    ``cluster``, ``cpu_cluster``: the concurrent-transfer one, or None; with
    ``trace``, ``busy``), so that another transfer model can be replayed
    against the measured steps without the cluster::

        saved = pickle.load(gzip.open(path))
        fddps.Schedule.from_order(r["graph"], my_cluster, r["device"], r["order"]).makespan
    """
    common.tf_quiet()
    import slim_models
    from tqdm.auto import tqdm

    import fddps
    from fddps import Schedule
    from fddps.algorithms import parse_algorithm
    from fddps.tf import local_cluster, make_cluster
    from fddps.tf.devices import same_device

    rows, kept = [], []
    t_start = time.perf_counter()
    with local_cluster(2, threads_per_worker=1) as cluster:
        started = time.perf_counter() - t_start
        specs = (list(algorithms) + [f"strategy:{name}" for name in strategies]
                 + [f"{a}{VERIFIED}" for a in verify_also])
        bar = tqdm(total=len(models) * len(specs), desc="real cluster", unit="run",
                   disable=not progress, file=sys.stderr)
        for model in models:
            bar.set_description(f"real cluster {model}: build")
            m = slim_models.build_training_graph(model, batch, dataset="cifar10")
            fetches = [m.train_op.name, m.loss.name]
            if profile:
                bar.set_description(f"real cluster {model}: profile")
                cm, facts = profiled_cost_model(m, cluster, steps=profile_steps, sizes=comm_sizes,
                                                repeats=comm_repeats, progress=False,
                                                transfer_cpu=place_transfer_cpu,
                                                concurrent=comm_concurrent,
                                                link_history=link_history)
            else:
                cm, facts = analytic_cost_model()
            # The same placements predicted with the per-transfer CPU cost fitted on
            # concurrent transfers (Cluster.transfer_cpu) instead of T / 2 per end; when
            # placed with it, the cost model's own (per direction), so the two agree.
            cpu_cluster = None
            if facts["placed_with_transfer_cpu"]:
                cpu_cluster = make_cluster(cluster.devices, cm)
            elif np.isfinite(facts["cpu_transfer_latency"]):
                cpu_cluster = make_cluster(cluster.devices, cm).with_transfer_cpu(
                    facts["cpu_transfer_latency"], facts["cpu_transfer_bandwidth"])
            placed = []  # (row, graph_def, saved) of every placement, measured together below
            for spec in specs:
                bar.set_description(f"real cluster {model}: {spec}")
                step_fetches = [m.train_op.name, m.loss.op.name]
                if spec == "strategy:head_data_parallel" and model not in TAIL_SCOPES:
                    placed.append((dict(model=model, batch=batch, algorithm=spec, status="n/a",
                                        message=f"written for {', '.join(TAIL_SCOPES)} only",
                                        **facts), None, None))
                    bar.update()
                    continue
                # With --verify, the finalists run on the cluster (isolated sessions, the
                # model's init op) before place() returns.
                checked = dict(verify=True, verify_budget=verify_budget, target=cluster.target,
                               session_config=cluster.session_config(),
                               init=m.init_op.name) if verify or spec.endswith(VERIFIED) else {}
                try:
                    if spec.startswith("strategy:"):
                        st = _strategy(spec.split(":", 1)[1], m, cluster.devices, step_fetches)
                        p = fddps.place(m.graph_def, cluster.devices, cost_model=cm, strategy=st,
                                        fetches=step_fetches, **checked)
                    else:
                        name, options = parse_algorithm(spec.removesuffix(VERIFIED))
                        p = fddps.place(m.graph_def, cluster.devices, cost_model=cm, algorithm=name,
                                        fetches=step_fetches, enforce_order=enforce_order,
                                        **checked, **options)
                except fddps.InfeasibleError as e:
                    placed.append((dict(model=model, batch=batch, algorithm=spec, status="OOM",
                                        message=str(e), **facts), None, None))
                    bar.update()
                    continue
                s = p.schedule
                enforced = bool(enforce_order and p.info.get("order_edges_added"))
                ops_per_device = np.bincount(s.device, minlength=2)
                op_seconds = s.graph.exec_times(p.cluster)[np.arange(s.graph.num_ops), s.device]
                predicted_ops = np.bincount(s.device, weights=op_seconds, minlength=2)
                cross = s.device[s.graph.src] != s.device[s.graph.dst]
                # TF sends a tensor once per (producer, receiving device), as the simulator does.
                sent = pd.DataFrame({"src": s.graph.src[cross], "to": s.device[s.graph.dst[cross]],
                                     "bytes": s.graph.bytes[cross]}).groupby(["src", "to"]).bytes.max()
                row = dict(model=model, batch=batch, algorithm=spec, status="ok",
                           ops=s.graph.num_ops, ops_worker0=int(ops_per_device[0]),
                           ops_worker1=int(ops_per_device[1]),
                           predicted_ops_w0=predicted_ops[0], predicted_ops_w1=predicted_ops[1],
                           transfers=len(sent), transfer_MB=float(sent.sum() / 1e6),
                           predicted=p.makespan, place_seconds=p.info["place_seconds"],
                           # The step the written graph runs: TensorFlow's executor
                           # (its own order, or held to the schedule's by order edges).
                           predicted_executor=p.executor_makespan,
                           predicted_transfer_cpu=(
                               Schedule.from_order(s.graph, cpu_cluster, s.device, s.order).makespan
                               if cpu_cluster is not None else np.nan),
                           # A strategy's task graph, without what the rewrite adds
                           # between parts (its prediction before it was written).
                           predicted_expansion=p.info.get("expansion_makespan", np.nan),
                           # TensorFlow's own order on one inter-op thread per worker
                           # (depth first; ops readied by a received tensor wait
                           # behind local work): what runs without order edges.
                           predicted_tf_order=_tf_order(s, p.cluster, enforced),
                           # Both: TensorFlow's order with the concurrent-transfer cost.
                           predicted_tf_order_transfer_cpu=_tf_order(s, cpu_cluster, enforced),
                           # The same before amortising (fddps.simulate.amortised_shares).
                           predicted_many_at_once=_tf_order(s, cpu_cluster, enforced, False),
                           # And transfers queued first in first out on one gRPC channel
                           # per pair of workers (fddps.tf.devices.grpc_channels).
                           predicted_channels=_tf_order(s, _with_channels(cpu_cluster), enforced),
                           # place()'s prediction with the workers' gRPC threads sending
                           # and receiving beside their ops, on the machine's cores.
                           predicted_transfer_threads=_tf_order(
                               s, _with_transfer_threads(p.cluster), enforced),
                           order_edges=p.info.get("order_edges_added", 0),
                           ops_split=p.info.get("ops_split", len(s.info.get("splits") or [])),
                           chosen=str(p.info.get("search", p.info.get("strategy", ""))),
                           message="", **_verify_columns(p.info.get("verified")),
                           verify_seconds=p.info.get("verify_seconds", 0.0), **facts)
                saved = dict(graph=s.graph, device=s.device, order=s.order,
                             cluster=p.cluster, cpu_cluster=cpu_cluster)
                placed.append((row, p.graph_def, saved))
                bar.update()
            bar.set_description(f"real cluster {model}: {len(placed)} placements, steps interleaved")
            measured = iter(measure_steps([gd for _, gd, _ in placed if gd is not None], fetches,
                                          m.init_op.name, cluster.target, steps=steps,
                                          warmup=warmup, config=cluster.session_config(),
                                          trace=trace))
            for row, gd, saved in placed:
                if gd is None:  # out of memory, or a strategy not written for the network: not run
                    rows.append(row)
                    continue
                got = next(measured)
                if trace:
                    for k, dev in enumerate(cluster.devices[:2]):
                        mine = got["busy"][[same_device(d, dev) for d in got["busy"].device]]
                        row[f"measured_ops_w{k}"] = float(mine.op_seconds.sum())
                        row[f"measured_comm_w{k}"] = float(mine.comm_seconds.sum())
                rows.append(dict(row, measured=got["median"], measured_min=got["min"],
                                 measured_max=got["max"], first_step=got["first_step"],
                                 loss=got["loss"], devices_ran=got["devices_ran"]))
                if save_schedules:
                    kept.append(dict(saved, row=rows[-1], busy=got.get("busy")))
        bar.close()
    df = pd.DataFrame(rows)
    df.attrs["cluster_start_seconds"] = started
    if save_schedules:
        common.ensure_parent(save_schedules)
        with gzip.open(save_schedules, "wb") as f:
            pickle.dump(kept, f)
    return df


def _verify_columns(record) -> dict:
    """The CSV's columns of a placement's verification (``info["verified"]``, or None)."""
    if not record:
        return dict(verified="", verify_finalists=0, verify_measured=np.nan, verify_detail="")
    returned = record["finalists"][record["returned_index"]]
    detail = "; ".join(f"{r['label']}: {r['predicted'] * 1e3:.1f} ms predicted, "
                       + (f"{r['measured'] * 1e3:.1f} ms measured ({r['steps']} steps)"
                          if np.isfinite(r["measured"]) else "not measured")
                       for r in record["finalists"])
    return dict(verified=(f"not verified: {record['reason']}" if record["reason"]
                          else record["returned"]),
                verify_finalists=len(record["finalists"]), verify_measured=returned["measured"],
                verify_detail=detail + (f"; {record['rounds']} rounds, stopped: "
                                        f"{record['stopped']}" if not record["reason"] else ""))


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and algorithm: measured and predicted ms, speedups over one worker, error."""
    out = []
    for (model, batch), g in df.groupby(["model", "batch"], sort=False):
        single = g.set_index("algorithm").get("measured", pd.Series(dtype=float)).get("single", np.nan)
        single_pred = g.set_index("algorithm").get("predicted", pd.Series(dtype=float)).get("single", np.nan)
        for r in g.itertuples():
            if r.status != "ok":
                out.append(dict(model=model, batch=batch, algorithm=label(r.algorithm),
                                measured_ms=r.status))
                continue
            cpu = getattr(r, "predicted_transfer_cpu", np.nan)
            out.append(dict(model=model, batch=batch, algorithm=label(r.algorithm),
                            measured_ms=round(r.measured * 1e3, 1),
                            min_max_ms=f"{r.measured_min * 1e3:.0f}-{r.measured_max * 1e3:.0f}",
                            predicted_ms=round(r.predicted * 1e3, 1),
                            pred_error=f"{(r.predicted - r.measured) / r.measured:+.0%}",
                            pred_cpu_ms=round(cpu * 1e3, 1),
                            pred_cpu_error=f"{(cpu - r.measured) / r.measured:+.0%}",
                            pred_taskgraph_ms=round(getattr(r, "predicted_expansion", np.nan) * 1e3, 1),
                            pred_tf_ms=round(getattr(r, "predicted_tf_order", np.nan) * 1e3, 1),
                            pred_tf_error=f"{(getattr(r, 'predicted_tf_order', np.nan) - r.measured) / r.measured:+.0%}",
                            pred_tf_cpu_error=f"{(getattr(r, 'predicted_tf_order_transfer_cpu', np.nan) - r.measured) / r.measured:+.0%}",
                            **_error_split(r),
                            x_single_measured=f"{single / r.measured:.2f}x",
                            x_single_predicted=f"{single_pred / r.predicted:.2f}x",
                            ops_w0_w1=f"{r.ops_worker0}/{r.ops_worker1}",
                            transfers=r.transfers, transfer_MB=round(r.transfer_MB, 2),
                            ops_split=getattr(r, "ops_split", 0),
                            order_edges=r.order_edges, place_s=round(r.place_seconds, 2),
                            verified=getattr(r, "verified", "")))
    out = pd.DataFrame(out)
    if "verified" in out and not out.verified.fillna("").astype(bool).any():
        out = out.drop(columns="verified")
    if "order_edges" in out and not (out.order_edges.fillna(0) > 0).any():
        out = out.drop(columns="order_edges")
    return out


def agreement(df: pd.DataFrame) -> pd.DataFrame:
    """How well each prediction ranks and sizes the placements, per model and batch.

    Speed-ups over one worker as ratios inside the run: predicted (the single
    row's prediction over the row's) against measured (median over median).
    Per prediction column of :data:`PREDICTIONS`: ``within_15`` the share of
    rows (``single`` and the ``+verify`` rows left out) whose predicted
    speed-up is within 15% of the measured one, ``tau`` Kendall's tau-b
    between the two over those rows and ``single``; and, for the run,
    ``proposed_faster`` (rows that ``place()`` predicts, as TensorFlow runs them,
    at least 10% faster than one worker)
    with ``of_them_not_slower`` (those measuring at least 1.0x),
    ``verified_min`` (the slowest ``+verify`` row, measured speed-up) and
    ``one_worker_spread`` (the largest distance from 1.0x of the
    ``one_worker_rows`` other rows that run on one worker: the noise floor).
    """
    out = []
    for (model, batch), g in df[df.status == "ok"].groupby(["model", "batch"], sort=False):
        g = g.set_index("algorithm")
        if "single" not in g.index:
            continue
        measured = g.measured["single"] / g.measured
        checked = ~g.index.str.endswith(VERIFIED)
        others = checked & (g.index != "single")
        row = dict(model=model, batch=batch, rows=int(others.sum()))
        for column in PREDICTIONS:
            if column not in g or not np.isfinite(g[column][checked]).all():
                continue
            predicted = g[column]["single"] / g[column]
            close = (predicted / measured - 1).abs() <= 0.15
            row[f"{column}:within_15"] = float(close[others].mean())
            row[f"{column}:tau"] = float(pd.concat([predicted[checked], measured[checked]], axis=1)
                                         .corr(method="kendall").iloc[0, 1])
        proposed = g.predicted_executor if "predicted_executor" in g else g.predicted
        faster = others & (proposed["single"] / proposed >= 1.1)
        row["proposed_faster"] = int(faster.sum())
        row["of_them_not_slower"] = int((measured[faster] >= 1.0).sum())
        verified = measured[~checked]
        row["verified_min"] = float(verified.min()) if verified.size else np.nan
        # Rows that run the whole step on one worker, as `single` does: the run's noise floor.
        if {"ops_worker0", "ops_worker1"} <= set(g.columns):
            alone = (g.ops_worker0 * g.ops_worker1 == 0) & (g.index != "single")
            row["one_worker_rows"] = int(alone.sum())
            row["one_worker_spread"] = (float((measured[alone] - 1).abs().max())
                                        if alone.any() else np.nan)
        out.append(row)
    return pd.DataFrame(out)


def measured_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, batch and placement (``single`` and ``+verify`` rows left out): the measured
    and predicted (``predicted_executor``) speed-up over ``single`` of the same run, and
    the placement's transfers (which tell whether two runs placed it alike)."""
    out = []
    for (model, batch), g in df[df.status == "ok"].groupby(["model", "batch"], sort=False):
        g = g.set_index("algorithm")
        if "single" not in g.index:
            continue
        for algorithm, r in g.iterrows():
            if algorithm == "single" or algorithm.endswith(VERIFIED):
                continue
            out.append(dict(model=model, batch=int(batch), algorithm=algorithm,
                            measured=g.measured["single"] / r.measured,
                            predicted=g.predicted_executor["single"] / r.predicted_executor,
                            transfers=r.transfers))
    return pd.DataFrame(out, columns=["model", "batch", "algorithm", "measured", "predicted",
                                      "transfers"])


#: The columns that say two runs' rows are the same placement: a strategy, or an algorithm
#: that placed alike (the same number of transfers between the workers).
SAME_PLACEMENT = ["model", "batch", "algorithm", "transfers"]


def run_to_run(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The same placements measured in two runs: how far their measured speed-ups moved.

    A prediction can only be as close to a measured speed-up as two measurements
    of it are to each other. Each run is scored against its own ``single`` row
    (ratios inside a run, so the machine's drift between runs cancels); the
    placements compared are those of both runs that move tensors between the
    workers with the same number of transfers (the same placement: a strategy,
    or an algorithm that placed alike).

    Parameters
    ----------
    first, second : pandas.DataFrame
        Two runs' rows (this module's CSVs).

    Returns
    -------
    pandas.DataFrame
        Per placement: ``model``, ``batch``, ``algorithm``, ``transfers``,
        ``measured_first``, ``measured_second`` (speed-ups over one worker),
        ``moved`` (second / first), and the predictions ``predicted_first``,
        ``predicted_second`` (each run's cost model was profiled in that run).
    """
    a, b = measured_speedups(first), measured_speedups(second)
    both = a.merge(b, on=SAME_PLACEMENT,
                   suffixes=("_first", "_second"))
    both = both[both.transfers > 0].reset_index(drop=True)
    both["moved"] = both.measured_second / both.measured_first
    return both[["model", "batch", "algorithm", "transfers", "measured_first", "measured_second",
                 "moved", "predicted_first", "predicted_second"]]


def _error_split(r) -> dict:
    """With a traced step: the ops' measured and predicted seconds per worker (ms), and
    how much of the prediction's error (the busier worker's ops, predicted minus
    measured, over the measured step) the kernels account for; the rest is the
    transfers, waiting and order."""
    measured = [getattr(r, f"measured_ops_w{k}", np.nan) for k in (0, 1)]
    if not np.isfinite(measured).all():
        return {}
    predicted = [getattr(r, f"predicted_ops_w{k}") for k in (0, 1)]
    kernels = (max(predicted) - max(measured)) / r.measured
    return dict(ops_ms_measured="/".join(f"{x * 1e3:.0f}" for x in measured),
                ops_ms_predicted="/".join(f"{x * 1e3:.0f}" for x in predicted),
                error_kernels=f"{kernels:+.0%}",
                error_rest=f"{(r.predicted - r.measured) / r.measured - kernels:+.0%}")


def plot(df: pd.DataFrame, path):
    """Measured (bars) and predicted (markers) step time per model and algorithm, three models a row."""
    plt = common.matplotlib_agg()
    ok = df[df.status == "ok"]
    models = list(dict.fromkeys(zip(ok.model, ok.batch)))  # one panel per network and batch
    cols = min(3, max(1, len(models)))
    rows = -(-max(1, len(models)) // cols)
    # The legend's four entries in one row need three panels' width; else two a row.
    legend_rows = 1 if cols >= 3 else 2
    legend_height = 0.35 * legend_rows + 0.25
    fig, axes = plt.subplots(rows, cols, figsize=(max(5.5 * cols, 8.0), 3.8 * rows + legend_height),
                             squeeze=False)
    markers = [("predicted", "D", "tab:orange", "predicted (place()'s schedule)"),
               ("predicted_transfer_cpu", "o", "tab:green",
                "predicted (CPU cost of concurrent transfers)"),
               ("predicted_tf_order_transfer_cpu", "^", "tab:red",
                "predicted (that cost, TensorFlow's executor order)"),
               ("predicted_transfer_threads", "v", "tab:purple",
                "predicted (that, transfers on gRPC threads sharing the cores)")]
    for ax, (model, batch) in zip(axes.flat, models):
        g = ok[(ok.model == model) & (ok.batch == batch)]
        x = np.arange(len(g))
        ax.bar(x, g.measured * 1e3, color="tab:blue", label="measured (median, min-max)")
        ax.errorbar(x, g.measured * 1e3, yerr=[(g.measured - g.measured_min) * 1e3,
                                               (g.measured_max - g.measured) * 1e3],
                    fmt="none", color="black", lw=0.8)
        for column, marker, color, text in markers:
            if column in g and np.isfinite(g[column]).any():
                ax.scatter(x, g[column] * 1e3, marker=marker, color=color, zorder=3, label=text)
        ax.set_xticks(x, [label(a) for a in g.algorithm], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{model} (batch {batch}), 2 workers x 1 core", fontsize=10)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=-(-len(labels) // legend_rows), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, legend_height / (3.8 * rows + legend_height), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=common.MODELS)
    parser.add_argument("--batch", type=int, default=None, help="default 8 (2 with --quick)")
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS),
                        help="'single' (one worker alone) is always run first")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per placement (median); default 10 (2 with --quick)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first; default 3 (1 with --quick)")
    parser.add_argument("--no-profile", action="store_true",
                        help="use the analytic one-core CPU preset instead of profiling")
    parser.add_argument("--profile-steps", type=int, default=None,
                        help="traced profiling steps; default 5 (1 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: batch 2, 1 warm-up + 2 timed steps, 1 profiled step, "
                             "transfers of 3 sizes x 2 repeats, concurrent transfers of "
                             "2 sizes x 2 counts")
    parser.add_argument("--strategies", nargs="*", default=[], choices=STRATEGIES,
                        help="strategies to run as given, besides the algorithms (e.g. "
                             "data_parallel parameter_split mixed; head_data_parallel: "
                             "ResNets and VGG-16 only, 'n/a' for the others)")
    parser.add_argument("--enforce-order", choices=("auto", "on", "off"), default="auto",
                        help="place()'s enforce_order: 'auto' (its default: order edges only "
                             "where TensorFlow's own order is predicted slower than one worker "
                             "and the scheduled order is not), 'on' (always), 'off' (never)")
    parser.add_argument("--out", default=str(common.RESULTS / "real_cluster.csv"))
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--save-schedules", default=None, metavar="PATH.pkl.gz",
                        help="keep every placement's graph, devices, order, clusters and "
                             "measured row, to replay other transfer models offline")
    parser.add_argument("--trace", action="store_true",
                        help="one more traced step per placement: each worker's op seconds, "
                             "measured beside predicted, and the prediction's error split "
                             "between the kernels and the rest")
    parser.add_argument("--verify", action="store_true",
                        help="place every algorithm and strategy with place(..., verify=True): "
                             "its finalists timed on the cluster, the fastest measured kept "
                             "(the 'verified' column names it)")
    parser.add_argument("--verify-also", nargs="+", default=[], metavar="ALGORITHM",
                        help="place these algorithms a second time with verify=True, in rows "
                             f"named ALGORITHM{VERIFIED}")
    parser.add_argument("--verify-budget", type=float, default=None,
                        help="seconds each verification may take (default: the library's)")
    parser.add_argument("--from-csv", nargs="+", default=None, metavar="CSV",
                        help="run nothing: join these runs' CSVs (e.g. one per network, each in "
                             "a fresh cluster) into --out, its plot and its page")
    parser.add_argument("--replay", nargs="+", default=None, metavar="PATH.pkl.gz",
                        help="run nothing: predict the placements of these --save-schedules "
                             "files again with the current simulator, against their measured "
                             "steps, into --out, its plot and its page")
    parser.add_argument("--compare-with", nargs="+", default=None, metavar="CSV",
                        help="with --from-csv or --replay: the same placements measured in "
                             "these earlier runs' CSVs; writes how far their measured "
                             "speed-ups moved between the runs (run_to_run) to "
                             "<out>_run_to_run.csv and .md")
    parser.add_argument("--link-history", default=None, metavar="FOLDER",
                        help="add each cell's transfer measurements to FOLDER's and fit the "
                             "link on all of them (give every run of a benchmark the same "
                             "FOLDER): a link fit spread over the run. Measured worse than "
                             "each cell's own fit on a machine that drifts (docs: the same "
                             "cells in three fresh clusters), so off by default")
    parser.add_argument("--half-transfer-cpu", action="store_true",
                        help="place with T / 2 of CPU per end of each transfer instead of the "
                             "CPU cost fitted on concurrent transfers (reported beside, in "
                             "predicted_transfer_cpu)")
    args = parser.parse_args(argv)
    quick = dict(batch=2, steps=2, warmup=1, profile_steps=1) if args.quick else \
        dict(batch=8, steps=10, warmup=3, profile_steps=5)
    for key, value in quick.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.batch < 1 or args.steps < 1 or args.warmup < 1 or args.profile_steps < 1:
        parser.error("--batch, --steps, --warmup and --profile-steps must be >= 1")
    if args.compare_with and not (args.from_csv or args.replay):
        parser.error("--compare-with needs --from-csv or --replay (runs already measured)")
    command = "python -m experiments.real_cluster" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    if args.from_csv or args.replay:
        if args.replay:
            saved = [entry for path in args.replay for entry in pickle.load(gzip.open(path))]
            df = replay(saved)
        else:
            df = pd.concat([pd.read_csv(f) for f in args.from_csv], ignore_index=True)
        df["verified"] = df.get("verified", pd.Series("", index=df.index)).fillna("")
        with pd.option_context("display.width", 200):
            print(agreement(df).to_string(index=False))
        out = common.save_csv_and_plot(df, args.out, plot)
        runs = list(dict.fromkeys(df["command"].dropna())) if "command" in df else []
        write_markdown(df, out.with_suffix(".md"), command + "".join(
            f"`, joining the runs of `{c}" for c in runs), np.nan)
        if args.compare_with:
            earlier = pd.concat([pd.read_csv(f) for f in args.compare_with], ignore_index=True)
            write_run_to_run(run_to_run(earlier, df), out, command)
        return df
    algorithms = ["single"] + [a for a in args.algorithms if a != "single"]
    t0 = time.perf_counter()
    df = run(args.models, algorithms, batch=args.batch, steps=args.steps, warmup=args.warmup,
             profile=not args.no_profile, profile_steps=args.profile_steps,
             comm_sizes=(4, 1 << 20, 8 << 20) if args.quick else None,
             comm_repeats=2 if args.quick else 5,
             comm_concurrent=QUICK_CONCURRENT if args.quick else None,
             enforce_order={"on": True, "off": False}.get(args.enforce_order, "auto"),
             progress=not args.no_progress, strategies=args.strategies,
             place_transfer_cpu=not args.half_transfer_cpu, trace=args.trace,
             save_schedules=args.save_schedules, verify=args.verify,
             verify_budget=args.verify_budget, verify_also=args.verify_also,
             link_history=args.link_history)
    wall = time.perf_counter() - t0
    first = df.iloc[0]
    print(f"Real cluster: 2 tf.distribute.Server workers on 127.0.0.1, 1 thread each, started in "
          f"{df.attrs.get('cluster_start_seconds', np.nan):.0f} s; models {', '.join(args.models)} at "
          f"batch {args.batch}, 32x32; per placement: {args.warmup} warm-up step(s), then the median "
          f"(min-max) of {args.steps} timed steps from this client, the placements' steps "
          f"interleaved (one each per round, the order rotating); "
          f"enforce_order={args.enforce_order}"
          + ("; placed with verify=True (each algorithm's finalists timed on the cluster, the "
             "fastest measured kept: column verified)" if args.verify else "")
          + f"; {wall:.0f} s in all.")
    if first.cost_model == "profiled":
        for model, g in df.groupby("model", sort=False):
            r = g.iloc[0]
            print(f"Cost model for {model}: profiled on worker 0 ({r.profile_coverage:.0%} of the step's "
                  f"ops timed; untraced step {r.profile_step_seconds * 1e3:.0f} ms, sum of op times "
                  f"{r.profile_op_seconds * 1e3:.0f} ms, executor gap {r.profile_gap_seconds * 1e6:.0f} "
                  f"us per op) and the link "
                  f"measured (latency {r.link_latency * 1e6:.0f} us, {r.link_bandwidth / 1e9:.2f} GB/s; "
                  f"one more concurrent transfer costs the tasks {r.cpu_transfer_latency * 1e6:.0f} us "
                  f"+ bytes / {r.cpu_transfer_bandwidth / 1e9:.2f} GB/s); "
                  f"profiling took {r.profile_seconds:.0f} s + {r.comm_bench_seconds:.0f} s.")
    else:
        print(f"Cost model: {first.cost_model} (not profiled).")
    print("measured = wall time of Session.run([train_op, loss]); predicted = the simulator's "
          "makespan of the schedule under that cost model (each transfer's T / 2 spent by each "
          "task; for a strategy, the step of the GraphDef it writes); pred_cpu = the same "
          "with the per-transfer CPU cost fitted on concurrent transfers (Cluster.transfer_cpu); "
          "pred_taskgraph = a strategy's task graph, as the searches score it; "
          "pred_tf = the same as TensorFlow's executor orders it; pred_tf_cpu = both "
          "(TensorFlow's order, the concurrent-transfer cost); with --trace, ops_ms = the "
          "seconds each worker's ops took in a traced step, measured and predicted, "
          "error_kernels = the busier worker's, predicted minus measured, over the measured "
          "step, error_rest = pred_error minus that (transfers, waiting, order); "
          "x_single = one worker's time / this.")
    with pd.option_context("display.width", 200):
        print(summary(df).to_string(index=False))
        print("How well each prediction ranks and sizes the placements (agreement(); "
              "speed-ups over one worker, predicted against measured):")
        print(agreement(df).to_string(index=False))
    df["command"] = command
    out = common.save_csv_and_plot(df, args.out, plot)
    write_markdown(df, out.with_suffix(".md"), command, wall)
    return df


def write_run_to_run(moved: pd.DataFrame, out, command: str) -> Path:
    """:func:`run_to_run`'s table as ``<out>_run_to_run.csv`` and ``.md`` (with how many
    placements moved less than 15% and the median move); prints the summary line."""
    out = Path(out)
    csv = out.with_name(out.stem + "_run_to_run.csv")
    moved.to_csv(csv, index=False)
    dev = (moved.moved - 1).abs()
    line = (f"{int((dev <= 0.15).sum())} of {len(moved)} placements' measured speed-ups moved "
            f"at most 15% between the runs (median {dev.median():.1%}, largest "
            f"{dev.max():.1%})" if len(moved) else "no placement measured in both runs")
    print(line)
    ratios = ("measured_first", "measured_second", "moved", "predicted_first", "predicted_second")
    table = moved.assign(transfers=moved.transfers.astype(int),
                         **{c: moved[c].map("{:.3f}".format) for c in ratios})
    csv.with_suffix(".md").write_text(
        f"Command: `{command}`.\n\n{line}.\n\n{common.markdown_table(table)}\n")
    print(f"results: {csv}, {csv.with_suffix('.md')}")
    return csv


def _cpu_model() -> str:
    """This machine's CPU model (``/proc/cpuinfo``), else ``platform.processor()``."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_markdown(df: pd.DataFrame, path, command: str, seconds: float) -> None:
    """The results page beside the CSV: the command, what it measures, when and where, the table."""
    import os
    from datetime import datetime, timezone

    table = summary(df)

    def cell(v):
        return "" if isinstance(v, float) and np.isnan(v) else str(v).replace("|", "/")

    lines = ["# Measured step time of placed graphs on a 2-worker TensorFlow cluster", "",
             f"Command: `{command}`" + (f" ({seconds:.0f} s)" if np.isfinite(seconds) else "")
             + f"; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} "
             f"UTC on {_cpu_model()}, {os.cpu_count()} cores, shared with other work (load "
             f"average {os.getloadavg()[0]:.1f} at the end): compare the rows of one model with "
             "each other (ratios), not across runs.", "",
             "What it measures: " + " ".join(" ".join(__doc__.split("\n\n")[1:3]).split()),
             "",
             "No paper figure: the papers' testbeds are GPUs; this is the one real "
             "multi-device setting a 2-core machine has.", "",
             "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    scores = agreement(df)
    if not scores.empty:
        lines += ["", "How well each prediction ranks and sizes the placements: speed-ups over "
                  "one worker, predicted (the single row's prediction over the row's) against "
                  "measured (median over median), over the rows other than `single` and "
                  f"`{VERIFIED}`; `within_15`: the share within 15%; `tau`: Kendall's tau-b "
                  "(with `single`); `proposed_faster`: rows predicted at least 10% faster "
                  "than one worker, `of_them_not_slower`: those measuring at least 1.0x; "
                  f"`verified_min`: the slowest `{VERIFIED}` row's measured speed-up; "
                  "`one_worker_spread`: the largest |measured speed-up - 1| of the "
                  "`one_worker_rows` other rows that, like `single`, run the step on one "
                  "worker (the run's noise floor). "
                  "Predictions: " + "; ".join(f"`{k}`: {v}" for k, v in PREDICTIONS.items())
                  + ".", "", common.markdown_table(scores, "{:.2f}")]
    if "verify_detail" in df and df.verify_detail.fillna("").astype(bool).any():
        lines += ["", "Verification (``place(..., verify=True)``, timed inside place(); the "
                  "finalist returned is the row's placement, measured again above):", ""]
        lines += [f"- {r.model} {label(r.algorithm)}: "
                  + (f"{r.verified}; " if r.verified.startswith("not verified") else
                     f"returned {r.verified} after {r.verify_seconds:.1f} s; ") + r.verify_detail
                  for r in df.itertuples() if isinstance(r.verify_detail, str) and r.verify_detail]
    path.write_text("\n".join(lines) + "\n")
    print(f"results page: {path}")


if __name__ == "__main__":
    main()
