""":func:`fddps.tf.place` with a strategy search (``algorithm="auto"``, ``"flexflow"``, ``"pase"``).

The search (:mod:`fddps.search`) runs on the step's ops as the strategy layer
reads them (:func:`~fddps.tf.strategy_graph.step_graph`), proposing only
configurations the GraphDef rewrite writes; its strategy is then written and
predicted as ``place(strategy=...)`` does
(:func:`~fddps.tf.strategy_rewrite.place_strategy`).
"""

from __future__ import annotations

import time


def place_searched(graph_def, devices, algorithm, cost_model, memory=None, *, fetches=None,
                   unknown_dim=1, **options):
    """Search a strategy with ``algorithm`` and place it; the :class:`~fddps.tf.place.Placement`.

    ``info`` gains ``search`` (the search that found the strategy; for
    ``auto`` the winner), ``search_info`` and ``search_seconds``.

    Raises
    ------
    SearchError
        For an unknown or bad option of the search (named).
    """
    from ..search import get_search
    from .devices import make_cluster
    from .graphdef import analyse
    from .strategy_graph import step_graph
    from .strategy_rewrite import place_strategy

    t0 = time.perf_counter()
    search = get_search(algorithm, writable=True, **options)
    analysis = analyse(graph_def, unknown_dim)
    cluster = make_cluster(devices, cost_model, memory)
    step = step_graph(analysis, fetches)
    result = search.fit(step, cluster, cost_model)
    placement = place_strategy(analysis, list(cluster.names), result.strategy, cost_model, memory,
                               fetches=fetches, unknown_dim=unknown_dim)
    placement.info.update(algorithm=algorithm, search=result.search, search_info=result.info,
                          search_seconds=result.seconds,
                          place_seconds=time.perf_counter() - t0)
    return placement
