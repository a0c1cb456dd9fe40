"""Exceptions raised by the cost model.

All derive from :class:`fddps.errors.FddpsError` (and :class:`ValueError`), so
callers can catch fddps errors in one place.
"""

from fddps.errors import FddpsError


class CostModelError(FddpsError, ValueError):
    """The cost model cannot answer: an unknown device type or preset, a missing column."""


class ProfileError(CostModelError):
    """A saved cost model or profile file cannot be read: corrupt, truncated, wrong format.

    Attributes
    ----------
    path : str or None
        The file at fault.
    """

    def __init__(self, message, path=None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class ProfileMismatchError(ProfileError):
    """A profile was taken on a different graph than the one it is applied to."""
