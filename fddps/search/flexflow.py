"""FlexFlow's search (Jia et al., MLSys 2019, Section 6): Metropolis-Hastings over strategies.

A proposal changes one decision unit (an op, or the tied ops of one variable)
at random: either a new configuration (a split drawn from
:func:`~fddps.search.space.unit_splits`, its parts on distinct devices drawn
at random, or whole on a random device), or, for a split unit, one part moved
to another device. It is scored by delta simulation
(:class:`~fddps.search.evaluate.StrategyEvaluator`) and accepted with
probability ``min(1, exp(beta * (cost - cost') / cost))`` (the paper's
Equation 1 with costs relative to the current one, so ``beta`` does not
depend on the step's length). Costs are simulated steps with a penalty for
memory over capacity.

As in the paper, the search runs a chain from each initial strategy (one
device, data parallelism, FD-DPS's whole-op placement) with an equal share of
the budget, and a chain stops when its share of proposals or seconds is spent,
or when it has not improved its best for half of the proposals it made (and at
least ``patience`` proposals). Seeded: the same seed and budget of proposals
give the same result (a time budget cuts where the machine allows).

Example
-------
>>> search = FlexFlowSearch(max_proposals=200, seed=0)   # doctest: +SKIP
>>> result = search.fit(step, cluster, cost_model)        # doctest: +SKIP
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..strategy.strategy import OpConfig
from .base import SearchResult, StrategySearch, positive, register_search
from .evaluate import MEMORY_PENALTY, StrategyEvaluator
from .space import baseline_strategies, decision_units, unit_splits, worth_deciding




@register_search
class FlexFlowSearch(StrategySearch):
    """Metropolis-Hastings over strategies, scored by delta simulation.

    Parameters
    ----------
    max_proposals : int
        Proposals in all (shared equally by the chains). Default 1000.
    time_budget : float, optional
        Seconds in all, the evaluator's set-up included; each chain gets an
        equal share of what is left when it starts. Once it is spent, the
        starts not yet begun are skipped (not even simulated; the first chain
        always runs), so the search overruns it by at most its set-up, one
        start's simulation and one proposal.
    beta : float
        Inverse temperature for relative cost changes (default 50: a proposal
        2% worse is accepted with probability ``exp(-1)``).
    patience : int
        A chain stops once it has not improved for this many proposals and
        for half of its proposals (default 100).
    seed : int
    starts : sequence of str
        Initial strategies among :func:`~fddps.search.space.baseline_strategies`'
        (default all three).
    memory_penalty : float
        :data:`fddps.search.evaluate.MEMORY_PENALTY`.
    progress : bool
        Show a tqdm progress bar.
    measure_full_every : int
        Every this many proposals, also time a full simulation of the proposal
        (for the delta/full speed-up in ``info``); 0 for never. Default 25.
    writable : bool
        Propose only configurations the GraphDef rewrite writes
        (:func:`~fddps.search.space.unit_splits`; :func:`fddps.tf.place` sets it).
    """

    name = "flexflow"
    options = dict(max_proposals=1000, time_budget=None, beta=50.0, patience=100, seed=0,
                   starts=("one device", "data parallel", "fddps"), memory_penalty=MEMORY_PENALTY,
                   progress=False, measure_full_every=25, writable=False)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_proposals = positive("max_proposals", self.max_proposals, integer=True,
                                      allow_none=False)
        self.time_budget = positive("time_budget", self.time_budget)
        self.beta = positive("beta", self.beta, allow_none=False)
        self.patience = positive("patience", self.patience, integer=True, allow_none=False)

    def fit(self, step, cluster, cost_model, starts=None) -> SearchResult:
        """Search; ``starts`` (name -> Strategy) overrides the default initial strategies."""
        from tqdm.auto import tqdm

        t0 = time.perf_counter()
        rng = np.random.default_rng(self.seed)
        devices = list(cluster.names)
        k = len(devices)
        ev = StrategyEvaluator(step, cluster, cost_model, self.memory_penalty)
        if starts is None:
            base = baseline_strategies(step, cluster, cost_model, writable=self.writable)
            starts = {s: base[s] for s in self.starts if s in base}
        units = [u for u in decision_units(step) if any(worth_deciding(step.ops[n]) for n in u)]
        splits = {u: unit_splits(step, u, k, writable=self.writable) for u in units}
        n_chains = len(starts)
        per_chain = max(1, self.max_proposals // n_chains)
        deadline = t0 + self.time_budget if self.time_budget else None
        best, best_from, start_costs = None, None, {}
        delta_s, full_s, proposals, accepted = [], [], 0, 0
        bar = tqdm(total=per_chain * n_chains, desc="flexflow", unit="proposal",
                   disable=not self.progress)
        for c, (start_name, strategy) in enumerate(starts.items()):
            if deadline is not None and best is not None and time.perf_counter() > deadline:
                break  # out of time: each further start would cost a full simulation
            current = ev.reset(strategy)
            start_costs[start_name] = current.makespan
            chain_best = current
            last_improved = 0
            # Each chain gets an equal share of what is left of the budget (the
            # evaluator's set-up and the starts' full simulations count too).
            chain_end = None if deadline is None else \
                time.perf_counter() + max(deadline - time.perf_counter(), 0.0) / (n_chains - c)
            for i in range(per_chain):
                if chain_end is not None and time.perf_counter() > chain_end:
                    break
                if i - last_improved > max(self.patience, i // 2):
                    break
                unit = units[int(rng.integers(len(units)))]
                cfg = ev.configs[unit[0]]
                if cfg.num_parts > 1 and rng.random() < 0.5:
                    devs = list(cfg.devices)
                    devs[int(rng.integers(len(devs)))] = devices[int(rng.integers(k))]
                    new = OpConfig(cfg.split, devs)
                else:
                    split = splits[unit][int(rng.integers(len(splits[unit])))]
                    n = int(np.prod(list(split.values()))) if split else 1
                    new = OpConfig(split, [devices[j] for j in rng.permutation(k)[:n]])
                if (new.split, new.devices) == (cfg.split, cfg.devices):
                    bar.update(1)
                    continue
                proposal = ev.propose({name: new for name in unit})
                proposals += 1
                delta_s.append(proposal.seconds)
                if self.measure_full_every and proposals % self.measure_full_every == 0:
                    full = ev.full(ev.strategy(proposal.configs))
                    full_s.append(full.seconds)
                rel = (current.cost - proposal.cost) / current.cost
                if rel >= 0 or rng.random() < math.exp(self.beta * rel):
                    ev.accept(proposal)
                    current = proposal
                    accepted += 1
                    if proposal.cost < chain_best.cost:
                        chain_best, last_improved = proposal, i
                bar.update(1)
            if best is None or chain_best.cost < best.cost:
                best, best_from = chain_best, start_name
        bar.close()
        strategy = ev.strategy(best.configs, name="flexflow")
        info = dict(proposals=proposals, accepted=accepted, start=best_from,
                    start_steps=start_costs, cost=best.cost,
                    delta_seconds=float(np.mean(delta_s)) if delta_s else float("nan"),
                    full_seconds=float(np.mean(full_s)) if full_s else float("nan"))
        return SearchResult(strategy, best.makespan, best.peak, best.fits, self.name,
                            time.perf_counter() - t0, info)
