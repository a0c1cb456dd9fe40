"""Draw a schedule: a Gantt chart per device, or each device's utilisation over time.

:func:`plot_schedule` draws one lane per device the schedule uses (idle
devices are counted in the title, not drawn; names shortened by
:func:`device_labels`): ops coloured by the op types that cost the most time
in total (the rest grey; plumbing ops that compute nothing -- Const, Identity,
NoOp, variable reads, ... -- one pale colour, listed last in the legend and
left out of its shares), the critical path as a red line above the bars of
its ops, joined across devices, and transfers as thin segments in a strip
below them, so that neither hides the ops. For graphs of thousands of ops,
``kind="utilization"`` (:func:`plot_utilization`) draws each device's busy
fraction per time bin (:func:`utilization`) instead.

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

#: Colours of the most time-consuming op types (tab10 without its grey); the rest are grey.
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf"]
_OTHER_COLOR = "#9a9a9a"
_NO_WORK_COLOR = "#e4e4e4"
_NO_WORK_LABEL = "plumbing (Const, Identity, NoOp, variable reads, ...)"
_PATH_COLOR = "#c00000"
#: Lane layout (device k's lane spans k - 0.5 .. k + 0.5, top to bottom): the
#: critical path line, the op bars, the transfer strip.
_PATH_Y = -0.40
_BAR_TOP, _BAR_HEIGHT = -0.34, 0.56
_TRANSFER_Y = 0.32


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


def device_labels(names) -> list[str]:
    """Short lane labels for device strings: what tells them apart, nothing more.

    ``/job:worker/replica:0/task:1/device:GPU:3`` becomes ``GPU:3`` when all
    devices are on one host, ``worker 1 GPU:3`` when they are on several
    (the job is left out when there is one job).

    Examples
    --------
    >>> device_labels(["/job:worker/replica:0/task:0/device:GPU:0",
    ...                "/job:worker/replica:0/task:1/device:GPU:0"])
    ['task 0 GPU:0', 'task 1 GPU:0']
    >>> device_labels(["/device:CPU:0", "/device:CPU:1"])
    ['CPU:0', 'CPU:1']
    """
    import re

    parsed = []
    for name in names:
        fields = dict(re.findall(r"/(job|replica|task|device):([^/]+)", str(name)))
        dev = fields.get("device", "")
        dev = dev.upper() if ":" not in dev else dev.split(":")[0].upper() + ":" + dev.split(":")[1]
        parsed.append((fields.get("job", "localhost"), fields.get("replica", "0"),
                       fields.get("task", "0"), dev or str(name)))
    hosts = {p[:3] for p in parsed}
    jobs = {p[0] for p in parsed}
    out = []
    for (job, replica, task, dev), name in zip(parsed, names):
        if len(hosts) == 1:
            label = dev
        elif len(jobs) == 1:
            label = f"task {task} {dev}" + (f" (replica {replica})" if replica != "0" else "")
        else:
            label = f"{job} {task} {dev}"
        out.append(label)
    if len(set(out)) < len(out):  # cannot tell them apart: keep the full names
        return [str(n) for n in names]
    return out


def _lanes(schedule, idle_lanes):
    """Device indices to draw: all, or (default) those running an op."""
    m = schedule.cluster.num_devices
    if idle_lanes or schedule.graph.num_ops == 0:
        return np.arange(m)
    used = np.unique(schedule.device)
    return used if used.size else np.arange(m)


def _devices_title(schedule, lanes):
    m = schedule.cluster.num_devices
    used = len(np.unique(schedule.device)) if schedule.graph.num_ops else 0
    text = f"on {used} of {m} devices"
    if len(lanes) < m:
        text += f" ({m - len(lanes)} idle, not drawn)"
    return text


def _time_unit(makespan):
    if makespan >= 1.0:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def op_time_by_type(schedule, max_op_types=9):
    """Which op types a chart colours: the ones that cost the most time in total.

    Ops that do no work (:data:`costmodel.NO_WORK_OPS`: Const, Identity,
    VarHandleOp, ...) are counted together as one group, whatever their number,
    so that they never crowd the op types that do work out of the legend.

    Parameters
    ----------
    schedule : Schedule
    max_op_types : int
        How many op types get a colour of their own.

    Returns
    -------
    labels : numpy.ndarray of str
        Per op, what it is drawn as: its op type if that is among the top
        ``max_op_types``, the plumbing group (:data:`_NO_WORK_LABEL`), or ``"other"``.
    totals : pandas.Series
        Seconds of op time per label, in the legend's order: the top op types
        (largest first), then ``"other"``, then the plumbing group.

    Examples
    --------
    >>> import fddps
    >>> g = fddps.OpGraph(["a", "b", "c", "d"], [1.0, 1.0, 3.0, 0.5], [],
    ...                   op_types=["Identity", "Identity", "Conv2D", "Relu"])
    >>> labels, totals = op_time_by_type(fddps.schedule(g, fddps.Cluster.homogeneous(1)), 1)
    >>> totals.round(1).to_dict()
    {'Conv2D': 3.0, 'other': 0.5, 'plumbing (Const, Identity, NoOp, variable reads, ...)': 2.0}
    >>> labels.tolist()[2:]
    ['Conv2D', 'other']
    """
    import pandas as pd
    from costmodel.hardware import NO_WORK_OPS

    g = schedule.graph
    dur = schedule.finish - schedule.start
    types = np.asarray([t or "op" for t in g.op_types], dtype=object)
    no_work = np.isin(types, list(NO_WORK_OPS))
    work_totals = pd.Series(dur[~no_work]).groupby(types[~no_work]).sum().sort_values(
        ascending=False, kind="stable")
    top = list(work_totals.index[:max_op_types])
    labels = np.where(np.isin(types, top), types, "other")
    labels[no_work] = _NO_WORK_LABEL
    totals = pd.Series(dur).groupby(labels).sum()
    order = top + [x for x in ("other", _NO_WORK_LABEL) if x in totals.index]
    return labels.astype(str), totals.reindex(order)


def utilization(schedule, bins=100):
    """Each device's busy fraction per time bin.

    Parameters
    ----------
    schedule : Schedule
    bins : int
        Equal bins from 0 to the makespan.

    Returns
    -------
    edges : numpy.ndarray, shape (bins + 1,)
        Bin edges in seconds.
    busy : numpy.ndarray, shape (devices, bins)
        Fraction of each bin during which an op runs on the device, in [0, 1];
        ``(busy * np.diff(edges)).sum(axis=1)`` is each device's total op time.

    Raises
    ------
    ValueError
        If ``bins`` < 1.

    Examples
    --------
    >>> import fddps
    >>> g = fddps.OpGraph(["a", "b"], [1.0, 3.0], [("a", "b")])
    >>> edges, busy = utilization(fddps.schedule(g, fddps.Cluster.homogeneous(2)), bins=4)
    >>> busy.sum(axis=0).tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    bins = int(bins)
    if bins < 1:
        raise ValueError(f"utilization needs bins >= 1, got {bins}")
    edges = np.linspace(0.0, max(schedule.makespan, 1e-300), bins + 1)
    busy = np.stack([_busy_per_bin(edges, schedule.start[on], schedule.finish[on])
                     for on in (schedule.device == k for k in range(schedule.cluster.num_devices))])
    return edges, np.clip(busy, 0.0, 1.0)


def _busy_per_bin(edges, start, finish):
    """Fraction of each bin between ``edges`` covered by the intervals [start, finish)."""
    # Busy time before t: sum over intervals of clip(t - start, 0, duration)
    #   = sum_{start < t} (t - start) - sum_{finish < t} (t - finish), from sorted ends.
    def before(points):
        points = np.sort(points)
        k = np.searchsorted(points, edges, side="left")
        csum = np.concatenate([[0.0], np.cumsum(points)])
        return k * edges - csum[k]

    busy = before(np.asarray(start, float)) - before(np.asarray(finish, float))
    return np.diff(busy) / np.diff(edges)


def plot_utilization(schedule, ax=None, bins=None, by_type=True, max_op_types=9,
                     idle_lanes=False):
    """Each device's busy fraction over time: one lane per device, filled up to the fraction.

    Readable whatever the number of ops (a Gantt chart of thousands of ops is
    not); the right margin gives each device's utilisation over the whole step.

    Parameters
    ----------
    schedule : Schedule
    ax : matplotlib Axes, optional
    bins : int, optional
        Time bins (default 150).
    by_type : bool
        Stack the fill by op type, in the colours of :func:`plot_schedule`
        (:func:`op_time_by_type`); else one colour.
    max_op_types : int
    idle_lanes : bool
        Draw a lane for devices that run no op too (default: they are
        counted in the title only).

    Returns
    -------
    matplotlib Axes
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    g, c = schedule.graph, schedule.cluster
    lanes = _lanes(schedule, idle_lanes)
    m = len(lanes)
    scale, unit = _time_unit(schedule.makespan)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 1.0 + 0.5 * m))
    edges, busy = utilization(schedule, bins or 150)
    x = np.repeat(edges * scale, 2)[1:-1]
    total = (busy * np.diff(edges)).sum(axis=1)
    groups = [(None, _COLORS[0], np.ones(g.num_ops, bool))]
    if by_type and g.num_ops:
        labels, totals = op_time_by_type(schedule, max_op_types)
        colors = _label_colors(totals, max_op_types)
        groups = [(label, colors[label], labels == label) for label in totals.index]
    height = 0.84
    for row, k in enumerate(lanes.tolist()):
        base = row + height / 2
        level = np.zeros(len(edges) - 1)
        on_k = schedule.device == k
        for _, color, sel in groups:
            on = on_k & sel
            if not on.any():
                continue
            frac = _busy_per_bin(edges, schedule.start[on], schedule.finish[on])
            low, level = level, np.minimum(level + frac, 1.0)
            ax.fill_between(x, base - height * np.repeat(low, 2), base - height * np.repeat(level, 2),
                            color=color, linewidth=0, gid="utilization")
        ax.axhline(base, color="0.6", linewidth=0.5)
        ax.axhline(base - height, color="0.8", linewidth=0.5, linestyle=":")
        share = total[k] / schedule.makespan if schedule.makespan > 0 else 0.0
        ax.annotate(f"{share:.0%} busy", (1.005, row), xycoords=("axes fraction", "data"),
                    va="center", fontsize="small")
    ax.set_yticks(range(m))
    ax.set_yticklabels([device_labels(c.names)[k] for k in lanes.tolist()])
    ax.set_ylim(m - 0.5, -0.5)
    ax.set_xlim(0, max(schedule.makespan * scale, 1e-12))
    ax.set_xlabel(f"time ({unit}); filled: fraction of each {(edges[1] - edges[0]) * scale:.3g} "
                  f"{unit} bin the device is busy (dotted: 100%)")
    name = schedule.algorithm or "schedule"
    ax.set_title(f"{name}: utilisation, {g.num_ops} ops {_devices_title(schedule, lanes)}, "
                 f"step {schedule.makespan * scale:.4g} {unit}")
    if by_type and g.num_ops:
        ax.legend(handles=[Patch(facecolor=col, label=lab) for lab, col, _ in groups],
                  loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize="small", frameon=False)
    return ax


def _label_colors(totals, max_op_types):
    colors = dict(zip([x for x in totals.index if x not in (_NO_WORK_LABEL, "other")][:max_op_types],
                      _COLORS))
    colors.update({_NO_WORK_LABEL: _NO_WORK_COLOR, "other": _OTHER_COLOR})
    return colors


def plot_schedule(schedule, ax=None, critical_path=True, transfers=False, max_op_types=9,
                  kind="gantt", bins=None, legend=True, idle_lanes=False):
    """Gantt chart of a schedule: one lane per device, one bar per op.

    Bars are coloured by op type: the ``max_op_types`` types that cost the
    most time in total get a colour each (:func:`op_time_by_type`; the legend
    lists them with their total time and share of the op time that does
    work, largest first), the rest grey, and plumbing ops that compute
    nothing (Const, Identity, NoOp, variable reads) one pale colour, listed
    last with their count. The critical path is a red line above the bars of
    the ops on it, joined by red dashes where it moves between devices, and
    transfers are thin segments in a strip under each lane, from the send to
    the tensor's arrival on that device, so that neither covers the ops.
    Devices that run no op get no lane (the title counts them) unless
    ``idle_lanes``; lanes are labelled by :func:`device_labels`.

    Parameters
    ----------
    schedule : Schedule
    ax : matplotlib Axes, optional
        Drawn into a new figure when not given.
    critical_path : bool
        Draw :func:`critical_path`.
    transfers : bool
        Draw every transfer between devices in the receiving device's strip.
    max_op_types : int
    kind : {"gantt", "utilization"}
        ``"utilization"``: :func:`plot_utilization` instead (``bins`` time bins).
    legend : bool
        Draw the legend (right of the chart); off for all but one of several
        charts of one graph, whose colours are the same.
    idle_lanes : bool
        Draw a lane for each device that runs no op too.

    Returns
    -------
    matplotlib Axes

    Raises
    ------
    ValueError
        For an unknown ``kind``.
    """
    if kind in ("utilization", "utilisation"):
        ax = plot_utilization(schedule, ax=ax, bins=bins, max_op_types=max_op_types,
                              idle_lanes=idle_lanes)
        if not legend and ax.get_legend() is not None:
            ax.get_legend().remove()
        return ax
    if kind != "gantt":
        raise ValueError(f"plot_schedule: unknown kind {kind!r}; use 'gantt' or 'utilization'")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    g, c = schedule.graph, schedule.cluster
    lanes = _lanes(schedule, idle_lanes)
    m = len(lanes)
    row = np.full(c.num_devices, -1, dtype=np.int64)
    row[lanes] = np.arange(m)
    scale, unit = _time_unit(schedule.makespan)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * m))
    start, dur = schedule.start * scale, (schedule.finish - schedule.start) * scale
    dev = schedule.device
    handles = []
    if g.num_ops:
        labels, totals = op_time_by_type(schedule, max_op_types)
        colors = _label_colors(totals, max_op_types)
        work = max(float(totals.drop(_NO_WORK_LABEL, errors="ignore").sum()), 1e-300)
        for label, total in totals.items():
            sel = labels == label
            for r, k in enumerate(lanes.tolist()):
                on = np.flatnonzero(sel & (dev == k))
                if on.size:
                    ax.broken_barh(list(zip(start[on], dur[on])), (r + _BAR_TOP, _BAR_HEIGHT),
                                   facecolors=colors[label], edgecolors="none", gid=f"ops:{label}")
            if label == _NO_WORK_LABEL:
                text = f"{label}: {int(sel.sum())} ops"
            else:
                text = f"{label}  {total * scale:.3g} {unit} ({total / work:.0%})"
            handles.append(Patch(facecolor=colors[label], label=text))
    if critical_path and g.num_ops:
        path = np.asarray(_critical_path(schedule), dtype=np.int64)
        y = row[dev[path]] + _PATH_Y
        on_ops = np.stack([np.column_stack([start[path], y]),
                           np.column_stack([start[path] + dur[path], y])], axis=1)
        ax.add_collection(LineCollection(on_ops, colors=_PATH_COLOR, linewidths=3.0,
                                         gid="critical_path", capstyle="butt"))
        # Joined from the end of each op to the start of the next, so that the path
        # reads as one line, dashed where it waits or moves to another device.
        gaps = np.flatnonzero((dev[path][1:] != dev[path][:-1])
                              | (start[path][1:] > start[path][:-1] + dur[path][:-1] + 1e-12))
        if gaps.size:
            a, b = path[gaps], path[gaps + 1]
            hops = np.stack([np.column_stack([start[a] + dur[a], row[dev[a]] + _PATH_Y]),
                             np.column_stack([start[b], row[dev[b]] + _PATH_Y])], axis=1)
            ax.add_collection(LineCollection(hops, colors=_PATH_COLOR, linewidths=1.2,
                                             linestyles=(0, (3, 2)), gid="critical_path_hops"))
        length = float(dur[path].sum())
        moves = int((dev[path][1:] != dev[path][:-1]).sum())
        handles.append(Line2D([], [], color=_PATH_COLOR, linewidth=3.0,
                              label=f"critical path: {len(path)} ops, {length:.3g} {unit} of "
                                    f"compute, {moves} device changes (dashed)"))
    if transfers and g.num_edges:
        comm = _edge_comm(g, c, dev) * scale
        cross = np.flatnonzero(dev[g.src] != dev[g.dst])
        if cross.size:
            t0 = schedule.finish[g.src[cross]] * scale
            y = row[dev[g.dst[cross]]] + _TRANSFER_Y
            segs = np.stack([np.column_stack([t0, y]), np.column_stack([t0 + comm[cross], y])],
                            axis=1)
            ax.add_collection(LineCollection(segs, colors="#555555", linewidths=2.5, alpha=0.35,
                                             gid="transfers", capstyle="butt"))
            handles.append(Line2D([], [], color="#555555", alpha=0.6, linewidth=2.5,
                                  label=f"transfers in ({cross.size}, under each lane)"))
    ax.set_yticks(range(m))
    ax.set_yticklabels([device_labels(c.names)[k] for k in lanes.tolist()])
    for k in range(m - 1):
        ax.axhline(k + 0.5, color="0.9", linewidth=0.6)
    ax.set_ylim(m - 0.5, -0.5)
    ax.set_xlim(0, max(schedule.makespan * scale, 1e-12) * 1.01)
    ax.set_xlabel(f"time ({unit})")
    name = schedule.algorithm or "schedule"
    ax.set_title(f"{name}: {g.num_ops} ops {_devices_title(schedule, lanes)}, step "
                 f"{schedule.makespan * scale:.4g} {unit}")
    if handles and legend:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  frameon=False, title="where the op time goes (total, share of work)",
                  title_fontsize="small", alignment="left")
    return ax


def plot_overview(schedule, critical_path=True, transfers=True, max_op_types=9, bins=None):
    """A figure with the Gantt chart (:func:`plot_schedule`) above the utilisation view
    (:func:`plot_utilization`), on one time axis: what ran where, and how busy each device was.

    Returns
    -------
    matplotlib Figure
    """
    import matplotlib.pyplot as plt

    m = len(_lanes(schedule, False))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 2.0 + 1.0 * m), sharex=True,
                                      gridspec_kw={"height_ratios": [1.4, 1.0]})
    plot_schedule(schedule, ax=top, critical_path=critical_path, transfers=transfers,
                  max_op_types=max_op_types)
    plot_utilization(schedule, ax=bottom, bins=bins, max_op_types=max_op_types)
    top.set_xlabel("")
    bottom.set_title("")
    bottom.get_legend().remove()  # the Gantt chart's legend above has the same colours
    fig.tight_layout()
    return fig
