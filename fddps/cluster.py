"""The cluster: devices with a type, speed and memory, and the links between them.

A transfer of ``b`` bytes from device ``k`` to device ``l`` costs
``latency[k, l] + b / bandwidth[k, l]`` seconds, and nothing when ``k == l``.
Links are contention-free, as in the DAG-scheduling literature the algorithms
come from (HEFT, DCP, ETF). Where devices move tensors themselves (CPU
devices over gRPC), ``transfer_compute`` says what fraction of a transfer's
time its two end devices spend on it; the simulator then charges that time to
them (:mod:`fddps.simulate`), so many small transfers slow the devices down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ClusterError


@dataclass(frozen=True)
class Device:
    """One device.

    Attributes
    ----------
    name : str
        Unique name (a TensorFlow device string for real placements).
    type : str
        Device type; selects the op cost column (``"GPU"``, ``"CPU"``, ...).
    speed : float
        Relative speed: an op of cost ``c`` takes ``c / speed`` seconds here.
    memory : float
        Capacity in bytes (``inf``: unbounded).
    host : str
        Host the device sits on; links between hosts may be slower.
    """

    name: str
    type: str = "device"
    speed: float = 1.0
    memory: float = float("inf")
    host: str = "0"


class Cluster:
    """Devices and the links between them.

    Parameters
    ----------
    devices : sequence of Device
    bandwidth : float or array-like (m, m)
        Bytes per second of each link (``inf``: transfers cost only latency).
    latency : float or array-like (m, m)
        Seconds per transfer on each link.
    transfer_compute : float or array-like (m, m)
        Fraction (0 to 1) of a transfer's time that its end devices spend on it,
        half each, and cannot compute meanwhile: 0 where copy engines move the
        data (GPUs, the default), 1 for CPU devices that serialise, copy and
        parse each tensor themselves (TensorFlow tasks talking gRPC).

    Raises
    ------
    ClusterError
        On no devices, duplicate names, a non-positive speed, a negative memory,
        a link with a negative latency or non-positive bandwidth, or a
        ``transfer_compute`` outside [0, 1].

    Examples
    --------
    >>> c = Cluster.homogeneous(2, bandwidth=1e9, latency=1e-5)
    >>> c.transfer_time(1e6, 0, 1)
    0.00101
    >>> c.transfer_time(1e6, 1, 1)
    0.0
    """

    def __init__(self, devices: Sequence[Device], bandwidth=float("inf"), latency=0.0,
                 transfer_compute=0.0):
        self.devices = tuple(devices)
        m = len(self.devices)
        if m == 0:
            raise ClusterError("the cluster has no devices")
        self.names = tuple(d.name for d in self.devices)
        self.index = {name: k for k, name in enumerate(self.names)}
        if len(self.index) != m:
            raise ClusterError(f"device names must be unique, got {list(self.names)}")
        for d in self.devices:
            if not (d.speed > 0 and np.isfinite(d.speed)):
                raise ClusterError(f"device {d.name!r} has an invalid speed {d.speed!r}")
            if not d.memory >= 0:
                raise ClusterError(f"device {d.name!r} has an invalid memory {d.memory!r}")
        self.bandwidth = self._matrix(bandwidth, "bandwidth")
        self.latency = self._matrix(latency, "latency")
        off = ~np.eye(m, dtype=bool)
        if np.any(~(self.bandwidth[off] > 0)):
            raise ClusterError("every link needs a bandwidth > 0")
        if np.any(~(self.latency[off] >= 0)) or np.any(np.isinf(self.latency[off])):
            raise ClusterError("every link needs a finite latency >= 0")
        self.transfer_compute = self._matrix(transfer_compute, "transfer_compute")
        if np.any(~((self.transfer_compute >= 0) & (self.transfer_compute <= 1))):
            raise ClusterError("transfer_compute must lie between 0 and 1 on every link")
        np.fill_diagonal(self.latency, 0.0)
        np.fill_diagonal(self.bandwidth, np.inf)
        np.fill_diagonal(self.transfer_compute, 0.0)
        self.inv_bandwidth = 1.0 / self.bandwidth
        self.memory = np.array([d.memory for d in self.devices], dtype=np.float64)
        self.speed = np.array([d.speed for d in self.devices], dtype=np.float64)
        for arr in (self.bandwidth, self.latency, self.inv_bandwidth, self.memory, self.speed,
                    self.transfer_compute):
            arr.setflags(write=False)

    def _matrix(self, value, what):
        m = len(self.devices)
        arr = np.array(value, dtype=np.float64)
        if arr.ndim == 0:
            return np.full((m, m), float(arr))
        if arr.shape != (m, m):
            raise ClusterError(f"{what} must be a number or an {m}x{m} matrix, got shape {arr.shape}")
        return arr.copy()

    # -- constructors ------------------------------------------------------------
    @classmethod
    def homogeneous(cls, n: int, *, bandwidth=float("inf"), latency=0.0, memory=None,
                    names: Sequence[str] | None = None, type: str = "device",
                    speed: float = 1.0) -> "Cluster":
        """``n`` identical devices on one host, fully connected by identical links.

        Device names are ``"0" .. "n-1"`` unless ``names`` are given; ``memory``
        is each device's capacity in bytes (default unbounded).
        """
        if n < 1:
            raise ClusterError(f"a cluster needs at least one device, got n={n}")
        names = [str(k) for k in range(n)] if names is None else list(names)
        if len(names) != n:
            raise ClusterError(f"{n} devices but {len(names)} names")
        mem = float("inf") if memory is None else float(memory)
        devices = [Device(name, type=type, speed=speed, memory=mem) for name in names]
        return cls(devices, bandwidth=bandwidth, latency=latency)

    @classmethod
    def multi_host(cls, hosts: int, devices_per_host: int, *, intra_bandwidth, inter_bandwidth,
                   intra_latency=0.0, inter_latency=0.0, memory=None, type: str = "device",
                   speed: float = 1.0, names: Sequence[str] | None = None) -> "Cluster":
        """``hosts`` hosts of ``devices_per_host`` devices each.

        Links inside a host use ``intra_*``, links between hosts ``inter_*``.
        Default names are TensorFlow-style ``/job:worker/task:H/device:<type>:i``.
        """
        if hosts < 1 or devices_per_host < 1:
            raise ClusterError("a cluster needs at least one host with one device")
        mem = float("inf") if memory is None else float(memory)
        total = hosts * devices_per_host
        if names is None:
            names = [f"/job:worker/task:{h}/device:{type}:{i}"
                     for h in range(hosts) for i in range(devices_per_host)]
        if len(names) != total:
            raise ClusterError(f"{total} devices but {len(names)} names")
        host_of = np.repeat(np.arange(hosts), devices_per_host)
        devices = [Device(names[k], type=type, speed=speed, memory=mem, host=str(host_of[k]))
                   for k in range(total)]
        same = host_of[:, None] == host_of[None, :]
        bw = np.where(same, intra_bandwidth, inter_bandwidth)
        lat = np.where(same, intra_latency, inter_latency)
        return cls(devices, bandwidth=bw, latency=lat)

    @classmethod
    def from_links(cls, devices: Sequence[Device], link, transfer_compute=None) -> "Cluster":
        """Devices whose link from ``a`` to ``b`` is ``link(a.name, b.name) -> (latency, bandwidth)``.

        How a cost model turns its per-pair link figures into a cluster.
        ``transfer_compute`` defaults to 1 between two devices of type
        ``"CPU"`` (they serialise, copy and parse tensors on the cores they
        compute on) and 0 otherwise (GPUs' copy engines move the data).
        """
        if transfer_compute is None:
            is_cpu = np.array([d.type.upper() == "CPU" for d in devices])
            transfer_compute = np.outer(is_cpu, is_cpu).astype(np.float64)
        devices = list(devices)
        m = len(devices)
        lat, bw = np.zeros((m, m)), np.full((m, m), np.inf)
        for i in range(m):
            for j in range(m):
                if i != j:
                    lat[i, j], bw[i, j] = link(devices[i].name, devices[j].name)
        return cls(devices, bandwidth=bw, latency=lat, transfer_compute=transfer_compute)

    # -- queries -------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def __len__(self):
        return len(self.devices)

    def __repr__(self):
        types = sorted({d.type for d in self.devices})
        hosts = len({d.host for d in self.devices})
        return f"Cluster({self.num_devices} devices of type {types} on {hosts} host(s))"

    def device_index(self, name) -> int:
        """Index of the device called ``name`` (an int index is returned as is).

        Raises
        ------
        ClusterError
            If no device has that name.
        """
        if isinstance(name, (int, np.integer)) and 0 <= name < self.num_devices:
            return int(name)
        try:
            return self.index[name]
        except KeyError:
            raise ClusterError(f"unknown device {name!r}; the cluster has {list(self.names)}") from None

    def transfer_time(self, nbytes: float, src: int, dst: int) -> float:
        """Seconds to move ``nbytes`` from device index ``src`` to ``dst``."""
        if src == dst:
            return 0.0
        return float(self.latency[src, dst] + nbytes * self.inv_bandwidth[src, dst])

    def mean_transfer_time(self, nbytes):
        """Mean transfer time over all ordered pairs of distinct devices.

        The estimate list schedulers use for an edge whose ends are not yet placed
        (HEFT's mean communication cost). 0 on a single-device cluster.
        ``nbytes`` may be an array.
        """
        m = self.num_devices
        if m == 1:
            return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
        off = ~np.eye(m, dtype=bool)
        lat = self.latency[off].mean()
        inv_bw = self.inv_bandwidth[off].mean()
        return lat + np.asarray(nbytes, dtype=np.float64) * inv_bw
