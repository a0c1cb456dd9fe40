"""Named clusters of the papers fddps reproduces: devices, links and the resources transfers share.

A preset is a machine a paper ran on, written down once with its sources, so
that an experiment asks for ``"flexflow-p100"`` instead of re-deriving its
links. :func:`preset_cluster` builds the :class:`~fddps.cluster.Cluster` (and
the cost model that times its ops and links) for the first ``devices`` GPUs
of a preset, filling nodes in order, with the network interfaces and PCIe
switches of :mod:`fddps.topology` that transfers share.

Presets (:data:`CLUSTER_PRESETS`):

- ``"flexflow-p100"``: FlexFlow's first cluster (Jia et al., MLSys 2019,
  Section 8 and Figure 5a): 4 nodes of 4 NVIDIA Tesla P100, the GPUs of a
  node connected by NVLink, nodes by 100 Gb/s EDR InfiniBand (one HCA per
  node, which every transfer between nodes crosses).
- ``"flexflow-k80"``: FlexFlow's second cluster (Figure 5b): 16 nodes of 4
  K80 GPUs, "adjacent GPUs connected by a separate PCI-e switch, and all GPUs
  connected to CPUs through a shared PCI-e switch", nodes by 56 Gb/s
  InfiniBand (the paper writes "56 GB/s EDR"; 56 Gb/s is FDR's rate). Each
  GPU's own PCIe link and each two-GPU switch's uplink are shared resources.

Example
-------
>>> cluster, cm = preset_cluster("flexflow-p100", 8)
>>> len(cluster), len({d.host for d in cluster.devices}), cluster.shares_links
(8, 2, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ClusterError
from .topology import with_topology

GB = 1e9


@dataclass(frozen=True)
class ClusterPreset:
    """One paper's cluster.

    Attributes
    ----------
    name : str
    gpu : str
        The cost model's GPU preset (:data:`costmodel.presets`).
    nodes, gpus_per_node : int
        The whole cluster.
    intra_link : tuple of (float, float)
        ``(latency s, bandwidth B/s)`` between two GPUs of one node (a lone
        transfer; sharing comes from ``topology``).
    inter_link : tuple of (float, float)
        The same between nodes.
    topology : str
        :data:`fddps.topology.TOPOLOGIES` parts joined by ``+``: the resources
        transfers share.
    source : str
        Where every figure comes from.
    """

    name: str
    gpu: str
    nodes: int
    gpus_per_node: int
    intra_link: tuple
    inter_link: tuple
    topology: str
    source: str

    @property
    def max_devices(self) -> int:
        return self.nodes * self.gpus_per_node


#: The paper clusters by name.
CLUSTER_PRESETS = {
    "flexflow-p100": ClusterPreset(
        "flexflow-p100", gpu="p100", nodes=4, gpus_per_node=4,
        intra_link=(8e-6, 18 * GB), inter_link=(10e-6, 11.5 * GB), topology="nvlink+infiniband",
        source="FlexFlow (Jia et al., MLSys 2019), Section 8 and Figure 5a: 4 nodes, each with "
               "4 Tesla P100 connected by NVLink, nodes over 100 Gb/s EDR InfiniBand. NVLink: a "
               "P100 SXM2 has 4 NVLink 1.0 links of 20 GB/s per direction; in a 4-GPU node each "
               "pair shares one link (NVIDIA DGX-1 system architecture white paper, 2017), ~18 "
               "GB/s measured one way (p2pBandwidthLatencyTest), ~8 us per copy, no resource "
               "shared between pairs. InfiniBand EDR: 12.5 GB/s line rate, ~11.5 GB/s RDMA "
               "write (topology part 'infiniband'), ~10 us per transfer through the runtime."),
    "flexflow-k80": ClusterPreset(
        "flexflow-k80", gpu="k80", nodes=16, gpus_per_node=4,
        intra_link=(10e-6, 12 * GB), inter_link=(10e-6, 6.0 * GB),
        topology="pcie3+infiniband-fdr",
        source="FlexFlow (Jia et al., MLSys 2019), Section 8 and Figure 5b: 16 nodes, each with "
               "4 K80 GPUs; adjacent GPUs behind a separate PCIe switch (a K80 board: two GK210 "
               "behind its PLX switch), all GPUs reaching the CPUs through a shared PCIe switch; "
               "nodes over 56 Gb/s InfiniBand (FDR; ~6.0 GB/s RDMA write, topology part "
               "'infiniband-fdr'). PCIe 3.0 x16 per GPU and per switch uplink, ~12 GB/s each "
               "(topology part 'pcie3', 2 GPUs per switch), ~10 us per copy."),
}


def preset_names() -> list:
    return sorted(CLUSTER_PRESETS)


def get_preset(name: str) -> ClusterPreset:
    """The preset called ``name``; a ClusterError naming the known ones otherwise."""
    try:
        return CLUSTER_PRESETS[name]
    except KeyError:
        raise ClusterError(f"unknown cluster preset {name!r}; known: "
                           f"{', '.join(preset_names())}") from None


def preset_devices(name: str, devices: int | None = None) -> list:
    """TensorFlow device strings of the first ``devices`` GPUs of preset ``name``.

    Nodes fill in order: up to ``gpus_per_node`` devices sit on one node,
    more take whole nodes (``devices`` must then be a multiple of
    ``gpus_per_node``), as the paper's Figure 6 counts them (8 GPUs on 2
    nodes, 16 on 4, ...).

    Raises
    ------
    ClusterError
        For more devices than the preset has, fewer than one, or a count that
        does not fill whole nodes.
    """
    p = get_preset(name)
    k = p.max_devices if devices is None else int(devices)
    if not 1 <= k <= p.max_devices:
        raise ClusterError(f"cluster preset {name!r} has {p.max_devices} GPUs "
                           f"({p.nodes} nodes x {p.gpus_per_node}); asked for {devices!r}")
    if k > p.gpus_per_node and k % p.gpus_per_node:
        raise ClusterError(f"cluster preset {name!r}: {k} GPUs do not fill whole nodes of "
                           f"{p.gpus_per_node}")
    per_node = min(k, p.gpus_per_node)
    return [f"/job:worker/replica:0/task:{h}/device:GPU:{i}"
            for h in range(k // per_node) for i in range(per_node)]


def preset_cost_model(name: str):
    """The analytic cost model of preset ``name``: its GPU's op times, its links.

    (Imported here: :mod:`costmodel` builds clusters with :mod:`fddps.cluster`.)
    """
    from costmodel import default_cost_model
    from costmodel.hardware import LinkPreset

    p = get_preset(name)
    intra = LinkPreset(f"{p.name} intra-node", *p.intra_link, source=p.source)
    inter = LinkPreset(f"{p.name} inter-node", *p.inter_link, source=p.source)
    return default_cost_model(p.gpu, links={"same_host:GPU-GPU": intra, "same_host:*": intra,
                                            "cross_host:*": inter})


def preset_cluster(name: str, devices: int | None = None, cost_model=None):
    """``(cluster, cost_model)`` of the first ``devices`` GPUs of preset ``name``.

    Parameters
    ----------
    name : str
        A key of :data:`CLUSTER_PRESETS`.
    devices : int, optional
        GPUs to use (default all); see :func:`preset_devices`.
    cost_model : CostModel, optional
        Default :func:`preset_cost_model`.

    Returns
    -------
    (Cluster, CostModel)
        The cluster with the preset's shared resources (network interfaces,
        PCIe lanes and switch uplinks), each device's memory its GPU's.

    Raises
    ------
    ClusterError
        For an unknown preset or a bad device count.
    """
    names = preset_devices(name, devices)
    cm = preset_cost_model(name) if cost_model is None else cost_model
    return with_topology(cm.cluster(names), get_preset(name).topology), cm


__all__ = ["CLUSTER_PRESETS", "ClusterPreset", "get_preset", "preset_cluster",
           "preset_cost_model", "preset_devices", "preset_names"]
