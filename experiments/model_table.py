"""Print the table of the six training graphs beside the paper's Table 3.

For each model, at the paper's batch size (64, or 16 for ResNet-200 and
NASNet-A Large) and CIFAR-10 size (32x32, 10 classes) unless told otherwise:

* nodes / edges of the whole GraphDef (edges = entries of the nodes' input
  lists, data and control), and of the step subgraph (ancestors of
  ``train_op`` and ``loss``, i.e. without the initialisers);
* trainable parameters of that graph;
* build time (Python graph construction, seconds);
* one-step CPU time: median wall time of ``--steps`` steps after one warm-up
  step (the warm-up includes Grappler's optimisation), on this machine;
* the paper's operator and edge counts (TF 1.14, TF-Slim graphs).

A second table gives the ImageNet-size parameter counts (forward pass only,
without auxiliary heads) against the references in ``slim_models``.

The models that do not fit on one device (``slim_models.LARGE_MODELS``:
``wide_resnet``, ``rnn_lm``, ``nmt``) get graph rows at their default
configuration (WResNet-50-4; FlexFlow's RNNLM and NMT) and batch
(`LARGE_BATCH`), changed with ``--model-option KEY=VALUE``; their step is run
only with ``--run-large`` (WResNet-50-4 alone holds 383M parameters). A third
table lists the papers' configurations (Tofu's Table 2 WResNets and RNNs,
FlexFlow's RNNLM and NMT) with their parameter counts, counted from the
layer shapes (nothing built), and the weight sizes Tofu reports.

Usage::

    python -m experiments.model_table                 # everything
    python -m experiments.model_table --no-run        # graphs only
    python -m experiments.model_table --models vgg16 resnet50 --steps 5
    python -m experiments.model_table --models rnn_lm --model-option hidden_size=512
    python -m experiments.model_table --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, List

try:  # optional progress bar
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


def _progress(items, desc):
    if tqdm is None:
        return items
    return tqdm(items, desc=desc, file=sys.stderr, leave=False)


#: Batch of the graph rows of the large models: Tofu trains WResNet-152-10 at
#: 8 (Section 7); FlexFlow's RNNLM and NMT figures use 64.
LARGE_BATCH = {"wide_resnet": 8, "rnn_lm": 64, "nmt": 64}


def measure(name: str, batch: int, dataset: str, steps: int,
            threads: int, **model_options) -> Dict:
    """Build one model's training graph and (if ``steps``) time its steps.

    ``model_options`` go to ``slim_models.build_training_graph``; the
    sequence models (``rnn_lm``, ``nmt``) take no ``dataset``.
    """
    import tensorflow as tf

    import slim_models

    if slim_models.SPECS[name].inputs == "images":
        model_options = dict(model_options, dataset=dataset)
    t0 = time.perf_counter()
    m = slim_models.build_training_graph(name, batch, **model_options)
    build_s = time.perf_counter() - t0
    full = slim_models.graph_size(m.graph_def)
    step = slim_models.graph_size(slim_models.step_graph_def(m))
    options = {k: v for k, v in m.options.items() if v is not None}
    row = dict(model=name, options=options, batch=batch, image_size=m.image_size,
               num_classes=m.num_classes, nodes=full["nodes"],
               edges=full["edges"], step_nodes=step["nodes"],
               step_edges=step["edges"],
               params=slim_models.count_parameters(m), build_s=build_s,
               first_step_s=None, step_s=None, loss=None)
    if steps > 0:
        cfg = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=threads,
            inter_op_parallelism_threads=threads)
        with tf.compat.v1.Session(graph=m.graph, config=cfg) as sess:
            sess.run(m.init_op)
            t0 = time.perf_counter()
            sess.run(m.fetches())
            row["first_step_s"] = time.perf_counter() - t0
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                _, loss = sess.run(m.fetches())
                times.append(time.perf_counter() - t0)
            row["step_s"] = statistics.median(times)
            row["loss"] = float(loss)
    return row


def papers_configurations() -> List[Dict]:
    """Tofu's Table 2 models and FlexFlow's RNNLM and NMT: parameters counted
    from the layer shapes, and the size Tofu's Table 2 reports (GiB at 12
    bytes per parameter: weights, gradients, one optimizer slot)."""
    from slim_models import resnet, rnn

    rows = []
    for (depth, width), gib in sorted(resnet.TOFU_TABLE2_GIB.items()):
        params = resnet.parameter_count(depth, width)
        rows.append(dict(model=f"WResNet-{depth}-{width}", build="wide_resnet",
                         options=dict(depth=depth, width=width), params=params,
                         counted="all", paper="Tofu Table 2", paper_gib=gib))
    for (layers, hidden), gib in sorted(rnn.TOFU_TABLE2_GIB.items()):
        options = rnn.tofu_rnn_options(layers, hidden)
        parts = rnn.rnn_lm_parameter_count(**options)
        rows.append(dict(model=f"RNN-{layers}-{hidden // 1024}K", build="rnn_lm",
                         options=options, params=parts["lstm"],
                         counted="LSTM stack", paper="Tofu Table 2", paper_gib=gib))
    rows.append(dict(model="FlexFlow RNNLM", build="rnn_lm", options=rnn.FLEXFLOW_RNNLM,
                     params=rnn.rnn_lm_parameter_count(**rnn.FLEXFLOW_RNNLM)["total"],
                     counted="all", paper="FlexFlow Sec. 8 (no count)", paper_gib=None))
    rows.append(dict(model="FlexFlow NMT", build="nmt", options=rnn.FLEXFLOW_NMT,
                     params=rnn.nmt_parameter_count(**rnn.FLEXFLOW_NMT)["total"],
                     counted="all", paper="FlexFlow Sec. 8 (no count)", paper_gib=None))
    for r in rows:
        r["gib_12_bytes"] = r["params"] * 12 / 2 ** 30
        r["diff_pct"] = (None if r["paper_gib"] is None
                         else 100.0 * (r["gib_12_bytes"] - r["paper_gib"]) / r["paper_gib"])
    return rows


def imagenet_params(name: str) -> Dict:
    """ImageNet-size trainable parameters, with and without the aux head
    (large models: at their default configuration)."""
    import slim_models

    has_aux = name in ("inception_v3", "pnasnet_mobile", "nasnet_large")
    t0 = time.perf_counter()
    opts = {"aux_head": False} if has_aux else {}
    count = slim_models.model_parameter_count(name, **opts)
    spec = slim_models.SPECS[name]
    return dict(model=name, image_size=spec.default_image_size or "-",
                params=count,
                params_with_aux=(slim_models.model_parameter_count(name)
                                 if has_aux else None),
                reference=spec.reference_params,
                diff_pct=100.0 * (count - spec.reference_params)
                / spec.reference_params,
                source=spec.reference_source,
                build_s=time.perf_counter() - t0)


def _fmt(v, spec="{:,}"):
    return "-" if v is None else spec.format(v)


def print_tables(rows: List[Dict], prow: List[Dict],
                 papers: List[Dict] = ()) -> None:
    import slim_models

    if rows:
        hdr = ("model", "batch", "size", "nodes", "edges", "step nodes",
               "step edges", "params", "build s", "1st step s", "step s",
               "paper ops", "paper edges")
        lines = [hdr]
        for r in rows:
            pb, pops, pedges = slim_models.PAPER_TABLE3.get(r["model"], (0, None, None))
            model = r["model"]
            if r["model"] in slim_models.LARGE_MODELS:
                model += " (" + ", ".join(f"{k}={v}" for k, v in r["options"].items()) + ")"
            lines.append((model, str(r["batch"]), str(r["image_size"] or "-"),
                          _fmt(r["nodes"]), _fmt(r["edges"]),
                          _fmt(r["step_nodes"]), _fmt(r["step_edges"]),
                          _fmt(r["params"]), _fmt(r["build_s"], "{:.1f}"),
                          _fmt(r["first_step_s"], "{:.2f}"),
                          _fmt(r["step_s"], "{:.3f}"),
                          f"{pops:,} (b{pb})" if pops else "-", _fmt(pedges)))
        _print_grid(lines)
    if prow:
        print()
        hdr = ("model", "ImageNet size", "params (no aux)", "reference",
               "diff %", "with aux head", "reference source")
        lines = [hdr]
        for r in prow:
            lines.append((r["model"], str(r["image_size"]), _fmt(r["params"]),
                          _fmt(r["reference"]), f"{r['diff_pct']:+.2f}",
                          _fmt(r["params_with_aux"]), r["source"]))
        _print_grid(lines)
    if papers:
        print()
        print("Papers' configurations, parameters counted from the layer shapes (nothing built); "
              "GiB at 12 bytes/parameter (weights, gradients, one optimizer slot: our reading "
              "of Tofu's Table 2)")
        hdr = ("model", "counted", "params", "GiB (12 B/param)", "paper GB", "diff %", "source")
        lines = [hdr]
        for r in papers:
            lines.append((r["model"], r["counted"], _fmt(r["params"]),
                          f"{r['gib_12_bytes']:.2f}", _fmt(r["paper_gib"], "{:.1f}"),
                          _fmt(r["diff_pct"], "{:+.1f}"), r["paper"]))
        _print_grid(lines)


def _print_grid(lines):
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(lines[0]))]
    for k, line in enumerate(lines):
        print("  ".join(str(c).rjust(w) if j else str(c).ljust(w)
                        for j, (c, w) in enumerate(zip(line, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    import slim_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(slim_models.ALL_MODELS),
                    choices=slim_models.ALL_MODELS)
    ap.add_argument("--model-option", nargs="+", default=[], metavar="KEY=VALUE",
                    help="options of the large models (e.g. depth=152 width=10, "
                         "hidden_size=4096 num_layers=6)")
    ap.add_argument("--run-large", action="store_true",
                    help="also time the steps of the large models (default: graphs only)")
    ap.add_argument("--no-papers", action="store_true",
                    help="skip the table of the papers' large configurations")
    ap.add_argument("--dataset", default="cifar10",
                    choices=("cifar10", "imagenet"))
    ap.add_argument("--batch", type=int, default=None,
                    help="batch for every model (default: the paper's)")
    ap.add_argument("--steps", type=int, default=3,
                    help="timed steps after the warm-up (default 3)")
    ap.add_argument("--no-run", action="store_true",
                    help="build graphs only, time no step")
    ap.add_argument("--no-imagenet-params", action="store_true",
                    help="skip the ImageNet parameter-count table")
    ap.add_argument("--threads", type=int, default=2,
                    help="TF intra/inter-op threads (default 2)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)

    steps = 0 if args.no_run else args.steps
    try:
        large_options = slim_models.parse_model_options(args.model_option)
    except ValueError as err:
        ap.error(str(err))
    known = {k for name in args.models if name in slim_models.LARGE_MODELS
             for k in slim_models.SPECS[name].defaults}
    unknown = sorted(set(large_options) - known)
    if unknown:
        ap.error(f"--model-option {unknown[0]!r}: no selected large model takes it "
                 f"(their options: {sorted(known)})")
    rows = []
    for name in _progress(args.models, "graphs"):
        if name in slim_models.LARGE_MODELS:
            batch = args.batch or LARGE_BATCH[name]
            options = {k: v for k, v in large_options.items()
                       if k in slim_models.SPECS[name].defaults}
            rows.append(measure(name, batch, args.dataset, steps if args.run_large else 0,
                                args.threads, **options))
        else:
            batch = args.batch or slim_models.PAPER_TABLE3[name][0]
            rows.append(measure(name, batch, args.dataset, steps, args.threads))
    prow = []
    if not args.no_imagenet_params:
        for name in _progress(args.models, "ImageNet params"):
            prow.append(imagenet_params(name))
    papers = [] if args.no_papers else papers_configurations()
    import tensorflow as tf
    timing = (f"step time = median of {steps} step(s) after one warm-up, "
              f"{args.threads} threads" if steps else "no step run")
    print(f"slim_models training graphs, TensorFlow {tf.__version__}, "
          f"dataset {args.dataset}, {timing}")
    print_tables(rows, prow, papers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graphs": rows, "imagenet_params": prow, "papers": papers}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
