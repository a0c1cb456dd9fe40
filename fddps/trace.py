"""Write a schedule as a Chrome trace (chrome://tracing, https://ui.perfetto.dev).

The trace-event JSON format: one process per host, one thread per device, one
complete (``"X"``) event per op with its start and duration in microseconds,
and flow arrows (``"s"``/``"f"`` events) for tensors moved between devices.

Examples
--------
>>> import fddps, json, io
>>> g = fddps.OpGraph(["a", "b"], [1e-3, 2e-3], [("a", "b", 1e6)])
>>> s = fddps.schedule(g, fddps.Cluster.homogeneous(1))
>>> trace = to_chrome_trace(s)
>>> [(e["name"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
[('a', 0.0, 1000.0), ('b', 1000.0, 2000.0)]
"""

from __future__ import annotations

import json
import os

import numpy as np

from .simulate import _edge_comm


def to_chrome_trace(schedule, path=None, transfers=True) -> dict:
    """The schedule as a Chrome trace-event dictionary; written to ``path`` if given.

    Parameters
    ----------
    schedule : Schedule
    path : str, os.PathLike or writable text file, optional
        Where to write the JSON.
    transfers : bool
        Add a flow arrow per edge between ops on different devices (with its
        bytes and transfer time).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
    """
    g, c = schedule.graph, schedule.cluster
    hosts = []
    for d in c.devices:
        if d.host not in hosts:
            hosts.append(d.host)
    pid = [hosts.index(d.host) for d in c.devices]
    events = []
    for p, host in enumerate(hosts):
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": f"host {host}"}})
    for k, d in enumerate(c.devices):
        events.append({"ph": "M", "name": "thread_name", "pid": pid[k], "tid": k,
                       "args": {"name": d.name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid[k], "tid": k,
                       "args": {"sort_index": k}})
    us = 1e6
    start, finish = schedule.start.tolist(), schedule.finish.tolist()
    dev = schedule.device.tolist()
    for i, name in enumerate(g.names):
        k = dev[i]
        events.append({"ph": "X", "name": str(name), "cat": g.op_types[i] or "op",
                       "pid": pid[k], "tid": k, "ts": start[i] * us,
                       "dur": (finish[i] - start[i]) * us,
                       "args": {"op_type": g.op_types[i], "device": c.names[k]}})
    if transfers and g.num_edges:
        device = schedule.device
        comm = _edge_comm(g, c, device)
        for e in np.flatnonzero(device[g.src] != device[g.dst]).tolist():
            u, v = int(g.src[e]), int(g.dst[e])
            common = {"cat": "transfer", "name": "transfer", "id": e}
            # The arrow leaves from inside the producer's slice and binds to the consumer's.
            events.append({**common, "ph": "s", "pid": pid[dev[u]], "tid": dev[u],
                           "ts": (start[u] + finish[u]) / 2 * us,
                           "args": {"bytes": float(g.bytes[e]), "seconds": float(comm[e])}})
            events.append({**common, "ph": "f", "bp": "e", "pid": pid[dev[v]], "tid": dev[v],
                           "ts": start[v] * us})
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"algorithm": schedule.algorithm, "makespan_seconds": schedule.makespan,
                           "ops": g.num_ops, "devices": list(c.names)}}
    if path is not None:
        if hasattr(path, "write"):
            json.dump(trace, path)
        else:
            with open(os.fspath(path), "w") as f:
                json.dump(trace, f)
    return trace
