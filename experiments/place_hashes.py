"""Fingerprints of what :func:`fddps.place` writes, to show a refactoring changed nothing.

For the six ``slim_models`` networks (batch 8, CIFAR size, 4 simulated P100s,
``fetches=[train_op, loss]``, the default algorithm) and README's two quick
starts (the Keras CNN and the ``tf.function`` step on 4 CPU devices of this
process), prints the SHA-256 of the placed GraphDef (deterministic
serialization) and the predicted step. Run it before and after a change, on
the same machine (the quick starts use this CPU's preset), and compare.

Run::

    python -m experiments.place_hashes                  # all eight cases
    python -m experiments.place_hashes --models vgg16 --no-quickstart
    python -m experiments.place_hashes --out hashes.csv   # also as CSV
"""

from __future__ import annotations

import argparse
import hashlib

import pandas as pd

from experiments.common import (MODELS, build_model, device_names, quickstart_cnn,
                                quickstart_linear_step, tf_quiet)


def digest(graph_def) -> str:
    """SHA-256 (first 16 hex digits) of a GraphDef's deterministic serialization."""
    return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()[:16]


def network_rows(models, batch=8, devices=4):
    """One row per network: ``case``, ``sha256``, ``makespan_ms``, ``place_s``."""
    import time

    import fddps
    from costmodel import default_cost_model

    cost_model = default_cost_model("p100")
    rows = []
    for name in models:
        model = build_model(name, batch)
        t = time.perf_counter()
        p = fddps.place(model.graph_def, device_names(devices), cost_model=cost_model,
                        fetches=[model.train_op.name, model.loss.name])
        rows.append(dict(case=f"{name} b{batch} {devices}xP100", sha256=digest(p.graph_def),
                         makespan_ms=p.makespan * 1e3, place_s=time.perf_counter() - t))
        print(rows[-1], flush=True)
    return rows


def quickstart_rows():
    """README's Keras and ``tf.function`` quick starts on 4 CPU devices of this process."""
    import time

    import keras
    import numpy as np

    import fddps
    from fddps.tf import local_cpu_devices

    devices = local_cpu_devices(4)
    model = quickstart_cnn(keras)
    x = np.random.default_rng(0).random((32, 32, 32, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 32)
    rows = []
    t = time.perf_counter()
    # verify=False: the fingerprint of the decision, not of which finalist measured fastest.
    p = fddps.place(model, devices, batch=(x, y), optimizer="adam",
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    verify=False)
    rows.append(dict(case="keras quick start", sha256=digest(p.graph_def),
                     makespan_ms=p.makespan * 1e3, place_s=time.perf_counter() - t))
    print(rows[-1], flush=True)

    train_step = quickstart_linear_step(stddev=0.0)

    t = time.perf_counter()
    q = fddps.place(train_step, devices, (x, y), verify=False)
    rows.append(dict(case="tf.function quick start", sha256=digest(q.graph_def),
                     makespan_ms=q.makespan * 1e3, place_s=time.perf_counter() - t))
    print(rows[-1], flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--no-quickstart", action="store_true")
    p.add_argument("--out", help="also write the rows as CSV here")
    args = p.parse_args(argv)
    tf_quiet()
    rows = []
    if not args.no_quickstart:  # first: local_cpu_devices must run before other TF work
        rows += quickstart_rows()
    rows += network_rows(args.models)
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    if args.out:
        df.to_csv(args.out, index=False)
    return df


if __name__ == "__main__":
    main()
