"""Write: a placed copy of the GraphDef, every node on its device.

Names, inputs and attributes are unchanged, so the placed graph computes
exactly what the original does and is fetched by the same names. FD-DPS's
splits are written in (:mod:`fddps.tf.split_rewrite`), the nodes a step does
not run (initializers, savers) follow their colocation group, their requested
device or their first input, and order control edges make TensorFlow follow a
schedule when asked.
"""

from __future__ import annotations

import numpy as np

from .devices import device_matches
from .graphdef import CONTROL_FLOW_OPS, _parse_input
from .split_rewrite import rewrite_splits
from .structure import cond_branch_nodes, forward_graph, step_nodes
from .tfimport import _tf


def needed_off_step(analysis, keep):
    """Step nodes that nodes outside the step need without the step's work.

    An initializer (``w/Assign``) reads the variable handle ``w``, a step node
    without inputs; running the initializer must not run the step, so ``w``
    must get no order edge. Nodes outside the step that hang off real step work
    (unused gradient branches) cannot run without the step anyway and protect nothing.
    """
    n = len(keep)
    if keep.all():
        return np.zeros(n, dtype=bool)
    succ, preds, order = forward_graph(analysis)
    work = np.zeros(n, dtype=bool)  # depends on a step node that has inputs
    for i in order:
        work[i] = (keep[i] and bool(preds[i])) or any(work[p] for p in preds[i])
    independent = [name for name, k, w in zip(analysis.table["name"], keep, work) if not k and not w]
    if not independent:
        return np.zeros(n, dtype=bool)
    return step_nodes(analysis, independent) & keep


def write_devices(analysis, device_of, splits=(), split_device=None):
    """A copy of the GraphDef with the splits written in and every node's device set.

    ``device_of``: device string of each original node (by position; a split
    op's is its combine's). ``splits``: decisions for
    :func:`fddps.tf.split_rewrite.rewrite_splits`, whose new nodes (appended)
    get ``split_device(name)``.
    """
    tf = _tf()
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(analysis.graph_def)
    if splits:
        rewrite_splits(out, analysis, splits, split_device)
    for node, dev in zip(out.node, device_of):
        node.device = dev
    return out


def add_order_edges(out, analysis, keep, schedule):
    """Add a ``^a`` input to each op ``b`` scheduled right after ``a`` on its device.

    Returns the number of edges added. Ops in loop frames, control flow and
    ``tf.cond`` branches are left out, and so are step ops that nodes outside
    the step need (see :func:`place`); ops the splits added (never in those)
    take part. No edge is added where ``b`` already reads ``a``.
    """
    table = analysis.table
    n_all = len(table)
    eligible = ((table["loop_frame"] == "").to_numpy()
                & ~table["op_type"].isin(CONTROL_FLOW_OPS).to_numpy()
                & ~cond_branch_nodes(analysis))
    shared = needed_off_step(analysis, keep)
    position = {node.name: k for k, node in enumerate(out.node)}
    names = schedule.graph.names
    added = 0
    for seq in schedule.order:
        chain = [position[names[i]] for i in seq.tolist()]
        chain = [k for k in chain if k >= n_all or eligible[k]]
        for a, b in zip(chain, chain[1:]):
            if b < n_all and shared[b]:
                continue
            node_b, name_a = out.node[b], out.node[a].name
            if any(_parse_input(s)[0] == name_a for s in node_b.input):
                continue
            node_b.input.append("^" + name_a)
            added += 1
    return added


def assign_off_step(analysis, keep, step_device, cluster, override):
    """Devices of the nodes a step does not run (initializers, savers): their group's,
    their requested one, or their first input's, else the first device."""
    table = analysis.table
    n = len(table)
    device = np.full(n, -1, dtype=np.int64)
    device[keep] = step_device
    group_dev = {}
    groups = table["colocation_group"].tolist()
    for i in np.flatnonzero(keep).tolist():
        if groups[i] is not None:
            group_dev.setdefault(groups[i], device[i])
    _, preds, queue = forward_graph(analysis)  # topological: inputs are placed first
    requested = table["requested_device"].tolist()
    for i in queue:
        if device[i] >= 0:
            continue
        g = groups[i]
        if g is not None and g in group_dev:
            device[i] = group_dev[g]
        else:
            k = -1
            if requested[i] and not override:
                matches = [kk for kk, d in enumerate(cluster.names) if device_matches(requested[i], d)]
                k = matches[0] if matches else -1
            if k < 0:
                placed = [device[p] for p in preds[i] if device[p] >= 0]
                k = placed[0] if placed else 0
            device[i] = k
            if g is not None:
                group_dev[g] = k
    return device
