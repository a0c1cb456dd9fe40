"""FD-DPS over the strategy space (``algorithm="fddps_space"``).

FD-DPS's intra-op split step (paper Section 4.1, Algorithm 3 lines 2-6;
:mod:`fddps.algorithms.split_step`) chose between whole and a batch or channel split of
Conv2D, its backprops and MatMul. Here the same step chooses, for every op on
or near the critical path, among all of the op's configurations in the
strategy space (:func:`~fddps.search.space.unit_splits`: each dimension of its
iteration domain, :data:`fddps.strategy.ops.OP_DESCRIPTIONS`, and pairs of
them, factors up to the number of devices), and FD-DPS's list scheduler then
places the parts:

1. FD-DPS places the whole ops (:func:`~fddps.search.space.baseline_strategies`'
   ``"fddps"``): the start, and the answer when nothing beats it.
2. Critical ops: slack at most ``critical_slack`` of the critical path, from
   mean costs as FD-DPS measures it (:func:`fddps.algorithms.split_step.path_slack`),
   and some compute (FLOPs).
3. For each, in step order, every configuration is costed by the cost model at
   its parts' own shapes (:class:`~fddps.search.evaluate.StrategyEvaluator`'s
   fragments: part times, the bytes each part reads and sends given its
   neighbours' configurations so far, partial-sum reduces, batch-norm
   statistics), its parts on distinct devices starting with the op's own: the
   busiest device's compute plus the busiest link's transfers. The best
   configuration is kept when it beats the whole op's estimate by
   ``min_gain``; later ops see it (so consecutive ops tend to agree on a
   layout and pass their parts without moving them).
4. The chosen configurations expand into a task graph of parts whose edges
   carry their bytes wherever their ends go (:func:`fddps.strategy.expand`
   with ``apart=True``); FD-DPS's list scheduler places every task (the parts,
   the whole ops, a reduce task with its reader, a statistics task with its
   part, tied ops with their variable), and the placement is read back as a
   :class:`~fddps.strategy.Strategy`.
5. Every such strategy is simulated (the same expansion and simulator every
   search is scored by); the splits are tried all together and then only the
   ``1/2, 1/4, ...`` with the largest estimated gains (a split that the
   estimate liked may still lengthen the simulated step), until halving
   stops shortening the step. The shortest
   strategy that fits in memory wins, FD-DPS's whole-op placement included,
   so the result is never predicted slower than it.

Deterministic: no random choices (FD-DPS's own restarts are seeded); a
``time_budget`` cuts where the machine allows.

Example
-------
>>> result = FDDPSSpaceSearch().fit(step, cluster, cost_model)   # doctest: +SKIP
>>> result.info["splits"]                                         # doctest: +SKIP
{'conv1/Conv2D': {'n': 2}, ...}
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
from networkx.utils import UnionFind

from ..algorithms.split_step import path_slack
from ..graph import OpGraph
from ..strategy.expand import expand, part_of_task, shared_task
from ..strategy.strategy import OpConfig, Strategy
from .base import SearchError, SearchResult, StrategySearch, positive, register_search
from .evaluate import MEMORY_PENALTY, StrategyEvaluator
from .space import baseline_strategies, unit_splits, whole_op_graph


def parts_graph(step, strategy, cluster, cost_model) -> tuple:
    """``strategy``'s task graph of parts, unpinned, for a whole-op scheduler to place.

    Every edge carries its bytes wherever its ends go (:func:`fddps.strategy.expand`
    with ``apart=True``). Colocation groups keep together what must share a
    device: the ops bound to one variable (they are kept whole), a reduce
    task and the part that reads it, a statistics task and its part.

    Returns
    -------
    (graph, tasks) : OpGraph, dict of op name -> list of its part tasks
    """
    ex = expand(step, strategy, cluster, cost_model, apart=True)
    g = ex.graph
    groups = UnionFind(g.names)
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            groups.union(("group", op.group), *ex.tasks[name])
    for u, v in zip(g.src.tolist(), g.dst.tolist()):
        src, dst = g.names[u], g.names[v]
        if shared_task(src):  # one reader per reduce task (apart=True)
            groups.union(src, dst)
        elif part_of_task(src) == part_of_task(dst):  # a part, its statistics, their passes
            groups.union(src, dst)
    root = {name: groups[name] for name in g.names}
    sizes = defaultdict(int)
    for r in root.values():
        sizes[r] += 1
    colocation = [str(root[n]) if sizes[root[n]] > 1 else None for n in g.names]
    edges = list(zip((g.names[i] for i in g.src.tolist()), (g.names[i] for i in g.dst.tolist()),
                     g.bytes.tolist()))
    graph = OpGraph(g.names, g.cost, edges, memory=g.memory, transient=g.transient,
                    device_types=g.device_types, op_types=g.op_types, colocation=colocation)
    return graph, ex.tasks


@register_search
class FDDPSSpaceSearch(StrategySearch):
    """FD-DPS whose split step chooses among every configuration (see the module notes).

    Parameters
    ----------
    critical_slack : float
        Ops whose slack is at most this share of the critical path are
        considered for splitting (default 0.1, as
        :func:`fddps.algorithms.split_step.plan_splits`).
    min_gain : float
        A configuration must beat the whole op's estimate by this share
        (default 0.05, as :func:`fddps.algorithms.split_step.plan_splits`).
    max_dims : int
        Dimensions split at once (default 2).
    rounds : int
        Passes of the choice over the critical ops (default 2): the first sees
        the choices of the ops before each, a later one those after it too
        (it stops early when a pass changes nothing).
    fddps_options : dict, optional
        Options of the FD-DPS scheduler (:class:`fddps.algorithms.fddps.FDDPS`)
        for both the whole ops and the parts.
    time_budget : float, optional
        Seconds: choosing stops at ``choose_share`` of them (the ops left stay
        whole), and no set of splits but the first is tried past them (so one
        try may overrun it; ``info["out_of_time"]`` says whether it cut). Without it the
        search is deterministic; with it, it cuts where the machine allows.
    choose_share : float
        The share of ``time_budget`` after which choosing stops (default 0.5,
        leaving time to try the splits). ``1`` cuts nothing before the budget
        runs out, so a search that finishes within its budget returns what it
        returns without one (``"auto"`` runs it so).
    writable : bool
        Only configurations the GraphDef rewrite writes (:func:`fddps.tf.place` sets it).
    memory_penalty : float
        :data:`fddps.search.evaluate.MEMORY_PENALTY` (for ranking strategies that
        do not fit).
    progress : bool
        A progress bar over the critical ops while costing them.
    """

    name = "fddps_space"
    options = dict(critical_slack=0.1, min_gain=0.05, max_dims=2, rounds=2, fddps_options=None,
                   time_budget=None, writable=False, memory_penalty=MEMORY_PENALTY,
                   progress=False, choose_share=0.5)

    def __init__(self, **options):
        super().__init__(**options)
        if self.critical_slack is None or not isinstance(self.critical_slack, (int, float)) or \
                isinstance(self.critical_slack, bool) or not 0 <= self.critical_slack <= 1:
            raise SearchError(f"option 'critical_slack' must be a number in [0, 1], got "
                              f"{self.critical_slack!r}")
        if not isinstance(self.min_gain, (int, float)) or isinstance(self.min_gain, bool) or \
                not 0 <= self.min_gain < 1:
            raise SearchError(f"option 'min_gain' must be a number in [0, 1), got "
                              f"{self.min_gain!r}")
        self.max_dims = positive("max_dims", self.max_dims, integer=True, allow_none=False)
        self.rounds = positive("rounds", self.rounds, integer=True, allow_none=False)
        self.time_budget = positive("time_budget", self.time_budget)
        if not isinstance(self.choose_share, (int, float)) or isinstance(self.choose_share, bool) \
                or not 0 < self.choose_share <= 1:
            raise SearchError(f"option 'choose_share' must be a number in (0, 1], got "
                              f"{self.choose_share!r}")
        if self.fddps_options is not None and not isinstance(self.fddps_options, dict):
            raise SearchError(f"option 'fddps_options' must be a dict of FD-DPS options, got "
                              f"{self.fddps_options!r}")
        if self.fddps_options:
            from ..algorithms import get_algorithm

            try:
                get_algorithm("fddps", **self.fddps_options)
            except TypeError as why:
                raise SearchError(f"option 'fddps_options': {why}") from None

    # -- step 2 and 3: which ops, which configuration ---------------------------------------
    def critical_ops(self, step, cluster, cost_model) -> list:
        """Names of the ops with some compute whose slack is within ``critical_slack``."""
        graph = whole_op_graph(step, cluster, cost_model)
        slack, length, _ = path_slack(graph, cluster)
        return [name for name, s in zip(graph.names, slack)
                if s <= self.critical_slack * length + 1e-15 and step.ops[name].flops > 0
                and not step.ops[name].tied]

    def estimate(self, ev, name, configs) -> float:
        """Seconds of op ``name`` under ``configs``: the busiest device's compute (its parts, the
        reduces of its partial sums) plus the busiest link's transfers to, from and inside it."""
        step = ev.step
        readers = ev.readers[name]
        frags = ev._build([name, *readers], configs)
        device = {}
        for n in dict.fromkeys([name, *readers, *(p for p, _ in step.ops[name].inputs),
                                *step.ops[name].control_inputs]):
            op_parts, tasks, _ = ev._layout(n, configs[n])
            for p, t in zip(op_parts, tasks):
                device[t] = p.device
        column = {d.name: ev.types.index(d.type) for d in ev.cluster.devices}
        idx = ev.cluster.index
        own = set(ev._layout(name, configs[name])[1])
        busy, link = defaultdict(float), defaultdict(float)

        def move(a, b, nbytes):
            if a != b:
                i, j = idx[a], idx[b]
                link[i, j] += ev.cluster.latency[i, j] + nbytes * ev.cluster.inv_bandwidth[i, j]

        for n, recs in frags.items():
            for r in recs:
                if r[0] in ("T", "C") and n == name:
                    busy[r[2]] += float(r[3][0][column[r[2]]])
                elif r[0] == "E" and (n == name or part_of_task(r[1]) in own):
                    move(device[part_of_task(r[1])], device[part_of_task(r[2])], r[3])
                elif r[0] == "R" and r[1][0] == name:  # a reduce of this op's partial sums
                    dev = r[1][3]
                    busy[dev] += float(r[4][0][column[dev]])
                    for src, _, nbytes in r[3]:
                        move(device[part_of_task(src)], dev, nbytes)
        return max(busy.values(), default=0.0) + max(link.values(), default=0.0)

    def choose(self, ev, step, start, candidates, progress=None, deadline=None) -> list:
        """``[(op, config, estimated gain)]``: the best configuration of each candidate that beats
        it whole, chosen in step order, each seeing the others' choices so far; ``rounds``
        passes (a later pass sees its readers' choices too). Past ``deadline`` (a
        ``time.perf_counter()`` value) the candidates not yet costed stay as they are."""
        devices = list(ev.cluster.names)
        configs = {n: start.config(n) for n in step.ops}
        splits = {n: [s for s in unit_splits(step, (n,), len(devices), self.max_dims,
                                             self.writable) if s] for n in candidates}
        gains = {}
        for _ in range(self.rounds):
            changed = False
            for name in candidates:
                if deadline is not None and time.perf_counter() > deadline:
                    self._out_of_time = True
                    break
                home = start.config(name).devices[0]
                order = [home] + [d for d in devices if d != home]
                trial = dict(configs)
                trial[name] = start.config(name)
                whole = self.estimate(ev, name, trial)
                best = (whole * (1 - self.min_gain), start.config(name))
                for split in splits[name]:
                    trial[name] = OpConfig(split, order[:int(np.prod(list(split.values())))])
                    t = self.estimate(ev, name, trial)
                    if t < best[0]:
                        best = (t, trial[name])
                changed |= best[1] != configs[name]
                configs[name] = best[1]
                gains[name] = whole - best[0] if best[1].num_parts > 1 else None
                if progress is not None:
                    progress.update(1)
            if not changed:
                break
        return [(n, configs[n], gains[n]) for n in candidates if gains.get(n) is not None]

    # -- step 4: FD-DPS places the parts --------------------------------------------------
    def place_parts(self, step, start, chosen, cluster, cost_model) -> Strategy:
        """The strategy with ``chosen`` configurations, every task placed by FD-DPS."""
        from ..algorithms import get_algorithm

        configs = {n: start.config(n) for n in step.ops}
        configs.update({n: cfg for n, cfg, _ in chosen})
        strategy = Strategy(configs, start.default_device)
        graph, tasks = parts_graph(step, strategy, cluster, cost_model)
        schedule = get_algorithm("fddps", **(self.fddps_options or {})).schedule(graph, cluster)
        device = schedule.placement  # a property that builds the dict: once
        placed = {n: OpConfig(configs[n].split, tuple(device[t] for t in tasks[n]))
                  for n in step.ops}
        return Strategy(placed, start.default_device, name="fddps over the strategy space")

    def fit(self, step, cluster, cost_model, start=None) -> SearchResult:
        """Search; ``start``, FD-DPS's whole-op placement of this step as a strategy (as
        :func:`~fddps.search.space.baseline_strategies` gives it), is reused if given."""
        from tqdm.auto import tqdm

        from ..errors import InfeasibleError

        t0 = time.perf_counter()
        ev = StrategyEvaluator(step, cluster, cost_model, self.memory_penalty)
        if start is None:
            starts = baseline_strategies(step, cluster, cost_model, self.fddps_options,
                                         writable=self.writable)
            start = starts.get("fddps", starts["one device"])
        scores = {"whole ops": (start, ev.full(start))}
        candidates = self.critical_ops(step, cluster, cost_model) if len(cluster.names) > 1 else []
        bar = tqdm(total=len(candidates) * self.rounds, desc="fddps_space",
                   disable=not self.progress)
        self._out_of_time = False
        budget = self.time_budget
        chosen = self.choose(ev, step, start, candidates, bar,
                             None if budget is None else t0 + budget * self.choose_share)
        bar.close()
        t_choose = time.perf_counter() - t0
        ranked = sorted(chosen, key=lambda c: -c[2])
        keep, infeasible, best_step = len(ranked), 0, None
        while keep >= 1:
            # The first set is tried whatever the time (the splits chosen so far are worth one
            # try); no further one past the budget.
            if budget is not None and keep < len(ranked) and time.perf_counter() - t0 > budget:
                self._out_of_time = True
                break
            try:
                s = self.place_parts(step, start, ranked[:keep], cluster, cost_model)
                sc = ev.full(s)
                scores[f"{keep} splits"] = (s, sc)
                if best_step is not None and sc.makespan >= best_step:
                    break  # fewer splits stopped paying: the estimate's best are in already
                best_step = sc.makespan
            except InfeasibleError:  # FD-DPS found no device with room for some part
                infeasible += 1
            keep //= 2
        fitting = [k for k, (_, sc) in scores.items() if sc.fits]
        best = (min(fitting, key=lambda k: (scores[k][1].makespan, k != "whole ops")) if fitting
                else min(scores, key=lambda k: scores[k][1].cost))
        chosen_strategy, score = scores[best]
        strategy = Strategy(dict(chosen_strategy.configs), chosen_strategy.default_device,
                            name="fddps over the strategy space")  # never rename the start
        split = {n: dict(c.split) for n, c in strategy.configs.items() if c.num_parts > 1}
        info = dict(critical_ops=len(candidates), splits_chosen=len(chosen), kept=best,
                    splits=split, whole_ops_step=scores["whole ops"][1].makespan,
                    speedup_over_whole_ops=scores["whole ops"][1].makespan / score.makespan,
                    tried={k: sc.makespan for k, (_, sc) in scores.items()},
                    infeasible=infeasible, choose_seconds=t_choose, cost=score.cost,
                    out_of_time=self._out_of_time)
        return SearchResult(strategy, score.makespan, score.peak, score.fits, self.name,
                            time.perf_counter() - t0, info)


__all__ = ["FDDPSSpaceSearch", "parts_graph"]
