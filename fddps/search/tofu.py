"""Tofu's partitioning (Wang et al., EuroSys 2019, Section 5) over :mod:`fddps.strategy`.

Tofu trains models too large for one device by partitioning every operator
so each device holds a share. Its search, as implemented here:

1. **Coarsen** the step (its Section 5.1): each forward op forms a group with
   its gradient ops (TensorFlow names them ``gradients/<forward op>_grad/...``);
   an element-wise op with one searchable producer joins that producer's
   group. Coalesced ops share one choice: consecutive element-wise ops of one
   iteration domain (forward, gradient and optimizer ops: their inputs and
   outputs are partitioned identically) and, with ``merge_timesteps``, the
   unrolled time steps of one op (names that differ only in a ``t<step>``
   component, :data:`TIMESTEP_PATTERN`), so an RNN's DP has as many nodes
   whatever its sequence length.
2. **Recursively partition** the device set (Section 5.2): ``k`` devices are
   factorised ``k = k_1 * k_2 * ...`` (largest first; halves for powers of
   two). At level ``i`` every searchable op picks one dimension of its
   iteration domain (:func:`fddps.strategy.resolve`) to split ``k_i`` ways
   within its current part, by a dynamic program over the coarse groups that
   minimises the bytes the level communicates (:mod:`fddps.search.tofu_dp`).
   Ops keep their earlier splits, so a dimension picked twice is split
   ``k_i*k_j`` ways and two dimensions make a grid. Part ``j`` of a level goes
   to the ``j``-th ``1/k_i`` of the current device group. With
   ``carry_fetched`` (default) an edge's bytes at a level are those of the
   region the consumer's group needs -- data an earlier level fetched from
   another group is an input of this one (Section 5.2, Figure 6) -- rather
   than the producer's part alone (which undercounts a tensor replicated over
   several levels: measured on an 8-GPU MLP, the DP's bytes were 2.2x the
   expanded plan's without, within 22% with).
3. The plan is a :class:`~fddps.strategy.Strategy`; :meth:`Tofu.search`
   expands and simulates it (:func:`fddps.strategy.simulate_strategy`) and
   accepts it only when every device's replayed peak memory is within its
   capacity (memory is the constraint: the point is that the model fits).
   The least-communication plan comes first; when some device is over its
   capacity, the levels are planned again with each choice also charged
   ``memory_weight`` times the bytes it leaves unsplit on every device of
   its group (an output or variable share it keeps whole or replicated:
   ``S (1 - 1/k)`` per device beyond an even split), for growing weights
   (:attr:`Tofu.memory_weights`), and the first plan that fits is returned:
   the least communication among the plans tried that fit. When none fits,
   :class:`~fddps.errors.InfeasibleError` names the smallest per-device peak
   reached (or, with ``infeasible="return"``, that plan comes back with
   ``fits=False``). Every returned plan says whether it fits (``fits``).

The DP (:func:`fddps.search.tofu_dp.eliminate`): a node per coalesced op
(``max_combos=1``, the default) or per coarse group cut into pieces of at
most ``max_combos`` joint choices enumerated by brute force (Tofu's
grouping); nodes are eliminated one at a time, fewest neighbour choices
first, each replaced by a table over its neighbours. On a chain this is the
chain DP Tofu runs; fork-join blocks (residual blocks; an LSTM layer whose
time steps are coalesced, a cycle) reduce by series and parallel steps, so
the DP is exact on them, and it is exact on any graph whose tables stay
under ``max_table`` entries (the same optimum for any ``max_combos``: a
group's members are then eliminated instead of enumerated; on WResNet-152,
TensorFlow's many gradient ops per forward op made pieces with too many
neighbours, so per-op nodes are the default). Beyond ``max_table`` the
level falls back to the frontier beam (``fallback_beam`` states, not exact:
:attr:`TofuPlan.exact`); ``beam=N`` asks for that beam everywhere, an option
beyond what Tofu's paper proves.

Bytes per edge at one level, for a tensor of ``S`` bytes (its producer's
current part) and ``k`` groups: producer and consumer split along the same
axis: 0; different axes: ``S (1 - 1/k)``; the consumer needs it whole in every
group (it split a dimension the tensor lacks: a weight under a sample split):
``S (k - 1)``; the consumer is one part (not split, or kept whole):
``S (k - 1)/k``; a producer split along a reduction (partial sums) sends
``S (k - 1)`` to a split consumer (reduce-scatter), ``S k (k - 1)`` to one needing
it whole everywhere (all-reduce) and ``S (k - 1)`` to one part (reduce).

Variables are partitioned with their reads, optimizer slots and update (each
variable's ops pick one split together), so each device holds its share of
the weights and slots, as in Tofu; with ``writable=True`` only the variables
the TensorFlow rewrite writes as shard variables
(:func:`fddps.strategy.strategy.shardable_groups`). What is kept whole: the
other variables' groups and the other colocation groups, spread over the
devices by bytes (:func:`fddps.strategy.strategy.group_devices`); ops without a
description (on the device of their first input's first part); with
``writable=True`` (default) batch norm is not split along its statistics
dimensions (the rewrite writes those since the spatial splits landed, but
opening them to Tofu's DP is untested: on the wide MLP of the tests it
changed which plans the memory fallback finds).

Example
-------
>>> from costmodel import default_cost_model
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> f4 = dict(input_itemsizes=(4, 4), output_itemsizes=(4,))
>>> g = StepGraph([OpInfo("x", "Const", output_shapes=((8, 64),), output_itemsizes=(4,),
...                       output_bytes=2048.0),
...                OpInfo("w", "Const", output_shapes=((64, 4096),), output_itemsizes=(4,),
...                       output_bytes=1048576.0),
...                OpInfo("y", "MatMul", inputs=(("x", 0), ("w", 0)),
...                       input_shapes=((8, 64), (64, 4096)), output_shapes=((8, 4096),),
...                       flops=4.2e6, output_bytes=131072.0, **f4),
...                OpInfo("z", "Relu", inputs=(("y", 0),), input_shapes=((8, 4096),),
...                       output_shapes=((8, 4096),), input_itemsizes=(4,), output_itemsizes=(4,),
...                       output_bytes=131072.0)])
>>> cm = default_cost_model("p100")
>>> plan = Tofu().search(g, cm.cluster(["/gpu:0", "/gpu:1"]), cm)
>>> plan.strategy.config("y").split  # the weight outweighs the activations: split by column
{'c': 2}
>>> plan.strategy.config("z").split, plan.levels[0]["bytes"]  # half of w moves, and all of x
({'c': 2}, 526336.0)
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
from networkx.utils import UnionFind

from ..errors import InfeasibleError
from .base import SearchError, SearchResult, StrategySearch, register_search
from .evaluate import penalised_cost
from .tofu_dp import LevelProblem, TooWide, eliminate, frontier_beam
from ..strategy import NotDescribed, OpConfig, Strategy, resolve, simulate_strategy
from ..strategy.strategy import group_devices, shardable_groups
from ..strategy.ops import ELEMENTWISE_OPS, SHAPE_ONLY_OPS

_GRADIENT = re.compile(r"^gradients(?:_\d+)?/")
#: A name component of an unrolled time step: ``slim_models.rnn`` writes step
#: ``t``'s ops under ``<layer>/t<t>/`` (MXNet's and PyTorch's unrolling helpers
#: name steps likewise); ops whose names differ only there are one op over time.
TIMESTEP_PATTERN = r"(?<=/)t\d+(?=/)"


@dataclass
class TofuPlan:
    """What :class:`Tofu` found.

    Attributes
    ----------
    strategy : Strategy
        Every op's split and devices (``name="tofu"``).
    levels : list of dict
        Per recursion level: ``ways`` (k_i), ``choices`` (op -> dimension or
        None), ``bytes`` (the DP's communicated bytes at that level, over all
        device groups).
    groups : int
        Coarse groups (DP nodes, after cutting large ones).
    exact : bool
        Whether the DP kept every state (no beam pruning) at every level.
    search_seconds : float
        Time of the search (coarsening and DP, not the validation).
    timeline : Timeline or None
        The simulated step (:meth:`Tofu.search` fills it).
    peak_memory : pandas.Series or None
        Per-device replayed peak bytes.
    fits : bool or None
        Whether every device's replayed peak is within its capacity (None:
        not simulated, as :meth:`Tofu.plan` returns it). :meth:`Tofu.search`
        returns only plans that fit unless asked for the best that does not.
    info : dict
        ``memory_weight``; from :meth:`Tofu.search`, ``attempts`` and
        ``capacity``; per level, the solver used (``solvers``).
    """

    strategy: Strategy
    levels: list
    groups: int
    exact: bool
    search_seconds: float
    timeline: object = None
    peak_memory: object = None
    info: dict = field(default_factory=dict)
    fits: object = None

    @property
    def comm_bytes(self) -> float:
        return float(sum(level["bytes"] for level in self.levels))


def factorize(k: int) -> list:
    """``k`` as prime factors, largest first (Tofu's ``k = k_1 * k_2 * ...``, ``k_i >= k_i+1``)."""
    if k < 1:
        raise ValueError(f"number of devices must be at least 1, got {k}")
    out, p = [], 2
    while k > 1:
        while k % p == 0:
            out.append(p)
            k //= p
        p += 1
    return sorted(out, reverse=True)


def forward_name(name: str, ops) -> str | None:
    """The forward op whose gradient ``name`` computes (``gradients/<op>_grad/...``), if in ``ops``."""
    m = _GRADIENT.match(name)
    if not m:
        return None
    rest = name[m.end():]
    for hit in re.finditer(r"_grad/", rest):
        if rest[:hit.start()] in ops:
            return rest[:hit.start()]
    return None


# -- per-op facts a level needs -------------------------------------------------------
def _axis_state(axes, d, reduction):
    """How a tensor with ``axes`` is laid out (output) or needed (input) when ``d`` is split."""
    if not isinstance(axes, tuple) or (axes and axes[0] == "shape"):
        return "none"  # handles, shape vectors: nothing worth counting
    if d is None:
        return "whole"
    if d in axes:
        return axes.index(d)
    return "partial" if d in reduction else "replicated"


def edge_bytes(produced, needed, size, k):
    """Bytes one level moves for a tensor of ``size`` bytes (see the module notes)."""
    if size <= 0 or needed == "none" or produced in ("replicated", "none"):
        return 0.0
    if produced == "partial":
        return size * (k - 1) * (k if needed == "replicated" else 1)
    if produced == "whole":
        return 0.0 if needed == "whole" else size * (k - 1) / (1 if needed == "replicated" else k)
    # split along axis `produced`
    if needed == "replicated":
        return size * (k - 1)
    if needed == "whole":
        return size * (k - 1) / k
    return 0.0 if needed == produced else size * (1 - 1 / k)


class Tofu:
    """Tofu's recursive partition search (see the module notes).

    Parameters
    ----------
    writable : bool
        Only choices :func:`fddps.tf.strategy_rewrite.rewrite_strategy` can
        write, and no batch-norm statistics splits (module notes). Default True.
    beam : int or None
        None (default): the exact DP by elimination. An integer: the frontier
        DP in forward order keeping that many states per step (exact only when
        none is dropped).
    max_combos : int
        Joint choices of one DP node: 1 (default) a node per coalesced op;
        more, coarse groups cut into pieces of that many (module notes).
    split_variables : bool
        Partition variables too (each variable's ops -- the variable, its
        optimizer slots, reads and update -- pick one split together), so each
        device holds its share of the weights and slots, as in Tofu (with
        ``writable``, the variables the rewrite writes as shards). Default True.
    memory_weights : sequence of float
        Weights of the unsplit bytes against communicated bytes, tried in
        order until a plan fits (see the module notes). Default
        ``(0, 0.25, 1, 4, 16, 64, 256)``; ``0`` is Tofu's pure communication
        objective.
    merge_timesteps : bool
        Coalesce an op's unrolled time steps (Section 5.1). Default True.
    carry_fetched : bool
        Count, at each level, the region the consumer's group needs, fetched
        data included (Section 5.2). Default True.
    max_table : int
        Largest table the exact DP builds before falling back to the beam.
    fallback_beam : int
        States of that fallback.
    timestep_pattern : str
        Regular expression of the name component of a time step.

    Example
    -------
    ``Tofu().search(step, cluster, cost_model).strategy`` -- see the module example.
    """

    def __init__(self, writable: bool = True, beam: int | None = None, max_combos: int = 1,
                 split_variables: bool = True,
                 memory_weights=(0.0, 0.25, 1.0, 4.0, 16.0, 64.0, 256.0),
                 merge_timesteps: bool = True, carry_fetched: bool = True,
                 max_table: int = 1 << 22, fallback_beam: int = 64,
                 timestep_pattern: str = TIMESTEP_PATTERN):
        if beam is not None and (isinstance(beam, bool) or not isinstance(beam, (int, np.integer))
                                 or beam < 1):
            raise ValueError(f"beam must be None (exact DP) or an integer >= 1, got {beam!r}")
        if max_combos < 1 or max_table < 1 or fallback_beam < 1:
            raise ValueError("max_combos, max_table and fallback_beam must be at least 1")
        memory_weights = tuple(float(w) for w in memory_weights)
        if not memory_weights or any(not (w >= 0) or np.isinf(w) for w in memory_weights):
            raise ValueError(f"memory_weights must be finite numbers >= 0, got {memory_weights!r}")
        try:
            self._timestep = re.compile(timestep_pattern)
        except (re.error, TypeError) as why:
            raise ValueError(f"timestep_pattern {timestep_pattern!r} is not a regular expression: "
                             f"{why}") from None
        self.memory_weights = memory_weights
        self.writable = writable
        self.split_variables = bool(split_variables)
        self.beam = None if beam is None else int(beam)
        self.max_combos = max_combos
        self.merge_timesteps = bool(merge_timesteps)
        self.carry_fetched = bool(carry_fetched)
        self.max_table = int(max_table)
        self.fallback_beam = int(fallback_beam)
        self.timestep_pattern = timestep_pattern

    # -- the search ---------------------------------------------------------------------
    def plan(self, step, devices, memory_weight: float = 0.0) -> TofuPlan:
        """The partition plan of ``step`` on ``devices`` (names), without checking memory.

        ``memory_weight`` charges each choice that many bytes per byte it
        leaves unsplit (0: communication only; see the module notes).
        """
        t0, c0 = time.perf_counter(), time.process_time()
        devices = list(devices)
        dims, tie = {}, {}
        for name, op in step.ops.items():
            if op.tied:
                continue
            try:
                d = resolve(op)
            except NotDescribed:
                continue
            if any(v > 1 for v in d.extent.values()):
                dims[name] = d
        if self.split_variables:
            dims.update(self._variable_groups(step, tie, self.writable))
        self._tie = tie
        self._template = self._timestep_templates(step, dims) if self.merge_timesteps else {}
        self._coalesced = self._coalesce(step, dims)
        self._whole_bytes_cache = {}
        groups = self._coarsen(step, dims)
        factor = {n: {} for n in dims}
        history = {n: [] for n in dims}  # per level: (dim or None, ways)
        levels, exact, copies = [], True, 1
        for ways in self._ways(len(devices)):
            choice, nbytes, level_exact = self._level(step, dims, factor, groups, ways,
                                                      memory_weight)
            # Every device group of this level does the same (Tofu's recursion).
            nbytes *= copies
            copies *= ways
            exact &= level_exact
            for n, d in choice.items():
                history[n].append((d, ways))
                if d is not None:
                    factor[n][d] = factor[n].get(d, 1) * ways
            levels.append(dict(ways=ways, choices=choice, bytes=nbytes, solver=self._last_solver,
                               dp_nodes=len(self._last_problem.size)))
        strategy = self._strategy(step, devices, dims, history)
        return TofuPlan(strategy, levels, len(groups), exact,
                        time.perf_counter() - t0,
                        info={"memory_weight": float(memory_weight),
                              "search_cpu_seconds": time.process_time() - c0})

    def search(self, step, cluster, cost_model, infeasible: str = "raise") -> TofuPlan:
        """The least-communication plan whose simulated per-device peaks all fit.

        Plans with each of :attr:`memory_weights` in turn (:meth:`plan`),
        simulates each plan's step, and returns the first whose every device's
        replayed peak is within its capacity; ``info`` records
        ``memory_weight`` and ``attempts`` (weight, communicated bytes, worst
        peak, its device). ``search_seconds`` covers every plan tried.

        ``infeasible="return"``: when no plan fits, return the one with the
        smallest worst-device peak, ``fits=False``, instead of raising.

        Raises
        ------
        InfeasibleError
            When no plan fits (``infeasible="raise"``, the default): the message names the smallest per-device peak
            the search reached (the worst device's of the plan with the lowest
            such peak) and that device; ``needed``/``available``/``device`` as
            :class:`~fddps.errors.InfeasibleError` documents, ``attempts`` one
            ``("tofu", device, peak, capacity)`` per plan tried.
        """
        if infeasible not in ("raise", "return"):
            raise ValueError(f"infeasible must be 'raise' or 'return', got {infeasible!r}")
        capacity = np.asarray(cluster.memory, dtype=np.float64)
        tried, best, seconds, cpu = [], None, 0.0, 0.0
        for weight in self.memory_weights:
            plan = self.plan(step, cluster.names, weight)
            seconds += plan.search_seconds
            cpu += plan.info["search_cpu_seconds"]
            timeline = simulate_strategy(step, plan.strategy, cluster, cost_model)
            plan.timeline, plan.peak_memory = timeline, timeline.peak_memory
            peak = np.asarray(timeline.peak_memory, dtype=np.float64)
            excess = peak - capacity * (1 + 1e-12)
            k = int(np.argmax(excess))
            tried.append((weight, plan.comm_bytes, float(peak[k]), cluster.names[k]))
            plan.info.update(capacity=capacity.tolist())
            if excess[k] <= 0:
                plan.search_seconds = seconds
                plan.info["search_cpu_seconds"] = cpu
                plan.info.update(attempts=tried)
                plan.fits = True
                return plan
            if best is None or excess[k] < best[0]:
                best = (excess[k], k, float(peak[k]), plan)
            if len(tried) > 1 and tried[-1][1:3] == tried[-2][1:3]:
                break  # a heavier weight changed nothing: later ones will not either
        _, k, peak_k, plan = best
        if infeasible == "return":
            plan.search_seconds = seconds
            plan.info["search_cpu_seconds"] = cpu
            plan.info.update(attempts=tried)
            plan.fits = False
            return plan
        device = cluster.names[k]
        raise InfeasibleError(
            f"tofu: no partition fits in memory: the smallest per-device peak reached is "
            f"{peak_k:.6g} bytes on {device!r}, over its capacity of {capacity[k]:.6g} "
            f"by {peak_k - capacity[k]:.6g} (recursive partition over {len(cluster.names)} devices, "
            f"{len(tried)} plans with memory weights {[t[0] for t in tried]}; "
            "peaks include received copies of remote inputs)",
            peak_k, float(capacity[k]), device=device,
            attempts=[("tofu", d, p, float(capacity[cluster.names.index(d)]))
                      for _, _, p, d in tried])

    @staticmethod
    def _variable_groups(step, tie, writable=False):
        """Dims of the ops of each variable's colocation group that can split as one
        (all described, one iteration domain; ``writable``: written as shard variables);
        ``tie`` gets op -> group."""
        groups = {}
        for name, op in step.ops.items():
            if op.tied and op.group is not None:
                groups.setdefault(op.group, []).append(name)
        if writable:
            shardable = shardable_groups(step)
            groups = {g: names for g, names in groups.items() if g in shardable}
        out = {}
        for group, names in groups.items():
            try:
                ds = [resolve(step.ops[n]) for n in names]
            except NotDescribed:
                continue
            if any((d.dims, d.extent) != (ds[0].dims, ds[0].extent) for d in ds) \
                    or not any(v > 1 for v in ds[0].extent.values()):
                continue
            for n, d in zip(names, ds):
                out[n] = d
                tie[n] = group
        return out

    # -- coarsening ---------------------------------------------------------------------
    def _coalesce(self, step, dims):
        """Op -> a representative of the ops that share its choice (Section 5.1,
        coalescing): consecutive element-wise ops of one iteration domain (forward,
        gradient and optimizer ops alike: their inputs and outputs are partitioned
        identically) and, with ``merge_timesteps``, one op's unrolled time steps.
        Ops of a variable's group keep the group's choice; ops alone are left out."""
        same = UnionFind()
        signature = {n: (d.dims, tuple(sorted(d.extent.items())), tuple(d.stats))
                     for n, d in dims.items()}
        for n, template in self._template.items():
            same.union(n, ("step", template))
        for n in dims:
            op = step.ops[n]
            if n in self._tie or op.op_type not in ELEMENTWISE_OPS:
                continue
            for p, _ in op.inputs:
                if (p in dims and p not in self._tie and step.ops[p].op_type in ELEMENTWISE_OPS
                        and signature[p] == signature[n]):
                    same.union(n, p)
        out = {}
        for members in same.to_sets():
            names = sorted((m for m in members if isinstance(m, str)), key=str)
            if len(names) > 1:
                for m in names:
                    out[m] = names[0]
        return out

    def _timestep_templates(self, step, dims):
        """Op -> its name with the time step masked (Section 5.1, merging unrolled time
        steps), for the searchable ops that share a masked name with another op of
        the same iteration domain; the others are left out."""
        by_template = {}
        for n in dims:
            if n in self._tie:
                continue
            template, count = self._timestep.subn("t*", n)
            if count:
                d = dims[n]
                by_template.setdefault((template, d.dims, tuple(sorted(d.extent.items())),
                                        tuple(d.stats)), []).append(n)
        out = {}
        for signature, names in by_template.items():
            if len(names) > 1:
                for n in names:
                    out[n] = signature
        return out

    def _coarsen(self, step, dims):
        """DP nodes: lists of searchable op names, in forward order (of their first op)."""
        pos = {n: i for i, n in enumerate(step.ops)}
        groups = UnionFind(dims)
        union = groups.union
        first = {}
        for n in dims:  # a variable's ops are one group
            if n in self._tie:
                union(n, first.setdefault(self._tie[n], n))
        for n in dims:
            fwd = forward_name(n, dims)
            if fwd is not None:
                union(n, fwd)
        for n, rep in self._coalesced.items():  # coalesced ops share one choice
            union(n, rep)
        for n in dims:
            op = step.ops[n]
            if op.op_type in ELEMENTWISE_OPS and not _GRADIENT.match(n):
                producers = {p for p, _ in op.inputs if p in dims}
                if len(producers) == 1:
                    union(n, producers.pop())
        # Which member a union keeps as root does not matter: groups are ordered
        # by their earliest op, members by position.
        members = [sorted(group, key=pos.get) for group in groups.to_sets()]
        return sorted(members, key=lambda g: pos[g[0]])

    # -- one level ----------------------------------------------------------------------
    def _choices(self, dim, factor, ways):
        out = [d for d in dim.dims if dim.extent[d] >= factor.get(d, 1) * ways
               and not (self.writable and d in dim.stats)]
        return out or [None]

    def _solve(self, problem, nodes, step):
        """(least bytes, choice per node, exact, solver name) of one level's problem;
        raises :class:`~fddps.search.tofu_dp.TooWide` for the caller to fall back."""
        if self.beam is not None:
            return (*frontier_beam(problem, self.beam), "beam")
        total, picked = eliminate(problem, self.max_table)
        return total, picked, True, "eliminate"

    def _ways(self, k):
        """Ways per level: Tofu's ``k = k_1 * k_2 * ...`` (largest first)."""
        return factorize(k)

    @staticmethod
    def _pieces(groups, key, choices, max_combos):
        """DP nodes: each coarse group cut, by its keys in order of first appearance,
        into pieces of at most ``max_combos`` joint choices (a key never split);
        returns (op names per node, keys per node)."""
        nodes, keys = [], []
        for g in groups:
            first = list(dict.fromkeys(key[n] for n in g))
            width = {}
            for n in g:
                width[key[n]] = len(choices[n])
            piece_of, pieces, size = {}, [[]], 1
            for k in first:
                if pieces[-1] and size * width[k] > max_combos:
                    pieces.append([])
                    size = 1
                pieces[-1].append(k)
                piece_of[k] = len(pieces) - 1
                size *= width[k]
            members = [[] for _ in pieces]
            for n in g:
                members[piece_of[key[n]]].append(n)
            nodes.extend(members)
            keys.extend(pieces)
        return nodes, keys

    def _level(self, step, dims, factor, groups, ways, memory_weight=0.0, max_combos=None):
        choices = {n: self._choices(dims[n], factor[n], ways) for n in dims}
        # Ops of one variable share one choice (a key); cut groups whose joint
        # choices exceed max_combos, never inside a key.
        key = {n: ("group", self._tie[n]) if n in self._tie else
               ("op", self._coalesced.get(n, n)) for n in dims}
        # Ops sharing a key share one list of choices (identical for Tofu's own
        # choices; a subclass restricting choices per op gets their intersection).
        by_key = {}
        for n in dims:
            by_key.setdefault(key[n], []).append(n)
        for names in by_key.values():
            if len(names) > 1 and any(choices[m] != choices[names[0]] for m in names):
                common = [c for c in choices[names[0]]
                          if all(c in choices[m] for m in names)] or [None]
                for m in names:
                    choices[m] = common
        max_combos = self.max_combos if max_combos is None else max_combos
        nodes, keys = self._pieces(groups, key, choices, max_combos)
        node_of = {n: t for t, piece in enumerate(nodes) for n in piece}
        member = {n: keys[t].index(key[n]) for t, piece in enumerate(nodes) for n in piece}
        width = {}
        for n in dims:
            width[node_of[n], member[n]] = len(choices[n])
        combos = [np.array(list(itertools.product(*[range(width[t, j]) for j in range(len(ks))])),
                           dtype=np.int64).reshape(-1, len(ks)) for t, ks in enumerate(keys)]

        def states(n, port, output):
            op = step.ops[n]
            if n not in dims:
                if not output:  # a shape-only reader needs no bytes
                    return ["none" if op.op_type in SHAPE_ONLY_OPS else "whole"]
                return ["none" if not op.output_itemsizes or port >= len(op.output_itemsizes)
                        or not op.output_itemsizes[port] else "whole"]
            d = dims[n]
            axes = (d.outputs if output else d.inputs)
            a = axes[port] if port < len(axes) else "whole-spec"
            return [_axis_state(a, c, d.reduction) for c in choices[n]]

        whole_cache = self._whole_bytes_cache

        def whole_bytes(n, port):
            if (n, port) in whole_cache:
                return whole_cache[n, port]
            op = step.ops[n]
            if port >= len(op.output_shapes) or op.output_shapes[port] is None:
                out = 0.0
            else:
                item = op.output_itemsizes[port] if port < len(op.output_itemsizes) else 0
                out = float(math.prod(s or 1 for s in op.output_shapes[port])) * item
            whole_cache[n, port] = out
            return out

        def shrink(nbytes, n, axes):
            if isinstance(axes, tuple) and not (axes and axes[0] == "shape"):
                for a in axes:
                    if a is not None:
                        nbytes /= factor[n].get(a, 1)
            return nbytes

        def size(n, port):
            """Bytes of ``n``'s output ``port`` in one part of the current device group."""
            nbytes = whole_bytes(n, port)
            if n in dims and port < len(dims[n].outputs):
                nbytes = shrink(nbytes, n, dims[n].outputs[port])
            return nbytes

        def edge_size(p_name, port, c_name, j):
            """Bytes of the tensor a level moves on one edge: the producer's part, or with
            ``carry_fetched`` the region the consumer's group needs (Section 5.2: what an
            earlier level fetched is an input of the group at this one)."""
            if self.carry_fetched and c_name in dims and j < len(dims[c_name].inputs):
                return shrink(whole_bytes(p_name, port), c_name, dims[c_name].inputs[j])
            return size(p_name, port)

        unary = {n: np.zeros(len(choices[n])) for n in dims}
        internal = [np.zeros(len(c)) for c in combos]
        problem_pairs = []  # (earlier node, its member, later node, its member, matrix)
        for c_name, op in step.ops.items():
            for j, (p_name, port) in enumerate(op.inputs):
                if p_name not in dims and c_name not in dims:
                    continue
                s = edge_size(p_name, port, c_name, j)
                if s <= 0:
                    continue
                produced = states(p_name, port, True)
                needed = states(c_name, j, False)
                m = np.array([[edge_bytes(a, b, s, ways) for b in needed] for a in produced])
                if p_name not in dims:
                    unary[c_name] += m[0]
                elif c_name not in dims:
                    unary[p_name] += m[:, 0]
                else:
                    tp, tc = node_of[p_name], node_of[c_name]
                    if tp == tc:
                        cb = combos[tp]
                        internal[tp] += m[cb[:, member[p_name]], cb[:, member[c_name]]]
                    else:
                        problem_pairs.append((tp, member[p_name], tc, member[c_name], m))
        if memory_weight > 0:
            for n in dims:
                unary[n] += memory_weight * self._unsplit_bytes(step.ops[n], choices[n], factor[n],
                                                                ways, size, states, n)
        for t, piece in enumerate(nodes):
            for n in piece:
                internal[t] += unary[n][combos[t][:, member[n]]]
        problem = LevelProblem([len(c) for c in combos], internal)
        # Edges of one pair of nodes, lifted to their joint choices; members repeat
        # (many edges, few (member, member) pairs), so sum per member pair first.
        by_members = {}
        for tp, pp, tc, pc, m in problem_pairs:
            k = (tp, pp, tc, pc)
            by_members[k] = by_members[k] + m if k in by_members else m
        for (tp, pp, tc, pc), m in by_members.items():
            problem.add_pair(tp, tc, m[combos[tp][:, pp][:, None], combos[tc][:, pc][None, :]])
        # Each node's largest tensor (an output or its variable), for solvers that
        # order by size (Spartan's, in tofu_baselines).
        self._node_bytes = [max([whole_bytes(n, port) for n in piece
                                 for port in range(len(step.ops[n].output_shapes))]
                                + [step.ops[n].param_bytes for n in piece]) for piece in nodes]
        try:
            total_bytes, picked, exact, solver = self._solve(problem, nodes, step)
        except TooWide:
            if max_combos > 1:
                # Groups cut into pieces of many joint choices can leave a piece
                # with many neighbours; one node per coalesced op keeps the tables
                # small (the optimum is the same: a group's members are then
                # eliminated one by one instead of enumerated together).
                return self._level(step, dims, factor, groups, ways, memory_weight, 1)
            # Beyond what the exact DP can hold: the frontier beam, not exact.
            solver = "beam (elimination too wide)"
            total_bytes, picked, exact = frontier_beam(problem, self.fallback_beam)
        if max_combos != self.max_combos:
            solver += " (one node per coalesced op)"
        self._last_solver = solver
        self._last_problem, self._last_nodes = problem, nodes
        choice = {}
        for t, piece in enumerate(nodes):
            for n in piece:
                choice[n] = choices[n][int(combos[t][picked[t], member[n]])]
        return choice, float(total_bytes), exact

    @staticmethod
    def _unsplit_bytes(op, choices, factor, ways, size, states, name):
        """Per choice, the bytes of ``op``'s current part each device of the group holds
        beyond an even ``ways``-way split: outputs the choice does not split (whole,
        replicated or partial sums), and its variable share when it splits nothing."""
        share = op.param_bytes / float(np.prod(list(factor.values()) or [1]))
        out = np.zeros(len(choices))
        for port in range(len(op.output_shapes)):
            for j, st in enumerate(states(name, port, True)):
                if not isinstance(st, int) and st != "none":
                    out[j] += size(name, port)
        out += np.array([share if c is None else 0.0 for c in choices])
        return out * (1 - 1 / ways)

    # -- the strategy ---------------------------------------------------------------------
    def _strategy(self, step, devices, dims, history):
        k = len(devices)
        radices = self._ways(k)
        # Every colocation group spread by bytes: a variable's, and TF's gradient
        # sums' too (data parallelism keeps those by their variable; here
        # spreading them balances memory, which is what Tofu is for).
        home = group_devices(step, devices)
        configs = {}
        for name, op in step.ops.items():
            if op.tied and not any(d for d, _ in history.get(name, ())):
                if op.group is not None:
                    configs[name] = OpConfig({}, (home[op.group],))
                else:
                    src = op.inputs[0][0] if op.inputs else None
                    configs[name] = OpConfig({}, (configs[src].devices[0] if src in configs
                                                  else devices[0],))
                continue
            levels = history.get(name, [])
            split = {}
            for d, ways in levels:
                if d is not None:
                    split[d] = split.get(d, 1) * ways
            if not split:
                src = op.inputs[0][0] if op.inputs else None
                dev = configs[src].devices[0] if src in configs else devices[0]
                configs[name] = OpConfig({}, (dev,))
                continue
            order = [d for d in dims[name].dims if d in split]
            devs = []
            for combo in itertools.product(*[range(split[d]) for d in order]):
                index = dict(zip(order, combo))
                dev, rest = 0, dict(index)
                remaining = {d: split[d] for d in order}
                for (d, ways), radix in zip(levels, radices):
                    digit = 0
                    if d is not None:
                        remaining[d] //= ways
                        digit, rest[d] = divmod(rest[d], remaining[d])
                    dev = dev * radix + digit
                devs.append(devices[dev])
            configs[name] = OpConfig(split, tuple(devs))
        return Strategy(configs, devices[0], name="tofu")


@register_search
class TofuSearch(StrategySearch):
    """:class:`Tofu` behind the search interface (``get_search("tofu")``), so that
    ``auto`` weighs its plan against the others'.

    Options are :class:`Tofu`'s; ``writable`` defaults to False like the other
    searches' (:func:`fddps.tf.place` sets it). :meth:`fit` raises
    :class:`~fddps.errors.InfeasibleError` when no plan fits.
    """

    name = "tofu"
    options = dict(writable=False, beam=None, max_combos=1, split_variables=True,
                   memory_weights=(0.0, 0.25, 1.0, 4.0, 16.0, 64.0, 256.0),
                   merge_timesteps=True, carry_fetched=True, max_table=1 << 22,
                   fallback_beam=64, progress=False)

    def __init__(self, **options):
        super().__init__(**options)
        self._search()  # bad options fail here, named

    def _search(self) -> Tofu:
        try:
            return Tofu(writable=self.writable, beam=self.beam, max_combos=self.max_combos,
                        split_variables=self.split_variables, memory_weights=self.memory_weights,
                        merge_timesteps=self.merge_timesteps, carry_fetched=self.carry_fetched,
                        max_table=self.max_table, fallback_beam=self.fallback_beam)
        except (TypeError, ValueError) as why:
            raise SearchError(f"strategy search 'tofu': {why}") from None

    def fit(self, step, cluster, cost_model) -> SearchResult:
        plan = self._search().search(step, cluster, cost_model)
        peak = np.asarray(plan.peak_memory, dtype=np.float64)
        makespan = float(plan.timeline.makespan)
        return SearchResult(plan.strategy, makespan, peak, bool(plan.fits), self.name,
                            plan.search_seconds,
                            dict(cost=penalised_cost(makespan, peak, cluster.memory),
                                 comm_bytes=plan.comm_bytes, levels=len(plan.levels),
                                 groups=plan.groups, exact=plan.exact,
                                 memory_weight=plan.info.get("memory_weight", 0.0)))


def tofu(step, cluster, cost_model, **options) -> TofuPlan:
    """``Tofu(**options).search(step, cluster, cost_model)``: a plan that fits, or InfeasibleError."""
    return Tofu(**options).search(step, cluster, cost_model)


__all__ = ["Tofu", "TofuPlan", "TofuSearch", "edge_bytes", "factorize", "forward_name", "tofu"]
