"""The plans Tofu is compared against (Wang et al., EuroSys 2019, Sections 7.1-7.3).

Partitioners of its Figure 10 (Section 7.3), each a :class:`~fddps.search.tofu.Tofu`
variant whose plan the same evaluator scores
(:func:`fddps.strategy.simulate_strategy`):

- :class:`AllRowGreedy` -- "partitions all tensors along the first dimension
  and partitions each operator using the best strategy given that its
  input/output tensors are partitioned on the first dimension": every op
  whose first output axis can be split ``k`` ways splits it (for a
  convolution or MatMul, the sample; for a variable, its rows); the others
  pick the least-communication split given those (by the DP), one level of
  ``k`` ways.
- :class:`Spartan` -- "greedily partition the largest tensor first (along
  any dimension), followed by its incident operators, followed by the second
  largest tensor and so on" (Spartan, Huang et al., USENIX ATC 2015): coarse
  nodes in order of their largest tensor (an output or a variable), each
  taking the split with the fewest bytes to the nodes already decided, one
  level of ``k`` ways.
- :class:`EqualChop` -- "Tofu's DP algorithm applied to chop each tensor
  equally along only one dimension": Tofu's exact DP, one level of ``k`` ways
  (no recursion, so no grid of two dimensions).
- :class:`ICML18` -- Jia et al. (ICML 2018) "which does not consider the
  partition strategy of aggregating output tensors (aka output-reduction)":
  Tofu's recursive DP with no op split along a reduction dimension (which
  leaves partial sums to reduce). The paper notes that with output reduction
  ICML18 finds Tofu's plan, only slower; we do not rebuild its
  non-recursive search.

All keep Tofu's coarsening and objective (bytes moved) and are searched with
memory weight 0 only (:meth:`Tofu.plan`): a heuristic does not retry with a
memory penalty. :func:`partitioner_plan` simulates one and says whether it
fits.

The swapping baseline of Section 7.1 (:func:`swap_seconds`): the bytes each
GPU must move to and from host memory per step, at least twice its simulated
peak over capacity (each byte over goes out once and comes back once; a lower
bound on vDNN-style LRU swapping, which the paper's baseline implements),
over the host links of :mod:`fddps.topology` -- each GPU's PCIe link and the
switch uplink it shares -- plus a host root link all GPUs share (the
paper's testbed: "the CPU-GPU bandwidth is 10 GB/s", which "all 8 GPUs share").
Prefetching overlaps the transfers with compute, so a step takes the longer
of the two.

Example
-------
>>> sorted(PARTITIONERS)
['allrow_greedy', 'equalchop', 'icml18', 'spartan', 'tofu']
"""

from __future__ import annotations

import numpy as np

from .tofu import Tofu

GB = 1e9


class EqualChop(Tofu):
    """Tofu's DP over one level of ``k`` ways: every tensor chopped along one dimension."""

    def _ways(self, k):
        return [k] if k > 1 else []


class AllRowGreedy(EqualChop):
    """Every op splits its first output axis where it can (module notes)."""

    def _choices(self, dim, factor, ways):
        out = super()._choices(dim, factor, ways)
        first = dim.outputs[0] if dim.outputs else None
        if isinstance(first, tuple) and first and first[0] in out:
            return [first[0]]
        return out


class Spartan(EqualChop):
    """Largest tensor first, each node the split with the fewest bytes to the decided ones."""

    def _solve(self, problem, nodes, step):
        order = np.argsort(-np.asarray(self._node_bytes), kind="stable")
        neighbours = [[] for _ in problem.size]
        for (a, b), m in problem.pairs.items():
            neighbours[a].append((b, m))
            neighbours[b].append((a, m.T))
        picked = [None] * len(problem.size)
        for t in order:
            cost = np.array(problem.unary[t], dtype=np.float64)
            for u, m in neighbours[t]:
                if picked[u] is not None:
                    cost = cost + m[:, picked[u]]
            picked[t] = int(np.argmin(cost))
        return problem.cost(picked), picked, False, "greedy, largest tensor first"


class ICML18(Tofu):
    """Tofu's recursive DP without output reduction (no split along a reduction)."""

    def _choices(self, dim, factor, ways):
        out = [d for d in super()._choices(dim, factor, ways) if d not in dim.reduction]
        return out or [None]


#: name -> the Tofu variant class (``tofu`` itself included).
PARTITIONERS = {"tofu": Tofu, "allrow_greedy": AllRowGreedy, "spartan": Spartan,
                "equalchop": EqualChop, "icml18": ICML18}


def partitioner_plan(name, step, cluster, cost_model, **options):
    """The plan of partitioner ``name`` and its simulated step.

    ``tofu`` runs :meth:`Tofu.search` (with its memory fallback; a plan that
    does not fit is returned, ``fits=False``); the others
    :meth:`Tofu.plan` once, then simulate.

    Returns
    -------
    TofuPlan
        With ``timeline``, ``peak_memory`` and ``fits`` filled.

    Raises
    ------
    ValueError
        For an unknown ``name``.
    """
    from ..strategy import simulate_strategy

    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; known: {', '.join(sorted(PARTITIONERS))}")
    search = PARTITIONERS[name](**options)
    if name == "tofu":
        return search.search(step, cluster, cost_model, infeasible="return")
    plan = search.plan(step, cluster.names)
    timeline = simulate_strategy(step, plan.strategy, cluster, cost_model)
    plan.timeline, plan.peak_memory = timeline, timeline.peak_memory
    peak = np.asarray(timeline.peak_memory, dtype=np.float64)
    capacity = np.asarray(cluster.memory, dtype=np.float64)
    plan.fits = bool((peak <= capacity * (1 + 1e-12)).all())
    plan.info.update(capacity=capacity.tolist())
    return plan


#: The paper's testbed (EC2 p2.8xlarge): "The CPU-GPU bandwidth is 10GB/s", shared.
HOST_BANDWIDTH = 10 * GB


def swap_seconds(swapped_bytes, devices, topology="pcie3", host_bandwidth=HOST_BANDWIDTH):
    """Seconds to move each GPU's ``swapped_bytes`` out to host memory and back.

    Parameters
    ----------
    swapped_bytes : sequence of float
        Per GPU, the bytes it swaps out in one step (the same come back in).
    devices : sequence of fddps.cluster.Device
        The GPUs (their hosts place them behind PCIe switches).
    topology : str
        A :mod:`fddps.topology` preset with a PCIe part: its per-GPU links and
        switch uplinks carry the swaps.
    host_bandwidth : float
        Bytes per second per direction of the link to host memory all GPUs
        share (the root complex; :data:`HOST_BANDWIDTH`).

    Returns
    -------
    float
        The busiest resource's seconds: each resource carries the bytes of the
        GPUs behind it, per direction.

    Raises
    ------
    ValueError
        When the lengths differ or a byte count is negative.

    Example
    -------
    >>> from fddps.cluster import Device
    >>> gpus = [Device(f"g{i}", "GPU") for i in range(8)]
    >>> swap_seconds([1e9] * 8, gpus)  # 8 GB each way over the shared 10 GB/s
    0.8
    """
    from ..cluster import Device
    from ..topology import link_resources

    devices = list(devices)
    swapped = np.asarray(swapped_bytes, dtype=np.float64)
    if swapped.shape != (len(devices),) or (swapped < 0).any():
        raise ValueError(f"swapped_bytes needs one byte count >= 0 per device ({len(devices)}), "
                         f"got {swapped_bytes!r}")
    host = "__host_memory__"
    resources = link_resources(devices + [Device(host, "CPU", host=devices[0].host)], topology)
    load = {d.name: b for d, b in zip(devices, swapped)}
    worst = float(swapped.sum()) / host_bandwidth
    for r in resources:
        out = sum(load[a] for a, b in r.pairs if b == host and a in load)
        back = sum(load[b] for a, b in r.pairs if a == host and b in load)
        worst = max(worst, max(out, back) / r.bandwidth)
    return worst


__all__ = ["AllRowGreedy", "EqualChop", "HOST_BANDWIDTH", "ICML18", "PARTITIONERS", "Spartan",
           "partitioner_plan", "swap_seconds"]
