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

``python -m experiments.gpu_kernels --report [TABLE ...]``
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
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel import hardware, kernels

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
            del x, w, y, dy
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
    args = p.parse_args(argv)
    if args.write_layers:
        return write_layers(path=Path(args.layers))
    if args.report is not None:
        paths = args.report or [kernels.KERNEL_TABLE]
        table = pd.concat([kernels.load_kernel_table(t) for t in paths], ignore_index=True)
        print(f"{len(table)} kernels from {', '.join(map(str, paths))}")
        return report(table, args.layers)
    return run_measure(args)


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
