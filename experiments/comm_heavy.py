"""Schedule quality when communication dominates, against the exact solver.

Generated task graphs (deterministic: the seed of each instance is derived
from its shape, size and CCR by :func:`instance_seed`): fork, join,
fork-join, in-tree, out-tree, pipeline, independent tasks and random DAGs of
10, 20 and 30 tasks. Task costs are uniform in [1, 10] s; every edge's
transfer time is ``CCR x`` the mean task cost times a uniform factor in
[0.5, 1.5] (bytes on links of 1 byte/s, no latency), for CCR 0.1, 1 and 10.
Each graph is scheduled on 2, 4, 8 and 16 identical devices.

The reference is ``exact``'s makespan (OR-Tools CP-SAT, warm-started from
the best of fddps, heft and etf, ``--time-limit`` seconds per instance): a
proven optimum where it says so, otherwise the best schedule it found (an
upper bound on the optimum, so ratios to it may flatter a heuristic).
For every other algorithm: the makespan ratio to the reference (mean,
worst), and the share of instances where it matches the reference.

Usage::

    python -m experiments.comm_heavy                      # everything, ~10 min at 1 s per instance
    python -m experiments.comm_heavy --shapes fork join --sizes 10 --ccr 1 --devices 2
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np
import pandas as pd

import fddps
from fddps.algorithms import parse_algorithm

from .common import RESULTS, label, matplotlib_agg, save_csv_and_plot

SHAPES = ("fork", "join", "fork_join", "in_tree", "out_tree", "pipeline", "independent", "random")
SIZES = (10, 20, 30)
CCRS = (0.1, 1.0, 10.0)
DEVICES = (2, 4, 8, 16)
#: Compared with the exact solver's schedule.
ALGORITHMS = ("fddps", "fddps:local_search=False", "fddps:improve=False", "heft", "etf", "fastt", "mpdps", "topo", "single")


def instance_seed(shape: str, size: int, ccr: float) -> int:
    """The seed of one generated graph: a checksum of its parameters (stable across runs)."""
    return zlib.crc32(f"{shape}/{size}/{ccr}".encode())


def _edges(shape, n, rng):
    if shape == "fork":
        return [(0, j) for j in range(1, n)]
    if shape == "join":
        return [(j, n - 1) for j in range(n - 1)]
    if shape == "fork_join":
        return [(0, j) for j in range(1, n - 1)] + [(j, n - 1) for j in range(1, n - 1)]
    if shape == "out_tree":
        return [((j - 1) // 2, j) for j in range(1, n)]
    if shape == "in_tree":
        return [(j, (j - 1) // 2) for j in range(n - 1, 0, -1)]
    if shape == "pipeline":
        # Two lanes of n/2 stages; each stage also feeds the other lane's next stage.
        lanes = 2
        stages = n // lanes
        node = lambda s, l: s * lanes + l  # noqa: E731
        return [(node(s, l), node(s + 1, m)) for s in range(stages - 1)
                for l in range(lanes) for m in (l, (l + 1) % lanes)]
    if shape == "independent":
        return []
    if shape == "random":
        p = min(1.0, 3.0 / n)
        return [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def make_graph(shape: str, size: int, ccr: float) -> fddps.OpGraph:
    """One generated task graph (see the module docstring).

    Examples
    --------
    >>> g = make_graph("fork", 10, 1.0)
    >>> g.num_ops, g.num_edges
    (10, 9)
    """
    rng = np.random.default_rng(instance_seed(shape, size, ccr))
    edges = _edges(shape, size, rng)
    cost = rng.uniform(1.0, 10.0, size)
    comm = ccr * cost.mean() * rng.uniform(0.5, 1.5, len(edges))
    names = [f"t{i}" for i in range(size)]
    return fddps.OpGraph(names, cost, [(names[a], names[b], w) for (a, b), w in zip(edges, comm)])


def cluster(devices: int) -> fddps.Cluster:
    """``devices`` identical devices, links of 1 byte/s (transfer time = edge bytes)."""
    return fddps.Cluster.homogeneous(devices, bandwidth=1.0)


def run(shapes=SHAPES, sizes=SIZES, ccrs=CCRS, devices=DEVICES, algorithms=ALGORITHMS,
        time_limit=1.0, progress=True) -> pd.DataFrame:
    """One row per (instance, algorithm): makespan, the reference and whether it is proven."""
    rows = []
    grid = [(s, n, r, m) for s in shapes for n in sizes for r in ccrs for m in devices]
    t0 = time.perf_counter()
    proven = 0
    for count, (shape, n, ccr, m) in enumerate(grid, 1):
        g, c = make_graph(shape, n, ccr), cluster(m)
        exact = fddps.schedule(g, c, "exact", time_limit=time_limit).validate()
        proven += exact.info["optimal"]
        base = dict(shape=shape, tasks=n, ccr=ccr, devices=m, reference=exact.makespan,
                    proven=exact.info["optimal"], exact_lower_bound=exact.info["lower_bound"])
        rows.append(dict(base, algorithm="exact", makespan=exact.makespan,
                         seconds=exact.info["search_seconds"]))
        for spec in algorithms:
            name, options = parse_algorithm(spec)
            t = time.perf_counter()
            s = fddps.schedule(g, c, name, **options).validate()
            rows.append(dict(base, algorithm=spec, makespan=s.makespan,
                             seconds=time.perf_counter() - t))
        if progress:
            print(f"[{count}/{len(grid)}] {shape} n={n} ccr={ccr} devices={m}: exact "
                  f"{exact.makespan:.4g} ({'proven' if exact.info['optimal'] else 'unproven'}), "
                  f"{proven} proven so far, {time.perf_counter() - t0:.0f} s", flush=True)
    df = pd.DataFrame(rows)
    df["ratio"] = df.makespan / df.reference
    return df


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm: mean and worst ratio to the reference, share matching it (1e-9)."""
    tol = 1e-9

    def stats(df):
        return pd.Series({"instances": len(df), "mean_ratio": df.ratio.mean(),
                          "worst_ratio": df.ratio.max(),
                          "optimal_share": (df.ratio <= 1 + tol).mean()})

    table = results.groupby("algorithm").apply(stats, include_groups=False)
    by_ccr = results.groupby(["algorithm", "ccr"]).ratio.mean().unstack()
    by_ccr.columns = [f"mean_ccr_{c:g}" for c in by_ccr.columns]
    return table.join(by_ccr).sort_values("mean_ratio").reset_index()


def plot(summary, png):
    plt = matplotlib_agg()
    cols = [c for c in summary.columns if c.startswith("mean_ccr_")]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = np.arange(len(summary))
    width = 0.8 / len(cols)
    for j, col in enumerate(cols):
        ax.bar(x + j * width - 0.4 + width / 2, summary[col], width, label=f"CCR {col[9:]}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, [label(a) for a in summary.algorithm], rotation=30, ha="right")
    ax.set_ylabel("mean makespan / exact solver's")
    ax.set_title("Communication-heavy task graphs: ratio to the exact solver (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--ccr", type=float, nargs="+", default=list(CCRS))
    parser.add_argument("--devices", type=int, nargs="+", default=list(DEVICES))
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--time-limit", type=float, default=1.0,
                        help="exact solver's wall-clock seconds per instance (default 1)")
    parser.add_argument("--out", default=str(RESULTS / "comm_heavy.csv"))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    results = run(args.shapes, args.sizes, args.ccr, args.devices, args.algorithms,
                  args.time_limit)
    summary = summarize(results)
    inst = results[results.algorithm == "exact"]
    print(f"comm_heavy: {len(inst)} instances ({len(args.shapes)} shapes x sizes {args.sizes} x "
          f"CCR {args.ccr} x devices {args.devices}); reference = exact (CP-SAT, "
          f"{args.time_limit:g} s each, 1 worker): {int(inst.proven.sum())} proven optimal, "
          f"{int((~inst.proven).sum())} best found; {time.perf_counter() - t0:.0f} s on a loaded "
          f"2-core machine")
    with pd.option_context("display.width", 180, "display.precision", 4):
        print(summary.to_string(index=False))
    save_csv_and_plot(results, args.out, lambda df, png: plot(summary, png))
    summary.to_csv(str(args.out).replace(".csv", "_summary.csv"), index=False)
    return summary


if __name__ == "__main__":
    main()
