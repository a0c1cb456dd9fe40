"""The vertex-elimination DP against data parallelism, FD-DPS and FlexFlow: ``python -m experiments.pase``.

For AlexNet (ImageNet size, FlexFlow's per-GPU batch of 256) and the FD-DPS
paper's six networks (CIFAR-10 size, the paper's batches), on simulated
P100s: the simulated step of

- ``data parallel`` and ``fddps`` (FD-DPS's whole-op placement), the baselines;
- ``pase``: :class:`fddps.search.pase.PaseSearch` (every op in the objective,
  the paper's multi-dimensional configurations, re-timed by simulation; it
  returns the fastest of its answer, its runners-up and the baselines, and the
  row says which);
- ``pase (before)``: the DP as it was on the main checkout (``--main``, run
  there in a subprocess on the same step, writing nothing there), with the
  same time budget, timed as ``pase`` is (``search_s`` and ``total_s``);
- ``flexflow``: FlexFlow's MCMC (``--flexflow-budget`` seconds), started from
  the baselines;

and each search's wall-clock seconds (``search_s``: for ``pase``, building the
graph, configurations and tables and the DP; ``total_s`` adds re-timing the
candidates by simulation). A DP over its time budget or table limit is a row
with its reason: ``--models nmt`` (FlexFlow's NMT, per-GPU batch 64) is one the
DP refuses before costing, naming the vertex and the table it would need.
Writes ``experiments/results/pase.csv`` and ``pase.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from .common import PAPER_BATCH, RESULTS, gpu_cluster, tf_quiet
from .flexflow import MODELS as FLEXFLOW_MODELS  # (AlexNet's and NMT's per-GPU batches)

MODELS = ("alexnet", "vgg16", "inception_v3", "resnet50", "resnet200", "pnasnet_mobile",
          "nasnet_large")

_BEFORE = r"""
import json, pickle, sys, time, warnings
warnings.simplefilter("ignore")
from costmodel import default_cost_model
from experiments.common import gpu_cluster
from fddps.search import get_search, SearchError
step = pickle.load(open(sys.argv[1], "rb"))
cm = default_cost_model("p100")
cluster = gpu_cluster(int(sys.argv[2]), cm)
t = time.perf_counter()
try:
    r = get_search("pase", time_budget=float(sys.argv[3])).fit(step, cluster, cm)
    out = dict(step_ms=r.makespan * 1e3, search_s=r.info["search_seconds"],
               total_s=time.perf_counter() - t, returned=r.info["returned"],
               pase_step_ms=r.info["pase_simulated"] * 1e3,
               additive_ms=r.info["additive_cost"] * 1e3, vertices=r.info["vertices"],
               configs=r.info["configs_per_vertex"])
except SearchError as why:
    out = dict(search_s=time.perf_counter() - t, note=str(why)[:200])
print("RESULT " + json.dumps(out))
"""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_step(model, devices, dataset, batch=None, alexnet_dataset="imagenet"):
    """``(step, batch, image_size)`` of ``model``'s training step (AlexNet on
    ``alexnet_dataset``, the others on ``dataset``)."""
    import slim_models
    from fddps.tf.strategy_graph import step_graph

    if model == "alexnet":
        batch = batch or FLEXFLOW_MODELS[model][1] * devices
        m = slim_models.build_training_graph(model, batch, dataset=alexnet_dataset)
    elif model == "nmt":  # (a sequence model: no image size or dataset)
        batch = batch or FLEXFLOW_MODELS[model][1] * devices
        m = slim_models.build_training_graph(model, batch)
    else:
        batch = batch or PAPER_BATCH[model]
        m = slim_models.build_training_graph(model, batch, dataset=dataset)
    return step_graph(m.graph_def, [m.train_op.name, m.loss.op.name]), batch, m.image_size


#: This checkout, where :func:`in_subprocess` times the DP afresh (``fresh_s``).
HERE = str(Path(__file__).resolve().parents[1])


def in_subprocess(step, devices, budget, main):
    """The DP of the checkout ``main`` on ``step``, in a fresh Python process: its row
    fields (run in ``main``, no files written)."""
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(step, f)
    try:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="3")
        env.pop("PYTHONPATH", None)
        p = subprocess.run([sys.executable, "-c", _BEFORE, f.name, str(devices), str(budget)],
                           cwd=main, env=env, capture_output=True, text=True,
                           timeout=budget * 3 + 300)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            return dict(note=f"failed: {p.stderr.strip().splitlines()[-1:]}")
        return json.loads(line[7:])
    finally:
        os.unlink(f.name)


def run(models, device_counts, budget, flexflow_budget, main=None, dataset="cifar10",
        batches=None, seed=0, alexnet_dataset="imagenet"):
    """One row per (model, devices, strategy)."""
    tf_quiet()
    from costmodel import default_cost_model
    from fddps.search import SearchError, StrategyEvaluator, get_search
    from fddps.search.space import baseline_strategies

    cm = default_cost_model("p100")
    rows = []
    for model in models:
        for k in device_counts.get(model, device_counts["*"]):
            step, batch, size = build_step(model, k, dataset, (batches or {}).get(model),
                                           alexnet_dataset)
            cluster = gpu_cluster(k, cm)
            ev = StrategyEvaluator(step, cluster, cm)
            base = dict(model=model, devices=k, batch=batch, image_size=size, ops=len(step))

            def row(strategy, **fields):
                rows.append(dict(base, strategy=strategy, **fields))
                r = rows[-1]
                print(f"  {model} x{k} {strategy:<14} "
                      f"{r.get('step_ms', float('nan')):10.2f} ms  "
                      f"{r.get('search_s', float('nan')):8.2f} s  {r.get('note', '')}"[:160],
                      flush=True)

            t = time.perf_counter()
            starts = baseline_strategies(step, cluster, cm)
            t_fddps = time.perf_counter() - t
            for name in ("data parallel", "fddps"):
                if name in starts:
                    s = ev.full(starts[name])
                    row(name, step_ms=s.makespan * 1e3, fits=s.fits,
                        search_s=t_fddps if name == "fddps" else 0.0)
            t = time.perf_counter()
            try:
                r = get_search("pase", time_budget=budget).fit(step, cluster, cm)
                info = r.info
                row("pase", step_ms=r.makespan * 1e3, fits=r.fits, search_s=info["search_seconds"],
                    total_s=time.perf_counter() - t, returned=info["returned"],
                    pase_step_ms=info["pase_simulated"] * 1e3,
                    additive_ms=info["additive_cost"] * 1e3, vertices=info["vertices"],
                    edges=info["edges"], configs=info["configs_per_vertex"],
                    largest_table=info["largest_table"][info["order"]], order=info["order"],
                    cost_s=info["cost_seconds"],
                    choices=" ".join(f"{a}:{b}" for a, b in sorted(info["choices"].items())))
            except SearchError as why:
                row("pase", search_s=time.perf_counter() - t, note=str(why)[:200])
            # The same DP in a fresh process, as `pase (before)` is timed: this
            # process has run the other searches, which moves its seconds both ways.
            rows[-1]["fresh_s"] = in_subprocess(step, k, budget, HERE).get("search_s")
            if main:
                row("pase (before)", **in_subprocess(step, k, budget, main))
            mc = get_search("flexflow", time_budget=flexflow_budget, seed=seed).fit(
                step, cluster, cm, starts=starts)
            row("flexflow", step_ms=mc.makespan * 1e3, fits=mc.fits, search_s=mc.seconds)
    return pd.DataFrame(rows)


def write_markdown(df, path, command, seconds):
    lines = [
        "# The vertex-elimination DP (pase) against data parallelism, FD-DPS and FlexFlow",
        "",
        f"Command: `{command}`  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {cpu_name()}, "
        f"{os.cpu_count()} cores, shared with other jobs (loaded: timings are comparable "
        f"only as ratios inside one run); {seconds:.0f} s for the last command.",
        "",
        "Simulated P100s (the default cost model). `step_ms`: the simulated step of each "
        "strategy; `search_s`: the search's wall-clock seconds (pase: graph, "
        "configurations, tables and DP; `total_s` adds re-timing its candidates by "
        "simulation); `returned`: what pase returned (its own answer, a runner-up, or a "
        "baseline when that simulated faster); `pase_step_ms`: its own answer's simulated "
        "step; `additive_ms`: the DP's objective; `pase (before)`: the DP of the main "
        "checkout on the same step and budget, in a subprocess, timed the same way "
        "(`search_s` its search, `total_s` with re-timing); `fresh_s`: this checkout's DP "
        "timed that way too, in a fresh process (compare it with `pase (before)`'s "
        "`search_s`: `search_s` of `pase` ran in the process that ran the other searches "
        "first). AlexNet at ImageNet size with "
        "FlexFlow's per-GPU batch of 256, the six at CIFAR-10 size with the FD-DPS paper's batches.",
        "",
        "The paper's own figures: our copy of the paper (its appendix) has none to set beside "
        "these.",
        "",
    ]
    cols = [c for c in ("model", "devices", "batch", "image_size", "strategy", "step_ms", "search_s",
                        "fresh_s", "total_s",
                        "returned", "pase_step_ms", "additive_ms", "vertices", "configs",
                        "largest_table", "choices", "note") if c in df.columns]
    table = df[cols].copy()
    for c in ("step_ms", "pase_step_ms", "additive_ms"):
        if c in table:
            table[c] = table[c].map(lambda x: "" if pd.isna(x) else f"{x:.2f}")
    for c in ("search_s", "fresh_s", "total_s"):
        if c in table:
            table[c] = table[c].map(lambda x: "" if pd.isna(x) else f"{x:.2f}")
    for c in ("vertices", "configs", "largest_table"):
        if c in table:
            table[c] = table[c].map(lambda x: "" if pd.isna(x) else f"{int(x)}")
    table = table.fillna("")
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "/") for c in cols) + " |")
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--devices", type=int, nargs="+", default=[4])
    ap.add_argument("--alexnet-devices", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--budget", type=float, default=120.0, help="pase's time budget, s")
    ap.add_argument("--flexflow-budget", type=float, default=20.0)
    ap.add_argument("--main", default="/work/main",
                    help="checkout whose pase is the 'before' ('' to skip)")
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--alexnet-dataset", default="imagenet")
    ap.add_argument("--batch", type=int, default=None, help="one batch for every model")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--append", action="store_true",
                    help="replace only these (model, devices) rows of an existing pase.csv")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    counts = {"*": args.devices, "alexnet": args.alexnet_devices}
    batches = {m: args.batch for m in args.models} if args.batch else None
    df = run(args.models, counts, args.budget, args.flexflow_budget, args.main or None,
             args.dataset, batches, alexnet_dataset=args.alexnet_dataset)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.pase " + shlex.join(sys.argv[1:] if argv is None else argv)
    seconds = time.perf_counter() - t0
    if args.append and (out / "pase.csv").exists():
        old = pd.read_csv(out / "pase.csv")
        redone = set(zip(df["model"], df["devices"]))
        keep = old[[(m, d) not in redone for m, d in zip(old["model"], old["devices"])]]
        df = pd.concat([keep, df], ignore_index=True)
        order = {m: i for i, m in enumerate(MODELS + ("nmt",))}
        df = df.sort_values(["model", "devices"], key=lambda c: c.map(order) if c.name == "model"
                            else c, kind="stable").reset_index(drop=True)
        previous = (out / "pase.md").read_text().split("Command: `", 1)[1].split("`", 1)[0] \
            if (out / "pase.md").exists() else ""
        command = f"{previous}`, then `{command.strip()}" if previous else command
    df.to_csv(out / "pase.csv", index=False)
    write_markdown(df, out / "pase.md", command.strip(), seconds)
    print(f"wrote {out / 'pase.csv'} and {out / 'pase.md'}")
    return df


if __name__ == "__main__":
    main()
