"""Predictions that hardware can keep: shared cores and shared network interfaces (issue 17).

Three parts, each optional (``--parts``):

``local``
    ``--model`` at ``--batch`` (CIFAR size) on 2 and 4 CPU devices of this
    process (``ConfigProto(device_count={"CPU": n})``). Every algorithm places
    it twice: with the cluster fddps builds by default, where the devices share
    this process's cores (:func:`fddps.tf.devices.local_cpu_sharing`), and with
    every device given cores of its own (``share_cores=False``, the model before
    contention was modelled). Each placed graph runs here (``--warmup`` steps,
    then the median of ``--steps``; identical placements run once); reported
    beside the prediction of the order TensorFlow picks itself
    (:attr:`Placement.executor_makespan`, what the placed graph runs). Speed-up
    = the ``single`` placement's time over the algorithm's, predicted by the
    same model, and measured by alternating steps of the two placed graphs in
    one process (medians), so both see the same load. ``--profile`` fits the op times on
    this machine first (:func:`fddps.tf.profiling.profile` on CPU:0) instead of
    the analytic CPU preset.
``cluster``
    The same on the 2-worker ``local_cluster`` (one core each, gRPC), through
    :func:`experiments.real_cluster.run` (its prediction is the scheduled
    order's; worker tasks are separate processes and fddps gives them no shared
    group: two one-thread workers on this 2-core machine do not contend).
``fig4``
    The paper's Figure 4 setting (2 hosts x 4 simulated P100s, PCIe 3 inside a
    host, 10 GbE between hosts, the paper's batch): every algorithm schedules
    each model on the contention-free cluster and on the one where each host
    sends and receives through one network interface
    (:func:`fddps.tf.devices.nic_per_host`). Reported: both step times, the
    change, each algorithm's rank in both, and the bytes crossing between hosts.

The machine is shared with other sessions: read measured times as ratios
inside one run; the load average at the start and end is printed.

Writes ``experiments/results/contention_{local,cluster,fig4}.csv`` and
``contention.png``.

Usage::

    python -m experiments.contention                       # ResNet-50 batch 8, all parts (~20 min)
    python -m experiments.contention --quick               # smoke: batch 2, 2 algorithms, short runs
    python -m experiments.contention --parts fig4 --fig4-models inception_v3 resnet50
    python -m experiments.contention --parts local --profile --devices 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pandas as pd

from . import common
from .common import DEFAULT_ALGORITHMS, PAPER_BATCH, label

PARTS = ("local", "cluster", "fig4")


def _placement_key(graph_def):
    return tuple(sorted((n.name, n.device) for n in graph_def.node))


def measure_paired(base_def, graph_def, fetches, init, config, *, steps=10, warmup=3):
    """Run two GraphDefs in one process, alternating steps (so both see the same load).

    Returns ``(base step times, step times)``, ``steps`` each after ``warmup``.
    """
    import tensorflow as tf

    tf1 = tf.compat.v1
    sessions = []
    for gd in (base_def, graph_def):
        g = tf.Graph()
        with g.as_default():
            tf.graph_util.import_graph_def(gd, name="")
        sess = tf1.Session(graph=g, config=config)
        sess.run(init)
        sessions.append(sess)
    times = ([], [])
    try:
        for rep in range(warmup + steps):
            for k in ((0, 1) if rep % 2 else (1, 0)):
                t0 = time.perf_counter()
                sessions[k].run(fetches)
                if rep >= warmup:
                    times[k].append(time.perf_counter() - t0)
    finally:
        for sess in sessions:
            sess.close()
    return times


def local_cost_model(model, profile_steps=0):
    """The default analytic cost model, or one fitted on this machine's CPU:0
    with ``profile_steps`` traced steps (> 0)."""
    import costmodel

    base = costmodel.default_cost_model()
    if not profile_steps:
        return base, "analytic default (cpu_preset: all cores)"
    from fddps.tf import op_table
    from fddps.tf.profiling import profile

    prof = profile(model, fetches=[model.train_op, model.loss], steps=profile_steps, warmup=2,
                   inter_op_threads=None, progress=False)
    cm = costmodel.fit_cost_model(prof.join(op_table(model.graph_def)), base=base,
                                  graph=prof.meta["graph"])
    return cm, f"profiled here ({profile_steps} traced steps on CPU:0, coverage {prof.coverage:.0%})"


def run_local(model_name="resnet50", batch=8, device_counts=(2, 4), algorithms=DEFAULT_ALGORITHMS,
              *, steps=10, warmup=3, profile_steps=0, progress=True):
    """Place and run on ``n`` CPU devices of this process, both core models; one row per run."""
    common.tf_quiet()
    import slim_models
    import tensorflow as tf
    from tqdm.auto import tqdm

    import fddps
    from fddps.algorithms import parse_algorithm
    from fddps.tf import make_cluster

    m = slim_models.build_training_graph(model_name, batch, dataset="cifar10")
    fetches = [m.train_op.name, m.loss.name]
    cm, cm_note = local_cost_model(m, profile_steps)
    specs = ["single"] + [s for s in algorithms if s != "single"]
    rows, measured, base = [], {}, {}
    bar = tqdm(total=len(device_counts) * 2 * len(specs), desc="contention local", unit="run",
               disable=not progress, file=sys.stderr)
    for n in device_counts:
        devices = [f"/device:CPU:{k}" for k in range(n)]
        config = tf.compat.v1.ConfigProto(device_count={"CPU": n})
        for cores in ("shared", "own"):
            cluster = make_cluster(devices, cm, share_cores=cores == "shared")
            for spec in specs:
                bar.set_description(f"contention local {n} CPUs, {cores} cores: {spec}")
                name, options = parse_algorithm(spec)
                p = fddps.place(m.graph_def, cluster, cost_model=cm, algorithm=name,
                                fetches=[m.train_op.name, m.loss.op.name], **options)
                if spec == "single":
                    base[n] = (p.graph_def, p.executor_makespan)
                key = (n, _placement_key(p.graph_def))
                if key not in measured:
                    # Each placement alternates with the single-device one:
                    # its speed-up is measured under the same load.
                    t_base, t = measure_paired(base[n][0], p.graph_def, fetches, m.init_op.name,
                                               config, steps=steps, warmup=warmup)
                    measured[key] = (float(np.median(t_base)), float(np.median(t)))
                t_base, t = measured[key]
                rows.append(dict(model=model_name, batch=batch, devices=n, cores=cores,
                                 algorithm=spec, predicted=p.executor_makespan,
                                 scheduled=p.makespan, measured=t, measured_single=t_base,
                                 predicted_speedup=base[n][1] / p.executor_makespan,
                                 measured_speedup=t_base / t,
                                 devices_used=int(len(np.unique(p.schedule.device))),
                                 cost_model=cm_note))
                bar.update()
    bar.close()
    df = pd.DataFrame(rows)
    df["error"] = df.predicted / df.measured - 1
    return df


def run_cluster(model_name="resnet50", batch=8, algorithms=DEFAULT_ALGORITHMS, *, steps=10,
                warmup=3, profile=True, progress=True):
    """:func:`experiments.real_cluster.run` with ``single`` first; adds speed-ups and errors."""
    from . import real_cluster

    specs = ("single",) + tuple(s for s in algorithms if s != "single")
    df = real_cluster.run([model_name], specs, batch=batch, steps=steps, warmup=warmup,
                          profile=profile, progress=progress)
    ok = df[df.status == "ok"].copy()
    single = ok[ok.algorithm == "single"].iloc[0]
    ok["predicted_speedup"] = single.predicted / ok.predicted
    ok["measured_speedup"] = single.measured / ok.measured
    ok["error"] = ok.predicted / ok.measured - 1
    return ok


def run_fig4(models=("inception_v3", "resnet50"), algorithms=DEFAULT_ALGORITHMS, *, batch=None,
             hosts=2, gpus_per_host=4, inter_link="10gbe", progress=True):
    """Every algorithm on each model on 2 x 4 P100s, contention-free and with one NIC per host."""
    import costmodel
    from tqdm.auto import tqdm

    from .fig4 import cross_host_bytes

    cm = costmodel.default_cost_model(gpu="p100", links={"cross_host:*": inter_link})
    clusters = {"free": common.gpu_cluster(gpus_per_host, cm, hosts=hosts, topology=None),
                "nic": common.gpu_cluster(gpus_per_host, cm, hosts=hosts, topology="auto")}
    nic_bw = clusters["nic"].link_resources[0].bandwidth
    rows = []
    bar = tqdm(total=len(models) * 2 * len(algorithms), desc="contention fig4", unit="run",
               disable=not progress, file=sys.stderr)
    for model in models:
        b = int(batch or PAPER_BATCH[model])
        bar.set_description(f"contention fig4 {model}: build + read")
        mg = common.load_model(model, b, cm, devices=clusters["nic"].names)
        for spec in algorithms:
            row = dict(model=model, batch=b, strategy=spec)
            for kind, cluster in clusters.items():
                bar.set_description(f"contention fig4 {model}: {spec} ({kind})")
                r = common.run_strategy(mg.graph, cluster, spec, extra=cross_host_bytes)
                row[f"step_{kind}"] = r["step_seconds"]
                row[f"cross_host_MB_{kind}"] = r.get("cross_host_bytes", np.nan) / 1e6
                bar.update()
            rows.append(row)
    bar.close()
    df = pd.DataFrame(rows)
    df["change"] = df.step_nic / df.step_free - 1
    # What the free schedule's cross-host bytes would take through one NIC, at least.
    df["nic_floor_free"] = df.cross_host_MB_free * 1e6 / nic_bw / hosts
    for kind in ("free", "nic"):
        df[f"rank_{kind}"] = df.groupby("model")[f"step_{kind}"].rank(method="min").astype(int)
    return df


def plot(local, cluster, fig4, path):
    """(a) predicted vs measured speed-up, local devices and the 2-worker cluster;
    (b) Fig. 4 step times without and with NIC contention."""
    plt = common.matplotlib_agg()
    measured = any(d is not None and len(d) for d in (local, cluster))
    simulated = fig4 is not None and len(fig4)
    # Only the panels that have something to show (--parts picks the parts).
    panels = [p for p, on in (("speedup", measured), ("fig4", simulated)) if on] or ["speedup"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    ax = axes.get("speedup")
    if ax is None:
        ax = fig.add_subplot(1, 1, 1)
        ax.set_visible(False)
    hi = 1.2
    styles = {("shared", 2): ("o", "tab:blue"), ("shared", 4): ("s", "tab:blue"),
              ("own", 2): ("o", "tab:red"), ("own", 4): ("s", "tab:red")}
    if local is not None and len(local):
        for (cores, n), g in local.groupby(["cores", "devices"]):
            marker, color = styles.get((cores, n), ("^", "grey"))
            what = "sharing this process's cores" if cores == "shared" else "cores of their own (old)"
            ax.scatter(g.measured_speedup, g.predicted_speedup, marker=marker, color=color,
                       label=f"{n} CPU devices, {what}", alpha=0.8)
            hi = max(hi, g.predicted_speedup.max(), g.measured_speedup.max())
    if cluster is not None and len(cluster):
        ax.scatter(cluster.measured_speedup, cluster.predicted_speedup, marker="D", color="tab:green",
                   label="2-worker local_cluster")
        hi = max(hi, cluster.predicted_speedup.max(), cluster.measured_speedup.max())
    ax.plot([0, hi * 1.05], [0, hi * 1.05], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("measured speed-up over one device")
    ax.set_ylabel("predicted speed-up over one device")
    ax.set_title("Speed-up, every algorithm (one run; machine shared)", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes.get("fig4")
    if ax is not None:
        x_labels = [f"{r.model}\n{label(r.strategy)}" for r in fig4.itertuples()]
        xs = np.arange(len(fig4))
        ax.bar(xs - 0.2, fig4.step_free * 1e3, 0.4, label="contention-free links", color="tab:grey")
        ax.bar(xs + 0.2, fig4.step_nic * 1e3, 0.4, label="one shared NIC per host", color="tab:orange")
        ax.set_xticks(xs, x_labels, rotation=90, fontsize=7)
        ax.set_ylabel("predicted step (ms)")
        ax.legend(fontsize=8)
        ax.set_title("Fig. 4 setting: 2 hosts x 4 P100, 10 GbE", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--model", default="resnet50", choices=common.MODELS,
                        help="model of the local and cluster parts (default resnet50)")
    parser.add_argument("--batch", type=int, default=None, help="default 8 (2 with --quick)")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4],
                        help="local CPU device counts (default 2 4)")
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="default: the experiments' six (fddps, heft with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 3 quick)")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 (1 quick)")
    parser.add_argument("--profile", action="store_true",
                        help="local part: fit op times on this machine first")
    parser.add_argument("--no-cluster-profile", action="store_true",
                        help="cluster part: analytic one-core preset instead of profiling")
    parser.add_argument("--fig4-models", nargs="+", default=None, choices=common.MODELS,
                        help="default inception_v3 resnet50 (resnet50 with --quick)")
    parser.add_argument("--fig4-batch", type=int, default=None, help="default: the paper's")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(common.RESULTS / "contention.csv"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    batch = args.batch or (2 if args.quick else 8)
    algorithms = args.algorithms or (["fddps", "heft"] if args.quick else list(DEFAULT_ALGORITHMS))
    steps = args.steps or (3 if args.quick else 10)
    warmup = args.warmup or (1 if args.quick else 3)
    fig4_models = args.fig4_models or (["resnet50"] if args.quick else ["inception_v3", "resnet50"])
    fig4_batch = args.fig4_batch or (8 if args.quick else None)
    progress = not args.no_progress
    out = common.ensure_parent(args.out)
    load0, t0 = os.getloadavg(), time.perf_counter()
    print(f"machine: {len(os.sched_getaffinity(0))} usable cores; load average at start "
          f"{load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f} (1/5/15 min): other sessions share it")
    local = cluster = fig4 = None
    if "local" in args.parts:
        local = run_local(args.model, batch, args.devices, algorithms, steps=steps, warmup=warmup,
                          profile_steps=3 if args.profile else 0, progress=progress)
        local.to_csv(out.with_name(out.stem + "_local.csv"), index=False)
        print(f"\nA. {args.model}, batch {batch}, on CPU devices of one process "
              f"(cost model: {local.cost_model.iloc[0]}); median of {steps} steps after {warmup}; "
              f"predicted = the order TensorFlow picks itself; speed-ups over 'single' in this run.")
        cols = ["devices", "cores", "algorithm", "devices_used", "predicted", "measured", "error",
                "predicted_speedup", "measured_speedup"]
        show = local[cols].copy()
        for c in ("predicted", "measured"):
            show[c] = (show[c] * 1e3).map(lambda v: f"{v:.4g}")
        show["error"] = show["error"].map(lambda v: f"{v:+.0%}")
        for c in ("predicted_speedup", "measured_speedup"):
            show[c] = show[c].map(lambda v: f"{v:.2f}x")
        print("(times in ms; cores: shared = fddps's default model, own = every device with all "
              "cores, the model before)")
        print(show.to_string(index=False))
    if "cluster" in args.parts:
        cluster = run_cluster(args.model, batch, algorithms, steps=steps, warmup=warmup,
                              profile=not args.no_cluster_profile, progress=progress)
        cluster.to_csv(out.with_name(out.stem + "_cluster.csv"), index=False)
        print(f"\nB. {args.model}, batch {batch}, on the 2-worker local_cluster (one core each, "
              f"gRPC; cost model: {cluster.cost_model.iloc[0]}); predicted = the scheduled order.")
        show = cluster[["algorithm", "predicted", "measured", "error", "predicted_speedup",
                        "measured_speedup"]].copy()
        for c in ("predicted", "measured"):
            show[c] = (show[c] * 1e3).map(lambda v: f"{v:.4g}")
        show["error"] = show["error"].map(lambda v: f"{v:+.0%}")
        print(show.to_string(index=False))
    if "fig4" in args.parts:
        fig4 = run_fig4(fig4_models, algorithms, batch=fig4_batch, progress=progress)
        fig4.to_csv(out.with_name(out.stem + "_fig4.csv"), index=False)
        print("\nC. Fig. 4 setting: 2 hosts x 4 simulated P100s (analytic), PCIe 3 in a host, 10 GbE "
              "(1.1 GB/s) between hosts; step = simulator's replay of each schedule; free = every "
              "device pair with its own link, nic = one network interface per host shared by its "
              "transfers; nic_floor_free = the free schedule's cross-host bytes through one NIC.")
        show = fig4.copy()
        for c in ("step_free", "step_nic", "nic_floor_free"):
            show[c] = (show[c] * 1e3).map(lambda v: f"{v:.4g}")
        show["change"] = show["change"].map(lambda v: f"{v:+.0%}")
        show["strategy"] = show["strategy"].map(label)
        print(show[["model", "batch", "strategy", "step_free", "step_nic", "change", "rank_free",
                    "rank_nic", "cross_host_MB_free", "cross_host_MB_nic", "nic_floor_free"]]
              .to_string(index=False))
    png = out.with_suffix(".png")
    plot(local, cluster, fig4, png)
    load1 = os.getloadavg()
    print(f"\nload average at end {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}; "
          f"{time.perf_counter() - t0:.0f} s in all; results: {out.parent}/{out.stem}_*.csv, {png}")
    return dict(local=local, cluster=cluster, fig4=fig4)


if __name__ == "__main__":
    main()
