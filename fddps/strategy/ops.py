"""Op descriptions by iteration domain: :data:`OP_DESCRIPTIONS` and :func:`resolve`.

Every op type that can be split has one declarative entry (Tofu's operator
descriptions, the optimal-strategy paper's iteration domains): for each input
and output tensor, one character per tensor axis naming the dimension of the
op's iteration domain that indexes it. A dimension that appears in inputs but
in no output is a *reduction*: parts split along it produce partial sums. The
table below is the registry (``print(description_table())`` shows it):

==========  =================================================================
character   meaning
==========  =================================================================
``a``-``z`` an iteration dimension; splitting it splits this axis
``.``       an axis never split (spatial axes of convolutions: they would need
            a halo; the softmax's class axis; a concatenation axis)
``*``       the leading axes of a rank-generic tensor, named by position:
            ``nhwc`` for rank 4, ``nc`` for rank 2, ``c`` for rank 1
            (:data:`GENERIC_AXES`); a lower-rank input broadcasts (aligned
            right, axes of extent 1 stay whole)
``-``       the whole tensor goes to every part (a resource handle, paddings)
``=k``      a shape vector: each part gets its own output ``k``'s shape
==========  =================================================================

Letter conventions (DESIGN.md, "Beyond whole-op placement"; FlexFlow's SOAP):
``n`` is the sample dimension, ``c``/``o`` output channels (parameter), ``i``
input channels (a reduction in a convolution), ``k`` MatMul's inner dimension,
``h``/``w`` attributes. Dimensions in :attr:`OpDescription.stats` need
statistics across parts (batch norm in training: its mean and variance are
over ``n``, ``h``, ``w``); splitting them costs a reduction of the statistics.

Op types whose semantics depend on constant inputs (``Mean``/``Sum`` axes,
``ConcatV2``'s axis, ``Slice``'s begin and size, ``Pad``'s paddings,
``Reshape``'s shape) have an entry whose specs come from a function of those
constants. Everything else is kept whole (:func:`resolve` says why).

Example
-------
>>> dims = resolve(OpInfo("c", "Conv2D", input_shapes=((8, 32, 32, 3), (3, 3, 3, 16)),
...                       output_shapes=((8, 32, 32, 16),), attrs={"data_format": "NHWC"}))
>>> dims.dims, dims.reduction, dims.extent["o"]
(('n', 'o', 'i'), frozenset({'i'}), 16)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from .graph import OpInfo

#: Axis names of a rank-generic (``*``) tensor, by rank.
GENERIC_AXES = {0: "", 1: "c", 2: "nc", 3: "nwc", 4: "nhwc", 5: "nhwdc"}

#: The sample dimension's letter (FlexFlow's S): data parallelism splits it.
SAMPLE = "n"


class NotDescribed(Exception):
    """An op is kept whole; the message says why (no entry, attributes, shapes)."""


@dataclass(frozen=True)
class OpDescription:
    """How one op type's iteration domain indexes its tensors.

    Attributes
    ----------
    op_type : str
    inputs, outputs : tuple of str
        One spec per input and output (see the module notes); an input beyond
        the specs (a variadic op) must be covered by ``specs``.
    when : tuple of (str, object)
        Attribute values the entry requires (``("data_format", "NHWC")``).
    stats : str
        Dimensions whose split needs statistics reduced across parts.
    specs : callable, optional
        ``specs(op) -> (inputs, outputs)`` for op types whose specs depend on
        constant inputs or on how many inputs the op has; raises
        :class:`NotDescribed` when the op cannot be split.
    note : str
        What the split means, for the table.
    """

    op_type: str
    inputs: tuple = ()
    outputs: tuple = ()
    when: tuple = ()
    stats: str = ""
    specs: Callable | None = None
    note: str = ""

    def applies(self, attrs: Mapping) -> bool:
        return all(attrs.get(key, value) == value for key, value in self.when)


@dataclass(frozen=True)
class OpDims:
    """An op's iteration domain, resolved at its shapes (what :func:`resolve` returns).

    Attributes
    ----------
    dims : tuple of str
        The dimensions, in the order parts enumerate them.
    extent : dict of str -> int
    inputs, outputs : tuple
        Per tensor: a tuple with one dimension letter or None (never split)
        per axis; ``"whole"`` for a tensor that goes whole to every part;
        ``("shape", k)`` for a shape vector equal to output ``k``'s shape.
    reduction : frozenset of str
        Dimensions in no output: parts split along them give partial sums.
    stats : frozenset of str
        Dimensions whose split needs statistics reduced across parts.
    description : OpDescription
    """

    dims: tuple
    extent: dict
    inputs: tuple
    outputs: tuple
    reduction: frozenset
    stats: frozenset
    description: OpDescription = field(repr=False, default=None)


OP_DESCRIPTIONS: dict[str, list[OpDescription]] = {}


def register(desc: OpDescription) -> OpDescription:
    """Add an entry to :data:`OP_DESCRIPTIONS` (several per type: one per attribute variant)."""
    OP_DESCRIPTIONS.setdefault(desc.op_type, []).append(desc)
    return desc


# -- specs that depend on constant inputs ---------------------------------------------
def _const(op: OpInfo, index: int, what: str):
    value = op.const_values.get(index)
    if value is None:
        raise NotDescribed(f"its {what} (input {index}) is not a constant")
    return list(value)


def _reduction_specs(op: OpInfo):
    """Mean/Sum: reduced axes are reductions, the others parallel."""
    rank = len(op.input_shapes[0])
    letters = GENERIC_AXES.get(rank)
    if letters is None:
        raise NotDescribed(f"rank {rank} input")
    axes = {a % rank for a in _const(op, 1, "axes")} if rank else set()
    keep = bool(op.attrs.get("keep_dims", False))
    out = "".join("." if (a in axes and keep) else letters[a]
                  for a in range(rank) if keep or a not in axes)
    return (letters, "-"), (out,)


def _concat_specs(op: OpInfo):
    n = len(op.input_shapes) - 1
    rank = len(op.output_shapes[0])
    axis = _const(op, n, "axis")[0] % rank if rank else 0
    letters = GENERIC_AXES.get(rank)
    if letters is None:
        raise NotDescribed(f"rank {rank} output")
    spec = "".join("." if a == axis else letters[a] for a in range(rank))
    return (spec,) * n + ("-",), (spec,)


def _slice_specs(op: OpInfo):
    rank = len(op.input_shapes[0])
    letters = GENERIC_AXES.get(rank)
    if letters is None:
        raise NotDescribed(f"rank {rank} input")
    begin, size = _const(op, 1, "begin"), _const(op, 2, "size")
    whole = [b == 0 and s in (-1, op.input_shapes[0][a])
             for a, (b, s) in enumerate(zip(begin, size))]
    spec = "".join(letters[a] if whole[a] else "." for a in range(rank))
    return (spec, "-", "-"), (spec,)


def _pad_specs(op: OpInfo):
    rank = len(op.input_shapes[0])
    letters = GENERIC_AXES.get(rank)
    if letters is None:
        raise NotDescribed(f"rank {rank} input")
    pads = _const(op, 1, "paddings")
    spec = "".join(letters[a] if pads[2 * a] == pads[2 * a + 1] == 0 else "." for a in range(rank))
    return (spec, "-"), (spec,)


def _reshape_specs(op: OpInfo):
    src, dst = op.input_shapes[0], op.output_shapes[0]
    if not src or not dst or src[0] != dst[0]:
        raise NotDescribed("it does not keep the first (sample) axis")
    return ("n" + "." * (len(src) - 1), "=0"), ("n" + "." * (len(dst) - 1),)


_NHWC = (("data_format", "NHWC"),)
_TRAINING = (("is_training", True),)
#: Ops that read only their inputs' shapes (static in a training step: TensorFlow
#: folds them to constants), so no input bytes move to them.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

ELEMENTWISE_OPS = ("Relu", "ReluGrad", "Relu6", "Mul", "Sub", "AddV2", "Add", "AddN", "RealDiv",
                   "Neg", "Floor", "FloorMod", "GreaterEqual", "SelectV2", "Identity",
                   "Maximum", "Minimum", "Square", "Sqrt", "Rsqrt", "Tanh", "Sigmoid", "Cast",
                   "TanhGrad", "SigmoidGrad")
for _d in (
    OpDescription("Conv2D", ("n..i", "..io"), ("n..o",), _NHWC,
                  note="sample n, output channels o (parameter), input channels i (reduction)"),
    OpDescription("Conv2DBackpropInput", ("=0", "..io", "n..o"), ("n..i",), _NHWC,
                  note="o is a reduction: channel parts give partial input gradients"),
    OpDescription("Conv2DBackpropFilter", ("n..i", "=0", "n..o"), ("..io",), _NHWC,
                  note="n is a reduction: sample parts give partial weight gradients"),
    OpDescription("DepthwiseConv2dNative", ("n..c", "..c."), ("n..c",), _NHWC,
                  note="depth multiplier 1 only (else the channel map is not one-to-one)"),
    OpDescription("DepthwiseConv2dNativeBackpropInput", ("=0", "..c.", "n..c"), ("n..c",), _NHWC),
    OpDescription("DepthwiseConv2dNativeBackpropFilter", ("n..c", "=0", "n..c"), ("..c.",), _NHWC,
                  note="n is a reduction"),
    OpDescription("MatMul", ("nk", "kc"), ("nc",), (("transpose_a", False), ("transpose_b", False))),
    OpDescription("MatMul", ("kn", "kc"), ("nc",), (("transpose_a", True), ("transpose_b", False))),
    OpDescription("MatMul", ("nk", "ck"), ("nc",), (("transpose_a", False), ("transpose_b", True))),
    OpDescription("MatMul", ("kn", "ck"), ("nc",), (("transpose_a", True), ("transpose_b", True))),
    OpDescription("BiasAdd", ("*c", "c"), ("*c",), _NHWC),
    OpDescription("BiasAddGrad", ("*c",), ("c",), _NHWC, note="leading axes are reductions"),
    OpDescription("FusedBatchNormV3", ("nhwc", "c", "c", "-", "-"), ("nhwc", "c", "c", "c", "c", "-"),
                  _NHWC + _TRAINING, stats="nhw",
                  note="n, h, w split: mean and variance reduced across parts"),
    OpDescription("FusedBatchNormGradV3", ("nhwc", "nhwc", "c", "c", "c", "-"),
                  ("nhwc", "c", "c", "-", "-"), _NHWC + _TRAINING, stats="nhw",
                  note="n, h, w split: the sums of dy and dy*x reduced across parts"),
    OpDescription("MaxPool", ("n..c",), ("n..c",), _NHWC),
    OpDescription("AvgPool", ("n..c",), ("n..c",), _NHWC),
    OpDescription("MaxPoolGrad", ("n..c", "n..c", "n..c"), ("n..c",), _NHWC),
    OpDescription("AvgPoolGrad", ("=0", "n..c"), ("n..c",), _NHWC),
    OpDescription("SoftmaxCrossEntropyWithLogits", ("n.", "n."), ("n", "n."),
                  note="the class axis stays whole (softmax over it)"),
    OpDescription("L2Loss", ("*",), ("",), note="every axis is a reduction"),
    OpDescription("Mean", specs=_reduction_specs, note="reduced axes (constant) are reductions"),
    OpDescription("Sum", specs=_reduction_specs, note="reduced axes (constant) are reductions"),
    OpDescription("ConcatV2", specs=_concat_specs, note="every axis but the concatenation axis"),
    OpDescription("Slice", specs=_slice_specs, note="axes taken whole (constant begin 0, full size)"),
    OpDescription("Pad", specs=_pad_specs, note="axes without padding (constant paddings)"),
    OpDescription("Reshape", specs=_reshape_specs, note="when it keeps the sample axis"),
    OpDescription("ResourceApplyMomentum", ("-", "-", "", "*", ""), (),
                  note="every axis of the variable is a parameter dimension"),
    OpDescription("ReadVariableOp", ("-",), ("*",), note="a part reads its part of the variable"),
    OpDescription("VarHandleOp", (), ("*",),
                  note="the variable's own axes: a part holds its share of the weights"),
    *(OpDescription(t, ("*",) * 2, ("*",), note="element-wise (broadcasting)")
      for t in ELEMENTWISE_OPS),
):
    register(_d)


def _expand(spec: str, rank: int, ref: str):
    """Axis letters of one tensor: ``spec`` at ``rank``, ``*`` filled from ``ref``."""
    if spec == "-":
        return "whole"
    if spec.startswith("="):
        return ("shape", int(spec[1:]))
    if "*" in spec:
        tail = spec.replace("*", "")
        lead = rank - len(tail)
        if lead < 0:
            raise NotDescribed(f"a rank-{rank} tensor where the spec {spec!r} needs more axes")
        return tuple(ref[len(ref) - rank:][:lead]) + tuple(tail)
    if len(spec) != rank:
        raise NotDescribed(f"a rank-{rank} tensor where the spec {spec!r} needs {len(spec)} axes")
    return tuple(spec)


def resolve(op: OpInfo) -> OpDims:
    """The iteration domain of ``op`` at its shapes.

    Raises
    ------
    NotDescribed
        When the op is kept whole: no entry for its type, no entry for its
        attributes, an unknown shape, a non-constant input the entry needs, or
        shapes the entry does not fit; the message says which.
    """
    entries = OP_DESCRIPTIONS.get(op.op_type)
    if not entries:
        raise NotDescribed(f"no description for op type {op.op_type}")
    desc = next((d for d in entries if d.applies(op.attrs)), None)
    if desc is None:
        raise NotDescribed(f"no {op.op_type} description for its attributes")
    if op.op_type == "VarHandleOp" and op.param_shape is None:
        raise NotDescribed("the variable's shape is not known")
    if desc.specs and any(s is None or None in s for s in list(op.input_shapes)
                          + list(op.output_shapes)):
        raise NotDescribed("a shape is not fully known")
    in_specs, out_specs = desc.specs(op) if desc.specs else (desc.inputs, desc.outputs)
    in_shapes = list(op.input_shapes)
    out_shapes = [op.param_shape] if op.op_type == "VarHandleOp" else list(op.output_shapes)
    if op.op_type in ELEMENTWISE_OPS:
        in_specs = ("*",) * len(in_shapes)
    if len(in_specs) < len(in_shapes) or len(out_specs) < len(out_shapes):
        raise NotDescribed(f"{len(in_shapes)} inputs and {len(out_shapes)} outputs, "
                           f"the description has {len(in_specs)} and {len(out_specs)}")
    star = [s for spec, s in zip(list(out_specs) + list(in_specs), out_shapes + in_shapes)
            if "*" in spec and s is not None]
    ref_rank = max((len(s) for s in star), default=0)
    ref = GENERIC_AXES.get(ref_rank)
    if ref is None:
        raise NotDescribed(f"rank {ref_rank} tensors have no generic axis names")
    extent, inputs, outputs = {}, [], []
    order = []
    for specs, shapes_, maps in ((out_specs, out_shapes, outputs), (in_specs, in_shapes, inputs)):
        for spec, shape in zip(specs, shapes_):
            if spec == "-" or spec.startswith("="):
                maps.append(_expand(spec, 0, ref))
                continue
            if shape is None or any(d is None for d in shape):
                raise NotDescribed("a shape is not fully known")
            axes = _expand(spec, len(shape), ref)
            if not isinstance(axes, tuple) or (axes and axes[0] == "shape"):
                maps.append(axes)
                continue
            resolved = []
            for letter, size in zip(axes, shape):
                if letter == ".":
                    resolved.append(None)
                    continue
                if "*" in spec and size == 1 and extent.get(letter, 1) != 1:
                    resolved.append(None)  # broadcast axis
                    continue
                if letter in extent and extent[letter] != size:
                    if "*" in spec and extent[letter] == 1:
                        extent[letter] = size  # an earlier tensor broadcast it
                    else:
                        raise NotDescribed(f"dimension {letter!r} has extents {extent[letter]} "
                                           f"and {size} in its tensors")
                extent.setdefault(letter, size)
                if letter not in order:
                    order.append(letter)
                resolved.append(letter)
            maps.append(tuple(resolved))
    in_out = {x for m in outputs if isinstance(m, tuple) for x in m if x}
    reduction = frozenset(d for d in order if d not in in_out)
    return OpDims(tuple(order), extent, tuple(inputs), tuple(outputs), reduction,
                  frozenset(d for d in desc.stats if d in extent), desc)


def description_table() -> pd.DataFrame:
    """The registry as a table: op type, attribute variant, input and output specs, notes."""
    rows = []
    for op_type, entries in OP_DESCRIPTIONS.items():
        for d in entries:
            rows.append(dict(op_type=op_type, when=" ".join(f"{k}={v}" for k, v in d.when),
                             inputs=", ".join(d.inputs) if not d.specs else "(from constants)",
                             outputs=", ".join(d.outputs) if not d.specs else "",
                             stats=d.stats, note=d.note))
    return pd.DataFrame(rows)


def coverage(step_graph) -> pd.DataFrame:
    """Per op type of ``step_graph``: how many ops are described and how many kept whole.

    Returns
    -------
    pandas.DataFrame
        Columns ``op_type``, ``ops``, ``described``, ``kept_whole``, ``reason``
        (the most common reason an op of the type is kept whole), sorted by
        ``ops`` descending.
    """
    rows = {}
    for op in step_graph.ops.values():
        r = rows.setdefault(op.op_type, dict(op_type=op.op_type, ops=0, described=0,
                                            kept_whole=0, reasons={}))
        r["ops"] += 1
        try:
            resolve(op)
            r["described"] += 1
        except NotDescribed as why:
            r["kept_whole"] += 1
            r["reasons"][str(why)] = r["reasons"].get(str(why), 0) + 1
    out = []
    for r in rows.values():
        reasons = r.pop("reasons")
        r["reason"] = max(reasons, key=reasons.get) if reasons else ""
        out.append(r)
    return (pd.DataFrame(out, columns=["op_type", "ops", "described", "kept_whole", "reason"])
            .sort_values(["ops", "op_type"], ascending=[False, True]).reset_index(drop=True))
