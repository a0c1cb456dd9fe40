"""How far a fitted link moves between measurements of the same two workers, by repeats.

``experiments.real_cluster`` fits each cell's link (latency and bandwidth per
direction, :func:`fddps.tf.comm_bench.fit_links`, and the per-transfer CPU
cost of concurrent transfers, :func:`~fddps.tf.comm_bench.fit_transfer_cpu`)
on 5 repeats per size, once per cell. Three fresh clusters of the same three
cells (2026-12-07, 23:00-23:30) measured the same placements' speed-ups with
a spread of 6% (median standard deviation of the log) and predicted them
with a spread of 10%; with every cell's fit replaced by the median fit the
predictions' spread fell to 2%. So the link fit, not the profile, moves
the predictions.

This measures the link ``--fits`` times in a row on one ``local_cluster``
(each fit as ``real_cluster`` measures it: every size one at a time, then
the concurrent sizes and counts, ``--repeats`` rounds each) and fits each
on its first ``n`` rounds for each ``n`` of ``--subsets``: how much the fit
moves from one measurement to the next with ``n`` rounds, and what ``n``
rounds cost.

Run::

    python -m experiments.link_fit_noise                     # 4 fits of 15 rounds: ~3 min
    python -m experiments.link_fit_noise --fits 2 --repeats 2 --subsets 1 2   # smoke size
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from experiments import common

PARAMETERS = ("latency_us", "bandwidth_GBps", "cpu_latency_us", "cpu_bandwidth_GBps")


def measure(fits=4, repeats=15, progress=True) -> pd.DataFrame:
    """``fits`` measurements of both directions, ``repeats`` rounds each: one row per step
    (:func:`~fddps.tf.comm_bench.measure_transfers`'s columns, with ``fit``, ``kind``
    (``one`` or ``concurrent``) and ``fit_seconds``, the wall time of that fit)."""
    common.tf_quiet()
    from tqdm.auto import tqdm

    from fddps.tf import local_cluster
    from fddps.tf.comm_bench import (CONCURRENT_COUNTS, CONCURRENT_SIZES, DEFAULT_SIZES,
                                     measure_transfers)

    parts = []
    with local_cluster(2, threads_per_worker=1) as cluster:
        for k in tqdm(range(fits), desc="link fits", disable=not progress):
            t0 = time.perf_counter()
            one = measure_transfers(cluster.devices, DEFAULT_SIZES, repeats=repeats,
                                    target=cluster.target, progress=False)
            concurrent = measure_transfers(cluster.devices, CONCURRENT_SIZES,
                                           counts=CONCURRENT_COUNTS, repeats=repeats,
                                           target=cluster.target, progress=False)
            seconds = time.perf_counter() - t0
            parts += [one.assign(fit=k, kind="one", fit_seconds=seconds),
                      concurrent.assign(fit=k, kind="concurrent", fit_seconds=seconds)]
    return pd.concat(parts, ignore_index=True)


def fits_by_rounds(raw: pd.DataFrame, subsets) -> pd.DataFrame:
    """Each fit refitted on its first ``n`` rounds, per ``n`` of ``subsets``: one row per fit,
    ``n`` and direction with :data:`PARAMETERS`.

    Examples
    --------
    >>> rows = [dict(src=s, dst=d, bytes=b, count=c, repeat=r, fit=0, kind=kind,
    ...              seconds=1e-4 + b * c / 1e9 + (c - 1) * (2e-5 + b / 2e9), fit_seconds=1.0)
    ...         for s, d in (("a", "b"), ("b", "a")) for r in range(2)
    ...         for kind, sizes, counts in (("one", (4, 1 << 20), (1,)),
    ...                                     ("concurrent", (64, 1 << 20), (8, 32)))
    ...         for b in sizes for c in counts]
    >>> fit = fits_by_rounds(pd.DataFrame(rows), [2])
    >>> fit[["src", "latency_us", "bandwidth_GBps"]].round(1).values.tolist()
    [['a', 100.0, 1.0], ['b', 100.0, 1.0]]
    """
    from fddps.tf.comm_bench import fit_links, fit_transfer_cpu

    out = []
    for k, g in raw.groupby("fit"):
        for n in subsets:
            kept = g[g.repeat < n]
            out += _fit_rows(int(k), int(n), fit_links(kept[kept.kind == "one"]).links_,
                             fit_transfer_cpu(kept[kept.kind == "concurrent"]))
    return pd.DataFrame(out)


def _fit_rows(k, n, links, cpu) -> list:
    """One row per direction of one fit: the link's and the concurrent transfers' parameters."""
    cpu = cpu.set_index(["src", "dst"])
    return [dict(fit=k, n=n, src=link.src, dst=link.dst, latency_us=link.latency * 1e6,
                 bandwidth_GBps=link.bandwidth / 1e9,
                 cpu_latency_us=cpu.cpu_latency[(link.src, link.dst)] * 1e6,
                 cpu_bandwidth_GBps=cpu.cpu_bandwidth[(link.src, link.dst)] / 1e9)
            for link in links.itertuples()]


def spread(fitted: pd.DataFrame, raw: pd.DataFrame) -> pd.DataFrame:
    """Per ``n`` and direction: each parameter's median over the fits and its relative range
    ((max - min) / median), and the seconds one fit of ``n`` rounds takes (the measured fit's
    time scaled by its rounds)."""
    from costmodel.devices import parse_device

    rounds = int(raw.repeat.max()) + 1
    seconds = float(raw.groupby("fit").fit_seconds.first().median())
    out = []
    for (n, src, dst), g in fitted.groupby(["n", "src", "dst"], sort=True):
        tasks = [parse_device(d).task for d in (src, dst)]
        row = dict(n=int(n), direction="task {} -> task {}".format(*tasks), fits=len(g))
        for p in PARAMETERS:
            med = float(g[p].median())
            row[p] = med
            row[f"{p}_range"] = float((g[p].max() - g[p].min()) / med) if med > 0 else np.nan
        row["seconds_per_fit"] = seconds * n / rounds
        out.append(row)
    return pd.DataFrame(out)


WHAT = ("One 2-worker `local_cluster`; each fit measures both directions as "
        "`experiments.real_cluster` does (every size of `comm_bench.DEFAULT_SIZES` one at a "
        "time, then `CONCURRENT_SIZES` x `CONCURRENT_COUNTS`), and is refitted on its first "
        "`n` rounds. Per `n` and direction: each parameter's median over the fits, and its "
        "range over the fits relative to the median (`_range`: (max - min) / median). "
        "`seconds_per_fit`: the wall time of one fit of `n` rounds (measured fits scaled by "
        "their rounds; warm-up rounds left out).")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fits", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15, help="rounds per fit")
    parser.add_argument("--subsets", type=int, nargs="+", default=[5, 10, 15],
                        help="refit each fit on its first n rounds, for each n")
    parser.add_argument("--out", default=str(common.RESULTS / "link_fit_noise.csv"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.fits < 2 or args.repeats < 1 or min(args.subsets) < 1 or max(args.subsets) > args.repeats:
        parser.error("need --fits >= 2 and 1 <= each of --subsets <= --repeats")
    t0 = time.perf_counter()
    raw = measure(args.fits, args.repeats, progress=not args.no_progress)
    fitted = fits_by_rounds(raw, sorted(set(args.subsets)))
    df = spread(fitted, raw)
    out = common.ensure_parent(args.out)
    df.to_csv(out, index=False)
    # Every fit's parameters, for replaying saved placements with them.
    fitted.to_csv(out.with_name(out.stem + "_fits.csv"), index=False)
    common.write_results_page(out, "How far a link fit moves between measurements", WHAT, df,
                              seconds=time.perf_counter() - t0, floats="{:.3g}")
    with pd.option_context("display.width", 200):
        print(df.round(3).to_string(index=False))
    print(f"results: {out}, {out.with_suffix('.md')}, {out.with_name(out.stem + '_fits.csv')}")
    return df


if __name__ == "__main__":
    main()
