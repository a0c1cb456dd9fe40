"""TensorFlow, imported once and quietly: the one place fddps imports it from."""

from __future__ import annotations

import contextlib
import os

_TF = None


def _tf():
    """Import TensorFlow once, quietly (its C++ logging goes to stderr otherwise)."""
    global _TF
    if _TF is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        _TF = tf
    return _TF


@contextlib.contextmanager
def _no_deprecation_warnings():
    """Mute TensorFlow's deprecation notices inside the block, and only those.

    TensorFlow's own FLOP statistics (``flops_registry``) call the deprecated
    ``tensor_shape_from_node_def_name``: the notice is about TensorFlow's code,
    not the user's. Errors and other warnings still show; the switch is
    restored however the block ends.
    """
    try:
        from tensorflow.python.util import deprecation
    except ImportError:  # pragma: no cover - private module moved
        yield
        return
    old = getattr(deprecation, "_PRINT_DEPRECATION_WARNINGS", None)
    if old is None:  # pragma: no cover - private switch renamed
        yield
        return
    deprecation._PRINT_DEPRECATION_WARNINGS = False
    try:
        yield
    finally:
        deprecation._PRINT_DEPRECATION_WARNINGS = old
