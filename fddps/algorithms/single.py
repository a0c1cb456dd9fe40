"""Everything on one device: the baseline every placement must beat.

Picks the device on which the whole graph runs fastest (sum of execution
times) among those that can run every op and whose memory holds the peak of
running them there one after another in topological order, and runs them
there in that order. Transfers never happen, so the makespan is the sum of the
execution times.
"""

import numpy as np

from ..errors import InfeasibleError
from ..simulate import peak_memory
from .base import PlacementState, Scheduler, register


def single_device_peak(graph, cluster, k: int, exec_time=None) -> float:
    """Peak bytes on device ``k`` running every op of ``graph`` there in topological order.

    ``exec_time`` is the ``(n, m)`` table of :meth:`OpGraph.exec_times` (computed if omitted).
    """
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    finish = np.empty(graph.num_ops)
    finish[graph.topo] = np.cumsum(et[graph.topo, k])
    start = finish - et[:, k]
    device = np.full(graph.num_ops, k, dtype=np.int64)
    return float(peak_memory(graph, cluster, device, start, finish)[k])


def best_single_device(state: PlacementState):
    """Index and total time of the fastest device that can hold the whole graph, or ``(None, inf)``.

    A device holds the graph when it can run every op, no op is pinned
    elsewhere, and :func:`single_device_peak` is within its capacity.
    """
    g = state.graph
    total = state.et.sum(axis=0)
    pinned = {state.cluster.device_index(d) for d in g.pinned.values()}
    for k in np.argsort(total, kind="stable").tolist():
        if (np.isfinite(total[k]) and pinned <= {k}
                and single_device_peak(g, state.cluster, k, state.et) <= state.capacity[k]):
            return k, float(total[k])
    return None, np.inf


@register
class SingleDevice(Scheduler):
    """All ops on the single best device, in topological order."""

    name = "single"

    def _schedule(self, graph, cluster):
        state = PlacementState(graph, cluster)
        k, _ = best_single_device(state)
        if k is None:
            runnable = np.flatnonzero(np.isfinite(state.et.sum(axis=0))).tolist()
            peaks = [(single_device_peak(graph, cluster, d, state.et), d) for d in runnable]
            detail = ", ".join(f"{cluster.names[d]!r} peaks at {p:.6g} bytes (capacity "
                               f"{state.capacity[d]:.6g})" for p, d in peaks)
            pins = " or ops are pinned to different devices" if graph.pinned else ""
            raise InfeasibleError(
                f"no single device can run every op and hold the graph's peak memory{pins}: "
                f"in topological order {detail or 'no device runs every op'}",
                needed=min(peaks)[0] if peaks else None, available=float(cluster.memory.max()))
        device = np.full(graph.num_ops, k, dtype=np.int64)
        order = [np.zeros(0, dtype=np.int64)] * cluster.num_devices
        order[k] = graph.topo
        from ..schedule import Schedule
        return Schedule.from_order(graph, cluster, device, order, exec_time=state.et)
