"""The path of a graph through :func:`fddps.tf.place`: read once, decide, write.

:func:`place_graph` analyses the graph once (:func:`fddps.tf.graphdef.analyse`)
and hands that analysis to the one stage that decides and writes:

- ``strategy=...``: the user's strategy, rewritten (:func:`fddps.tf.strategy_rewrite.place_strategy`);
- ``algorithm="tofu"``: Tofu's recursive partition (:func:`fddps.tf.search_place.place_tofu`);
- a strategy search (``"auto"``, ``"flexflow"``, ``"pase"``, ``"fddps_space"``):
  :func:`fddps.tf.search_place.place_searched`;
- a scheduler (``"fddps"`` and the baselines): :func:`fddps.tf.schedule_place.place_scheduled`.

``info`` gains ``read_seconds`` (analysing the graph; for a scheduler, also
costing its ops into the op graph), ``decide_seconds``
(scheduling or searching), ``write_seconds`` (the rest: writing the placed
graph and predicting its step) and ``place_seconds`` (all of it).

With ``verify``, each path also writes its finalists (its runners-up, the
one-device graph), from what it decided, not from reading the graph again,
and :func:`fddps.tf.verify.verify_graphs` times them on the devices; the
fastest measured is returned (``info["verified"]``, ``verify_seconds``;
``place_seconds`` includes it).
"""

from __future__ import annotations

import contextlib
import gc
import time

from ..errors import FddpsError
from .graphdef import analyse
from .read import cpu_preset_facts, default_cost_model_or_error
from .schedule_place import place_scheduled
from .search_place import one_device_finalist, place_searched, place_tofu
from .strategy_rewrite import place_strategy
from .verify import (adopt, check_budget, check_timer, distinct_finalists, finalist_count,
                     verify_graphs)


@contextlib.contextmanager
def _cyclic_collection_paused():
    """Hold Python's cyclic garbage collector off inside the block (as it was after).

    Placing a graph allocates hundreds of thousands of objects (the imported
    ``tf.Operation``s, the op table, the schedulers' per-op tuples) that live
    for a stage or for the call. Each time enough of them outlive a young
    collection, Python's collector walks every tracked object of the process,
    TensorFlow's own included: on ResNet-200 (20,411 nodes) one or two such
    full walks per call, 1.1-1.8 s of a 5.6-7.2 s ``place()`` (loaded 2-core
    machine). Reference counting still frees everything acyclic at once; the
    few cycles made meanwhile wait for the next collection after the call.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def place_graph(graph_def, devices, cost_model=None, algorithm="fddps", memory=None, **kwargs):
    """:func:`fddps.tf.place` for a GraphDef, ``tf.Graph``, serialized bytes or path;
    the same parameters, returns and errors (see :func:`_place_graph`), with Python's
    cyclic collector held off during the call (:func:`_cyclic_collection_paused`)."""
    with _cyclic_collection_paused():
        return _place_graph(graph_def, devices, cost_model, algorithm, memory, **kwargs)


def _place_graph(graph_def, devices, cost_model=None, algorithm="fddps", memory=None, *,
                 override=False, fetches=None, enforce_order="auto", unknown_dim=1,
                 session_config=None, topology="auto", strategy=None, verify=None,
                 verify_budget=None, verify_timer=None, feed_dict=None, init=None, target="",
                 finalists=0, **options):
    """:func:`fddps.tf.place` for a GraphDef, ``tf.Graph``, serialized bytes or path;
    the same parameters, returns and errors.

    ``finalists`` (for :func:`fddps.tf.functions.place_step`, which times a
    step itself): write up to that many finalists into ``placement.finalists``
    without timing them; ``verify`` then must be off.

    Raises
    ------
    FddpsError
        For a bad ``enforce_order``, or ``enforce_order=True`` without
        ``fetches``; a bad ``verify``, ``verify_budget`` or ``verify_timer``.
    """
    from ..search import available_searches

    count = finalist_count(verify, default_on=False)
    budget, timer = check_budget(verify_budget), check_timer(verify_timer)
    if count and finalists:
        raise FddpsError("place_graph: give verify or finalists, not both")
    finalists = max(int(finalists), count)
    if enforce_order not in (True, False, "auto"):
        raise FddpsError(f"enforce_order must be True, False or 'auto', got {enforce_order!r}")
    if enforce_order is True and fetches is None:
        raise FddpsError("enforce_order=True needs fetches=[...] (the ops a training step runs): "
                         "order edges from ops outside the step would make every step re-run them")
    t0 = time.perf_counter()
    if strategy is None and algorithm not in available_searches() and algorithm != "tofu":
        from ..algorithms import get_algorithm

        scheduler = get_algorithm(algorithm, **options)  # a bad name fails before reading
    cost_model = default_cost_model_or_error(cost_model)
    analysis = analyse(graph_def, unknown_dim, fetches=fetches)  # the step's nodes, once
    read_seconds = time.perf_counter() - t0
    if strategy is not None:
        placement = place_strategy(analysis, devices, strategy, cost_model, memory,
                                   fetches=fetches, unknown_dim=unknown_dim)
        if finalists:
            placement.finalists = distinct_finalists(
                [(strategy.name or "strategy", placement)]
                + one_device_finalist(analysis, placement.cluster, cost_model, memory, fetches,
                                      unknown_dim, placement), finalists)
    elif algorithm == "tofu":
        placement = place_tofu(analysis, devices, cost_model, memory, fetches, unknown_dim,
                               options, finalists=finalists)
    elif algorithm in available_searches():
        default, call = None, None
        if algorithm == "auto":  # never predicted slower than the default's own placement
            from ..algorithms import get_algorithm

            default = place_scheduled(analysis, devices, get_algorithm("fddps"), cost_model,
                                      memory, override=override, fetches=fetches,
                                      enforce_order=enforce_order,
                                      session_config=session_config, topology=topology)
            # What place()'s default would have taken (reading and placing), for auto's
            # call budget: measured in this call, so it scales with the graph and the load.
            call = (t0, time.perf_counter() - t0)
        placement = place_searched(analysis, devices, algorithm, cost_model, memory,
                                   fetches=fetches, unknown_dim=unknown_dim, default=default,
                                   finalists=finalists, call=call,
                                   **options)
    else:
        placement = place_scheduled(analysis, devices, scheduler, cost_model, memory,
                                    override=override, fetches=fetches,
                                    enforce_order=enforce_order, session_config=session_config,
                                    topology=topology, finalists=finalists)
    info = placement.info
    info.update(cpu_preset_facts(cost_model, placement.cluster))
    total = time.perf_counter() - t0
    decide = float(info.get("decide_seconds", info.get("search_seconds", 0.0)))
    read_seconds += float(info.get("cost_seconds", 0.0))  # the op graph is what reading gives
    info.update(read_seconds=read_seconds, decide_seconds=decide,
                write_seconds=max(total - read_seconds - decide, 0.0), place_seconds=total)
    if count:
        placement = _verified(placement, analysis, fetches, feed_dict, init, target,
                              session_config, budget, timer)
    return placement


def _verified(placement, analysis, fetches, feed_dict, init, target, session_config, budget,
              timer):
    """The finalist of ``placement.finalists`` measured fastest, with ``info["verified"]``."""
    t0 = time.perf_counter()
    finalists = placement.finalists or [("chosen", placement)]
    record = verify_graphs(analysis, finalists, fetches, feed_dict=feed_dict, init=init,
                           target=target, session_config=session_config,
                           devices=list(placement.cluster.names), budget=budget, timer=timer)
    chosen = finalists[record["returned_index"]][1]
    for _, p in finalists:
        p.finalists = []
    seconds = time.perf_counter() - t0
    return adopt(chosen, placement, record, seconds)
