"""GPU kernel times (published or measured) and the per-op-class efficiencies fitted to them.

The table ``costmodel/data/gpu_kernels.csv`` has one row per timed kernel:

``gpu``
    Preset name (``p100``, ``h100``, ...).
``op_class``
    One of :data:`costmodel.hardware.OP_CLASSES`.
``shape``
    ``"N=64 C=256 H=56 W=56 K=64 R=1 S=1 stride=1 pad=0"`` for convolutions
    (NCHW input, K filters of R x S; see :func:`parse_shape`), ``"M=.. N=.. K=.."``
    for MatMuls (``M x K`` times ``K x N``), ``"bytes=.."`` (read + written) for
    element-wise ops and reductions.
``precision``
    ``tf32`` or ``fp32``.
``seconds``
    Measured time of one kernel call (the GPU kernel alone: the preset's
    per-op ``overhead``, TensorFlow's dispatch, is left out when comparing).
``source``
    Where the number comes from.

:func:`fit_efficiencies` fits, per op class and precision, the efficiency that
makes a preset's roofline time closest to the measured times (least median
absolute log error); the named presets' ``efficiencies`` are its result
(``python -m costmodel.kernels`` prints them). ``experiments/gpu_kernels.py``
measures new rows on a GPU with PyTorch.

Examples
--------
>>> table = load_kernel_table()
>>> fit_efficiencies(table, "v100")
{'conv_forward/fp32': 0.646, 'matmul/fp32': 0.891}
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CostModelError
from .hardware import COMPUTE_CLASSES, OP_CLASSES, PRECISIONS, DevicePreset, device_preset

#: The committed table of kernel times.
KERNEL_TABLE = Path(__file__).resolve().parent / "data" / "gpu_kernels.csv"
COLUMNS = ("gpu", "op_class", "shape", "precision", "seconds", "source")
#: The op type each class's rows are predicted as.
_OP_TYPE = {"conv_forward": "Conv2D", "conv_input_grad": "Conv2DBackpropInput",
            "conv_filter_grad": "Conv2DBackpropFilter", "matmul": "MatMul", "elementwise": "AddV2",
            "reduction": "Sum"}
_SHAPE_KEYS = {"conv": ("N", "C", "H", "W", "K", "R", "S"), "matmul": ("M", "N", "K"),
               "memory": ("bytes",)}
_FLOAT_BYTES = 4  # FP32 tensors (TF32 also reads and writes FP32)


def parse_shape(op_class: str, shape: str) -> dict:
    """The numbers of a ``shape`` string (``"M=2560 N=64 K=2560"``) as a dict of ints.

    Convolutions need ``N C H W K R S``; ``stride`` and ``pad`` default to 1 and
    0, and ``stride_h``/``stride_w``/``pad_h``/``pad_w`` default to those
    (Inception's 1x7 and 7x1 filters pad one axis only).

    Raises
    ------
    CostModelError
        If a key the class needs is missing (the message names it and the shape).
    """
    values = {k: v for k, v in re.findall(r"(\w+)=([\w.]+)", str(shape))}
    kind = "conv" if op_class.startswith("conv") else "matmul" if op_class == "matmul" else "memory"
    missing = [k for k in _SHAPE_KEYS[kind] if k not in values]
    if missing:
        raise CostModelError(f"kernel shape {shape!r} of a {op_class} row lacks {missing} "
                             f"(needs {list(_SHAPE_KEYS[kind])})")
    d = {k: int(float(v)) for k, v in values.items() if k in _SHAPE_KEYS[kind] or kind == "conv"}
    if kind == "conv":
        d.setdefault("stride", 1)
        d.setdefault("pad", 0)
        for axis in ("h", "w"):
            d.setdefault(f"stride_{axis}", d["stride"])
            d.setdefault(f"pad_{axis}", d["pad"])
    return d


def kernel_features(op_class: str, shape: str) -> dict:
    """``op_type``, ``flops``, ``input_bytes``, ``output_bytes`` of one kernel, as fddps's op
    table has them for the TensorFlow op (FP32 tensors; FLOPs = 2 x multiply-adds).

    Examples
    --------
    >>> kernel_features("matmul", "M=2 N=3 K=4")["flops"]
    48
    """
    d = parse_shape(op_class, shape)
    if op_class.startswith("conv"):
        ho = (d["H"] + 2 * d["pad_h"] - d["R"]) // d["stride_h"] + 1
        wo = (d["W"] + 2 * d["pad_w"] - d["S"]) // d["stride_w"] + 1
        if ho < 1 or wo < 1:
            raise CostModelError(f"kernel shape {shape!r} has no output ({ho} x {wo})")
        x = d["N"] * d["C"] * d["H"] * d["W"]
        w = d["K"] * d["C"] * d["R"] * d["S"]
        y = d["N"] * d["K"] * ho * wo
        flops = 2 * d["N"] * d["K"] * d["C"] * d["R"] * d["S"] * ho * wo
        ins, out = {"conv_forward": (x + w, y), "conv_input_grad": (y + w, x),
                    "conv_filter_grad": (x + y, w)}[op_class]
    elif op_class == "matmul":
        flops = 2 * d["M"] * d["N"] * d["K"]
        ins, out = d["M"] * d["K"] + d["K"] * d["N"], d["M"] * d["N"]
    else:  # a binary element-wise op or a reduction: 2/3 of the bytes read, 1/3 written
        elements = d["bytes"] // (3 * _FLOAT_BYTES)
        flops, ins, out = elements, 2 * elements, elements
    return {"op_type": _OP_TYPE[op_class], "flops": flops, "input_bytes": ins * _FLOAT_BYTES,
            "output_bytes": out * _FLOAT_BYTES}


def load_kernel_table(path=None) -> pd.DataFrame:
    """The kernel table (default :data:`KERNEL_TABLE`), checked, with the op-table columns added.

    Raises
    ------
    CostModelError
        For a missing column, an unknown op class or precision, a bad shape or a
        time that is not positive; the message names the file and the row.
    """
    path = Path(path) if path is not None else KERNEL_TABLE
    table = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise CostModelError(f"{path}: kernel table has no column {missing[0]!r} (needs {list(COLUMNS)})")
    rows = []
    for i, r in table.iterrows():
        where = f"{path}, row {i + 2}"  # 1-based, after the header
        if r.op_class not in OP_CLASSES:
            raise CostModelError(f"{where}: unknown op class {r.op_class!r}; use one of {list(OP_CLASSES)}")
        if r.precision not in PRECISIONS:
            raise CostModelError(f"{where}: precision {r.precision!r} is not one of {list(PRECISIONS)}")
        if not (np.isfinite(r.seconds) and r.seconds > 0):
            raise CostModelError(f"{where}: seconds must be > 0, got {r.seconds!r}")
        try:
            rows.append(kernel_features(r["op_class"], r["shape"]))
        except CostModelError as err:
            raise CostModelError(f"{where}: {err}") from None
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows, index=table.index[:len(rows)])
                      .reset_index(drop=True)], axis=1)


def _predict(preset: DevicePreset, rows: pd.DataFrame, precision: str) -> np.ndarray:
    """The preset's kernel time: its op time less the per-op overhead (TensorFlow's dispatch),
    which a kernel benchmark does not include."""
    p = preset.with_precision(precision)
    return p.op_times(rows) - p.overhead


#: Fewest kernels of one class and precision a fitted efficiency rests on: one
#: kernel (DeepBench's first-layer convolution with 3 input channels, say) is
#: rarely typical of its class.
MIN_KERNELS = 3


def fit_efficiencies(table: pd.DataFrame, preset, *, min_kernels: int = MIN_KERNELS,
                     grid: int = 601) -> dict:
    """Per op class and precision, the efficiency fitting ``preset``'s times to the table's rows.

    For each (class, precision) with at least ``min_kernels`` rows of
    ``preset``'s GPU, the efficiency
    (of the compute peak for dense classes, of the memory bandwidth for
    element-wise ops and reductions) is the one, on a log grid from 0.001 to
    1, that minimises the median absolute log ratio of predicted to measured
    time (plus 1% of its mean, to break ties), the rest of the preset (peaks,
    overhead) as it is. A preset's kernel model (:mod:`costmodel.kernel_model`), if any, is
    left out: these are the roofline's efficiencies, used where the model does not apply.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`load_kernel_table`'s result.
    preset : DevicePreset or preset name
        Its name (before any ``:precision``) selects the rows (``gpu`` column).
    min_kernels : int
        Classes with fewer rows are left out (the preset keeps its value).

    Returns
    -------
    dict
        ``{"conv_forward/fp32": 0.71, "elementwise": 0.8, ...}``, only for the
        classes with rows: ready for ``DevicePreset(efficiencies=...)``.
    """
    # Efficiencies are the roofline's: fitted with a preset's kernel model (if any) left out.
    preset = replace(device_preset(preset), kernel_model="")
    gpu = preset.name.split(":")[0]
    mine = table[table.gpu == gpu]
    candidates = np.logspace(-3, 0, grid)
    fitted = {}
    for (cls, precision), rows in mine.groupby(["op_class", "precision"], sort=True):
        if len(rows) < min_kernels:
            continue
        key = f"{cls}/{precision}" if cls in COMPUTE_CLASSES else cls
        measured = rows.seconds.to_numpy(dtype=float)
        errors = []
        for e in candidates:
            log_err = np.abs(np.log(_predict(replace(preset, efficiencies={key: e}), rows,
                                             precision) / measured))
            # The mean breaks ties between efficiencies with one median (kernels bound by
            # memory or the overhead do not move with it).
            errors.append(np.median(log_err) + 0.01 * np.mean(log_err))
        fitted[key] = round(float(candidates[int(np.argmin(errors))]), 3)
    return fitted


def prediction_errors(table: pd.DataFrame, preset) -> pd.DataFrame:
    """Each of ``preset``'s GPU's rows with the preset's predicted time and the ratio to the measured.

    ``ratio`` > 1: the preset predicts too slow; ``abs_error`` is ``|predicted / measured - 1|``.
    """
    preset = device_preset(preset)
    gpu = preset.name.split(":")[0]
    rows = table[table.gpu == gpu].copy()
    rows["predicted"] = np.nan
    for precision, sel in rows.groupby("precision").groups.items():
        rows.loc[sel, "predicted"] = _predict(preset, rows.loc[sel], precision)
    rows["ratio"] = rows.predicted / rows.seconds
    rows["abs_error"] = (rows.ratio - 1).abs()
    return rows


def error_summary(table: pd.DataFrame, presets_by_name: dict) -> pd.DataFrame:
    """Median per-kernel error per preset, GPU, op class and precision.

    Parameters
    ----------
    presets_by_name : dict of label -> DevicePreset
        E.g. ``{"before": old, "after": new}``; each is compared on its own GPU's rows.

    Returns
    -------
    pandas.DataFrame with columns ``preset, gpu, op_class, precision, kernels,
    median_ratio, median_abs_error``.
    """
    out = []
    for label, preset in presets_by_name.items():
        e = prediction_errors(table, preset)
        for (gpu, cls, precision), d in e.groupby(["gpu", "op_class", "precision"]):
            out.append(dict(preset=label, gpu=gpu, op_class=cls, precision=precision, kernels=len(d),
                            median_ratio=float(d.ratio.median()),
                            median_abs_error=float(d.abs_error.median())))
    return pd.DataFrame(out)


def fit_deepbench(deepbench=None, out=None) -> dict:
    """Fit the kernel-dependent model (:mod:`costmodel.kernel_model`) to DeepBench's FP32
    GEMMs and convolutions and write it (default :data:`costmodel.kernel_model.MODEL_FILE`).

    Returns the fitted models (the file's content).
    """
    from . import deepbench as db
    from . import kernel_model as km

    kernels_ = db.load_kernels(deepbench)
    models = km.fit_models(kernels_, db.DATASHEETS)
    models["source"] = (f"DeepBench FP32 GEMM and convolution times ({len(kernels_)} kernels, "
                        f"{', '.join(models['gpus'])}); python -m costmodel.kernels --fit-deepbench")
    km.save_models(models, out or km.MODEL_FILE)
    return models


def main(argv=None) -> int:
    """``python -m costmodel.kernels [TABLE]``: print the efficiencies fitted per GPU and the errors.

    ``python -m costmodel.kernels --fit-deepbench [DIR]``: fit the kernel-dependent model to
    DeepBench (default: the shared data) and write ``costmodel/data/gpu_kernel_model.json``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--fit-deepbench":
        from . import kernel_model as km

        models = fit_deepbench(argv[1] if len(argv) > 1 else None)
        print(f"fitted {sorted(models['named'])} on {models['gpus']} "
              f"({sum(models['kernels'].values())} kernels); wrote {km.MODEL_FILE}")
        return 0
    table = load_kernel_table(argv[0] if argv else None)
    from .hardware import _DATASHEET_PRESETS, presets

    print(f"{len(table)} kernels in {argv[0] if argv else KERNEL_TABLE}")
    for gpu in sorted(set(table.gpu)):
        base = _DATASHEET_PRESETS[gpu]
        print(f"{gpu}: fitted (classes with >= {MIN_KERNELS} kernels): {fit_efficiencies(table, base)}; "
              f"with >= 1: {fit_efficiencies(table, base, min_kernels=1)}")
        summary = error_summary(table, {"datasheet": base, "fitted": presets[gpu]})
        print(summary.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
