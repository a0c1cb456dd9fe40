"""Sharded variables: Tofu's writable plans with variables whole versus written as shards.

For each model (``slim_models``, small enough to run on CPU), on 4 CPU devices
of this process, each with a simulated capacity of ``--capacity`` times the
model's weights and optimizer slots (the p100 cost model's speeds; so that one
device cannot hold the step):

- plans ``Tofu(writable=True)`` twice: ``split_variables=False`` (variables,
  their reads and updates whole, spread over the devices by bytes: what the
  rewrite could write before shard variables) and ``True`` (variable groups
  the rewrite writes as shard variables are partitioned with their ops);
- reports whether the plan fits, the simulated largest per-device peak, the
  bytes Tofu's DP communicates, the predicted step time, the number of
  variables written as shards, and the largest variable bytes any device
  holds in the written GraphDef (from its ``VarHandleOp`` shapes);
- runs the original and the written graph (``fddps.place(...,
  algorithm="tofu")``) for ``--steps`` steps on 4 CPU devices: the relative
  difference (``|a - b| / |b|``) of the losses and the largest of every
  variable's (read by its ``Read/ReadVariableOp`` name), and the median wall
  time of ``--timed``
  more steps of each (noisy: the 4 CPU devices share this machine's cores;
  compare as a ratio within one run).

Writes ``experiments/results/sharded_variables.csv`` and a PNG of the per-device
variable bytes and peaks.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from experiments.common import build_model, matplotlib_agg, save_csv_and_plot, tf_quiet

#: label -> (slim_models name, batch, image size, model options)
MODELS = {
    "vgg16": ("vgg16", 4, 32, {}),
    "rnn_lm": ("rnn_lm", 4, None, dict(num_layers=2, hidden_size=64, vocab_size=500,
                                       seq_length=4, embedding_size=64)),
    "wrn50-0.25": ("wide_resnet", 8, 32, dict(depth=50, width=0.25)),
}
QUICK = {"rnn_lm": ("rnn_lm", 2, None, dict(num_layers=1, hidden_size=32, vocab_size=100,
                                            seq_length=3, embedding_size=32))}
CPUS = [f"/device:CPU:{i}" for i in range(4)]


def variable_bytes(graph_def) -> dict:
    """Device -> bytes of the variables (``VarHandleOp`` shapes) placed on it."""
    import tensorflow as tf

    out = dict.fromkeys(CPUS, 0.0)
    for node in graph_def.node:
        if node.op == "VarHandleOp":
            shape = [d.size for d in node.attr["shape"].shape.dim]
            size = tf.as_dtype(node.attr["dtype"].type).size
            out[node.device] = out.get(node.device, 0.0) + float(np.prod(shape)) * size
    return out


def _run(graph_def, model, steps, timed):
    """Losses of ``steps`` steps, every variable after them, and ``timed`` more steps' wall times."""
    import tensorflow as tf

    v1 = tf.compat.v1
    config = v1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False)
    reads = [f"{v.op.name}/Read/ReadVariableOp:0" for v in model.trainable_variables]
    fetches = [model.train_op.name, model.loss.name]
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with v1.Session(graph=graph, config=config) as sess:
            sess.run(model.init_op.name)
            losses = [sess.run(fetches)[1] for _ in range(steps)]
            values = sess.run(reads)
            times = []
            for _ in range(timed):
                t = time.perf_counter()
                sess.run(fetches)
                times.append(time.perf_counter() - t)
    return np.array(losses), values, times


def _rel(a, b):
    """``|a - b| / |b|`` (Euclidean norms): a tensor's relative difference."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run_model(label, spec, capacity_factor, steps, timed):
    import fddps
    from costmodel import default_cost_model
    from fddps.tf.strategy_graph import step_graph

    name, batch, image_size, options = spec
    model = build_model(name, batch, image_size=image_size, model_options=options)
    fetches = [model.train_op.name, model.loss.name]
    step = step_graph(model.graph_def, fetches)
    weights = sum(op.param_bytes for op in step.ops.values())
    capacity = capacity_factor * weights
    cm = default_cost_model("p100")
    print(f"{label}: {len(step)} ops, weights and slots {weights / 1e6:.2f} MB, capacity "
          f"{capacity / 1e6:.2f} MB per device", flush=True)
    ref_loss, ref_vars, ref_times = _run(model.graph_def, model, steps, timed)
    rows = []
    for sharded in (False, True):
        row = dict(model=label, batch=batch, ops=len(step), weights_mb=weights / 1e6,
                   capacity_mb=capacity / 1e6, split_variables=sharded)
        t = time.perf_counter()
        try:
            p = fddps.place(model.graph_def, CPUS, cost_model=cm, memory=capacity,
                            fetches=fetches, algorithm="tofu", split_variables=sharded)
        except fddps.errors.InfeasibleError as err:
            rows.append(dict(row, fits=False, peak_max_mb=err.needed / 1e6,
                             place_seconds=time.perf_counter() - t))
            print(f"  split_variables={sharded!s:5}: does not fit ({err.needed / 1e6:.2f} MB)")
            continue
        held = variable_bytes(p.graph_def)
        loss, values, times = _run(p.graph_def, model, steps, timed)
        row.update(fits=True, peak_max_mb=float(p.peak_memory.max()) / 1e6,
                   comm_mb=p.info["comm_bytes"] / 1e6, predicted_ms=p.makespan * 1e3,
                   sharded=len(p.sharded_variables),
                   variables=sum(1 for n in model.graph_def.node if n.op == "VarHandleOp"),
                   variable_mb_max=max(held.values()) / 1e6,
                   variable_mb_min=min(held.values()) / 1e6,
                   loss_rel=_rel(loss, ref_loss),
                   vars_rel=max(_rel(a, b) for a, b in zip(values, ref_vars)),
                   step_ms=float(np.median(times)) * 1e3 if times else np.nan,
                   original_ms=float(np.median(ref_times)) * 1e3 if ref_times else np.nan,
                   place_seconds=time.perf_counter() - t)
        rows.append(row)
        print(f"  split_variables={sharded!s:5}: peak {row['peak_max_mb']:.2f} MB, DP moves "
              f"{row['comm_mb']:.2f} MB, predicted {row['predicted_ms']:.3f} ms; "
              f"{row['sharded']}/{row['variables']} variables sharded, variables per device "
              f"{row['variable_mb_min']:.2f}-{row['variable_mb_max']:.2f} MB; loss rel diff "
              f"{row['loss_rel']:.1e}, variables {row['vars_rel']:.1e}; wall "
              f"{row['step_ms']:.1f} ms/step (original {row['original_ms']:.1f})", flush=True)
    return rows


def _plot(df, png):
    plt = matplotlib_agg()
    models = list(dict.fromkeys(df["model"]))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(models) + 2), 3.4))
    width = 0.2
    for j, (sharded, col, what) in enumerate([(False, "variable_mb_max", "variables, whole"),
                                              (True, "variable_mb_max", "variables, sharded"),
                                              (False, "peak_max_mb", "simulated peak, whole"),
                                              (True, "peak_max_mb", "simulated peak, sharded")]):
        sub = df[df["split_variables"] == sharded].set_index("model").reindex(models)
        ratio = sub[col].to_numpy(dtype=float) / sub["capacity_mb"].to_numpy(dtype=float)
        x = np.arange(len(models)) + (j - 1.5) * width
        ax.bar(x, np.nan_to_num(ratio), width, label=what)
        for xi, fits in zip(x, sub["fits"]):
            if fits is False or fits == 0:  # no plan fits: nothing written (peak: the least reached)
                if col == "variable_mb_max":
                    ax.text(xi, 0.01, "no fit", rotation=90, fontsize=6, ha="center", va="bottom")
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="capacity")
    ax.set(xticks=np.arange(len(models)), ylabel="largest device / capacity",
           title="tofu (writable), 4 devices: largest per-device bytes")
    ax.set_xticklabels(models, fontsize=8)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one small model, fewer steps")
    p.add_argument("--models", default="", help=f"comma-separated of {sorted(MODELS)}")
    p.add_argument("--capacity", type=float, default=1.25,
                   help="per-device capacity, times the weights and slots")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--timed", type=int, default=5)
    p.add_argument("--out", default="experiments/results/sharded_variables.csv")
    args = p.parse_args(argv)
    tf_quiet()
    table = QUICK if args.quick else MODELS
    names = [m for m in args.models.split(",") if m] or list(table)
    for m in names:
        if m not in table:
            raise SystemExit(f"unknown model {m!r}; choose from {sorted(table)}")
    print(f"tofu(writable) on {len(CPUS)} CPU devices of one process, p100 cost model, capacity "
          f"{args.capacity} x weights+slots; {args.steps} steps compared, {args.timed} timed "
          "(wall times share this machine's cores: compare as ratios)", flush=True)
    rows = []
    for m in names:
        rows += run_model(m, table[m], args.capacity, args.steps,
                          0 if args.quick else args.timed)
    df = pd.DataFrame(rows)
    save_csv_and_plot(df, args.out, _plot)
    return df


if __name__ == "__main__":
    main()
