"""Profiles: measured op times of one graph on one device type, and their averaging.

The paper's computation cost (Definition 3) is the iterated average of an
op's end minus start time over training steps. :func:`iterated_mean` is that
average made robust: it repeatedly drops samples far from the current centre
(more than ``k`` robust standard deviations, from the median absolute
deviation) and averages the rest, so one step disturbed by another process
does not move it.

A :class:`Profile` is what :func:`fddps.tf.profiling.profile` returns: one
row per op of the graph's training step, saying whether the op was timed, fused
into another op by Grappler (its share of the fused op's time), or never run
(constant-folded or pruned by Grappler: 0 seconds, and counted as such).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import ProfileError, ProfileMismatchError, check_file_format

#: Status of an op in a profile.
TIMED, FUSED, PRUNED = "timed", "fused", "pruned"
STATUSES = (TIMED, FUSED, PRUNED)
PROFILE_FORMAT = "fddps.profile"
PROFILE_VERSION = 1


def iterated_mean(samples, *, k: float = 3.0, floor: float = 0.5, max_iter: int = 10):
    """Robust iterated average of each row of ``samples``.

    Parameters
    ----------
    samples : array-like, shape (n, s) or (s,)
        Measurements (NaN: missing).
    k : float
        Samples further than ``k`` robust standard deviations from the centre
        are dropped; the centre is recomputed as the mean of the kept samples
        until the kept set stops changing.
    floor : float
        The robust standard deviation (1.4826 x the median absolute deviation)
        is at least ``floor`` x the centre. With the default 0.5 and ``k = 3``
        only samples beyond 2.5x the centre go: a step stalled by another
        process. Ordinary jitter, a few tens of percent on a busy machine,
        stays in the average, since every real step pays it too (dropping it
        would bias the mean low).

    Returns
    -------
    mean, std, kept : arrays of shape (n,) (scalars for 1-D input)
        Mean and standard deviation of the kept samples and their count
        (NaN mean where a row has no sample).

    Examples
    --------
    >>> mean, std, kept = iterated_mean([1.0, 1.1, 0.9, 1.0, 9.0])
    >>> round(float(mean), 3), int(kept)
    (1.0, 4)
    """
    x = np.asarray(samples, dtype=np.float64)
    one = x.ndim == 1
    x = np.atleast_2d(x)
    keep = np.isfinite(x)
    with np.errstate(all="ignore"), _no_warnings():
        centre = np.nanmedian(np.where(keep, x, np.nan), axis=1)
        for _ in range(max_iter):
            kept_x = np.where(keep, x, np.nan)
            mad = np.nanmedian(np.abs(kept_x - centre[:, None]), axis=1)
            scale = np.maximum(1.4826 * mad, floor * np.abs(centre))
            new_keep = np.isfinite(x) & (np.abs(x - centre[:, None]) <= k * scale[:, None])
            # A row whose samples all disagree keeps them all.
            empty = ~new_keep.any(axis=1)
            new_keep[empty] = np.isfinite(x[empty])
            if np.array_equal(new_keep, keep):
                break
            keep = new_keep
            centre = np.nanmean(np.where(keep, x, np.nan), axis=1)
        kept_x = np.where(keep, x, np.nan)
        mean = np.nanmean(kept_x, axis=1)
        std = np.nanstd(kept_x, axis=1)
    n = keep.sum(axis=1)
    return (mean[0], std[0], n[0]) if one else (mean, std, n)


class _no_warnings:
    """Silence numpy's 'mean of empty slice' for rows with no sample."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


@dataclass
class Profile:
    """Measured op times of one graph's training step on one device.

    Attributes
    ----------
    ops : pandas.DataFrame
        One row per op of the step (the fetches' fan-in in the GraphDef):
        ``name``, ``op_type`` (in the GraphDef), ``executed_type`` (what ran:
        ``_FusedConv2D``, ``_MklNativeConv2D``, ...), ``status`` (``timed``,
        ``fused``, ``pruned``), ``seconds`` (iterated mean over the steps; a fused
        op's share of its fused node; 0 for pruned), ``std``, ``samples``,
        ``fused_into`` (name of the node that ran it, for fused ops),
        ``transient_bytes`` (bytes the op allocated for outputs and temporaries,
        0 for one that returned an existing buffer such as a ``ReadVariableOp``;
        NaN if unknown).
    steps : pandas.DataFrame
        One row per measured step: ``step``, ``traced`` (bool), ``wall_seconds``;
        for traced steps also ``span_seconds`` (first op start to last op end,
        on the device where that is longest), ``idle_seconds`` (summed over
        devices: span minus the op times inside it), ``op_seconds`` (sum of the
        op times) and ``timed_nodes``.
    unmapped : list of str
        Names timed by TensorFlow that match no op of the GraphDef (Grappler's
        own nodes whose origin could not be found); their time is not in ``ops``.
    meta : dict
        ``device``, ``device_type``, ``graph`` (fingerprint), ``num_graph_ops``,
        ``steps``, ``warmup``, ``tensorflow``, and anything the caller adds.
    """

    ops: pd.DataFrame
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        {"step": [], "traced": [], "wall_seconds": []}))
    unmapped: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        missing = {"name", "op_type", "status", "seconds"} - set(self.ops.columns)
        if missing:
            raise ProfileError(f"a profile's op table needs columns {sorted(missing)}")
        bad = set(self.ops["status"]) - set(STATUSES)
        if bad:
            raise ProfileError(f"unknown op status {sorted(bad)} in profile (known: {STATUSES})")

    @property
    def device_type(self) -> str:
        return str(self.meta.get("device_type", "CPU")).upper()

    @property
    def counts(self) -> dict:
        """Ops per status, plus ``unmapped`` names and ``graph_ops`` in the whole GraphDef."""
        c = self.ops["status"].value_counts()
        out = {s: int(c.get(s, 0)) for s in STATUSES}
        out["unmapped"] = len(self.unmapped)
        out["graph_ops"] = int(self.meta.get("num_graph_ops", len(self.ops)))
        return out

    @property
    def coverage(self) -> float:
        """Ops with a measured time (timed or fused) / ops in the step.

        Pruned ops (constant-folded or removed by Grappler) never run, so
        their 0 is measured too; they are counted apart, in :attr:`counts`.
        """
        n = len(self.ops)
        return float(self.ops["status"].isin([TIMED, FUSED]).sum() / n) if n else 1.0

    def step_time(self, traced: bool = False) -> float:
        """Median wall time of the untraced (or traced) measured steps, in seconds."""
        sel = self.steps[self.steps["traced"].astype(bool) == traced]["wall_seconds"]
        return float(np.median(sel)) if len(sel) else float("nan")

    @property
    def dispatch_seconds(self) -> float:
        """Idle time per executed op inside a step: (span - sum of op times) / ops timed.

        With one inter-op thread a device runs one op at a time, so what a
        traced step's span holds beyond its op times is the executor's work
        between ops (scheduling, allocation); the median over traced steps,
        floored at 0, NaN when the steps carry no span. Meaningful for a
        one-device profile (on several, idle time also waits for transfers).
        """
        if "idle_seconds" not in self.steps.columns:
            return float("nan")
        t = self.steps[self.steps["traced"].astype(bool)]
        t = t[np.isfinite(t["idle_seconds"].astype(float)) & (t["timed_nodes"] > 0)]
        if t.empty:
            return float("nan")
        gap = t["idle_seconds"] / t["timed_nodes"]
        return max(0.0, float(np.median(gap)))

    @property
    def step_overhead_seconds(self) -> float:
        """What a step costs beyond its ops: median untraced wall time minus the sum
        of the op times, floored at 0 (NaN without untraced steps).

        It holds ``Session.run``'s set-up and tear-down (which grows with the
        graph), the executor's gaps between ops and what the averaging of op
        times leaves out. A one-device step is predicted as the sum of its op
        times plus this; it does not depend on the batch size.
        """
        wall = self.step_time(traced=False)
        if not np.isfinite(wall):
            return float("nan")
        return max(0.0, wall - float(self.ops["seconds"].sum()))

    def report(self) -> str:
        """A few lines saying what was measured and what could not be mapped."""
        c = self.counts
        lines = [
            f"profile of {len(self.ops)} step ops ({c['graph_ops']} in the GraphDef) on "
            f"{self.meta.get('device', self.device_type)}, {self.meta.get('steps', '?')} traced steps "
            f"after {self.meta.get('warmup', '?')} warm-up",
            f"  timed {c['timed']}, fused into another op {c['fused']}, never ran (folded/pruned by "
            f"Grappler) {c['pruned']}; coverage (timed+fused)/step ops = {self.coverage:.1%}",
            f"  sum of op times {self.ops['seconds'].sum() * 1e3:.2f} ms; median step "
            f"{self.step_time() * 1e3:.2f} ms untraced, {self.step_time(True) * 1e3:.2f} ms traced; "
            f"executor gap {self.dispatch_seconds * 1e6:.1f} us per op; step overhead "
            f"{self.step_overhead_seconds * 1e3:.2f} ms",
        ]
        if self.unmapped:
            lines.append(f"  {len(self.unmapped)} timed names not in the GraphDef: "
                         f"{', '.join(self.unmapped[:5])}{' ...' if len(self.unmapped) > 5 else ''}")
        return "\n".join(lines)

    def join(self, ops: pd.DataFrame) -> pd.DataFrame:
        """The op table rows of the profiled ops with the measured ``seconds`` and ``status``.

        Parameters
        ----------
        ops : pandas.DataFrame
            ``fddps.tf.op_table`` of the profiled GraphDef (same batch size).

        Returns
        -------
        pandas.DataFrame: the op table's columns plus ``seconds``, ``status``,
        ``transient_bytes`` and ``device_type``, one row per profiled op.

        Raises
        ------
        ProfileMismatchError
            If more than half of the profiled ops are not in ``ops`` (another graph).
        """
        keep = [c for c in ("name", "seconds", "status", "transient_bytes", "std", "samples")
                if c in self.ops.columns]
        table = ops.drop(columns=[c for c in keep if c != "name" and c in ops.columns])
        out = table.merge(self.ops[keep], on="name", how="inner")
        if len(out) < 0.5 * len(self.ops):
            missing = sorted(set(self.ops["name"]) - set(ops["name"].astype(str)))
            raise ProfileMismatchError(
                f"{len(missing)} of the {len(self.ops)} profiled ops are not in the op table given "
                f"(e.g. {missing[:3]}): it is another graph")
        out["device_type"] = self.device_type
        return out

    # -- saving and loading ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "meta": self.meta,
                "unmapped": list(self.unmapped),
                "ops": _frame_to_json(self.ops), "steps": _frame_to_json(self.steps)}

    @classmethod
    def from_dict(cls, d: Mapping, path=None) -> "Profile":
        where = check_file_format(d, PROFILE_FORMAT, PROFILE_VERSION, "profile", path)
        try:
            return cls(pd.DataFrame(d["ops"]), pd.DataFrame(d["steps"]), list(d["unmapped"]),
                       dict(d["meta"]))
        except ProfileError as err:
            raise ProfileError(f"{where}: {err}", path=path) from None
        except (KeyError, TypeError, ValueError) as err:
            raise ProfileError(f"{where} is a corrupt profile ({type(err).__name__}: {err})",
                               path=path) from None

    def save(self, path) -> Path:
        """Write the profile as JSON (floats round-trip exactly)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "Profile":
        """Read a profile written by :meth:`save`.

        Raises
        ------
        ProfileError
            If the file cannot be read, is not JSON, or is not a profile (the file is named).
        """
        try:
            d = json.loads(Path(path).read_text())
        except OSError as err:
            raise ProfileError(f"cannot read profile file {str(path)!r}: {err.strerror}", path=path) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ProfileError(f"profile file {str(path)!r} is not valid JSON ({err})", path=path) from None
        return cls.from_dict(d, path=path)


def _frame_to_json(df: pd.DataFrame) -> dict:
    """Column lists with NaN as null (JSON has no NaN)."""
    out = {}
    for c in df.columns:
        col = df[c]
        if col.dtype.kind == "f":
            out[c] = [None if not np.isfinite(v) else float(v) for v in col.to_numpy()]
        elif col.dtype.kind in "iu":
            out[c] = [int(v) for v in col.to_numpy()]
        elif col.dtype.kind == "b":
            out[c] = [bool(v) for v in col.to_numpy()]
        else:
            out[c] = [None if (v is None or (isinstance(v, float) and not np.isfinite(v))) else v
                      for v in col.tolist()]
    return out


def merge_profiles(profiles) -> Profile:
    """One profile from several profiles of the same graph on the same device type.

    Profiles taken in turns (a few steps at a time, alternating with other
    work) spread a machine's changing load over all of them. Each op's time is
    the :func:`iterated_mean` of its per-profile times; an op is ``timed`` if
    any profile timed it (``fused``, then ``pruned`` otherwise); ``samples``
    add up; steps are concatenated and renumbered.

    Raises
    ------
    ProfileMismatchError
        If the profiles come from different graphs or device types.
    ProfileError
        If ``profiles`` is empty.
    """
    profiles = list(profiles)
    if not profiles:
        raise ProfileError("merge_profiles needs at least one profile")
    first = profiles[0]
    for p in profiles[1:]:
        if p.meta.get("graph") != first.meta.get("graph") or p.device_type != first.device_type:
            raise ProfileMismatchError("merge_profiles: the profiles come from different graphs or "
                                       f"device types ({first.device_type} vs {p.device_type})")
    ops = pd.concat([p.ops.assign(_k=k) for k, p in enumerate(profiles)], ignore_index=True)
    secs = ops.pivot_table(index="name", columns="_k", values="seconds", aggfunc="first")
    mean, std, _ = iterated_mean(secs.to_numpy())
    rank = {TIMED: 0, FUSED: 1, PRUNED: 2}
    best = (ops.assign(_r=ops["status"].map(rank)).sort_values(["name", "_r", "_k"], kind="stable")
            .drop_duplicates("name"))
    order = {n: i for i, n in enumerate(first.ops["name"])}
    best = best.assign(_o=best["name"].map(lambda n: order.get(n, len(order)))).sort_values("_o")
    merged = best.drop(columns=["_k", "_r", "_o"]).set_index("name")
    merged["seconds"] = pd.Series(mean, index=secs.index)
    merged["std"] = pd.Series(std, index=secs.index)
    if "samples" in ops.columns:
        merged["samples"] = ops.groupby("name")["samples"].sum()
    if "transient_bytes" in ops.columns:
        merged["transient_bytes"] = ops.groupby("name")["transient_bytes"].max()
    steps = []
    offset = 0
    for p in profiles:
        s = p.steps.copy()
        s["step"] = s["step"] + offset
        offset = int(s["step"].max()) + 1 if len(s) else offset
        steps.append(s)
    unmapped = sorted(set().union(*(p.unmapped for p in profiles)))
    meta = {**first.meta, "steps": int(sum(p.meta.get("steps", 0) for p in profiles)),
            "merged_profiles": len(profiles)}
    return Profile(merged.reset_index(), pd.concat(steps, ignore_index=True), unmapped, meta)
