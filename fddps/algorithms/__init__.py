"""Scheduling algorithms, one module each, registered by name.

Importing this package registers the built-in algorithms; a new one is a module
with a :class:`~fddps.algorithms.base.Scheduler` subclass decorated with
:func:`~fddps.algorithms.base.register`, imported here.
"""

from .base import Scheduler, available_algorithms, get_algorithm, parse_algorithm, register
from . import etf, exact, fastt, fddps, heft, mpdps, single  # noqa: F401  (registration)

__all__ = ["Scheduler", "available_algorithms", "get_algorithm", "parse_algorithm", "register"]
