"""Intra-operator parallelism: split one op into parts along a tensor dimension.

FD-DPS's first step (paper Section 4.1, Algorithm 3 lines 2-6) splits
compute-heavy ops so that one long op becomes several short ones on several
devices. This module is the TensorFlow-free half of it:

- :data:`SPLIT_RULES`, a declarative registry in the spirit of Tofu's operator
  descriptions: for an op type, which dimension can be split, which inputs are
  sliced on which axis, and how the partial outputs combine (concatenate on an
  axis, or sum). Adding an op type is adding entries with :func:`register_split_rule`.
- :class:`SplitCandidate`: an op of a graph that a rule applies to, with the
  sizes the decision needs. The TensorFlow adapter builds them from shapes and
  hands them over in :attr:`OpGraph.split_candidates`.
- :func:`plan_splits` decides, from the graph's costs and the cluster, which
  candidates to split into how many parts; :func:`apply_splits` rewrites the
  op graph accordingly (slice, part and combine ops, the combine op keeping the
  original op's name so its consumers and fetches are unchanged).

Conv2D (NHWC) splits on the batch or the output channels; its input gradient
concatenates batch parts and sums channel parts; its filter gradient sums batch
parts and concatenates channel parts; MatMul splits on rows, columns or the
inner dimension. DESIGN.md records that each split matches the whole op to
float32 rounding on this machine.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .errors import GraphError, InfeasibleError
from .graph import OpGraph


@dataclass(frozen=True)
class SplitRule:
    """How an op type splits along one dimension.

    Attributes
    ----------
    op_type : str
        TensorFlow op type (``"Conv2D"``).
    dim : str
        Name of the dimension (``"batch"``, ``"channels"``, ``"rows"``, ...).
    size_from : (int, int)
        ``(input index, axis)`` whose extent is the dimension's size.
    sliced : tuple of (int, int)
        ``(input index, axis)`` of every input sliced into parts; other inputs
        go whole to every part.
    combine : str
        ``"concat"`` (parts concatenated on ``concat_axis``) or ``"sum"``.
    concat_axis : int or None
    shape_inputs : tuple of (int, int)
        ``(input index, element)`` of shape-vector inputs whose element becomes
        the part's size (``Conv2DBackpropInput``'s ``input_sizes``).
    when : tuple of (str, object)
        Attribute values the rule requires (``("data_format", "NHWC")``).
    """

    op_type: str
    dim: str
    size_from: tuple
    sliced: tuple
    combine: str
    concat_axis: int | None = None
    shape_inputs: tuple = ()
    when: tuple = ()

    def __post_init__(self):
        if self.combine not in ("concat", "sum"):
            raise ValueError(f"combine must be 'concat' or 'sum', got {self.combine!r}")
        if (self.combine == "concat") != (self.concat_axis is not None):
            raise ValueError("a concat rule needs concat_axis; a sum rule must not have one")

    def applies(self, attrs) -> bool:
        """Whether the op's attributes (a mapping) satisfy ``when``."""
        return all(attrs.get(key, value) == value for key, value in self.when)


SPLIT_RULES: dict[str, list[SplitRule]] = {}


def register_split_rule(rule: SplitRule) -> SplitRule:
    """Add a rule to :data:`SPLIT_RULES` (several rules per op type: one per dimension)."""
    SPLIT_RULES.setdefault(rule.op_type, []).append(rule)
    return rule


def rules_for(op_type: str, attrs=None) -> list[SplitRule]:
    """The rules that apply to an op of ``op_type`` with attributes ``attrs``."""
    return [r for r in SPLIT_RULES.get(op_type, []) if r.applies(attrs or {})]


#: The dimensions FD-DPS's split step splits (the paper's Table 6: Conv2D and its
#: backprops by batch or channels, MatMul), by the letters of their entries in
#: :data:`fddps.strategy.ops.OP_DESCRIPTIONS`, with the names its decisions use.
#: The rules are derived from those entries (:func:`rule_from_description`), so the
#: axes each split slices and how its parts combine have one source of truth; the
#: search over every dimension of every described op is :mod:`fddps.search.fddps_space`.
FDDPS_SPLIT_DIMS = {"Conv2D": {"n": "batch", "o": "channels"},
                    "Conv2DBackpropInput": {"n": "batch", "o": "channels"},
                    "Conv2DBackpropFilter": {"n": "batch", "o": "channels"},
                    "MatMul": {"n": "rows", "c": "cols", "k": "inner"}}


def rule_from_description(desc, letter: str, dim: str) -> SplitRule:
    """The :class:`SplitRule` that splits dimension ``letter`` of an op description.

    ``desc`` is an :class:`fddps.strategy.ops.OpDescription` with fixed specs
    (one letter per tensor axis): the sliced inputs are those whose spec has
    ``letter``; the split dimension's size is read from the first of them
    that also has the sample dimension (the activations), else the first;
    parts concatenate on the output axis ``letter`` indexes, or are summed
    when no output axis does (a reduction); a shape-vector input (``=0``)
    gets the part's extent at that axis.

    Example
    -------
    >>> from fddps.strategy.ops import OP_DESCRIPTIONS
    >>> rule_from_description(OP_DESCRIPTIONS["Conv2DBackpropFilter"][0], "n", "batch").combine
    'sum'
    """
    from .strategy.ops import SAMPLE

    if desc.specs is not None:
        raise GraphError(f"{desc.op_type}'s description depends on constant inputs: no fixed rule")
    sliced = tuple((k, spec.index(letter)) for k, spec in enumerate(desc.inputs)
                   if letter in spec and not spec.startswith("=") and spec != "-")
    if not sliced:
        raise GraphError(f"{desc.op_type} has no input indexed by dimension {letter!r}")
    size_from = next(((k, a) for k, a in sliced if SAMPLE in desc.inputs[k]), sliced[0])
    out = desc.outputs[0]
    if letter in out:
        axis = out.index(letter)
        shapes = tuple((k, axis) for k, spec in enumerate(desc.inputs) if spec == "=0")
        return SplitRule(desc.op_type, dim, size_from, sliced, "concat", axis, shapes, desc.when)
    return SplitRule(desc.op_type, dim, size_from, sliced, "sum", when=desc.when)


def _register_fddps_rules():
    from .strategy.ops import OP_DESCRIPTIONS

    for op_type, dims in FDDPS_SPLIT_DIMS.items():
        desc = OP_DESCRIPTIONS[op_type][0]  # NHWC convolutions; MatMul without transposes
        for letter, dim in dims.items():
            register_split_rule(rule_from_description(desc, letter, dim))


_register_fddps_rules()


@dataclass(frozen=True)
class SplitCandidate:
    """An op a split rule applies to, with what the decision needs.

    Attributes
    ----------
    op : hashable
        The op's name in the OpGraph.
    rule : SplitRule
    size : int
        Extent of the split dimension.
    sliced : tuple of (hashable, float)
        ``(producer op name, bytes)`` of each input edge that is sliced; every
        other input edge of the op goes whole to each part.
    output_bytes : float
        Bytes of the op's output.
    slice_cost, combine_cost : tuple of float
        Seconds (one per device type of the graph, on a speed-1 device) of the
        op that slices one input, and of the op that combines the parts.
    whole_bytes : float
        Bytes of the data inputs that go whole to every part (a channel-split
        Conv2D's activations): each part on another device receives them.
    """

    op: Hashable
    rule: SplitRule
    size: int
    sliced: tuple
    output_bytes: float
    slice_cost: tuple = (0.0,)
    combine_cost: tuple = (0.0,)
    whole_bytes: float = 0.0


@dataclass(frozen=True)
class SplitDecision:
    """Split ``candidate`` into ``parts`` parts (sizes as ``numpy.array_split``)."""

    candidate: SplitCandidate
    parts: int
    estimated_gain: float = 0.0
    part_sizes: tuple = field(default=())

    def __post_init__(self):
        if not 2 <= self.parts <= self.candidate.size:
            raise GraphError(f"op {self.candidate.op!r} cannot be split into {self.parts} parts "
                             f"along {self.candidate.rule.dim} of size {self.candidate.size}")
        sizes = tuple(len(a) for a in np.array_split(np.arange(self.candidate.size), self.parts))
        object.__setattr__(self, "part_sizes", sizes)


def part_name(op, j: int) -> str:
    """Name of part ``j`` of a split op."""
    return f"{op}/fddps_part_{j}"


def slice_name(op, producer) -> str:
    """Name of the op that slices ``producer``'s output for the parts of ``op``."""
    return f"{op}/fddps_slice/{producer}"


def path_slack(graph: OpGraph, cluster):
    """Each op's slack off the critical path, as FD-DPS's split step measures it.

    From mean costs (an op's mean time over the devices that can run it, an
    edge's mean transfer between distinct devices): ``slack = length -
    (top level + bottom level)``, 0 on the critical path.

    Returns
    -------
    (slack, length, mean_time) : numpy.ndarray, float, numpy.ndarray
        Per op (graph order) its slack and mean time; the critical path's length.

    Example
    -------
    >>> from fddps.cluster import Cluster
    >>> g = OpGraph(["a", "b", "c"], [[2.0], [1.0], [2.0]], [("a", "c", 0.0), ("b", "c", 0.0)])
    >>> slack, length, _ = path_slack(g, Cluster.homogeneous(2))
    >>> slack.tolist(), length
    ([0.0, 1.0, 0.0], 4.0)
    """
    from .algorithms.base import PlacementState, bottom_levels, top_levels

    state = PlacementState(graph, cluster)
    et_mean = state.mean_exec_time()
    comm = state.mean_edge_comm()
    blevel = bottom_levels(graph, et_mean, comm)
    tlevel = top_levels(graph, et_mean, comm)
    length = float(blevel.max(initial=0.0))
    return length - (tlevel + blevel), length, et_mean


def plan_splits(graph: OpGraph, cluster, *, critical_slack: float = 0.1,
                min_gain: float = 0.05, max_parts: int | None = None) -> list[SplitDecision]:
    """Which of ``graph.split_candidates`` to split, and into how many parts.

    A candidate is considered when it lies on or near the critical path (its
    slack, from mean costs as in FD-DPS, at most ``critical_slack`` of the
    critical path's length: splitting an op off the critical path cannot
    shorten the step) and is not pinned. A candidate in a colocation group may
    be split: the group binds its combine op, which keeps the op's name, and the
    parts go anywhere. For ``k = 2 .. max_parts`` (default: the number of
    devices that can run it) the split's estimated time is: slicing the inputs,
    the largest part (``ET * largest part / size``), moving a part of every
    sliced input and the whole of every other data input (``whole_bytes``) to
    another device and its output back, and combining; the best ``k`` is taken
    when it beats the whole op by ``min_gain`` of its time. An op with several
    candidates (one per rule: batch or channels) gets at most one decision, the
    rule with the largest estimated gain.

    Returns
    -------
    list of SplitDecision, in the order of the candidates, at most one per op.
    """
    candidates = getattr(graph, "split_candidates", ())
    if not candidates or cluster.num_devices < 2:
        return []
    slack, length, et_mean = path_slack(graph, cluster)
    type_cols = graph.exec_times(cluster)  # only for the device count per op
    decisions = {}  # op -> best decision so far
    for cand in candidates:
        i = graph.index[cand.op]
        # A colocated op may split: its combine op keeps its name and group (the
        # adapter offers only ops whose computation is not tied to the group).
        if slack[i] > critical_slack * length or i in graph.pinned:
            continue
        runnable = int(np.isfinite(type_cols[i]).sum())
        k_max = min(runnable, cand.size, max_parts or runnable)
        whole = float(et_mean[i])
        slice_time = float(np.mean(cand.slice_cost)) if cand.sliced else 0.0
        combine_time = float(np.mean(cand.combine_cost))
        best = None
        for k in range(2, k_max + 1):
            largest = -(-cand.size // k)
            moved = sum(b for _, b in cand.sliced) * largest / cand.size + cand.whole_bytes
            back = cand.output_bytes * (largest / cand.size if cand.rule.combine == "concat" else 1.0)
            estimate = (slice_time + whole * largest / cand.size + combine_time
                        + float(cluster.mean_transfer_time(moved + back)))
            if best is None or estimate < best[0]:
                best = (estimate, k)
        if best and best[0] < whole * (1 - min_gain):
            gain = whole - best[0]
            if cand.op not in decisions or gain > decisions[cand.op].estimated_gain:
                decisions[cand.op] = SplitDecision(cand, best[1], gain)
    return list(decisions.values())


def apply_splits(graph: OpGraph, decisions) -> OpGraph:
    """A new OpGraph in which each decided op is replaced by its slice, part and combine ops.

    For an op ``X`` split into ``k`` parts: one slice op per sliced input
    (``X/fddps_slice/<producer>``) receives that input and sends a part to each
    part op ``X/fddps_part_j``; other inputs (and control edges) go whole to
    every part; the combine op takes the name ``X`` and keeps all of ``X``'s
    out-edges, so consumers and fetches see the same tensor. Part costs scale
    with their share of the dimension; memory: parts share ``X``'s transient
    bytes in proportion, the combine op holds the output, a slice op its slices
    (the whole sliced input).

    Raises
    ------
    GraphError
        If a decision names an op not in the graph, a sliced producer that is
        not an input of the op, or an op twice.
    """
    by_op = {}
    for d in decisions:
        if d.candidate.op not in graph.index:
            raise GraphError(f"split of unknown op {d.candidate.op!r}")
        if d.candidate.op in by_op:
            raise GraphError(f"op {d.candidate.op!r} is split twice")
        by_op[d.candidate.op] = d
    if not by_op:
        return graph
    names, op_types = list(graph.names), list(graph.op_types)
    cost = [row for row in graph.cost]
    memory, transient = graph.memory.tolist(), graph.transient.tolist()
    aliases = graph.aliases.tolist()
    groups = [int(x) if x >= 0 else None for x in graph.colocation]
    edges = []
    sliced_edge = {}
    for d in by_op.values():
        i = graph.index[d.candidate.op]
        inputs = {graph.names[p] for p in graph.predecessors(i)}
        for producer, _ in d.candidate.sliced:
            if producer not in inputs:
                raise GraphError(f"split of op {d.candidate.op!r} slices {producer!r}, "
                                 "which is not one of its inputs")
            sliced_edge[producer, d.candidate.op] = True
    for u, v, b in zip(graph.src.tolist(), graph.dst.tolist(), graph.bytes.tolist()):
        un, vn = graph.names[u], graph.names[v]
        if vn in by_op:
            d = by_op[vn]
            if (un, vn) in sliced_edge:
                edges.append((un, slice_name(vn, un), b))
            else:
                edges.extend((un, part_name(vn, j), b) for j in range(d.parts))
        else:
            edges.append((un, vn, b))
    for op, d in by_op.items():
        i = graph.index[op]
        cand, size = d.candidate, d.candidate.size
        combine_type = "ConcatV2" if cand.rule.combine == "concat" else "AddN"
        share = np.asarray(d.part_sizes, dtype=np.float64) / size
        for j in range(d.parts):
            names.append(part_name(op, j))
            op_types.append(graph.op_types[i])
            cost.append(graph.cost[i] * share[j])
            memory.append(0.0)
            transient.append(graph.transient[i] * share[j])
            aliases.append(False)
            groups.append(None)
            out = cand.output_bytes * (share[j] if cand.rule.combine == "concat" else 1.0)
            edges.append((part_name(op, j), op, out))
        for producer, nbytes in cand.sliced:
            name = slice_name(op, producer)
            names.append(name)
            op_types.append("SplitV")  # what the TensorFlow rewrite slices with
            cost.append(np.broadcast_to(np.asarray(cand.slice_cost, dtype=np.float64),
                                        graph.cost[i].shape))
            memory.append(0.0)
            transient.append(float(nbytes))  # its slices: the whole input, once more
            aliases.append(False)
            groups.append(None)
            edges.extend((name, part_name(op, j), nbytes * share[j]) for j in range(d.parts))
        # The original op becomes the combine op: same name, same out-edges.
        op_types[i] = combine_type
        cost[i] = np.broadcast_to(np.asarray(cand.combine_cost, dtype=np.float64), graph.cost[i].shape)
        transient[i] = cand.output_bytes
        aliases[i] = False
    pinned = {graph.names[i]: dev for i, dev in graph.pinned.items()}
    new = OpGraph(names, np.vstack(cost), edges, memory=memory, transient=transient,
                  device_types=None if graph.device_types == ("*",) else graph.device_types,
                  op_types=op_types, colocation=groups, pinned=pinned, aliases=aliases)
    return new


def schedule_with_splits(schedule_whole, graph: OpGraph, cluster, enabled=True, **plan_options):
    """Schedule ``graph`` whole and split; return the faster schedule.

    ``schedule_whole(graph, cluster) -> Schedule`` is the algorithm's own
    search. When :func:`plan_splits` (given ``plan_options``) decides some
    splits, the split graph is scheduled too and kept only if its predicted
    step is shorter, so splitting never makes a schedule worse; with
    ``enabled=False`` only the whole graph is scheduled. The result's
    ``info`` gains ``splits`` (the decisions kept, possibly none),
    ``splits_planned`` and, when split, ``unsplit_makespan``.
    """
    from .algorithms.base import memory_overflow

    def rank(schedule):  # schedules within memory first, then the faster
        return (memory_overflow(schedule) is not None, schedule.makespan)

    result = schedule_whole(graph, cluster)
    decisions = plan_splits(graph, cluster, **plan_options) if enabled else []
    if decisions:
        try:
            split_result = schedule_whole(apply_splits(graph, decisions), cluster)
        except InfeasibleError:  # the split graph's memory does not fit; the whole one did
            split_result = None
        if split_result is not None and rank(split_result) < rank(result):
            split_result.info.update(splits=decisions, unsplit_makespan=result.makespan)
            result = split_result
    result.info.setdefault("splits", [])
    result.info["splits_planned"] = len(decisions)
    return result


def decisions_table(decisions) -> pd.DataFrame:
    """The decisions as a table like the paper's Table 6: op, type, dimension, size, parts, gain."""
    return pd.DataFrame([dict(op=d.candidate.op, op_type=d.candidate.rule.op_type,
                              dim=d.candidate.rule.dim, size=d.candidate.size, parts=d.parts,
                              part_sizes=d.part_sizes, combine=d.candidate.rule.combine,
                              estimated_gain=d.estimated_gain) for d in decisions],
                        columns=["op", "op_type", "dim", "size", "parts", "part_sizes", "combine",
                                 "estimated_gain"])
