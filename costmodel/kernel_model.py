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

Both come in a second form, ``named_shape`` and ``datasheet_shape``, that also
sees the kernel's shape (:data:`SHAPE_KEYS`: a convolution's batch, channels,
height, filter size, stride and padding; a MatMul's M, N, K and transposes),
which select cuDNN's and cuBLAS's algorithm and which FLOPs and bytes do not
determine. They cross-validate better (the input gradients most) and are used by
:func:`predict_seconds` for the ops whose shape string it is given. fddps's op
tables carry it in a ``kernel_shape`` column (:data:`KERNEL_SHAPE_COLUMN`),
filled by the TensorFlow adapter (``fddps.tf.graphdef.op_table``; the parts of
a split op in ``fddps.tf.split_candidates`` and the strategy expansion,
``fddps.strategy.kernel_shape``) with :func:`tf_kernel_shape` of each op's
static shapes and attributes; ``DevicePreset.op_times`` passes that column on.
Ops without a shape there (an unknown dimension, a dilated convolution, a part
split by rows or columns) get the ensembles over FLOPs and bytes above.

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
import itertools
import json
import re
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
#: The kernel's shape, where a caller knows it (``predict_seconds(..., shapes=...)``): per kind,
#: the shape-string keys read (``"N=64 C=3 H=224 W=224 K=64 R=7 S=7 stride_h=2 pad_h=3"``,
#: ``"M=64 N=1000 K=2048 transpose=NT"``) and the defaults of those that may be left out.
SHAPE_KEYS = {"conv": ("N", "C", "H", "K", "R", "S", "stride_h", "pad_h"),
              "matmul": ("M", "N", "K", "trans_a", "trans_b")}
SHAPE_DEFAULTS = {"conv": {"stride_h": 1, "pad_h": 0}, "matmul": {"trans_a": 0, "trans_b": 0}}
#: The op-table column holding each op's kernel shape string (None where unknown), which
#: ``DevicePreset.op_times`` passes to :func:`predict_seconds` as ``shapes``.
KERNEL_SHAPE_COLUMN = "kernel_shape"
#: Op types :func:`tf_kernel_shape` reads a shape off, and the attributes it reads.
TF_KERNEL_SHAPE_OPS = frozenset({"Conv2D", "_FusedConv2D", "Conv2DBackpropInput",
                                 "Conv2DBackpropFilter", "MatMul", "_FusedMatMul"})
TF_KERNEL_SHAPE_ATTRS = ("data_format", "strides", "padding", "explicit_paddings", "dilations",
                         "transpose_a", "transpose_b")
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


def shape_kind(op_class: str) -> str:
    """``"conv"`` or ``"matmul"``: which :data:`SHAPE_KEYS` a class's shape has."""
    return "matmul" if op_class == "matmul" else "conv"


def parse_shapes(op_class: str, shapes) -> np.ndarray:
    """The numbers of each shape string (:data:`SHAPE_KEYS` of the class, in that order), one row
    per string; a row of NaN where the string is empty, None or lacks a key without a default
    (that op falls back to the ensemble without shapes).

    ``stride`` / ``pad`` stand for ``stride_h`` / ``pad_h`` where those are absent; a MatMul's
    ``transpose=TN`` gives ``trans_a`` = 1, ``trans_b`` = 0.

    Examples
    --------
    >>> parse_shapes("matmul", ["M=64 N=1000 K=2048 transpose=NT", None]).tolist()
    [[64.0, 1000.0, 2048.0, 0.0, 1.0], [nan, nan, nan, nan, nan]]
    """
    kind = shape_kind(op_class)
    keys = SHAPE_KEYS[kind]
    out = np.full((len(shapes), len(keys)), np.nan)
    for row, shape in enumerate(shapes):
        if not isinstance(shape, str) or not shape:
            continue
        v = dict(re.findall(r"(\w+)=([\w.]+)", shape))
        v.setdefault("stride_h", v.get("stride", 1))
        v.setdefault("pad_h", v.get("pad", 0))
        t = v.get("transpose", "NN")
        v.setdefault("trans_a", int(t[:1] == "T"))
        v.setdefault("trans_b", int(t[1:2] == "T"))
        try:
            out[row] = [float(v[k]) for k in keys]
        except (KeyError, ValueError):
            out[row] = np.nan
    return out


def shape_columns(op_class: str, dims: np.ndarray) -> np.ndarray:
    """The regressor's shape columns of :func:`parse_shapes`' rows: the logs of the sizes
    (channels, batch, spatial size, filter size; M, N, K), stride, padding and transposes as
    they are."""
    dims = np.asarray(dims, dtype=float)
    kind = shape_kind(op_class)
    logged = [k for k in SHAPE_KEYS[kind] if k not in ("stride_h", "pad_h", "trans_a", "trans_b")]
    return np.column_stack([np.log(np.maximum(dims[:, i], 1.0)) if k in logged else dims[:, i]
                            for i, k in enumerate(SHAPE_KEYS[kind])])


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


def _node_table(trees):
    """``(feature, threshold, left, right, value, depth)``: the trees' node lists as arrays
    of shape ``(trees, most nodes)``, padded with leaves (feature -2) that are never
    reached, and the longest root-to-leaf path. Built field by field from the concatenated
    lists, and the depths level by level over all trees at once (a child's index is past
    its parent's, as scikit-learn numbers them): 2.5 ms for 300 trees where loops over
    trees and nodes took 5 ms, once per ensemble and process."""
    counts = np.array([len(t["feature"]) for t in trees])
    shape = (len(trees), int(counts.max()))
    tree_of = np.repeat(np.arange(len(trees)), counts)
    slot = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    out = []
    for field, fill, dtype in (("feature", -2, np.int64), ("threshold", 0.0, float),
                               ("left", -1, np.int64), ("right", -1, np.int64),
                               ("value", 0.0, float)):
        a = np.full(shape, fill, dtype=dtype)
        a[tree_of, slot] = np.fromiter(itertools.chain.from_iterable(t[field] for t in trees),
                                       dtype=dtype, count=int(counts.sum()))
        out.append(a)
    feat, _, left, right, _ = out
    depth = np.zeros(shape, dtype=np.int64)
    rows = np.arange(len(trees))
    for j in range(shape[1]):  # (parents before children: each node's depth is final here)
        for child in (left[:, j], right[:, j]):
            has = child >= 0
            depth[rows[has], child[has]] = depth[has, j] + 1
    return (*out, int(depth.max()))


def _flat_tables(ens: dict):
    """``(feature, threshold, child, value, depth, trees, nodes)`` of an ensemble, cached in
    its dict: :func:`_node_table`'s arrays flattened to one index space (tree ``t``'s node
    ``j`` is ``t * nodes + j``), ``feature`` 0 at leaves, and ``child[2 * i]`` node ``i``'s
    right child, ``child[2 * i + 1]`` its left one (flat indices; a leaf's both itself), so
    that a level of the walk is three 1-D ``take``s (2-D fancy indexing cost 2-3x more)."""
    got = ens.get("_flat")
    if got is None:
        feat, thr, left, right, val, depth = _node_table(ens["trees"])
        trees, nodes = feat.shape
        base = (np.arange(trees) * nodes)[:, None]
        own = base + np.arange(nodes)[None, :]
        right = np.where(right >= 0, base + right, own)
        left = np.where(left >= 0, base + left, own)
        child = np.stack([right.ravel(), left.ravel()], axis=1).ravel()
        got = ens["_flat"] = (np.maximum(feat, 0).ravel(), thr.ravel(), child, val.ravel(),
                              depth, trees, nodes)
    return got


def ensemble_predict(ens: dict, x: np.ndarray) -> np.ndarray:
    """Predict with an :func:`export_ensemble` dict: all trees at once, level by level.

    Each row walks every tree from its root, ``x[feature] <= threshold`` going left as
    scikit-learn's trees do (a NaN goes right); a leaf stays where it is; the leaves'
    values are summed tree by tree.

    Examples
    --------
    >>> stump = dict(feature=[0, -2, -2], threshold=[0.5, 0, 0], left=[1, -1, -1],
    ...              right=[2, -1, -1], value=[0.0, -1.0, 1.0])
    >>> ensemble_predict(dict(init=10.0, learning_rate=0.5, trees=[stump]),
    ...                  np.array([[0.0], [1.0]])).tolist()
    [9.5, 10.5]
    """
    x = np.asarray(x, dtype=float)
    out = np.full(len(x), ens["init"], dtype=float)
    if not len(x):
        return out
    feat, thr, child, val, depth, trees, nodes = _flat_tables(ens)
    rows = len(x)
    node = np.tile(np.arange(trees) * nodes, rows)  # (row, tree), flat node ids
    column = np.repeat(np.arange(rows) * x.shape[1], trees)
    xs = x.ravel()
    for _ in range(depth):
        go_left = xs.take(column + feat.take(node)) <= thr.take(node)
        node = child.take(2 * node + go_left)
    return out + ens["learning_rate"] * val.take(node).reshape(rows, trees).sum(axis=1)


# -- fitting --------------------------------------------------------------------------------------
def _peaks(kernels: pd.DataFrame, datasheets: dict):
    missing = sorted(set(kernels.gpu) - set(datasheets))
    if missing:
        raise CostModelError(f"no datasheet figures for GPU {missing[0]!r} (have {sorted(datasheets)})")
    return (kernels.gpu.map(lambda g: datasheets[g]["peak_flops"]).to_numpy(float),
            kernels.gpu.map(lambda g: datasheets[g]["memory_bandwidth"]).to_numpy(float))


def kernel_features(kernels: pd.DataFrame, datasheets: dict, *, gpus=(), shapes=False) -> np.ndarray:
    """:func:`features` of one class's rows of :func:`costmodel.deepbench.load_kernels`, with
    :func:`shape_columns` of their ``shape`` strings appended if ``shapes``."""
    peak, bw = _peaks(kernels, datasheets)
    x = features(kernels.flops, kernels.input_bytes, kernels.output_bytes, peak, bw,
                 gpu=kernels.gpu.to_numpy(), gpus=tuple(gpus))
    if shapes:
        classes = set(kernels.op_class)
        if len(classes) != 1:
            raise CostModelError(f"shape features need the rows of one op class, got {sorted(classes)}")
        cls = classes.pop()
        dims = parse_shapes(cls, kernels["shape"].tolist())
        bad = ~np.isfinite(dims).all(axis=1)
        if bad.any():
            raise CostModelError(f"{cls} kernel shape {kernels['shape'].iloc[np.flatnonzero(bad)[0]]!r} "
                                 f"lacks one of {list(SHAPE_KEYS[shape_kind(cls)])}")
        x = np.column_stack([x, shape_columns(cls, dims)])
    return x


def fit_ensemble(kernels: pd.DataFrame, datasheets: dict, *, gpus=(), params=None, shapes=False):
    """Fit one class's regressor to ``kernels`` (rows of :func:`costmodel.deepbench.load_kernels`).

    ``gpus``: the GPUs with a one-hot column (``()``: a datasheet-only ensemble).
    ``shapes``: also the kernel's shape (:func:`shape_columns`).
    Returns the fitted ``GradientBoostingRegressor``.
    """
    from sklearn.ensemble import GradientBoostingRegressor

    peak, bw = _peaks(kernels, datasheets)
    x = kernel_features(kernels, datasheets, gpus=gpus, shapes=shapes)
    y = np.log(kernels.seconds.to_numpy(float)
               / reference_seconds(kernels.flops, kernels.input_bytes, kernels.output_bytes, peak, bw))
    return GradientBoostingRegressor(**{**GBR_PARAMS, **(params or {})}).fit(x, y)


def fit_models(kernels: pd.DataFrame, datasheets: dict, *, params=None) -> dict:
    """Both ensembles of every class in :data:`MODEL_CLASSES`: the content of :data:`MODEL_FILE`.

    Returns
    -------
    dict
        ``{"gpus": [...], "params": ..., "named": {cls: ens}, "datasheet": {cls: ens},
        "named_shape": {cls: ens}, "datasheet_shape": {cls: ens},
        "datasheets": {gpu: {peak_flops, memory_bandwidth}}, "kernels": {cls: n}}``
        (``*_shape``: with the kernel's shape, :data:`SHAPE_KEYS`).
    """
    gpus = sorted(set(kernels.gpu))
    out = dict(gpus=gpus, params={**GBR_PARAMS, **(params or {})}, features=list(FEATURES),
               datasheets={g: dict(peak_flops=datasheets[g]["peak_flops"],
                                   memory_bandwidth=datasheets[g]["memory_bandwidth"]) for g in gpus},
               shape_keys={k: list(v) for k, v in SHAPE_KEYS.items()},
               kernels={}, named={}, datasheet={}, named_shape={}, datasheet_shape={})
    for cls in MODEL_CLASSES:
        rows = kernels[kernels.op_class == cls]
        if rows.empty:
            continue
        out["kernels"][cls] = int(len(rows))
        out["named"][cls] = export_ensemble(fit_ensemble(rows, datasheets, gpus=gpus, params=params))
        out["datasheet"][cls] = export_ensemble(fit_ensemble(rows, datasheets, params=params))
        out["named_shape"][cls] = export_ensemble(fit_ensemble(rows, datasheets, gpus=gpus, params=params,
                                                               shapes=True))
        out["datasheet_shape"][cls] = export_ensemble(fit_ensemble(rows, datasheets, params=params,
                                                                   shapes=True))
    return out


def save_models(models: dict, path=MODEL_FILE) -> Path:
    """Write :func:`fit_models`' result as JSON."""
    path = Path(path)
    clean = json.loads(json.dumps(models, default=lambda o: None))
    for kind in ("named", "datasheet", "named_shape", "datasheet_shape"):
        for ens in clean.get(kind, {}).values():
            ens.pop("_flat", None)  # (ensemble_predict's cached tables)
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
                    memory_bandwidth: float, shapes=None, path=MODEL_FILE) -> np.ndarray:
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
    shapes : sequence of str or None, optional
        Each op's shape string where the caller knows it (:func:`parse_shapes`; None or ``""``
        where not): those ops are predicted by the ensembles that also see the shape (the
        filter size, stride, channels and batch that select cuDNN's algorithm; a MatMul's
        M, N, K and transposes), which cross-validate better (``python -m
        experiments.gpu_kernels --report``). Ops without one, every op when ``shapes``
        is None (``DevicePreset.op_times`` on an op table without a ``kernel_shape``
        column), and ops whose shape's FP32 bytes are not theirs (a part of a split op
        given the whole op's shape) use the ensembles over FLOPs and bytes.

    Raises
    ------
    CostModelError
        For an unknown ``model``, a class without an ensemble, or ``shapes`` of the wrong length.
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
    if shapes is None:
        shapes = [None] * len(flops)
    else:
        shapes = [s if isinstance(s, str) and s else None for s in shapes]
        if len(shapes) != len(flops):
            raise CostModelError(f"kernel model {model!r}: {len(shapes)} shapes for {len(flops)} ops")
    out = np.full(len(flops), np.nan)
    # Searches cost the same ops (and parts of them) over and over: remember each kernel's time.
    cache = _CACHE.setdefault((str(path), model, float(peak_flops), float(memory_bandwidth)), {})
    keys = list(zip(classes.tolist(), flops.tolist(), input_bytes.tolist(), output_bytes.tolist(),
                    shapes))
    # Each distinct kernel predicted once (a row's prediction depends on its own fields only);
    # ``got`` holds this call's times (the cache may be cleared on the way).
    first, got = {}, {}
    for i, k in enumerate(keys):
        if k in got or k in first:
            continue
        t = cache.get(k)
        if t is None:
            first[k] = i
        else:
            got[k] = t
    todo = np.zeros(len(keys), dtype=bool)
    todo[list(first.values())] = True
    for cls in np.unique(classes[todo]) if todo.any() else ():
        if cls not in models[kind]:
            raise CostModelError(f"kernel model {model!r} has no ensemble for op class {cls!r} "
                                 f"(has {sorted(models[kind])})")
        sel = todo & (classes == cls)
        idx = np.flatnonzero(sel)
        x = features(flops[sel], input_bytes[sel], output_bytes[sel], peak_flops, memory_bandwidth,
                     gpu=model, gpus=gpus)
        log_eff = np.full(len(idx), np.nan)
        dims = parse_shapes(cls, [shapes[i] for i in idx])
        known = np.isfinite(dims).all(axis=1) & (cls in models.get(f"{kind}_shape", {}))
        for j in np.flatnonzero(known):  # a shape that is not this op's (a part of a split op)
            known[j] = _shape_matches(cls, shapes[idx[j]], input_bytes[idx[j]], output_bytes[idx[j]])
        if known.any():
            log_eff[known] = ensemble_predict(models[f"{kind}_shape"][cls],
                                              np.column_stack([x[known],
                                                               shape_columns(cls, dims[known])]))
        if (~known).any():
            log_eff[~known] = ensemble_predict(models[kind][cls], x[~known])
        ref = reference_seconds(flops[sel], input_bytes[sel], output_bytes[sel], peak_flops,
                                memory_bandwidth)
        out[sel] = ref * np.exp(log_eff)
        if len(cache) > 200_000:
            cache.clear()
        done = dict(zip((keys[i] for i in idx), out[sel].tolist()))
        got.update(done)
        cache.update(done)
    return np.array([got[k] for k in keys], dtype=float).reshape(len(keys))


_CACHE: dict = {}


def _shape_matches(op_class: str, shape: str, input_bytes: float, output_bytes: float) -> bool:
    """Whether ``shape``'s FP32 output bytes are the op's within 1%, its input bytes within 5% (a
    fused bias, a convolution gradient's shape operand). Not its FLOPs: TensorFlow's FLOP count of
    a convolution gradient with VALID padding runs over the input's size, not the output's."""
    got = _shape_bytes(op_class, shape)
    if got is None:
        return False
    ins, out = got
    # numpy.isclose's test (atol 1e-8) on finite floats, without its per-call overhead.
    return (abs(out - float(output_bytes)) <= 1e-8 + 0.01 * abs(float(output_bytes))
            and abs(ins - float(input_bytes)) <= 1e-8 + 0.05 * abs(float(input_bytes)))


@functools.lru_cache(maxsize=65536)
def _shape_bytes(op_class: str, shape: str):
    """``(input_bytes, output_bytes)`` as floats of ``shape``'s kernel, or None where it has none
    (searches ask for the same parts' shapes over and over)."""
    from .errors import CostModelError as _Error
    from .kernels import kernel_features  # kernels imports hardware, which imports this module

    try:
        k = kernel_features(op_class, shape)
    except (_Error, KeyError, ValueError):
        return None
    return float(k["input_bytes"]), float(k["output_bytes"])


def _known(dims) -> bool:
    return dims is not None and all(isinstance(d, (int, np.integer)) and d > 0 for d in dims)


def tf_kernel_shape(op_type: str, input_shapes, output_shape, attrs=None):
    """The shape string (:func:`parse_shapes`) of a TensorFlow op, from its inputs' and output's
    static shapes and its attributes, or None where it cannot be told (an unknown dimension, a
    dilated or grouped convolution, an op type DeepBench did not time).

    Parameters
    ----------
    op_type : str
        ``Conv2D``, ``_FusedConv2D``, ``Conv2DBackpropInput``, ``Conv2DBackpropFilter``,
        ``MatMul`` or ``_FusedMatMul``.
    input_shapes : sequence of tuple
        The data inputs' shapes in TensorFlow's order (a convolution's input and filter; the
        input gradient's ``input_sizes``, filter and output gradient; the filter gradient's
        input, ``filter_sizes`` and output gradient; a MatMul's ``a`` and ``b``).
    output_shape : tuple
        The op's (first) output's shape.
    attrs : dict, optional
        ``data_format`` (``"NHWC"``), ``strides``, ``padding`` (``"SAME"``, ``"VALID"``,
        ``"EXPLICIT"`` with ``explicit_paddings``), ``dilations``; ``transpose_a``,
        ``transpose_b``. Strings may be bytes.

    Returns
    -------
    str or None
        A MatMul as cuBLAS runs it (column-major, as DeepBench timed it): TensorFlow's
        ``a (m x k) @ b (k x n)`` is cuBLAS's ``n x m`` product with the operands swapped, so
        ``M=n N=m`` and the transposes swapped.

    Examples
    --------
    >>> tf_kernel_shape("Conv2D", [(64, 224, 224, 3), (7, 7, 3, 64)], (64, 112, 112, 64),
    ...                 {"strides": [1, 2, 2, 1], "padding": b"SAME"})
    'N=64 C=3 H=224 W=224 K=64 R=7 S=7 stride_h=2 stride_w=2 pad_h=3 pad_w=3'
    >>> tf_kernel_shape("MatMul", [(64, 2048), (2048, 1000)], (64, 1000))
    'M=1000 N=64 K=2048 transpose=NN'
    """
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in (attrs or {}).items()}
    shapes = [tuple(s) if s is not None else None for s in input_shapes]
    out = tuple(output_shape) if output_shape is not None else None
    if op_type in ("MatMul", "_FusedMatMul"):
        if len(shapes) < 2 or not (_known(shapes[0]) and _known(shapes[1])):
            return None
        a, b = shapes[0], shapes[1]
        ta, tb = bool(attrs.get("transpose_a", False)), bool(attrs.get("transpose_b", False))
        if len(a) != 2 or len(b) != 2:
            return None
        m, k = (a[1], a[0]) if ta else a
        n = b[0] if tb else b[1]
        return f"M={n} N={m} K={k} transpose={'T' if tb else 'N'}{'T' if ta else 'N'}"
    if op_type not in ("Conv2D", "_FusedConv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        return None
    x = {"Conv2DBackpropInput": out}.get(op_type, shapes[0] if shapes else None)
    f = out if op_type == "Conv2DBackpropFilter" else (shapes[1] if len(shapes) > 1 else None)
    if not (_known(x) and _known(f)) or len(x) != 4 or len(f) != 4:
        return None
    fmt = attrs.get("data_format", "NHWC")
    h_axis, w_axis = (1, 2) if fmt == "NHWC" else (2, 3)
    n, h, w = x[0], x[h_axis], x[w_axis]
    c = x[3] if fmt == "NHWC" else x[1]
    r, s_, fc, k = f
    if fc != c or any(d != 1 for d in attrs.get("dilations", [1, 1, 1, 1])):
        return None
    strides = attrs.get("strides", [1, 1, 1, 1])
    sh, sw = strides[h_axis], strides[w_axis]
    padding = attrs.get("padding", "VALID")
    if padding == "SAME":
        def pad(size, kk, st):  # TensorFlow puts the odd row after: the output size is the same
            return (max((-(-size // st) - 1) * st + kk - size, 0) + 1) // 2
        ph, pw = pad(h, r, sh), pad(w, s_, sw)
    elif padding == "EXPLICIT":
        p = list(attrs.get("explicit_paddings", [0] * 8))
        ph, pw = p[2 * h_axis], p[2 * w_axis]
    else:
        ph = pw = 0
    return (f"N={n} C={c} H={h} W={w} K={k} R={r} S={s_} stride_h={sh} stride_w={sw} "
            f"pad_h={ph} pad_w={pw}")


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
