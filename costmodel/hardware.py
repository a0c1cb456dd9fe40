"""Hardware presets: analytic (roofline-style) op times and link figures.

A :class:`DevicePreset` predicts an op's time from its FLOPs and the bytes it
reads and writes, without running anything::

    time = overhead + max(flops / (peak * compute_efficiency),
                          bytes / (memory_bandwidth * memory_efficiency))

``peak`` is the FP32 peak, or for the dense ops that TensorFlow runs on tensor
cores by default (TF32 on Ampere and Hopper: MatMul, Conv2D and their
gradients) the TF32 peak -- unless the preset is switched to FP32
(``presets["h100"].with_precision("fp32")``, or the name ``"h100:fp32"``), as
TensorFlow is by ``tf.config.experimental.enable_tensor_float_32_execution(False)``.
Ops that only alias or describe tensors (:data:`NO_WORK_OPS`: Identity,
Reshape, Shape, Const, ...) cost only the overhead.

Each op belongs to an op class (:func:`op_class`: convolution forward, input
gradient, filter gradient, MatMul, element-wise, reduction). A preset may hold
an efficiency per class and precision (:attr:`DevicePreset.efficiencies`):
for the dense classes the fraction of the compute peak they reach, for
element-wise ops and reductions the fraction of the memory bandwidth. Classes
without one use ``compute_efficiency`` / ``memory_efficiency``. The named GPU
presets take theirs from published kernel benchmarks
(``costmodel/data/gpu_kernels.csv``, fitted by :func:`costmodel.kernels.fit_efficiencies`);
:meth:`DevicePreset.calibrate` fits them to a profile.

A preset may also hold efficiencies that depend on the op's size
(:attr:`DevicePreset.efficiency_curves`, fitted to this machine's CPU by
:func:`costmodel.calibrate_cpu`): per class, the efficiency as a piecewise-linear
function of log10 of the op's FLOPs (dense classes) or bytes moved (element-wise,
reduction); they win over the class's single efficiency.

A GPU preset with a :attr:`DevicePreset.kernel_model` times its FP32 convolutions
and MatMuls by the kernel-dependent model fitted to DeepBench's published kernel
times instead (:mod:`costmodel.kernel_model`: an efficiency that depends on the
kernel's size and shape, not one per class): the ``p100`` and ``v100`` by their
own kernels, the ``k80`` and the FP32 modes of the ``a100`` and ``h100`` (and
:func:`costmodel.gpu_from_datasheet`) by the model that knows a GPU by its
datasheet peaks. Where the op table has a :data:`KERNEL_SHAPE_COLUMN` column
(``kernel_shape``: the kernel's shape string, which ``fddps.tf.graphdef.op_table``
fills from each op's static shapes and attributes by
:func:`costmodel.kernel_model.tf_kernel_shape`), an op with a shape there is timed
by the ensemble that also sees its shape (batch, channels, filter size, stride,
padding; a MatMul's M, N, K and transposes); an op without one (None or empty,
or no such column: an op of unknown shape, a part of an op split by rows or
columns, a shape whose bytes are not the op's) by the ensemble over FLOPs and
bytes alone.

A :class:`LinkPreset` is a latency and a bandwidth: a transfer of ``b`` bytes
costs ``latency + b / bandwidth``.

The named presets live in :data:`presets` (``costmodel.presets``)::

    >>> from costmodel import presets
    >>> presets["p100"].peak_flops
    9300000000000.0
    >>> presets["pcie3"].bandwidth
    12000000000.0
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import pandas as pd

from .errors import CostModelError
from .kernel_model import KERNEL_SHAPE_COLUMN, MODEL_OP_TYPES, load_models, predict_seconds

GB = 1e9
GiB = 2.0 ** 30

#: Op types that alias, describe or hold tensors without touching their data:
#: they cost only the per-op overhead on every device.
NO_WORK_OPS = frozenset({
    "NoOp", "Const", "HostConst", "Identity", "IdentityN", "Placeholder", "PlaceholderWithDefault",
    "VarHandleOp", "VariableV2", "Variable", "ReadVariableOp", "VarIsInitializedOp", "Shape",
    "ShapeN", "Size", "Rank", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "PreventGradient",
    "ControlTrigger", "_Arg", "_Retval", "_Send", "_Recv", "_HostSend", "_HostRecv",
    "BroadcastGradientArgs", "EnsureShape", "CheckNumerics", "Enter", "Exit", "Merge", "Switch",
    "NextIteration", "LoopCond", "DestroyResourceOp",
})

#: Dense op types that TensorFlow runs on tensor cores by default on GPUs with
#: TF32 (``tf.config.experimental.enable_tensor_float_32_execution`` defaults to on).
TENSOR_CORE_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv2DBackpropInput",
    "Conv2DBackpropFilter", "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "_FusedConv2D", "_FusedMatMul", "Einsum",
})

#: Op classes that get their own efficiency (see :func:`op_class`). The first
#: four are bound by compute, the last two by memory bandwidth.
OP_CLASSES = ("conv_forward", "conv_input_grad", "conv_filter_grad", "matmul", "elementwise",
              "reduction")
COMPUTE_CLASSES = frozenset(OP_CLASSES[:4])
MEMORY_CLASSES = frozenset(OP_CLASSES[4:])
#: Precisions of the dense (tensor-core) classes: TF32 tensor cores or FP32 CUDA cores.
PRECISIONS = ("tf32", "fp32")

_OP_CLASS_OF = {
    **dict.fromkeys(("Conv2D", "Conv3D", "_FusedConv2D", "DepthwiseConv2dNative",
                     "FusedConv2DBiasActivation", "Conv"), "conv_forward"),
    **dict.fromkeys(("Conv2DBackpropInput", "Conv3DBackpropInput", "Conv3DBackpropInputV2",
                     "DepthwiseConv2dNativeBackpropInput"), "conv_input_grad"),
    **dict.fromkeys(("Conv2DBackpropFilter", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2",
                     "DepthwiseConv2dNativeBackpropFilter"), "conv_filter_grad"),
    **dict.fromkeys(("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul",
                     "Einsum", "SparseMatMul"), "matmul"),
    # Ops that reduce over whole axes (batch-norm statistics, bias and loss gradients).
    **dict.fromkeys(("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin",
                     "BiasAddGrad", "L2Loss", "SoftmaxCrossEntropyWithLogits",
                     "SparseSoftmaxCrossEntropyWithLogits", "FusedBatchNorm", "FusedBatchNormV2",
                     "FusedBatchNormV3", "FusedBatchNormGrad", "FusedBatchNormGradV2",
                     "FusedBatchNormGradV3", "Softmax", "LogSoftmax", "EuclideanNorm"),
                    "reduction"),
}


def op_class(op_type: str) -> str:
    """The op class whose efficiency an op type's time is predicted with.

    Returns one of :data:`OP_CLASSES`, or ``"no_work"`` for :data:`NO_WORK_OPS`.
    Op types not listed (Relu, AddV2, MaxPool, ApplyAdam, ...) are ``"elementwise"``:
    they stream their tensors through memory once.

    Examples
    --------
    >>> op_class("Conv2DBackpropFilter"), op_class("BiasAddGrad"), op_class("Relu")
    ('conv_filter_grad', 'reduction', 'elementwise')
    """
    return str(_op_classes(np.asarray([op_type], dtype=object))[0])


def _op_classes(types) -> np.ndarray:
    """:func:`op_class` of every element of an array of op types."""
    types = np.asarray(types, dtype=object)
    codes, uniques = pd.factorize(types)
    if len(types) > len(uniques) > 0 and (codes >= 0).all():
        # Tables of many rows hold few op types: class each type once.
        return _op_classes(np.asarray(uniques, dtype=object))[codes]
    classes = pd.Series(types.astype(str)).map(_OP_CLASS_OF)
    classes = classes.fillna("elementwise").to_numpy(dtype=object)
    classes[np.isin(np.asarray(types, dtype=object).astype(str), list(NO_WORK_OPS))] = "no_work"
    return classes


def _efficiency_key(key, preset_name) -> str:
    cls, _, precision = str(key).partition("/")
    ok = ((cls in COMPUTE_CLASSES and precision in PRECISIONS)
          or (cls in MEMORY_CLASSES and precision == ""))
    if not ok:
        raise CostModelError(
            f"preset {preset_name!r}: efficiency key {key!r} is neither CLASS/PRECISION (CLASS in "
            f"{sorted(COMPUTE_CLASSES)}, PRECISION in {list(PRECISIONS)}) nor one of "
            f"{sorted(MEMORY_CLASSES)}")
    return f"{cls}/{precision}" if precision else cls


def _efficiency_table(value, preset_name) -> tuple:
    """A mapping (or pairs) ``{"conv_forward/tf32": 0.3, "elementwise": 0.8}`` as sorted pairs, checked."""
    items = value.items() if isinstance(value, Mapping) else value
    out = {}
    for key, eff in items:
        key = _efficiency_key(key, preset_name)
        eff = float(eff)
        if not (np.isfinite(eff) and 0 < eff <= 1):
            raise CostModelError(f"preset {preset_name!r}: efficiency {key!r} must be in (0, 1], "
                                 f"got {eff!r}")
        out[key] = eff
    return tuple(sorted(out.items()))


def _curve_table(value, preset_name) -> tuple:
    """Efficiency curves ``{"elementwise": [[log10_bytes, eff], ...], "matmul/fp32": ...}`` as
    sorted ``(key, ((x, eff), ...))`` pairs, checked: x finite and strictly increasing,
    each efficiency in (0, 1]."""
    items = value.items() if isinstance(value, Mapping) else value
    out = {}
    for key, points in items:
        key = _efficiency_key(key, preset_name)
        try:
            pts = tuple((float(x), float(e)) for x, e in points)
        except (TypeError, ValueError):
            raise CostModelError(f"preset {preset_name!r}: efficiency curve {key!r} must be a list "
                                 f"of [log10_size, efficiency] pairs, got {points!r}") from None
        xs = np.array([x for x, _ in pts])
        es = np.array([e for _, e in pts])
        if not pts or not np.isfinite(xs).all() or (np.diff(xs) <= 0).any():
            raise CostModelError(f"preset {preset_name!r}: efficiency curve {key!r} needs at least "
                                 f"one point, sizes finite and strictly increasing, got {points!r}")
        if not (np.isfinite(es).all() and (es > 0).all() and (es <= 1).all()):
            raise CostModelError(f"preset {preset_name!r}: efficiency curve {key!r} has an "
                                 f"efficiency outside (0, 1]: {points!r}")
        out[key] = pts
    return tuple(sorted(out.items()))


def curve_efficiency(curve, size) -> np.ndarray:
    """Efficiency of ops of ``size`` (FLOPs or bytes; number or array) on a curve of
    ``(log10_size, efficiency)`` points: piecewise linear in log10 size between the
    points (interpolating the log of the efficiency), constant beyond the first and last.

    Examples
    --------
    >>> float(curve_efficiency(((6.0, 0.1), (8.0, 0.4)), 1e7))
    0.2
    >>> float(curve_efficiency(((6.0, 0.1), (8.0, 0.4)), 1e12))
    0.4
    """
    xs = np.array([x for x, _ in curve])
    log_e = np.log([e for _, e in curve])
    x = np.log10(np.maximum(np.asarray(size, dtype=np.float64), 1.0))
    return np.exp(np.interp(x, xs, log_e))


_REQUIRED_OP_COLUMNS = ("op_type", "flops", "input_bytes", "output_bytes")


def op_features(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FLOPs, bytes moved (in + out) and op types of an op table, as arrays.

    Missing values (ops whose shapes are unknown) count as 0.

    Raises
    ------
    CostModelError
        If a required column (``op_type``, ``flops``, ``input_bytes``,
        ``output_bytes``) is missing; the message names it.
    """
    missing = [c for c in _REQUIRED_OP_COLUMNS if c not in ops.columns]
    if missing:
        raise CostModelError(f"the op table has no column {missing[0]!r} "
                             f"(needs {list(_REQUIRED_OP_COLUMNS)}, has {list(ops.columns)})")
    flops = np.nan_to_num(ops["flops"].to_numpy(dtype=np.float64), nan=0.0, posinf=0.0)
    moved = (np.nan_to_num(ops["input_bytes"].to_numpy(dtype=np.float64), nan=0.0, posinf=0.0)
             + np.nan_to_num(ops["output_bytes"].to_numpy(dtype=np.float64), nan=0.0, posinf=0.0))
    return np.maximum(flops, 0.0), np.maximum(moved, 0.0), ops["op_type"].astype(str).to_numpy()


@dataclass(frozen=True)
class DevicePreset:
    """Analytic model of one device type.

    Attributes
    ----------
    name : str
        Preset name (``"p100"``).
    device_type : str
        TensorFlow device type it models (``"GPU"``, ``"CPU"``).
    peak_flops : float
        FP32 FLOP/s.
    memory_bandwidth : float
        Bytes/s of device memory.
    memory : float
        Capacity in bytes.
    overhead : float
        Seconds every op costs however small (executor dispatch, kernel launch).
    compute_efficiency, memory_efficiency : float
        Fractions of the peaks ops reach, where :attr:`efficiencies` has no
        entry for the op's class.
    tensor_flops : float
        FLOP/s of :data:`TENSOR_CORE_OPS` in TF32 (tensor cores); 0: the device has none.
    source : str
        Where the figures come from.
    precision : str
        ``"tf32"`` (TensorFlow's default on Ampere and later: :data:`TENSOR_CORE_OPS`
        run at ``tensor_flops``) or ``"fp32"`` (every op at ``peak_flops``).
        Default: ``"tf32"`` when ``tensor_flops > 0``, else ``"fp32"``.
        :meth:`with_precision` switches it.
    kernel_model : str
        ``""``: every op's time is the roofline. Otherwise the FP32 convolutions
        and MatMuls (:data:`costmodel.kernel_model.MODEL_OP_TYPES`, run off the
        tensor cores) take the time of the kernel-dependent model fitted to
        DeepBench's published kernels (:mod:`costmodel.kernel_model`): the name of
        a GPU it was fitted on (``"p100"``, ``"v100"``), or ``"datasheet"`` for the
        model that knows a GPU by its peaks alone (:func:`costmodel.gpu_from_datasheet`).
        Plus the per-op ``overhead``. Other ops, and TF32 ones, keep the roofline.
    efficiencies : mapping of str -> float
        Per op class (:func:`op_class`): ``"CLASS/PRECISION"`` for the dense
        classes (``"conv_forward/tf32"``: fraction of the TF32 peak a forward
        convolution reaches; ``"matmul/fp32"``: of the FP32 peak) and
        ``"elementwise"`` / ``"reduction"`` (fraction of the memory bandwidth).
        Stored as sorted ``(key, value)`` pairs so that the preset stays hashable;
        :meth:`efficiency` reads one.
    efficiency_curves : mapping of str -> list of (float, float)
        Per op class (keys as for :attr:`efficiencies`), an efficiency that depends on
        the op's size: ``(log10 size, efficiency)`` points, read by
        :func:`curve_efficiency` at log10 of the op's FLOPs (dense classes) or bytes
        moved (element-wise, reduction). A class with a curve ignores its entry in
        :attr:`efficiencies`; the memory term of a dense op with a curve then uses
        the ``"elementwise"`` curve at its bytes (streaming its tensors), if there
        is one. :func:`costmodel.calibrate_cpu` fits them to this machine's CPU.

    Examples
    --------
    >>> h100 = presets["h100"]
    >>> h100.precision, h100.with_precision("fp32").precision
    ('tf32', 'fp32')
    """

    name: str
    device_type: str
    peak_flops: float
    memory_bandwidth: float
    memory: float
    overhead: float
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.7
    tensor_flops: float = 0.0
    source: str = ""
    precision: str | None = None
    efficiencies: tuple = ()
    kernel_model: str = ""
    efficiency_curves: tuple = ()

    def __post_init__(self):
        for f in ("peak_flops", "memory_bandwidth", "memory", "compute_efficiency",
                  "memory_efficiency"):
            v = getattr(self, f)
            if not (np.isfinite(v) and v > 0):
                raise CostModelError(f"preset {self.name!r}: {f} must be finite and > 0, got {v!r}")
        if not (np.isfinite(self.overhead) and self.overhead >= 0):
            raise CostModelError(f"preset {self.name!r}: overhead must be finite and >= 0")
        if not (np.isfinite(self.tensor_flops) and self.tensor_flops >= 0):
            raise CostModelError(f"preset {self.name!r}: tensor_flops must be finite and >= 0")
        precision = self.precision
        if precision is None:
            precision = "tf32" if self.tensor_flops > 0 else "fp32"
        precision = str(precision).lower()
        if precision not in PRECISIONS:
            raise CostModelError(f"preset {self.name!r}: precision must be one of {list(PRECISIONS)}, "
                                 f"got {self.precision!r}")
        if precision == "tf32" and self.tensor_flops <= 0:
            raise CostModelError(f"preset {self.name!r} has no TF32 tensor cores (tensor_flops is 0); "
                                 f"its precision can only be 'fp32'")
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "efficiencies", _efficiency_table(self.efficiencies, self.name))
        object.__setattr__(self, "efficiency_curves",
                           _curve_table(self.efficiency_curves, self.name))
        model = str(self.kernel_model or "")
        if model:
            known = ["datasheet"] + list(load_models()["gpus"])
            if model not in known:
                raise CostModelError(f"preset {self.name!r}: kernel_model {model!r} is not one of "
                                     f"{known} (costmodel/data/gpu_kernel_model.json)")
        object.__setattr__(self, "kernel_model", model)

    def with_precision(self, precision: str) -> "DevicePreset":
        """A copy of this preset that runs the dense ops in ``precision`` (``"tf32"`` or ``"fp32"``).

        ``"fp32"`` models TensorFlow with ``enable_tensor_float_32_execution(False)``
        (or a GPU before Ampere); the name becomes ``NAME:fp32``.

        Raises
        ------
        CostModelError
            For another precision, or ``"tf32"`` on a GPU without tensor cores.

        Examples
        --------
        >>> presets["h100"].with_precision("fp32").name
        'h100:fp32'
        """
        base = self.name.split(":")[0]
        p = str(precision).lower()
        name = base if p == "tf32" or (p == "fp32" and self.tensor_flops <= 0) else f"{base}:{p}"
        return replace(self, precision=p, name=name)

    def efficiency(self, cls: str, precision: str | None = None) -> float:
        """The efficiency ops of class ``cls`` (:data:`OP_CLASSES`) reach in ``precision``.

        Falls back to ``compute_efficiency`` (dense classes) or
        ``memory_efficiency`` (element-wise, reduction) when the preset has none
        for the class.
        """
        table = dict(self.efficiencies)
        if cls in MEMORY_CLASSES:
            return table.get(cls, self.memory_efficiency)
        if cls not in COMPUTE_CLASSES:
            raise CostModelError(f"unknown op class {cls!r}; op classes: {list(OP_CLASSES)}")
        return table.get(f"{cls}/{precision or self.precision}", self.compute_efficiency)

    def op_times(self, ops: pd.DataFrame) -> np.ndarray:
        """Roofline time in seconds of every row of ``ops`` on this device.

        Parameters
        ----------
        ops : pandas.DataFrame
            Needs ``op_type``, ``flops``, ``input_bytes``, ``output_bytes``. An optional
            ``kernel_shape`` column (:data:`KERNEL_SHAPE_COLUMN`; a shape string or
            None per op) gives the convolutions' and MatMuls' shapes to the kernel
            model (:attr:`kernel_model`); rows without one get its FLOPs-and-bytes time.

        Returns
        -------
        numpy.ndarray of float, one finite time per row.

        Examples
        --------
        >>> ops = pd.DataFrame({"op_type": ["MatMul", "Identity"], "flops": [2e9, 0],
        ...                     "input_bytes": [8e6, 4e6], "output_bytes": [4e6, 4e6]})
        >>> t = presets["v100"].op_times(ops)
        >>> bool(t[0] > t[1] == presets["v100"].overhead)
        True
        """
        flops, moved, types = op_features(ops)
        input_bytes = np.maximum(np.nan_to_num(ops["input_bytes"].to_numpy(dtype=np.float64), nan=0.0,
                                               posinf=0.0), 0.0)
        shapes = (ops[KERNEL_SHAPE_COLUMN].to_numpy(dtype=object)
                  if KERNEL_SHAPE_COLUMN in ops.columns else None)
        return self._roofline(flops, moved, types, input_bytes, shapes)

    def _rates(self, types, flops=None, moved=None):
        """Per op: effective compute FLOP/s and memory bytes/s (peaks times efficiencies;
        with :attr:`efficiency_curves`, efficiencies at each op's ``flops`` / ``moved``)."""
        classes = _op_classes(types)
        tensor = (np.isin(types, list(TENSOR_CORE_OPS)) if self.precision == "tf32"
                  else np.zeros(len(types), dtype=bool))
        peak = np.where(tensor, self.tensor_flops, self.peak_flops)
        c_eff = np.full(len(types), self.compute_efficiency)
        m_eff = np.full(len(types), self.memory_efficiency)
        for cls in pd.unique(classes):
            sel = classes == cls
            if cls in COMPUTE_CLASSES:
                # A dense op off the tensor cores (DepthwiseConv2dNative) runs in FP32.
                c_eff[sel & tensor] = self.efficiency(cls, "tf32")
                c_eff[sel & ~tensor] = self.efficiency(cls, "fp32")
            elif cls in MEMORY_CLASSES:
                m_eff[sel] = self.efficiency(cls)
        if self.efficiency_curves and flops is not None and moved is not None:
            self._apply_curves(classes, tensor, flops, moved, c_eff, m_eff)
        return peak * c_eff, self.memory_bandwidth * m_eff, classes

    def _apply_curves(self, classes, tensor, flops, moved, c_eff, m_eff):
        """Overwrite the efficiencies of ops whose class has a curve, at their sizes."""
        curves = dict(self.efficiency_curves)
        stream = curves.get("elementwise")
        for cls in pd.unique(classes):
            sel = classes == cls
            if cls in COMPUTE_CLASSES:
                for precision, on in (("tf32", tensor), ("fp32", ~tensor)):
                    curve = curves.get(f"{cls}/{precision}")
                    pick = sel & on
                    if curve is not None and pick.any():
                        c_eff[pick] = curve_efficiency(curve, flops[pick])
                        if stream is not None:
                            m_eff[pick] = curve_efficiency(stream, moved[pick])
            elif cls in MEMORY_CLASSES and cls in curves:
                m_eff[sel] = curve_efficiency(curves[cls], moved[sel])

    def _roofline(self, flops, moved, types, input_bytes=None, shapes=None):
        compute_rate, memory_rate, classes = self._rates(types, flops, moved)
        t = self.overhead + np.maximum(flops / compute_rate, moved / memory_rate)
        if self.kernel_model and input_bytes is not None:
            # FP32 dense kernels of the types DeepBench timed: the fitted kernel model.
            on_model = np.isin(types, list(MODEL_OP_TYPES)) & (flops > 0)
            if self.precision == "tf32":
                on_model &= ~np.isin(types, list(TENSOR_CORE_OPS))
            if on_model.any():
                t = t.copy()
                t[on_model] = self.overhead + predict_seconds(
                    self.kernel_model, flops[on_model], input_bytes[on_model],
                    moved[on_model] - input_bytes[on_model], classes[on_model],
                    peak_flops=self.peak_flops, memory_bandwidth=self.memory_bandwidth,
                    shapes=None if shapes is None else list(shapes[on_model]))
        return np.where(classes == "no_work", self.overhead, t)

    def calibrate(self, measured: pd.DataFrame, *, quantile_overhead: float = 0.1) -> "DevicePreset":
        """A copy of this preset with overhead and efficiencies fitted to measured op times.

        The overhead becomes a low quantile of the times of ops that do no work
        (or of all ops, if none of those were timed); the compute efficiency the
        median, over ops the preset deems compute-bound, of (predicted compute
        time at efficiency 1) / (measured time - overhead); likewise the memory
        efficiency over memory-bound ops. The same median, over the ops of one
        class (:func:`op_class`) only, becomes that class's entry in
        :attr:`efficiencies` when at least 3 of its ops were timed. Medians keep
        outliers from moving it.

        Parameters
        ----------
        measured : pandas.DataFrame
            An op table (see :meth:`op_times`) with a ``seconds`` column.

        Raises
        ------
        CostModelError
            If ``measured`` has no ``seconds`` column or no finite positive time.
        """
        if "seconds" not in measured.columns:
            raise CostModelError("calibrating a preset needs a 'seconds' column of measured op times")
        t = measured["seconds"].to_numpy(dtype=np.float64)
        ok = np.isfinite(t) & (t > 0)
        if not ok.any():
            raise CostModelError(f"no finite positive op time to calibrate preset {self.name!r} with")
        flops, moved, types = op_features(measured)
        flops, moved, types, t = flops[ok], moved[ok], types[ok], t[ok]
        classes = _op_classes(types)
        no_work = (classes == "no_work") | ((flops == 0) & (moved == 0))
        base = t[no_work] if no_work.sum() >= 3 else t
        overhead = float(np.quantile(base, quantile_overhead))
        compute_rate, memory_rate, _ = self._rates(types, flops, moved)
        tensor = (np.isin(types, list(TENSOR_CORE_OPS)) if self.precision == "tf32"
                  else np.zeros(len(t), bool))
        peak = np.where(tensor, self.tensor_flops, self.peak_flops)
        ideal_compute = flops / peak
        ideal_memory = moved / self.memory_bandwidth
        work = np.maximum(t - overhead, 1e-12)
        changes = {"overhead": overhead}
        # Bound-ness at the preset's current efficiencies (the roofline ridge).
        compute_bound = ~no_work & (flops / compute_rate >= moved / memory_rate) & (flops > 0)
        memory_bound = ~no_work & ~compute_bound & (moved > 0)
        # Ops whose time is mostly overhead say nothing about the peaks.
        big = work > overhead

        def fit(sel, ideal):
            return float(np.clip(np.median(ideal[sel] / work[sel]), 1e-4, 1.0)) if sel.sum() >= 3 else None

        for name, sel, ideal in (("compute_efficiency", compute_bound & big, ideal_compute),
                                 ("memory_efficiency", memory_bound & big, ideal_memory)):
            eff = fit(sel, ideal)
            if eff is not None:
                changes[name] = eff
        table = dict(self.efficiencies)
        for cls in OP_CLASSES:
            if cls in COMPUTE_CLASSES:
                for precision, on in (("tf32", tensor), ("fp32", ~tensor)):
                    eff = fit((classes == cls) & on & compute_bound & big, ideal_compute)
                    if eff is not None:
                        table[f"{cls}/{precision}"] = eff
            else:
                eff = fit((classes == cls) & memory_bound & big, ideal_memory)
                if eff is not None:
                    table[cls] = eff
        src = self.source + (" | " if self.source else "") + f"calibrated on {len(t)} timed ops"
        return replace(self, source=src, efficiencies=table, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["efficiencies"] = dict(self.efficiencies)
        d["efficiency_curves"] = {k: [list(p) for p in pts] for k, pts in self.efficiency_curves}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "DevicePreset":
        """Inverse of :meth:`to_dict`; also reads presets saved before ``precision``,
        ``efficiencies`` and ``efficiency_curves`` existed (they get the defaults)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise CostModelError(f"unknown device preset fields {sorted(unknown)}")
        return cls(**{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in d.items()})


@dataclass(frozen=True)
class LinkPreset:
    """A link: a transfer of ``b`` bytes costs ``latency + b / bandwidth`` seconds.

    Attributes
    ----------
    name : str
    latency : float
        Seconds per transfer.
    bandwidth : float
        Bytes per second (effective, not line rate).
    source : str
        Where the figures come from.
    cpu_latency, cpu_bandwidth : float or None
        What each end of a link between CPU devices spends on one more transfer
        while many are in flight, ``cpu_latency + b / cpu_bandwidth`` seconds
        (fitted by ``fddps.tf.comm_bench.fit_transfer_cpu``;
        :class:`fddps.Cluster`'s ``transfer_cpu``). None: not measured.
    """

    name: str
    latency: float
    bandwidth: float
    source: str = ""
    cpu_latency: float | None = None
    cpu_bandwidth: float | None = None

    def __post_init__(self):
        if not (np.isfinite(self.latency) and self.latency >= 0):
            raise CostModelError(f"link {self.name!r}: latency must be finite and >= 0, got {self.latency!r}")
        if not (self.bandwidth > 0):
            raise CostModelError(f"link {self.name!r}: bandwidth must be > 0, got {self.bandwidth!r}")
        if (self.cpu_latency is None) != (self.cpu_bandwidth is None):
            raise CostModelError(f"link {self.name!r}: cpu_latency and cpu_bandwidth go together")
        if self.cpu_latency is not None and not (
                np.isfinite(self.cpu_latency) and self.cpu_latency >= 0 and self.cpu_bandwidth > 0):
            raise CostModelError(f"link {self.name!r}: needs cpu_latency >= 0 and cpu_bandwidth > 0, "
                                 f"got {self.cpu_latency!r} and {self.cpu_bandwidth!r}")

    def transfer_time(self, nbytes):
        """Seconds to move ``nbytes`` (a number or an array) over this link."""
        return self.latency + np.asarray(nbytes, dtype=np.float64) / self.bandwidth

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "LinkPreset":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise CostModelError(f"unknown link preset fields {sorted(unknown)}")
        return cls(**d)


# -- this machine's CPU ----------------------------------------------------------
def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu_flops_per_cycle(flags: set) -> int:
    """FP32 FLOPs per cycle per core from the SIMD flags: 2 FMA pipes x lanes x 2."""
    if "avx512f" in flags:
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if "avx" in flags:
        return 16
    return 8


#: Environment variable naming a file in ``/proc/cpuinfo`` format that
#: :func:`cpu_preset` reads instead of this machine's, to see what fddps does on
#: another CPU (the test suite runs its CPU-reading tests under two such files).
CPUINFO_ENV = "FDDPS_CPUINFO"


def _cpuinfo() -> tuple[str, bool]:
    """The cpuinfo text and whether it is faked by :data:`CPUINFO_ENV`.

    Raises
    ------
    CostModelError
        If the variable names a file that cannot be read.
    """
    path = os.environ.get(CPUINFO_ENV)
    if not path:
        return _read("/proc/cpuinfo"), False
    try:
        with open(path) as f:
            return f.read(), True
    except OSError as e:
        raise CostModelError(f"{CPUINFO_ENV}={path!r} cannot be read: {e.strerror}") from None


def cpu_preset(cores: int | None = None, *, name: str = "cpu") -> DevicePreset:
    """Analytic preset of this machine's CPU, read from ``/proc/cpuinfo`` and ``/proc/meminfo``.

    Parameters
    ----------
    cores : int, optional
        Cores one TensorFlow CPU device uses (its intra-op threads). Default:
        the cores this process may run on. A ``local_cluster`` worker held to
        one thread is ``cpu_preset(1)``.

    Peak FLOP/s = cores x clock x FP32 FLOPs/cycle (32 with AVX2+FMA, 64 with
    AVX-512, 16 with AVX); memory bandwidth is an assumed 10 GB/s per core, at
    most 100 GB/s (sustained STREAM-like figures of server cores; calibrate for
    better); capacity is the RAM in MemTotal. Overhead: 5 us per op (the
    TensorFlow executor's dispatch on CPU; calibrate for better).

    With the environment variable ``FDDPS_CPUINFO`` naming a file in
    ``/proc/cpuinfo`` format, that file's model, clock and flags are used
    instead (cores and RAM are still this machine's).

    Raises
    ------
    CostModelError
        If ``cores < 1``, or ``FDDPS_CPUINFO`` names a file that cannot be read.
    """
    info, faked = _cpuinfo()
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
    cores = int(cores)
    if cores < 1:
        raise CostModelError(f"cpu_preset needs cores >= 1, got {cores}")
    model = next(iter(re.findall(r"model name\s*:\s*(.+)", info)), "unknown CPU").strip()
    mhz = [float(x) for x in re.findall(r"cpu MHz\s*:\s*([\d.]+)", info)]
    ghz = re.findall(r"@\s*([\d.]+)\s*GHz", model)
    # A faked cpuinfo carries its own clock: this machine's cpufreq would contradict it.
    max_khz = "" if faked else _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if max_khz.isdigit():
        clock = float(max_khz) * 1e3
    elif ghz:
        clock = float(ghz[0]) * 1e9
    else:  # the current clock, rounded so the preset is the same from run to run
        clock = round(max(mhz) / 50.0) * 50e6 if mhz else 2.5e9
    flags = set(next(iter(re.findall(r"flags\s*:\s*(.+)", info)), "").split())
    per_cycle = _cpu_flops_per_cycle(flags)
    mem = re.findall(r"MemTotal:\s*(\d+)\s*kB", _read("/proc/meminfo"))
    memory = float(mem[0]) * 1024 if mem else 16 * GiB
    return DevicePreset(
        name=name, device_type="CPU", peak_flops=cores * clock * per_cycle,
        memory_bandwidth=min(10 * GB * cores, 100 * GB), memory=memory, overhead=5e-6,
        compute_efficiency=0.5, memory_efficiency=0.5,
        source=(f"{'FDDPS_CPUINFO=' + os.environ[CPUINFO_ENV] if faked else 'this machine'}: {model}, {cores} core(s) x {clock / 1e9:.2f} GHz x {per_cycle} "
                f"FP32 FLOP/cycle (/proc/cpuinfo flags); RAM from /proc/meminfo; memory bandwidth "
                f"assumed 10 GB/s per core; overhead and efficiencies assumed"))


# -- the named presets -------------------------------------------------------------
_GPU_NOTE = ("; overhead 10 us per op (TF executor + kernel launch) and efficiencies "
             "(0.6 compute, 0.7 memory) assumed")

#: The GPU presets from their datasheets alone (the efficiencies assumed).
_DATASHEET_PRESETS = {
    "k80": DevicePreset(
        "k80", "GPU", peak_flops=4.37e12, memory_bandwidth=240 * GB, memory=12 * GB,
        overhead=10e-6,
        source="NVIDIA Tesla K80 (board specification BD-07317-001_v05, 2015; AnandTech 'NVIDIA "
               "Launches Tesla K80, GK210 GPU', 2014): two GK210 GPUs per board, each 2496 cores "
               "at up to 875 MHz (8.74 TFLOPS FP32 per board with GPU Boost), 12 GB GDDR5 on a "
               "384-bit bus at 5 GHz (240 GB/s). One preset is one GK210, as TensorFlow sees it "
               "(4.37 TFLOPS, 240 GB/s, 12 GB); no tensor cores (Tofu's GPU)" + _GPU_NOTE),
    "p100": DevicePreset(
        "p100", "GPU", peak_flops=9.3e12, memory_bandwidth=732 * GB, memory=16 * GiB,
        overhead=10e-6,
        source="NVIDIA Tesla P100 PCIe 16 GB datasheet (2016): 9.3 TFLOPS FP32, 732 GB/s HBM2, "
               "16 GB (the paper's server: 8 x P100)" + _GPU_NOTE),
    "v100": DevicePreset(
        "v100", "GPU", peak_flops=15.7e12, memory_bandwidth=900 * GB, memory=32 * GiB,
        overhead=10e-6,
        source="NVIDIA Tesla V100 SXM2 32 GB datasheet (2017): 15.7 TFLOPS FP32, 900 GB/s HBM2 "
               "(FP32 training does not use its FP16 tensor cores)" + _GPU_NOTE),
    "a100": DevicePreset(
        "a100", "GPU", peak_flops=19.5e12, memory_bandwidth=2039 * GB, memory=80 * GiB,
        overhead=10e-6, tensor_flops=156e12,
        source="NVIDIA A100 SXM4 80 GB datasheet (2020): 19.5 TFLOPS FP32, 156 TFLOPS TF32 "
               "tensor (dense), 2039 GB/s HBM2e" + _GPU_NOTE),
    "h100": DevicePreset(
        "h100", "GPU", peak_flops=67e12, memory_bandwidth=3350 * GB, memory=80 * GiB,
        overhead=10e-6, tensor_flops=494.7e12,
        source="NVIDIA H100 SXM5 80 GB datasheet (2022): 67 TFLOPS FP32, 494.7 TFLOPS TF32 "
               "tensor (dense), 3.35 TB/s HBM3" + _GPU_NOTE),
}

#: Efficiencies per op class fitted to the kernel times in costmodel/data/gpu_kernels.csv
#: by ``python -m costmodel.kernels`` (which prints them; a class needs
#: ``costmodel.kernels.MIN_KERNELS`` kernels); tests/test_gpu_presets.py re-fits and
#: compares. GPUs and classes without enough rows keep the assumed 0.6 / 0.7. The
#: published rows found so far: DeepBench's FP32 GEMMs and 4 forward convolutions on
#: the V100, 3 kernels on the P100 (too few for a class); ``experiments/gpu_kernels.py``
#: measures more on a GPU.
_FITTED_EFFICIENCIES = {
    "v100": {"conv_forward/fp32": 0.646, "matmul/fp32": 0.891},
}


#: The kernel-dependent model (costmodel/kernel_model.py) each named GPU preset uses for its
#: FP32 convolutions and MatMuls: its own fit where DeepBench timed the GPU, else the model
#: that knows a GPU by its datasheet peaks (validated leave-one-GPU-out).
_KERNEL_MODELS = {"k80": "datasheet", "p100": "p100", "v100": "v100", "a100": "datasheet",
                  "h100": "datasheet"}


def _with_fitted(preset: DevicePreset) -> DevicePreset:
    fitted = _FITTED_EFFICIENCIES.get(preset.name)
    source = preset.source
    if fitted:
        source += (f"; efficiencies {', '.join(f'{k} {v:.3g}' for k, v in sorted(fitted.items()))} "
                   f"fitted to published kernel times (costmodel/data/gpu_kernels.csv)")
    model = _KERNEL_MODELS.get(preset.name, "")
    if model:
        source += ("; FP32 convolutions and MatMuls timed by the kernel-dependent model fitted to "
                   "DeepBench (costmodel/data/gpu_kernel_model.json, "
                   + (f"{model}'s own kernels" if model != "datasheet" else "from the datasheet peaks")
                   + ")")
    return replace(preset, efficiencies=fitted or (), kernel_model=model, source=source)


_DEVICE_PRESETS = {name: _with_fitted(p) for name, p in _DATASHEET_PRESETS.items()}

_LINK_PRESETS = {
    "pcie3": LinkPreset("pcie3", latency=10e-6, bandwidth=12 * GB,
                        source="PCIe 3.0 x16: 15.75 GB/s per direction line rate; ~12 GB/s "
                               "pinned cudaMemcpy; ~10 us per copy (launch + TF rendezvous)"),
    "pcie4": LinkPreset("pcie4", latency=10e-6, bandwidth=24 * GB,
                        source="PCIe 4.0 x16: 31.5 GB/s per direction line rate; ~24 GB/s "
                               "pinned cudaMemcpy; ~10 us per copy"),
    "nvlink": LinkPreset("nvlink", latency=8e-6, bandwidth=45 * GB,
                         source="NVLink 2.0 between two V100 of a DGX-1V (2 links x 25 GB/s per "
                                "direction = 50 GB/s line rate, ~45 GB/s measured by p2p "
                                "bandwidth tests); ~8 us per copy"),
    "nvlink3": LinkPreset("nvlink3", latency=8e-6, bandwidth=270 * GB,
                          source="NVLink 3 (A100 SXM4 via NVSwitch): 300 GB/s per direction "
                                 "line rate, ~90% achieved"),
    "nvlink4": LinkPreset("nvlink4", latency=8e-6, bandwidth=400 * GB,
                          source="NVLink 4 (H100 SXM5 via NVSwitch): 450 GB/s per direction "
                                 "line rate, ~90% achieved"),
    "10gbe": LinkPreset("10gbe", latency=50e-6, bandwidth=1.1 * GB,
                        source="10 Gb Ethernet: 1.25 GB/s line rate, ~1.1 GB/s TCP goodput; "
                               "~50 us per gRPC transfer on a LAN"),
    "100gbe": LinkPreset("100gbe", latency=30e-6, bandwidth=10 * GB,
                         source="100 Gb Ethernet: 12.5 GB/s line rate, ~10 GB/s TCP goodput "
                                "with several streams; ~30 us per transfer"),
    "grpc-loopback": LinkPreset(
        "grpc-loopback", latency=400e-6, bandwidth=1.3 * GB,
        source="two tf.distribute.Server tasks on 127.0.0.1 (DESIGN.md: 16 MB in 11-14 ms, "
               "~1.3 GB/s; latency ~0.4 ms per Session.run transfer); refit on your machine "
               "with fddps.tf.comm_bench"),
    "host-memory": LinkPreset(
        "host-memory", latency=5e-6, bandwidth=10 * GB,
        source="two devices of one process sharing host memory (e.g. several CPU devices from "
               "ConfigProto(device_count)): an intra-process rendezvous, ~5 us, and at worst a "
               "memcpy at ~10 GB/s"),
}


class Presets(Mapping):
    """Read-only mapping of preset name -> :class:`DevicePreset` or :class:`LinkPreset`.

    ``presets["cpu"]`` is this machine's CPU (all cores), read on first use
    (and again when ``FDDPS_CPUINFO`` names another cpuinfo file).
    ``presets["h100:fp32"]`` is ``presets["h100"].with_precision("fp32")``.
    ``presets.devices`` and ``presets.links`` hold each kind alone.
    """

    def __init__(self):
        self._cpu = {}

    @property
    def devices(self) -> dict:
        """Device presets by name: ``k80``, ``p100``, ``v100``, ``a100``, ``h100``, ``cpu``."""
        key = os.environ.get(CPUINFO_ENV)  # a faked CPU gets its own entry
        if key not in self._cpu:
            self._cpu[key] = cpu_preset()
        return {**_DEVICE_PRESETS, "cpu": self._cpu[key]}

    @property
    def links(self) -> dict:
        """Link presets by name: ``pcie3``, ``pcie4``, ``nvlink``, ``nvlink3``,
        ``nvlink4``, ``10gbe``, ``100gbe``, ``grpc-loopback``, ``host-memory``."""
        return dict(_LINK_PRESETS)

    def _all(self):
        return {**self.devices, **self.links}

    def __getitem__(self, name):
        if name == "cpu" or name in _DEVICE_PRESETS or name in _LINK_PRESETS:
            return self._all()[name]
        base, _, precision = str(name).partition(":")
        if precision and (base == "cpu" or base in _DEVICE_PRESETS):
            return self.devices[base].with_precision(precision)  # "h100:fp32"
        raise CostModelError(f"unknown preset {name!r}; device presets: {sorted(self.devices)}, "
                             f"link presets: {sorted(self.links)}")

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())

    def __repr__(self):
        return f"Presets(devices={sorted(self.devices)}, links={sorted(self.links)})"


#: The named presets (see :class:`Presets`).
presets = Presets()


def device_preset(spec) -> DevicePreset:
    """A :class:`DevicePreset` from a preset name or a preset (returned as is).

    Raises
    ------
    CostModelError
        For an unknown name or a link preset's name.
    """
    if isinstance(spec, DevicePreset):
        return spec
    p = presets[spec]
    if not isinstance(p, DevicePreset):
        raise CostModelError(f"{spec!r} is a link preset, not a device preset")
    return p


def link_preset(spec) -> LinkPreset:
    """A :class:`LinkPreset` from a preset name, a ``(latency, bandwidth)`` pair or a preset."""
    if isinstance(spec, LinkPreset):
        return spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return LinkPreset("custom", float(spec[0]), float(spec[1]))
    p = presets[spec]
    if not isinstance(p, LinkPreset):
        raise CostModelError(f"{spec!r} is a device preset, not a link preset")
    return p
