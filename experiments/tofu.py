"""Tofu's setting in simulation: models larger than one GPU on 8 simulated K80s (issue 16).

For each model -- WResNet-152 widened 4-10x (batch 8, ImageNet 224 x 224, as
Tofu trains WResNet-152-10) and RNNs of 6/8/10 LSTM layers with 4K-8K hidden
units (batch 128, 20 unrolled steps, vocabulary 10,000: Tofu's RNN-10-8K batch)
-- and each way to run it:

- ``single``: the whole step on one K80;
- ``data_parallel``: :func:`fddps.strategy.data_parallel` (samples split over
  the 8 GPUs, variables whole, spread by bytes);
- ``fddps`` and ``etf``: whole-op placement (FD-DPS; m-ETF, Baechi's
  memory-aware ETF) on the step's op graph, with their memory constraint;
- ``tofu``: :class:`fddps.search.tofu.Tofu` (recursive partition, DP per level;
  variables partitioned too, as in Tofu: ``writable=False``; ``--writable``
  only what the TensorFlow rewrite writes: variables as shard variables where
  their group allows, batch norm unsplit along its statistics);

it reports whether the step fits (every device's simulated peak within 12 GB),
the predicted step time, the largest per-device peak and the search time.
Strategies are expanded (:func:`fddps.strategy.expand`) and replayed with a
first-in-first-out executor per device; schedulers' peaks are their own
schedule's replay. Search times are wall-clock on a loaded 2-core machine:
compare them as ratios, and to Tofu's 8.3 s (WResNet-152) and 66.6 s (RNN-10)
on its own machine only loosely.

The K80: ``costmodel.presets["k80"]`` when the cost model has it, else
:data:`K80` below (the same figures): one GK210 as TensorFlow sees it, 4.37
TFLOPS FP32, 240 GB/s, 12 GB (NVIDIA Tesla K80 board specification
BD-07317-001_v05, 2015). Links: the cost model's default GPU-GPU link (PCIe).

Run::

    python -m experiments.tofu --quick                  # small models, 4 GPUs: a smoke test
    python -m experiments.tofu                          # Tofu's models (slow to build)
    python -m experiments.tofu --models wrn152-4,rnn6-4096 --budget 1800
    python -m experiments.tofu --flexflow               # FlexFlow's RNNLM and NMT, 4 P100s
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pandas as pd

from experiments.common import (RESULTS, device_names, ensure_parent, load_model, matplotlib_agg,
                                run_strategy, save_csv_and_plot)

GB = 1e9


def k80_preset():
    """The K80 (one GK210) device preset: the cost model's own when it has one."""
    from costmodel import presets
    from costmodel.hardware import DevicePreset

    if "k80" in list(presets):
        return presets["k80"]
    return DevicePreset(
        "k80", "GPU", peak_flops=4.37e12, memory_bandwidth=240 * GB, memory=12 * GB,
        overhead=10e-6,
        source="NVIDIA Tesla K80 board specification BD-07317-001_v05 (2015): two GK210 per "
               "board, each 4.37 TFLOPS FP32 (875 MHz boost), 240 GB/s, 12 GB GDDR5; "
               "overhead 10 us and efficiencies (0.6 compute, 0.7 memory) assumed as for p100")


#: Tofu's models (Section 7): name -> (slim model, options, batch).
def tofu_models():
    from slim_models.rnn import tofu_rnn_options

    out = {f"wrn152-{w}": ("wide_resnet", dict(depth=152, width=w), 8) for w in (4, 6, 8, 10)}
    for layers in (6, 8, 10):
        for hidden in (4096, 6144, 8192):
            out[f"rnn{layers}-{hidden}"] = ("rnn_lm", tofu_rnn_options(layers, hidden), 128)
    return out


#: --quick: small versions on 4 GPUs whose capacity is set below the single-device peak.
QUICK_MODELS = {
    "wrn50-0.25": ("wide_resnet", dict(depth=50, width=0.25, image_size=32, num_classes=10), 4),
    "rnn2-256": ("rnn_lm", dict(num_layers=2, hidden_size=256, vocab_size=1000, seq_length=5), 8),
}
#: --flexflow: FlexFlow's RNNLM and NMT (MLSys 2019, Section 8) at their defaults
#: (`slim_models.rnn.FLEXFLOW_RNNLM`, `FLEXFLOW_NMT`), batch 64, on 4 simulated P100s.
FLEXFLOW_MODELS = {"rnnlm": ("rnn_lm", {}, 64), "nmt": ("nmt", {}, 64)}
ORDER = ("single", "data_parallel", "fddps", "etf", "tofu")


def _strategy_row(step, strategy, cluster, cm, seconds):
    from fddps.strategy import simulate_strategy

    tl = simulate_strategy(step, strategy, cluster, cm)
    peak = np.asarray(tl.peak_memory, dtype=np.float64)
    fits = bool((peak <= cluster.memory * (1 + 1e-12)).all())
    return dict(status="ok" if fits else "OOM", step_seconds=tl.makespan if fits else np.nan,
                predicted_seconds=tl.makespan, peak_max=float(peak.max()),
                search_seconds=seconds, moved_gb=float(tl.transfers["bytes"].sum()) / GB)


def run_model(label, model, options, batch, devices, cm, capacity, algorithms=ORDER,
              writable=False, split_variables=True):
    """One row per way of running ``model`` on ``devices`` K80s of ``capacity`` bytes."""
    from fddps.errors import InfeasibleError
    from fddps.search.tofu import Tofu
    from fddps.strategy import Strategy, data_parallel
    from fddps.tf import make_cluster
    from fddps.tf.strategy_graph import step_graph

    options = dict(options)
    image_size = options.pop("image_size", None)
    num_classes = options.pop("num_classes", None)
    t0 = time.perf_counter()
    model_options = dict(options)
    if num_classes is not None:
        model_options["num_classes"] = num_classes
    mg = load_model(model, batch, cm, image_size=image_size, devices=device_names(devices),
                    keep_graph_def=True, model_options=model_options,
                    dataset="imagenet" if model == "wide_resnet" else "cifar10")
    step = step_graph(mg.graph_def, list(mg.fetches))
    built = time.perf_counter() - t0
    weights = sum(op.param_bytes for op in step.ops.values())
    base = dict(model=label, batch=batch, devices=devices, ops=len(step), params=mg.parameters,
                weights_gb=weights / GB, capacity_gb=capacity / GB, build_seconds=built)
    print(f"{label}: {len(step)} ops, {mg.parameters / 1e6:.0f} M parameters, weights and slots "
          f"{weights / GB:.1f} GB, built in {built:.0f} s", flush=True)
    names = device_names(devices)
    cluster = make_cluster(names, cm, capacity)
    rows = []
    for how in algorithms:
        t = time.perf_counter()
        if how == "single":
            one = make_cluster(names[:1], cm, capacity)
            row = _strategy_row(step, Strategy({}, names[0], "single"), one, cm, 0.0)
        elif how == "data_parallel":
            s = data_parallel(step, names)
            row = _strategy_row(step, s, cluster, cm, time.perf_counter() - t)
        elif how == "tofu":
            try:
                plan = Tofu(writable=writable, split_variables=split_variables).search(
                    step, cluster, cm)
                row = _strategy_row(step, plan.strategy, cluster, cm, plan.search_seconds)
                row.update(comm_gb=plan.comm_bytes / GB, exact=plan.exact, groups=plan.groups)
            except InfeasibleError as err:
                row = dict(status="OOM", step_seconds=np.nan, peak_max=err.needed,
                           search_seconds=time.perf_counter() - t, message=str(err)[:200])
        else:
            r = run_strategy(mg.graph, cluster, how, validate=False, probe_oom=False)
            row = dict(status=r["status"], step_seconds=r["step_seconds"],
                       peak_max=r["peak_max"], search_seconds=r["search_seconds"],
                       message=r["message"][:200])
        rows.append(dict(base, strategy=how, **row))
        r = rows[-1]
        print(f"  {how:14s} {r['status']:3s} step {r['step_seconds'] * 1e3:9.1f} ms  peak "
              f"{r['peak_max'] / GB:7.2f} GB  search {r['search_seconds']:7.1f} s", flush=True)
    return rows


def largest_fitting(df) -> pd.DataFrame:
    """Per model family and strategy: the largest model (by weights) whose step fits."""
    df = df.assign(family=df["model"].str.replace(r"-.*", "", regex=True))
    ok = df[df["status"] == "ok"].sort_values("weights_gb")
    rows = []
    for (family, how), sub in df.groupby(["family", "strategy"], sort=False):
        fit = ok[(ok["family"] == family) & (ok["strategy"] == how)]
        rows.append(dict(family=family, strategy=how,
                         largest=fit["model"].iloc[-1] if len(fit) else "none",
                         weights_gb=fit["weights_gb"].iloc[-1] if len(fit) else np.nan))
    return pd.DataFrame(rows)


def _plot(df, png):
    plt = matplotlib_agg()
    models = list(dict.fromkeys(df["model"]))
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(models) + 2), 3.4))
    ran = [how for how in ORDER if how in set(df["strategy"])]  # --algorithms may leave some out
    width = 0.8 / len(ran)
    for j, how in enumerate(ran):
        sub = df[df["strategy"] == how].set_index("model").reindex(models)
        x = np.arange(len(models)) + (j - len(ran) / 2 + 0.5) * width
        y = sub["step_seconds"].to_numpy(dtype=float)
        ax.bar(x, np.nan_to_num(y), width, label=how)
        for xi, yi in zip(x, y):
            if not np.isfinite(yi):
                ax.text(xi, 0, "OOM", rotation=90, fontsize=6, ha="center", va="bottom")
    ax.set_xticks(np.arange(len(models)))
    ax.set_xticklabels(models, fontsize=7, rotation=30)
    ax.set_ylabel("predicted step (s)")
    gpu = df["gpu"].iloc[0].upper() if "gpu" in df else "K80"
    ax.set_title(f"{df['devices'].iloc[0]} simulated {gpu}s ({df['capacity_gb'].iloc[0]:.3g} GB "
                 "each); OOM: a device over capacity", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small models on 4 GPUs, capacity 0.6 x the single-device peak")
    p.add_argument("--models", default="", help="comma-separated (default: all of Tofu's)")
    p.add_argument("--devices", type=int, default=None)
    p.add_argument("--algorithms", default=",".join(ORDER))
    p.add_argument("--budget", type=float, default=math.inf,
                   help="seconds: start no new model after this long")
    p.add_argument("--flexflow", action="store_true",
                   help="FlexFlow's RNNLM and NMT (batch 64) on 4 simulated P100s of 16 GB")
    p.add_argument("--writable", action="store_true",
                   help="tofu: only plans the TensorFlow rewrite writes (shard variables)")
    p.add_argument("--whole-variables", action="store_true",
                   help="tofu: keep variables whole (split_variables=False)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from costmodel import default_cost_model
    from experiments.common import tf_quiet

    tf_quiet()
    if args.flexflow:
        from costmodel import presets

        gpu = presets["p100"]  # FlexFlow's GPUs
    else:
        gpu = k80_preset()
    cm = default_cost_model(gpu)
    table = QUICK_MODELS if args.quick else FLEXFLOW_MODELS if args.flexflow else tofu_models()
    chosen = [m for m in args.models.split(",") if m] or list(table)
    unknown = [m for m in chosen if m not in table]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r}; known: {', '.join(table)}")
    devices = args.devices or (4 if args.quick or args.flexflow else 8)
    algorithms = [a for a in args.algorithms.split(",") if a]
    out = args.out or str(RESULTS / ("tofu_quick.csv" if args.quick else "tofu_flexflow.csv"
                                     if args.flexflow else "tofu.csv"))
    print(f"{gpu.name} preset: {gpu.source}")
    rows, t0 = [], time.perf_counter()
    for label in chosen:
        if time.perf_counter() - t0 > args.budget:
            print(f"{label}: not run (budget of {args.budget:.0f} s spent)")
            continue
        model, options, batch = table[label]
        capacity = gpu.memory
        if args.quick:  # below one device's peak, so single does not fit
            from fddps.strategy import Strategy, simulate_strategy
            from fddps.tf import make_cluster
            from fddps.tf.strategy_graph import step_graph

            opts = dict(options)
            size, classes = opts.pop("image_size", None), opts.pop("num_classes", None)
            if classes is not None:
                opts["num_classes"] = classes
            mg = load_model(model, batch, cm, image_size=size, keep_graph_def=True,
                            model_options=opts)
            step = step_graph(mg.graph_def, list(mg.fetches))
            one = make_cluster(device_names(1), cm)
            capacity = 0.6 * float(simulate_strategy(step, Strategy({}, one.names[0]), one,
                                                     cm).peak_memory.max())
        rows.extend(run_model(label, model, options, batch, devices, cm, capacity, algorithms,
                              args.writable, not args.whole_variables))
        pd.DataFrame(rows).to_csv(ensure_parent(out).with_suffix(".partial.csv"), index=False)
    df = pd.DataFrame(rows).assign(gpu=gpu.name)
    show = df[["model", "strategy", "status", "step_seconds", "peak_max", "search_seconds"]].assign(
        step_ms=(df.step_seconds * 1e3).round(1), peak_gb=(df.peak_max / GB).round(2),
        search_s=df.search_seconds.round(1)).drop(columns=["step_seconds", "peak_max",
                                                           "search_seconds"])
    print(show.to_string(index=False))
    print("\nLargest model that fits, per strategy:")
    print(largest_fitting(df).to_string(index=False))
    save_csv_and_plot(df, out, _plot)
    return df


if __name__ == "__main__":
    main()
