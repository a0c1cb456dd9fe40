"""The paper's Table 7 (and Table 6): intra-op parallelism on 4 simulated P100s.

For each model at the paper's batch size (VGG-16, Inception-V3 and ResNet-50 at
64, ResNet-200 at 16) on CIFAR-10-sized inputs (32 x 32, 10 classes):

1. build its training graph (``slim_models``) and read it once
   (:func:`fddps.tf.read_graph_def`, the step's ops only), costed by
   ``costmodel.default_cost_model(gpu="p100")``. The reading attaches the
   split candidates (:mod:`fddps.tf.split_candidates`): every Conv2D,
   Conv2DBackpropInput, Conv2DBackpropFilter and untransposed MatMul with known
   shapes, once per dimension it can be split on;
2. schedule that one OpGraph on 4 P100s of one host (PCIe 3) with MP-DPS,
   D-DPS(-F) (``fddps:split=False``: FD-DPS without intra-op splitting), FD-DPS
   (``fddps``), and the paper's algorithm without our refinement pass, with and
   without splits (``fddps:improve=False`` and ``fddps:improve=False,split=False``).
   The step time is the simulator's replay of each schedule. FD-DPS keeps the
   split graph only when its schedule is faster
   (:func:`fddps.algorithms.split_step.schedule_with_splits`);
3. list the ops FD-DPS split (:func:`fddps.strategy.fddps_splits.decisions_table`)
   and, for VGG-16, the paper's Table 6 operators with their predicted time and
   our decision.

Times are printed beside the paper's Table 7 (its TF 1.14 graphs on real P100s:
compare ratios, not seconds). Writes ``experiments/results/table7.csv`` (one row
per model and strategy), ``table7_splits.csv`` (every split decision),
``table7_vgg16_ops.csv`` (Table 6) and ``table7.png``.

Usage::

    python -m experiments.table7                      # the four models (~3 min here)
    python -m experiments.table7 --quick              # VGG-16 and ResNet-50
    python -m experiments.table7 --models resnet50 --batch 8 --devices 2
    python -m experiments.table7 --dataset imagenet   # 224 x 224: longer ops, more splits
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import common
from .common import COST_MODEL_NOTE, PAPER_BATCH, fmt_ms, fmt_pct, label, speedup

#: The paper's Table 7: seconds of one step on 4 P100s (TF 1.14), its "Speed"
#: column (= (D-DPS(-F) - FD-DPS) / D-DPS(-F), checked against its numbers) and
#: the op types it split.
PAPER_TABLE7 = {
    "vgg16": dict(batch=64, mpdps=1.905, dddps=1.926, fddps=1.812, speed=0.0592,
                  split="Conv2D, Conv2Dbp"),
    "inception_v3": dict(batch=64, mpdps=0.872, dddps=0.843, fddps=0.823, speed=0.0237,
                         split="Conv2D, Conv2Dbp"),
    "resnet50": dict(batch=64, mpdps=0.719, dddps=0.735, fddps=0.683, speed=0.0707,
                     split="Conv2D, Conv2Dbp"),
    "resnet200": dict(batch=16, mpdps=0.806, dddps=0.825, fddps=0.743, speed=0.0994,
                      split="Conv2D, Conv2Dbp"),
    "pnasnet_mobile": dict(batch=64, mpdps=1.547, dddps=1.489, fddps=1.314, speed=0.1175,
                           split="Conv2D, Conv2Dbp, Matmul"),
    "nasnet_large": dict(batch=16, mpdps=3.876, dddps=4.211, fddps=3.627, speed=0.1387,
                         split="Conv2D, Conv2Dbp, Matmul"),
}

#: The paper's Table 6 (VGG-16): operator, time (ms), "memory ratio (KB)", split.
#: The text runs the digits of the two number columns together; we read times
#: with three decimals where the other rows have three (so Conv1_2 is 15.673 ms
#: and 43.82 KB, not 15.67 ms and 343.82 KB).
PAPER_TABLE6 = [
    ("Conv1_1", 2.146, 3.64, False), ("Conv1_2", 15.673, 43.82, True),
    ("Conv1_2bp", 36.466, 56.88, True), ("Relu1_2", 2.908, 0.12, False),
    ("Pool1", 0.96, 0.54, False), ("Fc6", 1.654, 136766.44, False),
]

#: Our VGG-16 nodes for the paper's Table 6 rows (the backprop row is two ops here).
VGG16_TABLE6_OPS = [
    ("Conv1_1", "vgg_16/conv1/conv1_1/Conv2D"),
    ("Conv1_2", "vgg_16/conv1/conv1_2/Conv2D"),
    ("Conv1_2bp", "gradients/vgg_16/conv1/conv1_2/Conv2D_grad/Conv2DBackpropInput"),
    ("Conv1_2bp", "gradients/vgg_16/conv1/conv1_2/Conv2D_grad/Conv2DBackpropFilter"),
    ("Relu1_2", "vgg_16/conv1/conv1_2/Relu"),
    ("Pool1", "vgg_16/pool1"),
    ("Fc6", "vgg_16/fc6/MatMul"),
]

MODELS = ("vgg16", "inception_v3", "resnet50", "resnet200")
QUICK_MODELS = ("vgg16", "resnet50")

#: The strategies of the table: the paper's three columns, then FD-DPS without
#: our refinement pass (the paper's algorithm), with and without splits.
STRATEGIES = ("mpdps", "fddps:split=False", "fddps", "fddps:improve=False",
              "fddps:improve=False,split=False")

#: Labels beyond :data:`experiments.common.LABELS`.
EXTRA_LABELS = {"fddps:improve=False,split=False": "D-DPS(-F)(paper)"}


def _label(spec):
    return EXTRA_LABELS.get(spec, label(spec))


def vgg16_table6(graph, decisions) -> pd.DataFrame:
    """Our VGG-16 rows of the paper's Table 6: the op's time on one P100 (ms, from
    the cost model), its output and weight sizes (KB), and FD-DPS's decision.

    ``graph``: the unsplit OpGraph; ``decisions``: the SplitDecisions FD-DPS kept.
    """
    by_op = {d.candidate.op: d for d in decisions}
    candidates = {}
    for c in graph.split_candidates:
        candidates.setdefault(c.op, []).append(c.rule.dim)
    rows = []
    for paper_name, op in VGG16_TABLE6_OPS:
        if op not in graph.index:
            continue
        i = graph.index[op]
        weights = sum(float(graph.bytes[e]) for e in graph.pred_eid[graph.pred_ptr[i]:graph.pred_ptr[i + 1]]
                      if graph.op_types[graph.src[e]] == "ReadVariableOp")
        out = float(graph.transient[i])  # the cost model's transient bytes: the op's outputs
        d = by_op.get(op)
        if d is not None:
            decision = f"yes: {d.candidate.rule.dim} x{d.parts}"
        elif op in candidates:
            decision = f"no (could: {', '.join(candidates[op])})"
        else:
            decision = "no (no split rule)"
        paper = next((p for p in PAPER_TABLE6 if p[0] == paper_name), None)
        rows.append(dict(paper_op=paper_name, op=op, op_type=graph.op_types[i],
                         time_ms=float(graph.cost[i].min()) * 1e3,
                         weights_KB=weights / 1024, output_KB=out / 1024, split=decision,
                         paper_time_ms=paper[1] if paper else np.nan,
                         paper_memory_KB=paper[2] if paper else np.nan,
                         paper_split=("yes" if paper[3] else "no") if paper else ""))
    return pd.DataFrame(rows)


def run(models, devices=4, strategies=STRATEGIES, *, cost_model=None, dataset="cifar10",
        image_size=None, batch=None, validate=True, progress=True):
    """Every strategy on every model, on ``devices`` simulated P100s.

    Returns
    -------
    (results, splits, table6) : pandas.DataFrame
        One row per (model, strategy) with its step time, search time and the
        number of ops split; one row per split decision of every strategy that
        split (``decisions_table`` columns plus ``model`` and ``strategy``);
        the VGG-16 Table 6 rows (empty without VGG-16).
    """
    import costmodel
    from tqdm.auto import tqdm

    from fddps.strategy.fddps_splits import decisions_table

    cm = costmodel.default_cost_model(gpu="p100") if cost_model is None else cost_model
    strategies = list(strategies)
    rows, split_tables, table6 = [], [], pd.DataFrame()
    bar = tqdm(total=len(models) * (1 + len(strategies)), desc="table7", unit="run",
               disable=not progress, file=sys.stderr)
    for model in models:
        b = int(batch or PAPER_BATCH[model])
        bar.set_description(f"table7 {model}: build + read")
        mg = common.load_model(model, b, cm, dataset=dataset, image_size=image_size)
        bar.update()
        cluster = common.gpu_cluster(devices, cm)
        skipped = mg.info.get("split_skipped", {})
        base = dict(model=model, batch=b, image_size=mg.image_size, ops=mg.ops, devices=devices,
                    split_candidates=mg.info.get("split_candidates", 0),
                    candidate_ops=len({c.op for c in mg.graph.split_candidates}),
                    skipped=sum(skipped.values()))
        for spec in strategies:
            bar.set_description(f"table7 {model}: {spec}")
            kept = {}

            def extra(s):
                kept["splits"] = list(s.info.get("splits") or [])
                return dict(splits_planned=s.info.get("splits_planned", 0),
                            unsplit_seconds=s.info.get("unsplit_makespan", np.nan))

            row = common.run_strategy(mg.graph, cluster, spec, validate=validate, extra=extra)
            decisions = kept.get("splits", [])
            types = sorted({d.candidate.rule.op_type for d in decisions})
            rows.append({**base, **row, "split_types": ", ".join(types)})
            if decisions:
                t = decisions_table(decisions)
                t.insert(0, "strategy", spec)
                t.insert(0, "model", model)
                split_tables.append(t)
            if model == "vgg16" and spec == "fddps":
                table6 = vgg16_table6(mg.graph, decisions)
            bar.update()
        mg.graph = None  # free the big graph; the rows keep the facts
    bar.close()
    splits = (pd.concat(split_tables, ignore_index=True) if split_tables
              else pd.DataFrame(columns=["model", "strategy", "op", "op_type", "dim", "size",
                                         "parts", "part_sizes", "combine", "estimated_gain"]))
    return pd.DataFrame(rows), splits, table6


def _seconds(results, model, spec):
    sel = results[(results.model == model) & (results.strategy == spec)]
    if sel.empty or sel.iloc[0].status != "ok":
        return np.nan
    return float(sel.iloc[0].step_seconds)


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """One row per model: our step times (ms), the paper's (s), and the gain of splitting."""
    out = []
    for model, df in results.groupby("model", sort=False):
        t = {s: _seconds(results, model, s) for s in df.strategy}
        fd_rows = df[df.strategy == "fddps"]
        row = dict(model=model, batch=int(df.batch.iloc[0]), ops=int(df.ops.iloc[0]),
                   candidates=int(df.candidate_ops.iloc[0]))
        for s in df.strategy:
            row[_label(s)] = fmt_ms(t[s])
        row["Speed"] = fmt_pct(speedup(t.get("fddps:split=False"), t.get("fddps")))
        if "fddps:improve=False" in t:
            row["Speed(paper alg.)"] = fmt_pct(speedup(t.get("fddps:improve=False,split=False"),
                                                        t.get("fddps:improve=False")))
        row["ops split"] = int(fd_rows.splits.iloc[0]) if len(fd_rows) else 0
        row["split types"] = fd_rows.split_types.iloc[0] if len(fd_rows) else ""
        paper = PAPER_TABLE7.get(model)
        if paper:
            row.update({"| paper (batch)": paper["batch"], "MP-DPS s": f"{paper['mpdps']:.3f}",
                        "D-DPS(-F) s": f"{paper['dddps']:.3f}", "FD-DPS s": f"{paper['fddps']:.3f}",
                        "Speed ": fmt_pct(paper["speed"]), "split ": paper["split"]})
        out.append(row)
    return pd.DataFrame(out).fillna("")


def plot(results: pd.DataFrame, path):
    """Left: our step times relative to D-DPS(-F), per model and strategy. Right:
    the gain of splitting (FD-DPS over D-DPS(-F)), ours and the paper's."""
    plt = common.matplotlib_agg()
    models = list(dict.fromkeys(results.model))
    strategies = list(dict.fromkeys(results.strategy))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw=dict(width_ratios=[3, 2]))
    cmap = plt.get_cmap("tab10")
    width = 0.8 / len(strategies)
    x = np.arange(len(models))
    for j, s in enumerate(strategies):
        ys = [_seconds(results, m, s) / _seconds(results, m, "fddps:split=False")
              if "fddps:split=False" in strategies else _seconds(results, m, s) for m in models]
        ax.bar(x + (j - (len(strategies) - 1) / 2) * width, ys, width, label=_label(s), color=cmap(j))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, models)
    ax.set_ylabel("step time / D-DPS(-F)'s")
    ax.set_title("ours: simulated P100s, analytic costs", fontsize=10)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ours = [100 * speedup(_seconds(results, m, "fddps:split=False"), _seconds(results, m, "fddps"))
            for m in models]
    paper = [100 * PAPER_TABLE7[m]["speed"] if m in PAPER_TABLE7 else np.nan for m in models]
    ax2.bar(x - 0.2, ours, 0.4, label="ours", color=cmap(2))
    ax2.bar(x + 0.2, paper, 0.4, label="paper (Table 7)", color="grey")
    ax2.set_xticks(x, models)
    ax2.set_ylabel("FD-DPS gain over D-DPS(-F) (%)")
    ax2.set_title("what splitting gains", fontsize=10)
    ax2.legend(fontsize=7)
    n = int(results.devices.iloc[0])
    fig.suptitle(f"Table 7: intra-op parallelism on {n} P100s", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=None, choices=tuple(PAPER_BATCH),
                        help=f"default: {', '.join(MODELS)} (or {', '.join(QUICK_MODELS)} "
                             "with --quick)")
    parser.add_argument("--devices", type=int, default=4, help="GPU count (default 4, the paper's)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES),
                        help="algorithm specs like fddps:split=False")
    parser.add_argument("--batch", type=int, help="batch for every model (default: the paper's)")
    parser.add_argument("--dataset", default="cifar10", choices=("cifar10", "imagenet"))
    parser.add_argument("--image-size", type=int, help="overrides the dataset's image size")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK_MODELS)} (under a minute)")
    parser.add_argument("--out", default=str(common.RESULTS / "table7.csv"),
                        help="CSV of the results; the other files go beside it")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--no-validate", action="store_true", help="skip Schedule.validate()")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    if args.devices < 2:
        parser.error("--devices must be >= 2 (splitting needs several devices)")

    t0 = time.perf_counter()
    results, splits, table6 = run(models, args.devices, args.strategies, dataset=args.dataset,
                                  image_size=args.image_size, batch=args.batch,
                                  validate=not args.no_validate, progress=not args.no_progress)
    wall = time.perf_counter() - t0
    import tensorflow as tf

    print(f"Table 7: one training step per strategy on {args.devices} simulated P100s (one host, "
          f"PCIe 3), {args.dataset} inputs, models {', '.join(models)}; TensorFlow "
          f"{tf.__version__}; one schedule per cell (deterministic algorithms, no repetitions); "
          f"{wall:.0f} s in all.")
    print(COST_MODEL_NOTE)
    print("Split candidates: Conv2D / Conv2DBackpropInput / Conv2DBackpropFilter (batch or "
          "output channels) and untransposed MatMul (rows, cols, inner) with known shapes; "
          "slice and combine costs from the same cost model. FD-DPS keeps the split graph only "
          "when its simulated step is shorter.")
    table = summary(results)
    with pd.option_context("display.width", 250, "display.max_columns", 50,
                           "display.max_colwidth", 90):
        print("\nStep time in ms (ours) and s (paper); Speed = (D-DPS(-F) - FD-DPS) / D-DPS(-F); "
              "'paper alg.' = without our refinement pass:")
        print(table.to_string(index=False))
        fd = splits[splits.strategy == "fddps"] if len(splits) else splits
        if len(fd):
            print("\nOps FD-DPS split, by model, type and dimension (Table 6 style; all decisions "
                  "in table7_splits.csv):")
            counts = (fd.groupby(["model", "op_type", "dim", "parts"]).size()
                      .rename("ops").reset_index())
            print(counts.to_string(index=False))
        if len(table6):
            print("\nTable 6, VGG-16: time on one P100 (ours: cost model; paper: measured) and "
                  "FD-DPS's decision:")
            print(table6.round(3).to_string(index=False))
        no_split = [m for m in models if not len(fd) or m not in set(fd.model)]
        if no_split:
            print(f"\nNo op split in {', '.join(no_split)}: for every candidate the estimated "
                  "split (slice + largest part + transfers + combine) is not 5% shorter than the "
                  "op whole, or the op is off the critical path (see "
                  "fddps.algorithms.split_step.plan_splits).")

    out = common.ensure_parent(args.out)
    results.to_csv(out, index=False)
    stem = Path(out).with_suffix("")
    splits.to_csv(f"{stem}_splits.csv", index=False)
    written = [str(out), f"{stem}_splits.csv"]
    if len(table6):
        table6.to_csv(f"{stem}_vgg16_ops.csv", index=False)
        written.append(f"{stem}_vgg16_ops.csv")
    if not args.no_plot:
        plot(results, f"{stem}.png")
        written.append(f"{stem}.png")
    written.append(str(write_page(out, results, wall)))
    print("\nWrote " + ", ".join(written))
    return results, splits, table6


def write_page(out, results, seconds=None, command=None):
    """The generated page ``table7.md``: the summary table as printed."""
    return common.write_results_page(
        out, "Table 7 on the current presets",
        "Step time in ms (ours) and s (paper); Speed = (D-DPS(-F) - FD-DPS) / D-DPS(-F); "
        "'paper alg.' = without our refinement pass. " + COST_MODEL_NOTE, summary(results),
        seconds=seconds, command=command)


if __name__ == "__main__":
    main()
