"""Reader for the Standard Task Graph Set (Kasahara lab, Waseda University).

Format: the first non-comment line holds ``n``; then one line per task,
``id cost n_pred pred...``, for ids ``0 .. n+1`` where 0 and ``n+1`` are
zero-cost entry and exit tasks; lines starting with ``#`` are metadata. The
set has no communication costs.
"""

from __future__ import annotations

import os

import pandas as pd

from .errors import GraphError
from .graph import OpGraph


def read_stg(path) -> OpGraph:
    """Read an ``.stg`` file into an :class:`OpGraph` (op names are the task ids).

    Raises
    ------
    GraphError
        Naming the file and line when it is not a valid STG file.

    Examples
    --------
    Two tasks after a zero-cost entry task, joined by a zero-cost exit task:

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.stg")
    >>> with open(path, "w") as f:
    ...     _ = f.write("2\\n0 0 0\\n1 3 1 0\\n2 4 1 0\\n3 0 2 1 2\\n")
    >>> g = read_stg(path)
    >>> g.num_ops
    4
    """
    path = os.fspath(path)
    names, costs, edges = [], [], []
    n = None
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                fields = [int(x) for x in line.split()]
            except ValueError:
                raise GraphError(f"{path}:{lineno}: expected integers, got {line!r}") from None
            if n is None:
                n = fields[0]
                continue
            if len(fields) < 3 or len(fields) != 3 + fields[2]:
                raise GraphError(f"{path}:{lineno}: expected 'id cost n_pred pred...', got {line!r}")
            task, cost, _, *preds = fields
            names.append(task)
            costs.append(float(cost))
            edges.extend((p, task) for p in preds)
            if len(names) == n + 2:
                break
    if n is None or len(names) != n + 2:
        raise GraphError(f"{path}: expected {n} tasks plus entry and exit, found {len(names)}")
    return OpGraph(names, costs, edges)


def read_optimal_values(path) -> pd.DataFrame:
    """Read an ``Optimal_values/Case*_OPT.csv`` file.

    Each row is ``graph,processors,value[,upper]``: one value is a proven
    optimum, two are a lower/upper bound pair.

    Returns a DataFrame with columns ``graph`` (e.g. ``"50/rand0000.stg"``),
    ``processors``, ``lower``, ``upper`` and ``proven`` (``lower == upper``).

    Raises
    ------
    GraphError
        Naming the file and line of a malformed row.
    """
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            fields = [x.strip() for x in line.split(",") if x.strip()]
            if not fields:
                continue
            try:
                graph, procs, values = fields[0], int(fields[1]), [float(x) for x in fields[2:4]]
                lower, upper = values[0], values[-1]
            except (IndexError, ValueError):
                raise GraphError(f"{path}:{lineno}: expected 'graph,processors,value[,upper]', "
                                 f"got {line.strip()!r}") from None
            rows.append((graph, procs, lower, upper, lower == upper))
    return pd.DataFrame(rows, columns=["graph", "processors", "lower", "upper", "proven"])
