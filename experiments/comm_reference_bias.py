"""How much of a one-at-a-time transfer's measured time is the source task joining the step.

:func:`fddps.tf.comm_bench.measure_transfers` times a transfer as a step that
moves a tensor from ``src`` to ``dst`` minus a reference step with the tensor
already on ``dst``. The reference step runs on ``dst``'s task alone; the
transfer step also runs on ``src``'s. When ``dst`` is task 0 (the session's
master, in-process), the difference therefore also holds the RunGraph call
to ``src``'s task, which a step using both tasks pays once, not per
transfer. This times, on two ``local_cluster`` workers, each direction and
size four ways, in interleaved rounds (medians): ``moved`` and ``reference``
as ``measure_transfers`` runs them, and ``moved_both`` and
``reference_both``, each also fetching a 4-byte tensor from ``src``'s task,
so that both steps use both tasks. ``as_measured`` = moved - reference;
``both_tasks`` = moved_both - reference_both.

Run::

    python -m experiments.comm_reference_bias              # 60 rounds, 4 B and 1 MB
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from experiments import common


def measure(rounds=60, sizes=(4, 1 << 20), warmup=3) -> pd.DataFrame:
    """One row per direction and size: the four steps' median seconds and the two differences."""
    common.tf_quiet()
    import tensorflow as tf

    from fddps.tf import local_cluster

    tf1 = tf.compat.v1
    with local_cluster(2, threads_per_worker=1) as cluster:
        d0, d1 = cluster.devices[:2]
        graph, steps = tf.Graph(), {}
        with graph.as_default():
            for src, dst, direction in ((d0, d1, "task 0 -> 1"), (d1, d0, "task 1 -> 0")):
                for nbytes in sizes:
                    tag = f"{direction[5]}{direction[-1]}_{nbytes}"
                    n = max(1, nbytes // 4)

                    def var(name, shape):
                        return tf1.get_variable(f"{name}_{tag}", shape, use_resource=True,
                                                initializer=tf1.zeros_initializer()).read_value()

                    with tf1.device(src):
                        value, ping = var("value", [n]), tf.identity(var("ping", [1]))
                    with tf1.device(dst):
                        moved = tf.slice(value, [0], [1])
                        reference = tf.slice(var("local", [n]), [0], [1])
                    steps[direction, nbytes] = dict(moved=[moved], reference=[reference],
                                                    moved_both=[moved, ping],
                                                    reference_both=[reference, ping])
            init = tf1.global_variables_initializer()
        keys = [(k, v) for k in steps for v in steps[k]]
        times = {k: [] for k in keys}
        with tf1.Session(cluster.target, graph=graph) as sess:
            sess.run(init)
            rng = np.random.default_rng(0)
            for r in range(-warmup, rounds):
                for i in rng.permutation(len(keys)):  # a fresh order every round
                    k, v = keys[i]
                    t0 = time.perf_counter()
                    sess.run(steps[k][v])
                    if r >= 0:
                        times[k, v].append(time.perf_counter() - t0)
    rows = []
    for (direction, nbytes), fetches in steps.items():
        med = {v: float(np.median(times[(direction, nbytes), v])) for v in fetches}
        rows.append(dict(direction=direction, bytes=nbytes, rounds=rounds,
                         **{f"{v}_us": med[v] * 1e6 for v in fetches},
                         as_measured_us=(med["moved"] - med["reference"]) * 1e6,
                         both_tasks_us=(med["moved_both"] - med["reference_both"]) * 1e6))
    return pd.DataFrame(rows)


WHAT = ("Medians of interleaved steps on two `local_cluster` workers (one thread each). "
        "`as_measured_us`: the transfer as `comm_bench.measure_transfers` times it (moved - "
        "reference); `both_tasks_us`: the same with a 4-byte tensor also fetched from the "
        "source task in both steps, so that the reference step uses both tasks too.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 1 << 20])
    parser.add_argument("--out", default=str(common.RESULTS / "comm_reference_bias.csv"))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    df = measure(args.rounds, args.sizes)
    out = common.ensure_parent(args.out)
    df.to_csv(out, index=False)
    common.write_results_page(out, "What the reference step leaves in a transfer's time", WHAT,
                              df, seconds=time.perf_counter() - t0, floats="{:.0f}")
    print(df.round(0).to_string(index=False))
    print(f"results: {out}, {out.with_suffix('.md')}")
    return df


if __name__ == "__main__":
    main()
