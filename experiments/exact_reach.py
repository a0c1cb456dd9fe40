"""How large a graph the exact solver proves optimal within a time limit.

Random DAGs of the communication-heavy benchmark (:mod:`experiments.comm_heavy`,
same seeded generator) of growing size, on 4 identical devices, at each CCR;
``exact`` with each time limit (wall-clock seconds, 1 worker). Prints, per
limit, the largest size proven at every CCR, and writes the table.

Usage::

    python -m experiments.exact_reach                               # ~10 min
    python -m experiments.exact_reach --sizes 10 20 --limits 2 --ccr 1
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import fddps

from .comm_heavy import cluster, make_graph
from .common import RESULTS, ensure_parent


def run(sizes, limits, ccrs, devices=4, shape="random") -> pd.DataFrame:
    rows = []
    for limit in limits:
        for ccr in ccrs:
            for n in sizes:
                g, c = make_graph(shape, n, ccr), cluster(devices)
                t = time.perf_counter()
                s = fddps.schedule(g, c, "exact", time_limit=limit)
                rows.append(dict(shape=shape, tasks=n, ccr=ccr, devices=devices, time_limit=limit,
                                 proven=s.info["optimal"], makespan=s.makespan,
                                 lower_bound=s.info["lower_bound"],
                                 gap=s.makespan / s.info["lower_bound"] - 1,
                                 seconds=time.perf_counter() - t))
                r = rows[-1]
                print(f"limit {limit:g} s, CCR {ccr:g}, {n} tasks: "
                      f"{'proven' if r['proven'] else 'gap %.3f%%' % (100 * r['gap'])} "
                      f"in {r['seconds']:.1f} s", flush=True)
    return pd.DataFrame(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 30, 40, 60])
    parser.add_argument("--limits", type=float, nargs="+", default=[10.0, 60.0])
    parser.add_argument("--ccr", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--out", default=str(RESULTS / "exact_reach.csv"))
    args = parser.parse_args(argv)
    df = run(args.sizes, args.limits, args.ccr, args.devices)
    print(f"exact's reach: random DAGs, {args.devices} identical devices, 1 worker, loaded "
          "2-core machine; largest size proven per limit and CCR:")
    proven = df[df.proven].groupby(["time_limit", "ccr"]).tasks.max().unstack()
    print(proven.to_string())
    df.to_csv(ensure_parent(args.out), index=False)
    print(f"results: {args.out}")
    return df


if __name__ == "__main__":
    main()
