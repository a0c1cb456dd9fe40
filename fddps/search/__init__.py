"""Strategy searches (TensorFlow-free), above the strategy layer (:mod:`fddps.strategy`).

- :mod:`.evaluate`: strategies scored by simulation, by delta (:class:`StrategyEvaluator`);
- :mod:`.space`: decision units, their configurations, the baseline strategies;
- :mod:`.flexflow`: FlexFlow's Metropolis-Hastings search (``"flexflow"``);
- :mod:`.pase`: the exact vertex-elimination DP for an additive cost (``"pase"``), on
  :mod:`.pase_vertices`' graph and configurations and :mod:`.pase_tables`' costs;
- :mod:`.fddps_space`: FD-DPS whose split step chooses among every configuration (``"fddps_space"``);
- :mod:`.auto`: the best of the baselines and both searches in a time budget (``"auto"``);
- :mod:`.tofu`: Tofu's recursive partitioning (EuroSys 2019, Section 5; ``"tofu"``).

:func:`get_search` builds one by name; :func:`search` runs one.
"""

from .base import (SearchError, SearchResult, StrategySearch, available_searches, get_search,
                   register_search)
from .evaluate import Score, StrategyEvaluator, penalised_cost
from .space import baseline_strategies, decision_units, unit_splits, whole_op_graph
from . import auto, fddps_space, flexflow, pase, tofu  # noqa: F401  (registration)


def search(step, cluster, cost_model, algorithm="auto", **options) -> SearchResult:
    """Run the strategy search ``algorithm`` on ``step``: its :class:`SearchResult`."""
    return get_search(algorithm, **options).fit(step, cluster, cost_model)


__all__ = ["SearchError", "SearchResult", "StrategySearch", "available_searches", "get_search",
           "register_search", "Score", "StrategyEvaluator", "penalised_cost", "baseline_strategies",
           "decision_units", "unit_splits", "whole_op_graph", "search"]
