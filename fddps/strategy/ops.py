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
``.``       an axis never split (the softmax's class axis; a concatenation
            axis; a depthwise filter's multiplier)
``H``/``W`` a sliding-window op's input rows (columns) that the part's
            windows read: dimension ``h`` (``w``) mapped through stride,
            kernel extent and padding (:class:`Halo`): the part's own rows
            plus a halo from its neighbours
``Y``/``X`` the windows (output rows, columns) that touch the part's rows
            ``h`` (``w``): a backprop's output gradient
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
``h``/``w`` attributes (FlexFlow's A). A sliding-window entry (``halo``) says
whether ``h``/``w`` index its outputs' rows (``"forward"``: a convolution, a
pool, the filter gradient) or its inputs' rows (``"backward"``: the input
gradients), and where the kernel extent comes from (:data:`HALO_KERNELS`);
:func:`resolve` computes each spatial dimension's :class:`Halo` (stride,
dilation and padding from the op's attributes, at the axes its
``data_format`` puts them: :func:`spatial_axes`) and marks ``H``/``W``/``Y``/``X``
axes with a :class:`HaloAxis`. A dilated window reads through its effective
extent ``(k - 1) * d + 1``; an entry whose dilated windows cannot be split says
why in :attr:`OpDescription.dilated_whole` (its spatial axes then stay whole).
Window ops, ``BiasAdd``/``BiasAddGrad`` and batch norm have an entry per layout
(``NHWC``; ``NCHW``, the channel axis second); the first entry of a type is NHWC.
Dimensions in :attr:`OpDescription.stats` need
statistics across parts (batch norm in training: its mean and variance are
over ``n``, ``h``, ``w``); splitting them costs a reduction of the statistics.

Op types whose semantics depend on constant inputs or attributes (``Mean``/``Sum``
axes, ``ConcatV2``'s axis, ``Slice``'s begin and size, ``Pad``'s paddings,
``Reshape``'s shape; for the RNN models: ``Split``/``SplitV``'s and ``Pack``/``Unpack``'s
axis, ``Tile``'s multiples, ``Transpose``'s permutation, ``ExpandDims``'s axis,
``StridedSlice``'s begin, end, strides and masks, ``GatherV2``'s axis) have an entry
whose specs come from a function of those constants, and so do the rank-generic ones
(``Softmax``, ``UnsortedSegmentSum``, ``BatchMatMulV2``). Everything else is kept whole
(:func:`resolve` says why; :func:`coverage` counts it).

Example
-------
>>> dims = resolve(OpInfo("c", "Conv2D", input_shapes=((8, 32, 32, 3), (3, 3, 3, 16)),
...                       output_shapes=((8, 32, 32, 16),),
...                       attrs={"data_format": "NHWC", "strides": (1, 1, 1, 1), "padding": "SAME"}))
>>> dims.dims, dims.reduction, dims.extent["o"]
(('n', 'o', 'i', 'h', 'w'), frozenset({'i'}), 16)
>>> dims.halo["h"].reads(0, 16)   # rows 0-15 of 32 read rows -1..16 (SAME: one padded row)
(-1, 17)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
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
    halo : str
        ``"forward"`` or ``"backward"`` for a sliding-window op (``h``/``w``
        index the windows' output rows, or the input rows a backprop
        produces); ``""`` otherwise.
    kernel : str
        Where the window's extent comes from (a key of :data:`HALO_KERNELS`).
    dilated_whole : str
        Why this entry's windows keep their spatial axes whole when dilated
        (``""``: a dilated window splits like any other, through its effective
        extent).
    kept_whole : str
        Why ops this entry matches are kept whole (``""``: they split as the specs
        say): a variant TensorFlow's CPU kernels refuse to run in parts, named so
        that :func:`resolve` says so rather than "no description".
    """

    op_type: str
    inputs: tuple = ()
    outputs: tuple = ()
    when: tuple = ()
    stats: str = ""
    specs: Callable | None = None
    note: str = ""
    halo: str = ""
    kernel: str = ""
    dilated_whole: str = ""
    kept_whole: str = ""

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
    halo: dict = field(default_factory=dict)
    """Per spatial dimension of a sliding-window op: its :class:`Halo`."""
    whole_reason: str = ""
    """Why a sliding-window op's spatial axes stay whole, if they do."""


def spatial_axes(attrs: Mapping) -> tuple:
    """The axes of rows and columns in a 4-D tensor of an op with these attributes, which
    are also the positions of their entries in ``strides``, ``ksize`` and ``dilations``
    (and of their pairs in ``explicit_paddings``): ``(2, 3)`` for ``data_format="NCHW"``,
    else ``(1, 2)`` (NHWC, TensorFlow's default).

    >>> spatial_axes({"data_format": "NCHW"}), spatial_axes({})
    ((2, 3), (1, 2))
    """
    return (2, 3) if attrs.get("data_format") == "NCHW" else (1, 2)


#: Where a sliding-window op's kernel extent (rows, columns) comes from: the filter is
#: HWIO (HWC1 for a depthwise one) in either data format, a pool's ``ksize`` follows it.
HALO_KERNELS = {
    "filter": lambda op: tuple(op.input_shapes[1][:2]),    # the filter input
    "filter_sizes": lambda op: tuple(op.output_shapes[0][:2]),  # the filter gradient's shape
    "ksize": lambda op: tuple(op.attrs["ksize"][a] for a in spatial_axes(op.attrs)),
}


@dataclass(frozen=True)
class Halo:
    """One spatial dimension of a sliding-window op.

    Window ``y`` (an output row) reads input rows ``[y*stride - pad,
    y*stride - pad + kernel)``, every ``dilation``-th of them; rows outside
    ``[0, size)`` are padding. A part therefore needs that whole span of
    rows (the op runs on a contiguous slice), the rows a dilation skips
    included.

    Attributes
    ----------
    dim : str
        ``"h"`` or ``"w"``.
    size, out : int
        Input rows and windows (output rows) of the whole op.
    kernel, stride, pad : int
        Window extent (effective: ``(k - 1) * dilation + 1`` for ``k`` taps),
        step, and padding before row 0 (TensorFlow's SAME puts the odd row after).
    backward : bool
        ``dim`` indexes input rows (a backprop's output), else windows.
    dilation : int
        Rows between a window's taps (1: adjacent).
    """

    dim: str
    size: int
    out: int
    kernel: int
    stride: int
    pad: int
    backward: bool = False
    dilation: int = 1

    def windows(self, a: int, b: int) -> tuple:
        """The windows a part with rows ``[a, b)`` of its dimension computes with.

        Forward: the rows themselves. Backward: the windows that touch input
        rows ``[a, b)`` (possibly none: an empty range), clipped to the op's.
        """
        if not self.backward:
            return a, b
        lo = max(0, -(-(a + self.pad - self.kernel + 1) // self.stride))
        hi = min(self.out, (b - 1 + self.pad) // self.stride + 1)
        return lo, max(lo, hi)

    def reads(self, a: int, b: int) -> tuple:
        """Input rows (unclipped: below 0 or from ``size`` on is padding) the windows of
        ``[a, b)`` read (:meth:`windows` first when backward)."""
        y0, y1 = self.windows(a, b)
        if y1 <= y0:
            return y0 * self.stride - self.pad, y0 * self.stride - self.pad
        return y0 * self.stride - self.pad, (y1 - 1) * self.stride - self.pad + self.kernel

    def clip(self, lo: int, hi: int) -> tuple:
        """``((lo', hi'), (pad_before, pad_after))``: the rows of ``[lo, hi)`` that exist
        and the padding rows around them."""
        c0, c1 = min(max(lo, 0), self.size), max(min(hi, self.size), 0)
        if hi <= lo:
            return (c0, c0), (0, 0)
        return (c0, max(c0, c1)), (max(0, -lo), max(0, hi - self.size))

    def counts(self, y0: int, y1: int) -> np.ndarray:
        """Per window of ``[y0, y1)``: how many of its taps fall on real rows (not padding)."""
        start = np.arange(y0, y1) * self.stride - self.pad
        taps = start[:, None] + self.dilation * np.arange((self.kernel - 1) // self.dilation + 1)
        return ((taps >= 0) & (taps < self.size)).sum(axis=1)


@dataclass(frozen=True)
class HaloAxis:
    """A tensor axis indexed through a :class:`Halo`: ``reads`` (``H``/``W``: the input rows
    the part's windows read, halo included) or the windows themselves (``Y``/``X``)."""

    halo: Halo
    reads: bool

    @property
    def dim(self) -> str:
        return self.halo.dim

    def rows(self, a: int, b: int) -> tuple:
        """The rows of this axis that a part with rows ``[a, b)`` of ``dim`` needs (clipped).

        A part with all of ``dim`` reads the whole axis: it runs the op as it is,
        rows no window reads included (a 1x1 stride-2 window skips every other
        row; a max pool's gradient has its input's shape).
        """
        h = self.halo
        if (a, b) == (0, h.size if h.backward else h.out):
            return (0, h.size) if self.reads else (0, h.out)
        if self.reads:
            return self.halo.clip(*self.halo.reads(a, b))[0]
        return self.halo.windows(a, b)


#: Spec characters of halo axes: character -> (spatial dimension, reads input rows).
HALO_CHARS = {"H": ("h", True), "W": ("w", True), "Y": ("h", False), "X": ("w", False)}


def _halos(op: OpInfo, desc: OpDescription, in_specs, out_specs, in_shapes, out_shapes):
    """The :class:`Halo` of each spatial dimension of a sliding-window op, or a reason
    (str) why its spatial axes stay whole."""
    attrs = op.attrs
    strides, padding = attrs.get("strides"), attrs.get("padding")
    if strides is None or padding is None or len(strides) != 4:
        return "its strides or padding are not known"
    axes = spatial_axes(attrs)
    dilations = tuple(attrs.get("dilations") or (1, 1, 1, 1))
    if len(dilations) != 4 or any(d != 1 for a, d in enumerate(dilations) if a not in axes):
        return f"dilations {dilations} (not on the spatial axes)"
    if any(dilations[a] != 1 for a in axes) and desc.dilated_whole:
        return desc.dilated_whole
    try:
        kernel = HALO_KERNELS[desc.kernel](op)
    except (KeyError, IndexError, TypeError):
        return "its window's extent is not known"

    def axis_extent(specs, shapes, char):
        for spec, shape in zip(specs, shapes):
            if char in spec and shape is not None and len(spec) == len(shape):
                return shape[spec.index(char)]
        return None

    out = {}
    for j, (axis, dim, rows_char, win_char) in enumerate(zip(axes, "hw", "HW", "YX")):
        own = axis_extent(list(out_specs) + list(in_specs), list(out_shapes) + list(in_shapes), dim)
        other = axis_extent(in_specs, in_shapes, win_char if desc.halo == "backward" else rows_char)
        if own is None or other is None or None in (own, other, kernel[j]):
            return "a spatial extent is not known"
        size, windows = (own, other) if desc.halo == "backward" else (other, own)
        # A dilated window spans (k - 1) * d + 1 rows: TensorFlow pads and counts windows
        # with that effective extent, and a part needs every row of the span.
        d = int(dilations[axis])
        k, s = (int(kernel[j]) - 1) * d + 1, int(strides[axis])
        if padding == "SAME":
            pad = max((windows - 1) * s + k - size, 0) // 2
        elif padding == "VALID":
            pad = 0
        elif padding == "EXPLICIT" and len(attrs.get("explicit_paddings") or ()) == 8:
            pad = int(attrs["explicit_paddings"][2 * axis])
        else:
            return f"padding {padding!r}"
        after = {"VALID": 0, "SAME": None}.get(padding)
        if after is None and padding == "EXPLICIT":
            after = int(attrs["explicit_paddings"][2 * axis + 1])
        if after is not None and windows != (size + pad + after - k) // s + 1:
            return "its spatial shapes do not fit its window"
        out[dim] = Halo(dim, int(size), int(windows), k, s, pad, desc.halo == "backward", d)
    return out


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
    """Leading axes equal in both shapes (``n``, ``p``, ``q``...) and trailing ones (``c``,
    ``d``...) are parallel: row-major order keeps them; the axes between are merged or
    split and stay whole."""
    src, dst = op.input_shapes[0], op.output_shapes[0]
    if not src or not dst:
        raise NotDescribed("a scalar input or output")
    prefix = 0
    while prefix < min(len(src), len(dst)) and src[prefix] == dst[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < min(len(src), len(dst)) - prefix
           and src[len(src) - 1 - suffix] == dst[len(dst) - 1 - suffix]):
        suffix += 1
    if prefix + suffix == 0:
        raise NotDescribed("it keeps neither its first nor its last axis")
    if prefix > 5 or suffix > 5:
        raise NotDescribed("more than five axes kept on one side")
    lead, tail = "npqrs"[:prefix], "cdefg"[:suffix][::-1]

    def spec(rank):
        return lead + "." * (rank - prefix - suffix) + tail

    return (spec(len(src)), "=0"), (spec(len(dst)),)


def _letters(rank: int, what: str = "input") -> str:
    letters = GENERIC_AXES.get(rank)
    if letters is None:
        raise NotDescribed(f"rank {rank} {what}")
    return letters


def _but(letters: str, axes) -> str:
    """``letters`` with the axes in ``axes`` kept whole (``.``)."""
    return "".join("." if a in axes else x for a, x in enumerate(letters))


def _axis_attr(op: OpInfo, rank: int) -> int:
    axis = op.attrs.get("axis", 0)
    if not -rank <= axis < rank:
        raise NotDescribed(f"axis {axis} of a rank-{rank} tensor")
    return axis % rank


def _split_specs(op: OpInfo):
    """Split (axis, value) and SplitV (value, size_splits, axis): every axis but the split one."""
    value = 1 if op.op_type == "Split" else 0
    rank = len(op.input_shapes[value])
    axis_input = 0 if op.op_type == "Split" else 2
    axis = _const(op, axis_input, "axis")[0] % rank if rank else 0
    spec = _but(_letters(rank), {axis})
    inputs = ("-", spec) if op.op_type == "Split" else (spec, "-", "-")
    return inputs, (spec,) * len(op.output_shapes)


def _pack_specs(op: OpInfo):
    """Pack: every axis of the inputs; the new (stacking) axis stays whole."""
    rank = len(op.output_shapes[0])
    axis = _axis_attr(op, rank)
    out = _but(_letters(rank, "output"), {axis})
    return (out[:axis] + out[axis + 1:],) * len(op.input_shapes), (out,)


def _unpack_specs(op: OpInfo):
    """Unpack: every axis of the outputs; the unstacked axis stays whole."""
    rank = len(op.input_shapes[0])
    axis = _axis_attr(op, rank)
    spec = _but(_letters(rank), {axis})
    return (spec,), (spec[:axis] + spec[axis + 1:],) * len(op.output_shapes)


def _tile_specs(op: OpInfo):
    """Tile: the axes it does not repeat (multiple 1)."""
    rank = len(op.input_shapes[0])
    multiples = _const(op, 1, "multiples")
    spec = _but(_letters(rank), {a for a, m in enumerate(multiples) if m != 1})
    return (spec, "-"), (spec,)


def _transpose_specs(op: OpInfo):
    """Transpose: output axis j is input axis perm[j]."""
    rank = len(op.input_shapes[0])
    perm = _const(op, 1, "perm")
    letters = _letters(rank)
    return (letters, "-"), ("".join(letters[p % rank] for p in perm),)


def _expand_dims_specs(op: OpInfo):
    """ExpandDims: the input's axes; the new axis (extent 1) stays whole."""
    rank = len(op.output_shapes[0])
    axis = _const(op, 1, "axis")[0] % rank
    out = _but(_letters(rank, "output"), {axis})
    return (out[:axis] + out[axis + 1:], "-"), (out,)


def _strided_slice_axes(op: OpInfo, shape, begin, end, strides):
    """Axes of a ``StridedSlice`` taken whole (stride 1, from 0 to the end) and the axes it
    shrinks away; masks are bit fields over the begin/end/strides entries."""
    attrs = op.attrs
    if attrs.get("ellipsis_mask", 0) or attrs.get("new_axis_mask", 0):
        raise NotDescribed("an ellipsis or a new axis in its slice")
    whole, shrink = set(), set()
    for a, size in enumerate(shape):
        if a >= len(begin):
            whole.add(a)
            continue
        if attrs.get("shrink_axis_mask", 0) >> a & 1:
            shrink.add(a)
            continue
        starts = attrs.get("begin_mask", 0) >> a & 1 or begin[a] in (0, -size)
        ends = attrs.get("end_mask", 0) >> a & 1 or end[a] >= size
        if strides[a] == 1 and starts and ends:
            whole.add(a)
    return whole, shrink


def _strided_slice_specs(op: OpInfo):
    """StridedSlice: axes taken whole with stride 1 are parallel; sliced axes stay whole,
    shrunk ones leave the output. StridedSliceGrad: the same axes of its output (the
    sliced tensor's shape, a constant), its ``dy`` is the slice's output."""
    grad = op.op_type == "StridedSliceGrad"
    shape = _const(op, 0, "shape") if grad else op.input_shapes[0]
    begin, end, strides = (_const(op, 1 + k, what)  # inputs 1-3 in both ops
                           for k, what in enumerate(("begin", "end", "strides")))
    whole, shrink = _strided_slice_axes(op, shape, begin, end, strides)
    full = _but(_letters(len(shape)), set(range(len(shape))) - whole)
    sliced = "".join(x for a, x in enumerate(full) if a not in shrink)
    if grad:
        return ("=0", "-", "-", "-", sliced), (full,)
    return (full, "-", "-", "-"), (sliced,)


def _softmax_specs(op: OpInfo):
    """Softmax, LogSoftmax: every axis but the last (the softmax runs along it)."""
    rank = len(op.input_shapes[0])
    spec = _but(_letters(rank), {rank - 1})
    return (spec,), (spec,)


def _gather_specs(op: OpInfo):
    """GatherV2 along axis 0 (an embedding lookup in a table that is a tensor): the
    indices' axes (``n``, ``p``...) and the table's other axes (the embedding columns:
    ``c``, ``d``...) are parallel; the gathered axis stays whole."""
    if op.attrs.get("batch_dims", 0):
        raise NotDescribed("batch_dims is not 0")
    if _const(op, 2, "axis")[0] != 0:
        raise NotDescribed("it gathers along an axis other than 0")
    index_rank = len(op.input_shapes[1])
    rest = len(op.output_shapes[0]) - index_rank
    if index_rank > 5 or not 0 <= rest <= 5:
        raise NotDescribed("more than five index or column axes")
    index, columns = "npqrs"[:index_rank], "cdefg"[:rest]
    return ("." + columns, index, "-"), (index + columns,)


def _batch_matmul_specs(op: OpInfo):
    """BatchMatMulV2 of operands of one rank (no broadcasting): the batch axes (``n``,
    ``p``, ``q``), the rows ``m`` and columns ``c`` are parallel, the inner ``k`` a
    reduction; ``adj_x``/``adj_y`` swap an operand's last two axes."""
    x, y = op.input_shapes[0], op.input_shapes[1]
    if len(x) != len(y) or len(x) < 2 or x[:-2] != y[:-2]:
        raise NotDescribed("operands of different ranks or batch shapes (broadcasting)")
    if len(x) > 5:
        raise NotDescribed("more than three batch axes")
    batch = "npq"[:len(x) - 2]
    a = batch + ("km" if op.attrs.get("adj_x", False) else "mk")
    b = batch + ("ck" if op.attrs.get("adj_y", False) else "kc")
    return (a, b), (batch + "mc",)


def _segment_sum_specs(op: OpInfo):
    """UnsortedSegmentSum (an embedding's gradient): the ids' axes are reductions (each part
    scatters its rows into every segment: partial sums); the data's other axes parallel;
    the segment axis stays whole."""
    ids_rank = len(op.input_shapes[1])
    rest = len(op.input_shapes[0]) - ids_rank
    if ids_rank > 3 or rest > 5 or rest < 0:
        raise NotDescribed("more than three id axes or five data axes")
    ids, columns = "klm"[:ids_rank], "cdefg"[:rest]
    return (ids + columns, ids, "-"), ("." + columns,)


def _bias_nchw_specs(op: OpInfo):
    """BiasAdd (NCHW): the channel axis second, the bias along it; rank 3 to 5 (TensorFlow
    needs rank 3 or more for NCHW). The axes keep the generic names of their NHWC
    counterparts (``n``, ``c``, then ``h``, ``w``, ``d``)."""
    letters = _letters(len(op.input_shapes[0]))
    if len(letters) < 3:
        raise NotDescribed(f"a rank-{len(letters)} NCHW tensor")
    spec = letters[0] + letters[-1] + letters[1:-1]
    return (spec, "c"), (spec,)


def _bias_grad_nchw_specs(op: OpInfo):
    """BiasAddGrad (NCHW): every axis but the channels (second) is a reduction."""
    spec = _bias_nchw_specs(op)[0][0]
    return (spec,), ("c",)


_NHWC = (("data_format", "NHWC"),)
_NCHW = (("data_format", "NCHW"),)
_TRAINING = (("is_training", True),)
#: Why a dilated depthwise backprop stays whole: its parts run with VALID padding, and
#: TensorFlow's CPU kernels (oneDNN) fail on a dilated one (with SAME they run but
#: disagree with the dilated filter's result), so no split of it could be checked.
#: Why NCHW max pools stay whole: TensorFlow's CPU MaxPoolGrad runs NCHW only on the
#: output of its own MaxPool (oneDNN's rewrite pairs them); on a slice, a concatenation
#: of parts or any other tensor it falls back to a kernel that refuses NCHW. So neither a
#: part of the gradient nor the whole gradient of a split pool could run.
_NCHW_MAX_POOL = ("an NCHW max pool (TensorFlow's CPU MaxPoolGrad runs NCHW only on its own "
                  "MaxPool's output, not on parts)")
_DILATED_DEPTHWISE_GRAD = ("a dilated depthwise backprop (TensorFlow's CPU kernel fails on "
                           "its dilations with the VALID padding its parts run with)")
#: Ops that read only their inputs' shapes (static in a training step: TensorFlow
#: folds them to constants), so no input bytes move to them.
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

ELEMENTWISE_OPS = ("Relu", "ReluGrad", "Relu6", "Mul", "Sub", "AddV2", "Add", "AddN", "RealDiv",
                   "Neg", "Floor", "FloorMod", "GreaterEqual", "SelectV2", "Identity",
                   "Maximum", "Minimum", "Square", "Sqrt", "Rsqrt", "Tanh", "Sigmoid", "Cast",
                   "TanhGrad", "SigmoidGrad")
for _d in (
    OpDescription("Conv2D", ("nHWi", "..io"), ("nhwo",), _NHWC, halo="forward", kernel="filter",
                  note="sample n, output channels o (parameter), input channels i (reduction), "
                       "output rows h and columns w (attribute: input rows with a halo)"),
    OpDescription("Conv2DBackpropInput", ("=0", "..io", "nYXo"), ("nhwi",), _NHWC,
                  halo="backward", kernel="filter",
                  note="o is a reduction: channel parts give partial input gradients; h, w: "
                       "rows of the input gradient, from the windows touching them"),
    OpDescription("Conv2DBackpropFilter", ("nHWi", "=0", "nhwo"), ("..io",), _NHWC,
                  halo="forward", kernel="filter_sizes",
                  note="n, h, w are reductions: sample and row parts give partial weight gradients"),
    OpDescription("DepthwiseConv2dNative", ("nHWc", "..c."), ("nhwc",), _NHWC, halo="forward",
                  kernel="filter",
                  note="depth multiplier 1 only (else the channel map is not one-to-one)"),
    OpDescription("DepthwiseConv2dNativeBackpropInput", ("=0", "..c.", "nYXc"), ("nhwc",), _NHWC,
                  halo="backward", kernel="filter", dilated_whole=_DILATED_DEPTHWISE_GRAD),
    OpDescription("DepthwiseConv2dNativeBackpropFilter", ("nHWc", "=0", "nhwc"), ("..c.",), _NHWC,
                  halo="forward", kernel="filter_sizes", dilated_whole=_DILATED_DEPTHWISE_GRAD,
                  note="n, h, w are reductions"),
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
    OpDescription("MaxPool", ("nHWc",), ("nhwc",), _NHWC, halo="forward", kernel="ksize",
                  note="h, w: output rows, input rows with a halo (padding: -inf)"),
    OpDescription("AvgPool", ("nHWc",), ("nhwc",), _NHWC, halo="forward", kernel="ksize",
                  note="h, w: output rows, input rows with a halo (SAME: counts real rows)"),
    OpDescription("MaxPoolGrad", ("nHWc", "nYXc", "nYXc"), ("nhwc",), _NHWC, halo="backward",
                  kernel="ksize", note="h, w: rows of the input gradient"),
    OpDescription("AvgPoolGrad", ("=0", "nYXc"), ("nhwc",), _NHWC, halo="backward",
                  kernel="ksize", note="h, w: rows of the input gradient"),
    OpDescription("SoftmaxCrossEntropyWithLogits", ("n.", "n."), ("n", "n."),
                  note="the class axis stays whole (softmax over it)"),
    OpDescription("L2Loss", ("*",), ("",), note="every axis is a reduction"),
    OpDescription("Mean", specs=_reduction_specs, note="reduced axes (constant) are reductions"),
    OpDescription("Sum", specs=_reduction_specs, note="reduced axes (constant) are reductions"),
    OpDescription("ConcatV2", specs=_concat_specs, note="every axis but the concatenation axis"),
    OpDescription("Slice", specs=_slice_specs, note="axes taken whole (constant begin 0, full size)"),
    OpDescription("Pad", specs=_pad_specs, note="axes without padding (constant paddings)"),
    OpDescription("Reshape", specs=_reshape_specs,
                  note="the leading and trailing axes it keeps (sample, channels)"),
    OpDescription("Split", specs=_split_specs, note="every axis but the split axis"),
    OpDescription("SplitV", specs=_split_specs, note="every axis but the split axis"),
    OpDescription("Pack", specs=_pack_specs, note="every axis but the new (stacking) one"),
    OpDescription("Unpack", specs=_unpack_specs, note="every axis but the unstacked one"),
    OpDescription("Tile", specs=_tile_specs, note="the axes it does not repeat (multiple 1)"),
    OpDescription("Transpose", specs=_transpose_specs, note="every axis, permuted (constant perm)"),
    OpDescription("ExpandDims", specs=_expand_dims_specs, note="every axis but the new one"),
    OpDescription("StridedSlice", specs=_strided_slice_specs,
                  note="axes taken whole with stride 1 (constant begin, end, strides); no "
                       "ellipsis or new axis"),
    OpDescription("StridedSliceGrad", specs=_strided_slice_specs,
                  note="the same axes as its StridedSlice"),
    OpDescription("Softmax", specs=_softmax_specs, note="every axis but the last"),
    OpDescription("LogSoftmax", specs=_softmax_specs, note="every axis but the last"),
    OpDescription("SparseSoftmaxCrossEntropyWithLogits", ("n.", "n"), ("n", "n."),
                  note="the class axis stays whole (softmax over it)"),
    OpDescription("GatherV2", specs=_gather_specs,
                  note="axis 0: the indices' axes and the table's columns"),
    OpDescription("BatchMatMulV2", specs=_batch_matmul_specs,
                  note="batch axes, rows m and columns c; the inner k is a reduction"),
    OpDescription("UnsortedSegmentSum", specs=_segment_sum_specs,
                  note="the ids' axes are reductions, the data's columns parallel"),
    OpDescription("ResourceApplyMomentum", ("-", "-", "", "*", ""), (),
                  note="every axis of the variable is a parameter dimension"),
    OpDescription("ReadVariableOp", ("-",), ("*",), note="a part reads its part of the variable"),
    OpDescription("VarHandleOp", (), ("*",),
                  note="the variable's own axes: a part holds its share of the weights"),
    *(OpDescription(t, ("*",) * 2, ("*",), note="element-wise (broadcasting)")
      for t in ELEMENTWISE_OPS),
):
    register(_d)


# -- NCHW (channels second): after the NHWC entries, which stay each type's first --------
for _d in (
    OpDescription("Conv2D", ("niHW", "..io"), ("nohw",), _NCHW, halo="forward", kernel="filter",
                  note="NCHW: as NHWC (the filter is HWIO in both layouts)"),
    OpDescription("Conv2DBackpropInput", ("=0", "..io", "noYX"), ("nihw",), _NCHW,
                  halo="backward", kernel="filter", note="NCHW: as NHWC"),
    OpDescription("Conv2DBackpropFilter", ("niHW", "=0", "nohw"), ("..io",), _NCHW,
                  halo="forward", kernel="filter_sizes", note="NCHW: n, h, w are reductions"),
    OpDescription("DepthwiseConv2dNative", ("ncHW", "..c."), ("nchw",), _NCHW, halo="forward",
                  kernel="filter", note="NCHW: depth multiplier 1 only"),
    OpDescription("DepthwiseConv2dNativeBackpropInput", ("=0", "..c.", "ncYX"), ("nchw",), _NCHW,
                  halo="backward", kernel="filter", dilated_whole=_DILATED_DEPTHWISE_GRAD),
    OpDescription("DepthwiseConv2dNativeBackpropFilter", ("ncHW", "=0", "nchw"), ("..c.",), _NCHW,
                  halo="forward", kernel="filter_sizes", dilated_whole=_DILATED_DEPTHWISE_GRAD,
                  note="NCHW: n, h, w are reductions"),
    OpDescription("BiasAdd", specs=_bias_nchw_specs, when=_NCHW,
                  note="NCHW (rank 3-5): the bias along the second axis"),
    OpDescription("BiasAddGrad", specs=_bias_grad_nchw_specs, when=_NCHW,
                  note="NCHW: every axis but the second is a reduction"),
    OpDescription("FusedBatchNormV3", ("nchw", "c", "c", "-", "-"),
                  ("nchw", "c", "c", "c", "c", "-"), _NCHW + _TRAINING, stats="nhw",
                  note="NCHW: n, h, w split: mean and variance reduced across parts"),
    OpDescription("FusedBatchNormGradV3", ("nchw", "nchw", "c", "c", "c", "-"),
                  ("nchw", "c", "c", "-", "-"), _NCHW + _TRAINING, stats="nhw",
                  note="NCHW: n, h, w split: the sums of dy and dy*x reduced across parts"),
    OpDescription("MaxPool", ("ncHW",), ("nchw",), _NCHW, halo="forward", kernel="ksize",
                  kept_whole=_NCHW_MAX_POOL),
    OpDescription("AvgPool", ("ncHW",), ("nchw",), _NCHW, halo="forward", kernel="ksize",
                  note="NCHW: as NHWC (SAME: counts real rows)"),
    OpDescription("MaxPoolGrad", ("ncHW", "ncYX", "ncYX"), ("nchw",), _NCHW, halo="backward",
                  kernel="ksize", kept_whole=_NCHW_MAX_POOL),
    OpDescription("AvgPoolGrad", ("=0", "ncYX"), ("nchw",), _NCHW, halo="backward",
                  kernel="ksize", note="NCHW: h, w: rows of the input gradient"),
):
    register(_d)


# -- optimizer updates of sharded variables (fddps.tf.variable_shards writes them split) --
for _d in (
    OpDescription("ResourceApplyGradientDescent", ("-", "", "*"), (),
                  note="plain SGD: every axis of the variable is a parameter dimension"),
    OpDescription("ResourceApplyAdam", ("-", "-", "-", "", "", "", "", "", "", "*"), (),
                  note="every axis of the variable (and its two slots) is a parameter dimension"),
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
        keys = dict.fromkeys(k for d in entries for k, _ in d.when)  # what the entries test
        raise NotDescribed(f"no {op.op_type} description for its attributes ("
                           + ", ".join(f"{k}={op.attrs.get(k)!r}" for k in keys) + ")")
    if desc.kept_whole:
        raise NotDescribed(desc.kept_whole)
    if op.op_type == "VarHandleOp" and op.param_shape is None:
        raise NotDescribed("the variable's shape is not known")
    if desc.specs and any(s is None or None in s for s in list(op.input_shapes)
                          + list(op.output_shapes)):
        raise NotDescribed("a shape is not fully known")
    in_specs, out_specs = desc.specs(op) if desc.specs else (desc.inputs, desc.outputs)
    in_shapes = list(op.input_shapes)
    out_shapes = [op.param_shape] if op.op_type == "VarHandleOp" else list(op.output_shapes)
    halos, whole_reason = {}, ""
    if desc.halo:
        halos = _halos(op, desc, in_specs, out_specs, in_shapes, out_shapes)
        if isinstance(halos, str):  # spatial axes stay whole
            whole_reason = halos
            keep = str.maketrans({c: "." for c in "hwHWYX"})
            in_specs = tuple(s.translate(keep) for s in in_specs)
            out_specs = tuple(s.translate(keep) for s in out_specs)
            halos = {}
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
                if letter in HALO_CHARS and halos:
                    dim, reads = HALO_CHARS[letter]
                    resolved.append(HaloAxis(halos[dim], reads))
                    continue
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
    order = [d for d in order if d not in halos] + [d for d in order if d in halos]
    return OpDims(tuple(order), extent, tuple(inputs), tuple(outputs), reduction,
                  frozenset(d for d in desc.stats if d in extent), desc, halos, whole_reason)


def description_table() -> pd.DataFrame:
    """The registry as a table: op type, attribute variant, input and output specs, notes.

    The ``halo`` column says how a sliding-window entry's rows map (``forward`` or
    ``backward``, kernel from where); ``dilated`` what a dilated window of it does
    (a halo through its effective extent, or kept whole and why); ``note`` says why
    an entry that keeps its ops whole does (:attr:`OpDescription.kept_whole`).
    """
    rows = []
    for op_type, entries in OP_DESCRIPTIONS.items():
        for d in entries:
            dilated = ("" if not d.halo or d.kept_whole else f"kept whole: {d.dilated_whole}"
                       if d.dilated_whole else "split: halo of (k - 1) * d + 1 rows")
            rows.append(dict(op_type=op_type, when=" ".join(f"{k}={v}" for k, v in d.when),
                             inputs=", ".join(d.inputs) if not d.specs else "(from constants)",
                             outputs=", ".join(d.outputs) if not d.specs else "",
                             stats=d.stats, halo=(f"{d.halo}, kernel from {d.kernel}"
                                                  if d.halo else ""), dilated=dilated,
                             note=f"kept whole: {d.kept_whole}" if d.kept_whole else d.note))
    return pd.DataFrame(rows)


def coverage(step_graph) -> pd.DataFrame:
    """Per op type of ``step_graph``: how many ops are described and how many kept whole.

    Returns
    -------
    pandas.DataFrame
        Columns ``op_type``, ``ops``, ``described``, ``kept_whole``, ``reason``
        (the most common reason an op of the type is kept whole), ``flops`` and
        ``output_bytes`` (all ops of the type), ``whole_flops`` and
        ``whole_bytes`` (those kept whole), sorted by ``ops`` descending.
    """
    rows = {}
    for op in step_graph.ops.values():
        r = rows.setdefault(op.op_type, dict(op_type=op.op_type, ops=0, described=0,
                                            kept_whole=0, reasons={}, flops=0.0,
                                            output_bytes=0.0, whole_flops=0.0, whole_bytes=0.0))
        r["ops"] += 1
        r["flops"] += op.flops
        r["output_bytes"] += op.output_bytes
        try:
            resolve(op)
            r["described"] += 1
        except NotDescribed as why:
            r["kept_whole"] += 1
            r["whole_flops"] += op.flops
            r["whole_bytes"] += op.output_bytes
            r["reasons"][str(why)] = r["reasons"].get(str(why), 0) + 1
    out = []
    for r in rows.values():
        reasons = r.pop("reasons")
        r["reason"] = max(reasons, key=reasons.get) if reasons else ""
        out.append(r)
    columns = ["op_type", "ops", "described", "kept_whole", "reason", "flops", "output_bytes",
               "whole_flops", "whole_bytes"]
    return (pd.DataFrame(out, columns=columns)
            .sort_values(["ops", "op_type"], ascending=[False, True]).reset_index(drop=True))


def kept_whole_share(table: pd.DataFrame) -> dict:
    """The share of a step kept whole, from its :func:`coverage` table.

    Returns
    -------
    dict
        ``ops``, ``flops``, ``bytes``: the fractions (0-1) of the step's ops, FLOPs
        and output bytes in ops kept whole.

    Example
    -------
    >>> t = pd.DataFrame(dict(ops=[3, 1], kept_whole=[0, 1], flops=[10.0, 0.0],
    ...                       whole_flops=[0.0, 0.0], output_bytes=[6.0, 2.0],
    ...                       whole_bytes=[0.0, 2.0]))
    >>> kept_whole_share(t)
    {'ops': 0.25, 'flops': 0.0, 'bytes': 0.25}
    """
    def share(part, whole):
        total = float(table[whole].sum())
        return float(table[part].sum()) / total if total else 0.0

    return dict(ops=share("kept_whole", "ops"), flops=share("whole_flops", "flops"),
                bytes=share("whole_bytes", "output_bytes"))


#: Eigen's largest alignment (AVX-512): TensorFlow's ``Slice`` returns a view of
#: its input when it cuts only the first axis and each row is a multiple of it.
SLICE_VIEW_ALIGNMENT = 64


def first_axis_view(shape, begin, size, itemsize) -> bool:
    """Whether TensorFlow's ``Slice`` of ``shape`` at ``begin``/``size`` is a view of its
    input (``SliceOp``: a cut of the first axis only, rows aligned), not a copy.

    >>> first_axis_view((8, 4, 4, 16), (4, 0, 0, 0), (4, -1, 4, 16), 4)
    True
    >>> first_axis_view((8, 4, 4, 16), (0, 0, 0, 8), (8, 4, 4, 8), 4)  # channels: a copy
    False
    """
    if shape is None or len(shape) < 2 or None in shape or begin is None or size is None:
        return False
    if len(begin) != len(shape) or len(size) != len(shape):
        return False
    rest = zip(shape[1:], begin[1:], size[1:])
    if not all(b == 0 and s in (-1, d) for d, b, s in rest):
        return False
    return int(np.prod(shape[1:])) * itemsize % SLICE_VIEW_ALIGNMENT == 0
