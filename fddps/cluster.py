"""The cluster: devices with a type, speed and memory, and the links between them.

A transfer of ``b`` bytes from device ``k`` to device ``l`` costs
``latency[k, l] + b / bandwidth[k, l]`` seconds, and nothing when ``k == l``.
Links are contention-free, as in the DAG-scheduling literature the algorithms
come from (HEFT, DCP, ETF). Where devices move tensors themselves (CPU
devices over gRPC), ``transfer_compute`` says what fraction of a transfer's
time its two end devices spend on it; the simulator then charges that time to
them (:mod:`fddps.simulate`), so many small transfers slow the devices down.

Shared hardware (both optional; without them the model above is exact):

- :class:`SharedCores`: devices that compute on the same physical cores (the
  CPU devices of one TensorFlow process share its intra-op thread pool and the
  host's cores). Each device's op times are for it running *alone* with its
  ``threads`` threads; when ops of several devices of the group run at once the
  simulator slows them down so that together they never use more than
  ``cores`` (processor sharing, :mod:`fddps.simulate`). With
  ``transfer_threads``, the devices' sends and receives run on a thread of
  their own beside the ops, sharing the same cores (a worker's gRPC threads).
- :class:`LinkResource`: a network interface, PCIe switch uplink or PCIe lane
  with a bandwidth, and the ordered device pairs whose transfers cross it
  (:mod:`fddps.topology` builds them for common machines). Transfers crossing
  one resource share its bandwidth in the simulator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class SharedCores:
    """Devices whose ops run on the same ``cores`` physical cores.

    Attributes
    ----------
    devices : tuple of str
        Names of the devices sharing the cores (at least one).
    cores : float
        Cores (hardware threads) the group has between its devices.
    threads : float or tuple of float
        Threads one op of a device uses when it runs alone (the cores its op
        times are for): one number for every device, or one per device. For
        the CPU devices of one TensorFlow process that is the intra-op thread
        pool they all share, usually ``cores`` itself.
    name : str
        What the cores are (for messages and summaries).
    transfer_threads : bool
        Whether the devices' compute-charged sends and receives
        (``Cluster.transfer_compute``) run on a thread of their own, one per
        device, that shares these cores with the ops, instead of in the
        device's queue of ops. So a TensorFlow worker's gRPC threads do:
        they encode and parse tensors while the worker's inter-op thread
        computes, and use a core the ops leave idle. Default False: the
        device does its transfers between its ops.
    """

    devices: tuple
    cores: float
    threads: object = None
    name: str = "cores"
    transfer_threads: bool = False

    def threads_of(self, k: int) -> float:
        """Threads the ``k``-th device of the group wants (default: all ``cores``)."""
        if self.threads is None:
            return float(self.cores)
        if isinstance(self.threads, (tuple, list)):
            return float(self.threads[k])
        return float(self.threads)


@dataclass(frozen=True)
class LinkResource:
    """Something transfers share: a network interface, a PCIe uplink, a lane.

    Attributes
    ----------
    name : str
    bandwidth : float
        Bytes per second the resource carries, all transfers through it together.
    pairs : frozenset of (str, str)
        Ordered ``(source device, destination device)`` names whose transfers
        cross this resource.
    source : str
        Where the bandwidth figure comes from.
    fifo : bool
        How transfers share it. False (default): its bandwidth is split
        equally among the transfers crossing it at once (a network interface,
        a PCIe lane). True: it carries one transfer at a time, whole, in the
        order the transfers became ready (first in, first out), so a small
        tensor waits behind a large one sent before it: one gRPC channel
        between two TensorFlow tasks, which ships the tensors of its
        ``RecvTensor`` responses one after another.
    """

    name: str
    bandwidth: float
    pairs: frozenset = field(default_factory=frozenset)
    source: str = ""
    fifo: bool = False


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
    shared_cores : sequence of SharedCores
        Groups of devices computing on the same cores (a device in one group
        at most). Default none: every device has cores of its own.
    link_resources : sequence of LinkResource
        Resources transfers share (network interfaces, PCIe uplinks). Default
        none: links are contention-free.
    transfer_cpu : pair of (float or array-like (m, m)), optional
        ``(cpu_latency, cpu_bandwidth)``: what each end device of a
        compute-charged link (``transfer_compute > 0``) spends on a transfer of
        ``b`` bytes, ``cpu_latency + b / cpu_bandwidth`` seconds (NaN on a link
        not measured: ``T / 2``), as fitted on
        many transfers at once (:func:`fddps.tf.comm_bench.fit_transfer_cpu`):
        gRPC overlaps the waiting of concurrent transfers, so a small one
        costs the tasks far less than its one-at-a-time ``T``. The end devices
        then spend ``min(T / 2, cpu_latency + b / cpu_bandwidth)`` each (times
        ``transfer_compute``) and the wire the rest of ``T``
        (:meth:`transfer_share`). Default None: ``transfer_compute * T / 2`` each.

    Raises
    ------
    ClusterError
        On no devices, duplicate names, a non-positive speed, a negative memory,
        a link with a negative latency or non-positive bandwidth, a
        ``transfer_compute`` outside [0, 1], a ``transfer_cpu`` latency < 0 or
        bandwidth <= 0; a shared group or resource naming an unknown device, a
        device in two groups, or a capacity <= 0.

    Examples
    --------
    >>> c = Cluster.homogeneous(2, bandwidth=1e9, latency=1e-5)
    >>> c.transfer_time(1e6, 0, 1)
    0.00101
    >>> c.transfer_time(1e6, 1, 1)
    0.0
    """

    def __init__(self, devices: Sequence[Device], bandwidth=float("inf"), latency=0.0,
                 transfer_compute=0.0, shared_cores=(), link_resources=(), transfer_cpu=None):
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
        self.transfer_cpu = None
        if transfer_cpu is not None:
            try:
                cpu_lat, cpu_bw = transfer_cpu
            except (TypeError, ValueError):
                raise ClusterError("transfer_cpu must be a pair (cpu_latency, cpu_bandwidth), "
                                   f"got {transfer_cpu!r}") from None
            cpu_lat = self._matrix(cpu_lat, "transfer_cpu latency")
            cpu_bw = self._matrix(cpu_bw, "transfer_cpu bandwidth")
            fitted = ~np.isnan(cpu_lat) & ~np.isnan(cpu_bw)
            if np.any((np.isnan(cpu_lat) != np.isnan(cpu_bw))[off]):
                raise ClusterError("transfer_cpu: a link has a cpu_latency or a cpu_bandwidth, "
                                   "not both")
            if np.any(~(cpu_lat[off & fitted] >= 0)) or np.any(np.isinf(cpu_lat[off & fitted])):
                raise ClusterError("transfer_cpu needs a finite cpu_latency >= 0 on every link")
            if np.any(~(cpu_bw[off & fitted] > 0)):
                raise ClusterError("transfer_cpu needs a cpu_bandwidth > 0 on every link")
            np.fill_diagonal(cpu_lat, 0.0)
            np.fill_diagonal(cpu_bw, np.inf)
            for arr in (cpu_lat, cpu_bw):
                arr.setflags(write=False)
            self.transfer_cpu = (cpu_lat, cpu_bw)
        self.memory = np.array([d.memory for d in self.devices], dtype=np.float64)
        self.speed = np.array([d.speed for d in self.devices], dtype=np.float64)
        self._set_sharing(tuple(shared_cores), tuple(link_resources))
        for arr in (self.bandwidth, self.latency, self.inv_bandwidth, self.memory, self.speed,
                    self.transfer_compute, self.core_group, self.threads, self.slowdown,
                    self.transfer_thread):
            arr.setflags(write=False)

    def _set_sharing(self, shared_cores, link_resources):
        """Check the shared groups and resources; index them by device (see attributes)."""
        m = len(self.devices)
        self.shared_cores, self.link_resources = shared_cores, link_resources
        self.core_group = np.full(m, -1, dtype=np.int64)
        self.threads = np.zeros(m)
        self.transfer_thread = np.zeros(m, dtype=bool)
        self.group_cores = []
        for g, grp in enumerate(shared_cores):
            if not isinstance(grp, SharedCores):
                raise ClusterError(f"shared_cores must hold SharedCores, got {type(grp).__name__}")
            if not (grp.cores > 0 and np.isfinite(grp.cores)) or not grp.devices:
                raise ClusterError(f"shared cores {grp.name!r} need devices and cores > 0, got "
                                   f"{len(grp.devices)} devices and {grp.cores!r} cores")
            for j, name in enumerate(grp.devices):
                k = self.device_index(name)
                if self.core_group[k] >= 0:
                    raise ClusterError(f"device {name!r} is in two groups of shared cores")
                t = grp.threads_of(j)
                if not (t > 0 and np.isfinite(t)):
                    raise ClusterError(f"device {name!r} of shared cores {grp.name!r} wants "
                                       f"{t!r} threads; need a number > 0")
                self.core_group[k], self.threads[k] = g, t
                self.transfer_thread[k] = bool(grp.transfer_threads)
            self.group_cores.append(float(grp.cores))
        # What a list scheduler charges: every device of a group busy at once
        # gets its share of the cores (>= 1: a device alone is never faster).
        demand = np.bincount(self.core_group[self.core_group >= 0],
                             weights=self.threads[self.core_group >= 0],
                             minlength=len(shared_cores))
        self.slowdown = np.ones(m)
        grouped = self.core_group >= 0
        cores = np.asarray(self.group_cores, dtype=np.float64)
        self.slowdown[grouped] = np.maximum(1.0, demand[self.core_group[grouped]]
                                            / cores[self.core_group[grouped]])
        self.link_path = [[() for _ in range(m)] for _ in range(m)]
        for r, res in enumerate(link_resources):
            if not isinstance(res, LinkResource):
                raise ClusterError(f"link_resources must hold LinkResource, got {type(res).__name__}")
            if not (res.bandwidth > 0):
                raise ClusterError(f"link resource {res.name!r} needs a bandwidth > 0, "
                                   f"got {res.bandwidth!r}")
            for a, b in res.pairs:
                i, j = self.device_index(a), self.device_index(b)
                if i != j:
                    self.link_path[i][j] = self.link_path[i][j] + (r,)
        self.resource_bandwidth = np.array([r.bandwidth for r in link_resources], dtype=np.float64)
        self.resource_fifo = np.array([bool(r.fifo) for r in link_resources], dtype=bool)

    @property
    def shares_cores(self) -> bool:
        """Whether some devices compute on the same cores (:class:`SharedCores`)."""
        return bool(self.shared_cores)

    @property
    def shares_links(self) -> bool:
        """Whether transfers share resources (:class:`LinkResource` crossed by some pair)."""
        return any(any(row) for row in self.link_path)

    @property
    def shares_hardware(self) -> bool:
        """Whether the simulator must model contention (shared cores or links)."""
        return self.shares_cores or self.shares_links

    def with_sharing(self, shared_cores=None, link_resources=None) -> "Cluster":
        """This cluster with other shared groups and/or resources (``None``: keep these).

        Examples
        --------
        >>> c = Cluster.homogeneous(2, names=["a", "b"])
        >>> c.with_sharing([SharedCores(("a", "b"), cores=2)]).slowdown.tolist()
        [2.0, 2.0]
        """
        return self.replace(
            shared_cores=self.shared_cores if shared_cores is None else shared_cores,
            link_resources=self.link_resources if link_resources is None else link_resources)

    def replace(self, **changes) -> "Cluster":
        """A new cluster with the given constructor arguments changed, the others this one's.

        Examples
        --------
        >>> c = Cluster.homogeneous(2, bandwidth=1e9)
        >>> c.replace(latency=1e-5).transfer_time(0.0, 0, 1)
        1e-05
        """
        fields = dict(devices=self.devices, bandwidth=self.bandwidth, latency=self.latency,
                      transfer_compute=self.transfer_compute, shared_cores=self.shared_cores,
                      link_resources=self.link_resources, transfer_cpu=self.transfer_cpu)
        unknown = set(changes) - set(fields)
        if unknown:
            raise ClusterError(f"Cluster has no argument {sorted(unknown)[0]!r}; it takes "
                               f"{', '.join(fields)}")
        fields.update(changes)
        return Cluster(**fields)

    def subset(self, names) -> "Cluster":
        """The cluster of the named devices only: their links, and the shared
        groups and resources restricted to them (a group or resource left with
        no device or no pair is dropped).

        Raises
        ------
        ClusterError
            For an unknown name, or none.

        Examples
        --------
        >>> c = Cluster.multi_host(2, 2, intra_bandwidth=12e9, inter_bandwidth=1e9, topology="10gbe")
        >>> sub = c.subset(["/job:worker/task:0/device:device:0", "/job:worker/task:0/device:device:1"])
        >>> sub.num_devices, sub.shares_links, float(sub.bandwidth[0, 1])
        (2, False, 12000000000.0)
        """
        names = list(names)
        if not names:
            raise ClusterError("a subset of a cluster needs at least one device")
        idx = np.array([self.device_index(n) for n in names], dtype=np.int64)
        keep = set(names)
        sub = np.ix_(idx, idx)
        groups = []
        for grp in self.shared_cores:
            members = [j for j, d in enumerate(grp.devices) if d in keep]
            if members:
                threads = (tuple(grp.threads[j] for j in members)
                           if isinstance(grp.threads, (tuple, list)) else grp.threads)
                groups.append(dataclasses.replace(grp, devices=tuple(grp.devices[j] for j in members),
                                                  threads=threads))
        resources = []
        for res in self.link_resources:
            pairs = frozenset((a, b) for a, b in res.pairs if a in keep and b in keep)
            if pairs:
                resources.append(dataclasses.replace(res, pairs=pairs))
        cpu = None if self.transfer_cpu is None else tuple(m[sub] for m in self.transfer_cpu)
        return Cluster([self.devices[k] for k in idx], bandwidth=self.bandwidth[sub],
                       latency=self.latency[sub], transfer_compute=self.transfer_compute[sub],
                       shared_cores=groups, link_resources=resources, transfer_cpu=cpu)

    def with_transfer_cpu(self, cpu_latency, cpu_bandwidth) -> "Cluster":
        """This cluster with a fitted per-transfer CPU cost (``transfer_cpu``); ``None, None`` drops it.

        Examples
        --------
        >>> c = Cluster.homogeneous(2, bandwidth=1e9, latency=1e-3)
        >>> c = Cluster(c.devices, c.bandwidth, c.latency, transfer_compute=1.0)
        >>> float(c.with_transfer_cpu(1e-4, 1e9).transfer_share(0, 1, 0.0))  # 2 x 0.1 of 1 ms
        0.2
        """
        cpu = None if cpu_latency is None and cpu_bandwidth is None else (cpu_latency, cpu_bandwidth)
        return self.replace(transfer_cpu=cpu)

    def transfer_share(self, src, dst, nbytes):
        """The share ``c`` of a transfer's time ``T`` its end devices spend on it (half each).

        ``transfer_compute[src, dst]``; with ``transfer_cpu``, at most
        ``2 * (cpu_latency + nbytes / cpu_bandwidth) / T`` of it. Takes device
        indices and bytes, scalars or arrays of one shape.
        """
        c = self.transfer_compute[src, dst]
        if self.transfer_cpu is None:
            return c
        cpu_lat, cpu_bw = self.transfer_cpu
        t = self.latency[src, dst] + nbytes * self.inv_bandwidth[src, dst]
        cpu = 2.0 * (cpu_lat[src, dst] + nbytes / cpu_bw[src, dst])
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(t > 0, np.minimum(1.0, cpu / np.where(t > 0, t, 1.0)), 1.0)
        return c * np.where(np.isnan(frac), 1.0, frac)  # NaN: not measured, T / 2 each

    def sharing_summary(self) -> list:
        """One line per shared group and resource, for reports (empty without)."""
        lines = []
        for grp in self.shared_cores:
            threads = sorted({grp.threads_of(j) for j in range(len(grp.devices))})
            lines.append(f"{len(grp.devices)} devices share {grp.cores:g} {grp.name} "
                         f"(each op wants {'/'.join(f'{t:g}' for t in threads)} threads)")
        for res in self.link_resources:
            how = ("carried one at a time, first in first out" if res.fifo else "shared by")
            lines.append(f"{res.name}: {res.bandwidth / 1e9:.3g} GB/s {how} the transfers of "
                         f"{len(res.pairs)} device pairs")
        return lines

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
                   speed: float = 1.0, names: Sequence[str] | None = None,
                   topology=None) -> "Cluster":
        """``hosts`` hosts of ``devices_per_host`` devices each.

        Links inside a host use ``intra_*``, links between hosts ``inter_*``.
        Default names are TensorFlow-style ``/job:worker/task:H/device:<type>:i``.
        ``topology`` (a preset of :data:`fddps.topology.TOPOLOGIES` such as
        ``"10gbe"`` or ``"pcie3+10gbe"``) adds the resources transfers share,
        such as one network interface per host; default none (contention-free).

        Examples
        --------
        >>> c = Cluster.multi_host(2, 4, intra_bandwidth=12e9, inter_bandwidth=1.1e9,
        ...                        topology="10gbe")
        >>> c.shares_links, len(c.link_resources)
        (True, 4)
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
        cluster = cls(devices, bandwidth=bw, latency=lat)
        if topology is not None:
            from .topology import with_topology

            cluster = with_topology(cluster, topology)
        return cluster

    @classmethod
    def from_links(cls, devices: Sequence[Device], link, transfer_compute=None,
                   transfer_cpu=None) -> "Cluster":
        """Devices whose link from ``a`` to ``b`` is ``link(a.name, b.name) -> (latency, bandwidth)``.

        How a cost model turns its per-pair link figures into a cluster.
        ``transfer_compute`` defaults to 1 between two devices of type
        ``"CPU"`` (they serialise, copy and parse tensors on the cores they
        compute on) and 0 otherwise (GPUs' copy engines move the data).
        ``transfer_cpu(a.name, b.name)``, if given, returns the pair's
        ``(cpu_latency, cpu_bandwidth)`` or None (the cluster's
        ``transfer_cpu``; pairs without it spend ``T / 2`` at each end).
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
        cpu = None
        if transfer_cpu is not None:
            cpu_lat, cpu_bw = np.full((m, m), np.nan), np.full((m, m), np.nan)
            for i in range(m):
                for j in range(m):
                    fit = transfer_cpu(devices[i].name, devices[j].name) if i != j else None
                    if fit is not None:
                        cpu_lat[i, j], cpu_bw[i, j] = fit
            cpu = (cpu_lat, cpu_bw) if np.isfinite(cpu_lat).any() else None
        return cls(devices, bandwidth=bw, latency=lat, transfer_compute=transfer_compute,
                   transfer_cpu=cpu)

    # -- queries -------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def __len__(self):
        return len(self.devices)

    def __repr__(self):
        types = sorted({d.type for d in self.devices})
        hosts = len({d.host for d in self.devices})
        shared = ""
        if self.shared_cores:
            shared += f", {len(self.shared_cores)} group(s) of shared cores"
        if self.link_resources:
            shared += f", {len(self.link_resources)} shared link resource(s)"
        return f"Cluster({self.num_devices} devices of type {types} on {hosts} host(s){shared})"

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
        # The means, once per cluster (its arrays are read-only): asked per edge
        # and per split candidate.
        link = self.__dict__.get("_mean_link")
        if link is None:
            off = ~np.eye(m, dtype=bool)
            link = self._mean_link = (self.latency[off].mean(), self.inv_bandwidth[off].mean())
        lat, inv_bw = link
        return lat + np.asarray(nbytes, dtype=np.float64) * inv_bw
