"""Tofu's evaluation in simulation: its Figures 8-10 on 8 simulated K80s (issue 30).

Tofu (Wang et al., EuroSys 2019, Section 7) trains WResNet-50/101/152 widened
4-10x (ImageNet, 224 x 224) and LSTM language models of 6/8/10 layers of
4K/6K/8K units (20 unrolled steps) on 8 K80s of 12 GB. Per model, every way of
running it gets a batch and a simulated throughput (samples per second) and
its share of Ideal's:

- ``ideal``: one GPU with unbounded memory at the batch that saturates it
  (the paper's global 128 for WResNets, 512 for RNNs: 16 / 64 per GPU), its
  throughput times 8 (no communication);
- ``smallbatch``: the same, at the largest per-GPU batch whose simulated peak
  fits in one GPU;
- ``swapping``: data parallelism at Ideal's per-GPU batch with what does not
  fit swapped to host memory (:func:`fddps.search.tofu_baselines.swap_seconds`:
  twice the bytes over capacity per GPU, over the shared PCIe links of
  :mod:`fddps.topology` and the 10 GB/s host link all GPUs share; overlapped
  with compute) plus the weight gradients' all-reduce (ring, each GPU's
  PCIe link);
- ``opplacement`` (RNNs only, as in the paper): FD-DPS's whole-op placement
  on the op graph at Tofu's batch;
- ``tofu``: :class:`fddps.search.tofu.Tofu` at the largest global batch
  whose plan fits (doubling and halving from the paper's batch).

Figure 10 (``--fig10``): RNN-4-8K at batch 512 and WResNet-152-10 at batch 8
under Tofu and the partitioners of :mod:`fddps.search.tofu_baselines`
(AllRow-Greedy, Spartan, EqualChop, ICML18), each plan scored by the same
simulation: step time, the share of it not spent computing, bytes moved,
the fullest GPU's peak, and whether it fits.

Every result goes to CSV (``experiments/results/tofu.csv``, ``tofu_fig10.csv``)
and the page ``experiments/results/tofu.md`` is generated from them, beside the
figures the paper states. Search times are wall-clock on the machine that runs
it (a loaded shared 2-core machine for ours).

Run::

    python -m experiments.tofu --quick                      # smoke: small models, 4 GPUs
    python -m experiments.tofu --models wrn152-10,rnn10-8192 --fig10 --budget 1500
    python -m experiments.tofu                              # all 21 models (hours here)
    python -m experiments.tofu --markdown-only              # regenerate tofu.md from the CSVs
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import time

import numpy as np
import pandas as pd

from experiments.common import RESULTS, ensure_parent, matplotlib_agg

GB = 1e9
DEVICES = 8
#: Ideal's global batch (Section 7.2): 128 for WResNets, 512 for RNNs.
IDEAL_BATCH = {"wrn": 128, "rnn": 512}
#: Batches tried (powers of two; the paper's Tofu used 8-128 and 128-512).
BATCHES = {"wrn": (1, 2, 4, 8, 16, 32, 64, 128), "rnn": (16, 32, 64, 128, 256, 512)}
#: Where the doubling/halving search starts: the paper's Tofu batch of the largest model.
START = {"wrn": 8, "rnn": 128}
#: Figure 10's models and batches.
FIG10 = {"rnn4-8192": 512, "wrn152-10": 8}
FIG10_PARTITIONERS = ("tofu", "allrow_greedy", "spartan", "equalchop", "icml18")
METHODS = ("ideal", "smallbatch", "swapping", "opplacement", "tofu")
#: Whether steps get running gradient sums (fddps.search.tofu_accumulate); --addn clears it.
RUNNING_SUMS = [True]

#: What the paper states in its text (the bars of Figures 8-10 are images).
PAPER = {
    "fig8": "Tofu 60-95% of Ideal on every WResNet (batch 8 for WResNet-152-10 up to 128 for "
            "WResNet-50-4); SmallBatch fits only WResNet-50-4, 50-6 and 101-4 (12% and 15% "
            "faster than Tofu on 50-4 and 101-4); swapping 20-63% slower than Tofu; no operator "
            "placement for WResNets.",
    "fig9": "Tofu 70-98% of Ideal on every RNN (batch 128 for RNN-10-8K, 256 or 512 for the "
            "others); SmallBatch never better than Tofu and OOM for the larger RNNs; operator "
            "placement 38-61% of Tofu's throughput and OOM on RNN-10-8K; swapping 23-30% of Tofu.",
    "fig10": "AllRow-Greedy worst, and OOM on WResNet-152-10; Spartan and EqualChop lower the "
             "communication overhead by 3-10% but stay slower than Tofu; ICML18 7% slower than "
             "Tofu on RNN-4-8K and OOM on WResNet-152-10 (no output reduction).",
    "table1": "search 8.3 s (WResNet-152) and 66.6 s (RNN-10) on 8 workers",
    "table3": "RNN-6/8/10-4K: Tofu 210 / 154 / 122 samples/s; MXNet operator placement "
              "107 / 95 / 59; TensorFlow's 50 / 36 / 30",
}


def tofu_models():
    """Tofu's 21 models (Section 7.1): label -> (slim model, options, family)."""
    from slim_models.rnn import tofu_rnn_options

    out = {}
    for depth in (50, 101, 152):
        for w in (4, 6, 8, 10):
            out[f"wrn{depth}-{w}"] = ("wide_resnet", dict(depth=depth, width=w), "wrn")
    for layers in (6, 8, 10):
        for hidden in (4096, 6144, 8192):
            out[f"rnn{layers}-{hidden}"] = ("rnn_lm", tofu_rnn_options(layers, hidden), "rnn")
    out["rnn4-8192"] = ("rnn_lm", tofu_rnn_options(4, 8192), "rnn")  # Figure 10 only
    return out


#: --quick: small models whose capacity is set from their own peak (see main).
QUICK_MODELS = {
    "wrn50-0.25": ("wide_resnet", dict(depth=50, width=0.25, num_classes=10, image_size=32), "wrn"),
    "rnn2-256": ("rnn_lm", dict(num_layers=2, hidden_size=256, vocab_size=1000, seq_length=5),
                 "rnn"),
}
QUICK_BATCHES = {"wrn": (2, 4, 8, 16), "rnn": (4, 8, 16, 32)}


class Steps:
    """Step graphs of one model by batch, built once each (TensorFlow, then the strategy layer)."""

    def __init__(self, model, options, running_sums=True):
        self.model, self.options, self.cache, self.seconds = model, dict(options), {}, {}
        self.running_sums = running_sums

    def __call__(self, batch):
        if batch not in self.cache:
            from experiments.common import build_model
            from fddps.tf.strategy_graph import step_graph

            t0 = time.perf_counter()
            opts = dict(self.options)
            size = opts.pop("image_size", 224 if self.model == "wide_resnet" else None)
            m = build_model(self.model, batch, dataset="imagenet" if size == 224 else "cifar10",
                            image_size=size, model_options=opts)
            step = step_graph(m.graph_def, [m.train_op.name, m.loss.op.name])
            if self.running_sums:
                from fddps.search.tofu_accumulate import running_gradient_sums

                step = running_gradient_sums(step)
            self.cache[batch] = (step, m)
            self.seconds[batch] = time.perf_counter() - t0
        return self.cache[batch][0]


def single_gpu(step, cm, names):
    """(seconds, peak bytes) of the whole step on one GPU with unbounded memory."""
    from fddps.strategy import Strategy, simulate_strategy
    from fddps.tf import make_cluster

    one = make_cluster(names[:1], cm, math.inf)
    tl = simulate_strategy(step, Strategy({}, names[0], "single"), one, cm)
    return float(tl.makespan), float(np.max(tl.peak_memory))


def _allreduce_seconds(weight_bytes, k, lane_bandwidth):
    """Ring all-reduce of the weight gradients over each GPU's PCIe link."""
    return 2.0 * (k - 1) / k * weight_bytes / lane_bandwidth if k > 1 else 0.0


def run_model(label, spec, cm, capacity, devices=DEVICES, batches=None, methods=METHODS,
              budget_end=math.inf):
    """Rows (one per method) for one model; see the module notes."""
    from fddps.search.tofu import Tofu
    from fddps.search.tofu_baselines import swap_seconds
    from fddps.tf import make_cluster
    from fddps.topology import TOPOLOGIES

    model, options, family = spec
    batches = tuple(batches or BATCHES[family])
    names = [f"/device:GPU:{i}" for i in range(devices)]
    cluster = make_cluster(names, cm, capacity)
    steps = Steps(model, options, RUNNING_SUMS[0])
    singles = {}

    def single(b):
        if b not in singles:
            singles[b] = single_gpu(steps(b), cm, names)
        return singles[b]

    ideal_b = max(1, IDEAL_BATCH[family] // devices)
    ideal_b = min(batches, key=lambda b: abs(b - ideal_b)) if not quick_family(batches, family) \
        else batches[len(batches) // 2]
    step = steps(ideal_b)
    weights = float(sum(op.param_bytes for op in step.ops.values()))
    base = dict(model=label, family=family, devices=devices, capacity_gb=capacity / GB,
                running_sums=steps.running_sums,
                weights_and_slots_gb=weights / GB, ops=len(step))
    rows = []
    t_ideal, peak_ideal = single(ideal_b)
    ideal = devices * ideal_b / t_ideal
    rows.append(dict(base, method="ideal", batch=devices * ideal_b, fits=True,
                     step_seconds=t_ideal, throughput=ideal, peak_gb=peak_ideal / GB,
                     note=f"{ideal_b} per GPU, memory unbounded, times {devices}"))
    print(f"{label}: {len(step)} ops, weights and slots {weights / GB:.1f} GB; ideal "
          f"{ideal:.1f}/s at {ideal_b} per GPU (peak {peak_ideal / GB:.1f} GB)", flush=True)
    if "smallbatch" in methods:
        fit = None
        if weights <= capacity:  # else no batch fits: the weights alone are over
            for b in batches:
                if b > ideal_b or time.perf_counter() > budget_end:
                    break
                t, peak = single(b)
                if peak > capacity:
                    break
                fit = (b, t, peak)
        if fit:
            b, t, peak = fit
            rows.append(dict(base, method="smallbatch", batch=devices * b, fits=True,
                             step_seconds=t, throughput=devices * b / t, peak_gb=peak / GB,
                             note=f"{b} per GPU, times {devices}"))
        else:
            rows.append(dict(base, method="smallbatch", fits=False, note="OOM at every batch"))
    if "swapping" in methods:
        over = max(0.0, peak_ideal - capacity)
        lane = TOPOLOGIES["pcie3"].lane_bandwidth
        swap = swap_seconds([2 * over] * devices, cluster.devices, "pcie3")
        sync = _allreduce_seconds(weights / 3.0, devices, lane)  # gradients: a third of w+slots
        t = max(t_ideal, swap) + sync
        rows.append(dict(base, method="swapping", batch=devices * ideal_b, fits=True,
                         step_seconds=t, throughput=devices * ideal_b / t,
                         peak_gb=min(peak_ideal, capacity) / GB, moved_gb=devices * 2 * over / GB,
                         note=f"swap {swap:.3g} s, compute {t_ideal:.3g} s, all-reduce "
                              f"{sync:.3g} s"))
    tofu_batch = None
    if "tofu" in methods:
        tried, best = {}, None
        b = START[family] if START[family] in batches else batches[len(batches) // 2]
        while b in batches and b not in tried and time.perf_counter() < budget_end:
            t0 = time.perf_counter()
            plan = Tofu().search(steps(b), cluster, cm, infeasible="return")
            tried[b] = plan
            peak = float(np.max(plan.peak_memory))
            print(f"  tofu at batch {b}: {'fits' if plan.fits else 'OOM'}, peak {peak / GB:.2f} "
                  f"GB, step {plan.timeline.makespan:.3f} s, search {plan.search_seconds:.1f} s "
                  f"(with simulation {time.perf_counter() - t0:.0f} s)", flush=True)
            if plan.fits:
                best = b
                b = batches[batches.index(b) + 1] if batches.index(b) + 1 < len(batches) else None
                if b is not None and b in tried:
                    break
            else:
                if best is not None:
                    break
                i = batches.index(b)
                b = batches[i - 1] if i > 0 else None
        if best is not None:
            plan = tried[best]
            t = float(plan.timeline.makespan)
            tofu_batch = best
            rows.append(dict(base, method="tofu", batch=best, fits=True, step_seconds=t,
                             throughput=best / t, peak_gb=float(np.max(plan.peak_memory)) / GB,
                             search_seconds=plan.search_seconds, exact=plan.exact,
                             search_cpu_seconds=plan.info.get("search_cpu_seconds", np.nan),
                             moved_gb=float(plan.timeline.transfers["bytes"].sum()) / GB,
                             comm_gb=plan.comm_bytes / GB, groups=plan.groups,
                             note=f"batches tried {sorted(tried)}"))
        else:
            b = min(tried) if tried else None
            rows.append(dict(base, method="tofu", batch=b, fits=False,
                             peak_gb=float(np.max(tried[b].peak_memory)) / GB if tried else np.nan,
                             search_seconds=tried[b].search_seconds if tried else np.nan,
                             note=f"OOM at batches {sorted(tried)}" if tried else "not run"))
    if "opplacement" in methods and family == "rnn":
        b = tofu_batch or ideal_b * devices
        rows.append(dict(base, **_op_placement(steps, b, cm, names, capacity)))
    for r in rows:
        _print_row(r)
    return rows


def quick_family(batches, family):
    return tuple(batches) == QUICK_BATCHES.get(family)


def _op_placement(steps, batch, cm, names, capacity):
    """FD-DPS (whole ops placed and scheduled) on the op graph of the model at ``batch``."""
    from experiments.common import run_strategy
    from fddps.tf import make_cluster, read_graph_def

    steps(batch)
    _, m = steps.cache[batch]
    cluster = make_cluster(names, cm, capacity)
    graph, _ = read_graph_def(m.graph_def, cm, cluster, fetches=[m.train_op.name, m.loss.op.name])
    r = run_strategy(graph, cluster, "fddps", validate=False, probe_oom=False)
    ok = r["status"] == "ok"
    return dict(method="opplacement", batch=batch, fits=ok,
                step_seconds=r["step_seconds"] if ok else np.nan,
                throughput=batch / r["step_seconds"] if ok else np.nan,
                peak_gb=r["peak_max"] / GB, search_seconds=r["search_seconds"],
                note=f"FD-DPS at Tofu's batch; {r['message'][:80]}" if not ok else
                "FD-DPS at Tofu's batch")


def _print_row(r):
    thr = r.get("throughput", np.nan)
    print(f"  {r['method']:12s} batch {r.get('batch')!s:>5} {'fits' if r['fits'] else 'OOM ':4s} "
          f"{thr if thr == thr else float('nan'):9.2f}/s  peak {r.get('peak_gb', np.nan):6.2f} GB",
          flush=True)


def run_fig10(cm, capacity, models=None, devices=DEVICES, budget_end=math.inf):
    """Figure 10: every partitioner on RNN-4-8K (batch 512) and WResNet-152-10 (batch 8)."""
    from fddps.search.tofu_baselines import partitioner_plan
    from fddps.strategy import simulate_strategy
    from fddps.tf import make_cluster

    table = tofu_models()
    names = [f"/device:GPU:{i}" for i in range(devices)]
    cluster = make_cluster(names, cm, capacity)
    free = _free_links(cluster)
    rows = []
    for label, batch in (models or FIG10).items():
        if time.perf_counter() > budget_end:
            print(f"{label}: Figure 10 not run (budget spent)")
            continue
        model, options, _ = table[label] if label in table else QUICK_MODELS[label]
        step = Steps(model, options, RUNNING_SUMS[0])(batch)
        for name in FIG10_PARTITIONERS:
            t0 = time.perf_counter()
            plan = partitioner_plan(name, step, cluster, cm)
            # Compute alone: the same plan with transfers free (links of unbounded bandwidth).
            compute = _compute_only_seconds(step, plan.strategy, free, cm, simulate_strategy)
            t = float(plan.timeline.makespan)
            rows.append(dict(model=label, batch=batch, partitioner=name, fits=bool(plan.fits),
                             step_seconds=t, compute_seconds=compute,
                             comm_overhead=max(0.0, 1 - compute / t),
                             moved_gb=float(plan.timeline.transfers["bytes"].sum()) / GB,
                             comm_gb=plan.comm_bytes / GB,
                             peak_gb=float(np.max(plan.peak_memory)) / GB,
                             search_seconds=plan.search_seconds, exact=plan.exact,
                             search_cpu_seconds=plan.info.get("search_cpu_seconds", np.nan),
                             wall_seconds=time.perf_counter() - t0))
            r = rows[-1]
            print(f"  fig10 {label} {name:14s} {'fits' if r['fits'] else 'OOM '} step "
                  f"{t:.3f} s, comm {100 * r['comm_overhead']:.0f}%, moved {r['moved_gb']:.1f} GB, "
                  f"peak {r['peak_gb']:.2f} GB", flush=True)
    return rows


def _compute_only_seconds(step, strategy, cluster, cm, simulate_strategy):
    """The plan's simulated step with every transfer free (zero latency, unbounded links)."""
    return float(simulate_strategy(step, strategy, cluster, cm).makespan)


def _free_links(cluster):
    from fddps.cluster import Cluster

    return Cluster.from_links(cluster.devices, lambda a, b: (0.0, math.inf))


# -- the page ---------------------------------------------------------------------------
def _machine():
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or platform.machine()}, {os.cpu_count()} cores"


def _pct(x):
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.0f}%"


def markdown(df, fig10, command, gpu, sources=("tofu.csv", "tofu_fig10.csv")):
    """The results page: our Figures 8-10 beside what the paper states."""
    lines = [
        "# Tofu's evaluation in simulation (Figures 8-10)",
        "",
        f"Generated by `experiments/tofu.py` from `{sources[0]}` and `{sources[1]}`; do not edit.",
        f"Command: `{command}`. Date: {datetime.date.today().isoformat()}. Machine: {_machine()} "
        "(shared and loaded: compare search times as ratios, and only loosely with the paper's).",
        "",
        f"Cluster: {DEVICES} simulated {gpu.name.upper()}s ({gpu.memory / GB:.0f} GB each: "
        f"{gpu.source.split(';')[0]}); links: the cost model's PCIe link with each GPU's PCIe link "
        "and switch uplink shared (`fddps.topology` 'pcie3'). Throughput is samples per second of "
        "the simulated step; share is of Ideal's.",
        "",
    ]
    if df is not None and len(df):
        lines += ["## Headline", "",
                  "The paper: WResNet-152-10 and RNN-10-8K train on 8 K80s of 12 GB at 60-98% of "
                  "Ideal (Tofu's batch 8 and 128).", ""]
        for model in ("wrn152-10", "rnn10-8192", "rnn6-4096", "rnn8-4096", "rnn10-4096"):
            rows = df[df["model"] == model].set_index("method")
            if "tofu" not in rows.index or "ideal" not in rows.index:
                continue
            r = rows.loc["tofu"]
            if not r["fits"]:
                lines.append(f"- {model}: Tofu's plan does not fit at any batch tried ({r['note']}).")
                continue
            share = r["throughput"] / rows.loc["ideal", "throughput"]
            extra = ""
            paper = {"rnn6-4096": 210, "rnn8-4096": 154, "rnn10-4096": 122}.get(model)
            if paper:
                extra = f" (paper's Table 3: Tofu {paper} samples/s on real K80s)"
            lines.append(f"- {model}: fits at batch {int(r['batch'])}, {r['throughput']:.1f} "
                         f"samples/s, {_pct(share)} of Ideal{extra}; Tofu's search "
                         f"{r['search_seconds']:.1f} s wall ({r.get('search_cpu_seconds', np.nan):.1f}"
                         f" s CPU), fullest GPU {r['peak_gb']:.2f} GB.")
        lines.append("")
        for family, fig, title in (("wrn", "fig8", "Figure 8: WResNets"),
                                   ("rnn", "fig9", "Figure 9: RNNs")):
            sub = df[df["family"] == family]
            if not len(sub):
                continue
            lines += [f"## {title}", "", f"Paper: {PAPER[fig]}", ""]
            methods = [m for m in METHODS if m in set(sub["method"])]
            lines.append("| model | weights + slots (GB) | gradient sums | " + " | ".join(
                f"{m} (batch, samples/s, share)" for m in methods) + " | Tofu search (s) |")
            lines.append("|---" * (len(methods) + 4) + "|")
            for model, rows in sub.groupby("model", sort=False):
                ideal = rows[rows["method"] == "ideal"]["throughput"]
                ideal = float(ideal.iloc[0]) if len(ideal) else np.nan
                cells = []
                for m in methods:
                    r = rows[rows["method"] == m]
                    if not len(r):
                        cells.append("-")
                        continue
                    r = r.iloc[0]
                    if not r["fits"]:
                        cells.append("OOM")
                        continue
                    cells.append(f"{int(r['batch'])}, {r['throughput']:.1f}, "
                                 f"{_pct(r['throughput'] / ideal)}")
                tofu = rows[rows["method"] == "tofu"]
                search = f"{tofu['search_seconds'].iloc[0]:.1f}" if len(tofu) and \
                    np.isfinite(tofu["search_seconds"].iloc[0]) else "-"
                sums = rows["running_sums"].iloc[0] if "running_sums" in rows else np.nan
                sums = "not recorded" if sums != sums else "running" if sums in (True, 1.0,
                                                                                 "True") else "AddN"
                lines.append(f"| {model} | {rows['weights_and_slots_gb'].iloc[0]:.1f} | {sums} | "
                             + " | ".join(cells) + f" | {search} |")
            lines.append("")
    if fig10 is not None and len(fig10):
        lines += ["## Figure 10: partitioners", "", f"Paper: {PAPER['fig10']}", "",
                  "| model (batch) | partitioner | fits | step (s) | communication share | "
                  "moved (GB) | fullest GPU (GB) | search (s) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in fig10.itertuples():
            lines.append(f"| {r.model} ({r.batch}) | {r.partitioner} | "
                         f"{'yes' if r.fits else 'OOM'} | {r.step_seconds:.3f} | "
                         f"{_pct(r.comm_overhead)} | {r.moved_gb:.1f} | {r.peak_gb:.2f} | "
                         f"{r.search_seconds:.1f} |")
        lines.append("")
    lines += [
        "## What differs from the paper, and why",
        "",
        "- Gradient sums: TensorFlow sums a tensor's gradients with one AddN, holding every "
        "input until the last (an unrolled LSTM's per-step kernel gradients: 420 GB for "
        "RNN-10-8K on one GPU); Tofu's MXNet adds in place. Rows marked 'running' were run on "
        "the step rewritten with running sums (`fddps.search.tofu_accumulate`, ours); 'AddN' "
        "rows on TensorFlow's step (`--addn`, or runs before the rewrite existed).",
        "- Above 100% of Ideal (the RNNs): Ideal is 8 copies of one GPU, each computing every "
        "weight gradient and optimizer update over all the weights, work our cost model charges "
        "by the bytes it touches; Tofu splits that work 8 ways. On RNNs at batch 64 per GPU the "
        "weights' share of the step is large, so Tofu's split step beats 8 replicas; the "
        "paper's Ideal, measured on real K80s, stays above Tofu.",
        "- Figure 10: Tofu's objective is bytes moved, and it moves the fewest, but our "
        "simulated steps overlap most transfers with compute (communication share 0-12%), so "
        "a plan moving more (EqualChop, AllRow-Greedy) can step as fast or slightly faster; "
        "what separates the partitioners here is memory (which fit), as in the paper's OOMs.",
        f"- Search time: the paper's Table 1 gives {PAPER['table1']} (C++ in NNVM). Ours is "
        "Python on a shared 2-core machine, and covers every memory weight tried.",
        "- Ideal and SmallBatch: our cost model times an op from its FLOPs and bytes at fixed "
        "efficiencies, so a small batch loses only per-op overhead; the paper's K80 kernels lose "
        "utilisation at small batches (why SmallBatch trails on its RNNs). SmallBatch here is "
        "therefore closer to Ideal than the paper's.",
        "- Swapping is a model, not a run: twice each GPU's bytes over capacity through the "
        "shared host links, overlapped with compute (a lower bound on the traffic of the "
        "paper's LRU swapping).",
        "- Operator placement is FD-DPS (whole ops placed by a list scheduler), not the paper's "
        "layer-per-GPU round robin.",
        "- Tofu's plans are TensorFlow graphs' (many gradient ops per forward op) partitioned by "
        "`fddps.strategy` and replayed by its simulator, which counts received copies of remote "
        "inputs in the peak; Tofu's MXNet prototype fetches with its MultiFetch kernel in place.",
        "- Batches are powers of two, searched by doubling and halving from the paper's batch; "
        "the figures' bar heights are images in our copy of the paper, so only the numbers "
        "its text states are compared.",
        "",
    ]
    return "\n".join(lines)


def _plot(df, png):
    plt = matplotlib_agg()
    models = list(dict.fromkeys(df["model"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.0 * len(models) + 3), 3.4))
    methods = [m for m in METHODS if m in set(df["method"])]
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        shares, ran = [], []
        for model in models:
            rows = df[df["model"] == model].set_index("method")
            ran.append(m in rows.index)
            ok = m in rows.index and bool(rows.loc[m, "fits"])
            shares.append(rows.loc[m, "throughput"] / rows.loc["ideal", "throughput"] if ok
                          else np.nan)
        x = np.arange(len(models)) + (j - len(methods) / 2 + 0.5) * width
        ax.bar(x, np.nan_to_num(shares), width, label=m)
        for xi, yi, r in zip(x, shares, ran):
            if r and not np.isfinite(yi):  # run, and no plan fits (not run: nothing drawn)
                ax.text(xi, 0.02, "OOM", rotation=90, fontsize=6, ha="center", va="bottom")
    ax.set_xticks(np.arange(len(models)))
    ax.set_xticklabels(models, fontsize=7, rotation=30)
    ax.set_ylabel("throughput / Ideal")
    ax.set_title(f"{DEVICES} simulated K80s (12 GB): Tofu's Figures 8-9", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small models on 4 GPUs, capacity 0.6 x the single-GPU peak at the "
                        "middle batch (a smoke test)")
    p.add_argument("--models", default="", help="comma-separated (default: all of Tofu's)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--fig10", action="store_true", help="also Figure 10's partitioners")
    p.add_argument("--fig10-only", action="store_true")
    p.add_argument("--budget", type=float, default=math.inf,
                   help="seconds: start no new model or batch after this long")
    p.add_argument("--out", default=None, help="CSV (default experiments/results/tofu.csv)")
    p.add_argument("--addn", action="store_true",
                   help="keep TensorFlow's gradient AddN (every per-step gradient held until "
                        "the sum) instead of running sums, as Tofu's MXNet adds in place")
    p.add_argument("--fig10-models", default="",
                   help="comma-separated subset of Figure 10's models, each MODEL or "
                        "MODEL:BATCH (default: the paper's batch)")
    p.add_argument("--fresh", action="store_true",
                   help="drop the CSVs' rows of models not run (default: keep them)")
    p.add_argument("--also", action="append", default=[],
                   help="with --markdown-only: merge another run's CSV into --out first")
    p.add_argument("--runs", default="",
                   help="with --markdown-only: the commands that produced the merged CSVs, "
                        "for the page")
    p.add_argument("--markdown-only", action="store_true",
                   help="regenerate the page from the CSVs, run nothing")
    args = p.parse_args(argv)
    from costmodel import default_cost_model, presets
    from experiments.common import tf_quiet

    tf_quiet()
    gpu = presets["k80"]
    cm = default_cost_model(gpu)
    out = ensure_parent(args.out or RESULTS / ("tofu_quick.csv" if args.quick else "tofu.csv"))
    out10 = out.with_name(out.stem + "_fig10.csv")
    command = "python -m experiments.tofu " + " ".join(argv if argv is not None else
                                                       __import__("sys").argv[1:])
    if args.markdown_only:
        df = pd.read_csv(out) if out.exists() else None
        f10 = pd.read_csv(out10) if out10.exists() else None
        for other in args.also:  # another run's CSV: its models' rows replace ours
            path, _, tag = other.partition(":running_sums=")
            more = pd.read_csv(path)
            if tag:  # a run from before the column existed: say which step it ran on
                if "running_sums" not in more:
                    more["running_sums"] = np.nan
                more["running_sums"] = [bool(int(tag)) if v != v else bool(v)
                                        for v in more["running_sums"].astype(object)]
            df = more if df is None else pd.concat(
                [df[~df["model"].isin(set(more["model"]))], more], ignore_index=True)
        if args.also:
            df.to_csv(out, index=False)
            _plot(df, out.with_suffix(".png"))
        if args.runs:
            argv_ = list(argv if argv is not None else __import__("sys").argv[1:])
            i = argv_.index("--runs")
            merge = " ".join(argv_[:i] + argv_[i + 2:])
            command = f"{args.runs}` (runs), merged by `python -m experiments.tofu {merge}"
        out.with_suffix(".md").write_text(markdown(df, f10, command, gpu, (out.name, out10.name)))
        return df
    RUNNING_SUMS[0] = not args.addn
    t_start = time.perf_counter()
    budget_end = t_start + args.budget
    table = QUICK_MODELS if args.quick else tofu_models()
    default = [m for m in table if m != "rnn4-8192"]
    chosen = [m for m in args.models.split(",") if m] or ([] if args.fig10_only else default)
    unknown = [m for m in chosen if m not in table]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r}; known: {', '.join(table)}")
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"unknown method {bad[0]!r}; known: {', '.join(METHODS)}")
    devices = 4 if args.quick else DEVICES
    print(f"{gpu.name} preset: {gpu.source}")
    rows, fig10 = [], []
    for label in chosen:
        if time.perf_counter() > budget_end:
            print(f"{label}: not run (budget of {args.budget:.0f} s spent)")
            continue
        spec = table[label]
        capacity, batches = gpu.memory, None
        if args.quick:  # below one GPU's peak at the middle batch, so that must split
            batches = QUICK_BATCHES[spec[2]]
            mid = batches[len(batches) // 2]
            _, peak = single_gpu(Steps(spec[0], spec[1])(mid), cm, ["/device:GPU:0"])
            capacity = 0.6 * peak
        rows.extend(run_model(label, spec, cm, capacity, devices, batches, methods, budget_end))
        pd.DataFrame(rows).to_csv(out.with_suffix(".partial.csv"), index=False)
    if args.fig10 or args.fig10_only:
        if args.quick:
            fig10 = []
            for label, spec in QUICK_MODELS.items():
                batches = QUICK_BATCHES[spec[2]]
                mid = batches[len(batches) // 2]
                _, peak = single_gpu(Steps(spec[0], spec[1])(mid), cm, ["/device:GPU:0"])
                fig10 += run_fig10(cm, 0.6 * peak, {label: mid}, devices, budget_end)
        else:
            pick = {}
            for item in filter(None, args.fig10_models.split(",")):
                name, _, batch = item.partition(":")
                if name not in FIG10:
                    raise SystemExit(f"unknown Figure 10 model {name!r}; known: "
                                     f"{', '.join(FIG10)}")
                pick[name] = int(batch) if batch else FIG10[name]
            fig10 = run_fig10(cm, gpu.memory, pick or None, devices, budget_end)
    df = pd.DataFrame(rows).assign(gpu=gpu.name) if rows else None
    f10 = pd.DataFrame(fig10) if fig10 else None
    # Runs of other models stay: a run replaces only the rows of the models it ran.
    if df is not None and out.exists() and not args.fresh:
        old = pd.read_csv(out)
        df = pd.concat([old[~old["model"].isin(set(df["model"]))], df], ignore_index=True)
    if f10 is not None and out10.exists() and not args.fresh:
        old = pd.read_csv(out10)
        ran = set(zip(f10["model"], f10["batch"]))
        keep = [(m, b) not in ran for m, b in zip(old["model"], old["batch"])]
        f10 = pd.concat([old[keep], f10], ignore_index=True)
    if df is not None:
        df.to_csv(out, index=False)
        _plot(df, out.with_suffix(".png"))
    if f10 is not None:
        f10.to_csv(out10, index=False)
    if df is None and out.exists():
        df = pd.read_csv(out)
    if f10 is None and out10.exists():
        f10 = pd.read_csv(out10)
    page = out.with_suffix(".md")
    page.write_text(markdown(df, f10, command, gpu, (out.name, out10.name)))
    print(f"results: {out}, {page}")
    return df, f10


if __name__ == "__main__":
    main()
