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
    device : str or None
        When schedules were made but none fits: the device of the smallest
        per-device peak any of them reached (the best attempt's most
        overflowing device); ``needed`` is then that peak and ``available``
        the device's capacity.
    attempts : list of (str, str, float, float)
        ``(memory reservation, device, peak bytes, capacity)`` of each
        schedule made, best first; empty when no schedule was reached.
    """

    def __init__(self, message, needed=None, available=None, device=None, attempts=()):
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.device = device
        self.attempts = list(attempts)


class InvalidScheduleError(FddpsError, AssertionError):
    """:meth:`fddps.Schedule.validate` found a broken constraint."""
