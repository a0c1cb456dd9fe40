"""Issue 12's equality matrix: each network's training step under data
parallelism, a parameter (channel) split and the mixed strategy, rewritten
into a real GraphDef and run for one step on 4 CPU devices of one process and
on the 2 workers of ``local_cluster(2, threads_per_worker=1)``, against the
unsplit graph's step.

For every cell (network x strategy x cluster) the experiment records the
difference of the loss during the step and of the next step's loss (as the
tests' ``_train`` does), and of every variable after the step: the trainable
variables, the batch-norm moving averages and the momentum slots (read from
every float ``VarHandleOp`` of the unsplit graph), with the worst variable's
name. The data is the models' in-graph, constant-seeded stateless random batch
(`slim_models.training`): every run sees the same images, labels and initial
variables.

**Difference.** For a quantity ``b`` (unsplit) and ``a`` (strategy), the
relative difference is ``max |a - b| / (|b| + 0.1)`` over its elements, so a
quantity passes at ``rel <= 1e-5`` exactly when
``np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)`` passes, the tests'
criterion (values below 0.1 are held to 1e-6 absolute). ``worst_rel`` is the
largest over the two losses and every variable; a cell passes at 1e-5 when it
is at most 1e-5.

**Float32 rounding, measured.** The project's standard is "loss and variables
after a step equal to float32 rounding". Operationally: the unsplit graph is
run once more with its input batch rounded differently, every image value
moved by one float32 ulp, up or down at random (``np.nextafter``; fixed
seed), fed in place of ``data/images``. That is the same data rounded to
float32 the other way, the smallest change float32 can make to it, and it
changes nothing else (same graph, same kernels, same session config). How far
the step then moves a quantity is that quantity's *rounding spread*: how much
this network's step amplifies one rounding error at its input. A strategy
changes nothing but the order of sums (partial sums over channel parts,
gradients summed over sample parts), so its rounding errors are of the same
kind, injected at many ops instead of once at the input. Scaling the whole
batch by ``1 + 2**-23`` would be the obvious alternative but is no test at
all for the batch-norm networks: the first batch norm removes a common scale.
The input perturbation injects rounding at one place, the input, while a
strategy reorders sums at many ops, late layers included, where the input's
perturbation may arrive damped. So a second probe injects rounding where the
kernels are: the unsplit graph run with 2 intra-op threads instead of 1
(``spread:threads``), which reorders the sums inside every kernel that shards
its reduction over threads (convolutions, batch norm), and changes nothing in
kernels that do not; alone it could measure zero where rounding does matter.

The perturbation is drawn ``ROUNDING_DRAWS`` (3) times (seeds 0, 1, 2) and a
quantity's spread is the largest of its three differences: in the batch-norm
networks at batch 8 one step is chaotic (one ulp at the input moves conv1's
momentum slot by ten times its size), a single draw is one sample of a
heavy-tailed amplification, and over hundreds of variables some single draws
are far below typical. A quantity's rounding spread is the largest of its
differences under the three input draws and the thread probe (all four only
change rounding); ``ratio_ulp`` is the ratio against the input draws alone,
to show what the thread probe adds. Four probes are still a lower estimate.

A cell is **equal to float32 rounding** when every quantity (each loss, each
variable) either passes at 1e-5 or differs by at most ``ROUNDING_FACTOR`` (4)
times its own rounding spread; ``rounding_ratio`` is the largest
``rel / spread`` over the quantities above 1e-5. Where the spread itself is of
order 1 (the chaotic steps), this criterion says only that the strategy moves
the step no more than rounding does: it cannot tell a correct rewrite from a
slightly wrong one there, and the table says so by the size of the spread.
The unsplit graph is also run a second time unchanged (``spread:repeat``) to
show whether the reference itself is reproducible in this process; it is
reported, not used (0 in five networks; NASNet-A Large's depthwise weights'
momentum slots differ by up to 1.2e-2 between two identical runs).

**Float64: the decisive check.** Every cell is run once more with both
graphs converted to float64
(:func:`fddps.tf.float64.as_float64`: the unsplit graph, and the strategy's
rewrite of the float32 graph, widened the same way). A correct rewrite
reorders sums only, so in float64 its rounding is ~1e-16 per operation
instead of 6e-8, a ReLU input within rounding of zero becomes nine orders of
magnitude less likely, and the step is smooth again: the two must agree to
many digits. A wrong rewrite (a missing halo row, a statistic over the wrong
rows, a float32-rounded constant) differs by far more. The float64 rounding
spread is measured as above, with the input moved one float64 ulp
(``F64_DRAWS`` draws). ``verdict_f64`` is **equal in float64** when every
quantity is within ``F64_RTOL`` (1e-8, relative as above) or within
``ROUNDING_FACTOR`` times its float64 spread; ``f64_worst_rel`` and
``f64_ratio`` say by how much.

**Kernel probe** (``--kernel-probe``, a diagnostic for cells the above calls
DIFFERS): the unsplit step once more in a fresh process with
``TF_ENABLE_ONEDNN_OPTS=0`` (``spread:onednn_off``), i.e. the same graph on
TensorFlow's Eigen kernels instead of oneDNN's: two correct float32
implementations of every op, rounding inside every layer rather than at the
input only. ``verdict_kernels`` and ``ratio_kernels`` then compare each
quantity with the largest of all probes; ``verdict`` stays as above.

Run::

    python -m experiments.strategy_equality                   # the six networks, batch 8
    python -m experiments.strategy_equality --models vgg16 --clusters cpu4 \\
        --strategies data_parallel --batch 2
    python -m experiments.strategy_equality --models inception_v3 \\
        --strategies data_parallel --kernel-probe --out experiments/results/k.csv

Rows are appended to the CSV after every cell (``--out``), so a run cut short
keeps what it measured; ``--append`` adds to an existing CSV instead of
starting over (to finish missing cells).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import pandas as pd

from experiments.common import RESULTS, ensure_parent

#: The six networks, cheapest first (NASNet-A Large takes minutes per cell).
MODELS = ("vgg16", "resnet50", "inception_v3", "pnasnet_mobile", "resnet200", "nasnet_large")
STRATEGIES = ("data_parallel", "parameter_split", "mixed")
CLUSTERS = ("cpu4", "workers2")
CPU4 = tuple(f"/device:CPU:{i}" for i in range(4))
#: Tolerance of "equal" (with ``atol = RTOL / 10``: the tests' 1e-5 / 1e-6).
RTOL = 1e-5
FLOOR = 0.1
#: A quantity within this many times its rounding spread is equal to float32 rounding.
ROUNDING_FACTOR = 4.0
#: Independent one-ulp input perturbations; a quantity's spread is the largest.
ROUNDING_DRAWS = 3
#: The float64 check: tolerance, and one-float64-ulp input draws for its spread.
F64_RTOL = 1e-8
F64_DRAWS = 2
LOSSES = ("loss (step)", "loss (next)")
COLUMNS = ["model", "batch", "image_size", "cluster", "strategy", "devices", "status",
           "ops", "ops_split", "loss_step_rel", "loss_next_rel", "loss_rel", "loss_abs",
           "var_rel", "var_abs", "worst_var", "trainable_rel", "worst_rel", "worst_quantity",
           "spread_rel", "spread_worst_rel", "spread_worst_quantity", "rounding_ratio",
           "ratio_quantity", "ratio_ulp", "pass_1e5", "verdict",
           "ratio_kernels", "verdict_kernels", "f64_loss_rel", "f64_worst_rel",
           "f64_worst_quantity", "f64_spread_rel", "f64_ratio", "verdict_f64", "rewrite_s",
           "run_s", "seconds"]


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    return tf


def cpu4_config(intra_op_threads=1):
    """The tests' session config: 4 CPU devices, 1 intra-op and 2 inter-op threads."""
    tf = _tf()
    return tf.compat.v1.ConfigProto(device_count={"CPU": 4}, allow_soft_placement=False,
                                    inter_op_parallelism_threads=2,
                                    intra_op_parallelism_threads=intra_op_threads)


def variable_names(graph_def):
    """``[(name, dtype)]`` of the float resource variables of ``graph_def``, in its order."""
    tf = _tf()
    out = []
    for node in graph_def.node:
        if node.op == "VarHandleOp":
            dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
            if dtype.is_floating:
                out.append((node.name, dtype))
    return out


def run_step(graph_def, model, variables, target="", config=None, images=None):
    """Run ``init_op``, one ``[train_op, loss]`` step and the next loss; read ``variables``.

    ``images``: an array fed in place of the model's image batch (every run of
    the step and of the next loss). Returns ``{quantity: np.ndarray}``: the
    two losses (:data:`LOSSES`) and each variable by name.
    """
    tf = _tf()
    feed = {} if images is None else {model.images.name: images}
    if target:
        # The workers keep resource variables between sessions: a float32 run's
        # variables would clash with the float64 run's of the same names.
        tf.compat.v1.Session.reset(target)
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        reads = [tf.raw_ops.ReadVariableOp(resource=graph.get_tensor_by_name(f"{name}:0"),
                                           dtype=dtype) for name, dtype in variables]
        with tf.compat.v1.Session(target, graph=graph,
                                  config=config if config is not None else cpu4_config()) as sess:
            sess.run(model.init_op.name)
            step = sess.run([model.train_op.name, model.loss.name], feed)[1]
            after = sess.run(model.loss.name, feed)
            values = sess.run(reads)
    out = {LOSSES[0]: np.asarray(step), LOSSES[1]: np.asarray(after)}
    out.update((name, v) for (name, _), v in zip(variables, values))
    return out


def unsplit_images(model, config=None, graph_def=None):
    """The model's image batch, as the step (``graph_def``, default the model's) sees it."""
    tf = _tf()
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(model.graph_def if graph_def is None else graph_def,
                                       name="")
        with tf.compat.v1.Session(graph=graph, config=config or cpu4_config()) as sess:
            return sess.run(model.images.name)


def ulp_perturbed(x, seed=0, dtype=np.float32):
    """``x`` with every element moved one ulp of ``dtype`` up or down (at random, fixed
    seed)."""
    x = np.asarray(x, dtype=dtype)
    up = np.random.default_rng(seed).random(x.shape) < 0.5
    return np.where(up, np.nextafter(x, dtype(np.inf)),
                    np.nextafter(x, dtype(-np.inf))).astype(dtype)


def differences(got, ref):
    """``{quantity: (rel, abs)}``: ``rel = max |a - b| / (|b| + 0.1)``, ``abs = max |a - b|``."""
    out = {}
    for name, want in ref.items():
        a = np.asarray(got[name], dtype=np.float64)
        b = np.asarray(want, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{name}: shape {a.shape} != {b.shape}")
        d = np.abs(a - b)
        if not np.all(np.isfinite(d)):
            out[name] = (np.inf, np.inf)
            continue
        out[name] = (float((d / (np.abs(b) + FLOOR)).max(initial=0.0)), float(d.max(initial=0.0)))
    return out


def widest(spread, diff):
    """``spread`` widened by one more probe's :func:`differences`: per quantity the larger."""
    return {q: max(diff[q], spread.get(q, (0.0, 0.0))) for q in diff}


def _ratio(diff, spread, tol=RTOL):
    """The largest ``rel / spread`` over the quantities above ``tol``, and where."""
    ratio, where = 0.0, ""
    for q, (rel, _) in diff.items():
        if rel > tol:
            s = spread[q][0]
            r = rel / s if s > 0 else np.inf
            if r > ratio:
                ratio, where = r, q
    return ratio, where


def summarize(diff, spread=None, trainable=(), spread_ulp=None):
    """One cell's columns from its :func:`differences` (and the network's rounding spread).

    ``verdict``: ``"equal at 1e-5"`` when every quantity is within 1e-5;
    ``"equal to float32 rounding"`` when each quantity above 1e-5 is within
    :data:`ROUNDING_FACTOR` times its own rounding spread; ``"DIFFERS"``
    otherwise (or with no spread to compare to).
    """
    losses = [diff[q] for q in LOSSES]
    varq = [q for q in diff if q not in LOSSES]
    worst_var = max(varq, key=lambda q: diff[q][0]) if varq else ""
    worst = max(diff, key=lambda q: diff[q][0])
    row = dict(loss_step_rel=losses[0][0], loss_next_rel=losses[1][0],
               loss_rel=max(r for r, _ in losses), loss_abs=max(a for _, a in losses),
               var_rel=diff[worst_var][0] if varq else 0.0,
               var_abs=max((diff[q][1] for q in varq), default=0.0), worst_var=worst_var,
               trainable_rel=max((diff[q][0] for q in trainable if q in diff), default=np.nan),
               worst_rel=diff[worst][0], worst_quantity=worst,
               pass_1e5=bool(diff[worst][0] <= RTOL))
    if spread is not None:
        sworst = max(spread, key=lambda q: spread[q][0])
        row.update(spread_rel=spread[worst][0], spread_worst_rel=spread[sworst][0],
                   spread_worst_quantity=sworst)
        ratio, ratio_q = _ratio(diff, spread)
        row.update(rounding_ratio=ratio, ratio_quantity=ratio_q)
        if spread_ulp is not None:
            row["ratio_ulp"] = _ratio(diff, spread_ulp)[0]
    if row["pass_1e5"]:
        row["verdict"] = "equal at 1e-5"
    elif spread is not None and row["rounding_ratio"] <= ROUNDING_FACTOR:
        row["verdict"] = "equal to float32 rounding"
    else:
        row["verdict"] = "DIFFERS"
    return row


def summarize_float64(diff, spread):
    """A cell's float64 columns from its :func:`differences` in float64 and the
    float64 rounding spread: ``verdict_f64`` is ``"equal in float64"`` when every
    quantity is within :data:`F64_RTOL` or :data:`ROUNDING_FACTOR` times its spread."""
    worst = max(diff, key=lambda q: diff[q][0])
    ratio = _ratio(diff, spread, F64_RTOL)[0]
    return dict(f64_loss_rel=max(diff[q][0] for q in LOSSES), f64_worst_rel=diff[worst][0],
                f64_worst_quantity=worst, f64_spread_rel=spread[worst][0], f64_ratio=ratio,
                verdict_f64="equal in float64" if ratio <= ROUNDING_FACTOR else "DIFFERS")


def _strategy(name, step, devices):
    from fddps.strategy import data_parallel, mixed, parameter_split
    return {"data_parallel": data_parallel, "parameter_split": parameter_split,
            "mixed": mixed}[name](step, list(devices))


def _write(rows, out):
    if out is not None:
        df = pd.DataFrame(rows)
        df.reindex(columns=COLUMNS + [c for c in df.columns if c not in COLUMNS]).to_csv(
            ensure_parent(out), index=False)


def _unsplit_in_subprocess(name, batch, image_size, env):
    """The unsplit step's quantities, run by a fresh Python process with ``env`` added."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "unsplit.pkl")
        cmd = [sys.executable, "-m", "experiments.strategy_equality", "--unsplit-pickle", path,
               "--models", name, "--batch", str(batch)]
        if image_size is not None:
            cmd += ["--image-size", str(image_size)]
        subprocess.run(cmd, check=True, env={**os.environ, **env},
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(path, "rb") as f:
            return pickle.load(f)


def _save_unsplit(name, batch, image_size, path):
    import slim_models

    model = slim_models.build_training_graph(name, batch, dataset="cifar10",
                                             image_size=image_size)
    out = run_step(model.graph_def, model, variable_names(model.graph_def))
    with open(path, "wb") as f:
        pickle.dump(out, f)


def run_network(name, batch, strategies=STRATEGIES, clusters=CLUSTERS, image_size=None,
                cluster=None, rows=None, out=None, log=print, kernel_probe=False):
    """All cells of one network; appends rows to ``rows`` (written to ``out`` after each)."""
    import slim_models
    from fddps.tf.float64 import as_float64
    from fddps.tf.strategy_graph import step_graph
    from fddps.tf.strategy_rewrite import rewrite_strategy

    rows = [] if rows is None else rows
    t0 = time.perf_counter()
    model = slim_models.build_training_graph(name, batch, dataset="cifar10",
                                             image_size=image_size)
    gd = model.graph_def
    fetches = [model.train_op.name, model.loss.name]
    variables = variable_names(gd)
    trainable = [v.op.name for v in model.trainable_variables]
    base = dict(model=name, batch=batch, image_size=model.image_size)
    step = step_graph(gd, fetches)
    ref = run_step(gd, model, variables)
    log(f"{name}: built, {len(step)} step ops, unsplit step {time.perf_counter() - t0:.0f} s "
        f"(loss {float(ref[LOSSES[0]]):.5f} -> {float(ref[LOSSES[1]]):.5f})")
    images = unsplit_images(model)
    runs = ([("spread:repeat", {})]
            + [(f"spread:input_ulp{k}", {"images": ulp_perturbed(images, k)})
               for k in range(ROUNDING_DRAWS)]
            + [("spread:threads", {"config": cpu4_config(intra_op_threads=2)})])
    spread, spread_ulp = {}, {}
    for label, kwargs in runs:
        t = time.perf_counter()
        diff = differences(run_step(gd, model, variables, **kwargs), ref)
        if label != "spread:repeat":
            spread = widest(spread, diff)
        if label.startswith("spread:input_ulp"):
            spread_ulp = widest(spread_ulp, diff)
        rows.append(dict(base, cluster="local", strategy=label, devices=1, status="ok",
                         ops=len(gd.node), ops_split=0, run_s=time.perf_counter() - t,
                         seconds=time.perf_counter() - t, **summarize(diff, trainable=trainable)))
        rows[-1]["verdict"] = ""
        log(f"  {label}: worst rel {rows[-1]['worst_rel']:.2e} ({rows[-1]['worst_quantity']}), "
            f"loss (next) {rows[-1]['loss_next_rel']:.2e}")
    spread_all = spread
    if kernel_probe:
        t = time.perf_counter()
        diff = differences(_unsplit_in_subprocess(name, batch, image_size,
                                                  {"TF_ENABLE_ONEDNN_OPTS": "0"}), ref)
        spread_all = widest(spread, diff)
        rows.append(dict(base, cluster="local", strategy="spread:onednn_off", devices=1,
                         status="ok", ops=len(gd.node), ops_split=0,
                         seconds=time.perf_counter() - t, **summarize(diff, trainable=trainable)))
        rows[-1]["verdict"] = ""
        log(f"  spread:onednn_off: worst rel {rows[-1]['worst_rel']:.2e} "
            f"({rows[-1]['worst_quantity']}), loss (next) {rows[-1]['loss_next_rel']:.2e}")
    t = time.perf_counter()
    gd64 = as_float64(gd)
    variables64 = variable_names(gd64)
    ref64 = run_step(gd64, model, variables64)
    images64 = unsplit_images(model, graph_def=gd64)
    spread64 = {}
    for k in range(F64_DRAWS):
        diff = differences(run_step(gd64, model, variables64,
                                    images=ulp_perturbed(images64, k, np.float64)), ref64)
        spread64 = widest(spread64, diff)
    worst = max(spread64, key=lambda q: spread64[q][0])
    rows.append(dict(base, cluster="local", strategy="spread:f64_input_ulp", devices=1,
                     status="ok", ops=len(gd64.node), ops_split=0,
                     seconds=time.perf_counter() - t, verdict="",
                     f64_loss_rel=max(spread64[q][0] for q in LOSSES),
                     f64_worst_rel=spread64[worst][0], f64_worst_quantity=worst))
    log(f"  float64: unsplit step and {F64_DRAWS} one-ulp input draws "
        f"{time.perf_counter() - t:.0f} s; spread worst rel {spread64[worst][0]:.2e} ({worst})")
    _write(rows, out)
    for where in clusters:
        if where == "cpu4":
            devices, target, config = CPU4, "", cpu4_config()
        elif where == "workers2":
            if cluster is None:
                raise ValueError("workers2 needs a running local_cluster (cluster=...)")
            devices, target, config = cluster.devices, cluster.target, cluster.session_config()
        else:
            raise ValueError(f"unknown cluster {where!r}; known: {CLUSTERS}")
        for sname in strategies:
            t = time.perf_counter()
            row = dict(base, cluster=where, strategy=sname, devices=len(devices))
            try:
                strategy = _strategy(sname, step, devices)
                new = rewrite_strategy(gd, strategy, fetches, devices)
                t_rw = time.perf_counter()
                got = run_step(new, model, variables, target=target, config=config)
                t_run = time.perf_counter()
                diff = differences(got, ref)
                row.update(summarize_float64(differences(
                    run_step(as_float64(new), model, variables64, target=target, config=config),
                    ref64), spread64))
                if kernel_probe:
                    k = summarize(diff, spread_all)
                    row.update(ratio_kernels=k["rounding_ratio"], verdict_kernels=k["verdict"])
                row.update(status="ok", ops=len(new.node),
                           ops_split=sum(strategy.config(n).num_parts > 1 for n in step.ops),
                           rewrite_s=t_rw - t, run_s=t_run - t_rw,
                           **summarize(diff, spread, trainable, spread_ulp))
            except Exception as e:  # noqa: BLE001 -- one cell's failure is a result
                row.update(status=f"error: {type(e).__name__}: {e}"[:300], verdict="ERROR")
                traceback.print_exc()
            row["seconds"] = time.perf_counter() - t
            rows.append(row)
            _write(rows, out)
            if row["status"] == "ok":
                log(f"  {where} {sname}: {row['verdict']}; worst rel {row['worst_rel']:.2e} "
                    f"({row['worst_quantity']}), spread there {row['spread_rel']:.2e}, "
                    f"ratio {row['rounding_ratio']:.2g} (input ulp alone {row['ratio_ulp']:.2g}); "
                    f"float64: {row['verdict_f64']}, worst rel {row['f64_worst_rel']:.2e} "
                    f"({row['f64_worst_quantity']}), x{row['f64_ratio']:.2g} its spread; "
                    f"{row['ops']} ops, "
                    f"{row['seconds']:.0f} s")
            else:
                log(f"  {where} {sname}: {row['status']} ({row['seconds']:.0f} s)")
    log(f"{name}: {time.perf_counter() - t0:.0f} s")
    return rows


def markdown(df) -> str:
    """Network x strategy x cluster: worst rel. difference, rounding spread, verdict, seconds."""
    lines = ["| network | strategy | cluster | loss rel. diff (step, next) | worst rel. diff "
             "(where) | rounding spread there | ratio | verdict | float64: worst rel. diff, "
             "verdict | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        if r.strategy.startswith("spread:"):
            continue
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.strategy} | {r.cluster} | {r.status} | | | | ERROR "
                         f"| | {r.seconds:.0f} |")
            continue
        lines.append(f"| {r.model} | {r.strategy} | {r.cluster} | {r.loss_step_rel:.1e}, "
                     f"{r.loss_next_rel:.1e} | {r.worst_rel:.1e} ({r.worst_quantity}) "
                     f"| {r.spread_rel:.1e} | {r.rounding_ratio:.2g} | {r.verdict}"
                     + (f"; with oneDNN off as a probe: {r.verdict_kernels} "
                        f"(x{r.ratio_kernels:.2g})"
                        if isinstance(getattr(r, "verdict_kernels", None), str) else "")
                     + f" | {r.f64_worst_rel:.1e}, {r.verdict_f64} | {r.seconds:.0f} |")
    return "\n".join(lines)


def run(models=MODELS, batch=8, strategies=STRATEGIES, clusters=CLUSTERS, image_size=None,
        out=None, append=False, log=print, kernel_probe=False):
    rows = []
    if append and out is not None and os.path.exists(out):
        rows = pd.read_csv(out).to_dict("records")
    cluster_cm = None
    cluster = None
    if "workers2" in clusters:
        from fddps.tf import local_cluster
        cluster_cm = local_cluster(2, threads_per_worker=1)
        cluster = cluster_cm.__enter__()
        log(f"local_cluster: {cluster.devices}")
    try:
        for name in models:
            run_network(name, batch, strategies, clusters, image_size, cluster, rows, out, log,
                        kernel_probe)
    finally:
        if cluster_cm is not None:
            cluster_cm.__exit__(None, None, None)
    return pd.DataFrame(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image-size", type=int, default=None, help="default: CIFAR-10's 32")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--clusters", default=",".join(CLUSTERS))
    p.add_argument("--out", default=str(RESULTS / "strategy_equality.csv"))
    p.add_argument("--append", action="store_true", help="add to an existing --out CSV")
    p.add_argument("--kernel-probe", action="store_true",
                   help="also run the unsplit step with TF_ENABLE_ONEDNN_OPTS=0 (diagnostic)")
    p.add_argument("--unsplit-pickle", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.unsplit_pickle:  # the kernel probe's subprocess
        return _save_unsplit(args.models, args.batch, args.image_size, args.unsplit_pickle)
    t0 = time.perf_counter()
    df = run([m for m in args.models.split(",") if m], args.batch,
             [s for s in args.strategies.split(",") if s],
             [c for c in args.clusters.split(",") if c], args.image_size, args.out, args.append,
             kernel_probe=args.kernel_probe)
    print(f"\nOne training step vs the unsplit graph, CIFAR-10 size, batch {args.batch}; "
          f"worst rel. = max |a - b| / (|b| + 0.1) over both losses and every variable; "
          f"rounding spread = the unsplit step with its input moved one float32 ulp "
          f"({ROUNDING_DRAWS} draws) or 2 intra-op threads, per quantity the largest; "
          f"float32 rounding: within {ROUNDING_FACTOR:g}x the spread; float64: both graphs "
          f"widened, within {F64_RTOL:g} or {ROUNDING_FACTOR:g}x the float64 spread "
          f"({F64_DRAWS} one-ulp input draws). "
          f"{time.perf_counter() - t0:.0f} s in all.\n")
    print(markdown(df))
    return df


if __name__ == "__main__":
    main()
