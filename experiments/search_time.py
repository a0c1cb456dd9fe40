"""Search time and peak memory of every algorithm against graph size.

Graphs are :func:`fddps.generators.training_graph` (a forward pass with
branches, a mirrored backward pass, weight updates) of 1k, 10k, 50k and 100k
ops, scheduled on 8 identical devices with 10 GB/s links and 10 us latency.
Each (algorithm, size) runs in a fresh process, so its peak memory is measured
alone: ``peak_mb`` is the growth of the process's maximum resident set size
during the search (the graph is built before). The growth exponent is the
slope of log(time) against log(ops + edges): 1 is linear.

``--saga``: the same graph, scheduled in the same process by SAGA's HEFT
(``saga.schedulers.HeftScheduler``, the ``anrg-saga`` package, 2.0: a widely
used pure-Python implementation) and by fddps, each timed, with the ratio of
their seconds and makespans. Both are deterministic, so each is run
``--rounds`` times, interleaved, and its fastest round kept: on a shared
machine the minimum is the round least slowed by other jobs (one fddps run of
0.2 s measured 0.22-0.48 s on the same graph in three runs here, under a load
average of 2-3 on 2 cores). ``loadavg`` is the 1-minute load average when the
graph's rounds began. Results: ``search_time_saga.csv`` next to ``--out``,
and its page ``search_time_saga.md``. SAGA has no link latency and no colocation or
memory constraints, so for this comparison the cluster has no latency and the
graph's colocation groups and memory are dropped for both. SAGA is not a
dependency of fddps (it pulls in pygraphviz and z3); install it for this run
with ``pip install --no-deps anrg-saga pysmt z3-solver pydantic gitpython filelock``.

Usage::

    python -m experiments.search_time                        # all algorithms, all sizes
    python -m experiments.search_time --sizes 1000 10000 --algorithms fddps heft
    python -m experiments.search_time --saga --sizes 2000    # fddps against SAGA's HEFT
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd

import fddps
from fddps.algorithms import parse_algorithm


def _measure(algorithm, size, devices, seed, queue):
    from fddps.generators import training_graph

    graph = training_graph(size, seed=seed)
    cluster = fddps.Cluster.homogeneous(devices, bandwidth=10e9, latency=1e-5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    name, options = parse_algorithm(algorithm)
    s = fddps.schedule(graph, cluster, algorithm=name, **options)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s.validate()
    queue.put(dict(algorithm=algorithm, ops=graph.num_ops, edges=graph.num_edges, seconds=seconds,
                   peak_mb=(after - before) / 1024, makespan=s.makespan,
                   ratio_to_bound=s.makespan / fddps.lower_bound(graph, cluster)))


def measure(algorithm, size, devices=8, seed=0, timeout=600):
    """One run in a fresh process; a dict of what it measured (``seconds`` is NaN on time-out)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(algorithm, size, devices, seed, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return dict(algorithm=algorithm, ops=size, edges=np.nan, seconds=np.nan, peak_mb=np.nan,
                    makespan=np.nan, ratio_to_bound=np.nan)
    if proc.exitcode != 0:
        raise RuntimeError(f"{algorithm} on {size} ops failed (exit code {proc.exitcode})")
    return queue.get()


def saga_heft(graph, cluster):
    """SAGA's HEFT on ``graph``: ``(seconds, makespan)``.

    Device ``k`` becomes a SAGA node of speed ``1 / time-factor`` (every op of
    a homogeneous cluster costs ``graph.cost[i]`` there), each link a SAGA edge
    of the cluster's bandwidth; an edge's size is its bytes.

    Raises
    ------
    ImportError
        If SAGA is not installed (see the module notes).
    """
    from saga import Network, TaskGraph
    from saga.schedulers import HeftScheduler

    et = graph.exec_times(cluster)
    names = [str(n) for n in graph.names]
    tasks = TaskGraph.create([(names[i], float(et[i, 0])) for i in range(graph.num_ops)],
                             [(names[a], names[b], float(nb)) for a, b, nb in
                              zip(graph.src.tolist(), graph.dst.tolist(), graph.bytes.tolist())])
    devices = [f"d{k}" for k in range(cluster.num_devices)]
    bandwidth = float(cluster.bandwidth[0, 1]) if cluster.num_devices > 1 else 1.0
    network = Network.create([(d, 1.0) for d in devices],
                             [(a, b, bandwidth) for a in devices for b in devices if a < b])
    t0 = time.perf_counter()
    schedule = HeftScheduler().schedule(network, tasks)
    return time.perf_counter() - t0, float(schedule.makespan)


def versus_saga(size, devices=8, seed=0, algorithm="fddps", rounds=1):
    """fddps's ``algorithm`` and SAGA's HEFT on one training-shaped graph, in this process.

    Each is timed ``rounds`` times, interleaved; the fastest round of each is kept.

    Returns a dict: ``ops``, ``fddps_s``, ``saga_heft_s``, their makespans and the ratios,
    ``rounds`` and ``loadavg`` (the 1-minute load average before the first round).

    Raises
    ------
    ValueError
        If ``rounds`` is not a positive integer.
    """
    import os

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    from fddps.generators import training_graph
    from fddps.graph import OpGraph

    g = training_graph(size, seed=seed)
    # What SAGA models: costs and bytes, no colocation, no memory.
    names = list(g.names)
    graph = OpGraph(names, g.cost[:, 0], [(names[a], names[b], nb) for a, b, nb in
                                          zip(g.src.tolist(), g.dst.tolist(), g.bytes.tolist())])
    cluster = fddps.Cluster.homogeneous(devices, bandwidth=10e9, latency=0.0)
    name, options = parse_algorithm(algorithm)
    load = os.getloadavg()[0]
    ours = saga_s = np.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        s = fddps.schedule(graph, cluster, algorithm=name, **options)
        ours = min(ours, time.perf_counter() - t0)
        seconds, saga_makespan = saga_heft(graph, cluster)
        saga_s = min(saga_s, seconds)
    s.validate()
    return dict(ops=graph.num_ops, edges=graph.num_edges, algorithm=algorithm, fddps_s=ours,
                saga_heft_s=saga_s, speedup=saga_s / ours, fddps_makespan=s.makespan,
                saga_heft_makespan=saga_makespan, makespan_ratio=s.makespan / saga_makespan,
                rounds=rounds, loadavg=load)


def write_saga_page(csv_path, df, devices, seconds=None, command=None):
    """``search_time_saga.md`` from the ``--saga`` rows: the table and how many graphs
    fddps schedules at least 20x faster than SAGA's HEFT with no longer a step."""
    from experiments.common import write_results_page

    fast = int((df.speedup >= 20).sum())
    no_worse = int((df.makespan_ratio <= 1 + 1e-9).sum())
    what = (f"Training-shaped graphs (`fddps.generators.training_graph`, seeds 0..{len(df) - 1} "
            f"per size) on {devices} identical devices (10 GB/s, no latency: what SAGA models), "
            "scheduled in one process by fddps and by SAGA's HEFT (`anrg-saga`, pure Python). "
            "`fddps_s`, `saga_heft_s`: the fastest of `rounds` interleaved rounds each; "
            "`speedup` = saga_heft_s / fddps_s; `makespan_ratio` = fddps's step / SAGA's; "
            "`loadavg`: the machine's 1-minute load average before the graph's rounds. "
            f"fddps at least 20x faster: {fast} of {len(df)}; step no longer than SAGA's: "
            f"{no_worse} of {len(df)}. Timings comparable only as ratios inside one run.")
    return write_results_page(csv_path, "fddps against SAGA's HEFT: search time", what, df,
                              command=command, seconds=seconds)


def growth_exponent(df: pd.DataFrame) -> pd.Series:
    """Per algorithm, the slope of log(seconds) against log(ops + edges)."""
    def slope(g):
        g = g.dropna(subset=["seconds"])
        g = g[g.seconds > 0]
        if len(g) < 2:
            return np.nan
        return np.polyfit(np.log(g.ops + g.edges), np.log(g.seconds), 1)[0]
    return df.groupby("algorithm").apply(slope, include_groups=False).rename("growth_exponent")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000, 100000])
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="names or specs like fddps:improve=False (default: all)")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run before giving up")
    parser.add_argument("--out", default="experiments/results/search_time.csv")
    parser.add_argument("--saga", action="store_true",
                        help="time fddps against SAGA's HEFT on each size, in one process")
    parser.add_argument("--repeats", type=int, default=3,
                        help="with --saga: graphs per size (seeds 0..repeats-1)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --saga: timed rounds per graph and scheduler, fastest kept")
    args = parser.parse_args(argv)
    if args.saga:
        t_all = time.perf_counter()
        rows = [versus_saga(n, args.devices, seed=r, rounds=args.rounds) for n in args.sizes
                for r in range(args.repeats)]
        df = pd.DataFrame(rows)
        print(f"fddps against SAGA's HEFT, {args.devices} devices (10 GB/s, no latency), "
              f"one process, {args.repeats} graphs per size (seeds 0..{args.repeats - 1}), "
              f"fastest of {args.rounds} interleaved rounds each:")
        with pd.option_context("display.width", 160, "display.precision", 4):
            print(df.to_string(index=False))
        out = Path(args.out).with_name("search_time_saga.csv")
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
        import sys

        command = " ".join(["python -m experiments.search_time",
                            *(sys.argv[1:] if argv is None else argv)])
        page = write_saga_page(out, df, args.devices, seconds=time.perf_counter() - t_all,
                               command=command)
        print(f"results: {out}, {page}")
        return df
    # "exact" refuses graphs over its max_ops (these start at 1k ops).
    algorithms = args.algorithms or [a for a in fddps.available_algorithms() if a != "exact"] + [
        "fddps:improve=False"]
    from tqdm import tqdm

    rows = []
    runs = [(a, n) for n in args.sizes for a in algorithms]
    for algorithm, size in tqdm(runs, desc="search time", unit="run"):
        rows.append(measure(algorithm, size, args.devices, timeout=args.timeout))
    df = pd.DataFrame(rows)
    print(f"Search time on training-shaped graphs, {args.devices} identical devices "
          f"(10 GB/s, 10 us), one fresh process per run, 1 repetition:")
    with pd.option_context("display.width", 160, "display.precision", 3):
        print(df.to_string(index=False))
        print()
        print(growth_exponent(df).to_string())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(f"results: {args.out}")
    return df


if __name__ == "__main__":
    main()
