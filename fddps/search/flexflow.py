"""FlexFlow's search (Jia et al., MLSys 2019, Section 6): Metropolis-Hastings over strategies.

What the paper says, and what this module does by default:

- **Proposals** (Section 6.2): an op (here a decision unit: an op, or the tied
  ops of one variable) is drawn at random and its configuration replaced by
  a random one (a split drawn from :func:`~fddps.search.space.unit_splits`,
  its parts on distinct devices drawn at random, or whole on a random
  device); a split unit may instead have one part moved to another device.
  Scored by delta simulation (:class:`~fddps.search.evaluate.StrategyEvaluator`).
- **Acceptance** (Equation 1): ``min(1, exp(beta * (cost(S) - cost(S*))))``
  on the absolute simulated cost (seconds, with the memory penalty of
  :func:`~fddps.search.evaluate.penalised_cost`). ``beta`` is fixed for the
  whole search at ``beta_scale / cost(S0)``, ``S0`` the first start's
  simulated cost (data parallelism): Equation 1 needs a ``beta`` in 1/seconds
  and the paper gives none; scaling it once by the starting step makes one
  default serve steps of milliseconds and of seconds alike. With the default
  ``beta_scale = 50`` a proposal 2% of data parallelism's step slower than the
  current strategy is accepted with probability ``1/e``.
- **Beta per chain** (option ``beta_reference``, ours): Equation 1 has one
  ``beta`` for the whole search, and the paper gives no value or rule for it.
  With one ``beta`` for every chain, a worse proposal's acceptance depends on
  its slowdown in units of the first start's step: a chain from a start 7x
  faster than data parallelism (FD-DPS's placement on NMT at 64 K80s) sees
  every slowdown as 7x smaller and accepts nearly everything (97% there), a
  chain from a slower start (a random strategy) sees it as larger.
  ``beta_reference="chain start"`` sets ``beta = beta_scale / cost(that
  chain's start)``, fixed within the chain (Equation 1 as written, one
  ``beta`` per chain), so a worse proposal is accepted by its slowdown
  relative to its own chain's step; ``"chain best"`` re-sets it from the
  chain's best cost each time the chain improves, so a chain cools as it
  gains (closer to annealing than to the paper). ``"first start"``, the
  paper's single ``beta``, stays the default: with the paper's starts the
  data-parallel chain is the first start's, so ``"chain start"`` changes
  only the random chain's ``beta`` (smaller: that start is slower), and on
  AlexNet at 16 P100s (``python -m experiments.flexflow --figure beta
  --models alexnet --devices 16 --budget 90``, 2026-11-26) all three rules
  found the same best step (data parallelism's chain 0.540 -> 0.485 s, the
  random chain 4.17 -> 3.88-3.95 s). On RNNTC (10 steps) at 16 P100s from
  data parallelism, a random strategy and FD-DPS's placement (150 s each) a
  beta per chain did what it is for, FD-DPS's chain (20x faster than data
  parallelism) accepting 14 of 24 worse proposals with ``"chain start"``
  against 27 of 29 with one ``beta``, but every rule found the same best,
  0.1207 s from that chain's 0.1231 s (``experiments/results/flexflow.md``).
- **Starts** (Sections 6.2 and 8): data parallelism
  (:func:`~fddps.search.flexflow_starts.sample_parallel`) and a random
  strategy (:func:`~fddps.search.flexflow_starts.random_strategy`), the
  paper's two; ours beside them by default: the expert strategy of Section
  8.1 (:func:`~fddps.search.flexflow_starts.expert_strategy`; the paper
  lists expert strategies among possible starts) and FD-DPS's whole-op
  placement. One chain per start, each with an equal share of what is left
  of the budget.
- **Stopping** (Section 6.2): a chain stops when its share of the budget is
  spent, or when it has not improved its best for half of its share. The
  share is in seconds with ``time_budget``, else in proposals
  (``max_proposals`` / chains), so a run without a time budget is seeded and
  reproducible.

Options that keep the behaviour this module had before (measured in
``experiments/flexflow.py``): ``acceptance="relative"`` (``exp(beta_scale *
(cost - cost') / cost)``, relative to the current cost), ``stop="patience"``
(stop after ``max(patience, i / 2)`` proposals without improvement, ``i``
those made), ``starts=("one device", "data parallel", "fddps")``.

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
from .base import SearchError, SearchResult, StrategySearch, positive, register_search
from .evaluate import MEMORY_PENALTY, StrategyEvaluator
from .flexflow_starts import expert_strategy, random_strategy, sample_parallel
from .space import (baseline_strategies, decision_units, unit_splits, worth_deciding,
                    writable_strategy)

#: The starts :class:`FlexFlowSearch` knows: the paper's two, then ours.
STARTS = ("data parallel", "random", "expert", "fddps", "one device")
#: The paper's initial candidates (Section 8: "data parallelism and a randomly generated strategy").
PAPER_STARTS = ("data parallel", "random")
#: What Equation 1's ``beta`` is scaled by (the ``beta_reference`` option; see the module).
BETA_REFERENCES = ("first start", "chain start", "chain best")


def initial_strategies(step, cluster, cost_model, names, rng, writable=False, units=None) -> dict:
    """Start name -> Strategy for each of ``names`` (a subset of :data:`STARTS`).

    ``"fddps"`` is left out when FD-DPS cannot place the step.
    """
    unknown = [n for n in names if n not in STARTS]
    if unknown:
        raise SearchError(f"flexflow: unknown start {unknown[0]!r}; known: {', '.join(STARTS)}")
    devices = list(cluster.names)
    out = {}
    for name in names:
        if name == "data parallel":
            s = sample_parallel(step, devices)
        elif name == "random":
            s = random_strategy(step, devices, rng, units)
        elif name == "expert":
            s = expert_strategy(step, devices, [d.host for d in cluster.devices])
        else:
            base = baseline_strategies(step, cluster, cost_model) if name == "fddps" else None
            if name == "fddps":
                if "fddps" not in base:
                    continue
                s = base["fddps"]
            else:
                from ..strategy.strategy import whole_placement

                s = whole_placement({}, devices[0])
                s.name = "one device"
        out[name] = writable_strategy(step, s) if writable else s
    return out


@register_search
class FlexFlowSearch(StrategySearch):
    """Metropolis-Hastings over strategies, scored by delta simulation (see the module).

    Parameters
    ----------
    max_proposals : int
        Proposals in all (shared equally by the chains). Default 1000.
    time_budget : float, optional
        Seconds in all, the evaluator's set-up and the starts included; each
        chain gets an equal share of what is left when it starts. Every start
        is simulated first, whatever the budget (so the result is never worse
        than a start); the chains then run from the best start on, and once
        the budget is spent the chains not yet begun are skipped (the first
        always runs). So the search overruns it by at most its set-up, the
        starts' simulations and one proposal.
    beta_scale : float
        Equation 1's ``beta`` times the first start's simulated cost (default
        50); with ``acceptance="relative"``, the inverse temperature for
        relative cost changes.
    beta_reference : {"first start", "chain start", "chain best"}
        What ``beta = beta_scale / cost`` takes its cost from, with
        ``acceptance="absolute"``: the first start's (default: one ``beta``
        for the whole search, as Equation 1's single ``beta``); each chain's
        own start (one ``beta`` per chain); or each chain's best so far
        (re-set whenever the chain improves). See the module.
    acceptance : {"absolute", "relative"}
        ``"absolute"`` (default): Equation 1 on absolute costs with a fixed
        ``beta``; ``"relative"``: on cost changes relative to the current cost
        (this module's earlier rule).
    stop : {"half", "patience"}
        ``"half"`` (default, the paper's): a chain stops once it has not
        improved for half of its share of the budget (seconds with
        ``time_budget``, else proposals). ``"patience"``: once it has not
        improved for ``max(patience, i // 2)`` of its ``i`` proposals (the
        earlier rule).
    patience : int
        For ``stop="patience"`` (default 100).
    seed : int
    starts : sequence of str
        Initial strategies among :data:`STARTS` (default data parallelism and
        a random strategy, the paper's, then the expert strategy and FD-DPS's
        placement, ours). :meth:`fit` may be given strategies instead.
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

    Notes
    -----
    The result is the best strategy that fits in memory among every one
    scored (starts and proposals), or, when none fits, the one with the
    least penalised cost; ``fits`` says which.
    """

    name = "flexflow"
    options = dict(max_proposals=1000, time_budget=None, beta_scale=50.0,
                   beta_reference="first start", acceptance="absolute",
                   stop="half", patience=100, seed=0, starts=PAPER_STARTS + ("expert", "fddps"),
                   memory_penalty=MEMORY_PENALTY, progress=False, measure_full_every=25,
                   writable=False)

    def __init__(self, **options):
        super().__init__(**options)
        self.max_proposals = positive("max_proposals", self.max_proposals, integer=True,
                                      allow_none=False)
        self.time_budget = positive("time_budget", self.time_budget)
        self.beta_scale = positive("beta_scale", self.beta_scale, allow_none=False)
        self.patience = positive("patience", self.patience, integer=True, allow_none=False)
        for option, allowed in (("acceptance", ("absolute", "relative")),
                                ("beta_reference", BETA_REFERENCES),
                                ("stop", ("half", "patience"))):
            if getattr(self, option) not in allowed:
                raise SearchError(f"option {option!r} must be one of {allowed}, got "
                                  f"{getattr(self, option)!r}")
        unknown = [n for n in self.starts if n not in STARTS]
        if unknown or not len(self.starts):
            raise SearchError(f"option 'starts' must name some of {', '.join(STARTS)}, got "
                              f"{list(self.starts)!r}")

    def fit(self, step, cluster, cost_model, starts=None) -> SearchResult:
        """Search; ``starts`` (name -> Strategy) overrides the ``starts`` option."""
        from tqdm.auto import tqdm

        t0 = time.perf_counter()
        rng = np.random.default_rng(self.seed)
        devices = list(cluster.names)
        k = len(devices)
        ev = StrategyEvaluator(step, cluster, cost_model, self.memory_penalty)
        units = [u for u in decision_units(step) if any(worth_deciding(step.ops[n]) for n in u)]
        if starts is None:
            starts = initial_strategies(step, cluster, cost_model, self.starts, rng,
                                        writable=self.writable, units=units)
        splits = {u: unit_splits(step, u, k, writable=self.writable) for u in units}
        n_chains = len(starts)
        per_chain = max(1, self.max_proposals // n_chains)
        deadline = t0 + self.time_budget if self.time_budget else None
        best, best_fit, best_from, start_costs, chains = None, None, None, {}, {}
        beta = None
        delta_s, full_s, proposals, accepted = [], [], 0, 0
        bar = tqdm(total=per_chain * n_chains, desc="flexflow", unit="proposal",
                   disable=not self.progress)

        def keep(score, origin):
            nonlocal best, best_fit, best_from
            if best is None or score.cost < best.cost:
                best = score
                if best_fit is None:
                    best_from = origin
            if score.fits and (best_fit is None or score.makespan < best_fit.makespan):
                best_fit, best_from = score, origin

        # Every start is scored first (a full simulation each, even past the budget, so
        # that the result is never worse than a start), then the chains run from the best
        # start on: when the budget runs out, the chains skipped are the worst starts'.
        scored = {}
        for start_name, strategy in starts.items():
            current = ev.reset(strategy)
            start_costs[start_name] = current.makespan
            keep(current, start_name)
            if beta is None:  # Equation 1's beta, fixed for the search (see the module)
                beta = self.beta_scale / current.cost
            scored[start_name] = (current, ev.configs, ev.fragments)
        order = sorted(scored, key=lambda n: (not scored[n][0].fits, scored[n][0].cost))
        for c, start_name in enumerate(order):
            if deadline is not None and c > 0 and time.perf_counter() > deadline:
                break  # out of time
            current, ev.configs, ev.fragments = scored[start_name]
            ev.current = current
            chain_best, made, since, stopped = current, 0, 0, "budget"
            taken, worse, worse_taken = 0, 0, 0
            chain_beta = beta if self.beta_reference == "first start" else \
                self.beta_scale / current.cost
            chain_t0 = time.perf_counter()
            # Each chain gets an equal share of what is left of the budget (the
            # evaluator's set-up and the starts' full simulations count too).
            share = None if deadline is None else \
                max(deadline - chain_t0, 0.0) / (n_chains - c)
            last_gain_t = chain_t0
            for i in range(per_chain):
                now = time.perf_counter()
                if share is not None and now - chain_t0 > share:
                    break
                if self.stop == "half":
                    if share is not None and now - last_gain_t > share / 2:
                        stopped = "half the share without improvement"
                        break
                    if share is None and i - since > per_chain // 2:
                        stopped = "half the share without improvement"
                        break
                elif i - since > max(self.patience, i // 2):
                    stopped = "patience"
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
                made += 1
                delta_s.append(proposal.seconds)
                if self.measure_full_every and proposals % self.measure_full_every == 0:
                    full = ev.full(ev.strategy(proposal.configs))
                    full_s.append(full.seconds)
                if self.acceptance == "absolute":
                    exponent = chain_beta * (current.cost - proposal.cost)
                else:
                    exponent = self.beta_scale * (current.cost - proposal.cost) / current.cost
                worse += exponent < 0
                if exponent >= 0 or rng.random() < math.exp(exponent):
                    ev.accept(proposal)
                    current = proposal
                    accepted += 1
                    taken += 1
                    worse_taken += exponent < 0
                    keep(proposal, start_name)
                    if proposal.cost < chain_best.cost:
                        chain_best, since = proposal, i
                        last_gain_t = time.perf_counter()
                        if self.beta_reference == "chain best":
                            chain_beta = self.beta_scale / chain_best.cost
                bar.update(1)
            chains[start_name] = dict(start=start_costs[start_name], best=chain_best.makespan,
                                      proposals=made, accepted=taken, worse=int(worse),
                                      worse_accepted=int(worse_taken), beta_per_second=chain_beta,
                                      seconds=time.perf_counter() - chain_t0, stopped=stopped)
        bar.close()
        chosen = best_fit if best_fit is not None else best
        strategy = ev.strategy(chosen.configs, name="flexflow")
        info = dict(proposals=proposals, accepted=accepted, start=best_from,
                    start_steps=start_costs, cost=chosen.cost, chains=chains,
                    beta_per_second=beta, beta_reference=self.beta_reference,
                    acceptance=self.acceptance, stop=self.stop,
                    delta_seconds=float(np.mean(delta_s)) if delta_s else float("nan"),
                    full_seconds=float(np.mean(full_s)) if full_s else float("nan"))
        return SearchResult(strategy, chosen.makespan, chosen.peak, chosen.fits, self.name,
                            time.perf_counter() - t0, info)
