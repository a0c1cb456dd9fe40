"""The paper's Figure 5: how long each algorithm takes to decide, per model and against graph size.

Part 1, per model (8 simulated P100s, the paper's setting for Figure 5): each
model at the paper's batch size is built and read once; each algorithm's
search time is the wall time of :func:`fddps.schedule` on that OpGraph (median
of ``--repeats`` runs, one process). Beside it: the time to build the
TensorFlow graph, to read it (:func:`fddps.tf.read_graph_def`), and FD-DPS's
:func:`fddps.place` end to end (reading the GraphDef, scheduling, writing the
placed GraphDef), which is what a user waits for.

Part 2, against graph size: :func:`experiments.search_time.measure` on
synthetic training-shaped graphs (:func:`fddps.generators.training_graph`) of
``--sizes`` ops on 8 devices, each run in a fresh process; the growth exponent
is the slope of log(time) against log(ops + edges) (1 = linear).

The paper's text gives differences of search times (its Figure 5 is an image):
PNASNet-Mobile FastT - FD-DPS = 185.8 s; NASNet-A Large D-DPS(-F) - MP-DPS =
95.5 s, FD-DPS - MP-DPS = 117.3 s, FD-DPS - D-DPS(-F) = 21.8 s. They are
printed beside ours.

Writes ``experiments/results/fig5_models.csv``, ``fig5_sizes.csv`` and ``fig5.png``.

Usage::

    python -m experiments.fig5                         # six models + sizes 1k, 10k, 50k (~10 min)
    python -m experiments.fig5 --quick                 # three small models, sizes 1k, 10k
    python -m experiments.fig5 --models resnet50 --devices 2 --sizes 500 --batch 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import pandas as pd

import fddps
from fddps.algorithms import parse_algorithm

from . import common, search_time
from .common import DEFAULT_ALGORITHMS, MODELS, PAPER_BATCH, label

QUICK_MODELS = ("vgg16", "inception_v3", "resnet50")

#: Differences of search times the paper's text states: (model, slower, faster) -> seconds.
PAPER_FIG5 = {("pnasnet_mobile", "fastt", "fddps"): 185.8,
              ("nasnet_large", "fddps:split=False", "mpdps"): 95.5,
              ("nasnet_large", "fddps", "mpdps"): 117.3,
              ("nasnet_large", "fddps", "fddps:split=False"): 21.8}


def search_seconds(graph, cluster, spec, repeats=1):
    """Median wall time of ``repeats`` runs of ``spec`` on ``graph`` (NaN if it does not fit)."""
    name, options = parse_algorithm(spec)
    times, makespan = [], np.nan
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            s = fddps.schedule(graph, cluster, algorithm=name, **options)
        except fddps.InfeasibleError:
            return np.nan, np.nan, "OOM"
        times.append(time.perf_counter() - t0)
        makespan = s.makespan
    return statistics.median(times), makespan, "ok"


def run_models(models, devices=8, algorithms=DEFAULT_ALGORITHMS, *, batch=None, repeats=1,
               place=True, progress=True):
    """Search time of every algorithm on every model; one row per (model, algorithm)."""
    import costmodel
    from tqdm.auto import tqdm

    cm = costmodel.default_cost_model(gpu="p100")
    names = common.device_names(devices)
    cluster = common.gpu_cluster(devices, cm)
    rows = []
    bar = tqdm(total=len(models) * (len(algorithms) + int(place)), desc="fig5 models", unit="run",
               disable=not progress, file=sys.stderr)
    for model in models:
        b = int(batch or PAPER_BATCH[model])
        bar.set_description(f"fig5 {model}: build + read")
        mg = common.load_model(model, b, cm, keep_graph_def=place, devices=names)
        base = dict(model=model, batch=b, devices=devices, ops=mg.ops, edges=mg.edges,
                    nodes=mg.nodes, build_seconds=mg.build_seconds, read_seconds=mg.read_seconds)
        specs = common.with_split_variant(algorithms, mg.graph)
        bar.total += len(specs) - len(algorithms)
        for spec in specs:
            bar.set_description(f"fig5 {model}: {spec}")
            seconds, makespan, status = search_seconds(mg.graph, cluster, spec, repeats)
            rows.append({**base, "algorithm": spec, "search_seconds": seconds,
                         "step_seconds": makespan, "status": status})
            bar.update()
        if place:
            bar.set_description(f"fig5 {model}: place() end to end")
            t0 = time.perf_counter()
            try:
                p = fddps.place(mg.graph_def, names, cost_model=cm, algorithm="fddps",
                                fetches=list(mg.fetches))
                status, makespan = "ok", p.makespan
            except fddps.InfeasibleError:
                status, makespan = "OOM", np.nan
            rows.append({**base, "algorithm": "place(fddps)", "search_seconds": time.perf_counter() - t0,
                         "step_seconds": makespan, "status": status})
            bar.update()
        del mg
    bar.close()
    return pd.DataFrame(rows)


def run_sizes(sizes, devices=8, algorithms=DEFAULT_ALGORITHMS, *, timeout=600, progress=True):
    """:func:`experiments.search_time.measure` for every size and algorithm (fresh processes)."""
    from tqdm.auto import tqdm

    runs = [(a, n) for n in sizes for a in algorithms]
    rows = []
    for a, n in tqdm(runs, desc="fig5 sizes", unit="run", disable=not progress, file=sys.stderr):
        rows.append({**search_time.measure(a, n, devices, timeout=timeout), "size": n})
    return pd.DataFrame(rows)


def paper_comparison(models_df: pd.DataFrame) -> pd.DataFrame:
    """The paper's stated search-time differences beside ours (same model, same pair).

    Each pair is also given with ``fddps:improve=False`` for ``fddps`` (the
    paper's FD-DPS has no refinement pass). A pair whose algorithms were not
    run gives NaN (D-DPS(-F), ``fddps:split=False``, runs with ``fddps`` when
    the graph carries split candidates).
    """
    t = {(r.model, r.algorithm): r.search_seconds for r in models_df.itertuples()}
    rows = []
    for (model, slow, fast), paper in PAPER_FIG5.items():
        if model not in set(models_df.model):
            continue
        variants = [(slow, fast)]
        alt = tuple("fddps:improve=False" if a == "fddps" else a for a in (slow, fast))
        if alt != (slow, fast):
            variants.append(alt)
        for a, b in variants:
            ta, tb = t.get((model, a)), t.get((model, b))
            rows.append(dict(model=model, pair=f"{label(a)} - {label(b)}", paper_s=paper,
                             ours_s=(ta - tb if ta is not None and tb is not None else np.nan)))
    return pd.DataFrame(rows, columns=["model", "pair", "paper_s", "ours_s"])


def plot(models_df, sizes_df, path):
    """Search time per model and algorithm (bars, log scale) and against graph size (log-log)."""
    plt = common.matplotlib_agg()
    panels = max(1, int(len(models_df) > 0) + int(len(sizes_df) > 0))  # a part not run: no panel
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    ax1, ax2 = axes[0, 0], axes[0, -1]
    cmap = plt.get_cmap("tab10")
    algos = list(dict.fromkeys(models_df.algorithm)) if len(models_df) else []
    colors = {a: cmap(j % 10) for j, a in enumerate(dict.fromkeys(
        algos + (list(sizes_df.algorithm.unique()) if len(sizes_df) else [])))}
    if len(models_df):
        models = list(dict.fromkeys(models_df.model))
        width = 0.8 / len(algos)
        for j, a in enumerate(algos):
            d = models_df[models_df.algorithm == a].set_index("model")
            xs = np.arange(len(models)) + (j - (len(algos) - 1) / 2) * width
            ax1.bar(xs, [d.search_seconds.get(m, np.nan) for m in models], width, label=label(a),
                    color=colors[a])
        ax1.set_yscale("log")
        ax1.set_xticks(np.arange(len(models)), [f"{m}\n{int(models_df[models_df.model == m].ops.iloc[0])} ops"
                                                 for m in models], fontsize=7)
        ax1.set_ylabel("search time (s)")
        ax1.set_title(f"per model, {int(models_df.devices.iloc[0])} simulated P100s", fontsize=10)
        ax1.legend(fontsize=7)
    if len(sizes_df):
        for a, d in sizes_df.groupby("algorithm", sort=False):
            d = d.dropna(subset=["seconds"]).sort_values("ops")
            ax2.plot(d.ops + d.edges, d.seconds, "o-", label=label(a), color=colors.get(a))
        if len(models_df):
            for a, d in models_df[models_df.algorithm.isin(sizes_df.algorithm.unique())].groupby("algorithm"):
                ax2.scatter(d.ops + d.edges, d.search_seconds, marker="s", facecolors="none",
                            edgecolors=colors.get(a))
            ax2.scatter([], [], marker="s", facecolors="none", edgecolors="black",
                        label="model graphs (part 1)")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("ops + edges")
        ax2.set_ylabel("search time (s)")
        ax2.set_title("against size (synthetic training graphs, fresh process per run)", fontsize=10)
        ax2.legend(fontsize=7)
    fig.suptitle("Figure 5: search time", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=None, choices=MODELS,
                        help="models of part 1 (none: skip it)")
    parser.add_argument("--sizes", type=int, nargs="*", default=None,
                        help="synthetic graph sizes of part 2 (none: skip it; default 1000 10000 50000)")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS))
    parser.add_argument("--batch", type=int, help="batch for every model (default: the paper's)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per (model, algorithm); median")
    parser.add_argument("--no-place", action="store_true", help="skip place() end to end")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per synthetic run")
    parser.add_argument("--quick", action="store_true",
                        help=f"models {', '.join(QUICK_MODELS)} and sizes 1000 10000")
    parser.add_argument("--out", default=str(common.RESULTS / "fig5.csv"),
                        help="base name: writes <stem>_models.csv, <stem>_sizes.csv, <stem>.png")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.devices < 1 or args.repeats < 1:
        parser.error("--devices and --repeats must be >= 1")
    models = args.models if args.models is not None else list(QUICK_MODELS if args.quick else MODELS)
    sizes = args.sizes if args.sizes is not None else ([1000, 10000] if args.quick else [1000, 10000, 50000])
    t0 = time.perf_counter()
    models_df = run_models(models, args.devices, args.algorithms, batch=args.batch,
                           repeats=args.repeats, place=not args.no_place,
                           progress=not args.no_progress) if models else pd.DataFrame()
    t1 = time.perf_counter()
    sizes_df = run_sizes(sizes, args.devices, args.algorithms, timeout=args.timeout,
                         progress=not args.no_progress) if sizes else pd.DataFrame()
    t2 = time.perf_counter()
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.precision", 3):
        if len(models_df):
            print(f"Figure 5, part 1: search time on {args.devices} simulated P100s, median of "
                  f"{args.repeats} run(s) per cell in one process; models at the paper's batch, "
                  f"CIFAR-10 size; {t1 - t0:.0f} s in all.")
            wide = models_df.pivot_table(index=["model", "ops", "edges"], columns="algorithm",
                                         values="search_seconds", sort=False)
            wide.columns = [label(c) for c in wide.columns]
            facts = models_df.groupby("model", sort=False)[["build_seconds", "read_seconds"]].first()
            print(wide.reset_index().merge(facts.reset_index(), on="model").to_string(index=False))
            print("\nSearch-time differences the paper states (seconds; its TF 1.14 graphs are "
                  "1.2-5.8x larger than ours, and its implementation differs):")
            comparison = paper_comparison(models_df)
            print(comparison.to_string(index=False) if len(comparison) else
                  "(none of its models, pnasnet_mobile and nasnet_large, was run)")
        if len(sizes_df):
            print(f"\nFigure 5, part 2: search time against graph size, synthetic training graphs, "
                  f"{args.devices} devices (10 GB/s, 10 us), one fresh process per run, 1 repetition; "
                  f"{t2 - t1:.0f} s in all.")
            print(sizes_df[["algorithm", "ops", "edges", "seconds", "peak_mb", "ratio_to_bound"]]
                  .to_string(index=False))
            print()
            print(search_time.growth_exponent(sizes_df).to_string())
    out = common.ensure_parent(args.out)
    stem = out.with_suffix("")
    if len(models_df):
        models_df.to_csv(f"{stem}_models.csv", index=False)
    if len(sizes_df):
        sizes_df.to_csv(f"{stem}_sizes.csv", index=False)
    png = out.with_suffix(".png")
    plot(models_df, sizes_df, png)
    print(f"results: {stem}_models.csv, {stem}_sizes.csv, {png}")
    return models_df, sizes_df


if __name__ == "__main__":
    main()
