"""Parallelization strategies beyond whole-op placement (TensorFlow-free).

- :mod:`.ops`: op descriptions by iteration domain (:data:`~.ops.OP_DESCRIPTIONS`);
- :mod:`.graph`: the step's ops as the strategy layer sees them;
- :mod:`.strategy`: :class:`~.strategy.Strategy`, validation, data parallelism,
  parameter splits, attribute (spatial) splits, whole-op placement;
- :mod:`.expand`: a strategy's task graph for the simulator;
- :mod:`.fddps_splits`: FD-DPS's own intra-op splits of an op graph (split
  rules derived from :mod:`.ops`, candidates, decisions, the op-graph rewrite);
  its split step, which calls a scheduler, is :mod:`fddps.algorithms.split_step`.

The TensorFlow side: :func:`fddps.tf.strategy_graph.step_graph` reads a
GraphDef, :func:`fddps.tf.strategy_rewrite.rewrite_strategy` writes one.
"""

from .expand import Expansion, expand, simulate_strategy
from .graph import OpInfo, StepGraph
from .ops import OP_DESCRIPTIONS, NotDescribed, OpDescription, coverage, description_table, resolve
from .strategy import (OpConfig, Strategy, StrategyError, attribute_split, combine, data_parallel,
                       mixed, parameter_split, parts, shard_variables, validate, whole_placement)

__all__ = ["Expansion", "expand", "simulate_strategy", "OpInfo", "StepGraph", "OP_DESCRIPTIONS",
           "NotDescribed", "OpDescription", "coverage", "description_table", "resolve",
           "OpConfig", "Strategy", "StrategyError", "attribute_split", "combine", "data_parallel",
           "mixed", "parameter_split", "parts", "shard_variables", "validate", "whole_placement"]
