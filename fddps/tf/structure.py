"""The structure of an analysed graph: which nodes a step runs, the forward
graph, the nodes inside ``tf.cond`` branches.

Plain functions over a :class:`~fddps.tf.graphdef.GraphAnalysis`, shared by
the reader (:mod:`fddps.tf.read`), the writer (:mod:`fddps.tf.write`), the
split candidates and the strategy graph.
"""

from __future__ import annotations

import numpy as np

from ..errors import GraphError
from .graphdef import MERGE_OPS, SWITCH_OPS, GraphAnalysis, _parse_input


def step_nodes(analysis: GraphAnalysis, fetches) -> np.ndarray:
    """Mask of the nodes one ``session.run(fetches)`` executes: the fetches' ancestors.

    Every input edge counts, ``NextIteration -> Merge`` back edges included (a
    loop body runs whole).
    """
    names = analysis.table["name"].tolist()
    position = {name: i for i, name in enumerate(names)}
    if isinstance(fetches, str):
        fetches = [fetches]
    roots = []
    for f in fetches:
        if not isinstance(f, str):
            f = getattr(f, "name", f)
        if not isinstance(f, str):
            raise GraphError(f"fetches must be op or tensor names, got {f!r}")
        name, _ = _parse_input(f)
        if name not in position:
            raise GraphError(f"fetch {f!r} names no node of the graph")
        roots.append(position[name])
    n = len(names)
    preds = [[] for _ in range(n)]
    for s, d in zip(analysis.edges["src"].tolist(), analysis.edges["dst"].tolist()):
        preds[d].append(s)
    keep = np.zeros(n, dtype=bool)
    stack = list(roots)
    keep[roots] = True
    while stack:
        for p in preds[stack.pop()]:
            if not keep[p]:
                keep[p] = True
                stack.append(p)
    return keep


def forward_graph(analysis):
    """Successor lists over the forward edges and a topological order of all nodes."""
    n = len(analysis.table)
    e = analysis.edges
    fwd = ~e["back_edge"].to_numpy()
    succ = [[] for _ in range(n)]
    preds = [[] for _ in range(n)]
    indeg = [0] * n
    for s, d in zip(e["src"].to_numpy()[fwd].tolist(), e["dst"].to_numpy()[fwd].tolist()):
        succ[s].append(d)
        preds[d].append(s)
        indeg[d] += 1
    order = [i for i in range(n) if indeg[i] == 0]
    head = 0
    while head < len(order):
        for j in succ[order[head]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
        head += 1
    return succ, preds, order


def cond_branch_nodes(analysis):
    """Mask of nodes inside a ``tf.cond`` branch: reachable from a Switch before a Merge.

    Such nodes may be dead (not run) in a step; an order edge from one would
    make its consumer dead too.
    """
    n = len(analysis.table)
    op_types = analysis.table["op_type"].tolist()
    succ, _, _ = forward_graph(analysis)
    tainted = np.zeros(n, dtype=bool)
    stack = [i for i in range(n) if op_types[i] in SWITCH_OPS]
    while stack:
        i = stack.pop()
        for j in succ[i]:
            if not tainted[j] and op_types[j] not in MERGE_OPS:
                tainted[j] = True
                stack.append(j)
    return tainted
