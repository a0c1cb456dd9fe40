"""FD-DPS's intra-op splits of an op graph: rules, candidates, decisions, rewrite.

FD-DPS's first step (paper Section 4.1, Algorithm 3 lines 2-6) splits
compute-heavy ops so that one long op becomes several short ones on several
devices. This module holds what that step decides about and how a decision
changes the :class:`~fddps.graph.OpGraph` the schedulers see (no TensorFlow, no
scheduler):

- :data:`SPLIT_RULES`, a declarative registry in the spirit of Tofu's operator
  descriptions: for an op type, which dimension can be split, which inputs are
  sliced on which axis, and how the partial outputs combine (concatenate on an
  axis, or sum). The rules of FD-DPS's split step are derived from the op
  descriptions of :mod:`fddps.strategy.ops` (:data:`FDDPS_SPLIT_DIMS`,
  :func:`rule_from_description`); adding an op type is adding entries with
  :func:`register_split_rule`.
- :class:`SplitCandidate`: an op of a graph that a rule applies to, with the
  sizes the decision needs. The TensorFlow adapter builds them from shapes and
  hands them over in :attr:`OpGraph.split_candidates`.
- :class:`SplitDecision`: split a candidate into ``k`` parts;
  :func:`decisions_table` lists decisions like the paper's Table 6. In the
  strategy layer's vocabulary a decision to split op ``X`` into ``k`` parts
  along dimension ``d`` on devices ``D`` is ``OpConfig({d: k}, D)``
  (:meth:`SplitDecision.op_config`, ``d`` the dimension's letter,
  :func:`dimension_letter`), and a schedule of the split graph is a
  :class:`~fddps.strategy.strategy.Strategy` (:func:`split_strategy`).
- :func:`apply_splits` rewrites the op graph accordingly (slice, part and
  combine ops, the combine op keeping the original op's name so its consumers
  and fetches are unchanged).

Which candidates to split, from the cost model and the critical path, and the
choice between the whole and the split graph's schedules, call a scheduler's
machinery; they live with the algorithms, in :mod:`fddps.algorithms.split_step`
(:func:`~fddps.algorithms.split_step.plan_splits`,
:func:`~fddps.algorithms.split_step.schedule_with_splits`).

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

from ..errors import GraphError
from ..graph import OpGraph
from .ops import OP_DESCRIPTIONS, SAMPLE
from .strategy import OpConfig, Strategy


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
    part_costs : tuple of (int, tuple of float)
        ``(extent, seconds per device type)``: what a part covering ``extent``
        of the dimension costs, from the cost model at the part's own shape
        (TensorFlow runs each part as an op of its own: it pays the per-op
        overhead and reads its unsliced inputs whole). One entry per extent
        a split into 2 .. the most parts can give; see :meth:`part_cost`.
    """

    op: Hashable
    rule: SplitRule
    size: int
    sliced: tuple
    output_bytes: float
    slice_cost: tuple = (0.0,)
    combine_cost: tuple = (0.0,)
    whole_bytes: float = 0.0
    part_costs: tuple = ()

    def part_cost(self, extent: int, whole) -> np.ndarray:
        """Seconds, per device type, of a part covering ``extent`` of the dimension.

        ``whole`` is the op's own cost row (seconds per device type; ``inf``
        where it cannot run, which the part keeps). The cost is
        :attr:`part_costs`' entry for ``extent``; a candidate without one (built
        by hand, without a cost model) scales ``whole`` by ``extent / size``.

        Example
        -------
        >>> rule = rules_for("MatMul")[0]
        >>> cand = SplitCandidate("y", rule, 4, (("x", 8.0),), 8.0, part_costs=((2, (3.0,)),))
        >>> cand.part_cost(2, [5.0]).tolist(), cand.part_cost(1, [5.0]).tolist()
        ([3.0], [1.25])
        """
        whole = np.asarray(whole, dtype=np.float64)
        extent = int(extent)
        for at, costs in reversed(self.part_costs):  # the last entry wins, as in a dict
            if at == extent:
                return np.where(np.isfinite(whole),
                                np.broadcast_to(np.asarray(costs, dtype=np.float64), whole.shape),
                                whole)
        return whole * (extent / self.size)


def part_extents(size: int, max_parts: int) -> list[int]:
    """The extents a split of ``size`` into 2 .. ``max_parts`` parts gives its parts
    (cut as ``numpy.array_split``: ``size // k`` and ``size // k + 1``), ascending.

    Example
    -------
    >>> part_extents(6, 4)
    [1, 2, 3]
    """
    out = set()
    for k in range(2, min(max_parts, size) + 1):
        out.add(size // k)
        if size % k:
            out.add(size // k + 1)
    return sorted(out)


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

    def op_config(self, devices) -> OpConfig:
        """This decision in the strategy layer's terms: ``OpConfig({letter: parts}, devices)``.

        ``letter`` is the split dimension's letter in the op's description
        (:func:`dimension_letter`); ``devices`` holds one device per part, part
        ``j`` (:func:`part_name`) first to last. The strategy's parts
        (:func:`fddps.strategy.strategy.parts`) cover the same ranges of the
        dimension as :attr:`part_sizes` (both cut as ``numpy.array_split``).

        Raises
        ------
        GraphError
            If ``devices`` does not hold one device per part, or the rule has
            no letter (see :func:`dimension_letter`).

        Example
        -------
        >>> rule = rules_for("Conv2D", {"data_format": "NHWC"})[1]
        >>> cand = SplitCandidate("conv", rule, 16, (("w", 4.0),), 8.0)
        >>> SplitDecision(cand, 2).op_config(["/cpu:0", "/cpu:1"])
        OpConfig(split={'o': 2}, devices=('/cpu:0', '/cpu:1'))
        """
        devices = tuple(devices)
        if len(devices) != self.parts:
            raise GraphError(f"op {self.candidate.op!r} is split into {self.parts} parts but "
                             f"{len(devices)} devices were given (one per part)")
        return OpConfig({dimension_letter(self.candidate.rule): self.parts}, devices)


def dimension_letter(rule: SplitRule) -> str:
    """The letter of ``rule``'s dimension in its op's description (:data:`FDDPS_SPLIT_DIMS`).

    Raises
    ------
    GraphError
        For a rule that is not one of FD-DPS's derived rules (one added with
        :func:`register_split_rule` under a name :data:`FDDPS_SPLIT_DIMS` does not list).

    Example
    -------
    >>> [dimension_letter(r) for r in rules_for("MatMul")]
    ['n', 'c', 'k']
    """
    for letter, dim in FDDPS_SPLIT_DIMS.get(rule.op_type, {}).items():
        if dim == rule.dim:
            return letter
    raise GraphError(f"split rule {rule.op_type}/{rule.dim} names no dimension of the op's "
                     "description (FDDPS_SPLIT_DIMS)")


def part_name(op, j: int) -> str:
    """Name of part ``j`` of a split op."""
    return f"{op}/fddps_part_{j}"


def slice_name(op, producer) -> str:
    """Name of the op that slices ``producer``'s output for the parts of ``op``."""
    return f"{op}/fddps_slice/{producer}"


def apply_splits(graph: OpGraph, decisions) -> OpGraph:
    """A new OpGraph in which each decided op is replaced by its slice, part and combine ops.

    For an op ``X`` split into ``k`` parts: one slice op per sliced input
    (``X/fddps_slice/<producer>``) receives that input and sends a part to each
    part op ``X/fddps_part_j``; other inputs (and control edges) go whole to
    every part; the combine op takes the name ``X`` and keeps all of ``X``'s
    out-edges, so consumers and fetches see the same tensor. A part costs
    :meth:`SplitCandidate.part_cost` of its extent (the cost model at its
    shape, or its share of the whole op's cost for a candidate without part
    costs); memory: parts share ``X``'s transient
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
            cost.append(cand.part_cost(d.part_sizes[j], graph.cost[i]))
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


def decisions_table(decisions) -> pd.DataFrame:
    """The decisions as a table like the paper's Table 6: op, type, dimension, size, parts, gain."""
    return pd.DataFrame([dict(op=d.candidate.op, op_type=d.candidate.rule.op_type,
                              dim=d.candidate.rule.dim, size=d.candidate.size, parts=d.parts,
                              part_sizes=d.part_sizes, combine=d.candidate.rule.combine,
                              estimated_gain=d.estimated_gain) for d in decisions],
                        columns=["op", "op_type", "dim", "size", "parts", "part_sizes", "combine",
                                 "estimated_gain"])


def split_strategy(schedule, name: str = "FD-DPS splits") -> Strategy:
    """A schedule of FD-DPS's split step as a :class:`~fddps.strategy.strategy.Strategy`.

    ``schedule`` is a :class:`~fddps.schedule.Schedule` whose ``info["splits"]``
    lists the decisions it was made with (as
    :func:`fddps.algorithms.split_step.schedule_with_splits` leaves them; none
    for a whole-op schedule) and whose graph is then the split graph
    (:func:`apply_splits`). Each split op gets its decision's
    :meth:`SplitDecision.op_config` on the devices its parts were scheduled on;
    every other op of the original graph runs whole where it was scheduled. The
    slice ops, and the device of a split op's combine op, have no counterpart:
    a strategy's expansion decides where slices and combines happen.

    Simulated (:func:`fddps.strategy.expand.simulate_strategy`), the strategy's
    parts cost what they cost in the schedule (both from the cost model at the
    part's shape: :meth:`SplitCandidate.part_cost`), but its step is not the
    schedule's to the microsecond, by design: the expansion has no slice
    (``SplitV``) nor combine (``ConcatV2``/``AddN``) kernels, sends each piece
    straight to its consumer rather than through the combine op's device, and
    runs the executor's order instead of the schedule's. The schedule is what
    :mod:`fddps.tf.split_rewrite` writes and TensorFlow runs; the expansion is
    the strategy layer's model of any strategy. On a net of small ops they
    agree within a few tenths of a percent; on VGG-16 with 30 splits the
    expansion predicted 6% less.

    Returns
    -------
    Strategy
        Default device: the cluster's first.

    Example
    -------
    >>> from fddps.cluster import Cluster
    >>> from fddps.schedule import Schedule
    >>> rule = rules_for("MatMul")[0]
    >>> g = OpGraph(["x", "y"], [1.0, 4.0], [("x", "y", 8.0)])
    >>> d = SplitDecision(SplitCandidate("y", rule, 2, (("x", 8.0),), 8.0), 2)
    >>> split = apply_splits(g, [d])
    >>> where = {"x": 0, "y": 0, "y/fddps_part_0": 0, "y/fddps_part_1": 1, "y/fddps_slice/x": 0}
    >>> cluster = Cluster.homogeneous(2, names=["/cpu:0", "/cpu:1"])
    >>> s = Schedule.from_order(split, cluster, [where[n] for n in split.names],
    ...                         [[0, 4, 2, 1], [3]], info={"splits": [d]})
    >>> split_strategy(s).configs["y"]
    OpConfig(split={'n': 2}, devices=('/cpu:0', '/cpu:1'))
    >>> sorted(split_strategy(s).configs)  # no slice nor part ops: the strategy's expansion adds them
    ['x', 'y']
    """
    placement = schedule.placement
    decisions = {d.candidate.op: d for d in schedule.info.get("splits") or ()}
    added = {name for op, d in decisions.items()
             for name in [*(part_name(op, j) for j in range(d.parts)),
                          *(slice_name(op, producer) for producer, _ in d.candidate.sliced)]}
    configs = {}
    for op, device in placement.items():
        if op in decisions:
            d = decisions[op]
            configs[op] = d.op_config([placement[part_name(op, j)] for j in range(d.parts)])
        elif op not in added:
            configs[op] = OpConfig({}, (device,))
    return Strategy(configs, schedule.cluster.names[0], name=name)
