"""Fitting the cost model to measurements (scikit-learn), and predicting from the fits.

- :class:`OpTimeModel`: op times on one device type. Keeps the measured time
  of every profiled op (by name) and fits, per op type, a linear model of time
  on FLOPs and bytes in/out. A profiled op at the shapes it was profiled at
  gets its measured time; at other shapes (another batch size) its measured
  time with the part above its type's fixed cost (the fastest profiled op of
  the type, when it has a few) scaled by the op's work ratio (FLOPs, or bytes for ops without
  FLOPs); an
  op never profiled gets its type's fit; an op whose type was never profiled
  gets the device preset calibrated on the profile (the documented fallback,
  counted in :attr:`costmodel.CostModel.last_report`).
- :class:`LinkModel`: per link, ``seconds = latency + bytes / bandwidth`` by
  :class:`sklearn.linear_model.LinearRegression`, with R² per link (paper
  Definition 4).
- :func:`fit_cost_model`: a :class:`~costmodel.CostModel` from profiles,
  transfer measurements and a base model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score

from .base import CostModel, default_cost_model
from .calibrate import fit_cpu_preset
from .devices import parse_device
from .errors import CostModelError
from .hardware import NO_WORK_OPS, DevicePreset, LinkPreset, op_features

#: Features of the per-op-type regression, in this order.
FEATURES = ("flops", "input_bytes", "output_bytes")
_TIMED_STATUSES = ("timed",)
#: How far, in decades of work, an op type's measured/preset ratio is trusted
#: beyond the sizes it was measured at (the width of one size group of
#: :func:`costmodel.calibrate.fit_cpu_preset`); it fades to 1 (the calibrated
#: preset alone) over that distance. Three ~200 KB ``Slice`` ops of ResNet-50
#: timed at twice the preset made every 4.7 MB weight slice of a
#: parameter-split strategy cost twice its measured time.
RATIO_REACH = 1.0


def _work(x: np.ndarray) -> np.ndarray:
    """What an op's time grows with, from the FEATURES matrix: its FLOPs, or for
    ops without FLOPs (copies, reshapes, optimizer updates) its bytes moved."""
    return np.where(x[:, 0] > 0, x[:, 0], x[:, 1] + x[:, 2])


def _feature_matrix(ops: pd.DataFrame) -> np.ndarray:
    missing = [c for c in FEATURES if c not in ops.columns]
    if missing:
        raise CostModelError(f"the op table has no column {missing[0]!r} (features: {list(FEATURES)})")
    x = ops[list(FEATURES)].to_numpy(dtype=np.float64)
    return np.maximum(np.nan_to_num(x, nan=0.0, posinf=0.0), 0.0)


def _ratio_at(model: Mapping, work: np.ndarray) -> np.ndarray:
    """A ratio type model's factor for ops of ``work``: its ratio within the sizes
    measured, fading to 1 over :data:`RATIO_REACH` decades beyond them (models
    saved without ``sizes`` keep their ratio everywhere)."""
    ratio = float(model["ratio"])
    if "sizes" not in model or ratio <= 0:
        return np.full(len(work), ratio)
    lo, hi = model["sizes"]
    x = np.log10(np.maximum(work, 1.0))
    outside = np.maximum(lo - x, 0.0) + np.maximum(x - hi, 0.0)
    return ratio ** np.clip(1.0 - outside / RATIO_REACH, 0.0, 1.0)


class OpTimeModel:
    """Op times on one device type, fitted to measured op times.

    Parameters
    ----------
    preset : DevicePreset
        The device's analytic model; calibrated on the measurements in
        :meth:`fit` and used for op types never measured.
    min_samples : int
        Measurements with distinct features an op type needs for a linear fit;
        with fewer, its time is the calibrated preset's times a per-type factor
        (the median measured/preset ratio), trusted up to :data:`RATIO_REACH`
        decades of work beyond the sizes measured.
    rtol : float
        Relative tolerance under which an op's features count as "the same
        shapes as profiled".
    size_curves : bool
        Calibrate the preset as ``fddps calibrate`` does
        (:func:`costmodel.calibrate.fit_cpu_preset`: an efficiency per op class
        that depends on the op's size) instead of one efficiency per class
        (:meth:`DevicePreset.calibrate`). What the fit gives op types the
        profile never timed (the ``Slice`` and ``ConcatV2`` a split strategy
        adds): one median efficiency is set by the many small ops of a step and
        priced ResNet-50's 9 MB gradient concatenations at 3-6x their measured time.
        :func:`fit_cost_model` uses it for CPUs.

    Attributes
    ----------
    calibrated_ : DevicePreset
        Set by :meth:`fit`, as the attributes below.
    type_models_ : dict
        op type -> ``{"kind": "linear", "coef": [...], "intercept": float,
        "floor": float, "r2": float, "n": int, "fixed": float}`` or
        ``{"kind": "ratio", "ratio": float, "n": int, "fixed": float, "sizes": [lo, hi]}``
        (``sizes``: the log10 work of the smallest and largest op measured);
        ``fixed`` is the fastest measured time of the type (0 with fewer than
        ``2 * min_samples`` ops), the part of an op's time taken as not
        growing with its work.
    measured_ : pandas.DataFrame
        ``name``, the features, ``seconds``, ``status`` of every profiled op.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> flops = rng.uniform(1e6, 1e9, 50)
    >>> ops = pd.DataFrame({"name": [f"mm{i}" for i in range(50)], "op_type": "MatMul",
    ...                     "flops": flops, "input_bytes": flops / 100, "output_bytes": flops / 200,
    ...                     "seconds": 1e-5 + flops / 5e10, "status": "timed"})
    >>> from costmodel import presets
    >>> m = OpTimeModel(presets["cpu"]).fit(ops)
    >>> new = ops.assign(name="other", flops=2e9, input_bytes=2e7, output_bytes=1e7)
    >>> round(float(m.predict(new.head(1))[0]) * 1e3, 3)   # ms: 1e-5 s + 2e9 / 5e10 s
    40.01
    """

    def __init__(self, preset: DevicePreset, *, min_samples: int = 4, rtol: float = 1e-6,
                 size_curves: bool = False):
        self.preset = preset
        self.min_samples = min_samples
        self.rtol = rtol
        self.size_curves = size_curves

    # -- fitting -------------------------------------------------------------------------
    def fit(self, measured: pd.DataFrame) -> "OpTimeModel":
        """Fit to measured op times.

        Parameters
        ----------
        measured : pandas.DataFrame
            Op table rows with ``seconds`` and ``status`` (``timed``, ``fused``,
            ``pruned``: :meth:`costmodel.profile.Profile.join`). Only ``timed`` rows
            train the regressions; all rows are remembered by name.

        Raises
        ------
        CostModelError
            If ``measured`` lacks a column or has no timed op with a finite time.
        """
        for col in ("name", "op_type", "seconds"):
            if col not in measured.columns:
                raise CostModelError(f"measured op times need a {col!r} column")
        status = measured["status"] if "status" in measured.columns else pd.Series("timed", measured.index)
        t = measured["seconds"].to_numpy(dtype=np.float64)
        if np.any(~np.isfinite(t) | (t < 0)):
            bad = measured["name"].to_numpy()[~np.isfinite(t) | (t < 0)][0]
            raise CostModelError(f"op {bad!r} has an invalid measured time")
        timed = measured[(status.isin(_TIMED_STATUSES)).to_numpy() & (t > 0)]
        if timed.empty:
            raise CostModelError("no timed op with a positive time to fit")
        self.calibrated_ = (fit_cpu_preset(timed, self.preset, name=self.preset.name,
                                           timed_by="the profile")
                            if self.size_curves else self.preset.calibrate(timed))
        self.type_models_ = {}
        for op_type, rows in timed.groupby("op_type", sort=True):
            self.type_models_[str(op_type)] = self._fit_type(str(op_type), rows)
        m = measured[["name", "op_type"]].astype(str).reset_index(drop=True)
        m[list(FEATURES)] = _feature_matrix(measured)
        m["seconds"] = t
        m["status"] = status.astype(str).to_numpy()
        self.measured_ = m
        self._index = None
        return self

    def _fit_type(self, op_type: str, rows: pd.DataFrame) -> dict:
        x = _feature_matrix(rows)
        y = rows["seconds"].to_numpy(dtype=np.float64)
        n = len(y)
        # A fitted negative intercept must not make small ops free: predictions
        # stay above a tenth of the fastest measured op of the type.
        floor = 0.1 * float(np.min(y))
        distinct = len(np.unique(x, axis=0))
        # The fastest op of a type bounds its fixed per-op cost (kernel launch,
        # oneDNN set-up), the part of a time that does not grow with the work;
        # among a handful of ops the fastest is just an op, so none is assumed.
        fixed = float(np.min(y)) if n >= 2 * self.min_samples else 0.0
        if distinct >= self.min_samples and op_type not in NO_WORK_OPS and x.any():
            scale = np.where(x.max(axis=0) > 0, x.max(axis=0), 1.0)
            # Weights 1/y^2: least squares on relative error, so microsecond
            # ops count as much as millisecond ones.
            reg = LinearRegression(positive=True).fit(x / scale, y, sample_weight=1.0 / y ** 2)
            coef = reg.coef_ / scale
            pred = np.maximum(x @ coef + reg.intercept_, floor)
            return {"kind": "linear", "coef": [float(c) for c in coef],
                    "intercept": float(reg.intercept_), "floor": floor,
                    "r2": float(r2_score(y, pred)) if n > 1 else 1.0, "n": n,
                    "fixed": fixed}
        base = self.calibrated_.op_times(rows)
        work = _work(x)
        sizes = np.log10(work[work > 0]) if (work > 0).any() else np.zeros(1)
        return {"kind": "ratio", "ratio": float(np.median(y / base)), "n": n,
                "fixed": fixed, "sizes": [float(sizes.min()), float(sizes.max())]}

    # -- predicting ----------------------------------------------------------------------
    def _type_predict(self, ops: pd.DataFrame, x: np.ndarray):
        """Per-type fit of every row, and whether the row's type had a fit."""
        base = self.calibrated_.op_times(ops)
        out = base.copy()
        seen = np.zeros(len(ops), dtype=bool)
        types = ops["op_type"].astype(str).to_numpy()
        for op_type in np.unique(types):
            m = self.type_models_.get(op_type)
            if m is None:
                continue
            sel = types == op_type
            seen[sel] = True
            if m["kind"] == "linear":
                out[sel] = np.maximum(x[sel] @ np.asarray(m["coef"]) + m["intercept"], m["floor"])
            else:
                out[sel] = base[sel] * _ratio_at(m, _work(x[sel]))
        return out, seen

    def predict_with_source(self, ops: pd.DataFrame):
        """Predicted seconds and where each came from, for every row of ``ops``.

        A row is matched to a measurement by its ``name``, or by its
        ``profile_name`` where that column holds one: the op a part of a split
        op was cut from, whose measurement it scales by its work ratio.

        Returns
        -------
        seconds : numpy.ndarray of float
        source : numpy.ndarray of str
            ``profile``, ``profile-scaled``, ``regression`` or ``fallback``
            (see :class:`costmodel.OpTimeReport`).
        """
        if "name" not in ops.columns:
            raise CostModelError("the op table has no column 'name'")
        op_features(ops)  # checks the columns
        x = _feature_matrix(ops)
        fitted, seen = self._type_predict(ops, x)
        source = np.where(seen, "regression", "fallback").astype(object)
        seconds = fitted.copy()

        # Profiled ops: nearest profiled shapes (several batch sizes may be profiled).
        # A part of a split op names the op it is a part of (``profile_name``): it
        # scales that op's measurement by its share of the work, as a new batch
        # does. Costed by the fit instead, the late 1x1 convolutions of
        # ResNet-50 (CIFAR size, batch 32) summed to a third of their measured
        # whole, so two parts on one device were "faster" than the op they split.
        names = ops["name"].astype(str).to_numpy()
        if "profile_name" in ops.columns:
            origin = ops["profile_name"].to_numpy(dtype=object)
            names = np.where(pd.isna(origin), names, origin.astype(str))
        meas = self.measured_
        hit = np.flatnonzero(np.isin(names, meas["name"].to_numpy()))
        if hit.size:
            # The same name with another type is another op (a rewritten graph
            # keeps a split op's name on the IdentityN that gathers its parts).
            cand = pd.DataFrame({"row": hit, "name": names[hit],
                                 "op_type": ops["op_type"].astype(str).to_numpy()[hit]}).merge(
                meas.reset_index().rename(columns={"index": "m"}), on=["name", "op_type"])
            xm = cand[list(FEATURES)].to_numpy()
            xr = x[cand["row"].to_numpy()]
            dist = np.abs(np.log1p(xm) - np.log1p(xr)).sum(axis=1)
            cand["dist"] = dist
            best = cand.sort_values(["row", "dist"], kind="stable").drop_duplicates("row")
            rows = best["row"].to_numpy()
            xm = best[list(FEATURES)].to_numpy()
            same = np.all(np.abs(xm - x[rows]) <= self.rtol * np.maximum(np.abs(xm), 1.0), axis=1)
            t_meas = best["seconds"].to_numpy()
            # Scale the measurement by the op's own work ratio, not by the ratio of
            # its type's fit: the fit spreads a type's time over FLOPs and bytes
            # across ops, and may credit time to bytes that do not grow with the
            # batch (a filter's), which predicted ResNet-50's step at batch 16
            # from batch 8 40% short. The type's fixed cost does not scale.
            types = ops["op_type"].astype(str).to_numpy()[rows]
            fixed = np.minimum(t_meas, [self.type_models_.get(t, {}).get("fixed", 0.0)
                                        for t in types])
            w_old, w_new = _work(xm), _work(x[rows])
            ratio = np.where((w_old > 0) & (w_new > 0), w_new / np.where(w_old > 0, w_old, 1.0), 1.0)
            scaled = fixed + (t_meas - fixed) * ratio
            seconds[rows] = np.where(same, t_meas, scaled)
            source[rows] = np.where(same, "profile", "profile-scaled")
        return np.maximum(seconds, 0.0), source.astype(str)

    def predict(self, ops: pd.DataFrame) -> np.ndarray:
        """Predicted seconds of every row of ``ops``."""
        return self.predict_with_source(ops)[0]

    def profiled_names(self) -> set:
        """Names of the ops that have a measurement."""
        return set(self.measured_["name"])

    # -- saving --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        m = self.measured_
        return {"preset": self.preset.to_dict(), "calibrated": self.calibrated_.to_dict(),
                "min_samples": self.min_samples, "rtol": self.rtol,
                "size_curves": self.size_curves, "type_models": self.type_models_,
                "measured": {c: m[c].tolist() for c in m.columns}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "OpTimeModel":
        model = cls(DevicePreset.from_dict(d["preset"]), min_samples=int(d["min_samples"]),
                    rtol=float(d["rtol"]), size_curves=bool(d.get("size_curves", False)))
        model.calibrated_ = DevicePreset.from_dict(d["calibrated"])
        model.type_models_ = {str(k): dict(v) for k, v in d["type_models"].items()}
        for k, v in model.type_models_.items():
            if v.get("kind") not in ("linear", "ratio"):
                raise ValueError(f"op type {k!r} has an unknown model kind {v.get('kind')!r}")
        meas = pd.DataFrame(d["measured"])
        missing = {"name", "op_type", "seconds", "status", *FEATURES} - set(meas.columns)
        if missing:
            raise KeyError(f"measured ops lack columns {sorted(missing)}")
        for c in (*FEATURES, "seconds"):
            meas[c] = meas[c].astype(np.float64)
        model.measured_ = meas
        return model


class LinkModel:
    """Latency and bandwidth of every measured link, by linear regression.

    Fits ``seconds = latency + bytes / bandwidth`` per ``(src, dst)`` with
    :class:`sklearn.linear_model.LinearRegression` on the per-size robust mean
    times, weighted by 1/time so that small transfers (which fix the latency)
    count next to the large ones (which fix the bandwidth). The attributes
    ending in ``_`` are set by :meth:`fit`.

    Attributes
    ----------
    links_ : pandas.DataFrame
        ``src``, ``dst``, ``latency``, ``bandwidth``, ``r2`` (unweighted, on the
        per-size means), ``n`` (sizes), ``max_rel_error``.

    Examples
    --------
    >>> sizes = np.logspace(0, 7, 15)
    >>> df = pd.DataFrame({"src": "/cpu:0", "dst": "/cpu:1", "bytes": sizes,
    ...                    "seconds": 1e-4 + sizes / 1e9})
    >>> fit = LinkModel().fit(df).links_
    >>> print(round(fit.latency[0] * 1e6), round(fit.bandwidth[0] / 1e9, 3), round(fit.r2[0], 6))
    100 1.0 1.0
    """

    def fit(self, transfers: pd.DataFrame) -> "LinkModel":
        """Fit every link of ``transfers`` (columns ``src``, ``dst``, ``bytes``, ``seconds``).

        Raises
        ------
        CostModelError
            If a column is missing, or a link has fewer than 2 distinct sizes.
        """
        from .profile import iterated_mean

        for col in ("src", "dst", "bytes", "seconds"):
            if col not in transfers.columns:
                raise CostModelError(f"transfer measurements need a {col!r} column")
        rows = []
        for (src, dst), g in transfers.groupby(["src", "dst"], sort=True):
            sizes, means = [], []
            for size, s in g.groupby("bytes"):
                mean, _, _ = iterated_mean(s["seconds"].to_numpy(dtype=np.float64))
                sizes.append(float(size))
                means.append(float(mean))
            x, y = np.asarray(sizes), np.asarray(means)
            if len(x) < 2:
                raise CostModelError(f"link {src} -> {dst} needs transfers of at least 2 sizes")
            # Noise can make the smallest transfers' means <= 0: floor the weights.
            positive = y[y > 0]
            floor = max(float(positive.min()) if positive.size else 1e-6, 1e-7)
            reg = LinearRegression(positive=True).fit(x[:, None], y,
                                                      sample_weight=1.0 / np.maximum(y, floor))
            latency = max(float(reg.intercept_), 0.0)
            slope = float(reg.coef_[0])
            pred = latency + slope * x
            rows.append({"src": src, "dst": dst, "latency": latency,
                         "bandwidth": 1.0 / slope if slope > 0 else np.inf,
                         "r2": float(r2_score(y, pred)), "n": len(x),
                         "max_rel_error": float(np.max(np.abs(pred - y) / np.maximum(np.abs(y), floor)))})
        self.links_ = pd.DataFrame(rows, columns=["src", "dst", "latency", "bandwidth", "r2", "n",
                                                  "max_rel_error"])
        return self

    def predict(self, nbytes, src: str, dst: str):
        """Seconds to move ``nbytes`` over the fitted link ``src -> dst`` (either direction)."""
        p = self.pair_links().get((str(parse_device(src)), str(parse_device(dst))))
        p = p or self.pair_links().get((str(parse_device(dst)), str(parse_device(src))))
        if p is None:
            raise CostModelError(f"no measured link between {src!r} and {dst!r}")
        return p.transfer_time(nbytes)

    def pair_links(self) -> dict:
        """``{(src, dst): LinkPreset}`` of the fitted links (device names normalised)."""
        return {(str(parse_device(r.src)), str(parse_device(r.dst))):
                LinkPreset(f"measured {r.src} -> {r.dst}", float(r.latency), float(r.bandwidth),
                           f"fitted on {r.n} transfer sizes, R^2 = {r.r2:.4f}")
                for r in self.links_.itertuples()}


def fit_cost_model(measured: pd.DataFrame | Sequence[pd.DataFrame] | None = None, *,
                   transfers: pd.DataFrame | None = None, base: CostModel | None = None,
                   graph: str | None = None, links: Mapping | None = None,
                   meta: Mapping | None = None, min_samples: int = 4,
                   transfer_cpu: pd.DataFrame | None = None) -> CostModel:
    """A :class:`~costmodel.CostModel` fitted to measurements, on top of ``base``.

    Parameters
    ----------
    measured : DataFrame or list of DataFrames, optional
        Measured op times (:meth:`costmodel.profile.Profile.join`): op table
        columns plus ``seconds``, ``status``, ``device_type``; profiles of one
        device type at several batch sizes are concatenated. Rows with a
        ``transient_bytes`` column also calibrate memory. Each device type
        gets an :class:`OpTimeModel`, CPUs with ``size_curves=True``.
    transfers : DataFrame, optional
        Transfer measurements (``fddps.tf.comm_bench``): ``src``, ``dst``,
        ``bytes``, ``seconds``; each link is fitted with :class:`LinkModel`.
    base : CostModel, optional
        Presets and link rules to start from (default :func:`default_cost_model`).
    graph : str, optional
        Fingerprint of the profiled graph (``Profile.meta["graph"]``), checked by
        :meth:`CostModel.load` and :meth:`CostModel.check_graph`.
    links : mapping, optional
        Link rules to add to or replace the base's.
    transfer_cpu : DataFrame, optional
        What one more concurrent transfer costs each end of a measured link
        (``fddps.tf.comm_bench.fit_transfer_cpu``: ``src``, ``dst``,
        ``cpu_latency``, ``cpu_bandwidth``); kept on the pair's link
        (:meth:`CostModel.transfer_cpu`). Rows whose cost does not grow with
        the bytes (``cpu_bandwidth`` inf) or the count are left out.

    Returns
    -------
    CostModel

    Raises
    ------
    CostModelError
        On measurements of a device type the base has no preset for, or
        measurements that cannot be fitted.
    """
    base = default_cost_model() if base is None else base
    compute = dict(base.compute)
    transient = base.transient
    if measured is not None:
        frames = [measured] if isinstance(measured, pd.DataFrame) else list(measured)
        frame = pd.concat(frames, ignore_index=True)
        if "device_type" not in frame.columns:
            raise CostModelError("measured op times need a 'device_type' column (Profile.join adds it)")
        for dtype, rows in frame.groupby(frame["device_type"].astype(str).str.upper()):
            compute[dtype] = OpTimeModel(base._preset(dtype), min_samples=min_samples,
                                         size_curves=dtype == "CPU").fit(rows)
        if "transient_bytes" in frame.columns:
            from .memory import measured_transient

            transient = measured_transient(frame)
    pair_links = dict(base.pair_links)
    if transfers is not None:
        pair_links.update(LinkModel().fit(transfers).pair_links())
    for r in ([] if transfer_cpu is None else transfer_cpu.itertuples()):
        if not (np.isfinite(r.cpu_latency) and np.isfinite(r.cpu_bandwidth)):
            continue
        key = (str(parse_device(r.src)), str(parse_device(r.dst)))
        if key not in pair_links:
            raise CostModelError(f"transfer_cpu names the link {r.src!r} -> {r.dst!r}, which "
                                 "was not measured (give its transfers too)")
        pair_links[key] = dataclasses.replace(pair_links[key], cpu_latency=float(r.cpu_latency),
                                              cpu_bandwidth=float(r.cpu_bandwidth))
    rules = dict(base.links)
    rules.update(links or {})
    return CostModel(base.devices, rules, pair_links=pair_links, compute=compute,
                     transient=transient, graph=graph if graph is not None else base.graph,
                     meta={**base.meta, "kind": "fitted", **(meta or {})})
