"""Parallelization strategies in simulation: one device, FD-DPS's placement, data
parallelism, a parameter (channel) split of every convolution, a mixed
strategy, and an attribute split (every op with a height split by rows:
convolutions and pools with a halo), on 2, 4 and 8 simulated P100s (issue
12's second benchmark).

Every strategy is a :class:`fddps.strategy.Strategy`, expanded into its task
graph (:func:`fddps.strategy.expand`: parts costed at their own shapes, only the
bytes a part needs moved, partial sums reduced per link, batch-norm statistics
exchanged) and replayed by the simulator with a first-in-first-out executor per
device. FD-DPS's row is its own schedule of the whole-op graph (with its splits).
The mixed strategy splits each convolution or MatMul by parameter when its
weights outweigh its activations, else by sample (FlexFlow's finding).
Step times are ratios to one device in the same run; peak memory is the
simulator's highest bytes held at once on the fullest device.

Run::

    python -m experiments.strategies                       # six networks, batch 32
    python -m experiments.strategies --models vgg16 --devices 2 --batch 8
    python -m experiments.strategies --coverage            # op types described / kept whole
    python -m experiments.strategies --coverage --models rnn_lm,nmt --coverage-out rnn
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from experiments.common import (COST_MODEL_NOTE, MODELS, RESULTS, device_names, ensure_parent,
                                gpu_cluster, load_model, matplotlib_agg, save_csv_and_plot,
                                schedule_peak)

STRATEGIES = ("data_parallel", "parameter_split", "mixed", "attribute_split")


def _plot(df, png):
    plt = matplotlib_agg()
    models = list(dict.fromkeys(df["model"]))
    cols = min(3, len(models))
    rows_ = -(-len(models) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(3.6 * cols, 3.0 * rows_), squeeze=False)
    for ax in axes.ravel()[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.ravel(), models):
        sub = df[df["model"] == model]
        for strategy, rows in sub.groupby("strategy", sort=False):
            if strategy == "one device":
                continue
            ax.plot(rows["devices"], rows["speedup"], marker="o", label=strategy)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("P100s (simulated)")
        ax.set_xticks(sorted(set(sub["devices"]) - {1}))
        ax.set_ylabel("speed-up over one device")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def run(models, batch, device_counts, algorithms=("fddps",), dataset="cifar10"):
    """One row per (model, devices, strategy): predicted step, speed-up, peak memory, bytes moved."""
    from costmodel import default_cost_model
    from fddps import schedule
    from fddps.strategy import (attribute_split, data_parallel, expand, mixed, parameter_split,
                                whole_placement)
    from fddps.tf.strategy_graph import step_graph

    cm = default_cost_model("p100")
    makers = {"data_parallel": data_parallel, "parameter_split": parameter_split, "mixed": mixed,
              "attribute_split": attribute_split}
    rows = []
    for model in models:
        t0 = time.perf_counter()
        mg = load_model(model, batch, cm, dataset=dataset, keep_graph_def=True,
                        devices=device_names(max(device_counts)))
        step = step_graph(mg.graph_def, list(mg.fetches))
        one = gpu_cluster(1, cm)
        single = expand(step, whole_placement({}, one.names[0]), one, cm).simulate(one)
        base = dict(model=model, batch=batch)
        rows.append(dict(base, devices=1, strategy="one device", step_ms=single.makespan * 1e3,
                         speedup=1.0, peak_mb=float(single.peak_memory.max()) / 1e6,
                         moved_mb=0.0, ops_split=0, tasks=len(step)))
        for k in device_counts:
            cluster = gpu_cluster(k, cm)
            for algorithm in algorithms:
                s = schedule(mg.graph, cluster, algorithm)
                rows.append(dict(base, devices=k, strategy=algorithm, step_ms=s.makespan * 1e3,
                                 speedup=single.makespan / s.makespan,
                                 peak_mb=float(schedule_peak(s).max()) / 1e6, moved_mb=np.nan,
                                 ops_split=len(s.info.get("splits", [])), tasks=s.graph.num_ops))
            for name in STRATEGIES:
                ex = expand(step, makers[name](step, list(cluster.names)), cluster, cm)
                tl = ex.simulate(cluster)
                rows.append(dict(base, devices=k, strategy=name, step_ms=tl.makespan * 1e3,
                                 speedup=single.makespan / tl.makespan,
                                 peak_mb=float(tl.peak_memory.max()) / 1e6,
                                 moved_mb=float(tl.transfers["bytes"].sum()) / 1e6,
                                 ops_split=sum(len(t) > 1 for t in ex.tasks.values()),
                                 tasks=ex.graph.num_ops))
        print(f"{model}: {len(step)} step ops, {time.perf_counter() - t0:.0f} s", flush=True)
    return pd.DataFrame(rows)


#: Sizes the coverage report builds the RNNs at (their byte shares depend on size):
#: model -> (batch, options). Tofu's RNN-6-4K (batch 128, as ``experiments.tofu``) and
#: FlexFlow's NMT (its defaults, batch 64).
COVERAGE_SIZES = {"rnn_lm": (128, dict(num_layers=6, hidden_size=4096, vocab_size=10000,
                                       seq_length=20)),
                  "nmt": (64, {})}


def _coverage_step(model, batch, dataset):
    import slim_models
    from fddps.tf.strategy_graph import step_graph

    if model in COVERAGE_SIZES:  # word ids, no image dataset
        batch, options = COVERAGE_SIZES[model]
        m = slim_models.build_training_graph(model, batch, **options)
    else:
        m = slim_models.build_training_graph(model, batch, dataset=dataset)
    return step_graph(m.graph_def, [m.train_op.name, m.loss.name])


def coverage_table(models, batch=2, dataset="cifar10", shares=None) -> pd.DataFrame:
    """Op types of each network's training step: ops described (splittable) / kept whole.

    One row per op type: ``described`` and ``kept_whole`` summed over the
    models, a ``<model>`` column of ``described/total`` per model, and the
    most common reason an op of the type is kept whole. CNNs are built at
    ``batch`` (CIFAR size), the RNNs at :data:`COVERAGE_SIZES`.

    ``shares``: a list that receives one dict per model, the share of its step
    kept whole by ops, FLOPs and output bytes
    (:func:`fddps.strategy.ops.kept_whole_share`) and the op types kept whole
    that hold the most output bytes.
    """
    from fddps.strategy.ops import coverage, kept_whole_share

    per_model = {}
    for model in models:
        per_model[model] = table = coverage(_coverage_step(model, batch, dataset))
        if shares is not None:
            whole = table[table.kept_whole > 0].sort_values("whole_bytes", ascending=False)
            top = ", ".join(f"{t} {b / table.output_bytes.sum():.1%}"
                            for t, b in zip(whole.op_type[:5], whole.whole_bytes[:5]) if b > 0)
            share = kept_whole_share(table)
            shares.append(dict(model=model, ops=int(table.ops.sum()),
                               kept_whole=int(table.kept_whole.sum()),
                               **{f"whole_{k}": round(v, 4) for k, v in share.items()},
                               largest_whole=top))
    total = pd.concat(per_model.values()).groupby("op_type").agg(
        ops=("ops", "sum"), described=("described", "sum"), kept_whole=("kept_whole", "sum"),
        whole_flops=("whole_flops", "sum"), whole_bytes=("whole_bytes", "sum"),
        reason=("reason", lambda r: max(r, key=len)))
    for model, table in per_model.items():
        t = table.set_index("op_type")
        total[model] = [f"{t.described[o]}/{t.ops[o]}" if o in t.index else "" for o in total.index]
    return total.sort_values("ops", ascending=False).reset_index()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--devices", default="2,4,8")
    p.add_argument("--algorithms", default="fddps",
                   help="comma-separated fddps algorithms to compare ('' for none)")
    p.add_argument("--out", default=str(RESULTS / "strategies.csv"))
    p.add_argument("--coverage", action="store_true",
                   help="print the op-type coverage table (described / kept whole) and stop")
    p.add_argument("--coverage-out", default=None,
                   help="suffix of the coverage CSVs (strategy_coverage_SUFFIX.csv)")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if args.coverage:
        shares = []
        table = coverage_table(models, shares=shares)
        print(table.drop(columns=["whole_flops", "whole_bytes"]).to_string(index=False))
        print("\nShare of each step kept whole (ops, FLOPs, output bytes; CNNs at batch 2, "
              "CIFAR size; rnn_lm: RNN-6-4K at batch 128; nmt: FlexFlow's NMT at batch 64):")
        print(pd.DataFrame(shares).to_string(index=False))
        name = "strategy_coverage" + ("" if args.coverage_out is None else f"_{args.coverage_out}")
        table.to_csv(ensure_parent(RESULTS / f"{name}.csv"), index=False)
        pd.DataFrame(shares).to_csv(RESULTS / f"{name}_shares.csv", index=False)
        return table
    counts = [int(k) for k in args.devices.split(",")]
    algorithms = [a for a in args.algorithms.split(",") if a]
    df = run(models, args.batch, counts, algorithms)
    print(f"Strategies in simulation, CIFAR-10 size, batch {args.batch}. {COST_MODEL_NOTE}")
    show = df.assign(step_ms=df.step_ms.round(2), speedup=df.speedup.round(2),
                     peak_mb=df.peak_mb.round(0), moved_mb=df.moved_mb.round(0))
    print(show.to_string(index=False))
    save_csv_and_plot(df, args.out, _plot)
    return df


if __name__ == "__main__":
    main()
