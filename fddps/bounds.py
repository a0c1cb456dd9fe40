"""Lower bounds on the makespan."""

import numpy as np

from .algorithms.base import bottom_levels


def lower_bound(graph, cluster) -> float:
    """``max(critical path, total work / total speed)``, transfers ignored.

    The critical path takes every op at its fastest device; the work bound
    spreads every op's cheapest cost over the summed speed of all devices.
    No schedule can beat either.

    Examples
    --------
    >>> from fddps import OpGraph, Cluster
    >>> g = OpGraph(["a", "b", "c"], [2.0, 1.0, 1.0], [("a", "b"), ("a", "c")])
    >>> lower_bound(g, Cluster.homogeneous(2))
    3.0
    """
    if graph.num_ops == 0:
        return 0.0
    et = graph.exec_times(cluster)
    fastest = np.min(et, axis=1)
    critical_path = float(bottom_levels(graph, fastest, np.zeros(graph.num_edges)).max())
    work = float(np.sum(np.min(et * cluster.speed, axis=1)) / cluster.speed.sum())
    return max(critical_path, work)
