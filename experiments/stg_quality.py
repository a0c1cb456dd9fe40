"""Schedule quality on the Standard Task Graph Set against proven optima.

For every STG graph of the chosen sizes and processor counts whose optimum is
proven (one value in ``Optimal_values/Case{n}_{p}_OPT.csv``), schedule it with
each algorithm on ``p`` identical devices (STG has no communication costs) and
report the makespan ratio to the optimum: mean, worst, and the share of
instances solved optimally.

Usage::

    python -m experiments.stg_quality                     # everything (~1-3 min)
    python -m experiments.stg_quality --sizes 50 --procs 2 --limit 20 --algorithms fddps heft
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd

import fddps
from fddps.algorithms import parse_algorithm
from fddps.stg import read_optimal_values, read_stg

DEFAULT_STG = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "stg"


def stg_root(path=None) -> Path:
    """The STG folder: ``path``, ``$FDDPS_STG``, or ``../shared/benchmarks/stg``."""
    root = Path(path or os.environ.get("FDDPS_STG", DEFAULT_STG))
    if not (root / "Optimal_values").is_dir():
        raise FileNotFoundError(f"no STG benchmark set at {root} (expected {root}/Optimal_values)")
    return root


def instances(root, sizes=(50, 100), procs=(2, 4, 8, 16), limit=None):
    """Proven-optimum instances as a DataFrame: ``graph``, ``processors``, ``optimum``."""
    frames = []
    for n in sizes:
        for p in procs:
            table = read_optimal_values(root / "Optimal_values" / f"Case{n}_{p}_OPT.csv")
            table = table[table.proven]
            if limit:
                table = table.head(limit)
            frames.append(table.assign(size=n))
    table = pd.concat(frames, ignore_index=True)
    return table.rename(columns={"lower": "optimum"})[["size", "graph", "processors", "optimum"]]


def run(root, algorithms, sizes=(50, 100), procs=(2, 4, 8, 16), limit=None, progress=True):
    """Makespan of every algorithm on every proven instance; one row per (instance, algorithm)."""
    table = instances(root, sizes, procs, limit)
    graphs = {}
    rows = []
    iterator = table.itertuples(index=False)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, total=len(table), desc="STG instances", unit="inst")
    for inst in iterator:
        g = graphs.get(inst.graph) or graphs.setdefault(inst.graph, read_stg(root / inst.graph))
        cluster = fddps.Cluster.homogeneous(inst.processors)
        for name in algorithms:
            t0 = time.perf_counter()
            algorithm, options = parse_algorithm(name)
            s = fddps.schedule(g, cluster, algorithm=algorithm, **options)
            seconds = time.perf_counter() - t0
            s.validate()
            rows.append(dict(size=inst.size, graph=inst.graph, processors=inst.processors,
                             algorithm=name, makespan=s.makespan, optimum=inst.optimum,
                             ratio=s.makespan / inst.optimum, seconds=seconds))
    return pd.DataFrame(rows)


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Mean and worst ratio to the optimum, and the share solved optimally, per algorithm."""
    tol = 1e-9
    grouped = results.groupby(["algorithm", "size", "processors"])
    def stats(df):
        return pd.Series({"instances": len(df), "mean_ratio": df.ratio.mean(), "worst_ratio": df.ratio.max(),
                          "optimal_share": (df.ratio <= 1 + tol).mean()})
    detail = grouped.apply(stats, include_groups=False).reset_index()
    overall = results.groupby("algorithm").apply(stats, include_groups=False).reset_index()
    overall["size"], overall["processors"] = "all", "all"
    return pd.concat([detail, overall], ignore_index=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stg", help="STG folder (default ../shared/benchmarks/stg or $FDDPS_STG)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--limit", type=int, help="at most this many graphs per (size, processors)")
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="names or specs like fddps:improve=False; default: all "
                             f"({', '.join(fddps.available_algorithms())})")
    parser.add_argument("--out", default="experiments/results/stg_quality.csv")
    args = parser.parse_args(argv)
    root = stg_root(args.stg)
    # "exact" takes up to its time limit per instance: run it with experiments.stg_exact.
    algorithms = args.algorithms or [a for a in fddps.available_algorithms() if a != "exact"] + [
        "fddps:improve=False"]
    t0 = time.perf_counter()
    results = run(root, algorithms, args.sizes, args.procs, args.limit)
    summary = summarize(results)
    print(f"STG quality: {results.graph.nunique()} graphs, {len(results) // len(algorithms)} proven "
          f"instances (sizes {args.sizes}, processors {args.procs}), identical devices, no "
          f"communication; ratio = makespan / proven optimum; {time.perf_counter() - t0:.1f} s")
    with pd.option_context("display.max_rows", 500, "display.width", 160, "display.precision", 4):
        print(summary.to_string(index=False))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results.to_csv(args.out, index=False)
    print(f"per-instance results: {args.out}")
    return summary


if __name__ == "__main__":
    main()
