"""Cost tables over a few variables' choices, as the eliminating DPs (``pase``, Tofu's) add them.

A table is a numpy array with one axis per variable of its scope, each as long
as that variable's number of choices.
"""

from __future__ import annotations

import numpy as np


def broadcast(table, scope, axes, sizes) -> np.ndarray:
    """``table`` over ``scope`` laid out on ``axes`` (a superset of ``scope``), ready to add.

    Its axes are transposed into ``axes``' order and every variable of ``axes``
    not in ``scope`` gets a length-1 axis, so ``total + broadcast(...)`` adds the
    table to a ``total`` of shape ``[sizes[v] for v in axes]``.

    Example
    -------
    >>> broadcast(np.array([[1.0, 2.0]]), ["b", "a"], ["a", "b", "c"], {"a": 2, "b": 1, "c": 3}).shape
    (2, 1, 1)
    """
    perm = sorted(range(len(scope)), key=lambda i: axes.index(scope[i]))
    view = [1] * len(axes)
    for i in perm:
        view[axes.index(scope[i])] = sizes[scope[i]]
    return np.transpose(table, perm).reshape(view)
