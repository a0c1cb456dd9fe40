"""DeepBench's published GPU kernel times as fddps op-table rows, and the GPUs' datasheets.

DeepBench (Baidu Research, ``results/train/DeepBench_NV_*.xlsx``, Apache 2.0)
timed dense matrix multiplies, convolutions (forward, input gradient, filter
gradient), recurrent layers and all-reduce on six NVIDIA GPUs. A
column-normalised transcription lives in a directory of CSVs (``gemm.csv``,
``conv.csv``, ``rnn.csv``, ``allreduce.csv``; default
:data:`DEEPBENCH_DIR`, or the environment variable ``FDDPS_DEEPBENCH``).

:func:`load_kernels` turns the FP32 GEMM and convolution rows into the op-table
columns the presets predict from (``op_type``, ``flops``, ``input_bytes``,
``output_bytes``; FP32 tensors, FLOPs = 2 x multiply-adds), one row per kernel,
with the GPU's short name (:data:`GPU_NAMES`) and the measured ``seconds``.

:data:`DATASHEETS` holds each GPU's datasheet figures (FP32 peak, memory
bandwidth and size): what :func:`costmodel.gpu_from_datasheet` is given for a
GPU, and what leave-one-GPU-out validation holds out.

Examples
--------
>>> sorted(DATASHEETS)[:3]
['m40', 'p100', 't4']
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CostModelError

#: Where the CSVs are by default, unless ``FDDPS_DEEPBENCH`` says: the copy shipped with the
#: package (DeepBench's published training results, Apache License 2.0; see its README), so a
#: fresh clone re-fits and checks the GPU presets without the project's shared data folder.
DEEPBENCH_DIR = Path(__file__).resolve().parent / "data" / "deepbench"
DEEPBENCH_ENV = "FDDPS_DEEPBENCH"

#: DeepBench's GPU names -> fddps's short names.
GPU_NAMES = {
    "Nvidia Tesla M40": "m40", "Nvidia TitanX": "titanx", "Nvidia TitanX Pascal": "titanx-pascal",
    "NVIDIA Tesla P100": "p100", "NVIDIA V100": "v100", "NVIDIA T4": "t4",
}

GB = 1e9
GiB = 2.0 ** 30

#: Datasheet figures of the GPUs DeepBench timed: FP32 FLOP/s (boost clock x CUDA cores x 2),
#: memory bandwidth (bytes/s), memory (bytes), architecture and source. The P100 and V100
#: figures are the fddps presets' (``costmodel.presets``).
DATASHEETS = {
    "m40": dict(peak_flops=6.84e12, memory_bandwidth=288 * GB, memory=24 * GB, architecture="maxwell",
                source="NVIDIA Tesla M40 24 GB datasheet (2015): 3072 CUDA cores, 1114 MHz boost "
                       "(6.84 TFLOPS FP32), 288 GB/s GDDR5"),
    "titanx": dict(peak_flops=6.6e12, memory_bandwidth=336.5 * GB, memory=12 * GB,
                   architecture="maxwell",
                   source="NVIDIA GeForce GTX Titan X (Maxwell GM200, 2015): 3072 CUDA cores, "
                          "1075 MHz boost (6.6 TFLOPS FP32), 336.5 GB/s GDDR5, 12 GB"),
    "titanx-pascal": dict(peak_flops=10.97e12, memory_bandwidth=480 * GB, memory=12 * GB,
                          architecture="pascal",
                          source="NVIDIA Titan X (Pascal GP102, 2016): 3584 CUDA cores, 1531 MHz "
                                 "boost (10.97 TFLOPS FP32), 480 GB/s GDDR5X, 12 GB"),
    "p100": dict(peak_flops=9.3e12, memory_bandwidth=732 * GB, memory=16 * GiB, architecture="pascal",
                 source="NVIDIA Tesla P100 PCIe 16 GB datasheet (2016): 9.3 TFLOPS FP32, 732 GB/s"),
    "v100": dict(peak_flops=15.7e12, memory_bandwidth=900 * GB, memory=32 * GiB, architecture="volta",
                 source="NVIDIA Tesla V100 SXM2 32 GB datasheet (2017): 15.7 TFLOPS FP32, 900 GB/s"),
    "t4": dict(peak_flops=8.14e12, memory_bandwidth=320 * GB, memory=16 * GB, architecture="turing",
               source="NVIDIA T4 datasheet (2018): 8.1 TFLOPS FP32, 320 GB/s GDDR6, 16 GB"),
}

#: Kernel classes in the DeepBench rows and the TensorFlow op type each is predicted as.
OP_TYPES = {"conv_forward": "Conv2D", "conv_input_grad": "Conv2DBackpropInput",
            "conv_filter_grad": "Conv2DBackpropFilter", "matmul": "MatMul"}
KERNEL_CLASSES = tuple(OP_TYPES)
_FLOAT = 4  # bytes of an FP32 value


def deepbench_dir(path=None) -> Path:
    """The DeepBench directory: ``path``, else ``$FDDPS_DEEPBENCH``, else :data:`DEEPBENCH_DIR`.

    Raises
    ------
    CostModelError
        If the directory does not exist (the message names it).
    """
    p = Path(path or os.environ.get(DEEPBENCH_ENV) or DEEPBENCH_DIR)
    if not p.is_dir():
        raise CostModelError(f"DeepBench data directory {str(p)!r} does not exist; pass its path or "
                             f"set {DEEPBENCH_ENV}")
    return p


def _read(path: Path, needed) -> pd.DataFrame:
    if not path.is_file():
        raise CostModelError(f"{path}: no such DeepBench file")
    df = pd.read_csv(path)
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise CostModelError(f"{path}: no column {missing[0]!r} (needs {list(needed)})")
    unknown = sorted(set(df.gpu) - set(GPU_NAMES))
    if unknown:
        raise CostModelError(f"{path}: unknown GPU {unknown[0]!r}; known: {sorted(GPU_NAMES)}")
    return df


def _ms(col: pd.Series) -> np.ndarray:
    """Milliseconds as seconds; empty and "N/A" cells are NaN."""
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float) / 1e3


def load_kernels(path=None, precision: str = "fp32") -> pd.DataFrame:
    """DeepBench's GEMM and convolution kernels as op-table rows.

    Parameters
    ----------
    path : str or Path, optional
        The DeepBench directory (see :func:`deepbench_dir`).
    precision : str
        DeepBench's precision column: ``"fp32"`` (default) or ``"fp16_mixed"``.

    Returns
    -------
    pandas.DataFrame
        One row per kernel with a time: ``gpu`` (short name), ``op_class``
        (:data:`KERNEL_CLASSES`), ``op_type``, ``shape`` (a readable key, the
        same on every GPU), ``flops``, ``input_bytes``, ``output_bytes``,
        ``seconds``.

    Raises
    ------
    CostModelError
        For a missing file or column or an unknown GPU (the message names the file).
    """
    root = deepbench_dir(path)
    conv = _read(root / "conv.csv", ("gpu", "precision", "W", "H", "C", "N", "K", "R", "S", "pad_h",
                                     "pad_w", "stride_h", "stride_w", "fwd_ms", "bwd_input_ms",
                                     "bwd_filter_ms"))
    conv = conv[conv.precision == precision]
    ho = (conv.H + 2 * conv.pad_h - conv.R) // conv.stride_h + 1
    wo = (conv.W + 2 * conv.pad_w - conv.S) // conv.stride_w + 1
    flops = 2.0 * conv.N * conv.K * conv.C * conv.R * conv.S * ho * wo
    x = conv.N * conv.C * conv.H * conv.W
    w = conv.K * conv.C * conv.R * conv.S
    y = conv.N * conv.K * ho * wo
    shape = ("N=" + conv.N.astype(str) + " C=" + conv.C.astype(str) + " H=" + conv.H.astype(str)
             + " W=" + conv.W.astype(str) + " K=" + conv.K.astype(str) + " R=" + conv.R.astype(str)
             + " S=" + conv.S.astype(str) + " stride_h=" + conv.stride_h.astype(str) + " stride_w="
             + conv.stride_w.astype(str) + " pad_h=" + conv.pad_h.astype(str) + " pad_w="
             + conv.pad_w.astype(str))
    parts = []
    for cls, col, ins, out in (("conv_forward", "fwd_ms", x + w, y),
                               ("conv_input_grad", "bwd_input_ms", y + w, x),
                               ("conv_filter_grad", "bwd_filter_ms", x + y, w)):
        parts.append(pd.DataFrame(dict(gpu=conv.gpu.map(GPU_NAMES), op_class=cls, shape=shape,
                                       flops=flops, input_bytes=_FLOAT * ins.astype(float),
                                       output_bytes=_FLOAT * out.astype(float),
                                       seconds=_ms(conv[col]))))
    gemm = _read(root / "gemm.csv", ("gpu", "precision", "M", "N", "K", "trans_a", "trans_b", "time_ms"))
    gemm = gemm[gemm.precision == precision]
    shape = ("M=" + gemm.M.astype(str) + " N=" + gemm.N.astype(str) + " K=" + gemm.K.astype(str)
             + " transpose=" + gemm.trans_a.astype(str) + gemm.trans_b.astype(str))
    parts.append(pd.DataFrame(dict(
        gpu=gemm.gpu.map(GPU_NAMES), op_class="matmul", shape=shape,
        flops=2.0 * gemm.M * gemm.N * gemm.K,
        input_bytes=_FLOAT * (gemm.M * gemm.K + gemm.K * gemm.N).astype(float),
        output_bytes=_FLOAT * (gemm.M * gemm.N).astype(float), seconds=_ms(gemm.time_ms))))
    out = pd.concat(parts, ignore_index=True)
    out = out[np.isfinite(out.seconds) & (out.seconds > 0)].reset_index(drop=True)
    out.insert(2, "op_type", out.op_class.map(OP_TYPES))
    return out


def load_allreduce(path=None) -> pd.DataFrame:
    """DeepBench's all-reduce times with a time: ``gpu`` (short name), ``floats``, ``gpus``,
    ``bytes`` (FP32), ``seconds``, ``std_seconds``, ``algorithm``.

    The V100 and T4 rows of the transcription have no times and are left out.
    """
    df = _read(deepbench_dir(path) / "allreduce.csv",
               ("gpu", "floats", "gpus", "time_ms", "time_std_ms", "algorithm"))
    out = pd.DataFrame(dict(gpu=df.gpu.map(GPU_NAMES), floats=df.floats.astype(float),
                            gpus=df.gpus.astype(int), bytes=_FLOAT * df.floats.astype(float),
                            seconds=_ms(df.time_ms), std_seconds=_ms(df.time_std_ms),
                            algorithm=df.algorithm.astype(str)))
    return out[np.isfinite(out.seconds) & (out.seconds > 0)].reset_index(drop=True)


def load_rnn(path=None, precision: str = "fp32") -> pd.DataFrame:
    """DeepBench's recurrent layers: ``gpu`` (short name), ``cell`` (``vanilla``, ``lstm``,
    ``gru``), ``hidden``, ``batch``, ``timesteps``, ``fwd_seconds``, ``bwd_seconds`` (input
    plus weight gradient, or the sheet's single backward figure)."""
    df = _read(deepbench_dir(path) / "rnn.csv", ("gpu", "precision", "section", "hidden", "N",
                                                 "timesteps", "fwd_ms"))
    df = df[df.precision == precision]
    bwd = np.nan_to_num(_ms(df.get("bwd_input_ms", np.nan)), nan=0.0) + np.nan_to_num(
        _ms(df.get("bwd_weight_ms", np.nan)), nan=0.0)
    if "bwd_ms" in df.columns:
        bwd = np.where(bwd > 0, bwd, _ms(df.bwd_ms))
    cell = df.section.str.extract(r"(Vanilla|LSTM|GRU)", expand=False).str.lower()
    out = pd.DataFrame(dict(gpu=df.gpu.map(GPU_NAMES).to_numpy(), cell=cell.to_numpy(),
                            hidden=df.hidden.astype(int).to_numpy(),
                            batch=df.N.astype(int).to_numpy(),
                            timesteps=df.timesteps.astype(int).to_numpy(),
                            fwd_seconds=_ms(df.fwd_ms), bwd_seconds=np.where(bwd > 0, bwd, np.nan)))
    return out[np.isfinite(out.fwd_seconds)].reset_index(drop=True)
