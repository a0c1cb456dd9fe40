"""The README's TF2 quick starts placed by fddps: place() time, and step times against one device.

The Keras model is the README's quick-start CNN (two 3x3 convolutions on
32x32x3, global pooling, a dense layer; Adam). It is placed on 1 and on
``--devices`` logical CPU devices of this process
(:func:`fddps.tf.local_cpu_devices`), with ``place()``'s defaults (so with
verification: its finalists timed before it returns), and each step is timed
against ``model.train_on_batch`` on an identical model. The README's
``tf.function`` step (a linear softmax classifier) is placed the same two ways.
All five run interleaved, ``--steps`` times after two warm-up steps each, and
the medians are printed; ``x_one_device`` is the one-device placement's median
over the row's (the issue asks at least 0.97 of the verified placements).
The logical devices share this machine's cores, so the numbers say what
running the placed step costs, not what placement gains.
``max_weight_diff`` is the largest difference from Keras's weights after all
the steps (rounding: sums in another order; Adam enlarges it where a gradient
is near 0). ``verified``: the finalist verification returned.

Run: ``python -m experiments.keras_step [--devices 4] [--batch 32] [--steps 15]``;
writes ``experiments/results/keras_step.csv`` and its page ``keras_step.md``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from .common import (RESULTS, ensure_parent, quickstart_cnn, quickstart_linear_step, tf_quiet,
                     write_results_page)




def measure(devices: int = 4, batch: int = 32, steps: int = 15) -> pd.DataFrame:
    """One row per way of running the step: ``run``, ``devices``, ``nodes``,
    ``place_seconds``, ``predicted_ms``, ``step_ms`` (median), ``steps``,
    ``moved_ops`` (ops the runtime ran elsewhere than placed), ``max_weight_diff``."""
    tf_quiet()
    import fddps
    from fddps.tf import local_cpu_devices

    names = local_cpu_devices(devices)
    import keras

    rng = np.random.RandomState(0)
    x = rng.rand(batch, 32, 32, 3).astype(np.float32)
    y = rng.randint(0, 10, batch).astype(np.int32)

    def loss():
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    ref = quickstart_cnn(keras)
    ref.compile(optimizer="adam", loss=loss())
    runs = {"keras train_on_batch": (lambda: ref.train_on_batch(x, y), ref, None)}
    for n in sorted({1, devices}):
        model = quickstart_cnn(keras)
        t0 = time.perf_counter()
        p = fddps.place(model, names[:n], batch=(x, y), optimizer="adam", loss=loss())
        took = time.perf_counter() - t0
        runs[f"placed on {n}"] = ((lambda p=p: p.train_step(x, y)), model, (p, took))
    for n in sorted({1, devices}):
        step = quickstart_linear_step()
        t0 = time.perf_counter()
        p = fddps.place(step, names[:n], (x, y))
        took = time.perf_counter() - t0
        runs[f"tf.function placed on {n}"] = ((lambda p=p: p.train_step(x, y)), None, (p, took))
    times = {name: [] for name in runs}
    for k in range(2 + steps):
        for name, (step, _, _) in runs.items():
            t = time.perf_counter()
            step()
            if k >= 2:
                times[name].append(time.perf_counter() - t)
    rows = []
    for name, (_, model, placed) in runs.items():
        diff = (max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(),
                                                                  ref.get_weights()))
                if model is not None else np.nan)
        p, took = placed if placed else (None, np.nan)
        verified = (p.info.get("verified") or {}) if p else {}
        rows.append({"run": name, "devices": len(set(p.devices.values())) if p else 1,
                     "nodes": p.info["nodes"] if p else np.nan, "place_seconds": took,
                     "predicted_ms": p.makespan * 1e3 if p else np.nan,
                     "step_ms": float(np.median(times[name])) * 1e3, "steps": steps,
                     "moved_ops": len(p.moved_ops()) if p else 0, "max_weight_diff": diff,
                     "verified": (f"not verified: {verified['reason']}" if verified.get("reason")
                                  else verified.get("returned", ""))})
    df = pd.DataFrame(rows)
    # Against the same step placed on one device, as place() itself compares.
    one = {"placed": df.step_ms[df.run == "placed on 1"].iloc[0],
           "tf.function": df.step_ms[df.run == "tf.function placed on 1"].iloc[0]}
    df["x_one_device"] = [one["tf.function" if r.startswith("tf.function") else "placed"] / t
                          for r, t in zip(df.run, df.step_ms)]
    return df


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=4, help="logical CPU devices (default 4)")
    ap.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per run (default 15)")
    ap.add_argument("--out", default=str(RESULTS / "keras_step.csv"), help="CSV to write")
    args = ap.parse_args(argv)
    df = measure(args.devices, args.batch, args.steps)
    print(f"README CNN, batch {args.batch}, Adam; {args.devices} logical CPU devices sharing this "
          f"machine's cores; step time = median of {args.steps} interleaved steps after 2 "
          "warm-ups; max_weight_diff: largest |weight - Keras's weight| at the end")
    with pd.option_context("display.width", 140, "display.precision", 4):
        print(df.to_string(index=False))
    out = ensure_parent(args.out)
    df.to_csv(out, index=False)
    print(f"results: {out}")
    write_results_page(
        out, "The README's TF2 quick starts, placed and timed",
        " ".join(__doc__.split("\n\n")[1].split()) + f" Batch {args.batch}, "
        f"{args.steps} timed steps; {args.devices} logical devices.", df=df)
    return 0


if __name__ == "__main__":
    sys.exit(main())
