"""The CPU preset calibrated on the machine it runs on (``fddps calibrate``).

The analytic CPU preset (:func:`costmodel.cpu_preset`) predicts an op from the
CPU's datasheet peaks and assumed efficiencies; on this project's machines it
was off by a factor of up to 2.8 (``experiments/cpu_preset.py``), because how
much of the peak an op reaches depends on the op's size: a small convolution
leaves cores idle, a 1 MB element-wise op runs from cache at several times the
memory bandwidth, a tiny op costs only its dispatch. :func:`calibrate_cpu`
measures that here:

1. **Time** a fixed list of ops (:data:`CPU_CALIBRATION_OPS`: MatMul, Conv2D
   and its two gradients (3x3 and 1x1), element-wise ops, pooling, batch norm
   and its gradient, reductions, softmax and its cross-entropy, each at small
   to large sizes) with TensorFlow on this
   process's CPU device, each op alone with every core, dispatch included, its
   time the geometric mean of a warm-cache and a cold-cache measurement (a
   step's ops read both kinds of input; :func:`fddps.tf.op_timing.time_ops`),
   in interleaved rounds for ``seconds`` (default 30).
2. **Fit** (:func:`fit_cpu_preset`, numpy only):

   - ``overhead``: the median time of the tiny ops (at most 4 KB moved,
     :data:`TINY_BYTES`), what every op costs however small (ops that do no
     work cost only this);
   - each op's rate: FLOPs (dense classes) or bytes moved (element-wise,
     reduction) over its time less the overhead (an op no slower than the
     overhead gets efficiency 1: as fast as the fit can tell);
   - ``memory_bandwidth``: the highest rate of an element-wise or reduction op
     that took at least 10 us (what this CPU streams from its caches);
     ``peak_flops`` stays the analytic peak; efficiency = rate / peak;
   - per op class (:func:`costmodel.hardware.op_class`), the efficiency as a
     function of the op's size: the class's ops are grouped by size (sorted by
     log10 size; a gap of more than a quarter decade starts a new group,
     :data:`GROUP_GAP`), each group gives one point, its median log10 size and
     median efficiency (so one slow op type among several at a size does not
     set it), and the points are joined piecewise-linearly in log10 size and
     held constant beyond the sizes timed (:attr:`DevicePreset.efficiency_curves`,
     read by :func:`costmodel.hardware.curve_efficiency`). No monotonicity is
     forced: element-wise ops get *slower* per byte once their tensors leave
     the caches.

3. **Cache** the calibrated preset per CPU: a cost model file (the default
   model with this CPU preset, :meth:`CostModel.save` format, the measured
   table in its ``meta``) at :func:`cache_path`, named by the CPU model (from
   ``/proc/cpuinfo``, or ``FDDPS_CPUINFO``'s file), the cores this process may
   use and the TensorFlow version. :func:`costmodel.default_cost_model` --
   what ``fddps.place()`` and the ``fddps`` commands use when given no cost
   model -- picks it up (:func:`cached_cpu_calibration`) and records its path
   in the model's ``meta["cpu_calibration"]``; ``Placement.summary()`` says
   whether it did.

The cache folder is ``$FDDPS_CACHE_DIR``, else ``$XDG_CACHE_HOME/fddps``, else
``~/.cache/fddps``. This module never imports TensorFlow itself; only
:func:`calibrate_cpu` does, through ``fddps.tf.op_timing``.

Example
-------
>>> import costmodel                                  # doctest: +SKIP
>>> preset = costmodel.calibrate_cpu(seconds=30)      # doctest: +SKIP
>>> costmodel.cached_cpu_calibration() == preset      # doctest: +SKIP
True
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CostModelError, ProfileError
from .hardware import (COMPUTE_CLASSES, MEMORY_CLASSES, CPUINFO_ENV, DevicePreset, _cpuinfo,
                       _op_classes, cpu_preset, op_features)

#: Environment variable naming the cache folder (tests point it at a temporary one).
CACHE_ENV = "FDDPS_CACHE_DIR"
#: ``meta["kind"]`` of a calibration file.
KIND = "cpu calibration"
#: Ops are grouped by size for the fit (:func:`_size_groups`): a gap of more than
#: GROUP_GAP decades between two sizes, or a group wider than GROUP_WIDTH decades,
#: starts a new group. The fixed op list's sizes are 0.6 decades apart or more
#: between shapes and less within one shape's op types.
GROUP_GAP = 0.25
GROUP_WIDTH = 1.0
#: Ops whose work (time less overhead) is at least this long set ``memory_bandwidth``.
MIN_BANDWIDTH_WORK = 10e-6
#: Ops moving at most this many bytes and doing at most this many FLOPs are *tiny*:
#: the median of their times is the per-op overhead.
TINY_BYTES = 4096
TINY_FLOPS = 1e5


#: Activation shapes (NHWC) of the element-wise ops and reductions: 1 KB, 64 KB,
#: 1 MB, 4 MB and 16 MB of float32.
ACTIVATION_SHAPES = ((1, 4, 4, 16), (4, 16, 16, 16), (16, 32, 32, 16), (32, 32, 32, 32),
                     (32, 64, 64, 32))
#: Convolution shapes ``(n, h, w, cin, cout)``, 3x3, stride 1: 2.4 MFLOP to 1.2 GFLOP
#: (small to large CIFAR-size layers, and an image network's first layer, whose input
#: gradient a training step never computes: :data:`FIRST_LAYER` is timed forward and
#: for its filter gradient only).
CONV_SHAPES = ((8, 8, 8, 16, 16), (32, 16, 16, 16, 32), (32, 32, 32, 3, 32),
               (32, 16, 16, 32, 64), (16, 16, 16, 128, 128))
FIRST_LAYER = (32, 32, 32, 3, 32)
#: Pointwise (1x1) convolution shapes ``(n, h, w, cin, cout)``: 17 to 268 MFLOP (a
#: ResNet bottleneck's), whose FLOPs per byte are a ninth of a 3x3's.
POINTWISE_SHAPES = ((8, 8, 8, 256, 64), (32, 16, 16, 64, 64), (32, 8, 8, 128, 512))
#: MatMul shapes ``(m, k, n)``: 0.26 MFLOP to 1.1 GFLOP.
MATMUL_SHAPES = ((32, 64, 64), (128, 256, 256), (256, 512, 512), (512, 1024, 1024))
#: Softmax and cross-entropy shapes ``[batch, classes]``.
LOGIT_SHAPES = ((32, 10), (256, 100), (512, 1000))


def _ops() -> tuple:
    ops = [("overhead", "AddV2", {"shape": [1]})]
    for m, k, n in MATMUL_SHAPES:
        ops.append((f"MatMul {m}x{k}x{n}", "MatMul", dict(m=m, k=k, n=n)))
    for kind in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        for n, h, w, ci, co in CONV_SHAPES:
            if kind == "Conv2DBackpropInput" and (n, h, w, ci, co) == FIRST_LAYER:
                continue
            ops.append((f"{kind} {n}x{h}x{w}x{ci}->{co}", kind,
                        dict(n=n, h=h, w=w, cin=ci, cout=co)))
        for n, h, w, ci, co in POINTWISE_SHAPES:
            ops.append((f"{kind} 1x1 {n}x{h}x{w}x{ci}->{co}", kind,
                        dict(n=n, h=h, w=w, cin=ci, cout=co, k=1)))
    for shape in ACTIVATION_SHAPES:
        dims = "x".join(map(str, shape))
        for kind in ("Relu", "AddV2", "Mul", "BiasAdd", "ReluGrad", "MaxPool", "MaxPoolGrad",
                     "BiasAddGrad"):
            ops.append((f"{kind} {dims}", kind, {"shape": list(shape)}))
        ops.append((f"Mean {dims} over HW", "Mean", {"shape": list(shape), "axes": [1, 2]}))
        ops.append((f"Sum {dims} over NHW", "Sum", {"shape": list(shape), "axes": [0, 1, 2]}))
        if shape[0] > 1:  # batch norm and gradient sums at the 64 KB to 16 MB activations
            for kind in ("FusedBatchNormV3", "FusedBatchNormGradV3", "AddN"):
                ops.append((f"{kind} {dims}", kind, {"shape": list(shape)}))
    for b, c in LOGIT_SHAPES:
        for kind in ("Softmax", "SparseSoftmaxCrossEntropyWithLogits"):
            ops.append((f"{kind} {b}x{c}", kind, {"shape": [b, c]}))
    return tuple(ops)


#: The ops :func:`calibrate_cpu` times: ``(label, op_type, params)`` (see
#: :func:`fddps.tf.op_timing.time_ops`); those moving at most :data:`TINY_BYTES` set the
#: per-op overhead.
CPU_CALIBRATION_OPS = _ops()


# -- where the calibration lives --------------------------------------------------------
def cache_dir() -> Path:
    """The folder calibrations are cached in: ``$FDDPS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/fddps``, else ``~/.cache/fddps``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "fddps"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _tensorflow_version() -> str:
    """TensorFlow's installed version, read without importing it ('none' if not installed)."""
    if "tensorflow" in sys.modules:
        return str(sys.modules["tensorflow"].__version__)
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly", "tensorflow-intel"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def cpu_key() -> dict:
    """What a calibration is valid for: ``cpu_model`` (``/proc/cpuinfo``'s model name, or
    the file ``FDDPS_CPUINFO`` names), ``cores`` (this process may use) and ``tensorflow``
    (version)."""
    info, _ = _cpuinfo()
    model = next(iter(re.findall(r"model name\s*:\s*(.+)", info)), "")
    if not model.strip():
        import platform

        model = platform.processor() or platform.machine() or "unknown CPU"
    return {"cpu_model": model.strip(), "cores": _cores(), "tensorflow": _tensorflow_version()}


def cache_path(key: dict | None = None) -> Path:
    """The cache file of a CPU key (default this machine's, :func:`cpu_key`)."""
    key = key or cpu_key()
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", key["cpu_model"]).strip("-")[:80] or "cpu"
    return cache_dir() / f"cpu-{slug}-{key['cores']}cores-tf{key['tensorflow']}.json"


# -- the fit ------------------------------------------------------------------------------
def _size_groups(x) -> list:
    """Index arrays of ``x`` (log10 sizes) grouped by size: sorted, a new group starts where
    the next size is more than :data:`GROUP_GAP` decades above the previous one, or more
    than :data:`GROUP_WIDTH` above the group's first."""
    order = np.argsort(x, kind="stable")
    groups, current = [], [order[0]]
    for i in order[1:].tolist():
        if x[i] - x[current[-1]] > GROUP_GAP or x[i] - x[current[0]] > GROUP_WIDTH:
            groups.append(np.array(current))
            current = []
        current.append(i)
    groups.append(np.array(current))
    return groups


def _size_curve(x, eff) -> list:
    """``[(log10 size, efficiency)]``: per size group (:func:`_size_groups`), the median
    log10 size and the median efficiency of its ops (the geometric middle of the two
    middle ones for an even count)."""
    x, log_e = np.asarray(x, float), np.log(np.asarray(eff, float))
    curve = []
    for g in _size_groups(x):
        knot = round(float(np.median(x[g])), 6)
        if curve and knot <= curve[-1][0]:  # pragma: no cover - groups are increasing
            continue
        curve.append((knot, float(np.exp(np.median(log_e[g])))))
    return curve


def fit_cpu_preset(measured: pd.DataFrame, base: DevicePreset | None = None, *,
                   name: str = "cpu", timed_by: str | None = None) -> DevicePreset:
    """A CPU preset fitted to op times measured on this machine (see the module notes).

    Parameters
    ----------
    measured : pandas.DataFrame
        One row per op timed: ``op_type``, ``flops``, ``input_bytes``, ``output_bytes``,
        ``seconds`` (other columns are ignored).
    base : DevicePreset, optional
        The analytic preset whose peak FLOP/s and memory size are kept (default
        :func:`costmodel.cpu_preset` of the cores this process may use).
    name : str
        The fitted preset's name.
    timed_by : str, optional
        What timed the ops, for the preset's ``source`` (default: this machine,
        now, by :func:`calibrate_cpu`, with the date; anything else is named
        without one, so that fitting one profile twice gives equal presets).

    Returns
    -------
    DevicePreset
        ``base`` with the fitted ``overhead``, ``memory_bandwidth``,
        ``efficiency_curves`` (one per op class timed), and ``compute_efficiency`` /
        ``memory_efficiency`` (medians, for classes without a curve).

    Raises
    ------
    CostModelError
        If a column is missing, or no op has a finite positive time.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"op_type": ["AddV2", "MatMul", "MatMul", "Relu", "Relu"],
    ...                   "flops": [1, 1e6, 1e9, 0, 0], "input_bytes": [8, 8e3, 8e6, 1e4, 1e7],
    ...                   "output_bytes": [4, 4e3, 4e6, 1e4, 1e7],
    ...                   "seconds": [1e-6, 1e-4, 1e-2, 2e-6, 1e-3]})
    >>> p = fit_cpu_preset(t, cpu_preset(2))
    >>> p.overhead, sorted(dict(p.efficiency_curves))
    (1e-06, ['elementwise', 'matmul/fp32'])
    """
    if "seconds" not in measured.columns:
        raise CostModelError("fitting a CPU preset needs a 'seconds' column of measured op times")
    base = base if base is not None else cpu_preset(_cores(), name=name)
    flops, moved, types = op_features(measured)
    t = measured["seconds"].to_numpy(dtype=np.float64)
    ok = np.isfinite(t) & (t > 0)
    if not ok.any():
        raise CostModelError("no finite positive op time to fit the CPU preset with")
    tiny = ok & (moved <= TINY_BYTES) & (flops <= TINY_FLOPS)
    overhead = float(np.median(t[tiny])) if tiny.any() else float(t[ok].min())
    classes = _op_classes(types)
    # An op no slower than the overhead is as fast as the fit can tell: efficiency 1.
    work = np.maximum(t - overhead, 1e-9)
    is_memory = np.isin(classes, list(MEMORY_CLASSES))
    is_compute = np.isin(classes, list(COMPUTE_CLASSES))
    size = np.where(is_compute, flops, moved)
    usable = ok & (classes != "no_work") & (size > 0)
    rate = np.where(usable, size / work, np.nan)
    clean = usable & is_memory & (work >= MIN_BANDWIDTH_WORK)
    pool = clean if clean.any() else usable & is_memory
    bandwidth = float(np.nanmax(rate[pool])) if pool.any() else base.memory_bandwidth
    peak = np.where(is_compute, base.peak_flops, bandwidth)
    eff = np.clip(rate / peak, 1e-6, 1.0)
    curves = {}
    for cls in np.unique(classes[usable]):
        sel = usable & (classes == cls)
        key = f"{cls}/{base.precision}" if cls in COMPUTE_CLASSES else str(cls)
        curves[key] = _size_curve(np.log10(size[sel]), eff[sel])
    compute_eff = (float(np.median(eff[usable & is_compute])) if (usable & is_compute).any()
                   else base.compute_efficiency)
    memory_eff = (float(np.median(eff[usable & is_memory])) if (usable & is_memory).any()
                  else base.memory_efficiency)
    origin = (f"on this machine ({time.strftime('%Y-%m-%d %H:%M')}, {int(ok.sum())} ops timed by "
              f"costmodel.calibrate_cpu)" if timed_by is None
              else f"on {int(ok.sum())} ops timed by {timed_by}")
    source = (f"{base.source.split(';')[0]}; calibrated {origin}: overhead "
              f"{overhead * 1e6:.3g} us per op, streaming bandwidth {bandwidth / 1e9:.3g} GB/s, "
              f"efficiencies by op size per class")
    return replace(base, name=name, overhead=overhead, memory_bandwidth=bandwidth,
                   compute_efficiency=compute_eff, memory_efficiency=memory_eff,
                   efficiencies=(), efficiency_curves=curves, kernel_model="", source=source)


def describe_curves(preset: DevicePreset) -> list:
    """One line per efficiency curve of ``preset``: the class, then ``size: efficiency``
    (and the rate it means) at each knot."""
    lines = []
    for key, points in preset.efficiency_curves:
        compute = key.split("/")[0] in COMPUTE_CLASSES
        unit, peak = (("FLOP", preset.peak_flops) if compute else ("B", preset.memory_bandwidth))
        rate = "GFLOP/s" if compute else "GB/s"
        cells = ", ".join(f"{_si(10 ** x)}{unit} {e:.3g} ({e * peak / 1e9:.3g} {rate})"
                          for x, e in points)
        lines.append(f"{key:<18} {cells}")
    return lines


def _si(x) -> str:
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g} {prefix}"
    return f"{x:.3g} "


# -- cache -------------------------------------------------------------------------------
def save_cpu_calibration(preset: DevicePreset, path, *, measured: pd.DataFrame | None = None,
                         key: dict | None = None, seconds: float | None = None) -> Path:
    """Write a calibrated preset as a cost model file: the default model with ``preset``
    for CPU devices (so ``fddps place --cost-model FILE`` and :meth:`CostModel.load` read
    it), the CPU key, and the measured table in ``meta``. Returns the path."""
    from .base import default_cost_model

    meta = {"kind": KIND, **(key or cpu_key()), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "seconds": seconds,
            "measured": None if measured is None else json.loads(measured.to_json(orient="records"))}
    model = default_cost_model(cpu=preset, calibrated=False)
    model.meta = meta
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save(tmp)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load_cpu_calibration(path) -> DevicePreset:
    """The calibrated CPU preset in a file :func:`save_cpu_calibration` wrote.

    Raises
    ------
    ProfileError
        If the file is missing, unreadable, or not a CPU calibration (the file is named).
    """
    from .base import CostModel

    model = CostModel.load(path)
    if model.meta.get("kind") != KIND or "CPU" not in model.devices:
        raise ProfileError(f"{str(path)!r} is a cost model but not a CPU calibration "
                           f"(meta kind {model.meta.get('kind')!r}); write one with "
                           "`fddps calibrate`", path=path)
    return model.devices["CPU"]


def cached_cpu_calibration_path() -> Path | None:
    """:func:`cache_path` of this machine if that file exists, else None."""
    path = cache_path()
    return path if path.is_file() else None


def cached_cpu_calibration() -> DevicePreset | None:
    """This machine's cached calibrated CPU preset, or None when there is none.

    A file that cannot be read is reported by a warning (naming it and how to
    rewrite it) and treated as absent, so that ``place()`` still runs.
    """
    path = cached_cpu_calibration_path()
    if path is None:
        return None
    try:
        return load_cpu_calibration(path)
    except (ProfileError, CostModelError) as err:
        warnings.warn(f"ignoring the CPU calibration cache: {err}; run `fddps calibrate` to "
                      "rewrite it", RuntimeWarning, stacklevel=2)
        return None


# -- measuring -----------------------------------------------------------------------------
def calibrate_cpu(*, seconds: float = 30.0, cache: bool = True, output=None, ops=None,
                  progress=None) -> DevicePreset:
    """Time :data:`CPU_CALIBRATION_OPS` on this machine's CPU and fit a preset to them.

    Parameters
    ----------
    seconds : float
        Time budget of the measurement (building and warming up included;
        default 30). The ops are timed in interleaved rounds until it is spent.
    cache : bool
        Write the result to :func:`cache_path` (default), where
        :func:`costmodel.default_cost_model` and ``fddps.place()`` find it.
    output : str or Path, optional
        Also write it there (a cost model file, for ``--cost-model``).
    ops : sequence of (label, op_type, params), optional
        Other ops to time (default :data:`CPU_CALIBRATION_OPS`; tests time fewer).
    progress : callable, optional
        Called with a one-line message at each stage (``print`` shows them).

    Returns
    -------
    DevicePreset
        The calibrated preset (:func:`fit_cpu_preset`), for CPU devices with the
        cores this process may use. The measured table is in the file's ``meta``.

    Raises
    ------
    CostModelError
        If ``seconds`` is not positive.
    fddps.errors.FddpsError
        If TensorFlow cannot build or run one of ``ops``.
    """
    if not (seconds > 0 and np.isfinite(seconds)):
        raise CostModelError(f"calibrate_cpu needs seconds > 0, got {seconds!r}")
    from fddps.tf.op_timing import time_ops

    say = progress or (lambda msg: None)
    key = cpu_key()
    ops = CPU_CALIBRATION_OPS if ops is None else tuple(ops)
    say(f"calibrating the CPU preset: {key['cpu_model']}, {key['cores']} core(s), TensorFlow "
        f"{key['tensorflow']}; timing {len(ops)} ops for about {seconds:.0f} s")
    measured = time_ops(ops, seconds=seconds, progress=say)
    preset = fit_cpu_preset(measured, cpu_preset(key["cores"]))
    if os.environ.get(CPUINFO_ENV):
        preset = replace(preset, source=preset.source + f" (cpuinfo from {CPUINFO_ENV})")
    for path in ([cache_path(key)] if cache else []) + ([Path(output)] if output else []):
        save_cpu_calibration(preset, path, measured=measured, key=key, seconds=seconds)
        say(f"wrote {path}")
    return preset
