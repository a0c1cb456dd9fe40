"""The structure of an analysed graph: which nodes a step runs, the forward
graph, the nodes inside ``tf.cond`` branches.

Plain functions over a :class:`~fddps.tf.graphdef.GraphAnalysis`, shared by
the reader (:mod:`fddps.tf.read`), the writer (:mod:`fddps.tf.write`), the
split candidates and the strategy graph.
"""

from __future__ import annotations

import numpy as np

from .graphdef import MERGE_OPS, SWITCH_OPS, GraphAnalysis, ancestors, fetch_positions


def step_nodes(analysis: GraphAnalysis, fetches) -> np.ndarray:
    """Mask of the nodes one ``session.run(fetches)`` executes: the fetches' ancestors.

    Every input edge counts, ``NextIteration -> Merge`` back edges included (a
    loop body runs whole).
    """
    names = analysis.table["name"].tolist()
    position = {name: i for i, name in enumerate(names)}
    roots = fetch_positions(position, fetches)
    return ancestors(len(names), analysis.edges["src"].tolist(), analysis.edges["dst"].tolist(),
                     roots)


def analysed_step(analysis: GraphAnalysis, fetches) -> np.ndarray:
    """:func:`step_nodes` of ``fetches`` (every node when None), checked to be analysed.

    Raises
    ------
    GraphError
        If a fetch is unknown.
    FddpsError
        If ``analysis`` was read for other fetches and lacks a node of this step.
    """
    keep = (np.ones(len(analysis.table), dtype=bool) if fetches is None
            else step_nodes(analysis, fetches))
    analysis.require_analysed(keep)
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
