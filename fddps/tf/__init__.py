"""The TensorFlow adapter: the only part of fddps that imports TensorFlow.

- :func:`op_table`: one row of facts per node of a GraphDef (shapes, bytes,
  FLOPs, variables, colocation, kernels), what cost models read.
- :func:`read_graph_def`: a GraphDef as an :class:`~fddps.graph.OpGraph` for a cluster.
- :func:`place`: place and order a training graph on TensorFlow devices; returns
  a :class:`Placement` holding the new GraphDef.
- :func:`place_step`: the same for a Keras model or a ``tf.function`` step, which
  it runs placed on the step's own variables (:class:`StepPlacement`).
- :func:`local_cluster`: start ``tf.distribute.Server`` workers on this machine.
- :func:`as_float64`: a GraphDef computed in float64, to check that a placed or
  rewritten graph computes what the original does beyond float32's rounding.
"""

from .devices import DEFAULT_CPU_MEMORY, make_cluster, normalize_device, parse_device
from .float64 import as_float64
from .graphdef import load_graph, op_table
from .local_cluster import local_cluster
from .place import place
from .placement import Placement
from .read import read_graph_def
from .functions import StepPlacement, local_cpu_devices, place_step

__all__ = ["place", "Placement", "local_cluster", "read_graph_def", "op_table", "load_graph",
           "make_cluster", "parse_device", "normalize_device", "DEFAULT_CPU_MEMORY",
           "place_step", "StepPlacement", "local_cpu_devices", "as_float64"]
