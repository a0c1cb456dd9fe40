"""All-reduce as measured: a latency-bandwidth model per GPU system fitted to DeepBench.

DeepBench timed NCCL (and MPI / Baidu ring) all-reduces of 100 thousand to
64 million FP32 values over 2 to 32 GPUs of four systems (M40, TitanX,
TitanX Pascal, P100; its V100 and T4 rows have no times). Per system and
*scope* -- ``"node"``, the GPUs of one server (up to 8), or ``"cluster"``,
several servers (16 and 32 GPUs) -- :func:`fit_allreduce` fits each of

- ``"ring"``: ``2 (p - 1) / p * bytes / bandwidth + (p - 1) * latency`` (the
  bandwidth-optimal ring, one latency per step of each half),
- ``"tree"``: ``2 (p - 1) / p * bytes / bandwidth + 2 log2(p) * latency``
  (the latency of a tree, the ring's volume),

(a latency per step of both halves, ``2 (p - 1) * latency``, is the ring with half
the latency: the data cannot tell them apart), by non-negative least squares on the relative error (every row counts alike,
whatever its size), and keeps the one with the most rows within 20% of the
published mean (ties: the smaller median error). The fitted parameters are
committed as :data:`ALLREDUCE_FILE` (``python -m costmodel.allreduce --fit``)
and read by :func:`allreduce_seconds` / :func:`system_fit`.

Examples
--------
>>> fit = system_fit("p100")
>>> fit["model"] in MODELS and fit["bandwidth"] > 1e9
True
>>> round(allreduce_seconds(4 * 64.5e6, 8, fit) * 1e3)   # DeepBench: 76.6 ms
78
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CostModelError

#: The committed fit: one row per system and scope.
ALLREDUCE_FILE = Path(__file__).resolve().parent / "data" / "allreduce_fit.csv"
MODELS = ("ring", "tree")
#: GPUs of one server: DeepBench's single-node runs go up to 8.
NODE_GPUS = 8
#: Share within which a prediction counts as a hit.
TOLERANCE = 0.20


def scope_of(gpus) -> np.ndarray:
    """``"node"`` for up to :data:`NODE_GPUS` GPUs, else ``"cluster"``."""
    return np.where(np.asarray(gpus) <= NODE_GPUS, "node", "cluster")


def _terms(model: str, nbytes, p):
    nbytes, p = np.asarray(nbytes, dtype=float), np.asarray(p, dtype=float)
    volume = 2.0 * (p - 1.0) / p * nbytes
    steps = {"ring": p - 1.0, "tree": 2.0 * np.log2(np.maximum(p, 1.0))}
    if model not in steps:
        raise CostModelError(f"unknown all-reduce model {model!r}; models: {list(MODELS)}")
    return volume, steps[model]


def model_seconds(model: str, nbytes, p, bandwidth: float, latency: float) -> np.ndarray:
    """Seconds of an all-reduce of ``nbytes`` over ``p`` GPUs under ``model`` (0 for ``p <= 1``)."""
    volume, steps = _terms(model, nbytes, p)
    return np.where(np.asarray(p) > 1, volume / bandwidth + steps * latency, 0.0)


def fit_allreduce(rows: pd.DataFrame) -> pd.DataFrame:
    """Fit every model to every system and scope of ``rows``
    (:func:`costmodel.deepbench.load_allreduce`).

    Returns
    -------
    pandas.DataFrame
        One row per system (``gpu``), ``scope`` and ``model``: ``bandwidth``
        (bytes/s), ``latency`` (s), ``rows``, ``within`` (share within 20%),
        ``median_ratio``, ``median_abs_error``, ``chosen`` (the model kept for the
        system and scope).
    """
    from scipy.optimize import nnls

    rows = rows.assign(scope=scope_of(rows.gpus))
    out = []
    for (gpu, scope), d in rows.groupby(["gpu", "scope"], sort=True):
        t = d.seconds.to_numpy(float)
        for model in MODELS:
            volume, steps = _terms(model, d.bytes, d.gpus)
            (inv_bw, lat), _ = nnls(np.column_stack([volume / t, steps / t]), np.ones(len(t)))
            bw = 1.0 / inv_bw if inv_bw > 0 else np.inf
            ratio = model_seconds(model, d.bytes, d.gpus, bw, lat) / t
            out.append(dict(gpu=gpu, scope=scope, model=model, bandwidth=bw, latency=lat,
                            rows=len(d), within=float(np.mean(np.abs(ratio - 1) <= TOLERANCE)),
                            median_ratio=float(np.median(ratio)),
                            median_abs_error=float(np.median(np.abs(ratio - 1)))))
    fits = pd.DataFrame(out)
    best = (fits.sort_values(["within", "median_abs_error"], ascending=[False, True])
            .groupby(["gpu", "scope"]).head(1).index)
    fits["chosen"] = fits.index.isin(best)
    return fits


def predict(fits: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
    """Each row's (``gpu``, ``bytes``, ``gpus``) seconds under its system and scope's chosen model."""
    chosen = fits[fits.chosen].set_index(["gpu", "scope"])
    out = np.full(len(rows), np.nan)
    for i, (gpu, nbytes, p) in enumerate(zip(rows.gpu, rows.bytes, rows.gpus)):
        key = (gpu, str(scope_of(p)))
        if key in chosen.index:
            f = chosen.loc[key]
            out[i] = model_seconds(f.model, nbytes, p, f.bandwidth, f.latency)
    return out


@functools.lru_cache(maxsize=4)
def _load(path: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except OSError as e:
        raise CostModelError(f"all-reduce fit {path!r} cannot be read: {e.strerror}") from None


def load_fits(path=ALLREDUCE_FILE) -> pd.DataFrame:
    """The committed fits (:func:`fit_allreduce`'s table)."""
    return _load(str(Path(path))).copy()


def system_fit(gpu: str, gpus: int = 2, path=ALLREDUCE_FILE) -> dict:
    """The chosen fit of system ``gpu`` (``"p100"``, ...) for ``gpus`` GPUs (its scope).

    Raises
    ------
    CostModelError
        If the system (or that scope of it) was not fitted; the message lists the fitted ones.
    """
    fits = load_fits(path)
    fits = fits[fits.chosen.astype(bool)]
    scope = str(scope_of(gpus))
    hit = fits[(fits.gpu == gpu) & (fits.scope == scope)]
    if hit.empty:
        have = sorted(f"{g}/{s}" for g, s in zip(fits.gpu, fits.scope))
        raise CostModelError(f"no measured all-reduce fit for GPU system {gpu!r} at {gpus} GPUs "
                             f"(scope {scope!r}); fitted: {have}")
    return hit.iloc[0][["gpu", "scope", "model", "bandwidth", "latency"]].to_dict()


def allreduce_seconds(nbytes: float, gpus: int, fit: dict) -> float:
    """Seconds of an all-reduce of ``nbytes`` over ``gpus`` GPUs under a :func:`system_fit`."""
    if not nbytes >= 0:
        raise CostModelError(f"all-reduce bytes must be >= 0, got {nbytes!r}")
    return float(model_seconds(fit["model"], nbytes, int(gpus), fit["bandwidth"], fit["latency"]))


def main(argv=None) -> int:
    """``python -m costmodel.allreduce --fit [DIR]``: fit DeepBench's all-reduce times and write
    :data:`ALLREDUCE_FILE`; without ``--fit``, print the committed fits."""
    from .deepbench import load_allreduce

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--fit":
        fits = fit_allreduce(load_allreduce(argv[1] if len(argv) > 1 else None))
        fits.to_csv(ALLREDUCE_FILE, index=False, float_format="%.6g")
        _load.cache_clear()
        print(f"wrote {ALLREDUCE_FILE}")
    print(load_fits().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
