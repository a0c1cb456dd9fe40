"""Time the convolutions and MatMuls of ResNet-50, VGG-16 and Inception-V3 on a GPU; fit the presets.

Three modes:

``python -m experiments.gpu_kernels`` (needs PyTorch with CUDA and a GPU)
    Times, with cuDNN / cuBLAS through PyTorch (the libraries TensorFlow's GPU
    kernels call), every distinct convolution layer of ResNet-50, VGG-16 (224 x
    224) and Inception-V3 (299 x 299) at batch 64 -- forward, input gradient,
    filter gradient -- and the MatMuls of their classifier layers (forward and
    both gradients), in TF32 and in FP32, plus a few element-wise adds. Each time
    is the median of ``--repeats`` CUDA-event-timed calls after warm-up, with
    ``cudnn.benchmark`` on (TensorFlow autotunes its convolutions too). Writes
    the rows in the format of ``costmodel/data/gpu_kernels.csv`` (default
    ``experiments/results/gpu_kernels_<gpu>.csv``); append them to that file and
    run ``python -m costmodel.kernels`` to refit the presets.

``python -m experiments.gpu_kernels --report``
    No GPU needed: the presets against DeepBench's published FP32 kernel times
    (``costmodel/data/deepbench``, :mod:`costmodel.deepbench`). Per GPU and op class
    (forward convolution, input gradient, filter gradient, MatMul), the median
    predicted / measured ratio and the share of kernels within 25%: before (the
    roofline presets, 0.6 compute / 0.7 memory, the V100's two fitted
    efficiencies), the candidates cross-validated over shapes (5 folds; a shape
    is held out on every GPU at once): a roofline whose efficiency rises with the
    kernel's size fitted per GPU, a gradient-boosted regressor per GPU, and the
    one pooled over the GPUs that the presets use (in-sample too); and the
    datasheet model of :func:`costmodel.gpu_from_datasheet` leave-one-GPU-out;
    the same two (CV, leave-one-GPU-out) with the kernel's shape as well
    (:data:`costmodel.kernel_model.SHAPE_KEYS`), and what the shape changes
    for the CNNs' convolution layers (:func:`conv_layer_shift`).
    Also the all-reduce fit (:mod:`costmodel.allreduce`) against
    DeepBench's all-reduce rows, and fddps's unrolled LSTM steps (as ``rnn_lm``
    and ``nmt`` build them) against DeepBench's fused LSTM layers. Writes
    ``experiments/results/gpu_kernels*.csv``, ``gpu_kernels.png`` (predicted
    against measured, log-log, per class) and the page ``gpu_kernels.md``.
    ``--folds``, ``--classes`` and ``--gpus`` make it smaller.

``python -m experiments.gpu_kernels --report TABLE [TABLE ...]``
    No GPU needed: the per-kernel error of each GPU's datasheet preset (before)
    and of the preset fitted to the table (after), per GPU, op class and
    precision, and per model for the convolution layers (the layers of
    ``costmodel/data/conv_layers.csv`` found in the table). Default table: the
    committed one. Writes ``experiments/results/gpu_kernels_errors.csv``.

``python -m experiments.gpu_kernels --write-layers``
    Rebuilds ``costmodel/data/conv_layers.csv`` (the convolution layers of the
    three models at batch 64) from ``slim_models``' TensorFlow graphs.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel import allreduce, deepbench, hardware, kernel_model, kernels

from . import common

LAYERS = kernels.KERNEL_TABLE.parent / "conv_layers.csv"
MODELS = {"resnet50": 224, "vgg16": 224, "inception_v3": 299}
CONV_CLASSES = ("conv_forward", "conv_input_grad", "conv_filter_grad")
#: Element-wise adds timed beside the kernels (bytes read + written): activations of the models.
ADD_BYTES = (3 * 4 * 64 * 64 * 112 * 112, 3 * 4 * 64 * 256 * 56 * 56, 3 * 4 * 64 * 512 * 28 * 28,
             3 * 4 * 64 * 2048 * 7 * 7)
_GPU_NAMES = {"K80": "k80", "P100": "p100", "V100": "v100", "A100": "a100", "H100": "h100"}


class NoGPU(SystemExit):
    """Raised (exit status 1, with the message) when PyTorch or a CUDA GPU is missing."""


# -- the layers -------------------------------------------------------------------------
def conv_layers(path=LAYERS) -> pd.DataFrame:
    """The committed convolution layers: ``model, layer, count, shape, first`` (``first``: the
    layer reads the images, so no input gradient is computed)."""
    return pd.read_csv(path)


def _same_pad(size, k, stride):
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return (total + 1) // 2  # TensorFlow pads the extra row after; the output size is the same


def _after_a_conv(op) -> bool:
    """Whether a Conv2D is among ``op`` and its ancestors (else a convolution reading it reads
    the images, and TensorFlow computes no input gradient for it)."""
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        if o.type == "Conv2D":
            return True
        for t in o.inputs:
            if t.op.name not in seen:
                seen.add(t.op.name)
                todo.append(t.op)
    return False


def write_layers(batch=64, path=LAYERS) -> pd.DataFrame:
    """Read every forward Conv2D of the three models' training graphs (TensorFlow) into ``path``."""
    common.tf_quiet()
    from slim_models import build_training_graph
    rows = []
    for model, size in MODELS.items():
        m = build_training_graph(model, batch, image_size=size)
        convs = [op for op in m.graph.get_operations() if op.type == "Conv2D"]
        for op in convs:
            n, h, w, c = op.inputs[0].shape.as_list()
            r, s, _, k = op.inputs[1].shape.as_list()
            fmt = op.get_attr("data_format").decode()
            if fmt != "NHWC":
                raise ValueError(f"{model}: {op.name} is {fmt}, expected NHWC")
            _, sh, sw, _ = op.get_attr("strides")
            padding = op.get_attr("padding").decode()
            ph, pw = (_same_pad(h, r, sh), _same_pad(w, s, sw)) if padding == "SAME" else (0, 0)
            shape = (f"N={n} C={c} H={h} W={w} K={k} R={r} S={s} stride_h={sh} stride_w={sw} "
                     f"pad_h={ph} pad_w={pw}")
            first = not _after_a_conv(op.inputs[0].op)
            rows.append(dict(model=model, layer=op.name, shape=shape, first=bool(first)))
    df = pd.DataFrame(rows)
    df["count"] = df.groupby(["model", "shape"]).layer.transform("size")
    df = df.drop_duplicates(["model", "shape"])[["model", "layer", "count", "shape", "first"]]
    common.ensure_parent(path)
    df.to_csv(path, index=False)
    print(f"wrote {len(df)} distinct convolution layers ({len(rows)} in all) of "
          f"{', '.join(MODELS)} at batch {batch} to {path}")
    return df


def matmul_shapes(batch=64) -> list[str]:
    """The classifier MatMuls (forward, input and weight gradient) of the three models."""
    fc = {(2048, 1000), (25088, 4096), (4096, 4096), (4096, 1000)}  # ResNet/Inception; VGG-16
    out = []
    for k_in, n_out in sorted(fc):
        out += [f"M={batch} N={n_out} K={k_in}", f"M={batch} N={k_in} K={n_out}",
                f"M={k_in} N={n_out} K={batch}"]
    return out


# -- measuring (PyTorch) -------------------------------------------------------------------
def _torch():
    try:
        import torch
    except ImportError:
        raise NoGPU("experiments/gpu_kernels.py: measuring needs PyTorch with CUDA (pip install torch) "
                    "and an NVIDIA GPU; PyTorch is not installed here. Without a GPU, "
                    "`python -m experiments.gpu_kernels --report` compares the presets with the "
                    "committed kernel table.") from None
    if not torch.cuda.is_available():
        raise NoGPU("experiments/gpu_kernels.py: PyTorch sees no CUDA GPU "
                    "(torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU, "
                    "or use --report to compare the presets with the committed kernel table.")
    return torch


def _time(torch, fn, repeats):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return float(np.median(times))


def measure(torch, layers, precisions, repeats, batch=64) -> list[dict]:
    """Time every distinct kernel; one row (without ``gpu``, ``source``) per kernel and precision."""
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    conv_bwd = torch.ops.aten.convolution_backward
    rows = []
    shapes = list(dict.fromkeys(layers["shape"]))
    first = set(layers.loc[layers["first"].astype(bool), "shape"])
    for precision in precisions:
        tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for shape in shapes:
            d = kernels.parse_shape("conv_forward", shape)
            x = torch.randn(d["N"], d["C"], d["H"], d["W"], device=dev)
            w = torch.randn(d["K"], d["C"], d["R"], d["S"], device=dev)
            stride, pad = (d["stride_h"], d["stride_w"]), (d["pad_h"], d["pad_w"])
            y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
            dy = torch.randn_like(y)

            def backward(mask):
                return lambda: conv_bwd(dy, x, w, None, stride, pad, (1, 1), False, (0, 0), 1, mask)

            timed = {"conv_forward": lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad),
                     "conv_filter_grad": backward([False, True, False])}
            if shape not in first:
                timed["conv_input_grad"] = backward([True, False, False])
            for cls, fn in timed.items():
                rows.append(dict(op_class=cls, shape=shape, precision=precision,
                                 seconds=_time(torch, fn, repeats)))
        for shape in matmul_shapes(batch):
            d = kernels.parse_shape("matmul", shape)
            a = torch.randn(d["M"], d["K"], device=dev)
            b = torch.randn(d["K"], d["N"], device=dev)
            rows.append(dict(op_class="matmul", shape=shape, precision=precision,
                             seconds=_time(torch, lambda: a @ b, repeats)))
    for nbytes in ADD_BYTES:
        n = nbytes // 12
        a, b = torch.randn(n, device=dev), torch.randn(n, device=dev)
        rows.append(dict(op_class="elementwise", shape=f"bytes={nbytes}", precision="fp32",
                         seconds=_time(torch, lambda: a + b, repeats)))
    return rows


def run_measure(args) -> pd.DataFrame:
    torch = _torch()
    name = torch.cuda.get_device_name(0)
    gpu = args.gpu or next((v for k, v in _GPU_NAMES.items() if k in name.upper()), None)
    if gpu is None:
        raise SystemExit(f"experiments/gpu_kernels.py: no preset for {name!r}; name it with --gpu")
    layers = conv_layers(args.layers)
    layers = layers[layers.model.isin(args.models)]
    print(f"timing {layers['shape'].nunique()} distinct convolution layers of {', '.join(args.models)} "
          f"(batch 64; forward, input and filter gradient) and {len(matmul_shapes())} MatMuls in "
          f"{', '.join(args.precisions)} on {name} (torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}); median of {args.repeats} CUDA-event-timed calls each")
    rows = pd.DataFrame(measure(torch, layers, args.precisions, args.repeats))
    today = datetime.date.today().isoformat()
    rows.insert(0, "gpu", gpu)
    rows["source"] = (f"experiments/gpu_kernels.py on {name}, torch {torch.__version__}, cuDNN "
                      f"{torch.backends.cudnn.version()}, {today}: median of {args.repeats} calls")
    out = common.ensure_parent(args.out or common.RESULTS / f"gpu_kernels_{gpu}.csv")
    rows[list(kernels.COLUMNS)].to_csv(out, index=False)
    print(f"wrote {len(rows)} kernel times to {out}")
    report(pd.concat([kernels.load_kernel_table(), kernels.load_kernel_table(out)], ignore_index=True),
           args.layers)
    return rows


# -- report ---------------------------------------------------------------------------------
def report(table: pd.DataFrame, layers_path=LAYERS, out=None) -> pd.DataFrame:
    """Per-kernel error before (datasheet preset) and after (fitted to ``table``), printed and saved.

    Rows: per GPU, op class and precision (``model = "all kernels"``), and per
    model over its convolution layers found in the table (each distinct layer
    once).
    """
    layers = conv_layers(layers_path)
    parts = []
    for gpu in sorted(set(table.gpu)):
        before = hardware._DATASHEET_PRESETS[gpu]
        fitted = kernels.fit_efficiencies(table, before)
        after = hardware.DevicePreset(**{**before.to_dict(), "efficiencies": fitted})
        for label, preset in (("before", before), ("after", after)):
            e = kernels.prediction_errors(table, preset)
            e["model"] = "all kernels"
            per_model = e.merge(layers[["model", "shape"]], on="shape", suffixes=("_all", ""))
            per_model = per_model.drop(columns="model_all")
            for (model, cls, precision), d in pd.concat([e, per_model]).groupby(
                    ["model", "op_class", "precision"]):
                parts.append(dict(gpu=gpu, model=model, op_class=cls, precision=precision,
                                  preset=label, kernels=len(d), median_ratio=d.ratio.median(),
                                  median_abs_error=d.abs_error.median()))
        print(f"{gpu}: efficiencies fitted to the table (>= {kernels.MIN_KERNELS} kernels a class): "
              f"{fitted or 'none'}")
    df = pd.DataFrame(parts)
    wide = df.pivot_table(index=["gpu", "model", "op_class", "precision"], columns="preset",
                          values=["median_abs_error", "kernels"]).round(3)
    print("median per-kernel |predicted / measured - 1| (before: datasheet preset, after: fitted):")
    print(wide.to_string())
    path = common.ensure_parent(out or common.RESULTS / "gpu_kernels_errors.csv")
    df.to_csv(path, index=False)
    print(f"results: {path}")
    return df


# -- DeepBench: the presets against published kernel times ------------------------------------
#: Share of kernels within this much of the measured time counts as a hit.
WITHIN = 0.25
CLASS_LABELS = {"conv_forward": "conv forward", "conv_input_grad": "conv input grad",
                "conv_filter_grad": "conv filter grad", "matmul": "MatMul"}
METHODS = {
    "before": "before: roofline presets (0.6 compute, 0.7 memory; V100: 2 fitted efficiencies)",
    "curve_cv": "candidate: roofline with a size-dependent efficiency, per GPU (cross-validated)",
    "gbr_gpu_cv": "candidate: gradient boosting, per GPU (cross-validated)",
    "gbr_pooled_cv": "chosen: gradient boosting pooled over GPUs, one-hot GPU (cross-validated)",
    "gbr_pooled_in": "chosen, in-sample (the committed fit)",
    "datasheet_logo": "gpu_from_datasheet, leave-one-GPU-out (fitted on the other GPUs)",
    "shape_in": "with the kernel's shape, in-sample (the committed fit)",
    "shape_cv": "with the kernel's shape: pooled, one-hot GPU (cross-validated)",
    "shape_logo": "with the kernel's shape, leave-one-GPU-out (datasheet peaks)",
}


def before_preset(gpu: str) -> hardware.DevicePreset:
    """Today's roofline preset of a DeepBench GPU (before the kernel model): the named preset
    without its kernel model, else the datasheet figures at the assumed 0.6 / 0.7."""
    if gpu in hardware._DEVICE_PRESETS:
        return replace(hardware._DEVICE_PRESETS[gpu], kernel_model="")
    d = deepbench.DATASHEETS[gpu]
    return hardware.DevicePreset(gpu, "GPU", d["peak_flops"], d["memory_bandwidth"], d["memory"],
                                 overhead=10e-6, source=d["source"])


def _kernel_seconds(preset, rows) -> np.ndarray:
    """The preset's time of each kernel less its per-op overhead (a kernel benchmark has none)."""
    return preset.op_times(rows) - preset.overhead


def shape_folds(k: pd.DataFrame, folds: int) -> np.ndarray:
    """Fold of every row: each distinct shape (with its class) in one fold on every GPU."""
    from sklearn.model_selection import GroupKFold

    groups = (k.op_class + "|" + k["shape"]).to_numpy()
    fold = np.zeros(len(k), dtype=int)
    for f, (_, test) in enumerate(GroupKFold(folds).split(k, groups=groups)):
        fold[test] = f
    return fold


def _ensemble_predict(model, rows, gpus, shapes=False):
    peak, bw = kernel_model._peaks(rows, deepbench.DATASHEETS)
    x = kernel_model.kernel_features(rows, deepbench.DATASHEETS, gpus=gpus, shapes=shapes)
    ref = kernel_model.reference_seconds(rows.flops, rows.input_bytes, rows.output_bytes, peak, bw)
    return ref * np.exp(model.predict(x))


def kernel_predictions(k: pd.DataFrame, folds: int = kernel_model.FOLDS, progress=print,
                       params=None) -> pd.DataFrame:
    """Every kernel of ``k`` (:func:`costmodel.deepbench.load_kernels`) with each method's predicted
    seconds (one column per key of :data:`METHODS`). ``params`` override
    :data:`costmodel.kernel_model.GBR_PARAMS` in the refits (not in the committed "in-sample" fit)."""
    k = k.reset_index(drop=True).copy()
    all_gpus = sorted(set(k.gpu))
    fold = shape_folds(k, folds)
    for m in METHODS:
        k[m] = np.nan
    for gpu, rows in k.groupby("gpu"):
        k.loc[rows.index, "before"] = _kernel_seconds(before_preset(gpu), rows)
        k.loc[rows.index, "gbr_pooled_in"] = kernel_model.predict_seconds(
            gpu, rows.flops, rows.input_bytes, rows.output_bytes, rows.op_class,
            peak_flops=deepbench.DATASHEETS[gpu]["peak_flops"],
            memory_bandwidth=deepbench.DATASHEETS[gpu]["memory_bandwidth"])
        k.loc[rows.index, "shape_in"] = kernel_model.predict_seconds(
            gpu, rows.flops, rows.input_bytes, rows.output_bytes, rows.op_class,
            peak_flops=deepbench.DATASHEETS[gpu]["peak_flops"],
            memory_bandwidth=deepbench.DATASHEETS[gpu]["memory_bandwidth"], shapes=rows["shape"])
    for cls, c_rows in k.groupby("op_class"):
        progress(f"  {cls}: {folds}-fold cross-validation over {c_rows['shape'].nunique()} shapes")
        for f in range(folds):
            train, test = c_rows[fold[c_rows.index] != f], c_rows[fold[c_rows.index] == f]
            model = kernel_model.fit_ensemble(train, deepbench.DATASHEETS, gpus=all_gpus,
                                              params=params)
            k.loc[test.index, "gbr_pooled_cv"] = _ensemble_predict(model, test, all_gpus)
            model = kernel_model.fit_ensemble(train, deepbench.DATASHEETS, gpus=all_gpus,
                                              params=params, shapes=True)
            k.loc[test.index, "shape_cv"] = _ensemble_predict(model, test, all_gpus, shapes=True)
            for gpu, g_test in test.groupby("gpu"):
                g_train = train[train.gpu == gpu]
                d = deepbench.DATASHEETS[gpu]
                curve = kernel_model.fit_roofline_curve(g_train, d["peak_flops"], d["memory_bandwidth"])
                k.loc[g_test.index, "curve_cv"] = kernel_model.roofline_curve_seconds(
                    curve, g_test.flops, g_test.input_bytes + g_test.output_bytes, d["peak_flops"],
                    d["memory_bandwidth"])
                model = kernel_model.fit_ensemble(g_train, deepbench.DATASHEETS, params=params)
                k.loc[g_test.index, "gbr_gpu_cv"] = _ensemble_predict(model, g_test, ())
        progress(f"  {cls}: leave-one-GPU-out")
        for gpu in sorted(set(c_rows.gpu)):
            held = c_rows[c_rows.gpu == gpu]
            # The held-out GPU is known to the ensemble by its datasheet peaks alone.
            model = kernel_model.fit_ensemble(c_rows[c_rows.gpu != gpu], deepbench.DATASHEETS,
                                              params=params)
            k.loc[held.index, "datasheet_logo"] = _ensemble_predict(model, held, ())
            model = kernel_model.fit_ensemble(c_rows[c_rows.gpu != gpu], deepbench.DATASHEETS,
                                              params=params, shapes=True)
            k.loc[held.index, "shape_logo"] = _ensemble_predict(model, held, (), shapes=True)
    return k


def gpu_from_datasheet_for(gpu: str) -> hardware.DevicePreset:
    """:func:`costmodel.gpu_from_datasheet` of a DeepBench GPU's datasheet figures."""
    from costmodel import gpu_from_datasheet

    d = deepbench.DATASHEETS[gpu]
    return gpu_from_datasheet(gpu, d["peak_flops"], d["memory_bandwidth"], d["memory"], source=d["source"])


def summarize(pred: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, class and method: kernels, median predicted / measured, share within 25%."""
    out = []
    for (gpu, cls), d in pred.groupby(["gpu", "op_class"]):
        for m in METHODS:
            r = (d[m] / d.seconds).to_numpy(float)
            r = r[np.isfinite(r)]
            out.append(dict(gpu=gpu, op_class=cls, method=m, kernels=len(r),
                            median_ratio=float(np.median(r)) if len(r) else np.nan,
                            within_25=float(np.mean(np.abs(r - 1) <= WITHIN)) if len(r) else np.nan))
    return pd.DataFrame(out)


def _plot_kernels(pred: pd.DataFrame, png: Path):
    """Predicted against measured, log-log, one panel per class; rows: before, after (what
    ``op_times`` uses), and with the kernel's shape, the last two cross-validated."""
    plt = common.matplotlib_agg()
    classes = [c for c in kernel_model.MODEL_CLASSES if c in set(pred.op_class)]
    shown = [("before", "before (roofline)"), ("gbr_pooled_cv", "after (cross-validated)"),
             ("shape_cv", "with shape (cross-validated)")]
    shown = [(m, t) for m, t in shown if m in pred.columns]
    fig, axes = plt.subplots(len(shown), len(classes), figsize=(3.6 * len(classes), 3.7 * len(shown)),
                             squeeze=False)
    gpus = sorted(set(pred.gpu))
    colors = dict(zip(gpus, plt.cm.tab10.colors))
    for col, cls in enumerate(classes):
        d = pred[pred.op_class == cls]
        lo, hi = d.seconds.min() / 2, d.seconds.max() * 2
        for row, (m, title) in enumerate(shown):
            ax = axes[row, col]
            for gpu in gpus:
                g = d[d.gpu == gpu]
                ax.scatter(g.seconds * 1e3, g[m] * 1e3, s=7, alpha=0.6, color=colors[gpu], label=gpu)
            x = np.array([lo, hi]) * 1e3
            ax.plot(x, x, "k-", lw=0.8)
            ax.fill_between(x, x * (1 - WITHIN), x * (1 + WITHIN), color="0.85", zorder=0)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(*x)
            ax.set_ylim(*x)
            r = d[m] / d.seconds
            ax.set_title(f"{CLASS_LABELS[cls]}: {title}\nmedian {r.median():.2f}, "
                         f"{(abs(r - 1) <= WITHIN).mean():.0%} within 25%", fontsize=9)
            ax.set_xlabel("measured ms (DeepBench)", fontsize=8)
            if col == 0:
                ax.set_ylabel("predicted ms", fontsize=8)
    axes[0, 0].legend(fontsize=7, markerscale=2, loc="upper left")
    fig.suptitle("FP32 kernels of 6 GPUs: predicted vs measured (grey: within 25%)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def allreduce_table(rows: pd.DataFrame | None = None, fits: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every DeepBench all-reduce row with the committed fit's prediction and its ratio."""
    rows = deepbench.load_allreduce() if rows is None else rows
    fits = allreduce.load_fits() if fits is None else fits
    fits = fits.assign(chosen=fits.chosen.astype(bool))
    rows = rows.assign(scope=allreduce.scope_of(rows.gpus), predicted=allreduce.predict(fits, rows))
    rows["ratio"] = rows.predicted / rows.seconds
    rows["within_20"] = (rows.ratio - 1).abs() <= allreduce.TOLERANCE
    return rows


def lstm_step_ops(hidden: int, batch: int):
    """fddps's op table of one unrolled LSTM step (forward) as ``slim_models``' ``lstm_layer``
    builds it for ``rnn_lm`` and ``nmt`` (input size = hidden, as in DeepBench)."""
    common.tf_quiet()
    import tensorflow as tf

    from fddps.tf.graphdef import op_table
    from slim_models import rnn

    g = tf.Graph()
    with g.as_default():
        xs = [tf.compat.v1.placeholder(tf.float32, [batch, hidden], name=f"x{t}") for t in range(2)]
        rnn.lstm_layer(rnn.make_layers(0), xs, hidden, "lstm")
    ops = op_table(g)
    return ops[ops.name.str.startswith("lstm/t1/")].reset_index(drop=True)


def lstm_comparison(gpus=None, progress=print) -> pd.DataFrame:
    """DeepBench's LSTM layers (forward, ``timesteps`` steps) against fddps's sum of the unrolled
    steps' op times on each GPU's preset (its named preset, else :func:`gpu_from_datasheet_for`)."""
    rnn = deepbench.load_rnn()
    rnn = rnn[rnn.cell == "lstm"]
    if gpus:
        rnn = rnn[rnn.gpu.isin(gpus)]
    steps, out = {}, []
    for r in rnn.itertuples():
        key = (r.hidden, r.batch)
        if key not in steps:
            steps[key] = lstm_step_ops(r.hidden, r.batch)
        ops = steps[key]
        preset = hardware._DEVICE_PRESETS.get(r.gpu) or gpu_from_datasheet_for(r.gpu)
        t = preset.op_times(ops)
        mm = (ops.op_type == "MatMul").to_numpy()
        out.append(dict(gpu=r.gpu, hidden=r.hidden, batch=r.batch, timesteps=r.timesteps,
                        ops_per_step=len(ops), measured=r.fwd_seconds,
                        predicted=r.timesteps * t.sum(),
                        predicted_matmul=r.timesteps * t[mm].sum(),
                        predicted_overhead=r.timesteps * len(ops) * preset.overhead))
    df = pd.DataFrame(out)
    df["ratio"] = df.predicted / df.measured
    df["ratio_matmul"] = df.predicted_matmul / df.measured
    return df


def conv_layer_shift(layers_path=LAYERS, gpus=("p100", "v100")) -> pd.DataFrame:
    """Per GPU, model (ResNet-50, VGG-16, Inception-V3 at batch 64: ``conv_layers.csv``) and class,
    the kernel model's summed time of the model's convolution layers (each layer ``count`` times;
    no input gradient for the layer reading the images), without shapes (the ensembles over
    FLOPs and bytes) and with each layer's shape (as ``DevicePreset.op_times`` predicts them
    from an op table's ``kernel_shape``)."""
    layers = conv_layers(layers_path)
    rows = []
    for r in layers.itertuples():
        for cls in CONV_CLASSES:
            if cls == "conv_input_grad" and bool(r.first):
                continue
            rows.append(dict(model=r.model, count=r.count, op_class=cls, shape=r.shape,
                             **kernels.kernel_features(cls, r.shape)))
    ops = pd.DataFrame(rows)
    out = []
    for gpu in gpus:
        d = deepbench.DATASHEETS[gpu]
        kw = dict(peak_flops=d["peak_flops"], memory_bandwidth=d["memory_bandwidth"])
        args = (gpu, ops.flops, ops.input_bytes, ops.output_bytes, ops.op_class)
        t = ops.assign(without=kernel_model.predict_seconds(*args, **kw) * ops["count"],
                       with_shape=kernel_model.predict_seconds(*args, shapes=ops["shape"].tolist(), **kw)
                       * ops["count"])
        for model, m in t.groupby("model"):
            for cls, c in list(m.groupby("op_class")) + [("all", m)]:
                out.append(dict(gpu=gpu, model=model, op_class=cls, without_ms=1e3 * c.without.sum(),
                                with_shape_ms=1e3 * c.with_shape.sum()))
    df = pd.DataFrame(out)
    df["ratio"] = df.with_shape_ms / df.without_ms
    return df


def _machine() -> str:
    import os
    import platform

    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores"


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


#: The page's columns: method and label.
SHOWN = [("before", "before"), ("curve_cv", "roofline curve CV"), ("gbr_gpu_cv", "GBR per GPU CV"),
         ("gbr_pooled_in", "after in-sample"), ("gbr_pooled_cv", "after CV"),
         ("datasheet_logo", "datasheet LOGO"), ("shape_cv", "with shape CV"),
         ("shape_logo", "with shape LOGO")]


def _wide(summary: pd.DataFrame, methods) -> pd.DataFrame:
    rows = []
    for (gpu, cls), d in summary.groupby(["gpu", "op_class"]):
        d = d.set_index("method")
        row = {"GPU": gpu, "class": CLASS_LABELS[cls], "kernels": int(d.kernels.max())}
        for m, label in methods:
            row[label] = f"{d.loc[m, 'median_ratio']:.2f} / {d.loc[m, 'within_25']:.0%}"
        rows.append(row)
    return pd.DataFrame(rows)


def deepbench_report(deepbench_dir=None, *, folds=kernel_model.FOLDS, classes=kernel_model.MODEL_CLASSES,
                     gpus=None, out_dir=common.RESULTS, rnn=True, progress=print, params=None) -> dict:
    """The ``--report`` run: predictions, summaries, the all-reduce table, the LSTM comparison, the
    plot and the results page. Returns the tables by name."""
    started = datetime.datetime.now()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    k = deepbench.load_kernels(deepbench_dir)
    k = k[k.op_class.isin(classes)]
    if gpus:
        unknown = sorted(set(gpus) - set(k.gpu))
        if unknown:
            raise SystemExit(f"--gpus: no DeepBench GPU {unknown[0]!r}; have {sorted(set(k.gpu))}")
    progress(f"{len(k)} FP32 kernels of {k.gpu.nunique()} GPUs ({', '.join(sorted(set(k.gpu)))})")
    pred = kernel_predictions(k, folds=folds, progress=progress, params=params)
    if gpus:
        pred = pred[pred.gpu.isin(gpus)]
    summary = summarize(pred)
    pred.to_csv(out_dir / "gpu_kernels_predictions.csv", index=False, float_format="%.6g")
    summary.to_csv(out_dir / "gpu_kernels_summary.csv", index=False, float_format="%.4f")
    _plot_kernels(pred, out_dir / "gpu_kernels.png")
    ar = allreduce_table()
    ar.to_csv(out_dir / "gpu_kernels_allreduce.csv", index=False, float_format="%.6g")
    lstm = lstm_comparison(gpus, progress=progress) if rnn else pd.DataFrame()
    shift = conv_layer_shift(gpus=[g for g in ("p100", "v100") if not gpus or g in gpus])
    shift.to_csv(out_dir / "gpu_kernels_layers.csv", index=False, float_format="%.6g")
    if rnn:
        lstm.to_csv(out_dir / "gpu_kernels_lstm.csv", index=False, float_format="%.6g")
    wide = _wide(summary, SHOWN)
    print("median predicted/measured / share within 25%, per GPU and class:")
    print(wide.to_string(index=False))
    ar_sys = (ar.groupby("gpu").agg(rows=("ratio", "size"), within_20=("within_20", "mean"),
                                    median_ratio=("ratio", "median")).reset_index())
    print("all-reduce, per system:")
    print(ar_sys.to_string(index=False))
    checks = must_hold(summary, pred, ar)
    print(checks.to_string(index=False))
    page = _page(summary, pred, ar, lstm, folds, started, datetime.datetime.now(), classes, gpus, rnn,
                 shift)
    (out_dir / "gpu_kernels.md").write_text(page)
    progress(f"results: {out_dir / 'gpu_kernels.md'}, gpu_kernels_*.csv, gpu_kernels.png")
    return dict(predictions=pred, summary=summary, allreduce=ar, lstm=lstm, wide=wide)


def must_hold(summary: pd.DataFrame, pred: pd.DataFrame, ar: pd.DataFrame) -> pd.DataFrame:
    """The issue's checks: P100 and V100 per class cross-validated (median within 10%, at least
    70% within 25%); each GPU held out (median within 25%, at least 50% within 25%, over its
    kernels); all-reduce (at least 80% of each system's rows within 20%)."""
    rows = []
    for method, how in (("gbr_pooled_cv", "FLOPs and bytes (op_times where the shape is unknown)"),
                        ("shape_cv", "with the kernel's shape (what op_times uses)")):
        cv = summary[(summary.method == method) & summary.gpu.isin(["p100", "v100"])]
        for r in cv.itertuples():
            rows.append(dict(check=f"CV per class, {how}: median within 10%, >= 70% within 25%",
                             subject=f"{r.gpu} {CLASS_LABELS[r.op_class]}",
                             figure=f"{r.median_ratio:.3f} / {r.within_25:.0%}",
                             met=bool(abs(r.median_ratio - 1) <= 0.10 and r.within_25 >= 0.70)))
    for method, how in (("datasheet_logo", "FLOPs and bytes (op_times where the shape is unknown)"),
                        ("shape_logo", "with the kernel's shape (what op_times uses)")):
        if method not in pred.columns:  # a page rewritten from an older run's CSVs
            continue
        ratio = pred[method] / pred.seconds
        for gpu, r in ratio.groupby(pred.gpu):
            med, share = float(r.median()), float((abs(r - 1) <= WITHIN).mean())
            rows.append(dict(check=f"leave-one-GPU-out, {how}: median within 25%, >= 50% within 25%",
                             subject=f"{gpu} ({len(r)} kernels)", figure=f"{med:.3f} / {share:.0%}",
                             met=bool(abs(med - 1) <= 0.25 and share >= 0.50)))
    for gpu, d in ar.groupby("gpu"):
        share = float(d.within_20.mean())
        rows.append(dict(check="all-reduce: >= 80% of rows within 20%", subject=f"{gpu} ({len(d)} rows)",
                         figure=f"{share:.0%}", met=share >= 0.80))
    return pd.DataFrame(rows)


def page_from_csv(out_dir=common.RESULTS, folds=kernel_model.FOLDS) -> str:
    """Rewrite ``gpu_kernels.md`` from the CSVs a ``--report`` run left in ``out_dir``."""
    out_dir = Path(out_dir)
    summary = pd.read_csv(out_dir / "gpu_kernels_summary.csv")
    pred = pd.read_csv(out_dir / "gpu_kernels_predictions.csv")
    ar = pd.read_csv(out_dir / "gpu_kernels_allreduce.csv")
    lstm_path = out_dir / "gpu_kernels_lstm.csv"
    lstm = pd.read_csv(lstm_path) if lstm_path.exists() else pd.DataFrame()
    shift_path = out_dir / "gpu_kernels_layers.csv"
    shift = pd.read_csv(shift_path) if shift_path.exists() else pd.DataFrame()
    when = datetime.datetime.fromtimestamp((out_dir / "gpu_kernels_summary.csv").stat().st_mtime)
    page = _page(summary, pred, ar, lstm, folds, when, None, sorted(set(summary.op_class)), None,
                 len(lstm) > 0, shift)
    (out_dir / "gpu_kernels.md").write_text(page)
    return page


def _page(summary, pred, ar, lstm, folds, started, finished, classes, gpus, rnn, shift=None) -> str:
    cmd = "python -m experiments.gpu_kernels --report"
    if folds != kernel_model.FOLDS:
        cmd += f" --folds {folds}"
    if set(classes) != set(kernel_model.MODEL_CLASSES):
        cmd += " --classes " + " ".join(classes)
    if gpus:
        cmd += " --gpus " + " ".join(gpus)
    if not rnn:
        cmd += " --no-rnn"
    wide = _wide(summary, SHOWN)
    ar_sys = (ar.groupby("gpu").agg(rows=("ratio", "size"), within_20=("within_20", "mean"),
                                    median_ratio=("ratio", "median")).reset_index())
    checks = must_hold(summary, pred, ar)
    checks["met"] = checks.met.map({True: "met", False: "NOT met"})
    logo = pd.DataFrame([dict(GPU=gpu, kernels=len(r), median_ratio=f"{r.median():.2f}",
                              within_25=f"{(abs(r - 1) <= WITHIN).mean():.0%}",
                              before=f"{(pred.before / pred.seconds)[pred.gpu == gpu].median():.2f} / "
                                     f"{(abs(pred.before / pred.seconds - 1) <= WITHIN)[pred.gpu == gpu].mean():.0%}")
                         for gpu, r in (pred.datasheet_logo / pred.seconds).groupby(pred.gpu)])
    if "shape_logo" in pred.columns:
        r = pred.shape_logo / pred.seconds
        logo["with_shape"] = [f"{r[pred.gpu == gpu].median():.2f} / "
                              f"{(abs(r - 1) <= WITHIN)[pred.gpu == gpu].mean():.0%}" for gpu in logo.GPU]
    fits = allreduce.load_fits()
    fits = fits[fits.chosen.astype(bool)].copy()
    fits["bandwidth"] = (fits.bandwidth / 1e9).map("{:.2f} GB/s".format)
    fits["latency"] = (fits.latency * 1e6).map("{:.1f} us".format)
    fits["within"] = fits.within.map("{:.0%}".format)
    fits = fits[["gpu", "scope", "model", "bandwidth", "latency", "rows", "within"]]
    ar_sys = ar_sys.assign(within_20=ar_sys.within_20.map("{:.0%}".format),
                           median_ratio=ar_sys.median_ratio.map("{:.2f}".format))
    parts = [
        "# GPU presets against DeepBench's published kernel times",
        "",
        f"Command: `{cmd}` (no GPU needed). Generated by `experiments/gpu_kernels.py` from "
        f"`gpu_kernels_summary.csv`, `gpu_kernels_predictions.csv`, `gpu_kernels_allreduce.csv`"
        f"{', `gpu_kernels_lstm.csv`' if rnn else ''}"
        f"{', `gpu_kernels_layers.csv`' if shift is not None and len(shift) else ''}; "
        + (f"started {started:%Y-%m-%d %H:%M}, took {(finished - started).total_seconds():.0f} s"
           if finished else f"page rewritten (`--page-only`) from the CSVs of the run that ended "
                            f"{started:%Y-%m-%d %H:%M}")
        + f" on {_machine()} (a shared machine).",
        "",
        "What it measures: how close fddps's GPU presets come to the FP32 times DeepBench "
        "(Baidu; copy in `costmodel/data/deepbench`) published for convolutions (forward, input gradient, "
        "filter gradient) and MatMuls on six GPUs. A kernel's time is "
        "`max(flops / peak, bytes / bandwidth) * exp(g(features))`, with `g` a gradient-boosted "
        "tree ensemble per op class over FLOPs, input and output bytes and the GPU's peaks "
        "(`costmodel/kernel_model.py`; committed fit `costmodel/data/gpu_kernel_model.json`, "
        "`python -m costmodel.kernels --fit-deepbench`).",
        "",
        f"Each cell: median predicted / measured, then the share of kernels within 25%. "
        f"CV: {folds}-fold cross-validation over shapes (a shape is held out on every GPU at "
        "once). LOGO: the `gpu_from_datasheet` model fitted on the other five GPUs, the held-out "
        "GPU known only by its datasheet peaks. The presets use the pooled ensembles: \"with shape\" for the ops "
        "whose shape the op table knows, \"after\" for the rest, chosen because they held up best "
        "cross-validated; the roofline curve and the per-GPU "
        "regressor are the candidates it was chosen over.",
        "",
        "\"with shape\": the same pooled ensembles with the kernel's shape as well (a convolution's "
        "batch N, channels C and K, height H, filter R x S, stride and padding; a MatMul's M, N, K "
        "and transposes: `kernel_model.SHAPE_KEYS`), cross-validated and left-one-GPU-out the same "
        "way. cuDNN and cuBLAS pick their algorithm by these, and FLOPs and bytes do not determine "
        "them (ratios of FLOPs and bytes derived from them -- a MatMul's M, N, K solved from its "
        "FLOPs and bytes, powers of two, an odd-square factor hinting at a 3 x 3 filter -- moved "
        "the cross-validated shares by at most 3 points either way, so they were not kept). The "
        "committed file holds both; `kernel_model.predict_seconds(..., shapes=...)` uses the "
        "shape ensembles for ops whose shape it is given. `DevicePreset.op_times` "
        "(`costmodel/hardware.py`) passes the op table's `kernel_shape` column, which "
        "`fddps.tf.op_table` fills from each FP32 convolution's and MatMul's static shapes and "
        "attributes (`kernel_model.tf_kernel_shape`; a split op's parts get their own): fddps's "
        "op times (and Tables 5 and 7, Fig. 4) are the \"with shape\" model for those ops, the "
        "\"after\" one for ops whose shape is unknown.",
        "",
        _md_table(wide),
        "",
        "![predicted vs measured](gpu_kernels.png)",
        "",
        "## Must hold (issue 29)",
        "",
        _md_table(checks),
        "",
        "## Leave one GPU out, over all its kernels",
        "",
        "`gpu_from_datasheet`'s model fitted on the other five GPUs, the held-out GPU known only by "
        "its datasheet (`costmodel/deepbench.py`'s `DATASHEETS`); before: the roofline at 0.6 / "
        "0.7 of the same datasheet; with_shape: the same with the kernel's shape as well.",
        "",
        _md_table(logo),
        "",
        "## All-reduce",
        "",
        "DeepBench's all-reduce rows with times (its V100 and T4 rows have none) against the "
        "fit per system and scope (`node`: up to 8 GPUs of one server; `cluster`: 16 and 32 GPUs "
        "over several servers): `2 (p-1)/p * bytes / bandwidth` plus `(p-1) * latency` (ring) or "
        "`2 log2(p) * latency` (tree), the one with more rows within 20% kept "
        "(`costmodel/data/allreduce_fit.csv`, `python -m costmodel.allreduce --fit`). "
        "Data parallelism on one host of a measured GPU (the P100) uses the node fit.",
        "",
        _md_table(fits),
        "",
        "Per system (both scopes): rows within 20% of the published mean:",
        "",
        _md_table(ar_sys),
    ]
    if shift is not None and len(shift):
        t = shift.assign(without_ms=shift.without_ms.map("{:.1f}".format),
                         with_shape_ms=shift.with_shape_ms.map("{:.1f}".format),
                         ratio=shift.ratio.map("{:.2f}".format))
        parts += [
            "", "## What the kernel's shape changes for the paper's CNNs",
            "",
            "The convolution layers of ResNet-50, VGG-16 (224 x 224) and Inception-V3 (299 x 299) at "
            "batch 64 (`costmodel/data/conv_layers.csv`; each distinct layer times its count, no "
            "input gradient for the layer reading the images), their kernel-model times summed: "
            "`without_ms` by the ensembles over FLOPs and bytes (what `DevicePreset.op_times` "
            "predicted before op tables carried `kernel_shape`, and still predicts for an op of "
            "unknown shape), `with_shape_ms` with each layer's shape given (the \"with shape\" "
            "ensembles, what it predicts now); `ratio` = with / without.",
            "",
            _md_table(t),
        ]
    if rnn and len(lstm):
        t = (lstm.groupby("gpu").agg(layers=("ratio", "size"), median_ratio=("ratio", "median"),
                                     matmul_only=("ratio_matmul", "median"),
                                     overhead_share=("predicted_overhead", "sum"))
             .reset_index())
        t["overhead_share"] = (t.overhead_share / lstm.groupby("gpu").predicted.sum().to_numpy())
        for c in ("median_ratio", "matmul_only"):
            t[c] = t[c].map("{:.2f}".format)
        t["overhead_share"] = t.overhead_share.map("{:.0%}".format)
        parts += [
            "", "## LSTM layers",
            "",
            "The comparison: fddps's forward of one LSTM layer as `rnn_lm` and `nmt` build it -- "
            f"statically unrolled, {int(lstm.ops_per_step.iloc[0])} TensorFlow ops per step "
            "(ConcatV2, one MatMul of `[x, h]` by the `2H x 4H` kernel, BiasAdd, Split, the "
            "gates' element-wise ops), each costed by the preset and paying the 10 us per-op "
            "overhead -- summed over the steps, against DeepBench's forward time of the same "
            "layer (hidden = input size, batch, steps) run as cuDNN's fused LSTM. The ratio is "
            "therefore what fddps predicts for TensorFlow's unfused graph over what the fused "
            "kernel measures, not a like-for-like kernel error; `matmul_only` is the steps' "
            "MatMuls alone, `overhead_share` the per-op overhead's share of the prediction.",
            "",
            _md_table(t),
        ]
    return "\n".join(parts) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", nargs="*", metavar="TABLE",
                   help="compare presets with kernel tables (default: the committed one); no GPU")
    p.add_argument("--write-layers", action="store_true",
                   help="rebuild costmodel/data/conv_layers.csv from slim_models (TensorFlow)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--precisions", nargs="+", default=["tf32", "fp32"], choices=["tf32", "fp32"])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--gpu", help="preset name for the gpu column (default: from the device name)")
    p.add_argument("--layers", default=str(LAYERS))
    p.add_argument("--out", help="CSV of measured kernels (default experiments/results/gpu_kernels_GPU.csv)")
    p.add_argument("--deepbench", help="DeepBench CSV directory (default: costmodel/data/deepbench)")
    p.add_argument("--folds", type=int, default=kernel_model.FOLDS,
                   help="cross-validation folds over shapes (--report)")
    p.add_argument("--classes", nargs="+", default=list(kernel_model.MODEL_CLASSES),
                   choices=list(kernel_model.MODEL_CLASSES), help="op classes (--report)")
    p.add_argument("--gpus", nargs="+", default=None, help="DeepBench GPUs to report (default all)")
    p.add_argument("--out-dir", default=str(common.RESULTS), help="where --report writes")
    p.add_argument("--no-rnn", action="store_true", help="skip the LSTM comparison (TensorFlow)")
    p.add_argument("--page-only", action="store_true",
                   help="rewrite gpu_kernels.md from the CSVs of an earlier --report in --out-dir")
    args = p.parse_args(argv)
    if args.write_layers:
        return write_layers(path=Path(args.layers))
    if args.page_only:
        print(page_from_csv(Path(args.out_dir), folds=args.folds))
        return 0
    if args.report is not None and not args.report:
        return deepbench_report(args.deepbench, folds=args.folds, classes=args.classes,
                                gpus=args.gpus, out_dir=Path(args.out_dir), rnn=not args.no_rnn)
    if args.report is not None:
        paths = args.report or [kernels.KERNEL_TABLE]
        table = pd.concat([kernels.load_kernel_table(t) for t in paths], ignore_index=True)
        print(f"{len(table)} kernels from {', '.join(map(str, paths))}")
        return report(table, args.layers)
    return run_measure(args)


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
