"""The cost model fddps schedules by: op times, link times and op memory.

A :class:`CostModel` answers four questions:

- :meth:`CostModel.op_times`: seconds each op of an op table takes on a device type;
- :meth:`CostModel.link` / :meth:`CostModel.transfer_time`: what moving bytes
  between two devices costs;
- :meth:`CostModel.memory`: the persistent and transient bytes of each op;
- :meth:`CostModel.device_memory`: a device type's capacity.

It is built from parts, each replaceable:

- one :class:`~costmodel.hardware.DevicePreset` per device type (the analytic
  roofline model, used for every op when nothing was profiled);
- optionally, per device type, an :class:`~costmodel.regression.OpTimeModel`
  fitted to a profile (measured times by op name, and per-op-type linear
  regressions on FLOPs and bytes for ops not profiled or profiled at another
  batch size; the calibrated preset for op types never seen);
- link rules: a :class:`~costmodel.hardware.LinkPreset` per kind of link
  (same host or across hosts, by the two device types), and measured links per
  device pair (fitted by :func:`costmodel.regression.fit_links`);
- optionally, transient bytes measured per op (``memory_stats``).

The model is saved to and loaded from a human-readable JSON file.

Example
-------
>>> import pandas as pd
>>> cm = default_cost_model()
>>> ops = pd.DataFrame({"name": ["mm"], "op_type": ["MatMul"], "flops": [2e9],
...                     "input_bytes": [8e6], "output_bytes": [4e6], "param_bytes": [0]})
>>> cm.op_times(ops, "GPU") > 0
array([ True])
>>> cm.transfer_time(0, "/device:GPU:0", "/device:GPU:0")
0.0
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .devices import parse_device
from .errors import CostModelError, ProfileError, ProfileMismatchError, check_file_format
from .hardware import DevicePreset, LinkPreset, device_preset, link_preset, presets

FORMAT = "fddps.costmodel"
VERSION = 1

#: Link rules of the default model. Keys are ``"<scope>:<types>"`` with scope
#: ``same_host`` or ``cross_host`` and types the two device types sorted and
#: joined by ``-`` (or ``*`` for any).
DEFAULT_LINK_RULES = {
    "same_host:GPU-GPU": "pcie3",   # the paper's server: 8 x P100 PCIe
    "same_host:CPU-GPU": "pcie3",
    "same_host:CPU-CPU": "host-memory",
    "same_host:*": "pcie3",
    "cross_host:*": "10gbe",
}


class ProfileCoverageWarning(UserWarning):
    """Some ops had no measured time and were estimated (see :attr:`CostModel.last_report`)."""


@dataclass
class OpTimeReport:
    """Where the times of the last :meth:`CostModel.op_times` call came from.

    Attributes
    ----------
    device_type : str
    counts : dict
        Rows per source: ``"profile"`` (measured, same shapes), ``"profile-scaled"``
        (measured at other shapes, scaled by the regression), ``"regression"``
        (per-op-type fit), ``"fallback"`` (op type never profiled: calibrated
        preset), ``"analytic"`` (no profile for this device type: preset).
    fallback_ops : list of str
        Names of the ops that were not profiled and whose type never was.
    """

    device_type: str
    counts: dict = field(default_factory=dict)
    fallback_ops: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return int(sum(self.counts.values()))

    @property
    def coverage(self) -> float:
        """Fraction of rows that had a measured time (scaled or not)."""
        n = self.total
        measured = self.counts.get("profile", 0) + self.counts.get("profile-scaled", 0)
        return measured / n if n else 1.0


def graph_fingerprint(ops: pd.DataFrame) -> str:
    """A hash of an op table's ``(name, op_type)`` pairs, independent of shapes.

    Two op tables of the same graph built at different batch sizes have the
    same fingerprint; a different graph has another.
    """
    if "name" not in ops.columns or "op_type" not in ops.columns:
        raise CostModelError("the op table needs 'name' and 'op_type' columns")
    lines = sorted(f"{n}\t{t}" for n, t in zip(ops["name"].astype(str), ops["op_type"].astype(str)))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _link_key(src_type: str, dst_type: str, same_host: bool) -> str:
    scope = "same_host" if same_host else "cross_host"
    return f"{scope}:{'-'.join(sorted((src_type, dst_type)))}"


def _json_number(x):
    """JSON has no infinity: store it as null."""
    x = float(x)
    return None if math.isinf(x) else x


class CostModel:
    """Op times, link times and op memory for fddps.

    Parameters
    ----------
    devices : mapping of device type -> DevicePreset or preset name
        The analytic model of each device type (``{"CPU": "cpu", "GPU": "p100"}``).
    links : mapping of rule -> LinkPreset, preset name or (latency, bandwidth)
        Link rules (see :data:`DEFAULT_LINK_RULES`): ``"same_host:GPU-GPU"``,
        ``"same_host:*"``, ``"cross_host:*"``, ...
    pair_links : mapping of (src, dst) -> LinkPreset or (latency, bandwidth), optional
        Measured links between two named devices; they win over the rules. A
        pair measured in one direction also serves the other.
    compute : mapping of device type -> OpTimeModel, optional
        Models fitted to profiles (see :mod:`costmodel.regression`).
    transient : pandas.DataFrame, optional
        Measured transient bytes: columns ``name``, ``output_bytes`` (at
        profiling time) and ``transient_bytes``.
    graph : str, optional
        :func:`graph_fingerprint` of the graph the profiles were taken on.
    meta : dict, optional
        Free-form description (how and when the profile was taken), saved as is.

    Raises
    ------
    CostModelError
        On an unknown preset name, or a device preset filed under another type.
    """

    def __init__(self, devices: Mapping, links: Mapping | None = None, *,
                 pair_links: Mapping | None = None, compute: Mapping | None = None,
                 transient: pd.DataFrame | None = None, graph: str | None = None,
                 meta: Mapping | None = None):
        self.devices = {}
        for dtype, spec in devices.items():
            preset = device_preset(spec)
            if preset.device_type.upper() != str(dtype).upper():
                raise CostModelError(f"preset {preset.name!r} models {preset.device_type} devices, "
                                     f"not {dtype!r}")
            self.devices[str(dtype).upper()] = preset
        if not self.devices:
            raise CostModelError("a cost model needs at least one device type")
        self.links = {rule: link_preset(spec)
                      for rule, spec in (DEFAULT_LINK_RULES if links is None else links).items()}
        self.pair_links = {}
        for (src, dst), spec in (pair_links or {}).items():
            self.pair_links[str(parse_device(src)), str(parse_device(dst))] = link_preset(spec)
        self.compute = {str(k).upper(): v for k, v in (compute or {}).items()}
        self.transient = None if transient is None else transient.reset_index(drop=True).copy()
        self.graph = graph
        self.meta = dict(meta or {})
        self.last_report: OpTimeReport | None = None

    def __repr__(self):
        dev = {t: p.name for t, p in self.devices.items()}
        return (f"CostModel(devices={dev}, profiled={sorted(self.compute)}, "
                f"links={len(self.links)} rules + {len(self.pair_links)} measured pairs)")

    # -- compute -----------------------------------------------------------------------
    def _preset(self, device_type: str) -> DevicePreset:
        try:
            return self.devices[str(device_type).upper()]
        except KeyError:
            raise CostModelError(f"the cost model knows no device type {device_type!r}; "
                                 f"it has {sorted(self.devices)}") from None

    def op_times(self, ops: pd.DataFrame, device_type: str) -> np.ndarray:
        """Seconds each row of ``ops`` takes on a device of ``device_type``.

        Parameters
        ----------
        ops : pandas.DataFrame
            An op table (``fddps.tf.op_table``): ``name``, ``op_type``, ``flops``,
            ``input_bytes``, ``output_bytes``; optionally ``kernel_shape`` (the GPU
            presets' kernel model reads a convolution's or MatMul's shape there:
            :meth:`~costmodel.hardware.DevicePreset.op_times`).
        device_type : str
            ``"CPU"``, ``"GPU"``, ... (case-insensitive).

        Returns
        -------
        numpy.ndarray of float, one finite time >= 0 per row. Whether an op can
        run on the type at all is the TF adapter's decision, not this model's.

        Where each time came from is in :attr:`last_report`; when a profile
        exists for the type but some ops were never measured nor their type
        seen, a :class:`ProfileCoverageWarning` says how many fell back.

        Raises
        ------
        CostModelError
            For an unknown device type or a missing column.
        """
        preset = self._preset(device_type)
        dtype = str(device_type).upper()
        model = self.compute.get(dtype)
        if model is None:
            t = preset.op_times(ops)
            self.last_report = OpTimeReport(dtype, {"analytic": len(t)}, [])
            return t
        t, source = model.predict_with_source(ops)
        counts = pd.Series(source).value_counts().to_dict() if len(source) else {}
        fallback = np.flatnonzero(source == "fallback")
        names = ops["name"].astype(str).to_numpy() if "name" in ops.columns else np.arange(len(ops)).astype(str)
        self.last_report = OpTimeReport(dtype, {k: int(v) for k, v in counts.items()},
                                        names[fallback].tolist())
        if fallback.size:
            types = sorted(set(ops["op_type"].astype(str).to_numpy()[fallback]))
            warnings.warn(f"{fallback.size} of {len(t)} ops have op types never profiled on "
                          f"{dtype} ({', '.join(types[:8])}{', ...' if len(types) > 8 else ''}): "
                          f"their times come from the calibrated {preset.name!r} preset",
                          ProfileCoverageWarning, stacklevel=2)
        return t

    def times_read_names(self, device_type: str) -> bool:
        """Whether :meth:`op_times` on ``device_type`` can give two rows that differ only in
        ``name`` or ``profile_name`` different times: True where the type has a profile
        (its ops are matched to their measurements by name), False where the preset
        times every row from its other columns alone.

        Callers costing many rows alike but for their names (the DP's tables) cost
        each distinct row once where this is False.

        Raises
        ------
        CostModelError
            For an unknown device type.

        Examples
        --------
        >>> CostModel({"GPU": "p100"}).times_read_names("GPU")
        False
        """
        self._preset(device_type)
        return str(device_type).upper() in self.compute

    # -- links -------------------------------------------------------------------------
    def link(self, src: str, dst: str) -> tuple[float, float]:
        """``(latency_seconds, bandwidth_bytes_per_second)`` of the link from ``src`` to ``dst``.

        A measured pair (either direction) wins; otherwise the rule for the two
        device types (``same_host:CPU-GPU``), then the scope's ``*`` rule. The
        same device gives ``(0.0, inf)``.

        Raises
        ------
        CostModelError
            For an unreadable device name, or when no rule covers the pair.
        """
        a, b = parse_device(src), parse_device(dst)
        if a == b:
            return 0.0, math.inf
        key = (str(a), str(b))
        measured = self.pair_links.get(key) or self.pair_links.get(key[::-1])
        if measured is not None:
            return measured.latency, measured.bandwidth
        same = a.host == b.host
        for rule in (_link_key(a.type, b.type, same), ("same_host" if same else "cross_host") + ":*"):
            if rule in self.links:
                p = self.links[rule]
                return p.latency, p.bandwidth
        raise CostModelError(f"no link rule covers {src!r} -> {dst!r} "
                             f"(tried {_link_key(a.type, b.type, same)!r}; rules: {sorted(self.links)})")

    def transfer_cpu(self, src: str, dst: str):
        """``(cpu_latency, cpu_bandwidth)`` measured for the pair (either direction), or None.

        What each end spends on one more transfer while many are in flight
        (:class:`~costmodel.hardware.LinkPreset`); :meth:`cluster` and
        ``fddps.tf.make_cluster`` give it to the cluster (``transfer_cpu``).
        """
        a, b = parse_device(src), parse_device(dst)
        key = (str(a), str(b))
        p = self.pair_links.get(key) or self.pair_links.get(key[::-1])
        if p is None or p.cpu_latency is None:
            return None
        return p.cpu_latency, p.cpu_bandwidth

    def transfer_time(self, nbytes, src: str, dst: str):
        """Seconds to move ``nbytes`` (number or array) from ``src`` to ``dst``; 0 on one device."""
        lat, bw = self.link(src, dst)
        if lat == 0.0 and math.isinf(bw):
            return np.zeros_like(np.asarray(nbytes, dtype=np.float64)) if np.ndim(nbytes) else 0.0
        t = lat + np.asarray(nbytes, dtype=np.float64) / bw
        return float(t) if np.ndim(t) == 0 else t

    # -- memory ------------------------------------------------------------------------
    def memory(self, ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """``(persistent, transient)`` bytes of every row of ``ops``.

        Persistent: ``param_bytes`` (variables and optimizer slots are ops of
        their own in a training graph, each with its ``param_bytes``).
        Transient: ``output_bytes``, or, for ops whose memory was measured
        (:func:`costmodel.memory.measured_transient`), the measured bytes scaled
        by the ratio of output sizes (so a profile at one batch size serves another).

        Raises
        ------
        CostModelError
            If ``param_bytes`` or ``output_bytes`` is missing.
        """
        for col in ("param_bytes", "output_bytes"):
            if col not in ops.columns:
                raise CostModelError(f"the op table has no column {col!r} (needed for memory)")
        persistent = np.nan_to_num(ops["param_bytes"].to_numpy(dtype=np.float64), nan=0.0)
        transient = np.nan_to_num(ops["output_bytes"].to_numpy(dtype=np.float64), nan=0.0)
        if self.transient is not None and len(self.transient) and "name" in ops.columns:
            m = ops[["name"]].reset_index(drop=True).merge(
                self.transient, on="name", how="left", suffixes=("", "_profiled"))
            found = m["transient_bytes"].notna().to_numpy()
            prof_out = m["output_bytes"].to_numpy(dtype=np.float64)
            ratio = np.where(prof_out > 0, transient / np.where(prof_out > 0, prof_out, 1.0), 1.0)
            measured = m["transient_bytes"].to_numpy(dtype=np.float64) * ratio
            transient = np.where(found, np.maximum(transient, np.nan_to_num(measured)), transient)
        return np.maximum(persistent, 0.0), np.maximum(transient, 0.0)

    def device_memory(self, device_type: str) -> float:
        """Capacity in bytes of a device of ``device_type`` (from its preset)."""
        return float(self._preset(device_type).memory)

    # -- building a cluster ------------------------------------------------------------
    def cluster(self, devices: Sequence[str], memory=None):
        """A :class:`fddps.Cluster` of the named TensorFlow devices, with this model's links.

        Parameters
        ----------
        devices : sequence of str
            TensorFlow device names.
        memory : float or mapping of name -> bytes, optional
            Capacities; default :meth:`device_memory` of each device's type.

        Links between two CPU devices get ``transfer_compute = 1``: the devices
        spend the transfer's time on it themselves (:meth:`fddps.Cluster.from_links`),
        at most the CPU cost measured for the pair under many transfers at once
        (:meth:`transfer_cpu`).
        """
        from fddps.cluster import Cluster, Device

        names = list(devices)
        parsed = [parse_device(d) for d in names]
        out = []
        for name, p in zip(names, parsed):
            if isinstance(memory, Mapping):
                cap = memory.get(name, self.device_memory(p.type))
            else:
                cap = self.device_memory(p.type) if memory is None else float(memory)
            out.append(Device(name, type=p.type, memory=float(cap), host="/".join(map(str, p.host))))
        return Cluster.from_links(out, self.link, transfer_cpu=self.transfer_cpu)

    # -- checking the graph ------------------------------------------------------------
    def check_graph(self, ops: pd.DataFrame, path=None) -> None:
        """Raise if this model's profile was taken on another graph than ``ops``'.

        Passes when the model has no graph fingerprint (an analytic model).

        Raises
        ------
        ProfileMismatchError
            Naming the file (``path``) and a few ops of ``ops`` the profile never saw.
        """
        if self.graph is None or graph_fingerprint(ops) == self.graph:
            return
        where = f"profile {str(path)!r}" if path else "this cost model's profile"
        known = set()
        for model in self.compute.values():
            known.update(model.profiled_names())
        names = ops["name"].astype(str)
        unseen = [n for n in names if n not in known]
        detail = (f"; {len(unseen)} of its {len(names)} ops are not in the profile, e.g. "
                  f"{unseen[:3]}" if unseen else "; its op names or types differ")
        raise ProfileMismatchError(f"{where} was taken on another graph than the one given{detail}",
                                   path=path)

    # -- saving and loading ------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready description of the whole model (what :meth:`save` writes)."""
        return {
            "format": FORMAT, "version": VERSION, "graph": self.graph, "meta": self.meta,
            "devices": {t: p.to_dict() for t, p in self.devices.items()},
            "links": {rule: {**p.to_dict(), "bandwidth": _json_number(p.bandwidth)}
                      for rule, p in self.links.items()},
            "pair_links": [{"src": s, "dst": d, **p.to_dict(), "bandwidth": _json_number(p.bandwidth)}
                           for (s, d), p in self.pair_links.items()],
            "compute": {t: m.to_dict() for t, m in self.compute.items()},
            "transient": None if self.transient is None else self.transient.to_dict(orient="list"),
        }

    @classmethod
    def from_dict(cls, d: Mapping, path=None) -> "CostModel":
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        ProfileError
            If ``d`` is not a cost model of this format and version (``path`` is named).
        """
        where = check_file_format(d, FORMAT, VERSION, "cost model", path)
        try:
            def bw(x):
                return math.inf if x is None else float(x)

            devices = {t: DevicePreset.from_dict(p) for t, p in d["devices"].items()}
            links = {r: LinkPreset(**{**p, "bandwidth": bw(p["bandwidth"])}) for r, p in d["links"].items()}
            pairs = {(p["src"], p["dst"]): LinkPreset(p["name"], p["latency"], bw(p["bandwidth"]),
                                                      p.get("source", ""), p.get("cpu_latency"),
                                                      p.get("cpu_bandwidth"))
                     for p in d.get("pair_links", [])}
            compute = {}
            if d.get("compute"):
                from .regression import OpTimeModel

                compute = {t: OpTimeModel.from_dict(m) for t, m in d["compute"].items()}
            transient = d.get("transient")
            transient = None if transient is None else pd.DataFrame(transient)
            return cls(devices, links, pair_links=pairs, compute=compute, transient=transient,
                       graph=d.get("graph"), meta=d.get("meta"))
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ProfileError(f"{where} is a corrupt cost model ({type(err).__name__}: {err})",
                               path=path) from None

    def save(self, path) -> Path:
        """Write the model as indented JSON to ``path``; return the path.

        Floats are written with Python's shortest round-trip repr, so
        :meth:`load` gives back exactly the same numbers.
        """
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path, ops: pd.DataFrame | None = None) -> "CostModel":
        """Read a model written by :meth:`save`.

        Parameters
        ----------
        path : str or Path
        ops : pandas.DataFrame, optional
            The op table the model will be used on: checked against the graph
            the profile was taken on (see :meth:`check_graph`).

        Raises
        ------
        ProfileError
            If the file is missing, not JSON, or not a cost model (the file is named).
        ProfileMismatchError
            If ``ops`` is given and is another graph than the profiled one.
        """
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ProfileError(f"cannot read cost model file {str(path)!r}: {err.strerror}",
                               path=path) from None
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ProfileError(f"cost model file {str(path)!r} is not valid JSON ({err})",
                               path=path) from None
        model = cls.from_dict(d, path=path)
        if ops is not None:
            model.check_graph(ops, path=path)
        return model

    def __eq__(self, other):
        return isinstance(other, CostModel) and self.to_dict() == other.to_dict()


def default_cost_model(gpu="p100", cpu=None, *, links: Mapping | None = None,
                       calibrated: bool = True) -> CostModel:
    """The built-in cost model, used when nothing was profiled.

    CPU devices: this machine's CPU as calibrated on it by ``fddps calibrate``
    (:func:`costmodel.calibrate_cpu`) when its cache file exists, else the
    analytic preset (:func:`~costmodel.hardware.cpu_preset`, all cores); the
    model's ``meta["cpu_calibration"]`` is the cache file's path, or None.
    GPU devices: the NVIDIA P100 (the paper's GPU). Links:
    :data:`DEFAULT_LINK_RULES` (PCIe 3 inside a host, as in the paper's 8 x
    P100 server; 10 Gb Ethernet between hosts; shared memory between CPU
    devices of one process).

    Parameters
    ----------
    gpu : str or DevicePreset
        Preset for GPU devices (``"k80"``, ``"p100"``, ``"v100"``, ``"a100"``, ``"h100"``;
        ``"h100:fp32"``: with TF32 off).
    cpu : str or DevicePreset, optional
        Preset for CPU devices (default: the cached calibration, else ``presets["cpu"]``).
    links : mapping, optional
        Link rules replacing or adding to the defaults (``{"same_host:GPU-GPU": "nvlink"}``).
    calibrated : bool
        Look for the cached calibration when ``cpu`` is None (default True);
        False: the analytic preset.
    """
    rules = dict(DEFAULT_LINK_RULES)
    rules.update(links or {})
    path = None
    if cpu is None and calibrated:
        from .calibrate import cached_cpu_calibration, cached_cpu_calibration_path

        path = cached_cpu_calibration_path()
        cpu = cached_cpu_calibration() if path is not None else None
        path = None if cpu is None else str(path)
    return CostModel({"CPU": presets["cpu"] if cpu is None else cpu, "GPU": gpu}, rules,
                     meta={"kind": "analytic default", "cpu_calibration": path})
