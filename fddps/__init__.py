"""fddps: place the ops of a training graph on devices, and order them, so a step ends soonest.

The layers, bottom up:

- :class:`OpGraph`, :class:`Cluster`: the problem (``fddps.graph``, ``fddps.cluster``).
- :func:`schedule` and the algorithms in ``fddps.algorithms`` (FD-DPS and baselines).
- :class:`Schedule`: the answer, checked by :meth:`Schedule.validate`.
- :func:`simulate`: replay a placement and predict the step's timeline.
- ``fddps.tf``: the TensorFlow adapter (the only module that imports TensorFlow).
"""

from .algorithms import available_algorithms, get_algorithm
from .bounds import lower_bound
from .cluster import Cluster, Device
from .errors import (ClusterError, FddpsError, GraphError, InfeasibleError, InvalidScheduleError,
                     UnknownAlgorithmError)
from .graph import OpGraph
from .schedule import Schedule
from .simulate import Timeline, simulate
from .stg import read_stg

__version__ = "0.1.0"


def schedule(graph, cluster, algorithm: str = "fddps", **options) -> Schedule:
    """Place and order ``graph`` on ``cluster`` with the named algorithm.

    Parameters
    ----------
    graph : OpGraph or networkx.DiGraph
        A networkx graph is read with :meth:`OpGraph.from_networkx`.
    cluster : Cluster
    algorithm : str
        One of :func:`available_algorithms` (default ``"fddps"``).
    **options
        Passed to the algorithm's constructor.

    Returns
    -------
    Schedule

    Raises
    ------
    UnknownAlgorithmError
        For an unknown algorithm name (the message lists the known ones).
    InfeasibleError
        If the graph cannot fit in the cluster.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0, 2.0, 2.0], [("a", "b"), ("a", "c")])
    >>> schedule(g, Cluster.homogeneous(2)).makespan
    3.0
    """
    if not isinstance(graph, OpGraph):
        graph = OpGraph.from_networkx(graph)
    return get_algorithm(algorithm, **options).schedule(graph, cluster)


def place(graph_def, devices, **kwargs):
    """Place a TensorFlow graph on devices; see :func:`fddps.tf.place`."""
    from .tf import place as _place

    return _place(graph_def, devices, **kwargs)


def data_parallel(graph_def, devices, fetches=None):
    """The data-parallel strategy of a TensorFlow graph, for ``place(..., strategy=...)``;
    see :func:`fddps.tf.strategy_rewrite.data_parallel`."""
    from .tf.strategy_rewrite import data_parallel as _data_parallel

    return _data_parallel(graph_def, devices, fetches)


__all__ = ["data_parallel", "OpGraph", "Cluster", "Device", "Schedule", "Timeline", "schedule", "simulate",
           "lower_bound", "read_stg", "place", "available_algorithms", "get_algorithm",
           "FddpsError", "GraphError", "ClusterError", "InfeasibleError", "InvalidScheduleError",
           "UnknownAlgorithmError"]
