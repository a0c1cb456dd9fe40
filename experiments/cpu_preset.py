"""The analytic CPU preset against this machine: fit its efficiencies and per-op overhead.

``costmodel.cpu_preset()`` predicts a step on a TensorFlow CPU device from the
CPU's peak FLOP/s (cores x clock x FLOPs per cycle) and memory bandwidth. Its
efficiencies and per-op overhead were assumed (0.5 and 5 us) until this
experiment fitted them. For each model (``slim_models`` training graphs,
CIFAR-10 size):

1. **One core.** Profile the step in a session held to one thread
   (``intra_op = inter_op = 1``): each op's time on one core. Fitted from
   these (:meth:`costmodel.DevicePreset.calibrate` on ``cpu_preset(1)``): each
   op class's efficiency, as a fraction of one core's peak.
2. **As a user runs it.** Time the step in TensorFlow's default session (every
   core, inter-op parallelism): the median of ``--steps`` steps.
3. **Predict** the one-device step (``fddps.tf.place(..., algorithm="single")``,
   the sum of the step's op times) with the preset of this machine's cores:
   as it was (assumed efficiencies), and fitted. The fitted preset scales the
   one-core rates by the cores: one small op alone uses two cores poorly
   (CIFAR-size convolutions reached about a quarter of the two-core peak that
   one core's rate predicts), but TensorFlow runs independent ops side by
   side on its inter-op threads and fills the cores that one op leaves idle.
   What is left, the executor's work between ops and ``Session.run``'s own,
   is the per-op ``overhead``: fitted by least squares on the measured steps
   (one number: step = sum of op times + ops x overhead).

Each model's fitted prediction is also made *held out*: from a fit on the
other models only. The errors are relative to the measured median step.

Usage::

    python -m experiments.cpu_preset                       # resnet50, inception_v3, vgg16 (~4 min)
    python -m experiments.cpu_preset --models resnet50 --steps 3 --batch 4   # smoke
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import pandas as pd

from .common import fmt_pct, interleaved_step_times, one_core_config, save_csv_and_plot, tf_quiet

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = ("resnet50", "inception_v3", "vgg16")


def measure(name, batch, steps, warmup):
    """Profile ``name`` on one core and time its default-session step.

    Returns a dict: ``table`` (op table rows of the timed ops with ``seconds``),
    ``graph_def``, ``fetches``, ``wall`` (median default-session step, s),
    ``one_core_wall`` (median one-core step, s), ``dispatch`` (executor gap
    per op on one core, s).
    """
    import slim_models
    from fddps.tf import op_table
    from fddps.tf.profiling import profile

    m = slim_models.build_training_graph(name, batch_size=batch, image_size=32, num_classes=10)
    prof = profile(m, steps=steps, warmup=warmup, session_config=one_core_config(),
                   progress=False, meta={"model": name, "batch": batch})
    table = prof.join(op_table(m.graph_def))
    table = table[table["status"] == "timed"]
    wall = interleaved_step_times([m.graph_def], m.train_op.name, m.init_op.name, steps=steps,
                                  warmup=warmup)[0]
    return dict(table=table, graph_def=m.graph_def, fetches=[m.train_op.name, m.loss.name],
                wall=float(np.median(wall)), one_core_wall=prof.step_time(),
                dispatch=prof.dispatch_seconds)


def predicted_step(graph_def, fetches, preset):
    """``preset``'s one-device step for the graph (seconds) and the step's op count."""
    import costmodel
    import fddps

    p = fddps.tf.place(graph_def, ["/device:CPU:0"], costmodel.CostModel({"CPU": preset}),
                       algorithm="single", fetches=fetches)
    return float(p.makespan), int(p.schedule.graph.num_ops)


def run(models, batch, steps, warmup):
    import costmodel
    from dataclasses import replace

    cores = len(os.sched_getaffinity(0))
    data = {}
    for name in models:
        t0 = time.perf_counter()
        data[name] = measure(name, batch, steps, warmup)
        d = data[name]
        print(f"[{name} batch {batch}] {len(d['table'])} ops timed; one-core step "
              f"{d['one_core_wall'] * 1e3:.1f} ms (op sum {d['table'].seconds.sum() * 1e3:.1f} ms, "
              f"executor gap {d['dispatch'] * 1e6:.1f} us/op); default-session step "
              f"{d['wall'] * 1e3:.1f} ms ({time.perf_counter() - t0:.0f} s)")

    def zero_overhead(names):
        one = costmodel.cpu_preset(1).calibrate(pd.concat([data[n]["table"] for n in names],
                                                          ignore_index=True))
        return replace(costmodel.cpu_preset(cores), efficiencies=dict(one.efficiencies),
                       compute_efficiency=one.compute_efficiency,
                       memory_efficiency=one.memory_efficiency, overhead=0.0)

    def fit(names):
        zero = zero_overhead(names)
        pred = np.array([predicted_step(data[n]["graph_def"], data[n]["fetches"], zero)
                         for n in names])
        walls = np.array([data[n]["wall"] for n in names])
        # Least squares of (measured - zero-overhead step) = ops x overhead, through 0.
        overhead = float(max(0.0, np.dot(pred[:, 1], walls - pred[:, 0])
                             / np.dot(pred[:, 1], pred[:, 1])))
        return replace(zero, overhead=overhead)

    fitted = fit(models)
    assumed = costmodel.cpu_preset(cores)
    rows = []
    for name in models:
        d = data[name]
        others = [n for n in models if n != name]
        held = fit(others) if others else None
        row = dict(model=name, batch=batch, cores=cores, measured_ms=d["wall"] * 1e3,
                   one_core_ms=d["one_core_wall"] * 1e3)
        for label, preset in (("assumed", assumed), ("fitted", fitted), ("held_out", held)):
            if preset is None:
                row[f"{label}_ms"], row[f"{label}_error"] = np.nan, np.nan
                continue
            step, ops = predicted_step(d["graph_def"], d["fetches"], preset)
            row[f"{label}_ms"] = step * 1e3
            row[f"{label}_error"] = step / d["wall"] - 1
            row["step_ops"] = ops
        rows.append(row)
    df = pd.DataFrame(rows)
    effs = {k: round(v, 3) for k, v in dict(fitted.efficiencies).items()}
    print(f"\nfitted on {', '.join(models)} at batch {batch}, {cores} cores: efficiencies (of one "
          f"core's peak) {effs}, compute {fitted.compute_efficiency:.3f}, memory "
          f"{fitted.memory_efficiency:.3f}; overhead {fitted.overhead * 1e6:.1f} us per op")
    print("\n| model | step ops | measured ms (default session) | assumed preset | fitted | held out |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['step_ops']} | {r['measured_ms']:.1f} | {r['assumed_ms']:.1f} "
              f"({fmt_pct(r['assumed_error'])}) | {r['fitted_ms']:.1f} ({fmt_pct(r['fitted_error'])}) | "
              + (f"{r['held_out_ms']:.1f} ({fmt_pct(r['held_out_error'])})" if np.isfinite(r['held_out_ms']) else "-")
              + " |")
    return df, fitted


def _plot(df, png):
    from .common import matplotlib_agg

    plt = matplotlib_agg()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(df))
    cols = [("measured_ms", "measured (default session)"), ("assumed_ms", "assumed preset"),
            ("fitted_ms", "fitted preset"), ("held_out_ms", "fitted, held out")]
    w = 0.8 / len(cols)
    for k, (c, lab) in enumerate(cols):
        ax.bar(x + (k - 1.5) * w, df[c], w, label=lab)
    ax.set_xticks(x, [f"{m}\nbatch {b}" for m, b in zip(df.model, df.batch)])
    ax.set_ylabel("one-device step (ms)")
    ax.set_title(f"CPU preset vs measured step ({int(df.cores.iloc[0])} cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="experiments/results/cpu_preset.csv")
    args = ap.parse_args(argv)
    tf_quiet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df, _ = run(args.models, args.batch, args.steps, args.warmup)
    save_csv_and_plot(df, args.out, _plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
