"""What every strategy search shares: :class:`StrategySearch`, :class:`SearchResult`, the registry.

A search is configured in ``__init__`` (unknown options are an error naming
them) and run by :meth:`StrategySearch.fit` on a step, a cluster and a cost
model; it returns the best strategy it found with its simulated step.
Searches sit above the strategy layer (:mod:`fddps.strategy`), which does
not import them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import FddpsError, UnknownAlgorithmError

_SEARCHES: dict[str, type] = {}


class SearchError(FddpsError, ValueError):
    """A search's bad option, or a graph a search cannot handle (names what)."""


def register_search(cls):
    """Class decorator: make a :class:`StrategySearch` available under ``cls.name``."""
    _SEARCHES[cls.name] = cls
    return cls


def available_searches() -> list:
    return sorted(_SEARCHES)


def get_search(name: str, **options) -> "StrategySearch":
    """A configured search registered as ``name`` (``"flexflow"``, ``"pase"``, ``"auto"``).

    Raises
    ------
    UnknownAlgorithmError
        For an unknown name (the message lists the known ones).
    SearchError
        For an unknown or bad option (named).
    """
    if name not in _SEARCHES:
        raise UnknownAlgorithmError(f"unknown strategy search {name!r}; known: "
                                    f"{', '.join(available_searches())}")
    return _SEARCHES[name](**options)


def positive(name: str, value, *, integer=False, allow_none=True):
    """``value`` checked to be a positive (finite) number; else SearchError naming ``name``."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or value <= 0 or (integer and int(value) != value):
        kind = "a positive integer" if integer else "a positive number"
        raise SearchError(f"option {name!r} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


@dataclass
class SearchResult:
    """The best strategy a search found.

    Attributes
    ----------
    strategy : Strategy
    makespan : float
        Its simulated step, seconds.
    peak : numpy.ndarray
        Peak bytes per device.
    fits : bool
        Whether it fits in every device's memory.
    search : str
        The search that found it (for ``auto``: the one that won).
    seconds : float
        Wall-clock seconds of the search.
    info : dict
        Search-specific facts (proposals, accepted, the DP's additive cost,
        the delta and full seconds per proposal, the baselines' steps...).
    candidates : dict
        ``auto`` only: every candidate's strategy by name (as ``info["steps"]``),
        so that a caller can re-time them another way.
    """

    strategy: object
    makespan: float
    peak: np.ndarray
    fits: bool
    search: str
    seconds: float
    info: dict = field(default_factory=dict)
    candidates: dict = field(default_factory=dict)


class StrategySearch:
    """Base class: subclasses set ``name`` and ``options`` (option -> default) and
    implement :meth:`fit`."""

    name = ""
    options: dict = {}

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SearchError(f"strategy search {self.name!r} has no option {unknown[0]!r}; its "
                              f"options are {', '.join(sorted(self.options))}")
        for key, default in self.options.items():
            setattr(self, key, options.get(key, default))

    def __repr__(self):
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.options)
        return f"{type(self).__name__}({args})"

    def fit(self, step, cluster, cost_model) -> SearchResult:  # pragma: no cover - interface
        raise NotImplementedError
