"""Score strategies by simulation, re-expanding only what a change touches: :class:`StrategyEvaluator`.

A strategy's cost is the simulated step (:func:`fddps.strategy.expand`, then
:func:`fddps.simulate.simulate` with a first-in-first-out executor per device)
plus a penalty for memory over capacity (:func:`penalised_cost`).

Delta simulation (FlexFlow's Section 5.3, adapted to where the time goes
here). Of a full simulation of ResNet-50 on 4 GPUs, about 90% is the
expansion (parts, boxes, the bytes each edge carries) and 10% the replay.
So a proposal that changes some ops' configurations rebuilds the task-graph
*fragments* of those ops and of the ops that read them (an op's tasks and
in-edges depend only on its own configuration and its producers' layouts),
keeps every other fragment, and replays the assembled task graph. The
assembled graph is the one :func:`~fddps.strategy.expand` builds, task for
task and edge for edge in the same order (partial-sum reduce tasks shared by
several readers are created by the first, as there), so the simulated step
is the full simulation's exactly (``tests/test_search.py`` checks it on
random proposals). The replay itself is not incremental: with the executor's
choice depending on arrival times, a change early in the step can reorder
everything after it.

Example
-------
>>> from costmodel import default_cost_model
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> from fddps.strategy import OpConfig, whole_placement
>>> cm = default_cost_model("p100")
>>> g = StepGraph([OpInfo("x", "Const", output_shapes=((64, 512),), output_itemsizes=(4,),
...                       output_bytes=131072.0),
...                OpInfo("y", "Relu", inputs=(("x", 0),), input_shapes=((64, 512),),
...                       output_shapes=((64, 512),), input_itemsizes=(4,),
...                       output_itemsizes=(4,), flops=32768.0, input_bytes=131072.0,
...                       output_bytes=131072.0)])
>>> ev = StrategyEvaluator(g, cm.cluster(["/device:GPU:0", "/device:GPU:1"]), cm)
>>> base = ev.reset(whole_placement({}, "/device:GPU:0"))
>>> delta = ev.propose({"y": OpConfig({"n": 2}, ("/device:GPU:0", "/device:GPU:1"))})
>>> delta.makespan == ev.full(ev.strategy(delta.configs)).makespan
True
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..graph import OpGraph
from ..simulate import simulate
from ..strategy.expand import (add_edge, distinct_pieces, expand, op_layout, op_records,
                               task_aliases)

#: Records of :func:`~fddps.strategy.expand.op_records` that carry a cost-model row.
COSTED = ("T", "R", "C")
from ..strategy.strategy import Strategy, validate
from .space import resolved_dims

#: Default weight of memory over capacity: the cost is multiplied by
#: ``1 + MEMORY_PENALTY * overflow``, overflow being the excess bytes over the
#: capacity, summed over devices, as a fraction of one device's capacity.
MEMORY_PENALTY = 10.0


def penalised_cost(makespan, peak, capacity, weight=MEMORY_PENALTY) -> float:
    """``makespan * (1 + weight * overflow)``; overflow as in :data:`MEMORY_PENALTY` (0 when all fit)."""
    capacity = np.asarray(capacity, dtype=np.float64)
    excess = np.maximum(np.asarray(peak, dtype=np.float64) - capacity, 0.0)
    finite = np.isfinite(capacity) & (capacity > 0)
    overflow = float((excess[finite] / capacity[finite]).sum()) if finite.any() else 0.0
    return float(makespan) * (1.0 + weight * overflow)


@dataclass
class Score:
    """One strategy's simulated step.

    Attributes
    ----------
    cost : float
        ``makespan`` with the memory penalty (:func:`penalised_cost`).
    makespan : float
        Seconds of the simulated step.
    peak : numpy.ndarray
        Peak bytes per device (cluster order).
    fits : bool
        Whether every device's peak is within its capacity.
    configs : dict of op name -> OpConfig
        The strategy scored (every op).
    seconds : float
        Wall-clock seconds the scoring took.
    fragments : dict, internal
        The rebuilt fragments (for :meth:`StrategyEvaluator.accept`).
    """

    cost: float
    makespan: float
    peak: np.ndarray
    fits: bool
    configs: dict
    seconds: float = 0.0
    fragments: dict = field(default_factory=dict, repr=False)


class StrategyEvaluator:
    """Score strategies of one step on one cluster, full or by delta.

    Parameters
    ----------
    step : StepGraph
    cluster : Cluster
        Devices named as the strategies name them (``cost_model.cluster(names)``).
    cost_model : CostModel
    memory_penalty : float
        :data:`MEMORY_PENALTY`.

    Use: :meth:`reset` with a first strategy, then :meth:`propose` changes
    (a dict of op -> OpConfig) and :meth:`accept` the ones to keep;
    :meth:`full` scores any strategy from scratch (the reference).
    """

    def __init__(self, step, cluster, cost_model, memory_penalty=MEMORY_PENALTY):
        self.step, self.cluster, self.cost_model = step, cluster, cost_model
        self.memory_penalty = float(memory_penalty)
        self.types = list(dict.fromkeys(d.type for d in cluster.devices))
        self.capacity = np.asarray(cluster.memory, dtype=np.float64)
        self.dims = resolved_dims(step)  # (ops equal in what resolve reads share one)
        self.readers = {name: [] for name in step.ops}
        for name, op in step.ops.items():
            for src in dict.fromkeys([p for p, _ in op.inputs] + list(op.control_inputs)):
                self.readers[src].append(name)
        self.position = {name: i for i, name in enumerate(step.ops)}
        self.configs = {}
        self.fragments = {}
        self._layouts = {}
        self.current = None

    # -- strategies ----------------------------------------------------------------------
    def strategy(self, configs, name="") -> Strategy:
        """A :class:`Strategy` naming every op's configuration of ``configs``."""
        return Strategy(dict(configs), self.cluster.names[0], name=name)

    def _score(self, makespan, peak, configs, t0, fragments=None) -> Score:
        peak = np.asarray(peak, dtype=np.float64)
        cost = penalised_cost(makespan, peak, self.capacity, self.memory_penalty)
        fits = bool(np.all(peak <= self.capacity * (1 + 1e-12)))
        return Score(cost, float(makespan), peak, fits, configs, time.perf_counter() - t0,
                     fragments or {})

    def full(self, strategy) -> Score:
        """Expand and simulate ``strategy`` from scratch (the reference for the delta)."""
        t0 = time.perf_counter()
        tl = expand(self.step, strategy, self.cluster, self.cost_model,
                    dims_of=self.dims).simulate(self.cluster)
        configs = {n: strategy.config(n) for n in self.step.ops}
        return self._score(tl.makespan, tl.peak_memory.to_numpy(), configs, t0)

    def reset(self, strategy) -> Score:
        """Make ``strategy`` the current one (validated; every fragment built) and score it."""
        t0 = time.perf_counter()
        validate(strategy, self.step, self.cluster.names)
        configs = {n: strategy.config(n) for n in self.step.ops}
        fragments = self._build(list(self.step.ops), configs)
        self.configs, self.fragments = configs, fragments
        makespan, peak = self._simulate(fragments)
        self.current = self._score(makespan, peak, dict(configs), t0)
        return self.current

    def propose(self, changes) -> Score:
        """Score the current strategy with ``changes`` (op -> OpConfig) applied, by delta.

        The current strategy is unchanged until :meth:`accept`. Changes must be
        valid configurations (the searches draw them from
        :func:`fddps.search.space.op_choices`).
        """
        t0 = time.perf_counter()
        configs = dict(self.configs)
        configs.update(changes)
        touched = set(changes)
        for name in changes:
            touched.update(self.readers[name])
        rebuilt = self._build(sorted(touched, key=self.position.get), configs)
        fragments = dict(self.fragments)
        fragments.update(rebuilt)
        makespan, peak = self._simulate(fragments)
        return self._score(makespan, peak, configs, t0, rebuilt)

    def accept(self, score: Score) -> None:
        """Make a proposal's strategy the current one."""
        self.fragments.update(score.fragments)
        self.configs = dict(score.configs)
        self.current = score

    # -- fragments ---------------------------------------------------------------------
    def _layout(self, name, cfg):
        """Per output port: (entries [(task, device, box)], itemsize, partial) as expand's
        (cached per op and configuration: the DP asks for the same ones many times)."""
        key = (name,) + cfg.key
        if key not in self._layouts:
            self._layouts[key] = self._new_layout(name, cfg)
        return self._layouts[key]

    def _new_layout(self, name, cfg):
        return op_layout(self.step.ops[name], cfg, self.dims[name])

    def _fragment(self, name, configs, layouts):
        """The records expand() emits for op ``name`` (:func:`~fddps.strategy.expand.op_records`),
        a task's or reduce's row replaced by its index in the returned rows."""
        recs, rows = [], []
        for r in op_records(self.step.ops[name], configs[name], self.dims[name], layouts[name],
                            lambda src, port: layouts[src][2][port],
                            lambda src: layouts[src][1]):
            if r[0] in COSTED:
                recs.append((*r[:-1], len(rows)))
                rows.append(r[-1])
            else:
                recs.append(r)
        return recs, rows

    def _build(self, names, configs, costed=True):
        """Fragments of ``names`` under ``configs``, costed in one batch (tasks' and reduces'
        costs ``None`` when not ``costed``: the DP's edge terms need only the edges)."""
        layouts = {}

        def layout(n):
            if n not in layouts:
                layouts[n] = self._layout(n, configs[n])
            return layouts[n]

        built, all_rows = {}, []
        for name in names:
            op = self.step.ops[name]
            layout(name)
            for src in dict.fromkeys([p for p, _ in op.inputs] + list(op.control_inputs)):
                layout(src)
            recs, rows = self._fragment(name, configs, layouts)
            built[name] = (recs, len(all_rows))
            all_rows.extend(rows)
        if not costed:
            return {name: [(*r[:-1], None) if r[0] in COSTED else r for r in recs]
                    for name, (recs, _) in built.items()}
        table = pd.DataFrame(all_rows, columns=["name", "op_type", "flops", "input_bytes",
                                                "output_bytes", "param_bytes", "profile_name",
                                                "kernel_shape"])
        with warnings.catch_warnings():
            # Each proposal re-costs a few ops; the step's expansion already named every
            # op type that falls back, and hundreds of repeats would bury it. (Imported
            # here: the cost model is any object with op_times, costmodel's or not.)
            from costmodel import ProfileCoverageWarning

            warnings.simplefilter("ignore", ProfileCoverageWarning)
            cost = (np.column_stack([np.asarray(self.cost_model.op_times(table, t),
                                                dtype=np.float64) for t in self.types])
                    if len(table) else np.zeros((0, len(self.types))))
        persistent, transient = self.cost_model.memory(table) if len(table) else ((), ())
        op_types = table["op_type"].tolist()
        out = {}
        for name, (recs, base) in built.items():
            out[name] = [(*r[:-1], (cost[base + r[-1]], persistent[base + r[-1]],
                                    transient[base + r[-1]], op_types[base + r[-1]]))
                         if r[0] in COSTED else r for r in recs]
        return out

    def _assemble(self, fragments):
        names, device, costs, mem, trans, types, edges, reduces = [], {}, [], [], [], [], [], {}
        gathers, extra, pieces = set(), [], []
        for name in self.step.ops:
            for r in fragments[name]:
                kind = r[0]
                if kind == "E":
                    add_edge(edges, pieces, r)
                elif kind == "G":
                    gathers.add(r[1])
                elif kind == "C":  # a slice or concatenation its reader pays for
                    extra.append((r[1], r[3][0]))
                elif kind == "T":
                    _, tname, dev, (c, p, t, ty) = r
                    names.append(tname)
                    device[tname] = dev
                    costs.append(c), mem.append(p), trans.append(t), types.append(ty)
                else:
                    _, key, consumer, overlapping, (c, p, t, ty) = r
                    if key not in reduces:
                        rname = f"{key[0]}/fddps_reduce_{key[1]}_{len(reduces)}"
                        names.append(rname)
                        device[rname] = key[3]
                        costs.append(c), mem.append(p), trans.append(t), types.append(ty)
                        edges.extend((src, rname, b) for src, _, b in overlapping)
                        reduces[key] = rname
                    edges.append((reduces[key], consumer, 0.0))
        edges = distinct_pieces(edges, pieces, device)
        costs = np.array(costs).reshape(len(names), len(self.types))
        if extra:
            position = {n: i for i, n in enumerate(names)}
            np.add.at(costs, [position[t] for t, _ in extra], np.array([c for _, c in extra]))
        graph = OpGraph(names, costs, edges,
                        memory=mem, transient=trans, device_types=self.types, op_types=types,
                        pinned=device, aliases=task_aliases(types, names, gathers))
        return graph, device

    def _simulate(self, fragments):
        graph, device = self._assemble(fragments)
        tl = simulate(graph, self.cluster, device)
        return tl.makespan, tl.peak_memory.to_numpy()

    def timeline(self, configs=None):
        """The :class:`~fddps.simulate.Timeline` of the current strategy (or of ``configs``)."""
        fragments = self.fragments if configs is None else self._build(list(self.step.ops), configs)
        graph, device = self._assemble(fragments)
        return simulate(graph, self.cluster, device)


__all__ = ["MEMORY_PENALTY", "Score", "StrategyEvaluator", "penalised_cost"]
