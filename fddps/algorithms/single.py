"""Everything on one device: the baseline every placement must beat.

Picks the device on which the whole graph runs fastest (sum of execution
times) among those that can run every op and hold all of its memory, and runs
the ops there in topological order. Transfers never happen, so the makespan is
the sum of the execution times.
"""

import numpy as np

from ..errors import InfeasibleError
from .base import PlacementState, Scheduler, register


def best_single_device(state: PlacementState):
    """Index and total time of the fastest device that can hold the whole graph, or ``(None, inf)``."""
    g = state.graph
    total = state.et.sum(axis=0)
    need = float(g.memory.sum() + g.transient.sum())
    pinned = {state.cluster.device_index(d) for d in g.pinned.values()}
    best, best_time = None, np.inf
    for k in np.argsort(total, kind="stable").tolist():
        if np.isfinite(total[k]) and need <= state.capacity[k] and pinned <= {k}:
            best, best_time = k, float(total[k])
            break
    return best, best_time


@register
class SingleDevice(Scheduler):
    """All ops on the single best device, in topological order."""

    name = "single"

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        k, _ = best_single_device(state)
        if k is None:
            raise InfeasibleError("no single device can run every op and hold the whole graph's "
                                  f"{graph.memory.sum() + graph.transient.sum():.6g} bytes")
        device = np.full(graph.num_ops, k, dtype=np.int64)
        order = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
        order[k] = graph.topo
        from ..schedule import Schedule
        return Schedule.from_order(graph, cluster, device, order, exec_time=state.et)
