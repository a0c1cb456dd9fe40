"""Data parallelism as an estimate: one replica's step plus a ring all-reduce of the gradients.

Data parallelism does not place the ops of one graph; it runs ``p`` copies of
the graph, each on ``batch / p`` examples, and averages the gradients before
the update. fddps does not build that replicated graph; this module estimates
its step time from the same cost model and simulator as every placement, so
the numbers compare:

``step(p) = T_replica(batch / p) + T_allreduce(p)``

- ``T_replica``: the training graph built at ``batch / p`` and scheduled on one
  device of the cluster (:func:`fddps.schedule` with ``"single"``): the sum of
  its op times.
- ``T_allreduce``, as measured (``allreduce=`` a fit of :mod:`costmodel.allreduce`;
  :func:`measured_allreduce` picks it): the all-reduce of ``G`` bytes over
  ``p`` GPUs fitted to DeepBench's NCCL times of the GPU system the cost
  model's GPU preset names (the P100's 8-GPU server: ``2 (p - 1) / p * G /
  5.8 GB/s + 2 log2(p) * 17 us``, within 20% of all 21 of its published
  single-server rows). :func:`experiments.common.data_parallel_row` uses it when
  the devices share one host and their preset's system was measured.
- ``T_allreduce`` otherwise (``allreduce=None``): a ring all-reduce of the gradients (``G`` bytes: one copy of
  the trainable variables) over the ``p`` devices in cluster order. Each device
  sends ``2 (p - 1)`` chunks of ``G / p`` bytes (``p - 1`` reduce-scatter steps,
  ``p - 1`` all-gather steps), all links at once, so

  ``T_allreduce = 2 (p - 1) / p * G / B + 2 (p - 1) * L``

  with ``B`` the bandwidth and ``L`` the latency of the ring's slowest link (on
  two hosts the ring crosses the slow link twice, and every step waits for it).
  Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms
  for clusters of workstations", J. Parallel Distrib. Comput. 69(2), 2009
  (the bandwidth term, optimal for any all-reduce); A. Sergeev and M. Del Balso,
  "Horovod: fast and easy distributed deep learning in TensorFlow",
  arXiv:1802.05799, 2018 (ring all-reduce as used for TensorFlow data parallelism).

Assumptions, all in data parallelism's favour except the first: the all-reduce
starts after the whole backward pass (no overlap with it, as in TF-Slim's
synchronous replicas; Horovod overlaps part of it), and costs no compute;
replicas are perfectly in step; the input pipeline is free.

Out of memory: a replica that does not fit one device (the ``"single"``
scheduler's check: the sum of every op's ``memory + transient`` bytes) makes
data parallelism ``"OOM"``; the replica's simulated peak is reported too.

Examples
--------
>>> import fddps
>>> g = fddps.OpGraph(["fwd", "bwd"], [2e-3, 4e-3], [("fwd", "bwd", 1e6)])
>>> c = fddps.Cluster.homogeneous(4, bandwidth=10e9, latency=1e-5)
>>> est = estimate(g, c, gradient_bytes=100e6)
>>> round(est.replica_seconds, 6), round(est.allreduce_seconds, 6)
(0.006, 0.01506)
>>> from costmodel.allreduce import system_fit
>>> est = estimate(g, c, gradient_bytes=100e6, allreduce=system_fit("p100", 4))
>>> est.allreduce_model, round(est.allreduce_seconds, 4)
('measured p100 node tree', 0.0261)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

import fddps
from fddps.errors import ClusterError


def ring_allreduce_seconds(nbytes: float, devices: int, bandwidth: float, latency: float = 0.0) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``devices`` devices.

    ``2 (p - 1) / p * nbytes / bandwidth + 2 (p - 1) * latency`` (Patarasuk &
    Yuan 2009); 0 for one device.

    Raises
    ------
    ValueError
        For fewer than one device, negative bytes or latency, or a non-positive bandwidth.

    Examples
    --------
    >>> ring_allreduce_seconds(1e9, 2, bandwidth=1e9)
    1.0
    >>> ring_allreduce_seconds(1e9, 1, bandwidth=1e9)
    0.0
    """
    p = int(devices)
    if p < 1:
        raise ValueError(f"an all-reduce needs at least one device, got {devices!r}")
    if nbytes < 0 or latency < 0:
        raise ValueError(f"bytes and latency must be >= 0, got {nbytes!r} and {latency!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    if p == 1:
        return 0.0
    return 2.0 * (p - 1) / p * float(nbytes) / float(bandwidth) + 2.0 * (p - 1) * float(latency)


def ring_link(cluster) -> tuple[float, float]:
    """``(bandwidth, latency)`` of the slowest link of the ring ``0 -> 1 -> ... -> p-1 -> 0``.

    Every step of a ring all-reduce sends one chunk on every ring link at once,
    so the slowest link sets the pace: the smallest bandwidth and the largest
    latency among the ring's links. One device: ``(inf, 0.0)``.
    """
    p = cluster.num_devices
    if p == 1:
        return math.inf, 0.0
    nxt = (np.arange(p) + 1) % p
    bw = cluster.bandwidth[np.arange(p), nxt]
    lat = cluster.latency[np.arange(p), nxt]
    return float(bw.min()), float(lat.max())


@dataclass
class DataParallelEstimate:
    """The estimated step of data parallelism on a cluster (see the module notes).

    Attributes
    ----------
    devices : int
    status : str
        ``"ok"``, or ``"OOM"`` when one replica does not fit a device.
    step_seconds : float
        ``replica_seconds + allreduce_seconds`` (NaN on OOM).
    replica_seconds : float
        One replica's step on one device (NaN on OOM).
    allreduce_seconds : float
    gradient_bytes : float
    ring_bandwidth, ring_latency : float
        The ring's slowest link (or the measured fit's bandwidth and latency).
    reserved : float
        Bytes the single-device check reserves for one replica (all its ops'
        ``memory + transient``).
    peak : float
        The simulator's peak bytes of one replica's step (NaN on OOM).
    capacity : float
        Bytes of the device the replica runs on.
    message : str
    """

    devices: int
    status: str
    step_seconds: float
    replica_seconds: float
    allreduce_seconds: float
    gradient_bytes: float
    ring_bandwidth: float
    ring_latency: float
    reserved: float
    peak: float
    capacity: float
    message: str = ""
    allreduce_model: str = "ring over links"

    def to_dict(self) -> dict:
        return asdict(self)


def measured_allreduce(cost_model, cluster):
    """The measured all-reduce fit (:func:`costmodel.allreduce.system_fit`) for ``cluster``'s
    GPUs, or None: when the devices are GPUs on one host and the cost model's GPU preset names
    a system DeepBench timed (``p100``). Between hosts the cluster's own links price it (the
    published multi-server runs used their own network)."""
    from costmodel import CostModelError
    from costmodel.allreduce import system_fit

    devs = cluster.devices
    if len(devs) < 2 or len({d.host for d in devs}) > 1 or any(d.type != "GPU" for d in devs):
        return None
    try:
        name = cost_model._preset("GPU").name.split(":")[0]
        return system_fit(name, len(devs))
    except CostModelError:
        return None


def estimate(replica_graph, cluster, gradient_bytes: float, allreduce=None) -> DataParallelEstimate:
    """Data parallelism's step on ``cluster``, from one replica's graph at ``batch / p``.

    Parameters
    ----------
    replica_graph : OpGraph
        The training graph at the per-replica batch (``batch / p``).
    cluster : Cluster
        The ``p`` devices; the replica runs on the first, all are assumed alike.
    gradient_bytes : float
        Bytes of one full set of gradients (the trainable variables).
    allreduce : dict, optional
        A measured fit (:func:`costmodel.allreduce.system_fit`, or
        :func:`measured_allreduce`'s result); None: the ring over the cluster's links.

    Returns
    -------
    DataParallelEstimate

    Raises
    ------
    ValueError
        For negative ``gradient_bytes``.
    ClusterError
        If the devices differ in type or speed (a replica per device must take
        the same time everywhere for this estimate).
    """
    from fddps.simulate import peak_memory

    if not gradient_bytes >= 0:
        raise ValueError(f"gradient_bytes must be >= 0, got {gradient_bytes!r}")
    devs = cluster.devices
    if len({(d.type, d.speed) for d in devs}) > 1:
        raise ClusterError("data parallelism's estimate needs identical devices; got "
                           + ", ".join(f"{d.name} ({d.type}, speed {d.speed})" for d in devs))
    p = cluster.num_devices
    if allreduce is None:
        bandwidth, latency = ring_link(cluster)
        how = "ring over links"
        allreduce = ring_allreduce_seconds(gradient_bytes, p, bandwidth, latency)
    else:
        from costmodel.allreduce import allreduce_seconds

        fit = allreduce
        bandwidth, latency = float(fit["bandwidth"]), float(fit["latency"])
        how = f"measured {fit['gpu']} {fit['scope']} {fit['model']}"
        allreduce = allreduce_seconds(gradient_bytes, p, fit)
    one = fddps.Cluster([devs[0]], bandwidth=math.inf, latency=0.0)
    reserved = float(replica_graph.memory.sum() + replica_graph.allocated.sum())
    common = dict(devices=p, allreduce_seconds=allreduce, gradient_bytes=float(gradient_bytes),
                  ring_bandwidth=bandwidth, ring_latency=latency, reserved=reserved,
                  capacity=float(devs[0].memory), allreduce_model=how)
    try:
        s = fddps.schedule(replica_graph, one, algorithm="single")
    except fddps.InfeasibleError as e:
        peak = float(peak_memory(replica_graph, one, np.zeros(replica_graph.num_ops, np.int64),
                                 *_topological_times(replica_graph, one)).max())
        return DataParallelEstimate(status="OOM", step_seconds=np.nan, replica_seconds=np.nan,
                                    peak=peak, message=f"one replica does not fit: {e}", **common)
    peak = float(peak_memory(s.graph, s.cluster, s.device, s.start, s.finish).max())
    return DataParallelEstimate(status="ok", step_seconds=s.makespan + allreduce,
                                replica_seconds=s.makespan, peak=peak, **common)


def _topological_times(graph, one):
    """Start and finish times of the graph run in topological order on the one device of ``one``."""
    from fddps.simulate import replay

    device = np.zeros(graph.num_ops, dtype=np.int64)
    return replay(graph, one, device, [graph.topo])
