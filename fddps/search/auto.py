"""Run the searches within a time budget and keep the fastest strategy that fits (``"auto"``).

The budget is, by default, relative: ``budget_factor`` (2) times the seconds
the baselines took, so ``auto`` costs about three times one FD-DPS placement
(its baselines are FD-DPS's placement plus two simulations), wherever the
graph's size puts that. The baselines are where its gains were measured (on
the six networks every winner was FD-DPS's whole-op placement read through
the strategy layer), and they always run. ``time_budget=`` seconds gives a
fixed budget instead, as before.

Called by :func:`fddps.place` (``algorithm="auto"``), the budget is the whole
call's instead (``call_budget``, default 2.5): ``place`` first makes the
default algorithm's placement, which ``auto`` must never be predicted
slower than, and the call then ends by ``call_budget`` times the seconds
that took (reading the graph and placing it). Its own measurements put the
gains there: every winner was FD-DPS's whole-op placement (a baseline) or
the default's own, and the searches were cut by their budget without
winning. So only that baseline is simulated (``call_baselines``), it is
written and re-timed as a GraphDef (``fddps.tf.search_place``) when its
simulated step is below the default's (``retime_within``) and a write fits
the time left, and ``fddps_space`` runs from it only when more than the
baselines' seconds are left after a write (its answer written the same
way); the other searches do not run (their ``deadline``, a
``time.perf_counter()`` instant, is when the baselines end).

In order, each from the time the ones before it left:

1. the baselines (one device, data parallelism, FD-DPS's whole-op
   placement), each fully simulated, whatever they take (they are what
   ``auto`` promises never to be slower than);
2. FD-DPS over the strategy space (``"fddps_space"``, from that placement)
   with all the budget that is left (``fddps_space_share`` caps it) and
   nothing cut before it runs out (its ``choose_share=1``): deterministic, so
   when ``fddps_space`` alone finishes within what the baselines leave of
   ``auto``'s budget, ``auto`` finds the same strategy and is never
   predicted slower than it;
3. Tofu's recursive partition (``"tofu"``: the least-communication plan that
   fits, often the only one for a model larger than a device; seconds on a
   CNN): with a fixed ``time_budget``, like the baselines, always run, even
   with no time left; with the relative budget, run while time is left, and
   always when no baseline fits (the reason kept when no plan fits);
4. the vertex-elimination DP (``"pase"``, in ``pase_share`` of what is left; a
   step too wide for its table bound, or whose costing outlasts its share, is
   skipped, and the reason kept);
5. FlexFlow's MCMC for the rest of the budget, its chains starting from the
   candidates so far, fastest first (skipped when nothing is left).

The answer is the candidate with the shortest simulated step among those
that fit in memory (the least penalised cost when none fits), so it is never
predicted slower than the best baseline. A search started with time left
gets a deadline at the budget's end and stops at its next check past it; one
begun with none left is skipped. So ``auto`` overruns its budget by at most
the seconds of what always runs (the baselines and Tofu) plus one
indivisible piece of work of the search that was running when the budget ran
out (an ``fddps_space`` try: an FD-DPS schedule of the parts and a
simulation; the DP's costing of one vertex; MCMC's set-up, its starts'
simulations and one proposal); ``info["seconds"]`` has each one's,
``info["cut"]`` the searches the deadline stopped early.
``info`` has every candidate's step, the winner and its margin over the best
baseline.
"""

from __future__ import annotations

import time

from ..errors import InfeasibleError
from .base import SearchError, SearchResult, StrategySearch, get_search, positive, register_search
from .evaluate import StrategyEvaluator
from .space import baseline_strategies


#: The baselines :func:`~fddps.search.space.baseline_strategies` makes.
BASELINE_NAMES = ("one device", "data parallel", "fddps")


@register_search
class AutoSearch(StrategySearch):
    """The best of the baselines, FD-DPS over the strategy space, Tofu, the DP and FlexFlow's MCMC.

    Parameters
    ----------
    time_budget : float or None
        Seconds for the whole search; None (the default): ``budget_factor``
        times the baselines' seconds. See the module for the order in which
        the searches share it and by how much it can be overrun.
    budget_factor : float
        With ``time_budget=None``, the budget after the baselines as a multiple
        of their seconds (default 2: ``auto`` takes about 3x FD-DPS's
        placement).
    max_proposals : int
        MCMC's proposal budget (default 2000).
    seed : int
    writable : bool
        Only configurations the GraphDef rewrite writes (:func:`fddps.tf.place` sets it).
    progress : bool
    pase_share : float
        The share of what is left of ``time_budget`` after FD-DPS over the
        strategy space and Tofu that the DP's costing may take before it is
        skipped (default 0.6); MCMC gets the rest.
    fddps_space_share : float
        The most of ``time_budget`` FD-DPS over the strategy space may take
        (default 1: all it needs, up to what the baselines left).
    deadline : float or None
        A ``time.perf_counter()`` instant by which the searches must end,
        instead of ``time_budget`` or ``budget_factor`` (:func:`fddps.tf.place`
        sets it from ``call_budget``). The baselines still always run; every
        search after them, Tofu included, runs only while time is left (Tofu
        also when no baseline fits).
    call_budget : float or None
        For :func:`fddps.tf.place` only (no effect on :meth:`fit`): the whole
        ``place(..., algorithm="auto")`` call, reading, the default's
        placement, the searches and writing the candidates included, is
        budgeted to ``call_budget`` times the seconds the default algorithm's
        placement took in the same call (its reading and placing; default 2.5:
        the 3x users accept, less what the budget cannot see: the call's
        ending, freeing the graphs it read and wrote, took 0.1-0.8 s past
        the budget on ResNet-50 and ResNet-200, and that reference, one
        measurement of the default, was 0.68-1.21 s for the same ResNet-50
        call in one run; with 3, auto measured 3.3-3.6x the default's median
        where it wrote a candidate (experiments.auto_default, 3 rounds). A
        write is estimated at the default's seconds (measured 0.8-1.4x a
        write), so the estimate holds the margin for what cannot be cut, the
        strategy layer's step graph and the baselines). The baselines in ``call_baselines`` are simulated and
        written first; a candidate is written and re-timed only when the
        seconds measured for a write so far (the default's placement before
        the first) fit before the end; ``fddps_space`` then runs only with
        more than the baselines' seconds left after one more write, and Tofu,
        the DP and MCMC do not run. Cost: what those searches would find
        (on the six networks they were cut and never won); gain: ``auto``
        takes under 3x the default's seconds, where it took 6-25x
        (experiments.auto_default).
        ``None``: the earlier budget (``time_budget`` or ``budget_factor``,
        for the searches only, and every candidate below written). Ignored
        when ``time_budget`` is given.
    baselines : tuple of str or None
        The baselines simulated and kept as candidates (None, the default: all
        three, "one device", "data parallel" and "fddps").
    call_baselines : tuple of str
        ``baselines`` under :func:`fddps.tf.place`'s ``call_budget`` (default
        ``("fddps",)``: FD-DPS's whole-op placement, the baseline that won on
        five of the six networks; the default's own placement stands in for
        one device, which its order guard already compared with, and data
        parallelism never won there). Cost: where data parallelism would
        win, ``auto`` answers the default's or FD-DPS's placement; gain: on
        ResNet-50 at 4 P100s the two simulations took 1.2 of auto's 2.5 s of
        baselines (profiled).
    retime_within : float
        With ``call_budget``: a candidate is written and re-timed only when its
        simulated step (the search's task graph) is below the default's
        predicted step times ``1 + retime_within`` (default 0: strictly
        below); fastest first. On the six networks FD-DPS's whole-op placement
        simulated exactly what it predicted as written; a split strategy's
        task graph misses what the rewrite adds between parts (slices,
        concatenations), so as written it is usually predicted slower than
        simulated, not faster. Cost: a candidate whose
        written step would be below its task graph's is missed (``auto`` then
        returns the default's or another written placement, never one
        predicted slower than the default); gain: no write of a candidate
        that ties the default (the CPU quick start, where both keep one
        device: 4.3 s of a 14.6 s profiled call) or is slower (one device,
        data parallelism on the CNNs).

    Example
    -------
    >>> r = AutoSearch().fit(step, cluster, cost_model)   # doctest: +SKIP
    >>> r.search, r.info["seconds"]                                      # doctest: +SKIP
    ('fddps_space', {'baselines': 0.4, 'fddps_space': 2.1, ...})
    """

    name = "auto"
    options = dict(time_budget=None, budget_factor=2.0, max_proposals=2000, seed=0,
                   writable=False, progress=False, pase_share=0.6, fddps_space_share=1.0,
                   deadline=None, call_budget=2.5, retime_within=0.0, baselines=None,
                   call_baselines=("fddps",))

    def __init__(self, **options):
        super().__init__(**options)
        self.time_budget = positive("time_budget", self.time_budget, allow_none=True)
        self.budget_factor = positive("budget_factor", self.budget_factor, allow_none=False)
        self.max_proposals = positive("max_proposals", self.max_proposals, integer=True,
                                      allow_none=False)
        for share in ("pase_share", "fddps_space_share"):
            value = positive(share, getattr(self, share), allow_none=False)
            if value > 1:
                raise SearchError(f"option {share!r} must be a share in (0, 1], got {value!r}")
            setattr(self, share, value)
        self.call_budget = positive("call_budget", self.call_budget, allow_none=True)
        within = self.retime_within
        if (isinstance(within, bool) or not isinstance(within, (int, float))
                or not within >= 0 or within == float("inf")):
            raise SearchError(f"option 'retime_within' must be a number >= 0, got {within!r}")
        self.retime_within = float(within)
        for option in ("baselines", "call_baselines"):
            names = getattr(self, option)
            if names is None and option == "baselines":
                continue
            if isinstance(names, str) or not set(names) <= set(BASELINE_NAMES) or not names:
                raise SearchError(f"option {option!r} must name some of {BASELINE_NAMES}, "
                                  f"got {names!r}")
            setattr(self, option, tuple(names))
        if self.deadline is not None and (isinstance(self.deadline, bool)
                                          or not isinstance(self.deadline, (int, float))):
            raise SearchError("option 'deadline' must be a time.perf_counter() instant, got "
                              f"{self.deadline!r}")

    def fit(self, step, cluster, cost_model) -> SearchResult:
        """Search ``step`` on ``cluster``: the best candidate's :class:`SearchResult`."""
        t0 = time.perf_counter()
        ev = StrategyEvaluator(step, cluster, cost_model)
        starts = baseline_strategies(step, cluster, cost_model, writable=self.writable,
                                     names=self.baselines)
        candidates = {}
        for name, strategy in starts.items():
            score = ev.full(strategy)
            candidates[name] = (strategy, score.makespan, score.peak, score.fits, score.cost)
        skipped, cut, seconds = {}, [], {"baselines": time.perf_counter() - t0}
        relative = self.time_budget is None or self.deadline is not None
        if self.deadline is not None:  # place()'s call budget: what it left the searches
            budget = max(self.deadline - t0, 0.0)
        elif self.time_budget is None:
            budget = (1.0 + self.budget_factor) * seconds["baselines"]
        else:
            budget = self.time_budget
        end = t0 + budget

        def left():  # seconds left (a search started gets at least a sliver, never <= 0)
            return max(end - time.perf_counter(), 1e-9)

        if self.deadline is not None:
            no_time = (f"no time left of the {budget:.3g} s place()'s call budget left the "
                       "searches (call_budget)")
        else:
            no_time = (f"no time left of the {budget:.3g} s budget"
                       + (f" ({self.budget_factor:g}x the baselines' seconds after them)"
                          if relative else ""))

        def attempt(name, run, errors=(), always=False):
            """``run()``'s result, kept as a candidate; None when skipped (no time, or ``errors``)."""
            t = time.perf_counter()
            result = None
            if time.perf_counter() >= end and not always:
                skipped[name] = no_time
            else:
                try:
                    result = run()
                    candidates[name] = (result.strategy, result.makespan, result.peak,
                                        result.fits, result.info["cost"])
                except errors as why:
                    skipped[name] = str(why)
            seconds[name] = time.perf_counter() - t
            return result

        fs = attempt("fddps_space", lambda: get_search(
            "fddps_space", writable=self.writable, progress=self.progress, choose_share=1.0,
            time_budget=min(left(), self.fddps_space_share * budget)).fit(
            step, cluster, cost_model, start=starts.get("fddps")))
        if fs is not None and fs.info["out_of_time"]:
            cut.append("fddps_space")
        # Tofu is often the only plan that fits a model larger than a device: with a fixed
        # budget it runs whatever is left, as the baselines do (seconds on a CNN); with the
        # relative one, when time is left or nothing fits yet. Its search already expanded
        # and simulated its plan, as ev.full would.
        attempt("tofu", lambda: get_search("tofu", writable=self.writable).fit(
            step, cluster, cost_model), InfeasibleError,
            always=not relative or not any(c[3] for c in candidates.values()))
        dp = attempt("pase", lambda: get_search(
            "pase", writable=self.writable, progress=self.progress,
            time_budget=self.pase_share * left()).fit(step, cluster, cost_model), SearchError)
        # The fastest starts first: chains begun after the budget ran out are skipped.
        order = sorted(candidates, key=lambda n: candidates[n][4])
        mc = attempt("flexflow", lambda: get_search(
            "flexflow", time_budget=left(), max_proposals=self.max_proposals, seed=self.seed,
            writable=self.writable, progress=self.progress).fit(
            step, cluster, cost_model, starts={n: candidates[n][0] for n in order}))

        fitting = [n for n, c in candidates.items() if c[3]]
        if fitting:
            winner = min(fitting, key=lambda n: candidates[n][1])
        else:
            winner = min(candidates, key=lambda n: candidates[n][4])
        strategy, makespan, peak, fits, _ = candidates[winner]
        # MCMC started from the others: when it only kept a start, credit that start.
        kept = candidates.get(mc.info["start"]) if winner == "flexflow" else None
        if kept is not None and kept[1] == makespan and kept[3] == fits:
            winner = mc.info["start"]
            strategy = candidates[winner][0]
        baselines = {n: candidates[n][1] for n in ("one device", "data parallel", "fddps")
                     if n in candidates and candidates[n][3]}
        best_base = min(baselines.values()) if baselines else float("nan")
        strategy.name = strategy.name or winner
        total = time.perf_counter() - t0
        info = dict(winner=winner, steps={n: c[1] for n, c in candidates.items()},
                    fits={n: c[3] for n, c in candidates.items()}, skipped=skipped, cut=cut,
                    seconds=seconds, budget=budget, relative_budget=relative,
                    over_budget=max(total - budget, 0.0), best_baseline=best_base,
                    speedup_over_best_baseline=best_base / makespan if makespan > 0 else float("nan"),
                    proposals=mc.info["proposals"] if mc else 0,
                    delta_seconds=mc.info["delta_seconds"] if mc else float("nan"),
                    full_seconds=mc.info["full_seconds"] if mc else float("nan"))
        if dp is not None:
            info["pase_additive_cost"] = dp.info["additive_cost"]
        return SearchResult(strategy, makespan, peak, fits, winner, total, info,
                            candidates={n: c[0] for n, c in candidates.items()})


def describe_search(info) -> str:
    """One line of :meth:`fddps.tf.place.Placement.summary`: which search won and by how much."""
    found = info["search_info"]
    if "steps" not in found:  # one search, not auto
        return (f"strategy search ({info['algorithm']}): {info['search_seconds']:.1f} s, "
                + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in found.items() if not isinstance(v, dict)))
    steps = ", ".join(f"{n} {s * 1e3:.4g} ms" for n, s in found["steps"].items())
    text = (f"strategy search (auto, {info['search_seconds']:.1f} s): {found['winner']} won, "
            f"{found['speedup_over_best_baseline']:.3g}x the best of one device, data parallelism "
            f"and whole-op placement; predicted steps: {steps}")
    if "written_steps" in found:  # re-timed on the rewritten GraphDefs (fddps.tf.search_place)
        written = found["written_steps"]
        base = [written[n] for n in BASELINE_NAMES if n in written]
        best = written[found["written_winner"]]
        text += (f"; as written (with the ops the rewrite adds): {found['written_winner']} won"
                 + (f", {min(base) / best:.3g}x the best baseline written" if base else "")
                 + "; " + ", ".join(f"{n} {s * 1e3:.4g} ms" for n, s in written.items()))
        if "call_budget" in found:  # place()'s call budget (fddps.tf.search_place)
            b = found["call_budget"]
            text += (f"; call budget {b['seconds']:.3g} s ({b['factor']:g}x the default's "
                     f"{b['default_seconds']:.3g} s), used {b.get('seconds_used', 0):.3g} s"
                     + (f", not written: {', '.join(found['not_written'])}"
                        if found.get("not_written") else ""))
    return text
