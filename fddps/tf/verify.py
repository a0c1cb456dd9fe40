"""Measure before committing: time the finalists of :func:`fddps.tf.place` on the devices.

No cost model is exact on every machine, so ``place(..., verify=...)`` does not
trust its own prediction alone: it runs a few placed graphs -- the finalists:
the placement the algorithm chose, the best one-device graph, and the
runners-up the decision already had -- on the real devices, and returns the
fastest measured. The one-device graph is always a finalist, so what
``place()`` returns is never measured slower than it.

How the finalists are timed (:func:`verify_finalists`):

1. each finalist is prepared: its graph is built and run once (the first step
   partitions the graph, runs Grappler and allocates: not timed), then
   ``warmup`` more untimed steps. The chosen placement and the one-device
   graph always are; a runner-up only if the budget is not yet spent (on
   NASNet-A Large, building three finalists' sessions took 80-90 s);
2. rounds follow, in which every finalist still in the race runs one timed
   step, the order rotating from round to round (as
   ``experiments.real_cluster`` does), so that whatever the machine does
   meanwhile (other processes, clock changes) falls on all alike; timing
   them one after another measured identical graphs 1.0-1.4x apart on a
   2-core machine;
3. after at least ``min_rounds`` rounds (:data:`MIN_ROUNDS`):

   - a finalist whose fastest step is slower than the leader's slowest
     (the leader: the lowest median) is dropped from later rounds;
   - the rounds stop early when the leader is clearly best: its slowest
     timed step is faster than the median of every other finalist still
     in the race (or none is left);
   - they also stop when the seconds spent on verification (preparation
     included) reach the budget, or after ``max_rounds`` rounds;

4. the finalist with the lowest median step is returned (ties: the earlier
   finalist, the chosen placement first), provided that it is the one-device
   graph or beat it by a sign test (:func:`faster_by_sign_test`): faster in
   enough of the rounds both ran that a fair coin would do as well with
   probability at most :data:`SIGN_TEST_ALPHA` (all 5 of 5 rounds, 8 of 10,
   14 of 20). A lower median alone is not enough: identical graphs measured
   a few percent apart here, and a spread chosen on noise could be slower
   than the one device it replaced; the rounds do not stop early for a
   leader that has not passed the test. A finalist that fails to run is
   left out, its error recorded; if none runs, the predicted best is
   returned with the reason.

The timer is a parameter (``timer(label, run) -> seconds``; default
:func:`wall_time`, the wall seconds of ``run()``), so the choosing can be
tested with stub timings.

:func:`verify_graphs` times placed GraphDefs in ``tf.compat.v1.Session``s
(feeds from ``feed_dict`` or random tensors of each placeholder's shape and
dtype; variables initialised by ``init`` or the graph's initialisers);
:func:`measure_graphs` times them for a fixed number of interleaved rounds
(what ``experiments.real_cluster`` measures). Keras models and ``tf.function``
steps are timed through the placed step itself
(:func:`fddps.tf.functions.place_step`), which restores the step's variables
afterwards.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from ..errors import FddpsError
from .tfimport import _tf

#: Finalists timed with ``verify=True`` (and by default for Keras models and
#: ``tf.function`` steps): the chosen placement, the best one-device graph and
#: up to two runners-up.
DEFAULT_FINALISTS = 4
#: Seconds verification may take by default, preparing the finalists included;
#: :data:`MIN_ROUNDS` rounds are always run, so a slow step may take longer.
DEFAULT_BUDGET = 3.0
#: Untimed steps per finalist after its first step.
WARMUP = 1
#: Timed rounds always run (a median of at least this many steps per finalist).
MIN_ROUNDS = 5
#: Timed rounds at most.
MAX_ROUNDS = 20
#: Label of the one-device finalist.
ONE_DEVICE = "one device"
#: A finalist other than the one-device graph is returned only when a one-sided sign
#: test over the rounds both ran says it is faster at this significance
#: (:func:`faster_by_sign_test`).
SIGN_TEST_ALPHA = 0.1


def finalist_count(verify, default_on: bool) -> int:
    """How many finalists ``verify=`` asks for; 0 when verification is off.

    Parameters
    ----------
    verify : None, bool or int
        None: the default (``DEFAULT_FINALISTS`` when ``default_on``, else off);
        False or 0: off; True: :data:`DEFAULT_FINALISTS`; an int >= 2: at most
        that many finalists.
    default_on : bool
        Whether verification is on by default for this kind of input (Keras
        models and ``tf.function`` steps: yes; GraphDefs: no).

    Returns
    -------
    int

    Raises
    ------
    FddpsError
        For any other value of ``verify`` (named).
    """
    if verify is None:
        return DEFAULT_FINALISTS if default_on else 0
    if verify is True:
        return DEFAULT_FINALISTS
    if verify is False:
        return 0
    if isinstance(verify, (int, np.integer)):
        if verify == 0:
            return 0
        if verify >= 2:
            return int(verify)
    raise FddpsError(f"verify must be None (the default), True, False or the most finalists to "
                     f"time (an int >= 2: the chosen placement and the best one-device graph at "
                     f"least), got {verify!r}")


def check_budget(verify_budget) -> float:
    """``verify_budget=`` as seconds (:data:`DEFAULT_BUDGET` for None).

    Raises
    ------
    FddpsError
        If it is not a positive finite number (named).
    """
    if verify_budget is None:
        return DEFAULT_BUDGET
    ok = isinstance(verify_budget, (int, float, np.integer, np.floating)) and not isinstance(
        verify_budget, bool)
    if not ok or not math.isfinite(float(verify_budget)) or verify_budget <= 0:
        raise FddpsError(f"verify_budget must be a positive number of seconds, got "
                         f"{verify_budget!r}")
    return float(verify_budget)


def check_timer(verify_timer):
    """``verify_timer=`` (None: :func:`wall_time`); raises :class:`FddpsError` if not callable."""
    if verify_timer is None:
        return wall_time
    if not callable(verify_timer):
        raise FddpsError(f"verify_timer must be a callable (label, run) -> seconds, got "
                         f"{type(verify_timer).__name__}")
    return verify_timer


def wall_time(label, run) -> float:
    """Wall seconds of ``run()`` (``label``, the finalist's, is not used)."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def distinct_finalists(candidates, limit):
    """The first ``limit`` candidates whose placed graphs differ, the one-device one kept.

    Parameters
    ----------
    candidates : list of (str, Placement)
        Label and placement, in order of preference: the chosen placement
        first. Two placements whose GraphDefs serialize alike are one
        finalist (the earlier label kept).
    limit : int
        At most this many; the one labelled :data:`ONE_DEVICE` is always
        among them (it takes the last place when it would be cut).

    Returns
    -------
    list of (str, Placement)
    """
    seen, out, labels = {}, [], set()
    for label, p in candidates:
        key = p.graph_def.SerializeToString(deterministic=True)
        if key in seen:
            if label == ONE_DEVICE:  # the chosen placement is the one-device graph
                k = seen[key]
                labels.discard(out[k][0])
                out[k] = (ONE_DEVICE, out[k][1])
                labels.add(ONE_DEVICE)
            continue
        seen[key] = len(out)
        unique, n = label, 2
        while unique in labels:  # labels name finalists: never two alike
            unique, n = f"{label} ({n})", n + 1
        labels.add(unique)
        out.append((unique, p))
    if len(out) > limit:
        one = next((c for c in out if c[0] == ONE_DEVICE), None)
        cut = out[:limit]
        if one is not None and one not in cut:
            cut[-1] = one
        out = cut
    return out


def sign_test(times, baseline) -> tuple:
    """One-sided sign test that ``times`` are faster than ``baseline``, round by round.

    Parameters
    ----------
    times, baseline : sequence of float
        Step seconds of two runs, the i-th of each timed in the same round
        (the longer one's extra rounds are not paired and not counted).

    Returns
    -------
    (int, int, float)
        Rounds ``times`` was faster, rounds that were not ties, and the
        probability that a fair coin wins at least as many of them (1.0 when
        every round is a tie).

    Examples
    --------
    >>> sign_test([1.0] * 5, [1.1] * 5)
    (5, 5, 0.03125)
    >>> sign_test([1.0, 1.0, 1.2, 1.0, 1.0], [1.1] * 5)[2]
    0.1875
    """
    pairs = [(a, b) for a, b in zip(times, baseline) if a != b]
    wins, n = sum(a < b for a, b in pairs), len(pairs)
    p = sum(math.comb(n, j) for j in range(wins, n + 1)) / 2 ** n if n else 1.0
    return wins, n, p


def faster_by_sign_test(times, baseline, alpha=SIGN_TEST_ALPHA) -> bool:
    """Whether ``times`` beat ``baseline`` in enough paired rounds (:func:`sign_test`'s
    probability at most ``alpha``).

    Examples
    --------
    >>> faster_by_sign_test([1.0] * 5, [1.1] * 5)
    True
    >>> faster_by_sign_test([1.0, 1.0, 1.2, 1.0, 1.0], [1.1] * 5)
    False
    """
    return sign_test(times, baseline)[2] <= alpha


def not_verified(finalists, reason, returned=0, budget=float("nan")) -> dict:
    """The record of a verification that did not run (``reason`` says why)."""
    rows = [dict(label=label, predicted=float(predicted), measured=float("nan"),
                 min=float("nan"), max=float("nan"), steps=0, first_step=float("nan"),
                 error="", returned=k == returned, skipped=False)
            for k, (label, predicted) in enumerate(finalists)]
    return dict(finalists=rows, returned=finalists[returned][0] if finalists else "",
                returned_index=returned, predicted_best=finalists[0][0] if finalists else "",
                rounds=0, seconds=0.0, budget=budget, stopped="", reason=reason, not_proven="")


def interleave(runs, labels, *, min_rounds=MIN_ROUNDS, max_rounds=MAX_ROUNDS, budget=None,
               start=None, early_stop=True, baseline=None, timer=wall_time,
               clock=time.perf_counter):
    """Timed steps of several runs, interleaved: one step of each per round, the order rotating.

    Parameters
    ----------
    runs : list of callable
        Each runs one step (no arguments); None for a run left out.
    labels : list of str
        Passed to ``timer`` with each run.
    min_rounds, max_rounds : int
        Rounds always run, and at most.
    budget : float, optional
        Stop after the round in which ``clock() - start`` reaches it (never
        before ``min_rounds``).
    start : float, optional
        When the budget started (default: now).
    early_stop : bool
        Drop clearly slower runs and stop when one is clearly best (see the
        module notes); False runs every run ``max_rounds`` times (budget permitting).
    baseline : int, optional
        The run a leader other than it must beat by :func:`faster_by_sign_test`
        before the rounds stop early (the one-device graph).
    timer : callable
        ``timer(label, run) -> seconds`` of one step.
    clock : callable
        Seconds now, for the budget.

    Returns
    -------
    dict
        ``times`` (per run, its timed seconds), ``rounds``, ``stopped``
        ("clearly best", "budget", "max rounds") and ``dropped`` (indices).
    """
    start = clock() if start is None else start
    times = [[] for _ in runs]
    active = [k for k, r in enumerate(runs) if r is not None]
    dropped, stopped, rounds = [], "max rounds", 0
    for r in range(max_rounds):
        order = active[r % len(active):] + active[:r % len(active)] if active else []
        for k in order:
            t = float(timer(labels[k], runs[k]))
            if math.isfinite(t):
                times[k].append(t)
            else:  # the run failed (its error is the caller's to record): out of the race
                active.remove(k)
        rounds = r + 1
        if not active:
            break
        if rounds < min_rounds:
            continue
        if early_stop and len(active) > 1:
            # The leader: the lowest median. Clearly slower: every step of it slower than
            # every step of the leader. Clearly best: the leader's slowest step beats the
            # median of every other run still in the race.
            medians = {k: statistics.median(times[k]) for k in active}
            leader = min(active, key=lambda k: (medians[k], k))
            worst = max(times[leader])
            slower = [k for k in active if k != leader and min(times[k]) > worst]
            dropped += slower
            active = [k for k in active if k not in slower]
            proven = (baseline is None or leader == baseline or not times[baseline]
                      or faster_by_sign_test(times[leader], times[baseline]))
            if proven and all(worst < medians[k] for k in active if k != leader):
                stopped = "clearly best"
                break
        elif early_stop:
            stopped = "clearly best"
            break
        if budget is not None and clock() - start >= budget:
            stopped = "budget"
            break
    return dict(times=times, rounds=rounds, stopped=stopped, dropped=dropped)


def verify_finalists(finalists, prepare, *, budget=DEFAULT_BUDGET, timer=wall_time,
                     warmup=WARMUP, min_rounds=MIN_ROUNDS, max_rounds=MAX_ROUNDS,
                     clock=time.perf_counter):
    """Time the finalists and choose the fastest measured; the verification record.

    Parameters
    ----------
    finalists : list of (str, float)
        Each finalist's label and predicted step seconds; the first is the
        predicted best (what ``place()`` returns unverified).
    prepare : callable
        ``prepare(k) -> run``: builds finalist ``k`` and runs its first step;
        ``run()`` runs one more step. An exception it raises (or ``run``
        raises) leaves that finalist out, its error recorded.
    budget : float
        Seconds verification may take, preparation included (see the module notes).
    timer : callable
        ``timer(label, run) -> seconds`` of one timed step (default :func:`wall_time`).
    warmup : int
        Untimed steps after each finalist's first.
    min_rounds, max_rounds : int
        See :func:`interleave`.
    clock : callable
        Seconds now, for the budget and ``first_step``.

    Returns
    -------
    dict
        ``finalists``: per finalist ``label``, ``predicted``, ``measured``
        (median timed step), ``min``, ``max``, ``steps`` (timed), ``first_step``
        (seconds to build and run the first step), ``error`` ("" when it ran),
        ``skipped`` (a runner-up not built: the budget was spent before its
        turn) and ``returned``; ``returned`` (label) and ``returned_index``;
        ``predicted_best`` (label); ``rounds``; ``seconds`` (all of it);
        ``budget``; ``stopped`` (why the rounds ended); ``reason`` ("" when
        verified, else why the predicted best is returned unmeasured);
        ``not_proven`` ("" unless the finalist with the lowest median was not
        returned because it failed the sign test against the one-device graph:
        then how many rounds it won).
    """
    start = clock()
    labels = [label for label, _ in finalists]
    one = labels.index(ONE_DEVICE) if ONE_DEVICE in labels else None
    runs, first, errors, skipped = [], [], [], set()
    for k in range(len(finalists)):
        if k not in (0, one) and clock() - start >= budget:
            # The chosen placement and the one-device graph are always timed; a runner-up
            # only while the budget lasts (a large graph's session takes seconds to build).
            runs.append(None)
            errors.append("")
            first.append(float("nan"))
            skipped.add(k)
            continue
        t0 = clock()
        try:
            run = prepare(k)
            for _ in range(warmup):
                run()
        except Exception as err:  # noqa: BLE001 - a finalist that fails to run is left out
            runs.append(None)
            errors.append(_describe(err))
            first.append(float("nan"))
            continue
        runs.append(run)
        errors.append("")
        first.append(clock() - t0)
    if all(r is None for r in runs):
        record = not_verified(finalists, f"no finalist could run: {labels[0]}: {errors[0]}",
                              budget=budget)
        for row, e in zip(record["finalists"], errors):
            row["error"] = e
        record["seconds"] = clock() - start
        return record
    failed = []

    def guarded(label, run):
        k = labels.index(label)
        if runs[k] is None:
            return float("nan")
        try:
            return timer(label, run)
        except Exception as err:  # noqa: BLE001 - the step failed while timed: leave it out
            errors[k] = _describe(err)
            runs[k] = None
            failed.append(k)
            return float("nan")

    got = interleave(runs, labels, min_rounds=min_rounds, max_rounds=max_rounds, budget=budget,
                     start=start, baseline=one, timer=guarded, clock=clock)
    rows = []
    for k, (label, predicted) in enumerate(finalists):
        t = [x for x in got["times"][k] if math.isfinite(x)] if runs[k] is not None else []
        rows.append(dict(label=label, predicted=float(predicted),
                         measured=statistics.median(t) if t else float("nan"),
                         min=min(t) if t else float("nan"), max=max(t) if t else float("nan"),
                         steps=len(t), first_step=first[k], error=errors[k], returned=False,
                         skipped=k in skipped))
    ran = [k for k, row in enumerate(rows) if row["steps"] > 0 and not row["error"]]
    if not ran:
        record = not_verified(finalists, f"no finalist could run: {labels[0]}: {errors[0]}",
                              budget=budget)
        record["finalists"] = rows
        rows[0]["returned"] = True
        record["seconds"] = clock() - start
        return record
    fastest = min(ran, key=lambda k: (rows[k]["measured"], k))
    best, refused = fastest, ""
    if one in ran:  # a spread must beat the one-device graph round by round, not by median alone
        proven = [k for k in ran if k == one or faster_by_sign_test(got["times"][k],
                                                                     got["times"][one])]
        best = min(proven, key=lambda k: (rows[k]["measured"], k))
        if best != fastest:
            wins, n, p = sign_test(got["times"][fastest], got["times"][one])
            refused = (f"{labels[fastest]} had the lowest median but was faster than "
                       f"{labels[one]} in {wins} of {n} rounds (sign test p = {p:.2g} > "
                       f"{SIGN_TEST_ALPHA:g})")
    rows[best]["returned"] = True
    return dict(finalists=rows, returned=labels[best], returned_index=best,
                predicted_best=labels[0], rounds=got["rounds"], seconds=clock() - start,
                budget=budget, stopped=got["stopped"], reason="", not_proven=refused)


def adopt(chosen, decided, record, seconds):
    """``chosen`` (the finalist measured fastest) as ``place()``'s answer: ``decided``'s stages
    and decision facts, the verification ``record`` and its ``seconds`` in its ``info``.

    The four stages add up to the call: read, decide, write (all finalists),
    verify. Returns ``chosen``.
    """
    info = decided.info
    chosen.info.update({key: info[key] for key in ("read_seconds", "decide_seconds",
                                                   "write_seconds") if key in info})
    chosen.info.update(verified=record, verify_seconds=seconds,
                       place_seconds=info["place_seconds"] + seconds)
    if chosen is not decided:  # what the decision was, whichever finalist is returned
        chosen.info["algorithm"] = info.get("algorithm", chosen.info.get("algorithm"))
        for key in ("search_info", "search_seconds", "tofu_plan"):
            if key in info:
                chosen.info.setdefault(key, info[key])
        if "search" in info:
            chosen.info["search"] = record["returned"]
    return chosen


def _describe(err) -> str:
    """One line for an error a finalist raised: its type and first line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def describe(record, scale=1e3, unit="ms") -> list:
    """Lines of :meth:`Placement.summary` for a verification record (``info["verified"]``)."""
    rows = record["finalists"]
    if record.get("reason"):
        head = f"not verified on the devices: {record['reason']}"
        if len(rows) > 1:
            head += f"; returned the predicted best ({record['returned']})"
        lines = [head]
        if not any(r["error"] for r in rows):
            return lines
    else:
        lines = [f"verified on the devices: {len(rows)} finalists timed, {record['rounds']} "
                 f"interleaved rounds, {record['seconds']:.3g} s (budget {record['budget']:.3g} s; "
                 f"stopped: {record['stopped']}); returned {record['returned']}"
                 + ("" if record["returned"] == record["predicted_best"] else
                    f" (the predicted best was {record['predicted_best']})")]
        if record.get("not_proven"):
            lines.append(f"  not returned: {record['not_proven']}")
    width = max(len(r["label"]) for r in rows)
    lines.append(f"  {'finalist':<{width}} {'predicted ' + unit:>13} {'measured ' + unit:>12} "
                 f"{'steps':>5}")
    for r in rows:
        measured = (f"{r['measured'] * scale:>12.4g}" if math.isfinite(r["measured"])
                    else f"{'-':>12}")
        note = "  <- returned" if r["returned"] else ""
        if r["error"]:
            note += f"  (could not run: {r['error']})"
        elif r.get("skipped"):
            note += "  (not timed: the budget was spent building the others)"
        lines.append(f"  {r['label']:<{width}} {r['predicted'] * scale:>13.4g} {measured} "
                     f"{r['steps']:>5}{note}")
    return lines


# -- placed GraphDefs ---------------------------------------------------------------------------
def _step_closure(graph_def, fetches):
    """Names of the nodes ``fetches`` need (inputs and control inputs, transitively)."""
    inputs = {n.name: [s.lstrip("^").split(":")[0] for s in n.input] for n in graph_def.node}
    todo = [f.lstrip("^").split(":")[0] for f in fetches]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in inputs:
            continue
        seen.add(name)
        todo.extend(inputs[name])
    return seen


def _tensor_name(name) -> str:
    name = getattr(name, "name", name)
    if not isinstance(name, str):
        raise FddpsError(f"feed_dict keys must be tensor or placeholder names, got "
                         f"{type(name).__name__}")
    return name if ":" in name else name + ":0"


PLACEHOLDER_OPS = ("Placeholder", "PlaceholderV2")


def graph_feeds(analysis, fetches, feed_dict=None, seed=0):
    """Feeds for one step of a graph: the user's, else random tensors per placeholder.

    Parameters
    ----------
    analysis : GraphAnalysis
        The analysed input graph (:func:`fddps.tf.graphdef.analyse`).
    fetches : list of str
        What the step runs; only the placeholders they need are fed.
    feed_dict : mapping, optional
        Tensor (or placeholder) name -> value; these placeholders are fed these.
    seed : int
        Seed of the random feeds: floats standard normal, integers and
        booleans zero (a valid class index, say), so every finalist gets the
        same inputs.

    Returns
    -------
    (dict, str)
        Tensor name -> array, and "" -- or None and why the graph cannot be
        fed (the placeholder named, with its shape or dtype).
    """
    tf = _tf()
    given = {_tensor_name(k): v for k, v in (feed_dict or {}).items()}
    needed = _step_closure(analysis.graph_def, fetches)
    rng = np.random.default_rng(seed)
    feeds = dict(given)
    for node in analysis.graph_def.node:
        if node.op not in PLACEHOLDER_OPS or node.name not in needed or node.name + ":0" in given:
            continue
        t = analysis.graph.get_tensor_by_name(node.name + ":0")
        dtype = t.dtype.base_dtype
        if not t.shape.is_fully_defined():
            return None, (f"placeholder {node.name!r} has shape {t.shape} (not fully known): "
                          "pass feed_dict={...} with its value")
        shape = t.shape.as_list()
        if dtype.is_floating:
            feeds[node.name + ":0"] = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
        elif dtype.is_integer or dtype.is_bool:
            feeds[node.name + ":0"] = np.zeros(shape, dtype.as_numpy_dtype)
        else:
            return None, (f"placeholder {node.name!r} is a {dtype.name} tensor, which random "
                          "feeds cannot make: pass feed_dict={...} with its value")
    del tf
    return feeds, ""


VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")


def graph_init(analysis, fetches, init=None):
    """The op names that initialise the step's variables.

    ``init`` (an op name or list of them) when given; else the graph's
    initialiser: a ``NoOp`` named ``init`` (what
    ``tf.compat.v1.global_variables_initializer()`` makes), else each
    variable's ``<variable>/Assign`` (its initializer, as TF1 names it).

    Returns
    -------
    (list of str, str)
        The op names (empty when the step reads no variable) and "" -- or
        None and why none was found (the variable named).
    """
    names = {n.name: n for n in analysis.graph_def.node}
    if init is not None:
        ops = [init] if isinstance(init, str) else list(init)
        missing = [o for o in ops if o.split(":")[0].lstrip("^") not in names]
        if missing:
            return None, f"init op {missing[0]!r} is not in the graph"
        return [o.split(":")[0].lstrip("^") for o in ops], ""
    needed = _step_closure(analysis.graph_def, fetches)
    variables = [n.name for n in analysis.graph_def.node
                 if n.op in VARIABLE_OPS and n.name in needed]
    if not variables:
        return [], ""
    node = names.get("init")
    if node is not None and node.op == "NoOp":
        return ["init"], ""
    assigns = []
    for v in variables:
        a = names.get(f"{v}/Assign")
        if a is None or a.op not in ("Assign", "AssignVariableOp"):
            return None, (f"no initialiser found for variable {v!r} (no op 'init', no "
                          f"'{v}/Assign'): pass init='<init op>'")
        assigns.append(a.name)
    return assigns, ""


def local_session_config(devices):
    """A ``ConfigProto`` with as many CPU devices as the local ``/device:CPU:k`` names need."""
    tf = _tf()
    from .devices import parse_device

    cpus = 1
    for name in devices:
        spec = parse_device(name, "device")
        if spec.job in (None, "localhost") and (spec.device_type or "").upper() == "CPU":
            cpus = max(cpus, int(spec.device_index or 0) + 1)
    return tf.compat.v1.ConfigProto(device_count={"CPU": cpus})


class GraphSessions:
    """One ``tf.compat.v1.Session`` per placed GraphDef, for timing their steps.

    Each session imports its graph, runs ``init``, then the step (``fetches``
    with ``feeds``). Sessions are isolated (``isolate_session_state``), so on
    servers each has its own variables, and the input graph and any other
    session are untouched. Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, graph_defs, fetches, *, feeds=None, init=(), target="", config=None):
        self.graph_defs = list(graph_defs)
        self.fetches = list(fetches)
        self.feeds = dict(feeds or {})
        self.init = list(init or [])
        self.target = target or ""
        tf = _tf()
        self.config = tf.compat.v1.ConfigProto()
        if config is not None:
            self.config.CopyFrom(config)
        self.config.isolate_session_state = True
        self.sessions = [None] * len(self.graph_defs)
        self.last = [None] * len(self.graph_defs)

    def open(self, k, metadata=None):
        """Build session ``k``, initialise it and run its first step; its step runner.

        ``metadata``: a ``RunMetadata`` to fill with the first step's partition graphs.
        """
        tf = _tf()
        tf1 = tf.compat.v1
        g = tf.Graph()
        with g.as_default():
            tf.graph_util.import_graph_def(self.graph_defs[k], name="")
        sess = tf1.Session(self.target, graph=g, config=self.config)
        self.sessions[k] = sess
        if self.init:
            sess.run(self.init)
        options = (tf1.RunOptions(output_partition_graphs=True) if metadata is not None else None)
        self.last[k] = sess.run(self.fetches, feed_dict=self.feeds or None, options=options,
                                run_metadata=metadata)

        def run():
            self.last[k] = sess.run(self.fetches, feed_dict=self.feeds or None)

        return run

    def close(self):
        for sess in self.sessions:
            if sess is not None:
                sess.close()
        self.sessions = [None] * len(self.graph_defs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def verify_graphs(analysis, finalists, fetches, *, feed_dict=None, init=None, target="",
                  session_config=None, devices=(), budget=DEFAULT_BUDGET, timer=wall_time):
    """Time placed GraphDefs of one step on the devices; the verification record.

    Parameters
    ----------
    analysis : GraphAnalysis
        The analysed input graph (for its placeholders' shapes and its initialisers).
    finalists : list of (str, Placement)
        Label and placement; the first is the predicted best.
    fetches : list of str or None
        What one step runs (``place(fetches=...)``); without them the graph is
        not run (what a step is would be a guess).
    feed_dict, init : optional
        See :func:`graph_feeds` and :func:`graph_init`.
    target : str
        The session target (``""``: this process; ``"grpc://host:port"`` a
        server of the cluster whose devices were given).
    session_config : ConfigProto, optional
        Default: as many local CPU devices as ``devices`` name.
    devices : list of str
        The device names placed on (for the default session config).
    budget, timer
        See :func:`verify_finalists`.

    Returns
    -------
    dict
        :func:`verify_finalists`'s record; with ``reason`` set (and the
        predicted best returned) when the graph cannot be run: no fetches, a
        placeholder that cannot be fed, no initialiser found, or every
        finalist failing.
    """
    # What each placed graph's step is predicted to take as TensorFlow runs it (its own
    # order, or the enforced one): what the timing measures.
    predicted = [(label, p.executor_makespan) for label, p in finalists]
    if len(finalists) < 2:
        return not_verified(predicted, "one distinct finalist: nothing to choose between",
                            budget=budget)
    if not fetches:
        return not_verified(predicted, "no fetches given: what one step runs is unknown "
                            "(pass fetches=[...])", budget=budget)
    feeds, why = graph_feeds(analysis, fetches, feed_dict)
    if feeds is None:
        return not_verified(predicted, why, budget=budget)
    init_ops, why = graph_init(analysis, fetches, init)
    if init_ops is None:
        return not_verified(predicted, why, budget=budget)
    if session_config is None and not target:
        session_config = local_session_config(devices)
    with GraphSessions([p.graph_def for _, p in finalists], fetches, feeds=feeds, init=init_ops,
                       target=target, config=session_config) as sessions:
        return verify_finalists(predicted, sessions.open, budget=budget, timer=timer)


def measure_graphs(graph_defs, fetches, init, target="", *, steps=10, warmup=3, config=None,
                   feed_dict=None, trace=False, timer=wall_time):
    """Run several placed GraphDefs of one step on ``target``, their steps interleaved.

    Each graph gets its own (isolated) session: ``init``, a first step
    (graph partitioning, Grappler), ``warmup - 1`` more; then ``steps``
    rounds in which every graph runs one timed step, the order rotating from
    round to round (:func:`interleave` without early stopping).

    Parameters
    ----------
    graph_defs : list of GraphDef
    fetches : list of str
    init : str or list of str
        Op names run once per session before the first step.
    target : str
        Session target.
    steps, warmup : int
        Timed rounds; untimed steps per graph, the first included.
    config : ConfigProto, optional
    feed_dict : mapping, optional
        Tensor name -> value, fed to every step.
    trace : bool
        Each graph then runs one more step, traced, and its dict gets
        ``busy``: what each device spent on ops and on transfers in it
        (:func:`fddps.tf.profiling.device_busy`).
    timer : callable
        ``timer(label, run) -> seconds`` (labels are ``"0"``, ``"1"``, ...).

    Returns
    -------
    list of dict
        Per graph: ``median``, ``min``, ``max`` step seconds, ``first_step``
        seconds, ``last`` (the fetched values of its last step),
        ``devices_ran`` (devices in the executed partition graphs).
    """
    tf = _tf()
    tf1 = tf.compat.v1
    out, runs = [], []
    with GraphSessions(graph_defs, fetches, feeds=feed_dict, init=[init] if isinstance(
            init, str) else init, target=target, config=config) as sessions:
        for k in range(len(graph_defs)):
            meta = tf1.RunMetadata()
            t0 = time.perf_counter()
            run = sessions.open(k, metadata=meta)
            first = time.perf_counter() - t0
            devices = {n.device for part in meta.partition_graphs for n in part.node if n.device}
            for _ in range(max(0, warmup - 1)):
                run()
            runs.append(run)
            out.append(dict(first_step=first, devices_ran=len(devices)))
        got = interleave(runs, [str(k) for k in range(len(runs))], min_rounds=steps,
                         max_rounds=steps, early_stop=False, timer=timer)
        if trace:
            from .profiling import device_busy

            for sess, o in zip(sessions.sessions, out):
                meta = tf1.RunMetadata()
                sess.run(fetches, feed_dict=sessions.feeds or None,
                         options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                         run_metadata=meta)
                o["busy"] = device_busy(meta)
        for o, times, last in zip(out, got["times"], sessions.last):
            o.update(median=statistics.median(times), min=min(times), max=max(times), last=last)
    return out
