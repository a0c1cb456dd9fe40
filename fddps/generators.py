"""Synthetic op graphs for tests and benchmarks.

:func:`training_graph` builds graphs shaped like one training step: a forward
pass of layers with parallel branches, a mirrored backward pass, and a weight
update per parameterised op. Costs and sizes are random but seeded, so the same
arguments give the same graph.
"""

from __future__ import annotations

import numpy as np

from .graph import OpGraph


def training_graph(num_ops: int, *, seed: int = 0, max_branches: int = 4,
                   mean_cost: float = 1e-3, mean_bytes: float = 4e6,
                   param_bytes: float = 2e6) -> OpGraph:
    """A random graph shaped like a training step, with about ``num_ops`` ops.

    Forward: a chain of layers, each with 1..``max_branches`` parallel branches
    of 1-3 ops that join in a concat. Each branch op has a weight variable.
    Backward: for every forward op, a gradient op that depends on the gradients
    of the op's consumers and on the op's forward output (the activation kept
    for backprop), plus a weight-gradient op feeding an apply op that also reads
    the variable. Costs are log-normal around ``mean_cost`` seconds (backward ops
    twice as costly, updates cheap); edges carry log-normal byte counts around
    ``mean_bytes``; variables and their apply ops form a colocation group
    holding ``param_bytes``-ish of persistent memory.

    Parameters
    ----------
    num_ops : int
        Target size; the result is within a few ops of it (at least 10).
    seed : int

    Returns
    -------
    OpGraph

    Examples
    --------
    >>> g = training_graph(1000, seed=1)
    >>> 990 <= g.num_ops <= 1010
    True
    """
    rng = np.random.default_rng(seed)
    names, cost, memory, types, group = [], [], [], [], []
    edges = []

    def op(kind, c, mem=0.0, grp=None):
        names.append(f"{kind}_{len(names)}")
        cost.append(c)
        memory.append(mem)
        types.append(kind)
        group.append(grp)
        return len(names) - 1

    def lognormal(mean, size=None):
        return mean * rng.lognormal(-0.5, 1.0, size)

    x = op("Input", 0.0)
    forward = []  # (op, input, variable)
    # Each forward op adds three backward ops (two gradients and an apply) and
    # the loss adds two: stop the forward pass when the total would reach num_ops.
    while len(names) + 3 * len(forward) + 2 < num_ops:
        branches = int(rng.integers(1, max_branches + 1))
        outs = []
        for _ in range(branches):
            h = x
            for _ in range(int(rng.integers(1, 4))):
                v = op("Variable", 0.0, lognormal(param_bytes), grp=len(names))
                f = op("Conv2D", lognormal(mean_cost))
                edges += [(h, f, lognormal(mean_bytes)), (v, f, memory[v])]
                forward.append((f, h, v))
                h = f
            outs.append(h)
        if len(outs) > 1:
            j = op("Concat", lognormal(mean_cost / 20))
            edges += [(o, j, lognormal(mean_bytes)) for o in outs]
            x = j
        else:
            x = outs[0]
    loss = op("Loss", lognormal(mean_cost / 10))
    edges.append((x, loss, lognormal(mean_bytes / 100)))

    # Backward: the gradient w.r.t. an op's output sums the gradients its
    # consumers send back (several in-edges stand for the implicit AddN).
    loss_grad = op("LossGrad", lognormal(mean_cost / 10))
    edges.append((loss, loss_grad, 4.0))
    consumers = {}
    for s, d, _ in edges:
        consumers.setdefault(s, []).append(d)
    sent_back = {loss: [loss_grad]}  # op -> gradient ops w.r.t. its output
    for f, h, v in reversed(forward):
        g_in = op("Conv2DBackpropInput", 2 * lognormal(mean_cost))
        g_w = op("Conv2DBackpropFilter", 2 * lognormal(mean_cost))
        upstream = []
        for c in consumers.get(f, []):
            upstream += sent_back.get(c, [])
        for u in upstream or [loss_grad]:
            nbytes = lognormal(mean_bytes)
            edges += [(u, g_in, nbytes), (u, g_w, nbytes)]
        edges += [(h, g_w, lognormal(mean_bytes)), (v, g_in, memory[v])]
        apply = op("ApplyMomentum", lognormal(mean_cost / 20), grp=group[v])
        edges += [(g_w, apply, memory[v]), (v, apply, 0.0)]
        sent_back[f] = [g_in]
        sent_back.setdefault(h, []).append(g_in)
    edges = [(names[s], names[d], b) for s, d, b in edges]
    return OpGraph(names, cost, edges, memory=memory, op_types=types, colocation=group)
