"""What one small transfer adds to a busy 2-worker step: alone on the critical path,
or among many at once.

Issue 12's split strategies are predicted 32-92% slow on the 2-worker
``local_cluster`` with the default transfer cost (each transfer's time ``T``
charged ``T / 2`` to each end's CPU), and within about 15% with a CPU cost fitted
on *concurrent* transfers (``Cluster.transfer_cpu``, ~60 us per small
tensor). But with the concurrent fit FD-DPS spread Inception-V3 over both
workers (962 transfers, most of them small and one after another) and ran
at 0.72x one worker where it predicted 1.0x. This experiment measures the
difference directly, on the same cluster.

Both workers run a chain of ``--ops`` small MatMuls (``--size`` square, so
one op is ~0.1 ms and each worker's single executor thread is busy all step).
On top, ``k`` small tensors (``--bytes``) cross between the workers:

- **chain**: one after another, each hop an ``Add`` on the other worker
  reading the previous hop's output: every transfer alone, as in FD-DPS's
  spread of a branchy graph;
- **burst**: ``k/2`` independent tensors each way, all at once at the step's
  start, as a sample-split step sends its parts.

The added step time per transfer is ``(median step with k transfers - median
step without) / k``, in one run, alternating the variants step by step so
that drift hits all alike. The chain's own latency (``k`` hops of ~0.2 ms)
stays far below the compute (checked: the chain alone is printed).

Run::

    python -m experiments.transfer_overlap                      # k = 64, 256; ~1 min
    python -m experiments.transfer_overlap --counts 16 --ops 200 --steps 3   # smoke size

Prints a table and writes ``experiments/results/transfer_overlap.csv``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from experiments.common import RESULTS, ensure_parent

VARIANTS = ("none", "chain", "burst", "chain only")


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    return tf


def build(devices, variant, k, ops=3000, size=128, nbytes=1024):
    """The step's graph and its fetch: compute chains on both devices plus ``variant``'s
    ``k`` transfers (``"none"``: compute only; ``"chain only"``: the chain without the
    compute, to check its own length)."""
    tf = _tf()
    g = tf.Graph()
    fetch = []
    n = max(nbytes // 4, 1)
    with g.as_default():
        # Fed, not constant: grappler would fold a chain of constants away.
        seed = tf.compat.v1.placeholder(tf.float32, [], name="seed")
        if variant != "chain only":
            for t, dev in enumerate(devices):
                with tf.device(dev):
                    x = tf.fill([size, size], seed + t)
                    w = tf.fill([size, size], seed / size)
                    for _ in range(ops):
                        x = tf.matmul(x, w)
                    fetch.append(tf.reduce_sum(x))
        if variant in ("chain", "chain only"):
            with tf.device(devices[0]):
                y = tf.fill([n], seed)
            for i in range(k):
                with tf.device(devices[(i + 1) % 2]):
                    y = y + 1.0
            with tf.device(devices[k % 2]):
                fetch.append(tf.reduce_sum(y))
        elif variant == "burst":
            for t, dev in enumerate(devices):
                with tf.device(dev):
                    sent = [tf.fill([n], seed + j) for j in range(k // 2)]
                with tf.device(devices[1 - t]):
                    fetch.append(tf.add_n([s + 1.0 for s in sent]))
        with tf.device(devices[0]):
            out = tf.add_n([tf.reduce_sum(f) for f in fetch])
    return g, out.name, seed.name


def run(counts=(64, 256), ops=3000, size=128, nbytes=1024, steps=9, warmup=2, log=print):
    from fddps.tf import local_cluster

    tf = _tf()
    rows = []
    with local_cluster(2, threads_per_worker=1) as cluster:
        for k in counts:
            sessions = {}
            graphs = {v: build(cluster.devices, v, k, ops, size, nbytes) for v in VARIANTS}
            try:
                for v, (g, _, _) in graphs.items():
                    sessions[v] = tf.compat.v1.Session(cluster.target, graph=g,
                                                       config=cluster.session_config())
                times = {v: [] for v in VARIANTS}
                for i in range(warmup + steps):
                    for v in VARIANTS:  # alternate: drift hits every variant alike
                        t = time.perf_counter()
                        sessions[v].run(graphs[v][1], {graphs[v][2]: 1.0})
                        if i >= warmup:
                            times[v].append(time.perf_counter() - t)
            finally:
                for s in sessions.values():
                    s.close()
            base = float(np.median(times["none"]))
            for v in VARIANTS:
                med = float(np.median(times[v]))
                rows.append(dict(transfers=k, variant=v, bytes=nbytes, ops=ops, size=size,
                                 steps=steps, median_ms=med * 1e3,
                                 added_us_per_transfer=(med - base) / k * 1e6
                                 if v in ("chain", "burst") else np.nan))
            log(f"k={k}: " + ", ".join(f"{r['variant']} {r['median_ms']:.1f} ms"
                                       for r in rows[-len(VARIANTS):]))
    return pd.DataFrame(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=int, nargs="+", default=[64, 256])
    p.add_argument("--ops", type=int, default=3000, help="MatMuls per worker's chain")
    p.add_argument("--size", type=int, default=128, help="the MatMuls' square size")
    p.add_argument("--bytes", type=int, default=1024, help="bytes per transfer")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "transfer_overlap.csv"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    df = run(args.counts, args.ops, args.size, args.bytes, args.steps, args.warmup)
    df.to_csv(ensure_parent(args.out), index=False)
    print(f"\n2 workers (local_cluster, 1 thread each), both running {args.ops} "
          f"{args.size}x{args.size} MatMuls; {args.bytes}-byte transfers; median of "
          f"{args.steps} steps, variants alternated; {time.perf_counter() - t0:.0f} s.\n")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    return df


if __name__ == "__main__":
    main()
