"""The paper's Figure 4: step time on two hosts of four GPUs each, a slower link between hosts.

The paper ran two Docker containers of four P100s each on one server and
counted the traffic between containers; it reports speedups over FastT (on
PNASNet-Mobile: MP-DPS +4.9 %, FD-DPS +16.0 %). Here: ``--hosts`` simulated
hosts of ``--gpus-per-host`` P100s (devices
``/job:worker/replica:0/task:H/device:GPU:i``), PCIe 3 inside a host and the
``--inter-link`` preset between hosts (default 10 GbE: 1.1 GB/s, 50 us;
``costmodel.presets.links`` lists the others), each host sending and receiving
through one network interface of that bandwidth that its transfers share
(``--no-nic``: every pair of devices with a link of its own, as before fddps
modelled contention; :mod:`experiments.contention` compares the two). For each model at the paper's
batch size, on CIFAR-10-sized inputs: every algorithm schedules the model's
OpGraph (read once) on that cluster; data parallelism is estimated with a ring
all-reduce whose pace is the slow inter-host link
(:mod:`experiments.data_parallel`). Reported: step time, speedup over FastT
(the paper's measure), speedup over one GPU, and the bytes each schedule moves
between hosts.

Writes ``experiments/results/fig4.csv`` and ``fig4.png``.

Usage::

    python -m experiments.fig4                                # all six models (~6 min here)
    python -m experiments.fig4 --quick                        # VGG-16, Inception-V3, ResNet-50
    python -m experiments.fig4 --models resnet50 --hosts 2 --gpus-per-host 1 --batch 8
    python -m experiments.fig4 --inter-link 100gbe
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from . import common
from .common import (DEFAULT_ALGORITHMS, MODELS, PAPER_BATCH, fmt_ms, fmt_pct, label, speedup)

QUICK_MODELS = ("vgg16", "inception_v3", "resnet50")

#: What the paper's text reports of Figure 4 (speedup over FastT, PNASNet-Mobile, 2 x 4 GPUs).
PAPER_FIG4 = {("pnasnet_mobile", "mpdps"): 0.049, ("pnasnet_mobile", "fddps"): 0.160}


def cross_host_bytes(schedule) -> dict:
    """Bytes and tensors a schedule moves between devices of different hosts."""
    g, c = schedule.graph, schedule.cluster
    host = np.asarray([d.host for d in c.devices])
    d = schedule.device
    cross = host[d[g.src]] != host[d[g.dst]]
    return dict(cross_host_bytes=float(g.bytes[cross].sum()), cross_host_tensors=int(cross.sum()))


def run(models, hosts=2, gpus_per_host=4, algorithms=DEFAULT_ALGORITHMS, *, inter_link="10gbe",
        dataset="cifar10", batch=None, memory=None, data_parallel=True, validate=True,
        progress=True, topology="auto"):
    """Every strategy on every model on ``hosts x gpus_per_host`` GPUs; one row per (model, strategy)."""
    import costmodel
    from tqdm.auto import tqdm

    cm = costmodel.default_cost_model(gpu="p100", links={"cross_host:*": inter_link})
    cluster = common.gpu_cluster(gpus_per_host, cm, hosts=hosts, memory=memory, topology=topology)
    one = common.gpu_cluster(1, cm, memory=memory)
    rows = []
    bar = tqdm(total=len(models) * (len(algorithms) + 1 + int(data_parallel)), desc="fig4",
               unit="run", disable=not progress, file=sys.stderr)
    for model in models:
        b = int(batch or PAPER_BATCH[model])
        bar.set_description(f"fig4 {model}: build + read")
        mg = common.load_model(model, b, cm, dataset=dataset, devices=cluster.names)
        base = dict(model=model, batch=b, ops=mg.ops, hosts=hosts, gpus_per_host=gpus_per_host,
                    inter_link=inter_link)
        rows.append({**base, **common.run_strategy(mg.graph, one, "single", validate=validate)})
        bar.update()
        specs = common.with_split_variant(algorithms, mg.graph)
        bar.total += len(specs) - len(algorithms)
        for spec in specs:
            bar.set_description(f"fig4 {model}: {spec}")
            rows.append({**base, **common.run_strategy(mg.graph, cluster, spec, validate=validate,
                                                       extra=cross_host_bytes)})
            bar.update()
        if data_parallel:
            bar.set_description(f"fig4 {model}: data parallel")
            rows.append({**base, **common.data_parallel_row(mg, cluster, cm, dataset=dataset)})
            bar.update()
    bar.close()
    return pd.DataFrame(rows), cluster


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """Per model and strategy: step time, speedups over FastT and one GPU, cross-host MB."""
    out = []
    for model, g in results.groupby("model", sort=False):
        t = dict(zip(g.strategy, g.step_seconds.where(g.status == "ok")))
        fastt, single = t.get("fastt", np.nan), t.get("single", np.nan)
        for r in g.itertuples():
            paper = PAPER_FIG4.get((model, r.strategy if r.strategy != "fddps:improve=False" else "fddps"))
            out.append(dict(model=model, strategy=label(r.strategy),
                            step_ms=fmt_ms(r.step_seconds) if r.status == "ok" else r.status,
                            vs_FastT=fmt_pct(speedup(fastt, t.get(r.strategy))),
                            paper_vs_FastT=fmt_pct(paper) if paper is not None else "",
                            x_single=(f"{single / t[r.strategy]:.2f}x"
                                      if np.isfinite(single / t.get(r.strategy, np.nan)) else "-"),
                            cross_host_MB=(f"{r.cross_host_bytes / 1e6:.4g}"
                                           if np.isfinite(getattr(r, "cross_host_bytes", np.nan)) else ""),
                            search_s=(f"{r.search_seconds:.2f}" if np.isfinite(r.search_seconds) else "")))
    return pd.DataFrame(out)


def plot(results: pd.DataFrame, path):
    """Speedup over FastT per model and placement algorithm (bars), the paper's two figures (x).

    Data parallelism, far slower here, is written under each model instead of drawn.
    """
    plt = common.matplotlib_agg()
    models = list(dict.fromkeys(results.model))
    strategies = [s for s in dict.fromkeys(results.strategy)
                  if s not in ("single", "fastt", "data_parallel")]
    fig, ax = plt.subplots(figsize=(max(8.0, 1.6 * len(models) + 2), 4.4))
    width = 0.8 / max(1, len(strategies))
    cmap = plt.get_cmap("tab10")

    def step(model, s):
        g = results[(results.model == model) & (results.strategy == s) & (results.status == "ok")]
        return float(g.step_seconds.iloc[0]) if len(g) else np.nan

    for j, s in enumerate(strategies):
        xs = np.arange(len(models)) + (j - (len(strategies) - 1) / 2) * width
        ys = [100 * speedup(step(m, "fastt"), step(m, s)) for m in models]
        ax.bar(xs, np.nan_to_num(ys), width, label=label(s), color=cmap(j))
        for x, model in zip(xs, models):
            key = (model, "fddps" if s == "fddps:improve=False" else s)
            if key in PAPER_FIG4 and s != "fddps":
                ax.scatter([x], [100 * PAPER_FIG4[key]], marker="x", color="black", zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.scatter([], [], marker="x", color="black", label="paper (PNASNet only)")
    names = []
    for m in models:
        dp = step(m, "data_parallel")
        names.append(f"{m}\nDP: {step(m, 'fastt') / dp:.2f}x FastT" if np.isfinite(dp) else m)
    ax.set_xticks(np.arange(len(models)), names, fontsize=8)
    ax.set_ylabel("speedup over FastT (%)")
    r0 = results.iloc[0]
    ax.set_title(f"Figure 4: {r0.hosts} hosts x {r0.gpus_per_host} simulated P100s, "
                 f"{r0.inter_link} between hosts", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=None, choices=MODELS)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--gpus-per-host", type=int, default=4)
    parser.add_argument("--inter-link", default="10gbe",
                        help="link preset between hosts (10gbe, 100gbe, grpc-loopback, ...)")
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS))
    parser.add_argument("--batch", type=int, help="batch for every model (default: the paper's)")
    parser.add_argument("--dataset", default="cifar10", choices=("cifar10", "imagenet"))
    parser.add_argument("--memory-gb", type=float, help="GPU memory in GB (default 16 GiB)")
    parser.add_argument("--no-data-parallel", action="store_true")
    parser.add_argument("--no-nic", action="store_true",
                        help="contention-free links between hosts (no shared network interface)")
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_MODELS)}")
    parser.add_argument("--out", default=str(common.RESULTS / "fig4.csv"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.gpus_per_host < 1:
        parser.error("--hosts and --gpus-per-host must be >= 1")
    import costmodel

    try:
        link = costmodel.presets.links[args.inter_link]
    except KeyError:
        parser.error(f"unknown --inter-link {args.inter_link!r}; presets: "
                     f"{', '.join(sorted(costmodel.presets.links))}")
    models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    t0 = time.perf_counter()
    results, cluster = run(models, args.hosts, args.gpus_per_host, args.algorithms,
                           inter_link=args.inter_link, dataset=args.dataset, batch=args.batch,
                           memory=None if args.memory_gb is None else args.memory_gb * 1e9,
                           data_parallel=not args.no_data_parallel, validate=not args.no_validate,
                           progress=not args.no_progress,
                           topology=None if args.no_nic else "auto")
    wall = time.perf_counter() - t0
    print(f"Figure 4: {args.hosts} hosts x {args.gpus_per_host} simulated P100s; inside a host "
          f"PCIe 3 (12 GB/s, 10 us), between hosts {args.inter_link} ({link.bandwidth / 1e9:.3g} GB/s, "
          f"{link.latency * 1e6:.3g} us"
          f"{', contention-free' if args.no_nic else ', one shared network interface per host'}); "
          f"{args.dataset} inputs; one schedule per cell; {wall:.0f} s in all.")
    print(common.COST_MODEL_NOTE)
    print("Speedup = (FastT - X) / FastT, the paper's measure; x_single = one GPU's time / X; "
          "cross_host_MB = bytes the schedule sends between hosts.")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(summary(results).to_string(index=False))
    out = common.save_csv_and_plot(results, args.out, plot)
    write_page(out, results, wall)
    return results


def write_page(out, results, seconds=None, command=None):
    """The generated page ``fig4.md``: the summary table as printed."""
    return common.write_results_page(
        out, "Figure 4 on the current presets",
        "Two hosts of four simulated P100s (PCIe 3 inside a host; one shared network interface "
        "per host unless --no-nic). Speedup = (FastT - X) / FastT, the paper's measure; "
        "x_single = one GPU's time / X; cross_host_MB = bytes the schedule sends between hosts. "
        + common.COST_MODEL_NOTE, summary(results), seconds=seconds, command=command)


if __name__ == "__main__":
    main()
