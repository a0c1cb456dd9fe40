"""Exceptions raised by fddps.

Every error fddps raises on bad input derives from :class:`FddpsError`, and the
input errors are also :class:`ValueError`, so ``except ValueError`` keeps working
for callers that do not know fddps.
"""


class FddpsError(Exception):
    """Base class of every error fddps raises on purpose."""


class GraphError(FddpsError, ValueError):
    """The op graph is malformed: a cycle, a bad cost, an edge to an unknown op."""


class ClusterError(FddpsError, ValueError):
    """The cluster is malformed: no devices, a bad link, an unknown device."""


class UnknownAlgorithmError(FddpsError, ValueError):
    """No scheduling algorithm is registered under the requested name."""


class InfeasibleError(FddpsError):
    """The graph cannot be placed on the cluster (memory, or no device can run an op).

    Attributes
    ----------
    needed, available : float or None
        Bytes needed and bytes available, when the cause is memory.
    """

    def __init__(self, message, needed=None, available=None):
        super().__init__(message)
        self.needed = needed
        self.available = available


class InvalidScheduleError(FddpsError, AssertionError):
    """:meth:`fddps.Schedule.validate` found a broken constraint."""
