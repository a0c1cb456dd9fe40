"""The paper's Table 5: one training step's time under each strategy, on 2, 4 and 8 simulated P100s.

For each model at the paper's batch size (64; 16 for ResNet-200 and NASNet-A
Large) on CIFAR-10-sized inputs (32 x 32, 10 classes):

1. build its training graph (``slim_models``) and read it once
   (:func:`fddps.tf.read_graph_def`, the step's ops only: ancestors of
   ``train_op`` and ``loss``), costed by ``costmodel.default_cost_model(gpu="p100")``;
2. single device: everything on one P100 (``"single"``);
3. for each GPU count ``p``: every algorithm (FD-DPS with and without our
   refinement pass, FastT, MP-DPS, HEFT, m-ETF; FD-DPS without splits where the
   graph carries split candidates) schedules the same OpGraph on ``p`` P100s
   of one host (PCIe 3); the step time is the simulator's replay of the schedule;
4. data parallelism: the graph rebuilt at ``batch / p``, one replica's step
   plus a ring all-reduce of the gradients (:mod:`experiments.data_parallel`).

Memory: a schedule fits when each device's simulated peak (persistent bytes,
outputs until their last consumer, received copies) is within its capacity.
The schedulers reserve persistent bytes, check the peak, and where a device
overflows schedule again reserving every op's ``memory + transient`` for the
whole step (:meth:`fddps.algorithms.base.Scheduler.schedule`); the summary
counts the cells placed each way. A strategy that does not fit is marked
``OOM``; then the same algorithm is run again with unlimited memory, and that
schedule's peak says how far over it is.

Times are printed beside the paper's (its TF 1.14 graphs and real GPUs: compare
ratios, not seconds). Writes ``experiments/results/table5.csv`` (one row per
model, GPU count and strategy), ``table5_graphs.csv`` and ``table5.png``.

Usage::

    python -m experiments.table5                               # all six models (~10 min here)
    python -m experiments.table5 --quick                       # VGG-16, Inception-V3, ResNet-50
    python -m experiments.table5 --models resnet50 --devices 2 --batch 8
    python -m experiments.table5 --dataset imagenet --models resnet50 --memory-gb 16
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from . import common
from .common import (COST_MODEL_NOTE, DEFAULT_ALGORITHMS, MODELS, PAPER_BATCH, PAPER_TABLE5,
                     fmt_ms, fmt_pct, label, speedup)

QUICK_MODELS = ("vgg16", "inception_v3", "resnet50")

#: Strategies of ours that the paper's columns correspond to.
PAPER_KEY = {"single": "single", "data_parallel": "data_parallel", "fastt": "fastt",
             "mpdps": "mpdps", "fddps": "fddps", "fddps:improve=False": "fddps"}


def _paper(model, p, strategy):
    row = PAPER_TABLE5.get((model, p))
    key = PAPER_KEY.get(strategy)
    if row is None or key is None:
        return np.nan, ""
    v = row[key]
    return (np.nan, "OOM") if v is None else (float(v), "ok")


def run(models, devices=(2, 4, 8), algorithms=DEFAULT_ALGORITHMS, *, cost_model=None,
        dataset="cifar10", image_size=None, batch=None, memory=None, data_parallel=True,
        validate=True, progress=True):
    """Every strategy on every model and GPU count.

    Parameters
    ----------
    models : sequence of str
    devices : sequence of int
        GPU counts.
    algorithms : sequence of str
        Algorithm specs (``name:key=value``).
    cost_model : costmodel.CostModel, optional
        Default ``costmodel.default_cost_model(gpu="p100")``.
    dataset, image_size : see :func:`experiments.common.load_model`.
    batch : int, optional
        Batch for every model (default: the paper's).
    memory : float, optional
        Bytes per GPU (default: the preset's 16 GiB).
    data_parallel : bool
        Estimate data parallelism (builds the graph again at ``batch / p``).

    Returns
    -------
    (results, graphs) : pandas.DataFrame
        One row per (model, GPUs, strategy); one row per model's graph.
    """
    import costmodel
    from tqdm.auto import tqdm

    cm = costmodel.default_cost_model(gpu="p100") if cost_model is None else cost_model
    algorithms = list(algorithms)
    rows, graphs = [], []
    per_model = 1 + len(devices) * (len(algorithms) + int(data_parallel))
    bar = tqdm(total=len(models) * per_model, desc="table5", unit="run", disable=not progress,
               file=sys.stderr)
    for model in models:
        b = int(batch or PAPER_BATCH[model])
        bar.set_description(f"table5 {model}: build + read")
        mg = common.load_model(model, b, cm, dataset=dataset, image_size=image_size,
                                devices=common.device_names(max(devices, default=1)))
        graphs.append(mg)
        base = dict(model=model, batch=b, image_size=mg.image_size, ops=mg.ops)

        def add(p, result):
            paper, paper_status = _paper(model, p, result["strategy"])
            rows.append({**base, "devices": p, **result, "paper_seconds": paper,
                         "paper_status": paper_status})

        bar.set_description(f"table5 {model}: single")
        add(1, common.run_strategy(mg.graph, common.gpu_cluster(1, cm, memory=memory), "single",
                                   validate=validate, extra=_reservation))
        bar.update()
        specs = common.with_split_variant(algorithms, mg.graph)
        bar.total += len(devices) * (len(specs) - len(algorithms))
        for p in devices:
            cluster = common.gpu_cluster(p, cm, memory=memory)
            for spec in specs:
                bar.set_description(f"table5 {model} x{p}: {spec}")
                add(p, common.run_strategy(mg.graph, cluster, spec, validate=validate,
                                           extra=_reservation))
                bar.update()
            if data_parallel:
                bar.set_description(f"table5 {model} x{p}: data parallel")
                add(p, common.data_parallel_row(mg, cluster, cm, dataset=dataset, image_size=image_size))
                bar.update()
        mg.graph = None  # free the big graph; the row keeps the facts
    bar.close()
    return pd.DataFrame(rows), common.graph_table(graphs)


def _reservation(schedule) -> dict:
    """What the scheduler reserved to place it: ``"persistent"`` or ``"memory + transient"``."""
    return {"memory_reservation": schedule.info.get("memory_reservation", "")}


def _time(df, model, p, strategy):
    sel = df[(df.model == model) & (df.devices == p) & (df.strategy == strategy)]
    if sel.empty:
        return None
    r = sel.iloc[0]
    return "OOM" if r.status == "OOM" else ("n/a" if r.status == "n/a" else float(r.step_seconds))


def _num(x):
    return x if isinstance(x, float) else np.nan


def _ratio(single, t) -> str:
    return f"{single / t:.2f}x" if np.isfinite(single / t) else "-"


def summary(results: pd.DataFrame, algorithms) -> pd.DataFrame:
    """One row per (model, GPUs): our step times in ms, and FD-DPS's speedups.

    ``FD/FastT`` is the paper's measure ``(FastT - FD-DPS) / FastT`` (FD-DPS with
    our refinement pass), ``FDp/..`` the same for ``fddps:improve=False``;
    ``FD x1`` is one GPU's time over FD-DPS's.
    """
    out = []
    strategies = ["data_parallel"] + [a for a in algorithms if a != "single"]
    extra = [s for s in results.strategy.unique() if s not in strategies and s != "single"]
    for (model, p), _ in results[results.devices > 1].groupby(["model", "devices"], sort=False):
        single = _time(results, model, 1, "single")
        row = {"model": model, "GPUs": p, "single": fmt_ms(single)}
        for s in strategies + extra:
            v = _time(results, model, p, s)
            if v is not None:
                row[label(s)] = fmt_ms(v)
        t = {s: _num(_time(results, model, p, s))
             for s in ("fddps", "fddps:improve=False", "fastt", "mpdps")}
        row.update({"FD/FastT": fmt_pct(speedup(t["fastt"], t["fddps"])),
                    "FDp/FastT": fmt_pct(speedup(t["fastt"], t["fddps:improve=False"])),
                    "FD/MP": fmt_pct(speedup(t["mpdps"], t["fddps"])),
                    "FDp/MP": fmt_pct(speedup(t["mpdps"], t["fddps:improve=False"])),
                    "FD x1": _ratio(_num(single), t["fddps"])})
        out.append(row)
    return pd.DataFrame(out).fillna("")


def beside_paper(results: pd.DataFrame) -> pd.DataFrame:
    """The (model, GPUs) cells the paper reports: its times and speedups beside ours.

    Ours are ratios of simulated times (compare them, not seconds: the paper's
    are real P100 steps of TF 1.14 graphs 1.2-5.8x larger than ours).
    """
    out = []
    for (model, p), paper in PAPER_TABLE5.items():
        if not ((results.model == model) & (results.devices == p)).any():
            continue
        single = _num(_time(results, model, 1, "single"))
        t = {s: _num(_time(results, model, p, s))
             for s in ("fddps", "fddps:improve=False", "fastt", "mpdps", "data_parallel")}

        def ps(k):
            return "OOM" if paper[k] is None else f"{paper[k]:.3f}"

        out.append({"model": model, "GPUs": p,
                    "paper s: single": ps("single"), "DP": ps("data_parallel"),
                    "FastT": ps("fastt"), "MP-DPS": ps("mpdps"), "FD-DPS": ps("fddps"),
                    "FD/FastT paper": fmt_pct(speedup(paper["fastt"], paper["fddps"])),
                    "ours FDp": fmt_pct(speedup(t["fastt"], t["fddps:improve=False"])),
                    "ours FD": fmt_pct(speedup(t["fastt"], t["fddps"])),
                    "FD/MP paper": fmt_pct(speedup(paper["mpdps"], paper["fddps"])),
                    "ours FDp ": fmt_pct(speedup(t["mpdps"], t["fddps:improve=False"])),
                    "ours FD ": fmt_pct(speedup(t["mpdps"], t["fddps"])),
                    "FD x1 paper": ("-" if paper["single"] is None
                                    else _ratio(paper["single"], paper["fddps"])),
                    "ours": _ratio(single, t["fddps"]),
                    "DP x1 paper": ("-" if paper["single"] is None or paper["data_parallel"] is None
                                    else _ratio(paper["single"], paper["data_parallel"])),
                    "ours ": _ratio(single, t["data_parallel"])})
    return pd.DataFrame(out)


def _some(names, at_most=4) -> str:
    if not names:
        return "-"
    more = len(names) - at_most
    return ", ".join(names[:at_most]) + (f" (+{more} more)" if more > 0 else "")


def memory_summary(results: pd.DataFrame) -> pd.DataFrame:
    """Per model: peaks against capacity, how the cells were placed, and OOM verdicts.

    Columns: ``capacity_GB``; ``single_peak_GB`` (one GPU's simulated peak, with
    unlimited memory when it does not fit) and ``single_reserved_GB`` (its
    ``memory + transient`` sum, what the fallback reserves); ``peak_max_GB``
    over the placed cells; ``reserved/peak`` (how much more the fallback's
    reservation holds than the peak, over the placed schedules); the placed
    cells reserving persistent bytes only and those placed by the fallback;
    ``OOM`` cells, and among them those whose schedule with unlimited memory
    peaks within capacity (which the greedy placements missed).
    """
    ok = results[results.status == "ok"].copy()
    ok["ratio"] = ok.reserved_max / ok.peak_max
    if "memory_reservation" not in ok:
        ok["memory_reservation"] = ""
    rows = []
    for model, g in results.groupby("model", sort=False):
        k = ok[ok.model == model]
        single = g[g.strategy == "single"].iloc[0]
        oom = g[g.status == "OOM"]
        fits = oom[oom.unbounded_peak_max <= oom.capacity]
        fallback = k[k.memory_reservation == "memory + transient"]
        rows.append(dict(
            model=model,
            capacity_GB=round(float(g.capacity.iloc[0]) / 1e9, 2),
            single_peak_GB=round(float(single.peak_max if single.status == "ok"
                                       else single.unbounded_peak_max) / 1e9, 3),
            single_reserved_GB=round(float(single.reserved_max if single.status == "ok"
                                           else single.unbounded_reserved_max) / 1e9, 3),
            peak_max_GB=round(float(k.peak_max.max()) / 1e9, 3) if len(k) else np.nan,
            **{"reserved/peak": (f"{k.ratio.min():.2f}-{k.ratio.max():.2f}" if len(k) else "-")},
            placed_persistent=int((k.memory_reservation == "persistent").sum()),
            placed_fallback=len(fallback),
            fallback_cells=_some([f"{label(r.strategy)}x{r.devices}" for r in fallback.itertuples()]),
            OOM=len(oom),
            OOM_peak_fits=len(fits),
            which=_some([f"{label(r.strategy)}x{r.devices}" for r in fits.itertuples()])))
    return pd.DataFrame(rows)


def plot(results: pd.DataFrame, path, algorithms):
    """Speedup over one GPU, per model, GPU count and strategy (ours: bars; paper: markers)."""
    plt = common.matplotlib_agg()
    models = list(dict.fromkeys(results.model))
    strategies = ["data_parallel"] + [a for a in algorithms if a != "single"]
    strategies += [s for s in dict.fromkeys(results.strategy) if s not in strategies + ["single"]]
    ncols = min(len(models), 3)
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(8.0, 4.4 * ncols), 3.4 * nrows + 1.0),
                             squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    cmap = plt.get_cmap("tab10")
    for ax, model in zip(axes.flat, models):
        df = results[results.model == model]
        single = _num(_time(results, model, 1, "single"))
        ps = sorted(df[df.devices > 1].devices.unique())
        width = 0.8 / len(strategies)
        for j, s in enumerate(strategies):
            ys = [single / _num(_time(results, model, p, s)) if _time(results, model, p, s) is not None
                  else np.nan for p in ps]
            xs = np.arange(len(ps)) + (j - (len(strategies) - 1) / 2) * width
            ax.bar(xs, np.nan_to_num(ys), width, label=label(s), color=cmap(j))
            for x, y in zip(xs, ys):
                if not np.isfinite(y):
                    ax.text(x, 0.05, "OOM", rotation=90, ha="center", va="bottom", fontsize=7)
            if PAPER_KEY.get(s) in ("fastt", "mpdps", "fddps", "data_parallel") and s != "fddps":
                py = []
                for p in ps:
                    pr = PAPER_TABLE5.get((model, p))
                    v = pr and pr[PAPER_KEY[s]]
                    py.append(pr["single"] / v if pr and v and pr["single"] else np.nan)
                ax.scatter(xs, py, marker="x", color="black", zorder=3,
                           label="paper" if j == 0 else None)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(np.arange(len(ps)), [f"{p} GPUs" for p in ps])
        ax.set_title(f"{model} (batch {df.batch.iloc[0]})", fontsize=10)
        ax.set_ylabel("speedup over one GPU")
    handles, labels_ = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels_, loc="lower center", ncol=min(len(labels_), 5), fontsize=8)
    fig.suptitle("Table 5: speedup over one GPU, ours (bars: simulated P100s, analytic costs)\n"
                 "and the paper's (x: real P100s, TF 1.14) for DP, FastT, MP-DPS and FD-DPS",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=None, choices=MODELS,
                        help="default: all six (or the three smallest with --quick)")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8], help="GPU counts")
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS),
                        help="specs like fddps:improve=False")
    parser.add_argument("--batch", type=int, help="batch for every model (default: the paper's)")
    parser.add_argument("--dataset", default="cifar10", choices=("cifar10", "imagenet"))
    parser.add_argument("--image-size", type=int, help="overrides the dataset's image size")
    parser.add_argument("--memory-gb", type=float, help="GPU memory in GB (default: P100's 16 GiB)")
    parser.add_argument("--no-data-parallel", action="store_true", help="skip data parallelism")
    parser.add_argument("--no-validate", action="store_true", help="skip Schedule.validate()")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK_MODELS)} (about a minute)")
    parser.add_argument("--out", default=str(common.RESULTS / "table5.csv"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    if any(d < 1 for d in args.devices):
        parser.error("--devices must be >= 1")
    devices = [d for d in args.devices if d > 1]
    memory = None if args.memory_gb is None else args.memory_gb * 1e9

    t0 = time.perf_counter()
    results, graphs = run(models, devices, args.algorithms, dataset=args.dataset,
                          image_size=args.image_size, batch=args.batch, memory=memory,
                          data_parallel=not args.no_data_parallel, validate=not args.no_validate,
                          progress=not args.no_progress)
    wall = time.perf_counter() - t0
    import tensorflow as tf

    print(f"Table 5: one training step per strategy, {args.dataset} inputs, models "
          f"{', '.join(models)}, GPU counts {devices}; TensorFlow {tf.__version__}; one "
          f"schedule per cell (deterministic algorithms, no repetitions); {wall:.0f} s in all.")
    print(COST_MODEL_NOTE)
    if memory is not None:
        print(f"GPU memory set to {args.memory_gb:g} GB.")
    print("\nGraphs (ours: TF 2 slim_models, the step's ops only; paper: TF 1.14 TF-Slim graphs):")
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(graphs.to_string(index=False))
        print("\nStep time in ms on simulated P100s. FD = FD-DPS with our refinement pass, "
              "FDp = FD-DPS(paper) = fddps:improve=False; speedup = (base - FD) / base; "
              "x1 = one GPU's time / FD-DPS's:")
        print(summary(results, args.algorithms).to_string(index=False))
        paper = beside_paper(results)
        if len(paper):
            print("\nBeside the paper's Table 5 (its times in s on real P100s; compare the speedups):")
            print(paper.to_string(index=False))
        print("\nMemory: a schedule fits when every GPU's simulated peak (persistent bytes, outputs "
              "until their last consumer, received copies) is within its capacity; the schedulers "
              "reserve persistent bytes, check the peak, and fall back to reserving memory + "
              "transient for the whole step (data parallelism: one replica on one GPU):")
        print(memory_summary(results).to_string(index=False))
        oom = results[results.status == "OOM"]
        for r in oom.itertuples():
            verdict = ("fits: the greedy placements missed it" if r.unbounded_peak_max <= r.capacity
                       else "does not fit")
            step = (f", step {r.unbounded_step_seconds * 1e3:.4g} ms"
                    if np.isfinite(r.unbounded_step_seconds) else "")
            print(f"  OOM {r.model} x{r.devices} {label(r.strategy)}: with unlimited memory, peak "
                  f"{r.unbounded_peak_max / 1e9:.3g} GB vs capacity {r.capacity / 1e9:.3g} GB "
                  f"({verdict}){step}")
    unchecked = sorted({k for ks in graphs.kernels_unchecked for k in ks.split(",") if k})
    if unchecked:
        print(f"\nDevice strings '/device:GPU:i' on this TensorFlow ({tf.__version__}, CPU-only): its "
              f"kernel registry has no {'/'.join(unchecked)} kernels, so read_graph_def could not "
              "check them (info['kernels_unchecked']) and treats every op as runnable there.")
    out = common.ensure_parent(args.out)
    results.to_csv(out, index=False)
    graphs.to_csv(out.with_name(out.stem + "_graphs.csv"), index=False)
    png = out.with_suffix(".png")
    plot(results, png, args.algorithms)
    write_page(out, results, args.algorithms, wall)
    print(f"results: {out}, {out.with_name(out.stem + '_graphs.csv')}, {png}, "
          f"{out.with_suffix('.md')}")
    return results


def write_page(out, results, algorithms, seconds=None, command=None):
    """The generated page ``table5.md``: the summary table (ms) as printed."""
    return common.write_results_page(
        out, "Table 5 on the current presets",
        "Step time in ms of the six networks on 2, 4 and 8 simulated P100s (the paper's "
        "batches, CIFAR-10 size); FD = FD-DPS with our refinement pass, FDp = FD-DPS(paper) = "
        "fddps:improve=False; speedup = (base - FD) / base; x1 = one GPU's time / FD-DPS's. "
        + COST_MODEL_NOTE, summary(results, list(algorithms)), seconds=seconds, command=command)


if __name__ == "__main__":
    main()
