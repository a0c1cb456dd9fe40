"""FD-DPS on several hosts is never slower than FD-DPS on one host's devices."""

import numpy as np
import pytest

import fddps
from fddps import Cluster, Schedule
from fddps.generators import training_graph


def _embedded(graph, cluster, host_names):
    """FD-DPS on the named devices alone, replayed on the whole cluster."""
    alone = fddps.schedule(graph, cluster.subset(host_names), algorithm="fddps")
    members = [cluster.device_index(n) for n in host_names]
    order = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
    for j, k in enumerate(members):
        order[k] = alone.order[j]
    return Schedule.from_order(graph, cluster, np.asarray(members)[alone.device], order)


@pytest.mark.parametrize("seed", range(6))
def test_fddps_on_hosts_sharing_a_nic_is_no_slower_than_one_host(seed):
    g = training_graph(120, seed=seed, mean_cost=1e-3, mean_bytes=2e6)
    c = Cluster.multi_host(2, 3, intra_bandwidth=12e9, inter_bandwidth=1.1e9, intra_latency=1e-5,
                           inter_latency=5e-5, topology="10gbe")
    s = fddps.schedule(g, c, algorithm="fddps").validate()
    host0 = [d.name for d in c.devices if d.host == c.devices[0].host]
    assert s.makespan <= _embedded(g, c, host0).makespan * (1 + 1e-9)
    # Off, FD-DPS may spread over both hosts; on, it is never worse than that either.
    plain = fddps.schedule(g, c, algorithm="fddps", single_device_guard=False)
    assert s.makespan <= plain.makespan * (1 + 1e-9)


def test_a_host_that_cannot_take_the_pinned_ops_is_skipped():
    g = training_graph(60, seed=4, mean_cost=1e-3, mean_bytes=2e6)
    c = Cluster.multi_host(2, 2, intra_bandwidth=12e9, inter_bandwidth=1e8, topology="10gbe")
    pinned = c.devices[3].name  # on host 1
    edges = [(g.names[a], g.names[b], float(x)) for a, b, x in zip(g.src, g.dst, g.bytes)]
    g = fddps.OpGraph(g.names, g.cost, edges, memory=g.memory, pinned={g.names[0]: pinned})
    s = fddps.schedule(g, c, algorithm="fddps").validate()
    assert s.placement[g.names[0]] == pinned
    if "single_host_fallback" in s.info:
        assert s.info["single_host_fallback"] == c.devices[3].host


def test_subset_keeps_links_and_restricts_what_is_shared():
    c = Cluster.multi_host(2, 2, intra_bandwidth=12e9, inter_bandwidth=1e9, topology="pcie3+10gbe")
    names = [c.names[0], c.names[1]]
    sub = c.subset(names)
    assert sub.names == tuple(names) and sub.bandwidth[0, 1] == c.bandwidth[0, 1]
    # The NICs carry only transfers between hosts: none is left; PCIe resources stay.
    assert all("10" not in r.name for r in sub.link_resources)
    assert all(set(p) <= set(names) for r in sub.link_resources for p in r.pairs)
    with pytest.raises(fddps.ClusterError, match="unknown device"):
        c.subset(["nope"])
    with pytest.raises(fddps.ClusterError, match="at least one device"):
        c.subset([])
