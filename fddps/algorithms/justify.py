"""Forward-backward improvement: iterative justification of a list schedule.

Not part of the FD-DPS paper: a post-pass fddps adds (``FDDPS(improve=True)``)
because a single list-scheduling pass leaves idle time that a few cheap passes
recover. The technique is Li & Willis's iterative forward-backward scheduling
(EJOR 56, 1992), known in project scheduling as double justification (Valls,
Ballestin & Quintanilla, EJOR 165, 2005):

1. *Backward pass*: list-schedule the reversed graph, taking ops in order of
   decreasing finish time in the current schedule: every op is pushed as late
   as it can go.
2. *Forward pass*: list-schedule the graph, taking ops in order of increasing
   start time in the backward schedule (read forwards): every op is pulled as
   early as it can go.

Each pass sends every op to the device where it finishes first (insertion into
idle gaps allowed, transfers and memory respected), so the constraints are
those of every other algorithm here. The best schedule seen is kept, so the
result is never worse than the input.

It refines only while it pays. On graphs of up to ``small_graph_ops`` ops,
where a pass costs milliseconds, a descent ends after ``max_stale`` passes
without improvement, and the search then restarts from the input with its
finish times perturbed at random (seeded), a fixed number of times: that is
what closes the last tenths of a percent on the Standard Task Graph Set
(ending at the first pass gaining under 0.1% there moved its mean ratio from
1.0009 to 1.0013). On larger graphs each pass costs two list passes of
thousands of ops and the gains after the first few are hundredths of a
percent (a 2,000-op ``training_graph`` on 8 devices: 0.40%, 0.07%, then 0.15%
over 17 more passes and restarts; on 4 devices 0.9%, 0.9%, 0.19%, then
nothing): there the first pass that shortens the best makespan by less than
``min_gain`` of it (:data:`DEFAULT_MIN_GAIN`, 0.1%) ends the refinement,
without restarts. Between 300 and 1,000 ops the restarts still pay: on
``training_graph`` of 300, 500 and 800 ops on 2, 4 and 8 devices (27
instances) they end 0-1.05% shorter (mean 0.29%) than the min-gain rule
would, for seven times its passes (540 against 76). Above
:data:`PATIENT_GRAPH_OPS` (300) ops, though, most restarts find nothing (on
VGG-16's 602-op training step, 4 P100s, none of the 20 passes did): there the
restarts end after :data:`DEFAULT_MAX_STALE_RESTARTS` (2) in a row that do
not shorten the best makespan. On the 27 instances above that costs 0.05% on
average (at most 0.47%) for 0.56x the passes (303 against 540); on STG
(graphs of 50 and 100 ops) the same rule would move the mean ratio from
1.0009 to 1.0012, which is why graphs that small make every restart.

Work is bounded by a budget proportional to the list pass, counted in op
placements rather than timed, so the result does not depend on the machine:
by default :data:`DEFAULT_MAX_PASSES` forward-backward passes (each places
every op twice, so the refinement places at most ``2 * DEFAULT_MAX_PASSES``
times as many ops as the list pass it refines), and at most
:data:`DEFAULT_MAX_PLACEMENTS` in all, which leaves one pass above 50,000 ops
(on ``training_graph`` of 50,000 and 100,000 ops, 8 devices, a second pass
gained nothing and took the refinement 1.9x as long). It also stops once the
makespan reaches :func:`fddps.lower_bound`.
"""

from __future__ import annotations

import numpy as np

from ..bounds import lower_bound
from .base import PlacementState, list_schedule

#: A pass that shortens the best makespan by less than this fraction of it ends
#: the refinement of a graph over :data:`SMALL_GRAPH_OPS` ops (0.1%).
DEFAULT_MIN_GAIN = 1e-3

#: Graphs of at most this many ops refine until passes stall, with perturbed
#: restarts (a pass costs milliseconds there; STG needs them).
SMALL_GRAPH_OPS = 1000

#: Graphs of at most this many ops make every restart (STG's scale, where a
#: pass costs a millisecond or two and the last restarts still pay).
PATIENT_GRAPH_OPS = 300

#: On graphs between :data:`PATIENT_GRAPH_OPS` and :data:`SMALL_GRAPH_OPS` ops,
#: the restarts end after this many in a row that do not shorten the best makespan.
DEFAULT_MAX_STALE_RESTARTS = 2

#: The default budget, in forward-backward passes (two list passes each).
DEFAULT_MAX_PASSES = 20

#: The default budget's ceiling, in op placements (at least one pass is made).
DEFAULT_MAX_PLACEMENTS = 200_000


def default_budget(num_ops: int, passes: int = DEFAULT_MAX_PASSES,
                   ceiling: int = DEFAULT_MAX_PLACEMENTS) -> int:
    """Op placements of ``passes`` forward-backward passes over ``num_ops`` ops, at most
    ``ceiling``.

    Examples
    --------
    >>> default_budget(2000), default_budget(100_000)
    (80000, 200000)
    """
    return min(2 * passes * max(int(num_ops), 1), ceiling)


def check_min_gain(value, what="min_gain"):
    """``value`` as a float in [0, 1); raises ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) \
            or not 0 <= value < 1:
        raise ValueError(f"{what} must be a number in [0, 1) (a fraction of the makespan), "
                         f"got {value!r}")
    return float(value)


def forward_backward_improve(graph, cluster, start, finish, makespan, *, budget=None,
                             restarts=10, max_stale=2, noise=0.1, seed=0, exec_time=None,
                             min_gain=DEFAULT_MIN_GAIN, small_graph_ops=SMALL_GRAPH_OPS,
                             max_stale_restarts=DEFAULT_MAX_STALE_RESTARTS,
                             patient_graph_ops=PATIENT_GRAPH_OPS):
    """Improve a schedule by forward-backward passes; return the best state found, or None.

    Parameters
    ----------
    graph, cluster
    start, finish : arrays of float
        Times of the schedule to improve.
    makespan : float
        Its makespan.
    budget : int, optional
        At most this many op placements in all (a forward-backward pass costs
        ``2 * num_ops``); at least one pass is made. Default
        :func:`default_budget`: :data:`DEFAULT_MAX_PASSES` passes, at most
        :data:`DEFAULT_MAX_PLACEMENTS` placements.
    restarts : int
        Perturbed restarts after the first descent stalls.
    max_stale : int
        Passes without improvement before a descent ends.
    min_gain : float
        On graphs over ``small_graph_ops`` ops: a pass that shortens the best
        makespan by less than this fraction of it (or not at all) ends the
        refinement; what it improved is kept. 0 makes them refine as small ones.
        Default :data:`DEFAULT_MIN_GAIN`.
    small_graph_ops : int
        Graphs of at most this many ops refine until ``max_stale`` passes
        stall, with ``restarts`` perturbed restarts.
    max_stale_restarts : int or None
        On graphs of more than ``patient_graph_ops`` ops (and at most
        ``small_graph_ops``), the restarts end after this many in a row that
        do not shorten the best makespan; None makes every restart.
    patient_graph_ops : int
        Graphs of at most this many ops make every restart.
    noise : float
        Restart perturbation: finish times get uniform noise up to ``noise * makespan``.
    seed : int

    Returns
    -------
    (PlacementState or None, dict)
        The best forward pass's state if it beat ``makespan`` (else None), and
        statistics: passes made, improvements, whether the lower bound was reached.

    Raises
    ------
    ValueError
        If ``min_gain`` is not a number in [0, 1).
    """
    min_gain = check_min_gain(min_gain)
    n = graph.num_ops
    if budget is None:
        budget = default_budget(n)
    et = graph.exec_times(cluster) if exec_time is None else exec_time
    bound = lower_bound(graph, cluster)
    tol = 1e-9 * max(makespan, 1e-300)
    reverse = graph.reversed()
    rng = np.random.default_rng(seed)
    max_passes = max(1, budget // max(2 * n, 1))
    best, best_state = makespan, None
    stats = {"improve_passes": 0, "improve_max_passes": max_passes, "improvements": 0,
             "lower_bound_reached": makespan <= bound + tol}
    base_finish = np.asarray(finish, dtype=np.float64)
    small = n <= small_graph_ops or min_gain <= 0
    # Every pass starts from empty states of these two (tables computed once).
    empty_forward = PlacementState(graph, cluster, et)
    empty_backward = empty_forward.fresh(reverse)
    # Restarts in a row that found nothing; past the limit the restarts stop paying.
    stale_limit = None if n <= patient_graph_ops else max_stale_restarts
    stale_restarts = 0
    for attempt in range(restarts + 1 if small else 1):
        if stale_limit is not None and stale_restarts >= stale_limit:
            stats["stale_restarts"] = stale_restarts
            break
        best_before = best
        finish_now = base_finish if attempt == 0 else (
            base_finish + rng.uniform(0.0, noise * best, n))
        stale = 0
        while stale < max_stale and stats["improve_passes"] < max_passes:
            if best <= bound + tol:
                stats["lower_bound_reached"] = True
                return best_state, stats
            backward = list_schedule(empty_backward.fresh(), -finish_now)
            forward = list_schedule(empty_forward.fresh(), -np.asarray(backward.finish))
            stats["improve_passes"] += 1
            finish_now = np.asarray(forward.finish)
            span = float(finish_now.max(initial=0.0))
            if span < best - tol:
                gain = (best - span) / best
                best, best_state, stale = span, forward, 0
                stats["improvements"] += 1
                if not small and gain < min_gain:
                    stats["stopped_at_gain"] = gain
                    break
            elif not small:  # no gain at all is less than min_gain too
                break
            else:
                stale += 1
        if stats["improve_passes"] >= max_passes:
            break
        if attempt > 0:
            stale_restarts = stale_restarts + 1 if best >= best_before else 0
    stats["lower_bound_reached"] = best <= bound + tol
    return best_state, stats
