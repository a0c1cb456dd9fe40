"""Paths through an op graph, and where each op may run: what schedulers and bounds share.

Plain functions over an :class:`~fddps.graph.OpGraph` (and a
:class:`~fddps.cluster.Cluster`), below the schedulers of
:mod:`fddps.algorithms` and the bounds of :mod:`fddps.bounds`.
"""

from __future__ import annotations

import numpy as np

from .errors import ClusterError, InfeasibleError


def bottom_levels(graph, node_cost, edge_cost) -> np.ndarray:
    """Longest path from each op to an exit, both ends included.

    ``blevel(i) = node_cost[i] + max over successors j of (edge_cost[e(i,j)] + blevel(j))``
    (HEFT's upward rank). Arrays are indexed by op and by edge id.
    """
    blevel = np.asarray(node_cost, dtype=np.float64).copy()
    bl = blevel.tolist()
    sp, si, se = graph.succ_ptr.tolist(), graph.succ_idx.tolist(), graph.succ_eid.tolist()
    ec = np.asarray(edge_cost, dtype=np.float64).tolist()
    for i in reversed(graph.topo.tolist()):
        best = 0.0
        for p in range(sp[i], sp[i + 1]):
            v = ec[se[p]] + bl[si[p]]
            if v > best:
                best = v
        bl[i] += best
    return np.asarray(bl)


def top_levels(graph, node_cost, edge_cost) -> np.ndarray:
    """Longest path from an entry to the start of each op (ALAP-free EST, DCP's AEST)."""
    tl = [0.0] * graph.num_ops
    nc = np.asarray(node_cost, dtype=np.float64).tolist()
    pp, pi, pe = graph.pred_ptr.tolist(), graph.pred_idx.tolist(), graph.pred_eid.tolist()
    ec = np.asarray(edge_cost, dtype=np.float64).tolist()
    for i in graph.topo.tolist():
        best = 0.0
        for p in range(pp[i], pp[i + 1]):
            j = pi[p]
            v = tl[j] + nc[j] + ec[pe[p]]
            if v > best:
                best = v
        tl[i] = best
    return np.asarray(tl)


def allowed_devices(graph, cluster, exec_time=None):
    """Per op, the devices it may run on, ignoring memory: kernels, pins, colocation.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    exec_time : array (ops, devices), optional
        ``graph.exec_times(cluster)`` when not given; ``inf`` where an op cannot run.

    Returns
    -------
    list of list of int
        Device indices per op; ops that may run anywhere share one list.

    Raises
    ------
    InfeasibleError
        If an op can run on no device, is pinned to a device that cannot run
        it, or is colocated with ops no single device can run together.
    ClusterError
        If an op is pinned to a device the cluster does not have.

    Examples
    --------
    >>> from fddps import Cluster, OpGraph
    >>> c = Cluster.homogeneous(2)
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [("a", "b")], pinned={"b": c.names[1]})
    >>> allowed_devices(g, c)
    [[0, 1], [1]]
    """
    g, c = graph, cluster
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    finite = np.isfinite(et)
    everywhere = list(range(cluster.num_devices))
    allowed = [everywhere] * graph.num_ops
    for i in np.flatnonzero(~finite.all(axis=1)).tolist():
        devs = np.flatnonzero(finite[i]).tolist()
        if not devs:
            raise InfeasibleError(f"op {g.names[i]!r} ({g.op_types[i] or 'unknown type'}) can run "
                                  f"on no device of the cluster: no cost for types "
                                  f"{sorted({d.type for d in c.devices})}")
        allowed[i] = devs
    for i, dev in g.pinned.items():
        try:
            k = c.device_index(dev)
        except ClusterError:
            raise ClusterError(f"op {g.names[i]!r} is pinned to {dev!r}, which is not in the "
                               f"cluster {list(c.names)}") from None
        if k not in allowed[i]:
            raise InfeasibleError(f"op {g.names[i]!r} is pinned to {dev!r}, which cannot run it")
        allowed[i] = [k]
    # A colocation group may only use devices every member can run on.
    if (g.colocation >= 0).any():
        common: dict[int, set] = {}
        for i, grp in enumerate(g.colocation.tolist()):
            if grp >= 0 and allowed[i] is not everywhere:
                common[grp] = common.get(grp, set(everywhere)) & set(allowed[i])
        for i, grp in enumerate(g.colocation.tolist()):
            if grp in common:
                devs = sorted(common[grp])
                if not devs:
                    raise InfeasibleError(f"op {g.names[i]!r} is colocated with ops that no "
                                          "single device can run together (pins or kernels)")
                allowed[i] = devs
    return allowed

