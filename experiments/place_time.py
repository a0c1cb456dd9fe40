"""`place()`'s wall-clock seconds by stage, next to TensorFlow's own import of the same graph.

For the six ``slim_models`` networks (batch 8, CIFAR size, 4 simulated P100s,
``fetches=[train_op, loss]``, the default algorithm) and README's Keras quick
start (4 CPU devices of this process), times in one process, interleaved
(round by round: TensorFlow's ``import_graph_def`` of the GraphDef into a fresh
graph, then ``place()`` of it):

- ``import_s``: ``tf.compat.v1.import_graph_def`` of the same GraphDef (for the
  Keras step: of the traced step's GraphDef), median of the rounds;
- ``place_s``: ``place()``'s wall time, median of the rounds, split into the
  stages ``place()`` reports in ``Placement.info``: ``read_s`` (load and analyse
  the graph once, cost its ops), ``decide_s`` (the scheduler), ``write_s`` (write the placed
  graph and predict its step); ``trace_s`` is the rest of the call: for the
  Keras step, tracing the training step into a graph; for a GraphDef, what
  ``place()`` does outside the three stages;
- ``ratio``: ``place_s / import_s`` (issue 27 asks for at most 2).

Ratios inside one run cancel most of the machine's drift; a loaded machine
moves the stages differently, so compare runs only as ratios.

Each timed import and each timed ``place()`` starts after a full ``gc.collect()``
(not timed): Python's cyclic collector otherwise charges one side with the
other's garbage (the imported graph's ops form cycles; ``place()`` holds the
collector off while it runs, leaving its collection to whatever runs next).

Rounds: at least ``--rounds`` per case, and for a network more (at most 15)
while its rounds have taken under ``--min-seconds`` in all: a graph that
imports in a tenth of a second gets the median of a dozen rounds, not of three.

Run::

    python -m experiments.place_time                     # six networks + quick start
    python -m experiments.place_time --models vgg16 --rounds 1 --min-seconds 0 --no-quickstart   # smoke

Writes ``experiments/results/place_time.csv``, ``place_time.png`` (stacked
stages against the import) and the page ``place_time.md``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

from fddps.algorithms import list_pass_jit

from experiments.common import (MODELS, build_model, device_names, ensure_parent, matplotlib_agg,
                                quickstart_cnn, tf_quiet, write_results_page)

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = ("trace_s", "read_s", "decide_s", "write_s")
MAX_ROUNDS = 15
# trace_s is the call's time outside the three stages: tracing, for a Keras model.
STAGE_LABELS = {"trace_s": "place(): trace (Keras), else outside the stages"}


def import_seconds(graph_def) -> float:
    """Seconds of TensorFlow's ``import_graph_def`` of ``graph_def`` into a fresh graph."""
    import tensorflow as tf

    gc.collect()  # not timed: the garbage of what ran before is not the import's
    t = time.perf_counter()
    with tf.Graph().as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    return time.perf_counter() - t


def _row(case, nodes, imports, places, infos, totals=None) -> dict:
    """Medians over the rounds; the stage split of the round whose place() was the median."""
    k = sorted(range(len(places)), key=places.__getitem__)[len(places) // 2]
    info = infos[k]
    read, decide, write = (float(info.get(key, 0.0)) for key in
                           ("read_seconds", "decide_seconds", "write_seconds"))
    total = places[k] if totals is None else totals[k]
    row = dict(case=case, nodes=nodes, rounds=len(places),
               import_s=statistics.median(imports), place_s=total,
               trace_s=max(total - float(info.get("place_seconds", total)), 0.0),
               read_s=read, decide_s=decide, write_s=write)
    row["ratio"] = row["place_s"] / row["import_s"]
    return row


def _more_rounds(done, rounds, spent, min_seconds, max_rounds=MAX_ROUNDS) -> bool:
    """Whether a case runs another round: at least ``rounds``, then more while its rounds
    have taken under ``min_seconds`` in all (at most ``max_rounds``), so that a case
    whose round takes a fraction of a second gets a median of many rounds, not of
    three (VGG-16's import took 0.06-0.15 s within one run)."""
    return done < rounds or (spent < min_seconds and done < max_rounds)


def network_row(name, rounds, batch=8, devices=4, progress=print, min_seconds=0.0) -> dict:
    """One network: interleaved rounds of import and ``place()`` (see :func:`_more_rounds`)."""
    import fddps
    from costmodel import default_cost_model

    cost_model = default_cost_model("p100")
    model = build_model(name, batch)
    fetches = [model.train_op.name, model.loss.name]
    imports, places, infos = [], [], []
    while _more_rounds(len(places), rounds, sum(imports) + sum(places), min_seconds):
        r = len(places)
        imports.append(import_seconds(model.graph_def))
        gc.collect()  # not timed: the import's garbage is not place()'s
        t = time.perf_counter()
        p = fddps.place(model.graph_def, device_names(devices), cost_model=cost_model,
                        fetches=fetches)
        places.append(time.perf_counter() - t)
        infos.append(p.info)
        progress(f"  {name} round {r + 1}: import {imports[-1]:.2f} s, "
                 f"place {places[-1]:.2f} s")
    return _row(f"{name} b{batch} {devices}xP100", len(model.graph_def.node),
                imports, places, infos)


def quickstart_row(rounds, progress=print) -> dict:
    """README's Keras quick start on 4 CPU devices: trace + place, against importing its step."""
    import keras
    import numpy as np

    import fddps
    from fddps.tf import local_cpu_devices

    devices = local_cpu_devices(4)
    x = np.random.default_rng(0).random((32, 32, 32, 3), dtype=np.float32)
    y = np.random.default_rng(1).integers(0, 10, 32)
    imports, places, infos = [], [], []
    nodes = 0
    for r in range(rounds):
        model = quickstart_cnn(keras)
        gc.collect()  # not timed, as for the networks
        t = time.perf_counter()
        p = fddps.place(model, devices, batch=(x, y), optimizer="adam",
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        places.append(time.perf_counter() - t)
        infos.append(p.info)
        nodes = len(p.graph_def.node)
        imports.append(import_seconds(p.graph_def))
        progress(f"  keras quick start round {r + 1}/{rounds}: import {imports[-1]:.3f} s, "
                 f"place {places[-1]:.2f} s")
    return _row("keras quick start 4xCPU", nodes, imports, places, infos)


def plot(df: pd.DataFrame, path) -> Path:
    """Stacked stages of ``place()`` beside the import, per case (seconds)."""
    plt = matplotlib_agg()
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(df) + 1.6))
    y = range(len(df))
    left = [0.0] * len(df)
    colors = {"trace_s": "#bbbbbb", "read_s": "#4c72b0", "decide_s": "#dd8452",
              "write_s": "#55a868"}
    for stage in STAGES:
        widths = df[stage].tolist()
        if not any(widths):
            continue
        ax.barh([v + 0.2 for v in y], widths, left=left, height=0.38, color=colors[stage],
                label=STAGE_LABELS.get(stage, f"place(): {stage[:-2]}"))
        left = [a + b for a, b in zip(left, widths)]
    ax.barh([v - 0.2 for v in y], df["import_s"], height=0.38, color="#222222",
            label="TensorFlow import_graph_def")
    for v, (total, ratio) in enumerate(zip(df["place_s"], df["ratio"])):
        ax.text(total, v + 0.2, f"  {ratio:.2f}x", va="center", fontsize=8)
    ax.set_yticks(list(y))
    ax.set_yticklabels(df["case"])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12 * max(df["place_s"].max(), df["import_s"].max()))
    ax.set_xlabel("seconds (median of the rounds)")
    ax.set_title("place() by stage vs TensorFlow's import of the same GraphDef")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    ensure_parent(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_page(out, df: pd.DataFrame, command: str, seconds: float,
               warm_up_s: float | None = None) -> Path:
    """The generated page ``place_time.md`` (see :func:`experiments.common.write_results_page`)."""
    within = int((df["ratio"] <= 2.0).sum())
    compiled = ("The compiled list pass (numba) was not available: every pass ran in Python."
                if warm_up_s is None else
                f"The compiled list pass (numba) was loaded before the rounds, in {warm_up_s:.2f} s: "
                "what a process pays once, at its first `place()` of a graph of at least "
                f"{list_pass_jit.MIN_OPS_TO_LOAD:,} ops (smaller graphs run the passes in Python until then).")
    return write_results_page(
        out, "`place()`'s seconds by stage",
        "`import_s`: TensorFlow's `import_graph_def` of the same GraphDef into a fresh graph "
        "(the Keras step: of its traced step); `place_s`: `fddps.place()` with the default "
        "algorithm; both medians of interleaved rounds. The stages are those `place()` reports "
        "(`Placement.info`): `read` (load and analyse once, cost the ops), `decide` (the scheduler), "
        "`write` (write the placed graph, predict its step); `trace` is the rest of the call: "
        "tracing the training step for the Keras model, for a GraphDef what `place()` does "
        "outside its three stages. `ratio` = place_s / import_s. Timings comparable only as ratios "
        f"inside one run. Within 2x TensorFlow's import: {within} of {len(df)} cases. "
        + compiled,
        df[["case", "nodes", "rounds", "import_s", "place_s", "ratio", *STAGES]],
        command=command, seconds=seconds, after="![place() by stage](place_time.png)",
        floats="{:.3g}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per case, at least")
    ap.add_argument("--min-seconds", type=float, default=5.0,
                    help="more rounds (up to %d) while a network's rounds took less in all"
                         % MAX_ROUNDS)
    ap.add_argument("--no-quickstart", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "place_time.csv"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    tf_quiet()
    start = time.perf_counter()
    warm_up_s = None
    if list_pass_jit.AVAILABLE:  # paid once per process: measured and reported, not in a round
        warm_up_s = list_pass_jit.warm_up()
        print(f"compiled list pass loaded in {warm_up_s:.2f} s")
    rows = []
    if not args.no_quickstart:  # first: local_cpu_devices must run before other TF work
        rows.append(quickstart_row(args.rounds))
    for name in args.models:
        rows.append(network_row(name, args.rounds, min_seconds=args.min_seconds))
    df = pd.DataFrame(rows)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    out = ensure_parent(args.out)
    df.to_csv(out, index=False)
    plot(df, out.with_suffix(".png"))
    command = "python -m experiments.place_time" + (
        " " + " ".join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else "")
    write_page(out, df, command, time.perf_counter() - start, warm_up_s)
    print(f"wrote {out}, {out.with_suffix('.png')}, {out.with_suffix('.md')}")
    return df


if __name__ == "__main__":
    main()
