"""Run the searches within a time budget and keep the fastest strategy that fits (``"auto"``).

In order: the baselines (one device, data parallelism, FD-DPS's whole-op
placement), each fully simulated; FD-DPS over the strategy space
(``"fddps_space"``, in ``fddps_space_share`` of the budget, from that
placement); Tofu's recursive partition (``"tofu"``: the least-communication
plan that fits, often the only one for a model larger than a device;
skipped, with the reason kept, when none fits); the vertex-elimination DP (``"pase"``; a
step too wide for its table bound, or whose costing outlasts ``pase_share`` of
the budget, is skipped, and the reason kept); then
FlexFlow's MCMC for the rest of the budget, its chains starting from the
baselines and the other searches' strategies. The answer is the candidate with the
shortest simulated step among those that fit in memory (the least penalised
cost when none fits), so it is never predicted slower than the best baseline.
``info`` has every candidate's step, the winner and its margin over the best
baseline.
"""

from __future__ import annotations

import time

from ..errors import InfeasibleError
from .base import SearchError, SearchResult, StrategySearch, get_search, positive, register_search
from .evaluate import StrategyEvaluator
from .space import baseline_strategies


@register_search
class AutoSearch(StrategySearch):
    """The best of the baselines, the DP and FlexFlow's MCMC.

    Parameters
    ----------
    time_budget : float
        Seconds for the whole search (default 60); MCMC gets what the
        baselines and the DP leave (at least 10% of it). The baselines always
        run to the end, whatever they take (they are what ``auto`` promises
        never to be slower than), so on a large step the search can outlast
        the budget by their seconds and by each search's set-up.
    max_proposals : int
        MCMC's proposal budget (default 2000).
    seed : int
    writable : bool
        Only configurations the GraphDef rewrite writes (:func:`fddps.tf.place` sets it).
    progress : bool
    pase_share : float
        The share of ``time_budget`` the DP's costing may take before it is
        skipped (default 0.6).
    fddps_space_share : float
        The share of ``time_budget`` FD-DPS over the strategy space gets
        (default 0.3; :class:`~fddps.search.fddps_space.FDDPSSpaceSearch`'s
        ``time_budget``).
    """

    name = "auto"
    options = dict(time_budget=60.0, max_proposals=2000, seed=0, writable=False, progress=False,
                   pase_share=0.6, fddps_space_share=0.3)

    def __init__(self, **options):
        super().__init__(**options)
        self.time_budget = positive("time_budget", self.time_budget, allow_none=False)
        self.max_proposals = positive("max_proposals", self.max_proposals, integer=True,
                                      allow_none=False)
        self.pase_share = positive("pase_share", self.pase_share, allow_none=False)
        self.fddps_space_share = positive("fddps_space_share", self.fddps_space_share,
                                          allow_none=False)

    def fit(self, step, cluster, cost_model, pase=None, fddps_space=None) -> SearchResult:
        """Search; ``pase`` and ``fddps_space``, results of those searches already computed for
        this step and cluster (:class:`SearchResult`), are reused instead of run again
        (their seconds still count)."""
        t0 = time.perf_counter() - sum(r.seconds for r in (pase, fddps_space) if r is not None)
        ev = StrategyEvaluator(step, cluster, cost_model)
        starts = baseline_strategies(step, cluster, cost_model, writable=self.writable)
        candidates = {}
        for name, strategy in starts.items():
            score = ev.full(strategy)
            candidates[name] = (strategy, score.makespan, score.peak, score.fits, score.cost)
        skipped, seconds = {}, {"baselines": time.perf_counter() - t0}
        t = time.perf_counter()
        fs = fddps_space or get_search(
            "fddps_space", writable=self.writable, progress=self.progress,
            time_budget=self.fddps_space_share * self.time_budget).fit(
            step, cluster, cost_model, start=starts.get("fddps"))
        candidates["fddps_space"] = (fs.strategy, fs.makespan, fs.peak, fs.fits, fs.info["cost"])
        starts["fddps_space"] = fs.strategy
        seconds["fddps_space"] = time.perf_counter() - t + (
            fddps_space.seconds if fddps_space is not None else 0.0)
        t = time.perf_counter()
        try:
            # Tofu's search already expanded and simulated its plan, as ev.full would.
            plan = get_search("tofu", writable=self.writable).fit(step, cluster, cost_model)
            candidates["tofu"] = (plan.strategy, plan.makespan, plan.peak, plan.fits,
                                  plan.info["cost"])
            starts["tofu"] = plan.strategy
        except InfeasibleError as why:
            skipped["tofu"] = str(why)
        seconds["tofu"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            dp = pase or get_search("pase", writable=self.writable, progress=self.progress,
                                    time_budget=self.pase_share * self.time_budget).fit(
                step, cluster, cost_model)
            candidates["pase"] = (dp.strategy, dp.makespan, dp.peak, dp.fits, dp.info["cost"])
            starts["pase"] = dp.strategy
        except SearchError as why:
            skipped["pase"] = str(why)
        seconds["pase"] = time.perf_counter() - t + (pase.seconds if pase is not None else 0.0)
        left = max(self.time_budget - (time.perf_counter() - t0), 0.1 * self.time_budget)
        t = time.perf_counter()
        mc = get_search("flexflow", time_budget=left, max_proposals=self.max_proposals,
                        seed=self.seed, writable=self.writable, progress=self.progress).fit(
            step, cluster, cost_model, starts=starts)
        seconds["flexflow"] = time.perf_counter() - t
        candidates["flexflow"] = (mc.strategy, mc.makespan, mc.peak, mc.fits, mc.info["cost"])
        fitting = [n for n, c in candidates.items() if c[3]]
        if fitting:
            winner = min(fitting, key=lambda n: candidates[n][1])
        else:
            winner = min(candidates, key=lambda n: candidates[n][4])
        strategy, makespan, peak, fits, _ = candidates[winner]
        # MCMC started from the others: when it only kept a start, credit that start.
        if winner == "flexflow" and mc.info["start"] in candidates and \
                candidates[mc.info["start"]][1] == makespan:
            winner = mc.info["start"]
            strategy = candidates[winner][0]
        baselines = {n: candidates[n][1] for n in ("one device", "data parallel", "fddps")
                     if n in candidates and candidates[n][3]}
        best_base = min(baselines.values()) if baselines else float("nan")
        strategy.name = strategy.name or winner
        info = dict(winner=winner, steps={n: c[1] for n, c in candidates.items()},
                    fits={n: c[3] for n, c in candidates.items()}, skipped=skipped,
                    seconds=seconds, best_baseline=best_base,
                    speedup_over_best_baseline=best_base / makespan if makespan > 0 else float("nan"),
                    proposals=mc.info["proposals"], delta_seconds=mc.info["delta_seconds"],
                    full_seconds=mc.info["full_seconds"])
        if "pase" in candidates:
            info["pase_additive_cost"] = dp.info["additive_cost"]
        return SearchResult(strategy, makespan, peak, fits, winner, time.perf_counter() - t0, info)


def describe_search(info) -> str:
    """One line of :meth:`fddps.tf.place.Placement.summary`: which search won and by how much."""
    found = info["search_info"]
    if "steps" not in found:  # one search, not auto
        return (f"strategy search ({info['algorithm']}): {info['search_seconds']:.1f} s, "
                + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in found.items() if not isinstance(v, dict)))
    steps = ", ".join(f"{n} {s * 1e3:.4g} ms" for n, s in found["steps"].items())
    return (f"strategy search (auto, {info['search_seconds']:.1f} s): {found['winner']} won, "
            f"{found['speedup_over_best_baseline']:.3g}x the best of one device, data parallelism "
            f"and whole-op placement; predicted steps: {steps}")
