"""TensorFlow device strings, and the :class:`~fddps.cluster.Cluster` built from them.

Device strings are parsed and normalised by TensorFlow's own ``tf.DeviceSpec``:
``/cpu:0`` becomes ``/device:CPU:0``, ``/job:worker/task:1/device:GPU:0`` keeps
its job and task. A host is the ``(job, replica, task)`` triple (missing
replica and task count as 0; a string without a job is the local process).

Memory per device, first found:

1. the ``memory=`` argument (bytes for all devices, or a mapping by device
   string or device type);
2. the :class:`~fddps.cluster.Cluster` passed in, if one was;
3. :data:`DEFAULT_CPU_MEMORY` (64 GiB) for CPU devices: host memory is large
   and swaps, and the CPU devices of one process share it;
4. the cost model's ``device_memory(type)`` (its hardware preset) for the others.

Shared hardware (:func:`make_cluster`, see :mod:`fddps.cluster`): the CPU
devices of this process (``/device:CPU:N`` without a job, or of
``/job:localhost``) compute on the same cores, so by default they form one
:class:`~fddps.cluster.SharedCores` group (:func:`local_cpu_sharing`); and
devices on several hosts send through one network interface per host
(``topology="auto"``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
from collections.abc import Mapping


import numpy as np

from ..cluster import Cluster, Device, LinkResource, SharedCores
from ..errors import ClusterError
from .graphdef import _tf

#: Capacity assumed for a CPU device when none is given (bytes).
DEFAULT_CPU_MEMORY = 64 * 2**30

#: Device types accepted besides those the local kernel registry knows.
KNOWN_DEVICE_TYPES = frozenset({"CPU", "GPU", "TPU"})

_registry_types = None


def known_device_types() -> frozenset:
    """Device types this TensorFlow build registers kernels for, plus CPU, GPU and TPU."""
    global _registry_types
    if _registry_types is None:
        from tensorflow.python.framework import kernels

        _tf()
        found = {k.device_type for k in kernels.get_all_registered_kernels().kernel}
        _registry_types = frozenset(found - {"DEFAULT"}) | KNOWN_DEVICE_TYPES
    return _registry_types


def parse_device(name, what: str = "device"):
    """Parse one concrete TensorFlow device string into a ``tf.DeviceSpec``.

    Parameters
    ----------
    name : str
        ``/device:CPU:0``, ``/cpu:0``, ``/job:worker/replica:0/task:1/device:GPU:0``, ...
    what : str
        How to call the string in error messages.

    Returns
    -------
    tf.DeviceSpec

    Raises
    ------
    ClusterError
        If ``name`` is not a string, does not parse, names no device type or
        index (``/device:CPU:*``), or an unknown device type; the message names it.

    Examples
    --------
    >>> parse_device("/cpu:1").to_string()
    '/device:CPU:1'
    """
    tf = _tf()
    if not isinstance(name, str) or not name.strip():
        raise ClusterError(f"{what} must be a non-empty TensorFlow device string, got {name!r}")
    try:
        spec = tf.DeviceSpec.from_string(name.strip())
    except (ValueError, TypeError) as e:
        raise ClusterError(f"malformed {what} {name!r}: {e}") from None
    if spec.device_type is None:
        raise ClusterError(f"{what} {name!r} names no device type (expected e.g. '/device:CPU:0')")
    if spec.device_index is None:
        raise ClusterError(f"{what} {name!r} names no device index (expected e.g. "
                           f"'/device:{spec.device_type}:0')")
    if spec.device_type.upper() not in known_device_types():
        raise ClusterError(f"{what} {name!r} has unknown device type {spec.device_type!r}; "
                           f"known types: {sorted(known_device_types())}")
    return spec.replace(device_type=spec.device_type.upper())


def normalize_device(name, what: str = "device") -> str:
    """The canonical form of a device string (``/cpu:0`` -> ``/device:CPU:0``)."""
    return parse_device(name, what).to_string()


def host_of(spec) -> str:
    """The host of a device, ``/job:J/replica:R/task:T`` (``/job:localhost/...`` without a job)."""
    job = spec.job or "localhost"
    return f"/job:{job}/replica:{spec.replica or 0}/task:{spec.task or 0}"


@functools.lru_cache(maxsize=4096)
def _spec(name: str):
    return _tf().DeviceSpec.from_string(name)


def device_matches(requested, device) -> bool:
    """Whether the (possibly partial) ``requested`` device spec covers ``device``.

    Every field set in ``requested`` must equal ``device``'s (a missing field in
    ``device`` matches the job ``localhost``, replica 0 and task 0). Both may be
    strings or ``tf.DeviceSpec``.

    >>> device_matches("/device:CPU:*", "/job:localhost/replica:0/task:0/device:CPU:3")
    True
    >>> device_matches("/job:worker/task:1", "/job:worker/replica:0/task:0/device:CPU:0")
    False
    """
    r = _spec(requested) if isinstance(requested, str) else requested
    d = _spec(device) if isinstance(device, str) else device
    dev_fields = {"job": d.job or "localhost", "replica": d.replica or 0, "task": d.task or 0,
                  "device_type": (d.device_type or "").upper(), "device_index": d.device_index}
    req_fields = {"job": r.job, "replica": r.replica, "task": r.task,
                  "device_type": r.device_type.upper() if r.device_type else None,
                  "device_index": r.device_index}
    return all(v is None or dev_fields[k] == v for k, v in req_fields.items())


def same_device(a, b) -> bool:
    """Whether two device strings name the same device (a missing job is the local one)."""
    return device_matches(a, b) and device_matches(b, a)


def process_devices() -> list:
    """Full names of the devices this process's TensorFlow runtime has.

    Local devices, and those of the remote tasks of a cluster the process is
    connected to (``tf.config.experimental_connect_to_cluster``). Starts the
    runtime if it has not started.
    """
    _tf()
    from tensorflow.python.eager import context

    return [d for d in context.context().devices()]


def check_devices_exist(devices, existing=None):
    """Raise unless every device string names a device this process (or its cluster) has.

    Parameters
    ----------
    devices : str, list of str, or Cluster
        Device strings to check (a Cluster's device names).
    existing : list of str, optional
        The devices that exist (default :func:`process_devices`).

    Returns
    -------
    list of str
        The device strings, unchanged.

    Raises
    ------
    ClusterError
        If ``devices`` is empty, or one names no existing device: the message
        names it and lists the devices that exist. A placement meant for a
        simulated cluster is not checked (e.g. ``fddps.place(graph_def,
        devices, simulated=True)``, ``fddps place --simulated``).

    Example
    -------
    >>> check_devices_exist(["/device:CPU:5"], ["/job:localhost/replica:0/task:0/device:CPU:0"])
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fddps.errors.ClusterError: device '/device:CPU:5' names no device of this process ...
    """
    names = list(devices.names) if isinstance(devices, Cluster) else (
        [devices] if isinstance(devices, str) else list(devices))
    if not names:
        raise ClusterError("the device list is empty: give at least one TensorFlow device "
                           "string (e.g. fddps.tf.local_cpu_devices(2))")
    existing = process_devices() if existing is None else list(existing)
    for name in names:
        spec = parse_device(name, "device")
        if not any(device_matches(spec, d) for d in existing):
            raise ClusterError(
                f"device {name!r} names no device of this process or its cluster; the devices "
                f"that exist: {existing} (fddps.tf.local_cpu_devices(n) makes n CPU devices; "
                "to plan for hardware this process does not have, place a GraphDef on a "
                "simulated cluster)")
    return names


def _capacity(memory, name, spec, cost_model, given):
    dtype = spec.device_type
    if memory is not None:
        if isinstance(memory, Mapping):
            for key in (name, spec.to_string(), dtype):
                if key in memory:
                    return _bytes(memory[key], f"memory[{key!r}]")
        else:
            return _bytes(memory, "memory")
    if given is not None:
        return given
    if dtype == "CPU":
        return float(DEFAULT_CPU_MEMORY)
    try:
        return float(cost_model.device_memory(dtype))
    except Exception as e:  # noqa: BLE001 - any cost model's refusal
        raise ClusterError(f"no memory capacity for device {name!r}: the cost model has none for "
                           f"type {dtype!r} ({e}); pass memory={{'{dtype}': bytes}}") from None


def _bytes(value, what):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ClusterError(f"{what} must be a number of bytes, got {value!r}") from None
    if not v >= 0:
        raise ClusterError(f"{what} must be >= 0 bytes, got {value!r}")
    return v


def check_cluster(cluster) -> Cluster:
    """Return ``cluster`` if its devices are named and typed as TensorFlow devices.

    Raises
    ------
    ClusterError
        If a device name does not parse, or its type differs from the name's
        device type (build the cluster with :func:`make_cluster`).
    """
    if not isinstance(cluster, Cluster):
        raise ClusterError(f"expected a Cluster, got {type(cluster).__name__}")
    for d in cluster.devices:
        spec = parse_device(d.name, "cluster device")
        if d.type != spec.device_type:
            raise ClusterError(f"cluster device {d.name!r} has type {d.type!r}, not its TensorFlow "
                               f"type {spec.device_type!r}; build the cluster with "
                               "fddps.tf.make_cluster(devices, cost_model)")
    return cluster


def usable_cores() -> int:
    """Cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where absent)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_cpu_sharing(devices, session_config=None) -> list:
    """The :class:`~fddps.cluster.SharedCores` of this process's CPU devices.

    TensorFlow runs the kernels of all CPU devices of one process on one
    intra-op thread pool, on the cores the process may use: several
    ``/device:CPU:N`` are not more cores. Each device's op times (the cost
    model's CPU preset, all cores by default) are for it running alone with
    the pool's threads.

    Parameters
    ----------
    devices : sequence of Device
        Devices as :func:`make_cluster` builds them (``host`` set).
    session_config : tf.compat.v1.ConfigProto, optional
        Its ``intra_op_parallelism_threads``, when > 0, is the threads one op
        uses; otherwise (TensorFlow's default) the pool has one thread per
        usable core.

    Returns
    -------
    list of SharedCores
        One group of the local process's CPU devices, cores =
        :func:`usable_cores`; empty when it has fewer than two.

    Examples
    --------
    >>> devs = [Device(f"/job:localhost/replica:0/task:0/device:CPU:{i}", "CPU",
    ...                host="/job:localhost/replica:0/task:0") for i in range(4)]
    >>> [len(g.devices) for g in local_cpu_sharing(devs)]
    [4]
    """
    local = [d.name for d in devices
             if d.type == "CPU" and d.host == "/job:localhost/replica:0/task:0"]
    if len(local) < 2:
        return []
    cores = usable_cores()
    threads = int(getattr(session_config, "intra_op_parallelism_threads", 0) or 0) or cores
    return [SharedCores(tuple(local), cores=cores, threads=threads,
                        name="cores of this process (one intra-op thread pool)")]


#: Addresses that are this machine whatever its name.
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0")


def _address_host(address: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` too)."""
    address = str(address).strip()
    if address.startswith("["):
        return address[:address.index("]") + 1]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def task_sharing(devices, cluster_spec, threads_per_task=None, transfer_threads=False) -> list:
    """The :class:`~fddps.cluster.SharedCores` of worker tasks that run on this machine.

    Tasks of a TensorFlow cluster are separate processes, but those started on
    one machine compute on its cores: two ``local_cluster`` workers on a
    2-core machine cannot both run 2-thread ops at full speed. The tasks whose
    address in ``cluster_spec`` is this machine (a loopback address or this
    host's name) get one group over :func:`usable_cores`; tasks on other
    machines are left alone (their core counts are not known here).

    Parameters
    ----------
    devices : sequence of Device
        As :func:`make_cluster` builds them (``host`` is ``/job:J/replica:R/task:T``).
    cluster_spec : mapping of job -> list of ``"host:port"`` (or a ``tf.train.ClusterSpec``)
    threads_per_task : int or mapping of host -> int, optional
        Intra-op threads of each task's ops (what its op times are for);
        default every usable core (TensorFlow's default).
    transfer_threads : bool
        Whether the tasks' sends and receives run on threads of their own
        (gRPC's) that share the cores with the ops
        (``SharedCores.transfer_threads``). Default False: in each device's
        queue, between its ops.

    Returns
    -------
    list of SharedCores
        Empty unless at least two CPU devices of tasks on this machine.

    Raises
    ------
    ClusterError
        If ``cluster_spec`` is not a job -> addresses mapping.

    Examples
    --------
    >>> devs = [Device(f"/job:worker/replica:0/task:{t}/device:CPU:0", "CPU",
    ...                host=f"/job:worker/replica:0/task:{t}") for t in range(3)]
    >>> spec = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223", "gpu-box:2222"]}
    >>> [len(g.devices) for g in task_sharing(devs, spec, threads_per_task=1)]
    [2]
    """
    if hasattr(cluster_spec, "as_dict"):
        cluster_spec = cluster_spec.as_dict()
    if not isinstance(cluster_spec, Mapping):
        raise ClusterError(f"cluster_spec must map job names to lists of 'host:port' addresses, "
                           f"got {type(cluster_spec).__name__}")
    here = set(_LOOPBACK) | {socket.gethostname(), socket.getfqdn()}
    local_tasks = set()
    for job, addresses in cluster_spec.items():
        # A sparse job maps task indices to addresses.
        items = sorted(addresses.items()) if isinstance(addresses, Mapping) else enumerate(addresses)
        for t, addr in items:
            if _address_host(addr) in here:
                local_tasks.add(f"/job:{job}/replica:0/task:{int(t)}")
    members = [d for d in devices if d.type == "CPU" and d.host in local_tasks]
    if len(members) < 2:
        return []
    cores = usable_cores()
    if isinstance(threads_per_task, Mapping):
        threads = tuple(float(threads_per_task.get(d.host, cores)) for d in members)
    else:
        threads = float(threads_per_task or cores)
    return [SharedCores(tuple(d.name for d in members), cores=cores, threads=threads,
                        name=f"cores of this machine ({len({d.host for d in members})} tasks)",
                        transfer_threads=bool(transfer_threads))]


def nic_per_host(cluster) -> list:
    """One network interface per host (out and in), as fast as its fastest link off the host.

    Only transfers the devices do not compute themselves cross it
    (``transfer_compute < 1``); CPU tasks talking gRPC spend the whole
    transfer on their cores already. Empty on one host.
    """
    hosts = sorted({d.host for d in cluster.devices})
    if len(hosts) < 2:
        return []
    host = np.array([d.host for d in cluster.devices])
    wire = cluster.transfer_compute < 1
    out = []
    for h in hosts:
        here = host == h
        leaving = here[:, None] & ~here[None, :]
        for direction, mask in (("out", leaving & wire), ("in", leaving.T & wire)):
            if not mask.any():
                continue
            bw = float(cluster.bandwidth[mask].max())
            pairs = frozenset((cluster.names[i], cluster.names[j]) for i, j in zip(*np.nonzero(mask)))
            out.append(LinkResource(f"{h} NIC {direction}", bw, pairs,
                                    "one network interface per host, as fast as the cost model's "
                                    "link between hosts"))
    return out


def grpc_channels(cluster) -> list:
    """One first-in-first-out channel per ordered pair of tasks, as fast as their link.

    TensorFlow's distributed runtime moves the tensors one task receives from
    another as ``RecvTensor`` responses over one gRPC channel, one after
    another: a small tensor waits behind a large one sent before it
    (head-of-line blocking). Each channel is a :class:`LinkResource` with
    ``fifo=True`` carrying the part of each transfer the tasks' cores do not
    spend (``1 - transfer_share``). Empty on one task.

    Examples
    --------
    >>> from fddps import Cluster, Device
    >>> devs = [Device(f"/job:w/replica:0/task:{t}/device:CPU:0", "CPU",
    ...                host=f"/job:w/replica:0/task:{t}") for t in range(2)]
    >>> [r.name for r in grpc_channels(Cluster(devs, bandwidth=1e9))]
    ['gRPC channel /job:w/replica:0/task:0 -> /job:w/replica:0/task:1', \
'gRPC channel /job:w/replica:0/task:1 -> /job:w/replica:0/task:0']
    """
    hosts = sorted({d.host for d in cluster.devices})
    host = [d.host for d in cluster.devices]
    out = []
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            pairs = [(i, j) for i in range(cluster.num_devices) if host[i] == a
                     for j in range(cluster.num_devices) if host[j] == b]
            bw = float(max(cluster.bandwidth[i, j] for i, j in pairs))
            out.append(LinkResource(
                f"gRPC channel {a} -> {b}", bw,
                frozenset((cluster.names[i], cluster.names[j]) for i, j in pairs),
                "one gRPC channel per pair of tasks, tensors shipped first in first out",
                fifo=True))
    return out


def make_cluster(devices, cost_model, memory=None, *, session_config=None, share_cores=True,
                 topology="auto", cluster_spec=None, threads_per_task=None,
                 transfer_threads=False, channels=False) -> Cluster:
    """A :class:`Cluster` of TensorFlow devices, links from the cost model.

    Parameters
    ----------
    devices : sequence of str, or Cluster
        TensorFlow device strings, or a Cluster whose device names are such
        strings (its speeds, memory and links are kept; names are normalised and
        device types set from the names).
    cost_model : object
        Gives ``link(src, dst) -> (latency_s, bandwidth_Bps)`` and
        ``device_memory(device_type) -> bytes``; and, if it has one,
        ``transfer_cpu(src, dst) -> (cpu_latency, cpu_bandwidth) or None``
        (:meth:`costmodel.CostModel.transfer_cpu`).
    memory : float or mapping, optional
        Capacity in bytes for every device, or by device string or device type.
    session_config : tf.compat.v1.ConfigProto, optional
        The session's config: its intra-op threads are what one op of a local
        CPU device uses (:func:`local_cpu_sharing`).
    share_cores : bool
        Whether this process's CPU devices share its cores (default True;
        False models each with cores of its own, as before fddps modelled
        contention). Ignored when ``devices`` is a Cluster (its groups are kept).
    topology : ``"auto"``, None, or a preset of :data:`fddps.topology.TOPOLOGIES`
        The link resources transfers share. ``"auto"`` (default): one network
        interface per host (:func:`nic_per_host`) when the devices span hosts;
        None: contention-free links; a preset name such as ``"pcie3+10gbe"``.
        Ignored when ``devices`` is a Cluster.
    cluster_spec : mapping of job -> addresses, optional
        The TensorFlow cluster the devices belong to: the CPU devices of its
        tasks on this machine share its cores (:func:`task_sharing`, with
        ``threads_per_task``), as this process's own CPU devices do (with
        ``share_cores``). Ignored when ``devices`` is a Cluster.
    threads_per_task : int or mapping of task -> int, optional
        See :func:`task_sharing`.
    transfer_threads : bool
        Whether those tasks send and receive on threads of their own that
        share the machine's cores with their ops (:func:`task_sharing`).
        Default False.
    channels : bool
        Whether transfers between tasks queue first in first out on one gRPC
        channel per pair of tasks (:func:`grpc_channels`). Default False:
        each transfer moves as if alone. ``experiments.real_cluster``
        reports both (its ``predicted_channels`` column).

    Returns
    -------
    Cluster
        Devices named by their normalised strings, typed ``"CPU"``/``"GPU"``/...,
        hosted on their ``(job, replica, task)``.

    Raises
    ------
    ClusterError
        On an empty device list, a malformed or unknown device string (named),
        two strings naming one device, a bad memory value, or
        ``transfer_threads`` without a ``cluster_spec``.
    """
    if isinstance(devices, Cluster):
        given = devices
        names = list(devices.names)
    else:
        given = None
        if isinstance(devices, str):
            devices = [devices]
        try:
            names = list(devices)
        except TypeError:
            raise ClusterError(f"devices must be a list of TensorFlow device strings or a "
                               f"Cluster, got {type(devices).__name__}") from None
    if not names:
        raise ClusterError("devices is empty: give at least one TensorFlow device string "
                           "(e.g. ['/device:CPU:0'])")
    specs = [parse_device(name, "device") for name in names]
    normal = [s.to_string() for s in specs]
    for i in range(len(specs)):
        for j in range(i):
            if same_device(specs[i], specs[j]):
                raise ClusterError(f"devices {names[j]!r} and {names[i]!r} name the same device")
    out = []
    for k, (name, spec) in enumerate(zip(names, specs)):
        cap_given = float(given.devices[k].memory) if given is not None else None
        cap = _capacity(memory, name, spec, cost_model, cap_given)
        speed = given.devices[k].speed if given is not None else 1.0
        out.append(Device(normal[k], type=spec.device_type, speed=speed, memory=cap,
                          host=host_of(spec)))
    if given is not None:
        rename = dict(zip(names, normal))
        groups = [dataclasses.replace(grp, devices=tuple(rename[n] for n in grp.devices))
                  for grp in given.shared_cores]
        links = [dataclasses.replace(r, pairs=frozenset((rename[a], rename[b]) for a, b in r.pairs))
                 for r in given.link_resources]
        return given.replace(devices=out, shared_cores=groups, link_resources=links)
    cluster = Cluster.from_links(out, cost_model.link,
                                 transfer_cpu=getattr(cost_model, "transfer_cpu", None))
    groups = local_cpu_sharing(out, session_config) if share_cores else []
    if cluster_spec is not None:
        groups = groups + task_sharing(out, cluster_spec, threads_per_task, transfer_threads)
    elif transfer_threads:
        raise ClusterError("transfer_threads=True needs cluster_spec: it is set on the tasks "
                           "the spec places on this machine")
    if topology == "auto":
        links = nic_per_host(cluster)
    elif topology is None:
        links = []
    else:
        from ..topology import link_resources

        links = link_resources(out, topology)
    if channels:
        links = links + grpc_channels(cluster)
    if groups or links:
        cluster = cluster.with_sharing(groups, links)
    return cluster
