"""Link topologies: the network interfaces and PCIe uplinks that transfers share.

A topology turns a cluster's devices into :class:`~fddps.cluster.LinkResource`
objects, each a resource with a bandwidth and the device pairs whose transfers
cross it. The simulator shares each resource's bandwidth among the transfers
crossing it (:mod:`fddps.simulate`); the schedulers queue transfers on them
(:class:`fddps.algorithms.base.PlacementState`).

What a transfer from device ``a`` to device ``b`` crosses:

- between hosts: ``a``'s host's network interface (outgoing) and ``b``'s
  (incoming); the interface is full duplex, so each direction is a resource;
- with a PCIe part (``"pcie3"``, ``"pcie4"``): each GPU's own x16 link (out of
  ``a``, into ``b``) and, when ``a`` and ``b`` sit behind different PCIe
  switches (or on different hosts), the uplinks of their switches
  (``gpus_per_switch`` GPUs share one: 2 in the paper's 8 x P100 servers and
  in NVIDIA's DGX-1 PCIe tree);
- with ``"nvlink"``: GPUs of one host talk over point-to-point NVLinks that no
  other pair uses (no shared resource inside the host).

Presets (:data:`TOPOLOGIES`) name one part; join parts with ``+``:
``"pcie3+10gbe"`` is hosts of GPUs behind PCIe 3 switches joined by 10 Gb
Ethernet. Bandwidths are effective (goodput), as the link presets of
:mod:`costmodel.hardware` are, so a lone transfer over a resource costs what the
link model says it does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import LinkResource
from .errors import ClusterError

GB = 1e9


@dataclass(frozen=True)
class TopologyPart:
    """One part of a topology preset.

    Attributes
    ----------
    name : str
    nic_bandwidth : float or None
        Bytes per second of each host's network interface, per direction
        (``None``: this part has no network interface).
    lane_bandwidth : float or None
        Bytes per second of each GPU's own PCIe link and of each PCIe switch's
        uplink, per direction (``None``: no PCIe resources).
    gpus_per_switch : int
        GPUs behind one PCIe switch.
    source : str
    """

    name: str
    nic_bandwidth: float | None = None
    lane_bandwidth: float | None = None
    gpus_per_switch: int = 2
    source: str = ""


#: Topology parts by name. Bandwidths match the link presets of the same name.
TOPOLOGIES = {
    "10gbe": TopologyPart(
        "10gbe", nic_bandwidth=1.1 * GB,
        source="one 10 Gb Ethernet port per host: 1.25 GB/s line rate per direction, ~1.1 GB/s "
               "TCP goodput (costmodel link preset '10gbe')"),
    "25gbe": TopologyPart(
        "25gbe", nic_bandwidth=2.8 * GB,
        source="one 25 Gb Ethernet port per host: 3.125 GB/s line rate, ~2.8 GB/s TCP goodput"),
    "100gbe": TopologyPart(
        "100gbe", nic_bandwidth=10 * GB,
        source="one 100 Gb Ethernet port per host: 12.5 GB/s line rate, ~10 GB/s TCP goodput with "
               "several streams (costmodel link preset '100gbe')"),
    "infiniband": TopologyPart(
        "infiniband", nic_bandwidth=11.5 * GB,
        source="one InfiniBand EDR 4x HCA per host: 100 Gb/s = 12.5 GB/s line rate, ~11.5 GB/s "
               "RDMA write bandwidth (perftest ib_write_bw on ConnectX-4/5)"),
    "infiniband-fdr": TopologyPart(
        "infiniband-fdr", nic_bandwidth=6.0 * GB,
        source="one InfiniBand FDR 4x HCA per host: 56 Gb/s signalling, 54.5 Gb/s = 6.8 GB/s of "
               "data after 64b/66b encoding, ~6.0 GB/s RDMA write bandwidth (perftest ib_write_bw "
               "on ConnectX-3); FlexFlow's K80 cluster (MLSys 2019, Section 8: '56 GB/s')"),
    "pcie3": TopologyPart(
        "pcie3", lane_bandwidth=12 * GB, gpus_per_switch=2,
        source="PCIe 3.0 x16 per GPU and per switch uplink: 15.75 GB/s line rate per direction, "
               "~12 GB/s pinned cudaMemcpy; 2 GPUs per PCIe switch (8 x P100 PCIe servers, "
               "DGX-1 PCIe tree)"),
    "pcie4": TopologyPart(
        "pcie4", lane_bandwidth=24 * GB, gpus_per_switch=2,
        source="PCIe 4.0 x16 per GPU and per switch uplink: 31.5 GB/s line rate per direction, "
               "~24 GB/s pinned cudaMemcpy; 2 GPUs per switch"),
    "nvlink": TopologyPart(
        "nvlink", source="NVLink between the GPUs of a host (DGX-1 hybrid cube mesh, NVSwitch): "
                         "point-to-point links, no resource shared between pairs"),
}


def _parts(topology):
    if isinstance(topology, TopologyPart):
        return [topology]
    if not isinstance(topology, str) or not topology.strip():
        raise ClusterError(f"topology must be a preset name such as '10gbe' or 'pcie3+10gbe', "
                           f"got {topology!r}")
    parts = []
    for name in topology.split("+"):
        key = name.strip().lower()
        if key not in TOPOLOGIES:
            raise ClusterError(f"unknown topology part {name.strip()!r} in {topology!r}; known: "
                               f"{', '.join(sorted(TOPOLOGIES))}")
        parts.append(TOPOLOGIES[key])
    return parts


def link_resources(devices, topology) -> list:
    """The shared link resources of ``devices`` under ``topology``.

    Parameters
    ----------
    devices : sequence of Device
        Devices with their ``host`` and ``type`` (GPUs get PCIe resources).
    topology : str or TopologyPart
        A preset name from :data:`TOPOLOGIES`, or several joined by ``+``.

    Returns
    -------
    list of LinkResource
        Per host with devices on other hosts: its network interface out and
        in; with a PCIe part, per GPU its link out and in, per switch its
        uplink out and in. Resources no pair crosses are left out.

    Raises
    ------
    ClusterError
        For an unknown preset name.

    Examples
    --------
    >>> from fddps.cluster import Device
    >>> devs = [Device(f"g{h}{i}", "GPU", host=str(h)) for h in range(2) for i in range(2)]
    >>> [r.name for r in link_resources(devs, "10gbe")]
    ['host 0 NIC out', 'host 0 NIC in', 'host 1 NIC out', 'host 1 NIC in']
    """
    devices = list(devices)
    out = []
    hosts = sorted({d.host for d in devices})
    for part in _parts(topology):
        if part.nic_bandwidth is not None and len(hosts) > 1:
            for h in hosts:
                here = [d.name for d in devices if d.host == h]
                away = [d.name for d in devices if d.host != h]
                out.append(LinkResource(f"host {h} NIC out", part.nic_bandwidth,
                                        frozenset((a, b) for a in here for b in away), part.source))
                out.append(LinkResource(f"host {h} NIC in", part.nic_bandwidth,
                                        frozenset((b, a) for a in here for b in away), part.source))
        if part.lane_bandwidth is not None:
            gpus = [d for d in devices if d.type.upper() == "GPU"]
            switch = {}
            for h in hosts:
                on_host = [d for d in gpus if d.host == h]
                for i, d in enumerate(on_host):
                    switch[d.name] = (h, i // max(1, part.gpus_per_switch))
            names = [d.name for d in devices]
            for d in gpus:
                others = [b for b in names if b != d.name]
                out.append(LinkResource(f"{d.name} PCIe out", part.lane_bandwidth,
                                        frozenset((d.name, b) for b in others), part.source))
                out.append(LinkResource(f"{d.name} PCIe in", part.lane_bandwidth,
                                        frozenset((b, d.name) for b in others), part.source))
            for sw in sorted(set(switch.values())):
                below = {n for n, s in switch.items() if s == sw}
                outside = [b for b in names if b not in below]
                label = f"host {sw[0]} PCIe switch {sw[1]}"
                out.append(LinkResource(f"{label} up", part.lane_bandwidth,
                                        frozenset((a, b) for a in below for b in outside), part.source))
                out.append(LinkResource(f"{label} down", part.lane_bandwidth,
                                        frozenset((b, a) for a in below for b in outside), part.source))
    return [r for r in out if r.pairs]


def with_topology(cluster, topology):
    """``cluster`` with the link resources of ``topology`` (its shared cores kept).

    Raises
    ------
    ClusterError
        For an unknown preset name.
    """
    return cluster.with_sharing(link_resources=link_resources(cluster.devices, topology))
