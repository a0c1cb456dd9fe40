"""Kernel-dependent GPU efficiencies: a regressor over a kernel's size and shape, fitted to DeepBench.

A roofline with one efficiency per op class predicts single kernels badly (a
3 x 3 convolution that cuDNN runs with Winograd beats the FP32 peak's FLOP
count; a strided 1 x 1 input gradient reaches a fifth of it). Here a kernel's
time is

``seconds = max(flops / peak, bytes / bandwidth) * exp(g(features))``

with ``g`` a gradient-boosted tree ensemble (scikit-learn's
``GradientBoostingRegressor``, Huber loss) per op class (:data:`MODEL_CLASSES`)
over what fddps's op table knows of every op (FLOPs, input and output bytes)
and the GPU's peaks (:func:`features`): the ideal compute and memory times,
the ratios FLOPs / input bytes, FLOPs / output bytes and input / output bytes
(for a convolution these carry its reduction depth ``C R S``, its filter size
over stride squared and its channel ratio), and the FLOPs themselves.

Two ensembles per class are fitted, both on every GPU's kernels together:

- ``named``: with a one-hot column per published GPU, for the presets of GPUs
  DeepBench timed (``p100``, ``v100``): pooling lets one GPU's kernels inform
  another's, the one-hot columns keep what differs.
- ``datasheet``: without them, for a GPU nobody has timed
  (:func:`costmodel.gpu_from_datasheet`, and the ``k80``, and the FP32 modes of
  ``a100`` / ``h100``): it sees a GPU only through its peak FLOP/s and
  memory bandwidth.

The candidate it was chosen over, a roofline whose compute efficiency rises
with the kernel's size (:func:`fit_roofline_curve`: ``eff(F) = e_max / (1 +
t0 / (F / peak))^a``, one memory efficiency, fitted per GPU and class), and the
cross-validation that chose between them are in
``python -m experiments.gpu_kernels --report``.

The fitted ensembles are committed as :data:`MODEL_FILE` (written by
``python -m costmodel.kernels --fit``); :func:`predict_seconds` reads it with
numpy alone. DeepBench timed no depthwise convolution, no element-wise op and
no TF32 kernel: those keep the roofline with the preset's efficiencies.

Examples
--------
>>> import pandas as pd
>>> ops = pd.DataFrame({"op_type": ["MatMul"], "flops": [2 * 4096.0 ** 3],
...                     "input_bytes": [2 * 4 * 4096.0 ** 2], "output_bytes": [4 * 4096.0 ** 2]})
>>> t = predict_seconds("p100", ops.flops, ops.input_bytes, ops.output_bytes,
...                     ["matmul"], peak_flops=9.3e12, memory_bandwidth=732e9)
>>> 0.5 < float(ops.flops[0] / 9.3e12 / t[0]) < 1.0   # the efficiency of a big GEMM
True
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CostModelError

#: The committed ensembles.
MODEL_FILE = Path(__file__).resolve().parent / "data" / "gpu_kernel_model.json"
#: Op classes with a fitted ensemble (DeepBench's kernels).
MODEL_CLASSES = ("conv_forward", "conv_input_grad", "conv_filter_grad", "matmul")
#: Op types whose time the ensembles predict (others of these classes, e.g. depthwise
#: convolutions, keep the roofline: DeepBench has none of them).
MODEL_OP_TYPES = frozenset({"Conv2D", "_FusedConv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                            "MatMul", "_FusedMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                            "Einsum"})
FEATURES = ("log_compute_s", "log_memory_s", "log_flops_per_in_byte", "log_flops_per_out_byte",
            "log_in_per_out_byte", "log_flops")
#: Gradient boosting settings. Cross-validated over shapes on the input gradients (the hardest
#: class), depth 2-4, 300-600 trees, learning rate 0.05-0.1, Huber or absolute loss, leaves of
#: 3-10 kernels, subsample 0.5-0.8 all came within 3 points of one another (P100 55-63%,
#: V100 54-61% within 25%); these are the ones the committed fit uses.
GBR_PARAMS = dict(loss="huber", n_estimators=300, max_depth=3, learning_rate=0.05, subsample=0.8,
                  min_samples_leaf=5, random_state=0)
#: Folds of the cross-validation over shapes.
FOLDS = 5


# -- features -------------------------------------------------------------------------------------
def reference_seconds(flops, input_bytes, output_bytes, peak_flops, memory_bandwidth) -> np.ndarray:
    """The ideal roofline time ``max(flops / peak, bytes / bandwidth)`` (efficiency 1)."""
    flops = np.asarray(flops, dtype=float)
    moved = np.asarray(input_bytes, dtype=float) + np.asarray(output_bytes, dtype=float)
    return np.maximum(flops / peak_flops, moved / memory_bandwidth)


def features(flops, input_bytes, output_bytes, peak_flops, memory_bandwidth, *, gpu=None,
             gpus=()) -> np.ndarray:
    """The regressor's input, one row per kernel (:data:`FEATURES`, then a one-hot column per
    name in ``gpus``: 1 where ``gpu`` is that name). Sizes below 1 count as 1."""
    f = np.maximum(np.asarray(flops, dtype=float), 1.0)
    i = np.maximum(np.asarray(input_bytes, dtype=float), 1.0)
    o = np.maximum(np.asarray(output_bytes, dtype=float), 1.0)
    peak = np.asarray(peak_flops, dtype=float)
    bw = np.asarray(memory_bandwidth, dtype=float)
    cols = [np.log(f / peak), np.log((i + o) / bw), np.log(f / i), np.log(f / o), np.log(i / o),
            np.log(f)]
    x = np.column_stack([np.broadcast_to(c, f.shape) for c in cols])
    if gpus:
        g = np.broadcast_to(np.asarray(gpu, dtype=object), f.shape)
        x = np.column_stack([x] + [(g == name).astype(float) for name in gpus])
    return x


# -- the ensembles as plain arrays ----------------------------------------------------------------
def export_ensemble(model) -> dict:
    """A fitted ``GradientBoostingRegressor`` as JSON-ready lists (enough to predict with numpy)."""
    trees = []
    for est in model.estimators_[:, 0]:
        t = est.tree_
        trees.append(dict(feature=t.feature.tolist(), threshold=[float(f"{v:.9g}") for v in t.threshold],
                          left=t.children_left.tolist(), right=t.children_right.tolist(),
                          value=[float(f"{v:.9g}") for v in t.value[:, 0, 0]]))
    init = float(np.ravel(model.init_.predict(np.zeros((1, model.n_features_in_))))[0])
    return dict(init=init, learning_rate=float(model.learning_rate), trees=trees)


def ensemble_predict(ens: dict, x: np.ndarray) -> np.ndarray:
    """Predict with an :func:`export_ensemble` dict: all trees at once, level by level."""
    x = np.asarray(x, dtype=float)
    out = np.full(len(x), ens["init"], dtype=float)
    if not len(x):
        return out
    arrays = ens.get("_arrays")
    if arrays is None:  # pad the trees to one node table (cached in the dict)
        width = max(len(t["feature"]) for t in ens["trees"])
        shape = (len(ens["trees"]), width)
        feat, thr = np.full(shape, -2, np.int64), np.zeros(shape)
        left, right, val = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64), np.zeros(shape)
        for k, t in enumerate(ens["trees"]):
            n = len(t["feature"])
            feat[k, :n], thr[k, :n], val[k, :n] = t["feature"], t["threshold"], t["value"]
            left[k, :n], right[k, :n] = t["left"], t["right"]
        depth = 0
        for t in ens["trees"]:  # the longest root-to-leaf path
            stack = [(0, 0)]
            while stack:
                node, d = stack.pop()
                depth = max(depth, d)
                if t["left"][node] >= 0:
                    stack += [(t["left"][node], d + 1), (t["right"][node], d + 1)]
        arrays = ens["_arrays"] = (feat, thr, left, right, val, depth)
    feat, thr, left, right, val, depth = arrays
    trees = np.arange(feat.shape[0])[None, :]
    node = np.zeros((len(x), feat.shape[0]), dtype=np.int64)
    rows = np.arange(len(x))[:, None]
    for _ in range(depth):
        f = feat[trees, node]
        leaf = f < 0
        go_left = x[rows, np.maximum(f, 0)] <= thr[trees, node]
        node = np.where(leaf, node, np.where(go_left, left[trees, node], right[trees, node]))
    return out + ens["learning_rate"] * val[trees, node].sum(axis=1)


# -- fitting --------------------------------------------------------------------------------------
def _peaks(kernels: pd.DataFrame, datasheets: dict):
    missing = sorted(set(kernels.gpu) - set(datasheets))
    if missing:
        raise CostModelError(f"no datasheet figures for GPU {missing[0]!r} (have {sorted(datasheets)})")
    return (kernels.gpu.map(lambda g: datasheets[g]["peak_flops"]).to_numpy(float),
            kernels.gpu.map(lambda g: datasheets[g]["memory_bandwidth"]).to_numpy(float))


def fit_ensemble(kernels: pd.DataFrame, datasheets: dict, *, gpus=(), params=None):
    """Fit one class's regressor to ``kernels`` (rows of :func:`costmodel.deepbench.load_kernels`).

    ``gpus``: the GPUs with a one-hot column (``()``: a datasheet-only ensemble).
    Returns the fitted ``GradientBoostingRegressor``.
    """
    from sklearn.ensemble import GradientBoostingRegressor

    peak, bw = _peaks(kernels, datasheets)
    x = features(kernels.flops, kernels.input_bytes, kernels.output_bytes, peak, bw,
                 gpu=kernels.gpu.to_numpy(), gpus=tuple(gpus))
    y = np.log(kernels.seconds.to_numpy(float)
               / reference_seconds(kernels.flops, kernels.input_bytes, kernels.output_bytes, peak, bw))
    return GradientBoostingRegressor(**{**GBR_PARAMS, **(params or {})}).fit(x, y)


def fit_models(kernels: pd.DataFrame, datasheets: dict, *, params=None) -> dict:
    """Both ensembles of every class in :data:`MODEL_CLASSES`: the content of :data:`MODEL_FILE`.

    Returns
    -------
    dict
        ``{"gpus": [...], "params": ..., "named": {cls: ens}, "datasheet": {cls: ens},
        "datasheets": {gpu: {peak_flops, memory_bandwidth}}, "kernels": {cls: n}}``.
    """
    gpus = sorted(set(kernels.gpu))
    out = dict(gpus=gpus, params={**GBR_PARAMS, **(params or {})}, features=list(FEATURES),
               datasheets={g: dict(peak_flops=datasheets[g]["peak_flops"],
                                   memory_bandwidth=datasheets[g]["memory_bandwidth"]) for g in gpus},
               kernels={}, named={}, datasheet={})
    for cls in MODEL_CLASSES:
        rows = kernels[kernels.op_class == cls]
        if rows.empty:
            continue
        out["kernels"][cls] = int(len(rows))
        out["named"][cls] = export_ensemble(fit_ensemble(rows, datasheets, gpus=gpus, params=params))
        out["datasheet"][cls] = export_ensemble(fit_ensemble(rows, datasheets, params=params))
    return out


def save_models(models: dict, path=MODEL_FILE) -> Path:
    """Write :func:`fit_models`' result as JSON."""
    path = Path(path)
    clean = json.loads(json.dumps(models, default=lambda o: None))
    for kind in ("named", "datasheet"):
        for ens in clean[kind].values():
            ens.pop("_arrays", None)
    path.write_text(json.dumps(clean, separators=(",", ":")) + "\n")
    return path


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    _CACHE.clear()
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise CostModelError(f"kernel model file {path!r} cannot be read: {e.strerror}") from None


def load_models(path=MODEL_FILE) -> dict:
    """The committed ensembles (read once per path)."""
    return _load(str(Path(path)))


# -- predicting -----------------------------------------------------------------------------------
def predict_seconds(model: str, flops, input_bytes, output_bytes, classes, *, peak_flops: float,
                    memory_bandwidth: float, path=MODEL_FILE) -> np.ndarray:
    """Kernel seconds of ops of ``classes`` (:data:`MODEL_CLASSES`) on a GPU.

    Parameters
    ----------
    model : str
        A GPU of the file's one-hot columns (``"p100"``), or ``"datasheet"`` for the
        ensembles that know a GPU by its peaks alone.
    flops, input_bytes, output_bytes : array-like
    classes : array-like of str
        Each op's class; each must have an ensemble.
    peak_flops, memory_bandwidth : float
        The GPU's FP32 FLOP/s and bytes/s.

    Raises
    ------
    CostModelError
        For an unknown ``model`` or a class without an ensemble.
    """
    models = load_models(path)
    classes = np.asarray(classes, dtype=object)
    flops = np.asarray(flops, dtype=float)
    input_bytes = np.asarray(input_bytes, dtype=float)
    output_bytes = np.asarray(output_bytes, dtype=float)
    if model == "datasheet":
        kind, gpus = "datasheet", ()
    elif model in models["gpus"]:
        kind, gpus = "named", tuple(models["gpus"])
    else:
        raise CostModelError(f"kernel model {model!r} is neither 'datasheet' nor a fitted GPU "
                             f"({models['gpus']})")
    out = np.full(len(flops), np.nan)
    # Searches cost the same ops (and parts of them) over and over: remember each kernel's time.
    cache = _CACHE.setdefault((str(path), model, float(peak_flops), float(memory_bandwidth)), {})
    keys = list(zip(classes.tolist(), flops.tolist(), input_bytes.tolist(), output_bytes.tolist()))
    todo = np.array([k not in cache for k in keys], dtype=bool)
    for cls in np.unique(classes[todo]) if todo.any() else ():
        if cls not in models[kind]:
            raise CostModelError(f"kernel model {model!r} has no ensemble for op class {cls!r} "
                                 f"(has {sorted(models[kind])})")
        sel = todo & (classes == cls)
        x = features(flops[sel], input_bytes[sel], output_bytes[sel], peak_flops, memory_bandwidth,
                     gpu=model, gpus=gpus)
        ref = reference_seconds(flops[sel], input_bytes[sel], output_bytes[sel], peak_flops,
                                memory_bandwidth)
        out[sel] = ref * np.exp(ensemble_predict(models[kind][cls], x))
        if len(cache) > 200_000:
            cache.clear()
        cache.update(zip((keys[i] for i in np.flatnonzero(sel)), out[sel].tolist()))
    for i in np.flatnonzero(~todo):
        out[i] = cache[keys[i]]
    return out


_CACHE: dict = {}


# -- the candidate: a roofline with a size-dependent efficiency --------------------------------------
def fit_roofline_curve(kernels: pd.DataFrame, peak_flops: float, memory_bandwidth: float) -> np.ndarray:
    """Fit ``seconds = max(F / (peak eff(F)), B / (bandwidth e_mem))``, ``eff(F) = e_max / (1 + t0 /
    (F / peak))^a`` to one GPU's kernels of one class (robust least squares on log times).

    Returns the parameters ``[log e_max, log t0, a, log e_mem]``.
    """
    from scipy.optimize import least_squares

    t = kernels.seconds.to_numpy(float)
    args = (kernels.flops.to_numpy(float), (kernels.input_bytes + kernels.output_bytes).to_numpy(float),
            peak_flops, memory_bandwidth)
    fit = least_squares(lambda p: np.log(roofline_curve_seconds(p, *args) / t),
                        [np.log(0.7), np.log(2e-5), 1.0, np.log(0.7)], loss="soft_l1", f_scale=0.1,
                        bounds=([-5, -20, 0.05, -5], [2, -3, 3, 0.5]))
    return fit.x


def roofline_curve_seconds(params, flops, moved, peak_flops, memory_bandwidth) -> np.ndarray:
    """:func:`fit_roofline_curve`'s model at ``params``."""
    log_e, log_t0, a, log_em = params
    tc = np.maximum(np.asarray(flops, float), 1.0) / peak_flops
    compute = tc / np.exp(log_e) * (1.0 + np.exp(log_t0) / tc) ** a
    return np.maximum(compute, np.asarray(moved, float) / (memory_bandwidth * np.exp(log_em)))
