""":func:`fddps.tf.place` with a strategy search (``algorithm="auto"``, ``"flexflow"``, ``"pase"``).

The search (:mod:`fddps.search`) runs on the step's ops as the strategy layer
reads them (:func:`~fddps.tf.strategy_graph.step_graph`), proposing only
configurations the GraphDef rewrite writes; its strategy is then written and
predicted as ``place(strategy=...)`` does
(:func:`~fddps.tf.strategy_rewrite.place_strategy`).
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .devices import make_cluster
from .graphdef import analyse
from .strategy_graph import step_graph
from .strategy_rewrite import place_strategy
from .verify import ONE_DEVICE, distinct_finalists


def place_searched(graph_def, devices, algorithm, cost_model, memory=None, *, fetches=None,
                   unknown_dim=1, default=None, finalists=0, call=None, **options):
    """Search a strategy with ``algorithm`` and place it; the :class:`~fddps.tf.placement.Placement`.

    ``info`` gains ``search`` (the search that found the strategy; for
    ``auto`` the winner), ``search_info`` and ``search_seconds``.

    ``default``: the placement ``place()``'s default algorithm wrote for the
    same graph (``auto`` is given it): returned instead when the search's
    answer, as written, is not predicted faster, so ``auto`` is never
    predicted slower than the default.

    ``call``: ``(start, default_seconds)`` for ``auto``'s call budget: the
    ``time.perf_counter()`` instant the ``place()`` call began and the seconds
    its reading and the default's placement took. With the search's
    ``call_budget`` set (``auto``'s default) and no ``time_budget``, the call
    ends by ``start + call_budget * default_seconds``: only the search's
    ``call_baselines`` are simulated, written (:func:`_retime_within_budget`)
    while a write fits, and ``fddps_space`` runs from FD-DPS's placement
    when enough time is left (:func:`_search_within_budget`).
    ``info["call_budget"]`` says what was budgeted and measured.

    ``finalists``: when > 0, the placement's ``finalists`` holds up to that
    many distinct placements to time (``place(..., verify=...)``): this one,
    the one-device graph, and for ``auto`` the other candidates it wrote
    (its baselines and runners-up, the default's placement), fastest
    predicted first, that fit memory.

    Raises
    ------
    SearchError
        For an unknown or bad option of the search (named).
    """
    from ..search import get_search

    t0 = time.perf_counter()
    search = get_search(algorithm, writable=True, **options)
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    budget = _call_budget(search, call, default)
    step = step_graph(analysis, fetches)
    if budget is not None:
        # Where the gains were measured first: the baselines, simulated (the searches
        # after them are deferred, see _search_within_budget), then written. The
        # search is configured for that through its options, not changed after them.
        search = get_search(algorithm, writable=True, **{
            **options, "deadline": time.perf_counter(),
            "baselines": search.baselines or search.call_baselines})
    result = search.fit(step, cluster, cost_model)

    read_cache = {}  # candidates that write the same GraphDef read it once

    def write(strategy):
        return place_strategy(analysis, list(cluster.names), strategy, cost_model, memory,
                              fetches=fetches, unknown_dim=unknown_dim, step=step,
                              read_cache=read_cache)

    written = {}
    if budget is not None:
        placement, search_name, written = _retime_within_budget(
            result, write, default, budget, search.retime_within)
        if _search_within_budget(result, step, cluster, cost_model, budget, search):
            placement, search_name, written = _retime_within_budget(
                result, write, default, budget, search.retime_within, written=written,
                names=["fddps_space"])
        budget["seconds_used"] = time.perf_counter() - budget["start"]
        result.info["call_budget"] = budget
    else:
        placement, search_name = write(result.strategy), result.search
        if result.candidates:
            placement, search_name, written = _retime_written(result, placement, write,
                                                              default=default)
    decided = result.seconds + (default.info.get("decide_seconds", 0.0) if default else 0.0)
    placement.info.update(algorithm=algorithm, search=search_name, search_info=result.info,
                          search_seconds=result.seconds, decide_seconds=decided,
                          place_seconds=time.perf_counter() - t0)
    if finalists > 0:
        others = sorted(((n, p) for n, p in written.items() if p is not placement and _fits(p)),
                        key=lambda item: item[1].executor_makespan)
        one = [item for item in others if item[0] == ONE_DEVICE]
        if not one:
            one = one_device_finalist(analysis, cluster, cost_model, memory, fetches,
                                      unknown_dim, placement, read_cache=read_cache)
        rest = [item for item in others if item[0] != ONE_DEVICE]
        placement.finalists = distinct_finalists([(search_name, placement)] + one + rest,
                                                 finalists)
    return placement


def one_device_finalist(analysis, cluster, cost_model, memory, fetches, unknown_dim, placement,
                        read_cache=None):
    """``[("one device", Placement)]``: the whole step on the device ``placement`` found fastest
    for it (``info["single_device"]``), written as a strategy; empty when it does not fit.
    ``read_cache``: see :func:`~fddps.tf.strategy_rewrite.place_strategy`."""
    from ..strategy.strategy import whole_placement

    device = placement.info.get("single_device") or cluster.names[0]
    strategy = whole_placement({}, device)
    strategy.name = ONE_DEVICE
    with warnings.catch_warnings():  # the chosen placement's writing named them already
        from costmodel import ProfileCoverageWarning

        warnings.simplefilter("ignore", ProfileCoverageWarning)
        one = place_strategy(analysis, list(cluster.names), strategy, cost_model, memory,
                             fetches=fetches, unknown_dim=unknown_dim, read_cache=read_cache)
    return [(ONE_DEVICE, one)] if _fits(one) else []


#: Candidates of ``auto`` always written and re-timed: what it promises never to be slower than.
BASELINES = ("one device", "data parallel", "fddps")


def _fits(placement) -> bool:
    return bool(np.all(placement.peak_memory.to_numpy() <= placement.cluster.memory))


#: ``auto``'s name for the default algorithm's own placement among its written candidates.
DEFAULT_PLACEMENT = "fddps (place's default)"


def _same_strategy(a, b) -> bool:
    return a.default_device == b.default_device and dict(a.configs) == dict(b.configs)


def _call_budget(search, call, default):
    """``auto``'s call budget as a dict (``start``, ``end``, ``seconds``,
    ``default_seconds``, ``factor``), or None when it does not apply (another
    search, no default placement, ``call_budget=None``, or a ``time_budget``
    or ``deadline`` given)."""
    factor = getattr(search, "call_budget", None)
    if (factor is None or call is None or default is None
            or getattr(search, "time_budget", None) is not None
            or getattr(search, "deadline", None) is not None):
        return None
    start, default_seconds = call
    return dict(start=start, end=start + factor * default_seconds,
                seconds=factor * default_seconds, default_seconds=default_seconds,
                factor=factor)


def _search_within_budget(result, step, cluster, cost_model, budget, search) -> bool:
    """FD-DPS over the strategy space from FD-DPS's whole-op placement, in what
    ``auto``'s call budget has left after the baselines were written; whether it ran.

    It starts only when the time left, less one write (the longest measured so
    far, or the default's seconds), is more than the baselines' seconds (its
    indivisible piece, an FD-DPS schedule of the parts and a simulation, costs
    about what they did; started with less it overran the budget, 2.1 s
    for 0.9 s on ResNet-50). Its answer joins ``result``'s candidates as
    ``"fddps_space"`` (``result.info["seconds"]``, ``["steps"]``, ``["fits"]``,
    ``["cut"]``; ``["skipped"]`` says why when it did not run).
    """
    from ..search import get_search

    info = result.info
    estimate = max(budget.get("write_seconds", {}).values(), default=budget["default_seconds"])
    left = budget["end"] - time.perf_counter() - estimate
    start = result.candidates.get("fddps")
    if start is None or left <= info["seconds"]["baselines"]:
        info["skipped"]["fddps_space"] = (
            "no time left of the call budget after the baselines were written"
            if start is not None else "no FD-DPS placement to start from")
        return False
    t = time.perf_counter()
    fs = get_search("fddps_space", writable=True, progress=search.progress, choose_share=1.0,
                    time_budget=left).fit(step, cluster, cost_model, start=start)
    info["skipped"].pop("fddps_space", None)
    info["seconds"]["fddps_space"] = time.perf_counter() - t
    if fs.info["out_of_time"]:
        info["cut"].append("fddps_space")
    result.candidates["fddps_space"] = fs.strategy
    info["steps"]["fddps_space"], info["fits"]["fddps_space"] = fs.makespan, fs.fits
    return True


def _retime_within_budget(result, write, default, budget, within, written=None, names=None):
    """``auto``'s answer under its call budget: the candidates that could beat the
    default written and re-timed, fastest simulated first, while a write fits.

    A candidate is written (:func:`~fddps.tf.strategy_rewrite.place_strategy`)
    when it fits memory as simulated, its simulated step (the search's task
    graph) is below the ``default`` placement's predicted step
    (``executor_makespan``) times ``1 + within``, and the longest write so
    far (before the first: ``budget["default_seconds"]``, what reading and
    placing the graph took) ends before ``budget["end"]``; the first that
    does not fit stops the writing (the others are slower as simulated). A
    candidate with the same strategy as one written is not written again.
    The answer is the fastest written candidate that fits, or the ``default``
    placement (``DEFAULT_PLACEMENT``) when none is predicted faster: never
    predicted slower than the default.

    ``result.info`` gains ``written_steps``, ``written_winner`` and
    ``not_written`` (candidate -> why); ``budget`` gains ``write_seconds``
    (by candidate written). Returns the placement, the name of its candidate
    and every candidate written (name -> placement), as :func:`_retime_written`.
    ``written`` (what an earlier call returned) and ``names`` (the candidates
    to consider now, default all): to write a candidate found later.
    """
    info = result.info
    steps, fits = info["steps"], info["fits"]
    limit = float(default.executor_makespan) * (1.0 + within)
    names = list(result.candidates) if names is None else names
    order = sorted((n for n in names if fits.get(n)), key=lambda n: steps[n])
    not_written = info.setdefault("not_written", {})
    not_written.update({n: "does not fit memory as simulated" for n in names if not fits.get(n)})
    written = {n: p for n, p in (written or {}).items() if n != DEFAULT_PLACEMENT}
    write_seconds = budget.setdefault("write_seconds", {})
    estimate = max(write_seconds.values(), default=budget["default_seconds"])
    with warnings.catch_warnings():  # one warning per unprofiled op type is enough
        from costmodel import ProfileCoverageWarning

        for k, name in enumerate(order):
            strategy = result.candidates[name]
            same = next((n for n in written if _same_strategy(result.candidates[n], strategy)),
                        None)
            if same is not None:
                written[name] = written[same]
                continue
            if steps[name] >= limit:
                not_written.update({n: f"simulated step not below the default's "
                                       f"{default.executor_makespan * 1e3:.4g} ms x "
                                       f"{1 + within:g}" for n in order[k:]})
                break
            if time.perf_counter() + estimate > budget["end"]:
                not_written.update({n: f"no time left of the call budget "
                                       f"({budget['factor']:g}x the default's "
                                       f"{budget['default_seconds']:.3g} s) for a "
                                       f"{estimate:.3g} s write" for n in order[k:]})
                break
            t = time.perf_counter()
            written[name] = write(strategy)
            write_seconds[name] = time.perf_counter() - t
            estimate = max(write_seconds.values())
            warnings.simplefilter("ignore", ProfileCoverageWarning)
    steps_written = {n: float(p.makespan) for n, p in written.items()}
    names = list(written) + [DEFAULT_PLACEMENT]
    written[DEFAULT_PLACEMENT] = default
    steps_written[DEFAULT_PLACEMENT] = float(default.executor_makespan)
    fitting = [n for n in names if _fits(written[n])] or names
    best = min(fitting, key=lambda n: (steps_written[n], names.index(n)))
    info.update(written_steps=steps_written, written_winner=best)
    return written[best], best, written


def _retime_written(result, placement, write, runners_up: int = 2, default=None):
    """``auto``'s answer re-timed as written: the fastest fitting of the winner, the
    baselines and the ``runners_up`` next fastest candidates, each predicted on its
    rewritten GraphDef (:func:`~fddps.tf.strategy_rewrite.place_strategy`), and the
    ``default`` placement (what the TensorFlow executor runs of it,
    ``executor_makespan``) when given. A candidate with the same strategy as
    one already written is not written again.

    The searches score a strategy's task graph, which approximates what the
    rewrite adds between parts (a slice is paid on its reader's device, the
    tasks run in another order than the GraphDef's nodes); a split strategy
    that wins by less than that approximation can be slower than a baseline
    as written.
    ``result.info`` gains ``written_steps`` (seconds, by candidate) and
    ``written_winner``. Returns the placement, the name of its candidate and
    every candidate written (name -> placement).
    """
    info, winner = result.info, result.search
    fits = info["fits"]
    ranked = sorted((n for n in result.candidates if fits.get(n) and n != winner
                     and n not in BASELINES), key=lambda n: info["steps"][n])
    names = [winner] + [n for n in BASELINES if n in result.candidates and n != winner]
    names += ranked[:runners_up]
    written = {winner: placement}
    with warnings.catch_warnings():  # the winner's writing named the unprofiled op types
        from costmodel import ProfileCoverageWarning

        warnings.simplefilter("ignore", ProfileCoverageWarning)
        for name in names[1:]:
            strategy = result.candidates[name]
            same = next((n for n in written if _same_strategy(result.candidates[n], strategy)),
                        None)
            written[name] = written[same] if same is not None else write(strategy)
    steps = {n: float(p.makespan) for n, p in written.items()}
    if default is not None:
        names.append(DEFAULT_PLACEMENT)
        written[DEFAULT_PLACEMENT] = default
        steps[DEFAULT_PLACEMENT] = float(default.executor_makespan)
    fitting = [n for n in names if _fits(written[n])] or names
    best = min(fitting, key=lambda n: (steps[n], names.index(n)))
    info["written_steps"], info["written_winner"] = steps, best
    return written[best], best, written


def place_tofu(graph_def, devices, cost_model, memory, fetches, unknown_dim, options,
               finalists=0):
    """:func:`fddps.tf.place` with ``algorithm="tofu"``: Tofu's plan
    (:class:`fddps.search.tofu.Tofu`, ``options`` passed to it), written as a strategy.
    ``finalists`` > 0: ``placement.finalists`` holds it and the one-device graph."""
    from ..search.tofu import Tofu

    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    plan = Tofu(**options).search(step_graph(analysis, fetches), cluster, cost_model)
    placement = place_strategy(analysis, cluster, plan.strategy, cost_model, memory,
                               fetches=fetches, unknown_dim=unknown_dim)
    placement.info.update(algorithm="tofu", search_seconds=plan.search_seconds,
                          comm_bytes=plan.comm_bytes, tofu_plan=plan)
    if finalists > 0:
        placement.finalists = distinct_finalists(
            [("tofu", placement)] + one_device_finalist(analysis, cluster, cost_model, memory,
                                                        fetches, unknown_dim, placement),
            finalists)
    return placement
