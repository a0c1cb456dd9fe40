"""Write the experiment notebooks (without outputs) with nbformat.

The notebooks are committed as this script writes them; edit the cells here
and run ``python experiments/notebooks/make_notebooks.py`` to regenerate them.
``tests/test_notebooks.py`` executes each one.

- ``schedules.ipynb``: Gantt charts per device of a small model on 4 simulated
  GPUs, one per algorithm, critical path and transfers marked.
- ``compare_algorithms.ipynb``: bar charts of a table5-style run (the saved
  ``experiments/results/table5.csv`` when there is one, else a small run).
- ``split_decisions.ipynb``: the scheduler-side intra-op split on a small
  VGG-16-like graph with the paper's Table 6 op times: decisions and Gantt charts.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''\
# Find the repository (this notebook lives in experiments/notebooks/) and import from it.
import os, sys
from pathlib import Path

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "fddps" / "__init__.py").exists())
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
%matplotlib inline
# Small runs (the notebook tests set this): never read saved results.
SMALL = os.environ.get("FDDPS_NOTEBOOK_SMALL", "") not in ("", "0")'''


def schedules():
    return [
        new_markdown_cell(
            "# Schedules: where and when every op runs\n\n"
            "A small training graph (ResNet-50 from `slim_models`, CIFAR-10 size, small batch) is read "
            "once with `fddps.tf.read_graph_def` and scheduled by each algorithm on 4 simulated P100s "
            "(`costmodel.default_cost_model(gpu='p100')`: an analytic roofline model, PCIe 3 links). "
            "Each chart is a Gantt chart with one lane per device: bars are ops coloured by the op "
            "types that cost the most time in total (the legend gives each type's total; ops that do "
            "no work -- Const, Identity, VarHandleOp -- are one pale group, the rest grey), the "
            "**critical path** (the chain of ops and transfers that sets the step's length) is the "
            "thin black line above the bars, and the grey segments under each lane are the "
            "**transfers** into that device, from the producer's finish to the tensor's arrival. "
            "With thousands of ops the bars become slivers: the **utilisation view** "
            "(`plot_schedule(s, kind='utilization')`) shows each device's busy fraction over time "
            "instead."),
        new_code_cell(SETUP),
        new_code_cell(
            "# Parameters\n"
            "MODEL, BATCH, DEVICES = 'resnet50', 8, 4\n"
            "ALGORITHMS = ['fddps', 'fddps:improve=False', 'fastt', 'mpdps', 'heft', 'etf']"),
        new_code_cell(
            "import costmodel\n"
            "import fddps\n"
            "from fddps.algorithms import parse_algorithm\n"
            "from fddps.plot import critical_path, plot_schedule\n"
            "from experiments import common\n\n"
            "cm = costmodel.default_cost_model(gpu='p100')\n"
            "mg = common.load_model(MODEL, BATCH, cm, devices=common.device_names(DEVICES))\n"
            "cluster = common.gpu_cluster(DEVICES, cm)\n"
            "print(f'{MODEL} batch {BATCH}: {mg.ops} step ops, {mg.edges} edges '\n"
            "      f'(built in {mg.build_seconds:.1f} s, read in {mg.read_seconds:.1f} s); {cluster}')"),
        new_code_cell(
            "schedules = {}\n"
            "for spec in ['single'] + ALGORITHMS:\n"
            "    name, options = parse_algorithm(spec)\n"
            "    one = common.gpu_cluster(1, cm) if spec == 'single' else cluster\n"
            "    schedules[spec] = fddps.schedule(mg.graph, one, algorithm=name, **options).validate()\n"
            "single = schedules['single'].makespan\n"
            "summary = pd.DataFrame([dict(algorithm=common.label(a), step_ms=s.makespan * 1e3,\n"
            "                             speedup=single / s.makespan,\n"
            "                             critical_path_ops=len(critical_path(s)),\n"
            "                             search_s=s.info['search_seconds'])\n"
            "                        for a, s in schedules.items()])\n"
            "summary.round(3)"),
        new_markdown_cell("## One Gantt chart per algorithm"),
        new_code_cell(
            "# One graph, one cost model: the op types' colours are the same in every chart, so one legend.\n"
            "fig, axes = plt.subplots(len(ALGORITHMS), 1, figsize=(13, 2.4 * len(ALGORITHMS)))\n"
            "for k, (ax, spec) in enumerate(zip(np.atleast_1d(axes), ALGORITHMS)):\n"
            "    plot_schedule(schedules[spec], ax=ax, critical_path=True, transfers=True, legend=k == 0)\n"
            "    ax.set_title(f'{common.label(spec)}: ' + ax.get_title(), fontsize=9)\n"
            "fig.subplots_adjust(left=0.12, right=0.72, top=0.97, bottom=0.04, hspace=0.55)"),
        new_markdown_cell(
            "## How busy each device is\n\n"
            "The busy fraction of every device per time bin, stacked by op type in the Gantt chart's "
            "colours (`fddps.plot.utilization` gives the numbers); readable at any number of ops."),
        new_code_cell(
            "from fddps.plot import utilization\n\n"
            "fig, axes = plt.subplots(2, 1, figsize=(13, 5.5))\n"
            "for ax, spec in zip(axes, ['fddps', 'heft']):\n"
            "    plot_schedule(schedules[spec], ax=ax, kind='utilization', bins=120, legend=spec == 'fddps')\n"
            "    ax.set_title(f'{common.label(spec)}: ' + ax.get_title(), fontsize=9)\n"
            "fig.subplots_adjust(left=0.12, right=0.72, hspace=0.45)\n"
            "edges, busy = utilization(schedules['fddps'], bins=10)\n"
            "pd.DataFrame(busy, index=schedules['fddps'].cluster.names,\n"
            "             columns=[f'{e * 1e3:.2g} ms' for e in edges[:-1]]).round(2)"),
        new_markdown_cell(
            "## The critical path of FD-DPS's schedule\n\n"
            "Walking back from the op that finishes last: each op started when its last input arrived "
            "(a data dependency, possibly across devices) or when the op before it on its device "
            "finished. The ops and waits on this path add up to the step time."),
        new_code_cell(
            "s = schedules['fddps']\n"
            "path = critical_path(s)\n"
            "df = s.to_dataframe().set_index('op')\n"
            "cp = df.loc[[s.graph.names[i] for i in path], ['device', 'start', 'duration', 'op_type']]\n"
            "cp['device'] = cp['device'].str.replace('/device:', '')\n"
            "busy = cp.duration.sum()\n"
            "print(f'{len(path)} ops on the critical path: {busy * 1e3:.3g} ms of compute, '\n"
            "      f'{(s.makespan - busy) * 1e3:.3g} ms waiting for transfers or devices '\n"
            "      f'(step {s.makespan * 1e3:.3g} ms); device changes along it: '\n"
            "      f'{int((cp.device.values[1:] != cp.device.values[:-1]).sum())}')\n"
            "cp.groupby('op_type').duration.agg(['count', 'sum']).sort_values('sum', ascending=False).head(8)"),
        new_markdown_cell("## Transfers between devices, and the first tenth of the step up close"),
        new_code_cell(
            "tl = fddps.simulate(s.graph, s.cluster, s.device, s.order)\n"
            "assert abs(tl.makespan - s.makespan) <= 1e-9 * s.makespan  # times come from the same replay\n"
            "t = tl.transfers.assign(MB=lambda d: d.bytes / 1e6, ms=lambda d: d.seconds * 1e3)\n"
            "print(f'{int(t.tensors.sum())} tensors, {t.MB.sum():.4g} MB between devices')\n"
            "t[['src', 'dst', 'tensors', 'MB', 'ms']].round(3)"),
        new_code_cell(
            "ax = plot_schedule(s, critical_path=True, transfers=True)\n"
            "ax.set_xlim(0, s.makespan * 1e3 / 10)\n"
            "ax.set_title('FD-DPS, first 10% of the step', fontsize=9);"),
    ]


def compare_algorithms():
    return [
        new_markdown_cell(
            "# Comparing algorithms (Table 5 style)\n\n"
            "Step time of every strategy per model and GPU count, from `experiments.table5`: the saved "
            "`experiments/results/table5.csv` when `python -m experiments.table5` was run, otherwise a "
            "small run made here (ResNet-50, CIFAR-10 size, batch 16, 2 and 4 simulated P100s). "
            "Costs are the analytic P100 preset; times are the simulator's replay of each schedule. "
            "Data parallelism is the estimate of `experiments.data_parallel` (one replica at batch / p "
            "plus a ring all-reduce)."),
        new_code_cell(SETUP),
        new_code_cell(
            "# Parameters of the small run\n"
            "MODELS, BATCH, DEVICES = ['resnet50'], 16, [2, 4]\n"
            "ALGORITHMS = ['fddps', 'fddps:improve=False', 'fastt', 'mpdps', 'heft', 'etf']"),
        new_code_cell(
            "from experiments import common, table5\n\n"
            "saved = ROOT / 'experiments' / 'results' / 'table5.csv'\n"
            "if saved.exists() and not SMALL:\n"
            "    results = pd.read_csv(saved)\n"
            "    source = f'saved run {saved}'\n"
            "else:\n"
            "    results, graphs = table5.run(MODELS, DEVICES, ALGORITHMS, batch=BATCH, progress=False)\n"
            "    source = f'small run here: {MODELS}, batch {BATCH}, GPUs {DEVICES}'\n"
            "strategies = [s for s in dict.fromkeys(results.strategy) if s != 'single']\n"
            "print(source, '-', len(results), 'rows')\n"
            "results[['model', 'devices', 'strategy', 'status', 'step_seconds', 'search_seconds']].head(12)"),
        new_markdown_cell("## Speedup over one GPU"),
        new_code_cell(
            "models = list(dict.fromkeys(results.model))\n"
            "fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 3.8), squeeze=False)\n"
            "for ax, model in zip(axes[0], models):\n"
            "    d = results[results.model == model]\n"
            "    single = d[d.strategy == 'single'].step_seconds.iloc[0]\n"
            "    wide = (d[d.devices > 1].pivot_table(index='devices', columns='strategy', values='step_seconds')\n"
            "            .reindex(columns=strategies))\n"
            "    (single / wide).rename(columns=common.label).plot.bar(ax=ax, width=0.85, legend=False)\n"
            "    ax.axhline(1, color='grey', lw=0.8)\n"
            "    ax.set_title(f'{model}: one GPU {single * 1e3:.3g} ms', fontsize=10)\n"
            "    ax.set_xlabel('GPUs'); ax.set_ylabel('speedup over one GPU')\n"
            "axes[0][0].legend(fontsize=7, ncol=2)\n"
            "fig.tight_layout()"),
        new_markdown_cell(
            "## FD-DPS against FastT and MP-DPS\n\n"
            "The paper's measure: `(baseline - FD-DPS) / baseline`. `FD-DPS(paper)` is the algorithm "
            "without our refinement pass (`fddps:improve=False`)."),
        new_code_cell(
            "rows = []\n"
            "for (model, p), d in results[results.devices > 1].groupby(['model', 'devices']):\n"
            "    t = d.set_index('strategy').step_seconds\n"
            "    for fd in ('fddps', 'fddps:improve=False'):\n"
            "        for base in ('fastt', 'mpdps'):\n"
            "            if fd in t and base in t:\n"
            "                rows.append(dict(model=model, GPUs=p, pair=f'{common.label(fd)} vs {common.label(base)}',\n"
            "                                 speedup=100 * common.speedup(t[base], t[fd])))\n"
            "gain = pd.DataFrame(rows)\n"
            "ax = gain.pivot_table(index=['model', 'GPUs'], columns='pair', values='speedup').plot.bar(figsize=(10, 3.5))\n"
            "ax.axhline(0, color='grey', lw=0.8); ax.set_ylabel('speedup (%)')\n"
            "gain.round(2)"),
        new_markdown_cell(
            "## Memory: reserved by the schedulers vs the simulator's peak\n\n"
            "The schedulers reserve every op's `memory + transient` bytes on its device for the whole "
            "step (conservative); the simulator frees each output after its last consumer. Points above "
            "the diagonal are schedules whose reservation exceeds what is really held."),
        new_code_cell(
            "ok = results[results.status == 'ok']\n"
            "fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))\n"
            "for s, d in ok.groupby('strategy'):\n"
            "    ax1.scatter(d.peak_max / 1e9, d.reserved_max / 1e9, label=common.label(s), s=18)\n"
            "lim = max(ok.reserved_max.max(), ok.peak_max.max()) / 1e9 * 1.05\n"
            "ax1.plot([0, lim], [0, lim], color='grey', lw=0.8)\n"
            "ax1.set_xlabel('simulated peak per device (GB)'); ax1.set_ylabel('reserved per device (GB)')\n"
            "ax1.legend(fontsize=7)\n"
            "search = ok[ok.strategy != 'data_parallel'].pivot_table(index='model', columns='strategy',\n"
            "                                                          values='search_seconds', aggfunc='median')\n"
            "search.rename(columns=common.label).plot.bar(ax=ax2, logy=True, legend=False)\n"
            "ax2.set_ylabel('search time (s), median over GPU counts')\n"
            "fig.tight_layout()\n"
            "(ok.reserved_max / ok.peak_max).describe().round(2)"),
    ]


SPLIT_GRAPH = '''\
MS, B, H = 1e-3, 64, 32          # milliseconds; batch 64 of 32 x 32 images (CIFAR-10), as the paper
act = lambda c, h=H: B * h * h * c * 4.0          # bytes of a float32 NHWC activation
W1_1, W1_2, FC6 = 3 * 3 * 3 * 64 * 4, 3 * 3 * 64 * 64 * 4, 136766.44e3   # filter / weight bytes
ops, edges = [], []

def op(name, ms, op_type, memory=0.0, out=0.0, group=None):
    ops.append(dict(name=name, seconds=ms * MS, op_type=op_type, memory=memory, out=out, group=group))

def edge(a, b, nbytes):
    edges.append((a, b, nbytes))

# Forward: the paper's Table 6 ops with its times (Conv1_1 2.146 ms, Conv1_2 15.673 ms, ReLU 2.908 ms,
# Pool1 0.96 ms, Fc6 1.654 ms); the rest of VGG-16 lumped into one op each way.
op("images", 0.01, "Const", out=act(3))
op("conv1_1/w", 0.01, "VarHandleOp", memory=2 * W1_1, group="conv1_1")
op("conv1_1", 2.146, "Conv2D", out=act(64)); edge("images", "conv1_1", act(3)); edge("conv1_1/w", "conv1_1", W1_1)
op("relu1_1", 2.908, "Relu", out=act(64)); edge("conv1_1", "relu1_1", act(64))
op("conv1_2/w", 0.01, "VarHandleOp", memory=2 * W1_2, group="conv1_2")
op("conv1_2", 15.673, "Conv2D", out=act(64)); edge("relu1_1", "conv1_2", act(64)); edge("conv1_2/w", "conv1_2", W1_2)
op("relu1_2", 2.908, "Relu", out=act(64)); edge("conv1_2", "relu1_2", act(64))
op("pool1", 0.96, "MaxPool", out=act(64, 16)); edge("relu1_2", "pool1", act(64))
op("conv2_to_5", 20.0, "Conv2D", out=act(512, 1)); edge("pool1", "conv2_to_5", act(64, 16))
op("fc6/w", 0.01, "VarHandleOp", memory=2 * FC6, group="fc6")
op("fc6", 1.654, "MatMul", out=B * 4096 * 4); edge("conv2_to_5", "fc6", act(512, 1)); edge("fc6/w", "fc6", FC6)
op("loss", 0.5, "SoftmaxCrossEntropyWithLogits", out=B * 4096 * 4); edge("fc6", "loss", B * 4096 * 4)
# Backward (Conv1_2bp: 36.466 ms in the paper, for each of the two gradients here) and the updates.
op("fc6_grad_x", 1.654, "MatMul", out=act(512, 1)); edge("loss", "fc6_grad_x", B * 4096 * 4); edge("fc6/w", "fc6_grad_x", FC6)
op("fc6_grad_w", 1.654, "MatMul", out=FC6); edge("loss", "fc6_grad_w", B * 4096 * 4); edge("conv2_to_5", "fc6_grad_w", act(512, 1))
op("fc6/apply", 0.4, "ResourceApplyMomentum", group="fc6"); edge("fc6_grad_w", "fc6/apply", FC6); edge("fc6/w", "fc6/apply", 0)
op("conv5_to_2_grad", 40.0, "Conv2DBackpropInput", out=act(64, 16)); edge("fc6_grad_x", "conv5_to_2_grad", act(512, 1))
op("pool1_grad", 1.9, "MaxPoolGrad", out=act(64)); edge("conv5_to_2_grad", "pool1_grad", act(64, 16)); edge("relu1_2", "pool1_grad", act(64))
op("relu1_2_grad", 2.908, "ReluGrad", out=act(64)); edge("pool1_grad", "relu1_2_grad", act(64)); edge("relu1_2", "relu1_2_grad", act(64))
op("conv1_2_grad_x", 36.466, "Conv2DBackpropInput", out=act(64)); edge("relu1_2_grad", "conv1_2_grad_x", act(64)); edge("conv1_2/w", "conv1_2_grad_x", W1_2)
op("conv1_2_grad_w", 36.466, "Conv2DBackpropFilter", out=W1_2); edge("relu1_2_grad", "conv1_2_grad_w", act(64)); edge("relu1_1", "conv1_2_grad_w", act(64))
op("conv1_2/apply", 0.05, "ResourceApplyMomentum", group="conv1_2"); edge("conv1_2_grad_w", "conv1_2/apply", W1_2); edge("conv1_2/w", "conv1_2/apply", 0)
op("relu1_1_grad", 2.908, "ReluGrad", out=act(64)); edge("conv1_2_grad_x", "relu1_1_grad", act(64)); edge("relu1_1", "relu1_1_grad", act(64))
op("conv1_1_grad_w", 4.3, "Conv2DBackpropFilter", out=W1_1); edge("relu1_1_grad", "conv1_1_grad_w", act(64)); edge("images", "conv1_1_grad_w", act(3))
op("conv1_1/apply", 0.01, "ResourceApplyMomentum", group="conv1_1"); edge("conv1_1_grad_w", "conv1_1/apply", W1_1); edge("conv1_1/w", "conv1_1/apply", 0)
ops = pd.DataFrame(ops)
print(len(ops), "ops,", len(edges), "edges")'''


def split_decisions():
    return [
        new_markdown_cell(
            "# Intra-op split decisions\n\n"
            "FD-DPS's first step splits compute-heavy ops (Conv2D and its gradients, MatMul) into parts "
            "along a tensor dimension when the cost model says the parts, the slicing, the transfers and "
            "the combining beat the whole op (`fddps.algorithms.split_step.plan_splits`); the split "
            "graph (`fddps.strategy.fddps_splits.apply_splits`) is kept only when its schedule is "
            "faster. The paper's Table 6 lists such decisions for VGG-16.\n\n"
            "So that the decisions can be set beside the paper's, this notebook uses the scheduler-side "
            "split (no TensorFlow) on a small **synthetic** graph: the first block of VGG-16's training "
            "step with the op times of the paper's Table 6, the rest of the network lumped into one op "
            "each way, on 4 GPUs joined by PCIe 3 (12 GB/s, 10 us). The split candidates are written "
            "by hand here, one rule per op (batch for the convolutions, rows for the MatMul)."),
        new_code_cell(SETUP),
        new_code_cell(SPLIT_GRAPH),
        new_code_cell(
            "import fddps\n"
            "from fddps.plot import plot_schedule\n"
            "from fddps.algorithms.split_step import plan_splits\n"
            "from fddps.strategy.fddps_splits import SplitCandidate, decisions_table, rules_for\n\n"
            "def rule(op_type, dim):\n"
            "    return next(r for r in rules_for(op_type, {'data_format': 'NHWC'}) if r.dim == dim)\n\n"
            "def candidate(name, op_type, dim, sliced, out_bytes, whole_bytes):\n"
            "    # Slicing and combining are memory-bound copies on a P100 (732 GB/s at 70 %) plus 10 us.\n"
            "    copy = 2 * out_bytes / (732e9 * 0.7) + 10e-6\n"
            "    return SplitCandidate(name, rule(op_type, dim), B, tuple(sliced), out_bytes,\n"
            "                          slice_cost=(copy,), combine_cost=(copy,), whole_bytes=whole_bytes)\n\n"
            "# Split on the batch (rows for the MatMul); the filters / weights go whole to every part.\n"
            "candidates = [\n"
            "    candidate('conv1_1', 'Conv2D', 'batch', [('images', act(3))], act(64), W1_1),\n"
            "    candidate('conv1_2', 'Conv2D', 'batch', [('relu1_1', act(64))], act(64), W1_2),\n"
            "    candidate('conv1_2_grad_x', 'Conv2DBackpropInput', 'batch', [('relu1_2_grad', act(64))],\n"
            "              act(64), W1_2),\n"
            "    candidate('conv1_2_grad_w', 'Conv2DBackpropFilter', 'batch',\n"
            "              [('relu1_2_grad', act(64)), ('relu1_1', act(64))], W1_2, 0.0),\n"
            "    candidate('fc6', 'MatMul', 'rows', [('conv2_to_5', act(512, 1))], B * 4096 * 4, FC6),\n"
            "]\n"
            "graph = fddps.OpGraph(ops.name.tolist(), ops.seconds.tolist(), edges, memory=ops.memory.tolist(),\n"
            "                      transient=ops.out.tolist(), op_types=ops.op_type.tolist(),\n"
            "                      colocation=ops.group.tolist(), split_candidates=candidates)\n"
            "cluster = fddps.Cluster.homogeneous(4, bandwidth=12e9, latency=10e-6, type='GPU',\n"
            "                                    names=[f'/device:GPU:{i}' for i in range(4)])\n"
            "graph"),
        new_markdown_cell(
            "## The decisions, beside the paper's Table 6\n\n"
            "`estimated_gain` is the planner's estimate of the seconds saved on the op itself: the "
            "whole op minus slicing, the largest part, moving a part of each sliced input, the inputs "
            "that go whole to every part (filters, weights) and the output, and combining. The schedule "
            "decides in the end: the split graph is kept only when its step is shorter."),
        new_code_cell(
            "decisions = plan_splits(graph, cluster)\n"
            "table = decisions_table(decisions).set_index('op')\n"
            "paper = pd.DataFrame({'paper_ms': [2.146, 15.673, 36.466, 36.466, 2.908, 0.96, 1.654],\n"
            "                      'paper_split': ['no', 'yes', 'yes', 'yes', 'no', 'no', 'no']},\n"
            "                     index=['conv1_1', 'conv1_2', 'conv1_2_grad_x', 'conv1_2_grad_w',\n"
            "                            'relu1_2', 'pool1', 'fc6'])\n"
            "view = paper.join(table[['op_type', 'dim', 'parts', 'estimated_gain']], how='left')\n"
            "view['ours_split'] = np.where(view.parts.notna(), 'yes', 'no')\n"
            "view['estimated_gain_ms'] = (view.pop('estimated_gain') * 1e3).round(3)\n"
            "view"),
        new_markdown_cell("## Schedules with and without splitting"),
        new_code_cell(
            "runs = {'single': fddps.schedule(graph, cluster, 'single'),\n"
            "        'D-DPS(-F): fddps:split=False': fddps.schedule(graph, cluster, 'fddps', split=False),\n"
            "        'FD-DPS: fddps': fddps.schedule(graph, cluster, 'fddps'),\n"
            "        'FastT (splits critical ops only)': fddps.schedule(graph, cluster, 'fastt')}\n"
            "for s in runs.values():\n"
            "    s.validate()\n"
            "pd.DataFrame([dict(schedule=k, step_ms=s.makespan * 1e3, ops=s.graph.num_ops,\n"
            "                   splits_kept=len(s.info.get('splits', [])),\n"
            "                   unsplit_ms=s.info.get('unsplit_makespan', np.nan) * 1e3)\n"
            "              for k, s in runs.items()]).round(3)"),
        new_code_cell(
            "fig, axes = plt.subplots(2, 1, figsize=(13, 5.5))\n"
            "for ax, key in zip(axes, ['D-DPS(-F): fddps:split=False', 'FD-DPS: fddps']):\n"
            "    plot_schedule(runs[key], ax=ax, critical_path=True, transfers=True)\n"
            "    ax.set_title(f'{key}: ' + ax.get_title(), fontsize=9)\n"
            "fig.tight_layout()"),
        new_markdown_cell("## Where the parts of each split op ran"),
        new_code_cell(
            "s = runs['FD-DPS: fddps']\n"
            "df = s.to_dataframe()\n"
            "parts = df[df.op.str.contains('/fddps_')].copy()\n"
            "parts['split_op'] = parts.op.str.split('/fddps_').str[0]\n"
            "parts['device'] = parts.device.str.replace('/device:', '')\n"
            "(parts.assign(ms=parts.duration * 1e3)\n"
            "      .groupby(['split_op', 'device']).ms.agg(['count', 'sum']).round(3))"),
    ]


def write(name, cells):
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}})
    nbformat.validate(nb)
    path = HERE / name
    nbformat.write(nb, path)
    return path


def main():
    for name, cells in (("schedules.ipynb", schedules()),
                        ("compare_algorithms.ipynb", compare_algorithms()),
                        ("split_decisions.ipynb", split_decisions())):
        print("wrote", write(name, cells))


if __name__ == "__main__":
    main()
