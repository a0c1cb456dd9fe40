"""The strategy space the searches walk: decision units, their configurations, the starts.

- :func:`decision_units`: ops that must share one configuration (the tied ops of a
  colocation group: a variable, its reads, slots and update), and every other op alone;
- :func:`unit_splits`: the split factors a unit may take (every dimension its ops
  share, at most two split at once, factors up to the number of devices);
- :func:`whole_op_graph`: the step as an :class:`~fddps.graph.OpGraph` of whole ops,
  for the whole-op schedulers (FD-DPS's start of a search);
- :func:`baseline_strategies`: one device, data parallelism and FD-DPS's whole-op
  placement: what every search starts from and must beat.

Example
-------
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> g = StepGraph([OpInfo("y", "Relu", input_shapes=((4, 8),), output_shapes=((4, 8),))])
>>> decision_units(g), unit_splits(g, ["y"], 2)
([('y',)], [{}, {'n': 2}, {'c': 2}])
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from ..graph import OpGraph
from ..strategy.graph import tensor_bytes
from ..strategy.ops import NotDescribed, resolve
from ..strategy.strategy import OpConfig, Strategy, data_parallel, shardable_groups, whole_placement
from .pase_repeats import _frozen


def decision_units(step) -> list:
    """Tuples of op names configured together, in step order (tied groups at their first op)."""
    groups, units = {}, []
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            if op.group not in groups:
                groups[op.group] = [name]
                units.append(groups[op.group])
            else:
                groups[op.group].append(name)
        else:
            units.append([name])
    return [tuple(u) for u in units]


def worth_deciding(op) -> bool:
    """Whether an op is worth a decision: it computes, holds weights, or is a large tensor's
    splittable op (else it stays whole on the first device: constants, shapes, scalars)."""
    if op.flops > 0 or op.param_bytes > 0:
        return True
    try:
        resolve(op)
    except NotDescribed:
        return False
    return op.output_bytes > 4096


def unit_splits(step, unit, num_devices: int, max_dims: int = 2, writable: bool = False) -> list:
    """Split dicts valid for every op of ``unit`` (``{}``: whole), smallest first.

    A dimension qualifies when every op of the unit has it with the same
    extent; factors run over 2..``num_devices`` with their product at most
    ``num_devices`` and each at most the extent. Ops without a description
    leave only ``{}``. ``writable``: only splits
    :func:`fddps.tf.strategy_rewrite.rewrite_strategy` writes: a tied op splits
    only in a unit that holds its whole variable group, and only when the
    rewrite can write that group as shard variables
    (:func:`fddps.strategy.strategy.shardable_groups`); other tied ops stay whole.
    """
    extents = None
    shardable = _shardable(step) if writable and any(step.ops[n].tied for n in unit) else {}
    for name in unit:
        op = step.ops[name]
        if writable and op.tied and not set(shardable.get(op.group, (None,))) <= set(unit):
            return [{}]
        try:
            dims = resolve(op)
        except NotDescribed:
            return [{}]
        ext = dict(dims.extent)
        extents = ext if extents is None else {d: e for d, e in extents.items() if ext.get(d) == e}
    out = [{}]
    letters = sorted(extents or {}, key=lambda d: (d != "n", d))
    for r in range(1, max_dims + 1):
        for combo in itertools.combinations(letters, r):
            ranges = [range(2, min(num_devices, extents[d]) + 1) for d in combo]
            for factors in itertools.product(*ranges):
                if int(np.prod(factors)) <= num_devices:
                    out.append(dict(zip(combo, factors)))
    return out


def _shardable(step) -> dict:
    """:func:`shardable_groups` of ``step``, computed once per step (searches ask per unit)."""
    cached = getattr(step, "_fddps_shardable", None)
    if cached is None:
        cached = step._fddps_shardable = shardable_groups(step)
    return cached


def writable_strategy(step, strategy):
    """``strategy`` with every configuration the GraphDef rewrite does not write made whole
    (on the configuration's first device): a split tied op unless its variable group is
    shardable and configured alike (see :func:`unit_splits`)."""
    shardable = _shardable(step)
    alike = {g for g, names in shardable.items()
             if len({strategy.config(n).key for n in names}) == 1}
    configs = {}
    for name in step.ops:
        cfg = strategy.config(name)
        if cfg.num_parts > 1:
            if step.ops[name].tied and step.ops[name].group not in alike:
                cfg = OpConfig({}, cfg.devices[:1])
        configs[name] = cfg
    return Strategy(configs, strategy.default_device, name=strategy.name)


def whole_op_graph(step, cluster, cost_model) -> OpGraph:
    """The step's ops whole, as an :class:`OpGraph` a whole-op scheduler places.

    Edges carry each input tensor's bytes (from its shape), control edges
    none; tied ops share their colocation group; costs and memory are the cost
    model's for the ops' own rows.
    """
    ops = list(step.ops.values())
    table = pd.DataFrame([dict(name=op.name, op_type=op.op_type, flops=op.flops,
                               input_bytes=op.input_bytes, output_bytes=op.output_bytes,
                               param_bytes=op.param_bytes, kernel_shape=op.kernel_shape)
                          for op in ops])
    types = list(dict.fromkeys(d.type for d in cluster.devices))
    cost = np.column_stack([np.asarray(cost_model.op_times(table, t), dtype=np.float64)
                            for t in types])
    persistent, transient = cost_model.memory(table)
    edges = []
    for op in ops:
        for k, (src, port) in enumerate(op.inputs):
            producer = step.ops[src]
            shape = producer.output_shapes[port] if port < len(producer.output_shapes) else None
            item = producer.output_itemsizes[port] if port < len(producer.output_itemsizes) else 0
            edges.append((src, op.name, tensor_bytes(shape, item) if shape else 0.0))
        edges.extend((c, op.name, 0.0) for c in op.control_inputs)
    return OpGraph([op.name for op in ops], cost, edges, memory=persistent, transient=transient,
                   device_types=types, op_types=[op.op_type for op in ops],
                   colocation=[op.group if op.tied else None for op in ops])


def baseline_strategies(step, cluster, cost_model, fddps_options=None, writable=False,
                        names=None) -> dict:
    """``{"one device", "data parallel", "fddps"}`` -> Strategy (FD-DPS's whole-op placement).

    FD-DPS's entry is missing when it cannot place the step (an
    :class:`~fddps.errors.InfeasibleError`: the step does not fit).
    ``writable``: data parallelism as :func:`writable_strategy`.
    ``names``: the baselines to make (default all three); the others are not
    computed (data parallelism walks every op of the step: seconds on a cell
    network, for nothing where only FD-DPS's placement is wanted).
    """
    from ..algorithms import get_algorithm
    from ..errors import InfeasibleError

    wanted = ("one device", "data parallel", "fddps") if names is None else tuple(names)
    devices = list(cluster.names)
    out = {}
    if "one device" in wanted:
        out["one device"] = whole_placement({}, devices[0])
        out["one device"].name = "one device"
    if "data parallel" in wanted:
        out["data parallel"] = data_parallel(step, devices)
        if writable:
            out["data parallel"] = writable_strategy(step, out["data parallel"])
    if "fddps" in wanted:
        try:
            s = get_algorithm("fddps", **(fddps_options or {})).schedule(
                whole_op_graph(step, cluster, cost_model), cluster)
            out["fddps"] = whole_placement(s.placement, devices[0])
            out["fddps"].name = "fddps (whole ops)"
        except InfeasibleError:
            pass
    return out


def resolved_or_none(op):
    """:func:`~fddps.strategy.ops.resolve` of ``op``, or None where it is not described."""
    try:
        return resolve(op)
    except NotDescribed:
        return None


def resolved_dims(step) -> dict:
    """``{op: resolved_or_none(op)}`` for every op of ``step`` (its resolved description, or None).

    :func:`~fddps.strategy.ops.resolve` reads only the fields keyed here (its type,
    attributes, constant inputs, shapes, FLOPs and output bytes), so ops equal in
    them (a layer's element-wise ops, repeated blocks) are resolved once and share
    the (frozen) description: a fifth of the space's set-up on Inception-V3.
    """
    out, seen = {}, {}
    for n, op in step.ops.items():
        key = (op.op_type, _frozen(op.attrs), _frozen(op.const_values), op.input_shapes,
               op.output_shapes, op.param_shape, op.flops, op.output_bytes)
        try:
            got = seen[key]
        except KeyError:
            got = seen[key] = resolved_or_none(op)
        except TypeError:  # (an unhashable shape: resolved on its own)
            got = resolved_or_none(op)
        out[n] = got
    return out
