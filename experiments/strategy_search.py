"""Strategy searches in simulation: one device, data parallelism, FD-DPS's whole-op
placement, FD-DPS over the strategy space, FlexFlow's MCMC, the vertex-elimination DP
(PaSE) and ``auto``, on the six ``slim_models`` networks at the paper's batch sizes on
2, 4 and 8 simulated P100s (issue 15's benchmark).

Every row is a :class:`fddps.strategy.Strategy` expanded and simulated with a
first-in-first-out executor per device (:func:`fddps.strategy.expand`); its step is
a ratio to one device in the same run. ``search_s`` is the wall-clock seconds the
row's search took (FD-DPS: scheduling the whole-op graph; FD-DPS over the strategy
space (``fddps_space``, :mod:`fddps.search.fddps_space`): that, choosing the critical
ops' configurations and scheduling their parts; the DP: costing and
elimination; MCMC and auto: their budgets). FlexFlow's MCMC starts from one device,
data parallelism and FD-DPS's placement, with ``--budget`` seconds and
``--proposals`` proposals; ``auto`` (:class:`fddps.search.auto.AutoSearch`) runs the
baselines, FD-DPS over the strategy space, Tofu, the DP and MCMC (from all of them)
in ``--budget`` seconds on its own (it does not reuse the other rows' results; its
``skipped`` and ``cut`` columns name the searches its budget left out or
stopped early). ``tofu`` is Tofu's recursive partition
(:class:`fddps.search.tofu.TofuSearch`; no row when no plan fits). With
``--hosts H`` each device count is split evenly over H hosts joined by 10 GbE,
each sending through one network interface its transfers share (the cluster of
:mod:`experiments.fig4`), and every row gives the MB its step moves between
hosts (``cross_host_mb``). The DP's row
also gives its additive cost (``additive_ms``: blind to overlap). ``delta_ms`` and
``full_ms`` are MCMC's mean seconds per proposal by delta and by full simulation
(every 25th proposal is also simulated in full). The PNG shows speed-ups and, for
``auto``'s strategy, how the FLOPs are split (whole, by sample, by parameter, other);
with one device count, every strategy's split side by side (and the MB between hosts).

Wall-clock times are of a machine shared with other jobs: compare them as ratios.

Run::

    python -m experiments.strategy_search                         # six networks, 2/4/8 GPUs
    python -m experiments.strategy_search --quick                 # a smoke test (~1-2 min)
    python -m experiments.strategy_search --models resnet50 --devices 4 --budget 60
    python -m experiments.strategy_search --delta 10 --devices 4  # delta vs full, six networks
    python -m experiments.strategy_search --models vgg16 --devices 8 --hosts 2 --budget 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from experiments.common import (COST_MODEL_NOTE, MODELS, PAPER_BATCH, RESULTS, build_model, gpu_cluster,
                                matplotlib_agg, save_csv_and_plot, tf_quiet)

SHAPES = ("whole", "sample", "parameter", "other")


def strategy_shape(step, strategy) -> dict:
    """Fraction of the step's FLOPs whole, split by sample, by parameter (incl. both), other."""
    from fddps.strategy.strategy import PARAMETER_DIMS

    flops = dict.fromkeys(SHAPES, 0.0)
    for name, op in step.ops.items():
        dims = set(strategy.config(name).split)
        if not dims:
            kind = "whole"
        elif PARAMETER_DIMS.get(op.op_type) in dims:
            kind = "parameter"
        elif dims == {"n"}:
            kind = "sample"
        else:
            kind = "other"
        flops[kind] += op.flops
    total = sum(flops.values()) or 1.0
    return {f"flops_{k}": v / total for k, v in flops.items()}


def _plot(df, png):
    plt = matplotlib_agg()
    models = list(dict.fromkeys(df["model"]))
    # One colour and marker per strategy in every panel (a search skipped on one
    # model must not shift the others' colours), each drawn a little aside so
    # that equal speed-ups stay visible.
    names = [n for n in dict.fromkeys(df["strategy"]) if n != "one device"]
    style = {n: (f"C{k}", "osD^vP*X"[k % 8], (k - (len(names) - 1) / 2) * 0.06)
             for k, n in enumerate(names)}
    fig, axes = plt.subplots(2, len(models), figsize=(3.3 * len(models), 6.2), squeeze=False)
    for j, model in enumerate(models):
        sub = df[df["model"] == model]
        ax = axes[0][j]
        for name, rows in sub.groupby("strategy", sort=False):
            if name == "one device":
                continue
            color, marker, dx = style[name]
            ax.plot(rows["devices"] * (1 + dx), rows["speedup"], marker=marker, color=color,
                    label=name, alpha=0.85)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{model} (batch {sub['batch'].iloc[0]})", fontsize=9)
        ax.set_xticks(sorted(set(sub["devices"])))
        ax.set_xlabel("P100s (simulated)" if sub["hosts"].iloc[0] == 1
                      else f"P100s on {sub['hosts'].iloc[0]} hosts (simulated)")
        ax = axes[1][j]
        if sub["devices"].nunique() == 1:  # one cluster: every strategy's shape side by side
            shown = sub[sub["strategy"] != "one device"]
            ticks = list(shown["strategy"])
            ax.set_xlabel(f"{sub['devices'].iloc[0]} P100s: each strategy")
        else:  # auto's strategy per device count
            shown = sub[sub["strategy"] == "auto"]
            ticks = list(shown["devices"].astype(str))
            ax.set_xlabel("P100s: auto's strategy")
        if "cross_host_mb" in shown:  # several hosts: what each step sends between them
            ticks = [f"{t}\n{mb:.0f} MB" for t, mb in zip(ticks, shown["cross_host_mb"])]
            ax.set_xlabel(ax.get_xlabel() + "\n(MB between hosts)")
        bottom = np.zeros(len(shown))
        for kind in SHAPES:
            vals = shown[f"flops_{kind}"].to_numpy()
            ax.bar(range(len(shown)), vals, bottom=bottom, label=kind)
            bottom += vals
        ax.set_xticks(range(len(shown)), ticks, fontsize=7,
                      rotation=0 if len(ticks) < 4 else 60, ha="center" if len(ticks) < 4 else "right",
                      rotation_mode="anchor")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("speed-up over one device")
    axes[1][0].set_ylabel("share of FLOPs")
    handles = [plt.Line2D([], [], color=c, marker=m, label=n) for n, (c, m, _) in style.items()]
    axes[0][-1].legend(handles=handles, fontsize=7)
    axes[1][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


SEARCHES = ("fddps_space", "pase", "tofu", "flexflow", "auto")


def run(models, device_counts, batches, budget, proposals, seed=0, dataset="cifar10", hosts=1,
        searches=SEARCHES):
    """One row per (model, devices, strategy); ``hosts > 1`` splits each count's devices evenly
    over that many hosts (:func:`experiments.common.gpu_cluster`, as :mod:`experiments.fig4`);
    ``searches``: which of :data:`SEARCHES` get rows beside the baselines."""
    tf_quiet()
    from costmodel import default_cost_model
    from fddps.errors import InfeasibleError
    from fddps.search import SearchError, StrategyEvaluator, get_search
    from fddps.search.space import baseline_strategies
    from fddps.tf.strategy_graph import step_graph

    cm = default_cost_model("p100")
    rows = []
    for model in models:
        batch = batches.get(model, 32)
        t0 = time.perf_counter()
        m = build_model(model, batch, dataset=dataset)
        step = step_graph(m.graph_def, [m.train_op.name, m.loss.op.name])
        base = dict(model=model, batch=batch, ops=len(step))
        one_cluster = gpu_cluster(1, cm)
        single = StrategyEvaluator(step, one_cluster, cm).full(
            baseline_strategies(step, one_cluster, cm)["one device"])
        for k in device_counts:
            cluster = gpu_cluster(k // hosts, cm, hosts=hosts)
            ev = StrategyEvaluator(step, cluster, cm)

            def row(name, strategy, makespan, peak, fits, seconds, **extra):
                if hosts > 1:
                    extra["cross_host_mb"] = cross_host_mb(step, strategy, cluster, cm)
                r = dict(base, devices=k, hosts=hosts, strategy=name, step_ms=makespan * 1e3,
                         speedup=single.makespan / makespan, fits=bool(fits),
                         peak_mb=float(np.max(peak)) / 1e6, search_s=seconds,
                         ops_split=sum(c.num_parts > 1 for c in strategy.configs.values()),
                         **strategy_shape(step, strategy))
                r.update(extra)
                rows.append(r)
                print(f"  {model} x{k} {name:<14} {makespan * 1e3:9.3f} ms  "
                      f"{single.makespan / makespan:5.2f}x  {seconds:7.1f} s", flush=True)

            t = time.perf_counter()
            starts = baseline_strategies(step, cluster, cm)
            t_fddps = time.perf_counter() - t  # FD-DPS's schedule dominates
            for name, strategy in starts.items():
                score = ev.full(strategy)
                row(name, strategy, score.makespan, score.peak, score.fits,
                    t_fddps if name == "fddps" else score.seconds)
            if "fddps_space" in searches:
                fs = get_search("fddps_space").fit(step, cluster, cm)
                row("fddps_space", fs.strategy, fs.makespan, fs.peak, fs.fits, fs.seconds,
                    critical_ops=fs.info["critical_ops"], splits_chosen=fs.info["splits_chosen"])
            if "pase" in searches:
                try:
                    dp = get_search("pase").fit(step, cluster, cm)
                    row("pase", dp.strategy, dp.makespan, dp.peak, dp.fits, dp.seconds,
                        additive_ms=dp.info["additive_cost"] * 1e3)
                except SearchError as why:
                    print(f"  {model} x{k} pase skipped: {why}")
            if "tofu" in searches:
                try:
                    tofu = get_search("tofu").fit(step, cluster, cm)
                    row("tofu", tofu.strategy, tofu.makespan, tofu.peak, tofu.fits, tofu.seconds)
                except InfeasibleError as why:
                    print(f"  {model} x{k} tofu skipped: {why}")
            if "flexflow" in searches:
                mc = get_search("flexflow", time_budget=budget, max_proposals=proposals,
                                seed=seed).fit(step, cluster, cm, starts=starts)
                row("flexflow", mc.strategy, mc.makespan, mc.peak, mc.fits, mc.seconds,
                    proposals=mc.info["proposals"], delta_ms=mc.info["delta_seconds"] * 1e3,
                    full_ms=mc.info["full_seconds"] * 1e3)
            if "auto" in searches:
                auto = get_search("auto", time_budget=budget, max_proposals=proposals,
                                  seed=seed).fit(step, cluster, cm)
                row("auto", auto.strategy, auto.makespan, auto.peak, auto.fits, auto.seconds,
                    winner=auto.search, proposals=auto.info["proposals"],
                    skipped=",".join(auto.info["skipped"]), cut=",".join(auto.info["cut"]))
        print(f"{model}: {len(step)} step ops, {time.perf_counter() - t0:.0f} s", flush=True)
    return pd.DataFrame(rows)


def cross_host_mb(step, strategy, cluster, cost_model) -> float:
    """MB a strategy's step moves between devices of different hosts
    (:func:`experiments.fig4.cross_host_bytes` of its expansion)."""
    from types import SimpleNamespace

    from experiments.fig4 import cross_host_bytes
    from fddps.strategy import expand

    ex = expand(step, strategy, cluster, cost_model)
    device = np.asarray([cluster.index[ex.placement[n]] for n in ex.graph.names])
    return cross_host_bytes(SimpleNamespace(graph=ex.graph, cluster=cluster,
                                            device=device))["cross_host_bytes"] / 1e6


def delta_vs_full(models, devices, batches, proposals, seed=0, dataset="cifar10"):
    """Seconds per proposal by delta and by full simulation, from data parallelism.

    Each proposal changes one random op (or tied group) to a random
    configuration; both simulations must give the same step (``equal``).
    """
    tf_quiet()
    from costmodel import default_cost_model
    from fddps.search import StrategyEvaluator, decision_units, unit_splits
    from fddps.search.space import worth_deciding
    from fddps.strategy import OpConfig, data_parallel
    from fddps.tf.strategy_graph import step_graph

    cm = default_cost_model("p100")
    rows = []
    for model in models:
        m = build_model(model, batches[model], dataset=dataset)
        step = step_graph(m.graph_def, [m.train_op.name, m.loss.op.name])
        cluster = gpu_cluster(devices, cm)
        names = list(cluster.names)
        ev = StrategyEvaluator(step, cluster, cm)
        start = ev.reset(data_parallel(step, names))
        units = [u for u in decision_units(step) if any(worth_deciding(step.ops[n]) for n in u)]
        rng = np.random.default_rng(seed)
        delta, full, equal = [], [], True
        for _ in range(proposals):
            unit = units[int(rng.integers(len(units)))]
            splits = unit_splits(step, unit, devices)
            split = splits[int(rng.integers(len(splits)))]
            n = int(np.prod(list(split.values()))) if split else 1
            cfg = OpConfig(split, [names[j] for j in rng.permutation(devices)[:n]])
            proposal = ev.propose({op: cfg for op in unit})
            reference = ev.full(ev.strategy(proposal.configs))
            equal &= proposal.makespan == reference.makespan
            delta.append(proposal.seconds)
            full.append(reference.seconds)
        rows.append(dict(model=model, batch=batches[model], devices=devices, ops=len(step),
                         proposals=proposals, start_ms=start.makespan * 1e3,
                         delta_ms=np.mean(delta) * 1e3, full_ms=np.mean(full) * 1e3,
                         speedup=np.mean(full) / np.mean(delta), equal=bool(equal)))
        print(f"  {model}: delta {rows[-1]['delta_ms']:.0f} ms, full {rows[-1]['full_ms']:.0f} ms "
              f"per proposal ({rows[-1]['speedup']:.2f}x), equal: {equal}", flush=True)
    return pd.DataFrame(rows)


def _plot_delta(df, png):
    plt = matplotlib_agg()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = np.arange(len(df))
    ax.bar(x - 0.2, df["full_ms"], 0.4, label="full simulation")
    ax.bar(x + 0.2, df["delta_ms"], 0.4, label="delta simulation")
    ax.set_xticks(x, [f"{m}\n{s:.1f}x" for m, s in zip(df["model"], df["speedup"])], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("ms per proposal")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--devices", default="2,4,8")
    p.add_argument("--batch", type=int, default=None,
                   help="one batch for every model (default: the paper's, PAPER_BATCH)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds for MCMC and for auto")
    p.add_argument("--proposals", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hosts", type=int, default=1,
                   help="split each --devices count evenly over this many hosts, joined by 10 GbE "
                        "through one shared network interface per host (as experiments.fig4); "
                        "rows then give the MB crossing between hosts")
    p.add_argument("--searches", default=",".join(SEARCHES),
                   help="the searches to run beside the baselines (default all: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: vgg16 at batch 8 on 2 GPUs, 10 s budgets, 40 proposals")
    p.add_argument("--delta", type=int, default=0, metavar="N",
                   help="instead: delta vs full simulation seconds over N random proposals "
                        "per model on the largest --devices count")
    p.add_argument("--out", default=str(RESULTS / "strategy_search.csv"))
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    counts = [int(k) for k in args.devices.split(",")]
    if args.hosts < 1 or any(k % args.hosts for k in counts):
        p.error(f"--hosts {args.hosts} must be a positive divisor of every --devices count "
                f"({args.devices})")
    batches = {m: args.batch or PAPER_BATCH[m] for m in models}
    budget, proposals = args.budget, args.proposals
    if args.quick:
        models, counts, batches, budget, proposals = ["vgg16"], [2], {"vgg16": 8}, 10.0, 40
    if args.delta:
        df = delta_vs_full(models, max(counts), batches, args.delta, args.seed)
        print(f"Delta vs full simulation per proposal (from data parallelism, one random op "
              f"changed each), {max(counts)} simulated P100s. {COST_MODEL_NOTE}")
        print(df.round(3).to_string(index=False))
        save_csv_and_plot(df, str(args.out).replace(".csv", "_delta.csv"), _plot_delta)
        return df
    searches = [x for x in args.searches.split(",") if x]
    unknown = sorted(set(searches) - set(SEARCHES))
    if unknown:
        p.error(f"unknown --searches {unknown[0]!r}; choose from {', '.join(SEARCHES)}")
    df = run(models, counts, batches, budget, proposals, args.seed, hosts=args.hosts,
             searches=searches)
    hosts = f" on {args.hosts} hosts (10 GbE, one shared NIC each)" if args.hosts > 1 else ""
    print(f"Strategy searches in simulation, CIFAR-10 size{hosts}. {COST_MODEL_NOTE} "
          f"MCMC and auto budgets: {budget:g} s, {proposals} proposals, seed {args.seed}.")
    cols = [c for c in ("model", "batch", "devices", "strategy", "step_ms", "speedup", "fits",
                        "peak_mb", "search_s", "cross_host_mb", "ops_split", "critical_ops",
                        "additive_ms", "proposals", "delta_ms", "full_ms", "winner", "skipped",
                        "cut") if c in df.columns]
    print(df[cols].round(3).to_string(index=False))
    save_csv_and_plot(df, args.out, _plot)
    return df


if __name__ == "__main__":
    main()
