"""A parallelization strategy: per op, a split factor per dimension and a device per part.

:class:`OpConfig` is one op's configuration (the optimal-strategy paper's
Section 1: a split factor for each dimension of the op's iteration domain,
their product at most the number of devices, and a device for each part);
:class:`Strategy` holds one per op, with a default (whole, on one device) for
the ops it does not name. Whole-op placement, data parallelism and channel
(parameter) splits are all strategies:

- :func:`whole_placement`: every op whole on the device a placement gives it;
- :func:`data_parallel`: every op with a sample dimension split by sample over
  the devices; variables, their reads and updates whole, spread over the
  devices by size (parameter servers); weight gradients then reach their
  variable's device as partial sums (a reduce per link);
- :func:`parameter_split`: chosen op types split along their parameter
  (output-channel) dimension;
- :func:`attribute_split`: ops with a height (width) split along it,
  convolutions and pools reading a halo from their neighbours.

:func:`parts` enumerates a configured op's parts and the box of its iteration
domain each one computes; :func:`validate` checks a strategy against a step.

Example
-------
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> g = StepGraph([OpInfo("x", "Const", output_shapes=((4, 8),), output_itemsizes=(4,)),
...                OpInfo("y", "Relu", inputs=(("x", 0),), input_shapes=((4, 8),),
...                       output_shapes=((4, 8),), input_itemsizes=(4,), output_itemsizes=(4,))])
>>> s = Strategy({"y": OpConfig({"n": 2}, ("/cpu:0", "/cpu:1"))}, default_device="/cpu:0")
>>> [p.box for p in parts(g.ops["y"], s.config("y"))]
[{'n': (0, 2), 'c': (0, 8)}, {'n': (2, 4), 'c': (0, 8)}]
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import FddpsError
from .graph import tensor_bytes
from .ops import SAMPLE, NotDescribed, resolve


class StrategyError(FddpsError, ValueError):
    """A strategy that does not fit the step or the cluster (the op and dimension are named)."""


@dataclass(frozen=True)
class OpConfig:
    """One op's configuration.

    Attributes
    ----------
    split : mapping of str -> int
        Split factor per dimension letter (missing: 1).
    devices : tuple of str
        One device per part, parts enumerated over the dimensions in the
        op's order (:attr:`fddps.strategy.ops.OpDims.dims`), the last fastest.
    key : tuple
        ``(split items sorted, devices)``: equal for configurations alike, hashable
        (``split`` is a dict); made once, as the searches key caches and tables by it.
    """

    split: Mapping = field(default_factory=dict)
    devices: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "split", {k: int(v) for k, v in dict(self.split).items() if v != 1})
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "key", (tuple(sorted(self.split.items())), self.devices))

    @property
    def num_parts(self) -> int:
        # math.prod of the (int) factors: the same number as an int64 np.prod, without
        # building an array (pase asks this of every op of every configuration).
        return math.prod(self.split.values())


class Strategy:
    """A configuration per op; ops not named run whole on ``default_device``.

    Parameters
    ----------
    configs : mapping of op name -> OpConfig
    default_device : str
    name : str
        A label for reports (``"data parallel"``).
    """

    def __init__(self, configs: Mapping, default_device: str, name: str = ""):
        self.configs = dict(configs)
        self.default_device = default_device
        self.name = name

    def config(self, op: str) -> OpConfig:
        return self.configs.get(op) or OpConfig({}, (self.default_device,))

    def __repr__(self):
        split = sum(c.num_parts > 1 for c in self.configs.values())
        return f"Strategy({self.name or 'unnamed'}: {split} ops split, {len(self.configs)} configured)"

    def devices(self) -> list:
        """Every device the strategy uses, in first-use order."""
        out = [self.default_device]
        for c in self.configs.values():
            out.extend(d for d in c.devices if d not in out)
        return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Part:
    """One part of a configured op: its index, device and box (dim -> (start, stop))."""

    index: int
    device: str
    box: dict


def _bounds(extent: int, factor: int):
    return list(_cached_bounds(int(extent), int(factor)))


@functools.lru_cache(maxsize=65536)
def _cached_bounds(extent: int, factor: int) -> tuple:
    """``(start, stop)`` of each of ``factor`` parts of ``range(extent)``, as
    ``numpy.array_split`` cuts it (the first ``extent % factor`` parts one longer)."""
    base, extra = divmod(extent, factor)
    out, start = [], 0
    for j in range(factor):
        stop = start + base + (1 if j < extra else 0)
        out.append((start, stop))
        start = stop
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _part_boxes(extents: tuple, factors: tuple) -> tuple:
    """Per part (the last dimension fastest), its ``(start, stop)`` per dimension.

    Pure (ints in, a tuple of tuples out): :func:`parts` is called for every op and
    configuration the searches and the expansion look at, most of them many times.
    """
    return tuple(itertools.product(*[_cached_bounds(e, f) for e, f in zip(extents, factors)]))


def parts(op, config: OpConfig, dims=None) -> list:
    """The parts of ``op`` under ``config`` (uneven parts as ``numpy.array_split``).

    A whole op (no split) has one part whose box is its whole domain (empty
    when the op has no description). Each call returns new :class:`Part` objects
    (their boxes are fresh dicts); the boxes' bounds are cached by extents and factors.
    """
    if dims is None:
        try:
            dims = resolve(op)
        except NotDescribed:
            if config.num_parts > 1:
                raise
            return [Part(0, config.devices[0], {})]
    letters = dims.dims
    boxes = _part_boxes(tuple(int(dims.extent[d]) for d in letters),
                        tuple(int(config.split.get(d, 1)) for d in letters))
    devices = config.devices
    return [Part(j, devices[j], dict(zip(letters, combo))) for j, combo in enumerate(boxes)]


def validate(strategy: Strategy, step, devices: Sequence[str]) -> None:
    """Check ``strategy`` against the step's ops and the cluster's ``devices``.

    Raises
    ------
    StrategyError
        Naming the op and what is wrong: an op not in the step; a split of an
        op that is kept whole (and why); a dimension the op does not have; a
        factor below 1, above the dimension's extent, or above the number of
        devices; a product of factors above the number of devices; a number of
        devices other than the number of parts; a device outside the cluster;
        ops bound to one colocation group configured differently.
    """
    cluster = list(devices)
    known = set(cluster)
    if strategy.default_device not in known:
        raise StrategyError(f"the default device {strategy.default_device!r} is not in the "
                            f"cluster {cluster}")
    for name, cfg in strategy.configs.items():
        if name not in step.ops:
            raise StrategyError(f"the strategy configures op {name!r}, which is not in the step")
        op = step.ops[name]
        for d in cfg.devices:
            if d not in known:
                raise StrategyError(f"op {name!r} has a part on device {d!r}, which is not in "
                                    f"the cluster {cluster}")
        if cfg.num_parts > 1 or cfg.split:
            try:
                dims = resolve(op)
            except NotDescribed as why:
                raise StrategyError(f"op {name!r} ({op.op_type}) cannot be split: {why}") from None
            for d, f in cfg.split.items():
                if d not in dims.extent and d in ("h", "w") and dims.description.halo:
                    raise StrategyError(f"op {name!r} ({op.op_type}) cannot be split along {d!r}: "
                                        f"its spatial axes stay whole ({dims.whole_reason})")
                if d not in dims.extent:
                    raise StrategyError(f"op {name!r} ({op.op_type}) has no dimension {d!r}; its "
                                        f"dimensions are {', '.join(dims.dims) or 'none'}")
                if f < 1:
                    raise StrategyError(f"op {name!r}: split factor {f} of dimension {d!r} "
                                        "must be at least 1")
                if f > dims.extent[d]:
                    raise StrategyError(f"op {name!r}: split factor {f} of dimension {d!r} is "
                                        f"larger than the dimension ({dims.extent[d]})")
                if f > len(cluster):
                    raise StrategyError(f"op {name!r}: split factor {f} of dimension {d!r} is "
                                        f"larger than the number of devices ({len(cluster)})")
        if cfg.num_parts > len(cluster):
            raise StrategyError(f"op {name!r} has {cfg.num_parts} parts, more than the "
                                f"{len(cluster)} devices")
        if len(cfg.devices) != cfg.num_parts:
            raise StrategyError(f"op {name!r} has {cfg.num_parts} parts but {len(cfg.devices)} "
                                "devices (one per part)")
    bound = {}
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            cfg = strategy.config(name)
            first = bound.setdefault(op.group, (name, cfg))
            if (first[1].split, first[1].devices) != (cfg.split, cfg.devices):
                raise StrategyError(f"ops {first[0]!r} and {name!r} share colocation group "
                                    f"{op.group!r} but are configured differently")


# -- strategies in this one form ------------------------------------------------------
def whole_placement(placement: Mapping, default_device: str) -> Strategy:
    """Whole-op placement as a strategy: op name -> device, every op whole."""
    return Strategy({op: OpConfig({}, (dev,)) for op, dev in placement.items()},
                    default_device, name="whole-op placement")


#: Op types that hold a variable: a colocation group with one of them is a variable's.
VARIABLE_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable", "TemporaryVariable"})


#: Op types of a variable's colocation group that the TensorFlow rewrite writes split:
#: one shard variable per part, each read and updated by its own part
#: (:mod:`fddps.tf.variable_shards`).
SHARDED_VARIABLE_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "ResourceApplyMomentum",
                                  "ResourceApplyGradientDescent", "ResourceApplyAdam"})


def shardable_groups(step) -> dict:
    """Colocation group -> its tied ops, for the groups the TensorFlow rewrite can write
    split. A variable's group (shard variables): every tied op of the group is
    of :data:`SHARDED_VARIABLE_OPS`, its variables (the weight and its optimizer
    slots) have one shape, and no op outside the step uses a variable's handle
    in a way the rewrite cannot write (``OpInfo.attrs["unshardable"]``, set by
    :func:`fddps.tf.strategy_graph.step_graph`). A group without a variable
    (TensorFlow colocates a gradient's ``tuple/control_dependency`` and sums
    with the op that computes it) when none of its ops uses a variable: the
    rewrite drops the colocation attribute and names the devices itself.

    Examples
    --------
    >>> from fddps.strategy.graph import OpInfo, StepGraph
    >>> step = StepGraph([OpInfo("w", "VarHandleOp", param_shape=(4, 2), group="w", tied=True),
    ...                   OpInfo("r", "ReadVariableOp", inputs=(("w", 0),), group="w", tied=True)])
    >>> shardable_groups(step)
    {'w': ('w', 'r')}
    """
    groups = {}
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            groups.setdefault(op.group, []).append(name)
    out = {}
    for group, names in groups.items():
        ops = [step.ops[n] for n in names]
        variables = [op for op in ops if op.op_type == "VarHandleOp"]
        if not any(op.op_type in VARIABLE_TYPES or op.op_type in SHARDED_VARIABLE_OPS
                   for op in ops):
            out[group] = tuple(names)
        elif (variables and all(op.op_type in SHARDED_VARIABLE_OPS for op in ops)
                and len({op.param_shape for op in variables}) == 1
                and not any(op.attrs.get("unshardable") for op in variables)):
            out[group] = tuple(names)
    return out


def _variable_groups(step) -> set:
    return {op.group for op in step.ops.values()
            if op.group is not None and op.op_type in VARIABLE_TYPES}


def group_devices(step, devices, groups=None) -> dict:
    """A device per colocation group of ``groups`` (default: every group), spread by
    their ops' parameter bytes, largest first, each to the least-loaded device.

    Examples
    --------
    >>> from fddps.strategy.graph import OpInfo, StepGraph
    >>> step = StepGraph([OpInfo("w", "VarHandleOp", param_bytes=16.0, group="w"),
    ...                   OpInfo("v", "VarHandleOp", param_bytes=8.0, group="v")])
    >>> group_devices(step, ["a", "b"])
    {'w': 'a', 'v': 'b'}
    """
    sizes = {}
    for op in step.ops.values():
        if op.group is not None and (groups is None or op.group in groups):
            sizes[op.group] = sizes.get(op.group, 0.0) + op.param_bytes
    load = dict.fromkeys(devices, 0.0)
    out = {}
    for g in sorted(sizes, key=lambda g: (-sizes[g], g)):
        d = min(devices, key=lambda d: load[d])
        out[g] = d
        load[d] += sizes[g]
    return out


def _split_where(step, devices, choose, name) -> Strategy:
    """``choose(op, dims) -> {dim: factor}`` splits ops over the first devices; whole ops
    go where their data is.

    A whole op bound to a variable's colocation group runs on the group's
    device (variables spread by bytes); another whole op follows its first
    input's producer (its first part), a colocation group without a variable
    (TensorFlow's gradient sums) its first member, and an op without inputs
    (a constant) its first consumer, so that work on a variable stays on the
    variable's device instead of piling onto the first device. Last, whole
    ops move to their readers' device where that moves fewer bytes
    (:func:`_follow_readers`).
    """
    devices = list(devices)
    variables = _variable_groups(step)
    group_dev = group_devices(step, devices, variables)
    configs, sourceless = {}, []
    for op in step.ops.values():
        split = {}
        if not op.tied:
            try:
                split = choose(op, resolve(op)) or {}
            except NotDescribed:
                split = {}
        n = int(np.prod(list(split.values()), dtype=np.int64)) if split else 1
        if n > 1:
            configs[op.name] = OpConfig(split, tuple(devices[:n]))
            continue
        if op.tied and op.group in group_dev:
            home = group_dev[op.group]
        elif op.inputs:
            home = configs[op.inputs[0][0]].devices[0]
        else:
            home = devices[0]
            if not op.tied:
                sourceless.append(op.name)
        if op.tied and op.group is not None:
            home = group_dev.setdefault(op.group, home)
        configs[op.name] = OpConfig({}, (home,))
    first_consumer = {}
    for op in step.ops.values():
        for src, _ in op.inputs:
            first_consumer.setdefault(src, op.name)
    for name_ in sourceless:
        consumer = first_consumer.get(name_)
        if consumer is not None:
            configs[name_] = OpConfig({}, (configs[consumer].devices[0],))
    _follow_readers(step, configs, variables)
    return Strategy(configs, devices[0], name=name)


def _bytes_to(step, configs, src, port, device) -> float:
    """Bytes of output ``port`` of ``src`` that reach ``device`` from other devices:
    the parts held elsewhere, or every partial sum held elsewhere."""
    op, cfg = step.ops[src], configs[src]
    shape = op.output_shapes[port] if port < len(op.output_shapes) else None
    nbytes = tensor_bytes(shape, op.output_itemsizes[port]) if shape else 0.0
    away = sum(d != device for d in cfg.devices)
    if cfg.num_parts == 1:
        return nbytes * away
    try:
        partial = any(cfg.split.get(d, 1) > 1 for d in resolve(op).reduction)
    except NotDescribed:
        partial = False
    return nbytes * away if partial else nbytes * away / cfg.num_parts


def _follow_readers(step, configs, variable_groups):
    """Move a whole op, or a colocation group without a variable, to the one device
    all its readers run on, unless that moves more bytes.

    Latest first, so chains move together. A weight's gradient sum (the
    ``AddN`` of the sample parts' partial sums and the weight decay's gradient,
    one colocation group) then runs on the variable's device, as on a
    parameter server, instead of where its first member ran, which sent the
    summed gradient back: four weight-sized transfers per variable instead of
    two (a read and a partial sum). A weight decay's ``L2Loss`` stays by its
    weight: its scalar moves, not the weight. Variables' groups never move.
    """
    units, unit_of = {}, {}
    for op in step.ops.values():
        if configs[op.name].num_parts > 1 or op.group in variable_groups:
            continue
        if op.tied and op.group is None:
            continue
        key = op.group if op.tied else op.name
        units.setdefault(key, []).append(op.name)
        unit_of[op.name] = key
    readers = {}
    for op in step.ops.values():
        for src in dict.fromkeys([s for s, _ in op.inputs] + list(op.control_inputs)):
            if unit_of.get(src) is not None and unit_of.get(op.name) == unit_of[src]:
                continue  # inside one group
            readers.setdefault(src, []).append(op.name)
    position = {name: i for i, name in enumerate(step.ops)}
    for key in sorted(units, key=lambda k: -max(position[n] for n in units[k])):
        members = units[key]
        outside = [r for n in members for r in readers.get(n, ())]
        if not outside:
            continue
        homes = {d for r in outside for d in configs[r].devices}
        here = configs[members[0]].devices[0]
        if len(homes) != 1 or here in homes:
            continue
        there = next(iter(homes))
        inside = set(members)

        def cost(device):
            sent = 0.0
            for n in members:
                op = step.ops[n]
                sent += sum(_bytes_to(step, configs, s, k, device)
                            for s, k in op.inputs if s not in inside)
                if device != there and n in readers:
                    sent += max((_bytes_to(step, configs, n, k, there)
                                 for k in range(len(op.output_shapes))), default=0.0)
            return sent

        if cost(there) <= cost(here):  # a tie goes to the readers: what it feeds comes next
            for n in members:
                configs[n] = OpConfig({}, (there,))


def sample_dim(dims, batch):
    """The dimension of ``dims`` that indexes the samples, or None.

    The letter ``n`` when its extent is the batch; else the dimension on the
    first axis of the first input that has one of the batch's extent (a weight
    gradient ``MatMul(x, dy, transpose_a=True)`` reduces over the samples).
    """
    if dims.extent.get(SAMPLE) == batch:
        return SAMPLE
    for axes in dims.inputs:
        if isinstance(axes, tuple) and axes and axes[0] not in (None, "shape"):
            if dims.extent[axes[0]] == batch:
                return axes[0]
    return None


def data_parallel(step, devices: Sequence[str]) -> Strategy:
    """Data parallelism: every op with a sample dimension of the batch's extent split by sample.

    Parameters
    ----------
    step : StepGraph
    devices : sequence of str
        The cluster's devices; ``min(len(devices), batch)`` parts per split op.

    Returns
    -------
    Strategy
        Ops bound to variables (reads, updates) whole on their variable's
        device, variables spread over the devices by bytes; everything else
        without a sample dimension whole on the first device.
    """
    batch = step.batch_size
    k = min(len(devices), batch or 1)

    def choose(op, dims):
        d = sample_dim(dims, batch)
        return {d: k} if k > 1 and d is not None else {}

    return _split_where(step, devices, choose, "data parallel")


#: The parameter (output-channel) dimension of the op types :func:`parameter_split` splits.
PARAMETER_DIMS = {"Conv2D": "o", "Conv2DBackpropInput": "i", "Conv2DBackpropFilter": "o",
                  "DepthwiseConv2dNative": "c", "DepthwiseConv2dNativeBackpropInput": "c",
                  "DepthwiseConv2dNativeBackpropFilter": "c", "MatMul": "c"}


def parameter_split(step, devices: Sequence[str], op_types=None, *, only=None) -> Strategy:
    """Split every op of ``op_types`` (default: convolutions and their backprops) by parameter.

    ``only(op) -> bool`` narrows the ops further (a mixed strategy's late layers).
    The filter's output channels of ``Conv2D`` and ``Conv2DBackpropFilter``
    and the input channels ``Conv2DBackpropInput`` produces are split over
    ``min(len(devices), channels)`` parts; the rest as :func:`data_parallel`'s
    home devices.
    """
    kinds = set(op_types or [t for t in PARAMETER_DIMS if t != "MatMul"])
    devices = list(devices)

    def choose(op, dims):
        d = PARAMETER_DIMS.get(op.op_type)
        if op.op_type not in kinds or d not in dims.extent or (only and not only(op)):
            return {}
        f = min(len(devices), dims.extent[d])
        return {d: f} if f > 1 else {}

    return _split_where(step, devices, choose, "parameter split")


def attribute_split(step, devices: Sequence[str], dims: Sequence[str] = ("h",), *,
                    only=None) -> Strategy:
    """FlexFlow's attribute dimension: every op with a height (and/or width) split along it.

    Parameters
    ----------
    step : StepGraph
    devices : sequence of str
    dims : sequence of str
        ``("h",)`` (rows), ``("w",)`` or ``("h", "w")``; with both, the
        devices are shared out as ``k = kh * kw`` with ``kh >= kw``.
    only : callable, optional
        ``only(op) -> bool`` narrows the ops.

    Returns
    -------
    Strategy
        Convolutions, pools, their gradients (a halo each), batch norm
        (statistics reduced across the parts) and element-wise ops split into
        ``min(factor, extent)`` parts per dimension; the rest as
        :func:`data_parallel`'s home devices.

    Examples
    --------
    >>> from fddps.strategy.graph import OpInfo, StepGraph
    >>> g = StepGraph([OpInfo("x", "Relu", input_shapes=((2, 6, 6, 3),),
    ...                       output_shapes=((2, 6, 6, 3),))])
    >>> attribute_split(g, ["d0", "d1", "d2", "d3"], ("h", "w")).config("x").split
    {'h': 2, 'w': 2}
    """
    devices = list(devices)
    k = len(devices)
    factors = {dims[0]: k} if len(dims) == 1 else {}
    if len(dims) == 2:
        kw = max(f for f in range(1, int(k ** 0.5) + 1) if k % f == 0)
        factors = {dims[0]: k // kw, dims[1]: kw}

    def choose(op, op_dims):
        if only and not only(op):
            return {}
        split = {d: min(f, op_dims.extent[d]) for d, f in factors.items() if d in op_dims.extent}
        return {d: f for d, f in split.items() if f > 1}

    return _split_where(step, devices, choose, "attribute split")


def mixed(step, devices: Sequence[str]) -> Strategy:
    """FlexFlow's finding as a strategy: split each convolution or MatMul by parameter when
    its weights outweigh its activations, else by sample; everything else as
    :func:`data_parallel`.

    An op's weights are its tensors without the sample dimension, its
    activations those with it (so a layer's forward op and both its backprops
    decide alike).
    """
    batch = step.batch_size
    devices = list(devices)
    dp = data_parallel(step, devices)

    def weight_heavy(op):
        dims = resolve(op)
        d = sample_dim(dims, batch)
        sizes = {True: 0.0, False: 0.0}
        for axes, shape, item in zip(dims.inputs + dims.outputs, op.input_shapes + op.output_shapes,
                                     op.input_itemsizes + op.output_itemsizes):
            if isinstance(axes, tuple) and shape and axes and axes[0] != "shape":
                sizes[d in axes] += float(np.prod(shape)) * item
        return sizes[False] > sizes[True]

    ps = parameter_split(step, devices, op_types=list(PARAMETER_DIMS), only=weight_heavy)
    configs = {n: (ps.config(n) if ps.config(n).num_parts > 1 else dp.config(n)) for n in step.ops}
    return Strategy(configs, devices[0], name="mixed")


def shard_variables(step, strategy: Strategy, devices: Sequence[str], dim: str = "c") -> Strategy:
    """``strategy`` with every shardable variable group (:func:`shardable_groups` with a
    variable) split along the variables' dimension ``dim`` over the first devices.

    ``dim`` names the variable's axis as its generic letters do
    (:data:`fddps.strategy.ops.GENERIC_AXES`): ``"c"``, the last axis, is a
    MatMul weight's output columns, a convolution filter's output channels, a
    bias's channels, so that a :func:`parameter_split` of the layers reads its
    weight shards where they are. Each group gets ``min(len(devices), extent)``
    parts; groups without ``dim``, or with an extent of 1, keep their configuration.

    Examples
    --------
    >>> from fddps.strategy.graph import OpInfo, StepGraph
    >>> step = StepGraph([OpInfo("w", "VarHandleOp", param_shape=(4, 6), output_shapes=((),),
    ...                          group="w", tied=True)])
    >>> shard_variables(step, Strategy({}, "d0"), ["d0", "d1"]).config("w")
    OpConfig(split={'c': 2}, devices=('d0', 'd1'))
    """
    configs = dict(strategy.configs)
    for group, names in shardable_groups(step).items():
        var = next((n for n in names if step.ops[n].op_type in VARIABLE_TYPES), None)
        if var is None:
            continue
        extent = resolve(step.ops[var]).extent.get(dim, 1)
        k = min(len(devices), extent)
        if k > 1:
            for n in names:
                configs[n] = OpConfig({dim: k}, tuple(devices[:k]))
    return Strategy(configs, strategy.default_device, name=f"{strategy.name} (sharded variables)")


def combine(*strategies, name="mixed") -> Strategy:
    """Per op, the first strategy's configuration that splits it; else the first's."""
    configs = {}
    for op in strategies[0].configs:
        cfgs = [s.config(op) for s in strategies]
        configs[op] = next((c for c in cfgs if c.num_parts > 1), cfgs[0])
    return Strategy(configs, strategies[0].default_device, name=name)
