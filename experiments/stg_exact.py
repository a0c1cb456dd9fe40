"""How many Standard Task Graph Set optima the exact solver reaches and proves.

For STG instances with a proven optimum (see :mod:`experiments.stg_quality`),
run ``exact`` with ``--time-limit`` seconds each (wall clock, 1 worker) and
count the instances where its makespan equals the published optimum
("reached") and where it also proves it ("proved").

All 1,356 instances at 10 s is about 4 h. By default a deterministic
stratified sample runs instead: the first ``--per-case`` graphs (in file order)
of every (size, processors) case; ``--all`` runs everything.

Usage::

    python -m experiments.stg_exact                          # 3 per case x 8 cases x 10 s, ~4 min
    python -m experiments.stg_exact --all                    # the whole set, ~4 h
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import fddps
from fddps.stg import read_stg

from .common import RESULTS, ensure_parent
from .stg_quality import instances, stg_root


def run(root, table, time_limit):
    rows = []
    for count, inst in enumerate(table.itertuples(index=False), 1):
        g = read_stg(root / inst.graph)
        s = fddps.schedule(g, fddps.Cluster.homogeneous(inst.processors), "exact",
                           time_limit=time_limit)
        reached = s.makespan <= inst.optimum * (1 + 1e-9)
        rows.append(dict(size=inst.size, graph=inst.graph, processors=inst.processors,
                         optimum=inst.optimum, makespan=s.makespan,
                         lower_bound=s.info["lower_bound"], reached=reached,
                         proved=bool(s.info["optimal"]), warm_start=s.info["warm_start"],
                         warm_start_makespan=s.info["warm_start_makespan"],
                         seconds=s.info["search_seconds"]))
        print(f"[{count}/{len(table)}] {inst.graph} on {inst.processors}: exact {s.makespan:g} "
              f"(optimum {inst.optimum:g}, {'proved' if s.info['optimal'] else 'not proved'}, "
              f"bound {s.info['lower_bound']:.4g})", flush=True)
    return pd.DataFrame(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stg", help="STG folder (default ../shared/benchmarks/stg or $FDDPS_STG)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--per-case", type=int, default=3,
                        help="graphs per (size, processors) case in the sample (default 3)")
    parser.add_argument("--all", action="store_true", help="every proven instance (~4 h at 10 s)")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--out", default=str(RESULTS / "stg_exact.csv"))
    args = parser.parse_args(argv)
    root = stg_root(args.stg)
    table = instances(root, args.sizes, args.procs, None if args.all else args.per_case)
    t0 = time.perf_counter()
    df = run(root, table, args.time_limit)
    what = "all proven instances" if args.all else (
        f"a SAMPLE: the first {args.per_case} graphs of each (size, processors) case")
    print(f"stg_exact: {len(df)} instances ({what}), exact with {args.time_limit:g} s each "
          f"(wall clock, 1 worker, loaded 2-core machine), {time.perf_counter() - t0:.0f} s")
    summary = df.groupby(["size", "processors"]).agg(
        instances=("reached", "size"), reached=("reached", "sum"), proved=("proved", "sum"))
    print(summary.to_string())
    print(f"all: reached {int(df.reached.sum())}/{len(df)}, proved {int(df.proved.sum())}/{len(df)}")
    df.to_csv(ensure_parent(args.out), index=False)
    print(f"results: {args.out}")
    return df


if __name__ == "__main__":
    main()
