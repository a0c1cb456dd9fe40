"""Op memory: persistent bytes (variables, optimizer slots) and transient bytes.

The op table gives ``param_bytes`` (a variable's size; optimizer slots are
variables of their own in a training graph, so they have theirs) and
``output_bytes`` (from the inferred shapes). A profile adds what TensorFlow
measured per op (``NodeExecStats``: the bytes its allocators handed out while
it ran, outputs and temporaries; 0 for an op whose output is a buffer that
already existed, as a ``ReadVariableOp``'s is its variable's):
:func:`measured_transient` turns it into the table :class:`costmodel.CostModel`
uses, and :meth:`costmodel.CostModel.memory` scales it to other batch sizes by
the ratio of output sizes.

The simulator's per-device peak (``fddps.simulate.peak_memory``) holds each
op's persistent bytes for the whole step and its transient bytes from its
start until its last consumer finishes; an op that only forwards its input's
buffer (``fddps.OpGraph.aliases``: a same-device variable read, ``Identity``)
allocates none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import CostModelError


def measured_transient(measured: pd.DataFrame) -> pd.DataFrame:
    """Measured transient bytes per op, from profiled rows.

    Parameters
    ----------
    measured : pandas.DataFrame
        ``name``, ``output_bytes`` (from shapes, at the profiled batch size) and
        ``transient_bytes`` (measured; NaN where TensorFlow reported nothing).

    Returns
    -------
    pandas.DataFrame with ``name``, ``output_bytes``, ``transient_bytes``: one row
    per op with a measurement (the largest profiled batch when there are several).

    Raises
    ------
    CostModelError
        If a column is missing.
    """
    for col in ("name", "output_bytes", "transient_bytes"):
        if col not in measured.columns:
            raise CostModelError(f"measured memory needs a {col!r} column")
    m = measured[["name", "output_bytes", "transient_bytes"]].copy()
    m["output_bytes"] = m["output_bytes"].astype(np.float64).fillna(0.0)
    m["transient_bytes"] = m["transient_bytes"].astype(np.float64)
    m = m[np.isfinite(m["transient_bytes"]) & (m["transient_bytes"] >= 0)]
    m = m.sort_values(["name", "output_bytes"], kind="stable").drop_duplicates("name", keep="last")
    return m.reset_index(drop=True)


def memory_summary(cost_model, ops: pd.DataFrame) -> pd.Series:
    """Total persistent and transient bytes of ``ops`` under ``cost_model`` (for reports)."""
    persistent, transient = cost_model.memory(ops)
    return pd.Series({"persistent_bytes": float(persistent.sum()),
                      "transient_bytes": float(transient.sum()),
                      "largest_transient_bytes": float(transient.max()) if len(transient) else 0.0})
