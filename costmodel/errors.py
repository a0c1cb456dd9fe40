"""Exceptions raised by the cost model.

All derive from :class:`fddps.errors.FddpsError` (and :class:`ValueError`), so
callers can catch fddps errors in one place.
"""

from collections.abc import Mapping

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


def check_file_format(d, fmt: str, version: int, what: str, path=None) -> str:
    """Raise :class:`ProfileError` unless ``d`` is a dictionary of format ``fmt``, version ``version``.

    ``what`` names the kind of file in the message ("cost model", "profile").
    Returns how to name the source in later messages (the path, or "the given
    dictionary").
    """
    where = f"{str(path)!r}" if path else "the given dictionary"
    if not isinstance(d, Mapping) or d.get("format") != fmt:
        raise ProfileError(f"{where} is not an fddps {what} (no \"format\": \"{fmt}\")", path=path)
    if d.get("version") != version:
        raise ProfileError(f"{where} has {what} version {d.get('version')!r}; this fddps reads "
                           f"version {version}", path=path)
    return where
