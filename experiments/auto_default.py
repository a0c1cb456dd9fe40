"""Should ``algorithm="auto"`` be :func:`fddps.place`'s default? Its predicted step and search time
against the default's (``"fddps"``), as a user calls ``place`` (issue 15).

For each ``slim_models`` network at ``--batch`` (CIFAR-10 size) on ``--devices``
simulated P100s (``costmodel.default_cost_model("p100")``), and for README's
GraphDef quick start (ResNet-50, batch 8, on 4 CPU devices of this process,
which share its cores; cost model of this machine's CPU, unpinned, as a user
gets it): ``fddps.place(graph_def, devices, fetches=[train_op, loss])`` with
the default algorithm and with ``algorithm="auto"`` (by default with its call
budget: the whole call within ``call_budget`` (2.5) times the seconds the
default's placement took inside it, ``--call-budget``; ``--call-budget none``:
the searches' earlier budget, twice their baselines' seconds after them, and
every candidate re-timed; ``--budget`` seconds: a fixed search budget).
Reported per row: the predicted step of what the placed
graph runs (``step_ms``: the executor's order for the default, which
``place`` does not enforce unless its order guard says so; the simulated
strategy for ``auto``), the scheduled-order step of the default
(``scheduled_ms``), ``place``'s wall-clock seconds (reading the graph,
searching, writing the placed graph), and for ``auto`` the search that won.

Wall-clock times are of a machine shared with other jobs: compare them as ratios
within the run.

Run::

    python -m experiments.auto_default                     # six networks + quick start, 3 rounds
    python -m experiments.auto_default --models vgg16 --budget 10 --no-quickstart
    python -m experiments.auto_default --quick             # a smoke test (~10 s)
    python -m experiments.auto_default --call-budget none  # auto as before its call budget
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np
import pandas as pd

from experiments.common import (COST_MODEL_NOTE, MODELS, RESULTS, build_model, device_names,
                                matplotlib_agg, save_csv_and_plot, tf_quiet, write_results_page)

DEFAULT = "fddps"  # fddps.place's default algorithm when this experiment decided


def place_both(graph_def, devices, fetches, cost_model, budget, call_budget="default",
               auto_first=False) -> list:
    """``fddps.place`` with the default algorithm and with ``auto``: one dict per algorithm
    (the default's first), ``auto`` called first when ``auto_first``.

    ``call_budget``: auto's option of that name (``"default"``: not passed)."""
    import fddps

    rows = []
    auto = {} if budget is None else dict(time_budget=budget)
    if call_budget != "default":
        auto["call_budget"] = call_budget
    calls = [(DEFAULT, {}), ("auto", auto)]
    for algorithm, options in (calls[::-1] if auto_first else calls):
        # Not timed: the garbage of what ran before is not this call's (place() holds
        # Python's cyclic collector off while it runs, leaving the collection to the
        # next call, which would otherwise pay for it: as experiments.place_time does).
        gc.collect()
        t = time.perf_counter()
        p = fddps.place(graph_def, devices, cost_model=cost_model, fetches=fetches,
                        algorithm=algorithm, **options)
        seconds = time.perf_counter() - t
        found = p.info.get("search_info", {})
        written = [n for n in found.get("written_steps", {}) if n != "fddps (place's default)"]
        rows.append(dict(algorithm=algorithm, step_ms=p.executor_makespan * 1e3,
                         scheduled_ms=p.makespan * 1e3, place_s=seconds,
                         winner=p.info.get("search", "") if found else "",
                         written=",".join(written), skipped=",".join(found.get("skipped", {})),
                         cut=",".join(found.get("cut", [])),
                         budget_s=found.get("call_budget", {}).get("seconds", float("nan")),
                         load1=os.getloadavg()[0]))
    return sorted(rows, key=lambda r: r["algorithm"] != DEFAULT)


def median_round(rounds) -> dict:
    """Of one algorithm's rows over the rounds, the row of the round whose ``place_s`` is the
    median (the lower middle of an even count), with ``rounds`` and every round's
    seconds (``place_s_rounds``)."""
    k = sorted(range(len(rounds)), key=lambda i: rounds[i]["place_s"])[(len(rounds) - 1) // 2]
    return dict(rounds[k], rounds=len(rounds),
                place_s_rounds=" ".join(f"{r['place_s']:.3g}" for r in rounds))


def run(models, batch, devices, budget, quickstart=True, dataset="cifar10",
        call_budget="default", rounds=3):
    """One row per (case, algorithm): the round whose seconds are the median of ``rounds``
    interleaved rounds (each round calls both, the order alternating), so that one
    call's drift (the same default call measured 0.64 and 0.84 s in one run) moves
    neither side alone."""
    tf_quiet()
    from costmodel import default_cost_model

    rows = []
    cases = [(m, batch, device_names(devices), default_cost_model("p100")) for m in models]
    if quickstart:  # README: resnet50, batch 8, 4 CPU devices of one process, the CPU preset
        cases.append(("resnet50 (quick start, CPU)", 8, [f"/device:CPU:{i}" for i in range(4)],
                      default_cost_model()))
    for case, b, devs, cm in cases:
        m = build_model(case.split(" ")[0], b, dataset=dataset)
        fetches = [m.train_op.name, m.loss.name]
        done = [place_both(m.graph_def, devs, fetches, cm, budget, call_budget,
                           auto_first=bool(k % 2)) for k in range(rounds)]
        for j in range(2):
            r = median_round([d[j] for d in done])
            rows.append(dict(case=case, batch=b, devices=len(devs), **r))
            print(f"  {case:<28} {r['algorithm']:<6} {r['step_ms']:9.3f} ms  "
                  f"{r['place_s']:7.1f} s (rounds: {r['place_s_rounds']})  {r['winner']}",
                  flush=True)
    df = pd.DataFrame(rows)
    base = df[df.algorithm == DEFAULT].set_index("case")
    df["step_vs_default"] = df["step_ms"] / df["case"].map(base["step_ms"])
    df["time_vs_default"] = df["place_s"] / df["case"].map(base["place_s"])
    return df


def _plot(df, png):
    plt = matplotlib_agg()
    auto = df[df.algorithm == "auto"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    x = np.arange(len(auto))
    labels = [c.replace(" (quick start, CPU)", "\nquick start") for c in auto["case"]]
    axes[0].bar(x, auto["step_vs_default"], color="C0")
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylim(0, 1.2)
    axes[0].set_ylabel(f"auto's predicted step / {DEFAULT}'s")
    axes[1].set_yscale("log")
    # The bars rise from "as long as the default" (down, where auto took less).
    axes[1].set_ylim(min(0.8, 0.9 * auto["time_vs_default"].min()),
                     max(4.0, 1.2 * auto["time_vs_default"].max()))
    axes[1].bar(x, auto["time_vs_default"] - 1.0, bottom=1.0, color="C1")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].axhline(3.0, color="grey", lw=0.8, ls="--")  # the bar for a default: 3x its seconds
    axes[1].annotate("3x", (len(auto) - 0.5, 3.0), ha="right", va="bottom", fontsize=7)
    axes[1].set_ylabel(f"auto's place() seconds / {DEFAULT}'s")
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=7, rotation=30)
    for i, (s, w) in enumerate(zip(auto["step_vs_default"], auto["winner"])):
        w = "default" if w == f"{DEFAULT} (place's default)" else w  # fits a bar's width
        axes[0].annotate(f"{s:.2f}\n{w}", (i, s), ha="center", va="bottom", fontsize=6)
    for i, t in enumerate(auto["time_vs_default"]):
        axes[1].annotate(f"{t:.2f}", (i, max(t, 1.0)), ha="center", va="bottom", fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def write_page(out, df, command, seconds):
    """The generated page ``auto_default.md`` (see :func:`experiments.common.write_results_page`)."""
    auto = df[df.algorithm == "auto"]
    cols = ["case", "algorithm", "step_ms", "scheduled_ms", "place_s", "place_s_rounds", "winner",
            "step_vs_default", "time_vs_default", "written", "skipped", "cut", "budget_s",
            "load1"]
    return write_results_page(
        out, "`auto` against `place()`'s default",
        f"`step_ms`: the predicted step of what the placed graph runs; `scheduled_ms`: the "
        f"default's step in its scheduled order; `place_s`: `place()`'s wall-clock seconds "
        f"(comparable only as ratios inside one run), of the round whose seconds are the "
        f"median of `rounds` interleaved rounds (`place_s_rounds`: every round's; each row "
        f"is that round's); `winner`: what `auto` returned (a "
        f"search, a baseline, or `fddps (place's default)`: the default algorithm's own "
        f"placement); `written`: the candidates `auto` wrote and re-timed as GraphDefs "
        f"(besides the default's placement); `budget_s`: `auto`'s call budget (its `call_budget` times the "
        f"seconds the default's reading and placing took inside the `auto` call); `load1`: "
        f"the machine's 1-minute load average "
        f"after the call. `auto` predicted no slower than the default in "
        f"{int((auto.step_vs_default <= 1).sum())} of {len(auto)} cases; its seconds "
        f"{auto.time_vs_default.min():.1f}-{auto.time_vs_default.max():.1f}x the default's "
        f"(median {auto.time_vs_default.median():.1f}x), within 3x in "
        f"{int((auto.time_vs_default <= 3).sum())} of {len(auto)}. {COST_MODEL_NOTE}",
        df[cols], command=command, seconds=seconds,
        after="![auto against the default](auto_default.png)", floats="{:.3f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--budget", type=float, default=None,
                   help="auto's time_budget in seconds (default: auto's own budget)")
    p.add_argument("--call-budget", default="default",
                   help="auto's call_budget: the whole call within this many times the "
                        "default's seconds ('none': the earlier budget of the searches only; "
                        "default: auto's own, 2.5)")
    p.add_argument("--no-quickstart", action="store_true",
                   help="leave out README's quick start (ResNet-50 on 4 local CPU devices)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: vgg16 at batch 2 on 2 GPUs, auto with its own (call) budget, "
                        "no quick start")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds per case; each row is the median round's (default 3)")
    p.add_argument("--out", default=str(RESULTS / "auto_default.csv"))
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    batch, devices, budget, quickstart = args.batch, args.devices, args.budget, not args.no_quickstart
    rounds = args.rounds
    if rounds < 1:
        p.error(f"--rounds must be at least 1, got {rounds}")
    if args.quick:
        models, batch, devices, quickstart, rounds = ["vgg16"], 2, 2, False, 1
    call_budget = args.call_budget
    if call_budget not in ("default", "none"):
        try:
            call_budget = float(call_budget)
        except ValueError:
            p.error(f"--call-budget must be a number, 'none' or 'default', got {call_budget!r}")
    elif call_budget == "none":
        call_budget = None
    start = time.perf_counter()
    df = run(models, batch, devices, budget, quickstart, call_budget=call_budget,
             rounds=rounds)
    said = "its own budget" if budget is None else f"{budget:g} s"
    print(f"fddps.place: default ({DEFAULT}) vs auto ({said}), batch {batch}, CIFAR-10 "
          f"size, {devices} simulated P100s. {COST_MODEL_NOTE}")
    print(df.round(3).to_string(index=False))
    out = save_csv_and_plot(df, args.out, _plot)
    command = " ".join(["python -m experiments.auto_default",
                        *(argv if argv is not None else sys.argv[1:])])
    write_page(out, df, command, time.perf_counter() - start)
    return df


if __name__ == "__main__":
    main()
