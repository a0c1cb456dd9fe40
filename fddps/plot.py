"""Draw a schedule: a Gantt chart per device with its critical path marked.

Works on any :class:`~fddps.schedule.Schedule` (no TensorFlow); matplotlib is
imported when a chart is drawn.

Examples
--------
>>> import fddps
>>> g = fddps.OpGraph(["a", "b", "c"], [1.0, 2.0, 2.0], [("a", "b"), ("a", "c")])
>>> s = fddps.schedule(g, fddps.Cluster.homogeneous(2))
>>> [g.names[i] for i in critical_path(s)]
['a', 'b']
"""

from __future__ import annotations

import numpy as np

from .simulate import _edge_comm

#: Colours of the most time-consuming op types; the rest are grey.
_PALETTE = "tab10"
_OTHER_COLOR = "#b0b0b0"


def critical_path(schedule) -> list[int]:
    """Indices of the ops on the schedule's critical path, first to last.

    Walks back from the op that finishes last: each op's start is set either by
    an input arriving (producer's finish plus transfer) or by the op before it
    on its device finishing; the walk follows whichever set it (a data
    dependency when both did), until an op that starts at time 0. The times
    are the schedule's replayed ones, so the path's ops and waits add up to the
    makespan.

    Parameters
    ----------
    schedule : Schedule

    Returns
    -------
    list of int
        Empty for an empty graph.
    """
    g = schedule.graph
    n = g.num_ops
    if n == 0:
        return []
    start, finish = schedule.start, schedule.finish
    comm = _edge_comm(g, schedule.cluster, schedule.device)
    arrival = finish[g.src] + comm
    prev_on_device = np.full(n, -1, dtype=np.int64)
    for seq in schedule.order:
        if len(seq) > 1:
            prev_on_device[seq[1:]] = seq[:-1]
    tol = 1e-9 * max(schedule.makespan, 1e-300)
    i = int(np.argmax(finish))
    path = [i]
    seen = {i}
    while start[i] > tol:
        eids = g.pred_eid[g.pred_ptr[i]:g.pred_ptr[i + 1]]
        best = -1
        if eids.size:
            k = int(np.argmax(arrival[eids]))
            if arrival[eids[k]] >= start[i] - tol:
                best = int(g.src[eids[k]])
        q = int(prev_on_device[i])
        if best < 0 and q >= 0 and finish[q] >= start[i] - tol:
            best = q
        if best < 0:  # an idle wait with no cause (not produced by replay): stop here
            break
        if best in seen:
            break
        i = best
        seen.add(i)
        path.append(i)
    return path[::-1]


# ``plot_schedule``'s ``critical_path`` flag shadows the function inside it.
_critical_path = critical_path


def _time_unit(makespan):
    if makespan >= 1.0:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def plot_schedule(schedule, ax=None, critical_path=True, transfers=False, max_op_types=9):
    """Gantt chart of a schedule: one lane per device, one bar per op.

    Bars are coloured by op type (the ``max_op_types`` types with the most
    compute time get their own colour; the rest are grey).

    Parameters
    ----------
    schedule : Schedule
    ax : matplotlib Axes, optional
        Drawn into a new figure when not given.
    critical_path : bool
        Outline the ops of :func:`critical_path` in red and join them with a red line.
    transfers : bool
        Draw every transfer between devices as a grey line from the producer's
        finish on its lane to the tensor's arrival on the consumer's lane.
    max_op_types : int

    Returns
    -------
    matplotlib Axes
    """
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    g, c = schedule.graph, schedule.cluster
    m = c.num_devices
    scale, unit = _time_unit(schedule.makespan)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * m))
    start, dur = schedule.start * scale, (schedule.finish - schedule.start) * scale
    dev = schedule.device
    types = np.asarray([t or "op" for t in g.op_types], dtype=object)
    if g.num_ops:
        totals = {}
        for t, d in zip(types.tolist(), dur.tolist()):
            totals[t] = totals.get(t, 0.0) + d
        top = sorted(totals, key=lambda t: -totals[t])[:max_op_types]
    else:
        top = []
    cmap = plt.get_cmap(_PALETTE)
    colors = {t: cmap(k % cmap.N) for k, t in enumerate(top)}
    height = 0.7
    handles = []
    for t in top + ["other"]:
        sel = (types == t) if t != "other" else ~np.isin(types, top)
        color = colors.get(t, _OTHER_COLOR)
        if not sel.any():
            continue
        for k in range(m):
            on = np.flatnonzero(sel & (dev == k))
            if on.size:
                ax.broken_barh(list(zip(start[on], dur[on])), (k - height / 2, height),
                               facecolors=color, edgecolors="none")
        handles.append(Patch(facecolor=color, label=t))
    if critical_path and g.num_ops:
        path = np.asarray(_critical_path(schedule), dtype=np.int64)
        for k in range(m):
            on = path[dev[path] == k]
            if on.size:
                ax.broken_barh(list(zip(start[on], dur[on])), (k - height / 2, height),
                               facecolors="none", edgecolors="red", linewidths=1.5)
        xs = np.ravel(np.column_stack([start[path], start[path] + dur[path]]))
        ys = np.repeat(dev[path], 2)
        ax.plot(xs, ys, color="red", linewidth=1.0, alpha=0.8)
        handles.append(Patch(facecolor="none", edgecolor="red",
                             label=f"critical path ({len(path)} ops)"))
    if transfers and g.num_edges:
        comm = _edge_comm(g, c, dev) * scale
        cross = np.flatnonzero(dev[g.src] != dev[g.dst])
        if cross.size:
            t0 = schedule.finish[g.src[cross]] * scale
            segs = np.stack([np.column_stack([t0, dev[g.src[cross]]]),
                             np.column_stack([t0 + comm[cross], dev[g.dst[cross]]])], axis=1)
            ax.add_collection(LineCollection(segs, colors="0.35", linewidths=0.6, alpha=0.5))
    ax.set_yticks(range(m))
    ax.set_yticklabels(c.names)
    ax.set_ylim(m - 0.5, -0.5)
    ax.set_xlim(0, max(schedule.makespan * scale, 1e-12) * 1.01)
    ax.set_xlabel(f"time ({unit})")
    name = schedule.algorithm or "schedule"
    ax.set_title(f"{name}: {g.num_ops} ops on {m} devices, makespan "
                 f"{schedule.makespan * scale:.4g} {unit}")
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  frameon=False)
    return ax
