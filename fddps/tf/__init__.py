"""The TensorFlow adapter: the only part of fddps that imports TensorFlow.

- :func:`op_table`: one row of facts per node of a GraphDef (shapes, bytes,
  FLOPs, variables, colocation, kernels), what cost models read.
- :func:`read_graph_def`: a GraphDef as an :class:`~fddps.graph.OpGraph` for a cluster.
- :func:`place`: place and order a training graph on TensorFlow devices; returns
  a :class:`Placement` holding the new GraphDef.
- :func:`local_cluster`: start ``tf.distribute.Server`` workers on this machine.
"""

from .graphdef import op_table

__all__ = ["op_table"]
